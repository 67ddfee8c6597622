//! Logging: `tracing` to stderr, as text or one JSON object per line, level
//! from `RUST_LOG` (default `info`, with the HTTP/TLS stack kept quiet).

use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

/// Output format of the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable `key=value` lines.
    #[default]
    Text,
    /// One JSON object per line, fields at the top level.
    Json,
}

/// The filter used when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,hyper=warn,h2=warn,rustls=warn,tower=warn,kube=warn";

/// Install the global subscriber. A second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(false),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}
