//! The one piece of cluster state admission cannot create: the headless
//! Service that gives an injected Job's pods (or a StatefulSet whose
//! `serviceName` Service is missing) their DNS names.

/// Run the reconciler until the process shuts down.
pub async fn run(_client: kube::Client) -> anyhow::Result<()> {
    futures::future::pending::<()>().await;
    Ok(())
}
