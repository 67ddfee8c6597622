//! A generated cluster served over HTTP as a kube-apiserver would serve it,
//! for the real `trainwire-controllers`: list (paginated, label
//! selectors honoured unless told otherwise), watch (kept open, nothing
//! changes), get, create and merge-patch of namespaced objects (the
//! controllers' Lease, the Services they create, the annotations they
//! write). Every request is recorded for the test to look at.
//!
//! The cluster: N pods of which 1 % belong to injected workloads
//! (StatefulSets and Jobs of 4 pods, from the captured AdmissionReviews,
//! injected by the real engine), N/100 other StatefulSets and N/100 other
//! Jobs (the rest of the pods belong to ReplicaSets), N/50 Nodes with 40
//! images each. Pods carry a realistic status and managedFields. Used by
//! `controllers-bench` (memory) and tests/tests/controllers.rs (which
//! watches each feature opens).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Pods of one injected workload.
pub const WORLD_PODS: usize = 4;
/// Pods per node.
pub const PODS_PER_NODE: usize = 50;
/// Images in each node's status.
const NODE_IMAGES: usize = 40;

/// One resource's objects, serialized once.
#[derive(Default)]
struct Collection {
    kind: String,
    api_version: String,
    items: Vec<(BTreeMap<String, String>, Bytes)>,
}

/// One request: method, path and query parameters.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
}

impl Seen {
    /// The cluster-wide collection it lists or watches (`pods`, `nodes`, ...).
    pub fn collection(&self) -> Option<&str> {
        let segments: Vec<&str> = self.path.split('/').filter(|s| !s.is_empty()).collect();
        match segments.as_slice() {
            ["api", _, resource] | ["apis", _, _, resource] => Some(resource),
            _ => None,
        }
    }

    /// Whether it is a watch.
    pub fn is_watch(&self) -> bool {
        self.query
            .get("watch")
            .is_some_and(|w| w == "true" || w == "1")
    }
}

/// The generated cluster and what was asked of it.
#[derive(Default)]
pub struct Cluster {
    collections: HashMap<String, Collection>,
    ignore_selectors: bool,
    /// Namespaced objects written by the controllers (the Lease, created
    /// Services), by path.
    written: Mutex<HashMap<String, Value>>,
    watches: Mutex<HashMap<String, usize>>,
    last_request: Mutex<Option<Instant>>,
    seen: Mutex<Vec<Seen>>,
    /// Collections whose objects may not be patched (a 500 answers).
    refused: Mutex<HashSet<String>>,
}

impl Cluster {
    /// Watches opened so far, per collection.
    pub fn watches(&self) -> HashMap<String, usize> {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Answer every PATCH of an object of `collection` (`statefulsets`,
    /// ...) with a server error, as an apiserver that fails the write.
    pub fn refuse_patches(&self, collection: &str) {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(collection.to_string());
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How long since the last request (`None`: none yet).
    pub fn quiet_for(&self) -> Option<Duration> {
        self.last_request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|t| t.elapsed())
    }

    /// Serve it on `127.0.0.1:0` on the current runtime.
    pub async fn serve(self: &Arc<Self>) -> std::io::Result<SocketAddr> {
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(addr)
    }

    /// Serve it and start `bin controllers FLAGS` against it, its probe on
    /// a free loopback port and a kubeconfig of its own (pod name
    /// `hostname`, for the Lease).
    pub async fn start_controllers(
        self: &Arc<Self>,
        bin: &std::path::Path,
        flags: &[&str],
        hostname: &str,
    ) -> anyhow::Result<Controllers> {
        use anyhow::Context as _;
        let addr = self.serve().await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = crate::apiserver::write_kubeconfig(dir.path(), addr, "trainwire-system")?;
        let probe = trainwire_test_support::net::free_port();
        let child = std::process::Command::new(bin)
            .args(flags)
            .arg(format!("--probe-listen=127.0.0.1:{probe}"))
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .env("HOSTNAME", hostname)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Controllers {
            child,
            probe,
            _dir: dir,
        })
    }
}

/// A `trainwire-controllers` process of [`Cluster::start_controllers`],
/// killed when dropped.
pub struct Controllers {
    pub child: std::process::Child,
    /// The port of its probe and metrics endpoint on 127.0.0.1.
    pub probe: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Controllers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    v["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Equality selectors (`a=b,c=d`), the only form the controllers send.
fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        match term.split_once("==").or_else(|| term.split_once('=')) {
            Some((k, v)) => labels.get(k.trim()).map(String::as_str) == Some(v.trim()),
            None => labels.contains_key(term.trim()),
        }
    })
}

