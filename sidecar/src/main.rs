use anyhow::Context;
use clap::Parser;

/// The log filter when `RUST_LOG` is not set.
const DEFAULT_FILTER: &str = "info,hyper=warn,kube=warn,tower=warn";

/// The command line: only `--help` and `--version`. The configuration is the
/// `TRAINWIRE_*` environment the webhook sets (trainwire_contract::env), so
/// that a pod spec holds it in one place.
#[derive(Debug, Parser)]
#[command(
    name = "trainwire-sidecar",
    version = trainwire_contract::release::VERSION,
    about = "Watches a torchrun world's peers and checkpoints; restarts the local trainer on a confirmed peer loss",
    long_about = None,
    after_help = "\
Configured by environment only; the webhook injects it (docs/sidecar.md):
  TRAINWIRE_NNODES       the world's node count, N or MIN:MAX (required)
  TRAINWIRE_NODE_RANK    this pod's rank, 0 to NNODES-1 (required)
  TRAINWIRE_PEER_HOSTS   the peers' host pattern, {i} for the rank
  TRAINWIRE_POD_NAME     this pod's name (default: HOSTNAME)
  TRAINWIRE_HEALTH_PORT  the HTTP port of /healthz, /readyz, /status, /metrics (default 29600)
  ...and the optional TRAINWIRE_* settings listed in docs/sidecar.md."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Installs the trainer's rendezvous handler (trainwire-c10d) into DIR
    /// (put on the trainer's PYTHONPATH) and creates the channel directory
    /// the sidecar and the handler share; run by the injected init container.
    InstallRendezvousHandler {
        /// Where the Python package goes.
        #[arg(default_value = trainwire_contract::rendezvous::HANDLER_DIR)]
        dir: std::path::PathBuf,
        /// The channel directory (TRAINWIRE_RENDEZVOUS_DIR).
        #[arg(long, default_value = trainwire_contract::rendezvous::CHANNEL_DIR)]
        channel: std::path::PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    // `--help` and `--version` exit here (0), before any env is read; an
    // unknown argument exits 2 with clap's message.
    let Cli { command } = Cli::parse();
    if let Some(Command::InstallRendezvousHandler { dir, channel }) = command {
        return match trainwire_sidecar::rendezvous::install(&dir, &channel) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: installing the rendezvous handler: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
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
