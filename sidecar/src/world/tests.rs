use std::time::{Duration, Instant};

use http::{Request, Response};
use kube::client::Body;
use trainwire_contract::config::NodeCount;
use trainwire_contract::world::{Nodes, RankRole, Role, WorldStatus};

use super::*;
use crate::peers::{Evidence, Identity, Observation, Peers, Source};

fn view(expected: u32, roles: &[(u32, Role)]) -> WorldStatus {
    WorldStatus {
        version: trainwire_contract::world::SCHEMA_VERSION,
        nodes: Nodes {
            ready: 0,
            expected,
            spares: 0,
        },
        ranks: roles
            .iter()
            .map(|(index, role)| RankRole {
                index: *index,
                pod: format!("w-{index}"),
                role: *role,
                torch_rank: None,
                from: "pod".into(),
            })
            .collect(),
        ..WorldStatus::default()
    }
}

/// An elastic world of 8 (4:8) seen from pod 0, which watches its ring
/// neighbours 1 and 7 only.
fn ring_peers(t: Instant) -> Peers {
    let watched = crate::ring::watched(0, 8, None);
    let mut p = Peers::new(NodeCount::Elastic { min: 4, max: 8 }, 0, 3, t).watching(&watched);
    alive(&mut p, &[1, 7], t);
    p
}

/// `ranks` seen alive by the Kubernetes source.
fn alive(peers: &mut Peers, ranks: &[u32], t: Instant) {
    for &rank in ranks {
        peers.observe(Observation {
            rank,
            source: Source::Kubernetes,
            evidence: Evidence::Alive(Identity {
                pod: format!("w-{rank}"),
                uid: format!("u-{rank}"),
                ..Identity::default()
            }),
            at: t,
        });
    }
}

#[test]
fn unwatched_peers_count_by_the_controllers_view() {
    let t = Instant::now();
    let peers = ring_peers(t);
    // Without a view: the unwatched are presumed up.
    assert_eq!(survivors(1, &peers, None), 7);
    // The view says 3 and 4 are gone, 5 waits: 0, 2, 6, 7 survive.
    let v = view(
        8,
        &[
            (0, Role::Training),
            (1, Role::Training),
            (2, Role::Training),
            (3, Role::Lost),
            (4, Role::Lost),
            (5, Role::Waiting),
            (6, Role::Spare),
            (7, Role::Training),
        ],
    );
    assert_eq!(survivors(1, &peers, Some(&v)), 4);
}

#[test]
fn what_this_sidecar_sees_wins_over_the_view() {
    let t = Instant::now();
    let mut peers = ring_peers(t);
    // The view (older) says 7 trains; this sidecar saw it lost.
    peers.observe(Observation {
        rank: 7,
        source: Source::Kubernetes,
        evidence: Evidence::Lost(crate::peers::LossReason::Deleted, "deleted".into()),
        at: t,
    });
    let all: Vec<(u32, Role)> = (0..8).map(|i| (i, Role::Training)).collect();
    assert_eq!(survivors(1, &peers, Some(&view(8, &all))), 6);
}

#[test]
fn a_world_scaled_below_its_maximum_has_no_pods_past_expected() {
    let t = Instant::now();
    let peers = ring_peers(t);
    // A 4:8 world running 5 pods; the view lists them all.
    let v = view(5, &(0..5).map(|i| (i, Role::Training)).collect::<Vec<_>>());
    // 7 is watched and healthy (its pod is there as far as this sidecar
    // knows); 5 and 6 are past expected and unlisted.
    assert_eq!(survivors(1, &peers, Some(&v)), 5);
}

#[test]
fn the_owner_is_the_controller_statefulset_or_job() {
    let meta = |api: &str, kind: &str, controller: bool| {
        serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(
            serde_json::json!({"ownerReferences": [{
                "apiVersion": api, "kind": kind, "name": "llama", "uid": "u",
                "controller": controller}]}),
        )
        .expect("meta")
    };
    assert_eq!(
        Owner::of(&meta("apps/v1", "StatefulSet", true)),
        Some(Owner::StatefulSet("llama".into()))
    );
    assert_eq!(
        Owner::of(&meta("batch/v1", "Job", true)),
        Some(Owner::Job("llama".into()))
    );
    assert_eq!(Owner::of(&meta("apps/v1", "StatefulSet", false)), None);
    assert_eq!(
        Owner::of(&meta("example.com/v1", "StatefulSet", true)),
        None
    );
    assert_eq!(Owner::Job("x".into()).reference(), "job/x");
}

const WORLD: &str = r#"{"version":1,"phase":"Running","nodes":{"ready":2,"expected":3,"spares":1},"generation":0,"ranks":[{"index":0,"pod":"sd-0","role":"training","from":"sidecar"},{"index":1,"pod":"sd-1","role":"training","from":"sidecar"},{"index":2,"pod":"sd-2","role":"spare","from":"index"}],"updatedAt":"2026-11-28T10:00:00Z"}"#;

fn json(status: http::StatusCode, body: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).expect("json")))
        .expect("response")
}

fn metadata(kind: &str, name: &str, meta: serde_json::Value) -> serde_json::Value {
    let mut m = meta;
    m["name"] = name.into();
    m["namespace"] = "ml".into();
    serde_json::json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": m, "_kind": kind})
}

async fn next(
    handle: &mut Handle,
) -> (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .ok()
        .flatten()
        .expect("a request")
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A reader for pod `pod` of namespace `ml` whose API is the test's.
fn mocked(pod: &str) -> (Reader, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "ml");
    (
        Reader::build(Some(client), "ml", pod, Duration::ZERO),
        handle,
    )
}