fn query(uri: &axum::http::Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).unwrap_or_default(),
    )
        .into_response()
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

async fn handle(State(cluster): State<Arc<Cluster>>, request: Request) -> Response {
    *cluster
        .last_request
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    let (parts, body) = request.into_parts();
    cluster
        .seen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Seen {
            method: parts.method.clone(),
            path: parts.uri.path().to_string(),
            query: query(&parts.uri),
        });
    let body = axum::body::to_bytes(body, 16 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let q = query(&parts.uri);
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (api_version, rest) = match segments.as_slice() {
        ["api", v, rest @ ..] => (v.to_string(), rest.to_vec()),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest.to_vec()),
        _ => {
            return json_response(
                StatusCode::NOT_FOUND,
                &json!({"kind": "Status", "code": 404}),
            );
        }
    };
    match (parts.method.clone(), rest.as_slice()) {
        (Method::GET, [resource]) => list_or_watch(&cluster, resource, &q),
        (Method::GET, ["namespaces", _, _, _]) => {
            match cluster
                .written
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&path)
            {
                Some(v) => json_response(StatusCode::OK, v),
                None => not_found(),
            }
        }
        (Method::POST, ["namespaces", ns, resource]) => {
            let mut object: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
            let name = object["metadata"]["name"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("generated-{}", rand_suffix()));
            object["metadata"]["name"] = json!(name);
            object["metadata"]["namespace"] = json!(ns);
            object["metadata"]["uid"] = json!(format!("uid-{name}"));
            object["metadata"]["resourceVersion"] = json!("2");
            object["metadata"]["creationTimestamp"] = json!("2026-11-27T00:00:00Z");
            if *resource != "events" {
                cluster
                    .written
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(format!("{path}/{name}"), object.clone());
            }
            json_response(StatusCode::CREATED, &object)
        }
        (Method::PATCH, ["namespaces", _, resource, ..])
            if cluster
                .refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(*resource) =>
        {
            json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": "InternalError", "message": "the test refuses this write", "code": 500}),
            )
        }
        (Method::PATCH, ["namespaces", ns, resource, name, ..]) => {
            let patch: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
            let key = format!(
                "/{}/{}/namespaces/{ns}/{resource}/{name}",
                if api_version == "v1" { "api" } else { "apis" },
                api_version
            );
            let mut written = cluster.written.lock().unwrap_or_else(|p| p.into_inner());
            let object = written.entry(key).or_insert_with(|| {
                json!({
                    "apiVersion": api_version,
                    "kind": cluster.collections.get(*resource).map(|c| c.kind.clone()).unwrap_or_else(|| kind_of(resource)),
                    "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")},
                })
            });
            merge(object, &patch);
            let version = object["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1);
            object["metadata"]["resourceVersion"] = json!((version + 1).to_string());
            let answer = object.clone();
            drop(written);
            json_response(StatusCode::OK, &answer)
        }
        _ => not_found(),
    }
}

fn kind_of(resource: &str) -> String {
    match resource {
        "leases" => "Lease",
        "services" => "Service",
        "deployments" => "Deployment",
        "statefulsets" => "StatefulSet",
        "jobs" => "Job",
        "pods" => "Pod",
        _ => "Unknown",
    }
    .to_string()
}

fn rand_suffix() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn not_found() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
    )
}

fn list_or_watch(cluster: &Cluster, resource: &str, q: &HashMap<String, String>) -> Response {
    let empty = Collection {
        kind: kind_of(resource),
        api_version: "v1".to_string(),
        items: Vec::new(),
    };
    let collection = cluster.collections.get(resource).unwrap_or(&empty);
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        *cluster
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(resource.to_string())
            .or_default() += 1;
        // Open until the client goes: nothing changes in this cluster.
        let stream = futures::stream::pending::<Result<Bytes, Infallible>>();
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(stream),
        )
            .into_response();
    }
    let selector = q
        .get("labelSelector")
        .filter(|_| !cluster.ignore_selectors)
        .cloned()
        .unwrap_or_default();
    let start: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let mut body = Vec::new();
    let mut taken = 0;
    let mut next = None;
    let mut index = start;
    let mut first = true;
    body.extend_from_slice(b"[");
    while index < collection.items.len() {
        let (labels, bytes) = &collection.items[index];
        index += 1;
        if !selects(&selector, labels) {
            continue;
        }
        if taken == limit {
            next = Some(index - 1);
            break;
        }
        if !first {
            body.push(b',');
        }
        first = false;
        body.extend_from_slice(bytes);
        taken += 1;
    }
    body.extend_from_slice(b"]");
    let mut head = json!({
        "apiVersion": collection.api_version,
        "kind": format!("{}List", collection.kind),
        "metadata": {"resourceVersion": "1"},
    });
    if let Some(n) = next {
        head["metadata"]["continue"] = json!(n.to_string());
    }
    let mut out = serde_json::to_vec(&head).unwrap_or_default();
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":");
    out.extend_from_slice(&body);
    out.push(b'}');
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        out,
    )
        .into_response()
}

