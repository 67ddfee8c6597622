//! Logging: `tracing` to stderr, as text or one JSON object per line, level
//! from `RUST_LOG` (default `info`, with the HTTP/TLS stack kept quiet). The
//! subscriber is the one both programs share (`trainwire-runtime`); text has
//! no colour when stderr is not a terminal.

/// Output format of the log: the contract's type, parsed by clap with its
/// `FromStr` (`text`, `json`).
pub use trainwire_runtime::LogFormat;

/// The filter used when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,hyper=warn,h2=warn,rustls=warn,tower=warn,kube=warn";

/// Install the global subscriber. A second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    trainwire_runtime::logging::init(format, DEFAULT_FILTER);
}
