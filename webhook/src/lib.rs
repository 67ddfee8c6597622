//! trainwire-webhook: a mutating admission webhook, and the same engine
//! offline (`inject -f`), that turns annotated StatefulSets and Jobs into
//! torchrun worlds.
//!
//! The mutation engine ([`mutation`]) is pure: a workload and a policy
//! [`policy::Profile`] in, the mutated workload, a JSON Patch and warnings out.
//! Everything with I/O (serving, certificates, the reconciler, the CLI) is
//! built around it.

pub mod admission;
pub mod certs;
pub mod cli;
pub mod controllers;
pub mod crashloop;
pub mod failures;
pub mod inject;
pub mod lease;
pub mod metrics;
pub mod mutation;
pub mod nodefailure;
pub mod policy;
pub mod rdzv_store;
pub mod reconciler;
pub mod scale;
pub mod serve;
/// The SIGTERM/SIGINT future both programs share.
pub use trainwire_runtime::shutdown;
pub mod telemetry;
pub mod tls;
pub mod world;
pub mod yaml_error;
