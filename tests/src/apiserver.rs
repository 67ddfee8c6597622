//! A fake kube-apiserver over plain HTTP on loopback, for tests that start
//! the real `trainwire-sidecar` binary with Kubernetes detection: it answers
//! what the sidecar asks (access reviews, a list and a watch of one
//! namespace's pods, Events, the patch of its own pod) from pod objects the
//! test sets, and streams every change the test makes as a watch event, as
//! the kubelet's status updates reach a real watch.
//!
//! Not a general API server: one namespace, label selectors ignored (the
//! test sets only the workload's pods), `resourceVersion` a counter.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::broadcast;

#[derive(Default)]
struct Pods {
    items: BTreeMap<String, Value>,
    version: u64,
}

struct Shared {
    pods: Mutex<Pods>,
    events: broadcast::Sender<String>,
    /// Whether the sidecar's service account may read nodes.
    nodes_allowed: bool,
    /// Every request, `METHOD path`, for the test to look at.
    requests: Mutex<Vec<String>>,
    /// The bodies of the pod patches, with the pod's name.
    patches: Mutex<Vec<(String, Value)>>,
}

/// The fake API server; stops with the runtime it was started on.
#[derive(Clone)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl FakeApiServer {
    /// Starts on `127.0.0.1:0` on the current tokio runtime.
    pub async fn start() -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            pods: Mutex::new(Pods::default()),
            events,
            nodes_allowed: false,
            requests: Mutex::new(Vec::new()),
            patches: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                post(access_review),
            )
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                get(one_pod).patch(patch_pod),
            )
            .route("/api/v1/namespaces/{ns}/events", post(created))
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                post(created),
            )
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(shared.clone(), record))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeApiServer { shared, addr })
    }

    /// A kubeconfig for this server, written to `dir/kubeconfig`.
    pub fn kubeconfig(&self, dir: &Path, namespace: &str) -> std::io::Result<PathBuf> {
        write_kubeconfig(dir, self.addr, namespace)
    }

    /// Adds or replaces a pod (by `metadata.name`), giving it the next
    /// `resourceVersion`, and streams it to the watches (`ADDED` or
    /// `MODIFIED`).
    pub fn set_pod(&self, mut pod: Value) {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut pods = self.lock();
        pods.version += 1;
        pod["metadata"]["resourceVersion"] = json!(pods.version.to_string());
        let kind = if pods.items.contains_key(&name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        pods.items.insert(name, pod.clone());
        let _ = self
            .shared
            .events
            .send(json!({"type": kind, "object": pod}).to_string());
    }

    /// Removes a pod and streams `DELETED`.
    pub fn delete_pod(&self, name: &str) {
        let mut pods = self.lock();
        pods.version += 1;
        let version = pods.version;
        if let Some(mut pod) = pods.items.remove(name) {
            pod["metadata"]["resourceVersion"] = json!(version.to_string());
            let _ = self
                .shared
                .events
                .send(json!({"type": "DELETED", "object": pod}).to_string());
        }
    }

    /// The pod named `name`, as last set.
    pub fn pod(&self, name: &str) -> Option<Value> {
        self.lock().items.get(name).cloned()
    }

    /// The merge patches sent to pods so far: (pod name, body).
    pub fn patches(&self) -> Vec<(String, Value)> {
        self.shared
            .patches
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default()
    }

    /// How many watch requests have reached the server.
    pub fn watches(&self) -> usize {
        self.shared
            .requests
            .lock()
            .map(|r| r.iter().filter(|l| l.contains("watch=true")).count())
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pods> {
        self.shared.pods.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A kubeconfig for a plain-HTTP API server at `addr` whose context is
/// `fake` with `namespace`, written to `dir/kubeconfig`.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr, namespace: &str) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\nusers:\n- name: sidecar\n  user:\n    token: fake\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sidecar\n    namespace: {namespace}\ncurrent-context: fake\n"
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// A running pod of a StatefulSet: `name` with its index label, `uid`, at
/// `ip`, Ready or not, its trainer container restarted `restarts` times.
pub fn pod(name: &str, index: u32, uid: &str, ip: &str, ready: bool, restarts: i32) -> Value {
    let status = if ready { "True" } else { "False" };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "e2e",
            "uid": uid,
            "creationTimestamp": "2026-11-25T08:00:00Z",
            "labels": {"app": "train", "apps.kubernetes.io/pod-index": index.to_string()}
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "trainer", "image": "t"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": "2026-11-25T08:00:05Z"}],
            "containerStatuses": [{
                "name": "trainer", "image": "t", "imageID": "", "ready": ready,
                "restartCount": restarts, "started": ready
            }]
        }
    })
}

async fn record(
    State(shared): State<Arc<Shared>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let line = format!(
        "{} {}",
        req.method(),
        req.uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or_default()
    );
    if let Ok(mut r) = shared.requests.lock() {
        r.push(line);
    }
    next.run(req).await
}

async fn access_review(
    State(shared): State<Arc<Shared>>,
    axum::Json(mut review): axum::Json<Value>,
) -> Response {
    let resource = review["spec"]["resourceAttributes"]["resource"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let allowed = resource == "pods" || (resource == "nodes" && shared.nodes_allowed);
    review["status"] = json!({"allowed": allowed});
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

async fn pods(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    if query.get("watch").map(String::as_str) == Some("true") {
        let mut rx = shared.events.subscribe();
        let stream = async_stream(move |tx| async move {
            while let Ok(line) = rx.recv().await {
                if tx.send(format!("{line}\n")).await.is_err() {
                    return;
                }
            }
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    let pods = shared.pods.lock().unwrap_or_else(|p| p.into_inner());
    axum::Json(json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": pods.version.to_string()},
        "items": pods.items.values().collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn one_pod(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((_, name)): axum::extract::Path<(String, String)>,
) -> Response {
    let found = shared
        .pods
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .items
        .get(&name)
        .cloned();
    match found {
        Some(pod) => axum::Json(pod).into_response(),
        None => not_found().await,
    }
}

async fn patch_pod(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((ns, name)): axum::extract::Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let patch: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Ok(mut p) = shared.patches.lock() {
        p.push((name.clone(), patch));
    }
    one_pod(State(shared), axum::extract::Path((ns, name))).await
}

async fn created(axum::Json(body): axum::Json<Value>) -> Response {
    (StatusCode::CREATED, axum::Json(body)).into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"
        })),
    )
        .into_response()
}

/// A stream of text chunks fed by `produce` through a channel.
fn async_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<String, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<String>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(produce(tx));
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|line| (Ok(line), rx))
    })
}
