use anyhow::Context;
use tracing_subscriber::EnvFilter;
use trainwire_sidecar::config::LogFormat;

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
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,hyper=warn,kube=warn,tower=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    // One thread: the sidecar is mostly idle and must stay small.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(trainwire_sidecar::run(
        config,
        trainwire_sidecar::shutdown::signal(),
    ))?;
    Ok(())
}
