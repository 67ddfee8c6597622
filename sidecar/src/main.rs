fn main() -> anyhow::Result<()> {
    anyhow::bail!("trainwire-sidecar: not built yet")
}