/// `request.object` of a captured review.
fn captured(name: &str) -> anyhow::Result<Value> {
    Ok(trainwire_test_support::fixtures::request_object(name).0)
}

fn injected(object: &Value, ns: &str) -> anyhow::Result<Value> {
    let profile = trainwire_engine::policy::Profile::default();
    match trainwire_engine::mutation::mutate(object, Some(ns), &profile) {
        Ok(trainwire_engine::mutation::Outcome::Mutated(m)) => Ok(m.object),
        other => bail!("the capture was not injected: {other:?}"),
    }
}

fn pod_status(ready: bool, containers: &[String]) -> Value {
    let t = "2026-11-27T00:00:00Z";
    let status = if ready { "True" } else { "False" };
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|c| json!({"type": c, "status": status, "lastProbeTime": null, "lastTransitionTime": t}))
    .collect();
    let container_statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({
            "name": c, "state": {"running": {"startedAt": t}}, "lastState": {},
            "ready": ready, "restartCount": 0, "started": true,
            "image": "registry.example/team/app:1.2.3",
            "imageID": "registry.example/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        })
        })
        .collect();
    json!({
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
        "podIP": "10.244.1.2", "podIPs": [{"ip": "10.244.1.2"}],
        "startTime": t, "qosClass": "Burstable",
        "containerStatuses": container_statuses,
    })
}

/// A pod made from `template` (a pod template spec) owned by `owner`.
fn pod_from(
    template: &Value,
    name: &str,
    ns: &str,
    node: &str,
    owner: (&str, &str, &str),
    base: &Value,
) -> Value {
    let mut pod = base.clone();
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["namespace"] = json!(ns);
    pod["metadata"]["uid"] = json!(format!("uid-{ns}-{name}"));
    pod["metadata"]["resourceVersion"] = json!("1");
    pod["metadata"]["creationTimestamp"] = json!("2026-11-27T00:00:00Z");
    if let Some(m) = template["metadata"].as_object() {
        for (k, v) in m {
            pod["metadata"][k] = v.clone();
        }
    }
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": owner.0, "kind": owner.1, "name": owner.2,
        "uid": format!("uid-{ns}-{}", owner.2), "controller": true, "blockOwnerDeletion": true,
    }]);
    let mut spec = template["spec"].clone();
    spec["nodeName"] = json!(node);
    pod["spec"] = spec;
    let containers: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    pod["status"] = pod_status(true, &containers);
    pod
}

fn workload(object: &Value, name: &str, ns: &str) -> Value {
    let mut w = object.clone();
    w["metadata"]["name"] = json!(name);
    w["metadata"]["namespace"] = json!(ns);
    w["metadata"]["uid"] = json!(format!("uid-{ns}-{name}"));
    w["metadata"]["resourceVersion"] = json!("1");
    w["metadata"]["generation"] = json!(1);
    w
}

fn node(i: usize) -> Value {
    let name = format!("node-{i:05}");
    let conditions: Vec<Value> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|c| {
            json!({
                "type": c, "status": if *c == "Ready" { "True" } else { "False" },
                "lastHeartbeatTime": "2026-11-27T00:00:00Z", "lastTransitionTime": "2026-11-27T00:00:00Z",
                "reason": format!("Kubelet{c}"), "message": format!("kubelet reports {c}"),
            })
        })
        .collect();
    let images: Vec<Value> = (0..NODE_IMAGES)
        .map(|j| {
            json!({
                "names": [format!("registry.example/team/image-{j}@sha256:{j:064x}"), format!("registry.example/team/image-{j}:v{j}")],
                "sizeBytes": 100_000_000 + j,
            })
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "gpu-8x", "topology.kubernetes.io/zone": format!("zone-{}", i % 3)}},
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": format!("cloud://{name}")},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "95", "memory": "1050Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.33.2", "containerRuntimeVersion": "containerd://2.0.0", "osImage": "Debian GNU/Linux 13",
                "kernelVersion": "6.12.0", "architecture": "amd64", "operatingSystem": "linux", "machineID": "m", "systemUUID": "s", "bootID": "b",
                "kubeProxyVersion": "", },
            "images": images,
        }
    })
}

