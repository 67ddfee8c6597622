//! The sidecar's whole configuration contract: the `TRAINWIRE_*` environment
//! variables that the webhook sets on the sidecar container. Defined once, in
//! `trainwire-contract`, which the webhook uses too, so the two programs
//! cannot drift apart (and neither links the other).

pub use trainwire_contract::env::*;
