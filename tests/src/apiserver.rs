//! A fake kube-apiserver over plain HTTP on loopback, for tests that start
//! the real `trainwire-sidecar` binary with Kubernetes detection: it answers
//! what the sidecar asks (access reviews, a list and a watch of one
//! namespace's pods, Events, the patch of its own pod, a GET of its
//! StatefulSet or Job) from pod and workload objects the test sets, and streams every change the test makes as a watch event, as
//! the kubelet's status updates reach a real watch.
//!
//! Not a general API server: one namespace, `resourceVersion` a counter, a
//! watch starts from the moment it is opened (the test waits for the watches
//! before it changes anything). Label selectors (`k=v`, `k!=v`,
//! `k in (a,b)`, `k notin (a)`, `k`, `!k`) and the field selector
//! `metadata.name=<name>` narrow lists and watches as the apiserver does, and
//! every watch event sent is counted, by the token of the watch's client
//! ([`FakeApiServer::deliveries`]), so a test sees what each watcher was sent.

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

/// One change, as broadcast to the watches.
#[derive(Clone, Debug)]
struct Change {
    version: u64,
    kind: &'static str,
    pod: Value,
}

/// One watch event sent to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The bearer token of the watch's client (its kubeconfig's).
    pub token: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: String,
    pub pod: String,
    /// The change's `resourceVersion`.
    pub version: u64,
}

#[derive(Default)]
struct Watches {
    next_id: u64,
    /// The open watches: the last change each has looked at.
    open: BTreeMap<u64, u64>,
    sent: Vec<Delivery>,
}

struct Shared {
    pods: Mutex<Pods>,
    events: broadcast::Sender<Change>,
    watches: Mutex<Watches>,
    /// Whether the sidecar's service account may read nodes.
    nodes_allowed: bool,
    /// Every request, `METHOD path`, for the test to look at.
    requests: Mutex<Vec<String>>,
    /// The bodies of the pod patches, with the pod's name.
    patches: Mutex<Vec<(String, Value)>>,
    /// The StatefulSets and Jobs a GET may read, by `(resource, name)`.
    workloads: Mutex<BTreeMap<(String, String), Value>>,
    /// Whether a pod patch changes the pod (a JSON merge patch, streamed
    /// as `MODIFIED`), as the apiserver does; off, patches are only recorded.
    apply_patches: std::sync::atomic::AtomicBool,
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
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        Self::start_on(listener).await
    }

    /// Starts on `listener` (one made in a network namespace, say) on the
    /// current tokio runtime.
    pub async fn start_on(listener: std::net::TcpListener) -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            pods: Mutex::new(Pods::default()),
            events,
            watches: Mutex::new(Watches::default()),
            nodes_allowed: false,
            requests: Mutex::new(Vec::new()),
            patches: Mutex::new(Vec::new()),
            workloads: Mutex::new(BTreeMap::new()),
            apply_patches: std::sync::atomic::AtomicBool::new(false),
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
            .route(
                "/apis/apps/v1/namespaces/{ns}/statefulsets/{name}",
                get(
                    |s: State<Arc<Shared>>, p: axum::extract::Path<(String, String)>| {
                        one_workload(s, p, "statefulsets")
                    },
                ),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                get(
                    |s: State<Arc<Shared>>, p: axum::extract::Path<(String, String)>| {
                        one_workload(s, p, "jobs")
                    },
                ),
            )
            .route("/api/v1/namespaces/{ns}/events", post(created))
            .route(
                "/apis/events.k8s.io/v1/namespaces/{ns}/events",
                post(created),
            )
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(shared.clone(), record))
            .with_state(shared.clone());
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
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

    /// A kubeconfig for this server whose client sends the bearer token
    /// `token` (what [`Delivery::token`] names), written to
    /// `dir/kubeconfig-<token>`.
    pub fn kubeconfig_as(
        &self,
        dir: &Path,
        namespace: &str,
        token: &str,
    ) -> std::io::Result<PathBuf> {
        let path = dir.join(format!("kubeconfig-{token}"));
        std::fs::write(&path, kubeconfig_text(self.addr, namespace, token))?;
        Ok(path)
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
        let _ = self.shared.events.send(Change {
            version: pods.version,
            kind,
            pod,
        });
    }

    /// From now on a pod patch changes the pod as the apiserver would (a
    /// JSON merge patch, a new `resourceVersion`, `MODIFIED` to the
    /// watches), so the sidecars' records can be read back from the pods.
    pub fn apply_patches(&self) {
        self.shared
            .apply_patches
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every pod, as the server holds it now.
    pub fn pods(&self) -> Vec<Value> {
        self.lock().items.values().cloned().collect()
    }

    /// Sets the StatefulSet or Job a GET of `resource` (`statefulsets`,
    /// `jobs`) named `metadata.name` answers with (not watched).
    pub fn set_workload(&self, resource: &str, object: Value) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        if let Ok(mut w) = self.shared.workloads.lock() {
            w.insert((resource.to_string(), name.to_string()), object);
        }
    }

    /// Every request so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Removes a pod and streams `DELETED`.
    pub fn delete_pod(&self, name: &str) {
        let mut pods = self.lock();
        pods.version += 1;
        let version = pods.version;
        if let Some(mut pod) = pods.items.remove(name) {
            pod["metadata"]["resourceVersion"] = json!(version.to_string());
            let _ = self.shared.events.send(Change {
                version,
                kind: "DELETED",
                pod,
            });
        }
    }

    /// The `resourceVersion` of the last change.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// How many watches are open now.
    pub fn open_watches(&self) -> usize {
        self.watch_state(|w| w.open.len())
    }

    /// Whether every open watch has looked at the changes up to `version`
    /// (sent them, or left them out by its selectors).
    pub fn settled(&self, version: u64) -> bool {
        self.watch_state(|w| w.open.values().all(|&v| v >= version))
    }

    /// Every watch event sent so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.watch_state(|w| w.sent.clone())
    }

    fn watch_state<T>(&self, f: impl FnOnce(&Watches) -> T) -> T {
        f(&self
            .shared
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner()))
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
    std::fs::write(&path, kubeconfig_text(addr, namespace, "fake"))?;
    Ok(path)
}

