//! trainwire-runtime: the I/O every long-running trainwire program shares
//! (the admission server, the controllers, the sidecar), so each is written
//! once: the shutdown future ([`shutdown::signal`]), the log
//! ([`logging::init`]), the directory watch behind certificate and policy
//! reloads ([`watch`]), the `/metrics` formats ([`exposition`]), and the
//! telemetry flags of the cluster programs ([`telemetry`]). What the
//! programs agree on without I/O (env names, value grammars, [`LogFormat`])
//! stays in `trainwire-contract`. It may import the contract, tokio,
//! tracing, prometheus-client, notify and clap; it must not import the
//! engine, a kube client or any program's crate.

pub use trainwire_contract::LogFormat;

pub mod exposition;
pub mod logging;
pub mod shutdown;
pub mod telemetry;
pub mod watch;
