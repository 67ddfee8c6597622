//! trainwire-sidecar: watches peer health and checkpoint freshness in a
//! torchrun pod and restarts the local trainer when a peer is lost.

pub mod env;
