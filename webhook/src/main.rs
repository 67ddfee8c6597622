use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One crypto provider for rustls, kube and rcgen: ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    trainwire_webhook::cli::Cli::parse().run().await
}
