//! `trainwire-webhook certs`: a CA and a serving certificate for a self-managed setup.

use clap::Args;

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Name of the webhook's Service.
    #[arg(long)]
    pub service: String,
    /// Namespace of the webhook's Service.
    #[arg(long)]
    pub namespace: String,
    /// Directory to write `ca.crt`, `ca.key`, `tls.crt` and `tls.key` to.
    #[arg(long)]
    pub out: std::path::PathBuf,
}

pub fn run(_args: CertsArgs) -> anyhow::Result<()> {
    anyhow::bail!("certs: not built yet")
}
