//! `trainwire-webhook inject`: the engine offline, like `istioctl kube-inject`.

use clap::Args;

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Manifest to read (multi-document YAML or a List); `-` for stdin.
    #[arg(short = 'f', long = "filename")]
    pub file: std::path::PathBuf,
}

pub fn run(_args: InjectArgs) -> anyhow::Result<()> {
    anyhow::bail!("inject: not built yet")
}
