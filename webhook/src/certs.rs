//! `trainwire-webhook certs`: a CA and a serving certificate for a self-managed setup.

use clap::Args;

#[derive(Debug, Args)]
pub struct CertsArgs {}

pub fn run(_args: CertsArgs) -> anyhow::Result<()> {
    anyhow::bail!("certs: not built yet")
}
