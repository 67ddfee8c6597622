use std::process::ExitCode;

use clap::Parser;

// mimalloc, as the admission server (docs/benchmarks.md), built with
// `no_thp` (Cargo.toml) so the idle process keeps a small RSS.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // One crypto provider for rustls and kube: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match trainwire_controllers::cli::run(trainwire_controllers::cli::ControllersArgs::parse())
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        // A user's error is a message (with its causes), never a stack
        // backtrace, whatever RUST_BACKTRACE says.
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
