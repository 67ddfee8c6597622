//! What the tests of every crate share, once: prerequisites that fail under
//! CI and skip visibly outside it ([`require`]), processes ([`process`]),
//! ports and plain HTTP ([`net`]), bounded waits ([`wait`]) and the
//! repository's fixtures ([`fixtures`]).
//!
//! A dev-dependency of the engine, the webhook, the sidecar, the kubectl
//! plugin and `trainwire-tests`; it depends on none of them.

pub mod fixtures;
pub mod net;
pub mod output;
pub mod process;
pub mod require;
pub mod sidecar;
pub mod wait;

pub use fixtures::{admission_fixtures_dir, repo_root};
pub use net::{free_port, http_get, status};
pub use process::alive;
pub use require::{Prerequisite, require};
pub use wait::{wait_for, wait_until};