/// A read asked in the background (the test answers its requests).
fn ask(reader: &Reader) -> tokio::task::JoinHandle<()> {
    let r = reader.clone();
    tokio::spawn(async move { r.refresh(Duration::ZERO, Duration::from_secs(10)).await })
}

/// The first read asks for the pod's owner, then the StatefulSet's metadata
/// only; the second asks for the StatefulSet alone; a read younger than the
/// asked age makes no request.
#[tokio::test]
async fn reads_the_owner_once_then_the_workloads_metadata() {
    let (reader, mut handle) = mocked("sd-1");
    let asked = ask(&reader);
    let (req, send) = next(&mut handle).await;
    assert_eq!(req.uri().path(), "/api/v1/namespaces/ml/pods/sd-1");
    let accept = req
        .headers()
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(accept.contains("as=PartialObjectMetadata"), "{accept}");
    send.send_response(json(
        http::StatusCode::OK,
        metadata(
            "Pod",
            "sd-1",
            serde_json::json!({"ownerReferences": [{"apiVersion": "apps/v1",
                "kind": "StatefulSet", "name": "sd", "uid": "u", "controller": true}]}),
        ),
    ));
    let (req, send) = next(&mut handle).await;
    assert_eq!(
        req.uri().path(),
        "/apis/apps/v1/namespaces/ml/statefulsets/sd"
    );
    send.send_response(json(
        http::StatusCode::OK,
        metadata(
            "StatefulSet",
            "sd",
            serde_json::json!({"annotations": {"trainwire.dev/world": WORLD}}),
        ),
    ));
    asked.await.expect("joined");
    let seen = reader.seen();
    assert_eq!(seen.error, None);
    assert_eq!(seen.workload.as_deref(), Some("statefulset/sd"));
    let status = seen.status.as_ref().expect("read");
    assert_eq!(status.ranks[2].role, Role::Spare);
    assert_eq!(seen.reads, 1);
    // Young enough: no request at all.
    reader
        .refresh(Duration::from_secs(60), Duration::from_secs(1))
        .await;
    assert_eq!(reader.seen().reads, 1);
    // Older than asked: the workload only.
    let asked = ask(&reader);
    let (req, send) = next(&mut handle).await;
    assert_eq!(
        req.uri().path(),
        "/apis/apps/v1/namespaces/ml/statefulsets/sd"
    );
    send.send_response(json(
        http::StatusCode::OK,
        metadata("StatefulSet", "sd", serde_json::json!({"annotations": {}})),
    ));
    asked.await.expect("joined");
    let seen = reader.seen();
    assert_eq!(seen.reads, 2);
    assert_eq!(
        seen.error.as_deref(),
        Some("statefulset/sd has no trainwire.dev/world yet (the controllers write it)")
    );
    // The last good read is kept, and is not fresh for a later loss.
    assert!(seen.status.is_some());
    assert!(seen.fresh_since(Instant::now()).is_none());
}

/// Without the right the reason is shown and the next read waits the
/// refused back-off.
#[tokio::test]
async fn a_refused_read_says_which_right_is_missing_and_backs_off() {
    let (reader, mut handle) = mocked("j-0");
    let asked = ask(&reader);
    let (_, send) = next(&mut handle).await;
    send.send_response(json(
        http::StatusCode::OK,
        metadata(
            "Pod",
            "j-0",
            serde_json::json!({"ownerReferences": [{"apiVersion": "batch/v1",
                "kind": "Job", "name": "j", "uid": "u", "controller": true}]}),
        ),
    ));
    let (req, send) = next(&mut handle).await;
    assert_eq!(req.uri().path(), "/apis/batch/v1/namespaces/ml/jobs/j");
    send.send_response(json(
        http::StatusCode::FORBIDDEN,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "forbidden", "reason": "Forbidden", "code": 403}),
    ));
    asked.await.expect("joined");
    let seen = reader.seen();
    assert_eq!(
        seen.error.as_deref(),
        Some(
            "the service account may not get job/j in namespace ml (RBAC): bind the trainwire-sidecar ClusterRole"
        )
    );
    reader
        .refresh(Duration::ZERO, Duration::from_millis(200))
        .await;
    assert_eq!(reader.seen().reads, 1, "no new read within the back-off");
}

#[tokio::test]
async fn without_an_api_the_view_says_so() {
    let reader = Reader::new(None, "ml", "p");
    reader.refresh(Duration::ZERO, Duration::from_secs(1)).await;
    assert_eq!(
        reader.seen().error.as_deref(),
        Some("no Kubernetes API configuration")
    );
}

#[test]
fn a_1024_pod_view_read_from_the_annotation_counts_every_pod() {
    let t = Instant::now();
    let watched = crate::ring::watched(0, 1024, None);
    let mut peers = Peers::new(
        NodeCount::Elastic {
            min: 900,
            max: 1024,
        },
        0,
        3,
        t,
    )
    .watching(&watched);
    alive(&mut peers, &[1, 1023], t);
    // Pods 600..700 lost, past the first 512: the controllers' table
    // holds them, written in runs and read back.
    let roles: Vec<(u32, Role)> = (0..1024)
        .map(|i| {
            let role = if (600..700).contains(&i) {
                Role::Lost
            } else {
                Role::Training
            };
            (i, role)
        })
        .collect();
    let text = view(1024, &roles).to_annotation();
    let read = WorldStatus::from_annotation(&text).expect("reads");
    // Losing 1 as well: 1,024 - 100 - 1.
    assert_eq!(survivors(1, &peers, Some(&read)), 923);
}
