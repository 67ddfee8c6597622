//! trainwire-engine: what trainwire computes, with no I/O. A workload and a
//! platform policy [`policy::Profile`] in, the injected workload, its RFC
//! 6902 JSON Patch and the warnings out ([`mutation`]); the policy's
//! grammar and validation from its text ([`policy`]); the objects an
//! injected workload implies (its headless [`service`], its dedicated
//! rendezvous [`store`]); the scale guard's decision ([`scale`]); what
//! every crate reads of a pod, the trainer container first ([`pod`]); and
//! the world's status observed from its pods ([`world`]).
//!
//! It may import the contract (`trainwire-contract`), the Kubernetes API
//! types (`k8s-openapi`) and pure data crates (serde, json-patch, hashing,
//! glob matching). It must not import tokio, hyper, a kube client or
//! runtime, tracing, or any other trainwire crate: no file, socket, clock or
//! log is touched here (a caller passes the time in), so the admission
//! server, the offline CLI, the controllers and the kubectl plugin run the
//! same code, and tests run it without a runtime. `tests/tests/layering.rs`
//! holds this crate to it.
//!
//! Adding an annotation: its name in `trainwire-contract`'s `annotations`
//! (and docs/annotations.md's table, which a test checks against it), its
//! parsing in [`mutation::annotations`], its effect in the [`mutation`]
//! module of its concern.

pub mod cache;
pub mod mutation;
pub mod pod;
pub mod policy;
pub mod scale;
pub mod service;
pub mod store;
pub mod world;
pub mod yaml_error;
