use clap::Parser;

// mimalloc: an admission allocates and frees many small strings and maps;
// measured in docs/benchmarks.md against the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One crypto provider for rustls, kube and rcgen: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    trainwire_webhook::cli::Cli::parse().run().await
}
