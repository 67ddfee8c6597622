use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainwire_webhook::cli::Cli::parse().run().await
}
