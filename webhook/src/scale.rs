//! The scale guard: `kubectl scale` on an injected fixed-size StatefulSet
//! would leave `PET_NNODES` stale, so such a `statefulsets/scale` request is
//! refused unless the world is elastic over the new size.
//!
//! The `autoscaling/v1 Scale` in the review carries no labels or annotations,
//! so the StatefulSet itself is read through the Kubernetes API. When it
//! cannot be read, the request is refused with the reason rather than let
//! through on a guess.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::mutation::Refusal;

/// Where the guard reads StatefulSets from: the Kubernetes API in the
/// server, a map in tests.
pub trait StatefulSetSource: Send + Sync {
    /// The StatefulSet as JSON, `Ok(None)` when it does not exist, `Err`
    /// with a reason a user can act on when it cannot be read.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, String>>;
}

/// Reads StatefulSets with the server's kube client.
#[derive(Clone)]
pub struct KubeStatefulSets(pub kube::Client);

/// How long a StatefulSet lookup may take: well under the apiserver's
/// default webhook timeout (10 s).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(4);

impl StatefulSetSource for KubeStatefulSets {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, String>> {
        Box::pin(async move {
            let api: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
                kube::Api::namespaced(self.0.clone(), namespace);
            match tokio::time::timeout(LOOKUP_TIMEOUT, api.get_opt(name)).await {
                Err(_) => Err(format!(
                    "the Kubernetes API did not answer within {}s",
                    LOOKUP_TIMEOUT.as_secs()
                )),
                Ok(Err(e)) => Err(e.to_string()),
                Ok(Ok(None)) => Ok(None),
                Ok(Ok(Some(sts))) => serde_json::to_value(sts)
                    .map(Some)
                    .map_err(|e| format!("cannot encode the StatefulSet: {e}")),
            }
        })
    }
}

/// Used when the server has no Kubernetes client (no in-cluster config and
/// no kubeconfig): every lookup fails with the reason.
#[derive(Clone, Debug)]
pub struct NoKubernetesApi(pub String);

impl StatefulSetSource for NoKubernetesApi {
    fn get<'a>(
        &'a self,
        _namespace: &'a str,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Option<Value>, String>> {
        let why = format!("no Kubernetes API client: {}", self.0);
        Box::pin(async move { Err(why) })
    }
}

/// Decide a `statefulsets/scale` UPDATE to `new_replicas` (from
/// `old_replicas`, when the review says).
pub async fn check(
    source: &Arc<dyn StatefulSetSource>,
    namespace: &str,
    name: &str,
    new_replicas: i32,
    old_replicas: Option<i32>,
) -> Result<(), Refusal> {
    if old_replicas == Some(new_replicas) {
        return Ok(());
    }
    match source.get(namespace, name).await {
        Err(why) => Err(Refusal::Workload(format!(
            "cannot read StatefulSet {namespace}/{name} to check that scaling it to {new_replicas} replicas keeps its trainwire PET_NNODES right: {why}; try again, or change spec.replicas with kubectl apply or kubectl patch (the webhook re-injects it)"
        ))),
        // The apiserver answers NotFound itself.
        Ok(None) => Ok(()),
        Ok(Some(statefulset)) => crate::mutation::scale_allowed(&statefulset, new_replicas),
    }
}
