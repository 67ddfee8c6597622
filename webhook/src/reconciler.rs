//! The one piece of cluster state admission cannot create: the headless
//! Service that gives an injected Job's pods (or a StatefulSet whose
//! `serviceName` Service is missing) their DNS names.

/// Every Kubernetes API call the reconciler makes, as `(API group, resource,
/// verb)`. The ClusterRole in `manifests/base/rbac.yaml` grants exactly these
/// (plus the scale guard's `get statefulsets`); a test compares the two.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("apps", "statefulsets", "list"),
    ("apps", "statefulsets", "watch"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("", "services", "get"),
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "services", "create"),
    ("", "services", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

/// Run the reconciler until the process shuts down.
pub async fn run(_client: kube::Client) -> anyhow::Result<()> {
    futures::future::pending::<()>().await;
    Ok(())
}
