//! Logging: `tracing` to stderr, as text or one JSON object per line, level
//! from `RUST_LOG` (default `info`, with the HTTP/TLS stack kept quiet). The
//! subscriber is the one both programs share (`trainwire-runtime`); text has
//! no colour when stderr is not a terminal. And the flags `serve` and
//! `controllers` share: the log format and the probe and metrics endpoint.

use std::net::SocketAddr;

use clap::Args;
use tokio::net::TcpListener;

/// Output format of the log: the contract's type, parsed by clap with its
/// `FromStr` (`text`, `json`).
pub use crate::LogFormat;

/// The filter used when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,hyper=warn,h2=warn,rustls=warn,tower=warn,kube=warn";

/// Install the global subscriber. A second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    crate::logging::init(format, DEFAULT_FILTER);
}

/// The flags of a long-running subcommand's telemetry (`serve`, `controllers`).
#[derive(Clone, Debug, Args)]
pub struct TelemetryArgs {
    /// Address of the plain-HTTP probe and metrics endpoint (/healthz, /readyz, /metrics).
    #[arg(
        long,
        env = "TRAINWIRE_PROBE_LISTEN",
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:8080"
    )]
    pub probe_listen: SocketAddr,
    /// Log format, `text` or `json`; the level comes from RUST_LOG (default info).
    #[arg(
        long,
        env = "TRAINWIRE_LOG_FORMAT",
        value_name = "text|json",
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

impl TelemetryArgs {
    /// Bind the probe and metrics endpoint.
    pub async fn bind_probes(&self) -> Result<TcpListener, BindError> {
        TcpListener::bind(self.probe_listen)
            .await
            .map_err(|source| BindError {
                addr: self.probe_listen,
                source,
            })
    }
}

/// The probe endpoint could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on --probe-listen {addr}")]
pub struct BindError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}
