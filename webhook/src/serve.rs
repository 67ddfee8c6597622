//! `trainwire-webhook serve`: the admission server over TLS.

use clap::Args;

#[derive(Debug, Args)]
pub struct ServeArgs {}

pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve: not built yet")
}
