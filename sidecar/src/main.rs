use anyhow::Context;

/// The log filter when `RUST_LOG` is not set.
const DEFAULT_FILTER: &str = "info,hyper=warn,kube=warn,tower=warn";

fn main() -> std::process::ExitCode {
    // A configuration error is a message (with its causes), never a stack
    // backtrace, whatever RUST_BACKTRACE says.
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    let config =
        trainwire_sidecar::config::from_env().context("trainwire-sidecar configuration")?;
    // stderr, no colour unless stderr is a terminal (shared with the webhook).
    trainwire_runtime::logging::init(config.log_format, DEFAULT_FILTER);
    let _ = rustls::crypto::ring::default_provider().install_default();
    // One thread: the sidecar is mostly idle and must stay small.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(trainwire_sidecar::run(config, async {
        let signal = trainwire_runtime::shutdown::signal().await;
        tracing::info!(signal, "shutting down");
    }))?;
    Ok(())
}
