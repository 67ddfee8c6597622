use std::process::ExitCode;

use clap::Parser;

// mimalloc: an admission allocates and frees many small strings and maps;
// measured in docs/benchmarks.md against the system allocator. Built with
// `no_thp` (Cargo.toml): on a kernel whose transparent huge pages are
// `always` or `madvise`, mimalloc's arenas would otherwise take 2 MiB pages
// and the idle server 19 MB of RSS instead of 12.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // One crypto provider for rustls, kube and rcgen: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match trainwire_webhook::cli::Cli::parse().run().await {
        Ok(()) => ExitCode::SUCCESS,
        // A user's error is a message (with its causes), never a stack
        // backtrace, whatever RUST_BACKTRACE says.
        Err(e) => match e.downcast_ref::<trainwire_webhook::output::Exit>() {
            // Already said.
            Some(trainwire_webhook::output::Exit(code)) => ExitCode::from(*code),
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}
