//! trainwire-webhook: the admission server (`serve`: the mutating webhook
//! over TLS, its scale guard and metrics) and the offline command line
//! (`inject -f`, the KRM function, `certs`, `policy check`), both thin
//! layers over the pure engine (`trainwire-engine`), which does every
//! mutation and policy decision.
//!
//! It may import the engine, the contract, the policy file
//! (`trainwire-policyfile`), the shared runtime, tokio, axum/hyper/rustls
//! (serving), rcgen (certificates) and kube's client and runtime for one
//! read-only watch (the scale guard's StatefulSet cache). It must not import
//! the controllers (`trainwire-controllers`) or the sidecar: the process the
//! apiserver calls on every admission links no controller and holds no
//! write right. `tests/tests/layering.rs` holds it to that.

pub mod admission;
pub mod certs;
pub mod cli;
pub mod inject;
pub mod metrics;
pub mod output;
pub mod scale;
pub mod serve;
/// The SIGTERM/SIGINT future both programs share.
pub use trainwire_runtime::shutdown;
pub mod tls;
