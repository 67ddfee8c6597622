//! The typed configuration, parsed from the `TRAINWIRE_*` environment.
//!
//! The parser is the contract's ([`trainwire_contract::config`]), the same
//! one the webhook's `policy check` runs on a policy's `sidecar.env`; this
//! module adds the process environment as a [`Source`], with the fallbacks
//! that need I/O.

pub use trainwire_contract::config::*;

use crate::env;

/// The service-account namespace file, read when `TRAINWIRE_POD_NAMESPACE` is unset.
pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The process environment; the pod name falls back to `HOSTNAME` and the
/// namespace to the service-account namespace file.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Source for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        let set = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        set(key).or_else(|| match key {
            k if k == env::POD_NAME => set("HOSTNAME"),
            k if k == env::POD_NAMESPACE => std::fs::read_to_string(NAMESPACE_FILE)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
            _ => None,
        })
    }
}

/// Reads the configuration from the process environment.
pub fn from_env() -> Result<Config, ConfigError> {
    Config::from_source(&ProcessEnv)
}