fn kubeconfig_text(addr: SocketAddr, namespace: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\nusers:\n- name: sidecar\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: sidecar\n    namespace: {namespace}\ncurrent-context: fake\n"
    )
}

/// Whether a label selector string selects `labels` (`k=v`, `k==v`,
/// `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`; all must hold).
pub fn selects(selector: &str, labels: &serde_json::Map<String, Value>) -> bool {
    let mut parts = Vec::new();
    let (mut depth, mut part) = (0u32, String::new());
    for c in selector.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut part));
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    parts.push(part);
    let label = |k: &str| labels.get(k.trim()).and_then(Value::as_str);
    let set = |values: &str| -> Vec<String> {
        values
            .trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.trim().to_string())
            .collect()
    };
    parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .all(|p| {
            if let Some((k, v)) = p.split_once("!=") {
                label(k) != Some(v.trim())
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                label(k) == Some(v.trim())
            } else if let Some((k, v)) = p.split_once(" notin ") {
                label(k).is_none_or(|l| !set(v).iter().any(|s| s == l))
            } else if let Some((k, v)) = p.split_once(" in ") {
                label(k).is_some_and(|l| set(v).iter().any(|s| s == l))
            } else if let Some(k) = p.strip_prefix('!') {
                label(k).is_none()
            } else {
                label(p).is_some()
            }
        })
}

/// Whether `pod` is selected by the request's `labelSelector` and
/// `fieldSelector` (only `metadata.name=<name>` is understood; another
/// field selector selects nothing).
fn selected(query: &BTreeMap<String, String>, pod: &Value) -> bool {
    let empty = serde_json::Map::new();
    let labels = pod["metadata"]["labels"].as_object().unwrap_or(&empty);
    let by_label = query
        .get("labelSelector")
        .is_none_or(|s| selects(s, labels));
    let by_field = query.get("fieldSelector").is_none_or(|f| {
        f.split(',').filter(|t| !t.is_empty()).all(|t| {
            t.strip_prefix("metadata.name=")
                .is_some_and(|n| pod["metadata"]["name"] == n)
        })
    });
    by_label && by_field
}

/// A running pod of a StatefulSet: `name` with its index label, `uid`, at
/// `ip`, Ready or not, its trainer container restarted `restarts` times;
/// its controller is the StatefulSet `name` without its `-<index>`.
pub fn pod(name: &str, index: u32, uid: &str, ip: &str, ready: bool, restarts: i32) -> Value {
    let status = if ready { "True" } else { "False" };
    let set = name
        .strip_suffix(&format!("-{index}"))
        .unwrap_or(name)
        .to_string();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "e2e",
            "uid": uid,
            "creationTimestamp": "2026-11-25T08:00:00Z",
            "labels": {"app": "train", "apps.kubernetes.io/pod-index": index.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                "name": set, "uid": format!("uid-{set}"), "controller": true}]
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
    headers: axum::http::HeaderMap,
) -> Response {
    if query.get("watch").map(String::as_str) == Some("true") {
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_string();
        let mut rx = shared.events.subscribe();
        let id = {
            let mut w = shared.watches.lock().unwrap_or_else(|p| p.into_inner());
            w.next_id += 1;
            let id = w.next_id;
            let now = shared
                .pods
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .version;
            w.open.insert(id, now);
            id
        };
        let stream = async_stream(move |tx| async move {
            while let Ok(change) = rx.recv().await {
                if selected(&query, &change.pod) {
                    let line = json!({"type": change.kind, "object": change.pod}).to_string();
                    if tx.send(format!("{line}\n")).await.is_err() {
                        break;
                    }
                    let mut w = shared.watches.lock().unwrap_or_else(|p| p.into_inner());
                    w.sent.push(Delivery {
                        token: token.clone(),
                        kind: change.kind.to_string(),
                        pod: change.pod["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        version: change.version,
                    });
                }
                let mut w = shared.watches.lock().unwrap_or_else(|p| p.into_inner());
                w.open.insert(id, change.version);
            }
            let mut w = shared.watches.lock().unwrap_or_else(|p| p.into_inner());
            w.open.remove(&id);
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
        "items": pods.items.values().filter(|p| selected(&query, p)).collect::<Vec<_>>(),
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

async fn one_workload(
    State(shared): State<Arc<Shared>>,
    axum::extract::Path((_, name)): axum::extract::Path<(String, String)>,
    resource: &'static str,
) -> Response {
    let found = shared
        .workloads
        .lock()
        .ok()
        .and_then(|w| w.get(&(resource.to_string(), name)).cloned());
    match found {
        Some(object) => axum::Json(object).into_response(),
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
        p.push((name.clone(), patch.clone()));
    }
    if shared
        .apply_patches
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        let mut pods = shared.pods.lock().unwrap_or_else(|p| p.into_inner());
        pods.version += 1;
        let version = pods.version;
        if let Some(pod) = pods.items.get_mut(&name) {
            json_patch::merge(pod, &patch);
            pod["metadata"]["resourceVersion"] = json!(version.to_string());
            let _ = shared.events.send(Change {
                version,
                kind: "MODIFIED",
                pod: pod.clone(),
            });
        }
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