/// The generated cluster of `pods` pods, and the bytes of JSON it holds.
/// `ignore_selectors`: every list answers every object, as if the
/// controllers watched without a label selector.
pub fn generate(pods: usize, ignore_selectors: bool) -> anyhow::Result<(Cluster, usize)> {
    let sts = captured("statefulset-create.json")?;
    let job = captured("job-indexed-create.json")?;
    let base_pod = captured("pod-create-from-statefulset.json")?;
    let ns_of = |i: usize| format!("team-{:03}", i % 200);
    let mut plain_sts = sts.clone();
    if let Some(a) = plain_sts["metadata"]["annotations"].as_object_mut() {
        a.retain(|k, _| !k.starts_with("trainwire.dev/"));
    }
    let mut plain_job = job.clone();
    if let Some(a) = plain_job["metadata"]["annotations"].as_object_mut() {
        a.retain(|k, _| !k.starts_with("trainwire.dev/"));
    }
    let injected_sts = injected(&sts, "team-000")?;
    let injected_job = injected(&job, "team-000")?;

    let nodes = pods.div_ceil(PODS_PER_NODE);
    let node_name = |i: usize| format!("node-{:05}", i % nodes);
    let mut collections: HashMap<String, Vec<Value>> = HashMap::new();
    let trainwire_pods = pods / 100;
    let worlds = trainwire_pods / WORLD_PODS;
    let mut made = 0;
    for w in 0..worlds {
        let ns = ns_of(w);
        let (object, kind, api) = if w % 2 == 0 {
            (&injected_sts, "StatefulSet", "apps/v1")
        } else {
            (&injected_job, "Job", "batch/v1")
        };
        let name = format!("train-{w:05}");
        let wl = workload(object, &name, &ns);
        let template = &wl["spec"]["template"];
        for r in 0..WORLD_PODS {
            let pod = pod_from(
                template,
                &format!("{name}-{r}"),
                &ns,
                &node_name(made),
                (api, kind, &name),
                &base_pod,
            );
            collections.entry("pods".into()).or_default().push(pod);
            made += 1;
        }
        let resource = if kind == "Job" {
            "jobs"
        } else {
            "statefulsets"
        };
        collections.entry(resource.into()).or_default().push(wl);
    }
    let plain_workloads = pods / 100;
    let mut i = 0;
    while made < pods {
        let ns = ns_of(i);
        // Each plain pod belongs to a plain StatefulSet or Job (or, beyond
        // those, to a ReplicaSet: the bulk of a real cluster's pods).
        let (kind, api, owner) = if i < plain_workloads {
            ("StatefulSet", "apps/v1", format!("app-{i:05}"))
        } else if i < 2 * plain_workloads {
            ("Job", "batch/v1", format!("batch-{i:05}"))
        } else {
            (
                "ReplicaSet",
                "apps/v1",
                format!("web-{:05}-5d8f7c9b4", i % 5000),
            )
        };
        let template = if kind == "Job" {
            &plain_job["spec"]["template"]
        } else {
            &plain_sts["spec"]["template"]
        };
        let pod = pod_from(
            template,
            &format!("{owner}-{i}"),
            &ns,
            &node_name(made),
            (api, kind, &owner),
            &base_pod,
        );
        collections.entry("pods".into()).or_default().push(pod);
        made += 1;
        i += 1;
    }
    for k in 0..plain_workloads {
        collections
            .entry("statefulsets".into())
            .or_default()
            .push(workload(&plain_sts, &format!("app-{k:05}"), &ns_of(k)));
        collections.entry("jobs".into()).or_default().push(workload(
            &plain_job,
            &format!("batch-{:05}", plain_workloads + k),
            &ns_of(plain_workloads + k),
        ));
    }
    collections.insert("nodes".into(), (0..nodes).map(node).collect());

    let mut cluster = Cluster {
        ignore_selectors,
        ..Cluster::default()
    };
    let mut bytes_total = 0;
    for (resource, objects) in collections {
        let mut c = Collection {
            kind: kind_of(&resource),
            api_version: match resource.as_str() {
                "statefulsets" => "apps/v1",
                "jobs" => "batch/v1",
                _ => "v1",
            }
            .to_string(),
            items: Vec::new(),
        };
        if resource == "nodes" {
            c.kind = "Node".into();
        }
        for o in objects {
            let bytes = Bytes::from(serde_json::to_vec(&o)?);
            bytes_total += bytes.len();
            c.items.push((labels_of(&o), bytes));
        }
        cluster.collections.insert(resource, c);
    }
    Ok((cluster, bytes_total))
}
