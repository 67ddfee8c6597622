//! In-process tests of the HTTPS router (`tower::ServiceExt::oneshot`):
//! every AdmissionReview a real kube-apiserver sent, bad input, the scale
//! guard, probes and metrics.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use trainwire_webhook::scale::{Lookup, StatefulSetCache, StatefulSetSource, Unknown};
use trainwire_webhook::serve::{AppState, probe_router, router};

/// A StatefulSet source fed by the test: `(namespace, name)` → what the
/// cache would know.
#[derive(Default)]
struct FakeStatefulSets {
    answers: Mutex<HashMap<(String, String), Lookup>>,
    lookups: Mutex<Vec<(String, String)>>,
}

impl FakeStatefulSets {
    fn with(namespace: &str, name: &str, answer: Lookup) -> Arc<Self> {
        let fake = FakeStatefulSets::default();
        fake.answers
            .lock()
            .expect("lock")
            .insert((namespace.to_string(), name.to_string()), answer);
        Arc::new(fake)
    }

    fn found(namespace: &str, name: &str, sts: Value) -> Arc<Self> {
        let sts = serde_json::from_value(sts).expect("a StatefulSet");
        Self::with(namespace, name, Lookup::Found(Arc::new(sts)))
    }
}

impl StatefulSetSource for FakeStatefulSets {
    fn lookup(&self, namespace: &str, name: &str) -> Lookup {
        let key = (namespace.to_string(), name.to_string());
        self.lookups.lock().expect("lock").push(key.clone());
        self.answers
            .lock()
            .expect("lock")
            .get(&key)
            .cloned()
            .unwrap_or(Lookup::Missing)
    }
}

fn state_with(statefulsets: Arc<dyn StatefulSetSource>) -> AppState {
    common::app_state(statefulsets)
}

fn state() -> AppState {
    state_with(Arc::new(FakeStatefulSets::default()))
}

struct Reply {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn send(state: &AppState, request: Request<Body>) -> Reply {
    let response = router(state.clone())
        .oneshot(request)
        .await
        .expect("router is infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Reply {
        status,
        content_type,
        body,
    }
}

async fn post(state: &AppState, body: impl Into<Body>) -> Reply {
    send(
        state,
        Request::post("/mutate")
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.into())
            .expect("request"),
    )
    .await
}

/// The fields every answered review must have.
fn check_review_envelope(review: &Value, uid: &str) -> Value {
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1", "{review}");
    assert_eq!(review["kind"], "AdmissionReview", "{review}");
    assert!(review.get("request").is_none(), "{review}");
    let response = review["response"].clone();
    assert_eq!(response["uid"], uid, "{review}");
    response
}

#[tokio::test]
async fn every_captured_review_gets_a_review_back_with_its_uid() {
    let state = state();
    for name in common::fixture_names() {
        let fixture = common::fixture(&name);
        let uid = fixture["request"]["uid"].as_str().expect("uid").to_string();
        let reply = post(&state, common::fixture_bytes(&name)).await;
        assert_eq!(reply.status, StatusCode::OK, "{name}: {}", reply.text());
        assert_eq!(reply.content_type, "application/json", "{name}");
        let response = check_review_envelope(&reply.json(), &uid);
        let request = &fixture["request"];
        match name.as_str() {
            // Not managed (Pods), a Job UPDATE (template immutable), and the
            // scale guard with no StatefulSet cache: allowed untouched (the
            // guard's own verdicts are in the scale guard's table test).
            n if n.starts_with("pod-") || n == "job-update-label.json" => {
                assert_eq!(response["allowed"], true, "{name}: {response}");
                assert!(response.get("patch").is_none(), "{name}: {response}");
                assert!(response.get("warnings").is_none(), "{name}: {response}");
            }
            "statefulset-scale-subresource.json" => {
                assert_eq!(response["allowed"], true, "{name}: {response}");
                assert!(response.get("patch").is_none(), "{name}: {response}");
            }
            // A StatefulSet created paused: injected, but never a world of 0.
            "statefulset-create-zero-replicas.json" => {
                assert_eq!(response["allowed"], true, "{name}: {response}");
                let patched = common::apply_response_patch(&response, &request["object"]);
                let trainer = common::trainer(&patched);
                for var in ["PET_NNODES", "WORLD_SIZE", "NNODES"] {
                    assert!(
                        common::env_value(trainer, var).is_none(),
                        "{name}: {var} in {trainer}"
                    );
                }
                let sidecar = &patched["spec"]["template"]["spec"]["initContainers"][0];
                assert!(
                    common::env_value(sidecar, "TRAINWIRE_NNODES").is_none(),
                    "{name}: {sidecar}"
                );
                let warnings = response["warnings"].to_string();
                assert!(warnings.contains("replicas 0"), "{name}: {warnings}");
                check_reinjection_changes_nothing(&state, &fixture, patched).await;
            }
            // Annotated StatefulSets (CREATE, UPDATE) and Jobs (CREATE); a
            // NonIndexed Job (the apiserver's default) becomes Indexed, with
            // a warning that says so.
            _ => {
                let patched = check_injected(&name, request, &response);
                let nonindexed = request["object"]["spec"]["completionMode"] == "NonIndexed";
                let warned = response["warnings"].as_array().is_some_and(|w| {
                    w.iter()
                        .any(|w| w.as_str().is_some_and(|w| w.contains("changed to Indexed")))
                });
                assert_eq!(nonindexed, warned, "{name}: {response}");
                check_reinjection_changes_nothing(&state, &fixture, patched).await;
            }
        }
    }
}

/// Apply the answer's patch to the request's object and check the result is
/// a torchrun world of the right size.
fn check_injected(name: &str, request: &Value, response: &Value) -> Value {
    assert_eq!(response["allowed"], true, "{name}: {response}");
    assert_eq!(response["patchType"], "JSONPatch", "{name}: {response}");
    let object = &request["object"];
    let patched = common::apply_response_patch(response, object);
    let trainer = common::trainer(&patched);
    let expected_nnodes = match request["kind"]["kind"].as_str() {
        Some("Job") => object["spec"]["parallelism"].clone(),
        _ => object["spec"]["replicas"].clone(),
    };
    let nnodes = common::env_value(trainer, "PET_NNODES")
        .unwrap_or_else(|| panic!("{name}: no PET_NNODES in {trainer}"));
    assert_eq!(nnodes["value"], expected_nnodes.to_string(), "{name}");
    for var in [
        "PET_NODE_RANK",
        "PET_RDZV_ENDPOINT",
        "PET_RDZV_BACKEND",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    ] {
        assert!(
            common::env_value(trainer, var).is_some(),
            "{name}: {var} missing from the patched trainer: {trainer}"
        );
    }
    let rank = common::env_value(trainer, "PET_NODE_RANK").expect("rank");
    assert!(
        rank["valueFrom"]["fieldRef"]["fieldPath"].is_string(),
        "{name}: {rank}"
    );
    let pod = &patched["spec"]["template"]["spec"];
    assert_eq!(pod["shareProcessNamespace"], true, "{name}");
    let sidecar = pod["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["restartPolicy"] == "Always"))
        .unwrap_or_else(|| panic!("{name}: no native sidecar in {pod}"));
    assert!(sidecar["image"].is_string(), "{name}");
    if request["kind"]["kind"] == "Job" {
        assert_eq!(patched["spec"]["completionMode"], "Indexed", "{name}");
    }
    assert_eq!(
        patched["metadata"]["name"], object["metadata"]["name"],
        "{name}"
    );
    patched
}

/// The injected object sent again (what `kubectl apply` of the same manifest
/// or `reinvocationPolicy: IfNeeded` does) is allowed with no patch.
async fn check_reinjection_changes_nothing(state: &AppState, fixture: &Value, patched: Value) {
    let mut again = fixture.clone();
    again["request"]["object"] = patched;
    let reply = post(state, serde_json::to_vec(&again).expect("json")).await;
    let response = &reply.json()["response"];
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        response.get("patch").is_none(),
        "re-injection patched: {response}"
    );
}

#[tokio::test]
async fn dry_run_is_answered_like_the_real_request() {
    let state = state();
    for (dry, real) in [
        ("statefulset-create-dryrun.json", "statefulset-create.json"),
        ("job-indexed-create-dryrun.json", "job-indexed-create.json"),
    ] {
        let a = post(&state, common::fixture_bytes(dry)).await.json();
        let b = post(&state, common::fixture_bytes(real)).await.json();
        assert_eq!(a["response"]["allowed"], b["response"]["allowed"], "{dry}");
        assert_eq!(
            a["response"]["warnings"], b["response"]["warnings"],
            "{dry}"
        );
        let pa = common::apply_response_patch(
            &a["response"],
            &common::fixture(dry)["request"]["object"],
        );
        let pb = common::apply_response_patch(
            &b["response"],
            &common::fixture(real)["request"]["object"],
        );
        assert_eq!(pa["spec"], pb["spec"], "{dry}: same mutation of the spec");
    }
}

fn with_request(mut review: Value, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    edit(&mut review["request"]);
    serde_json::to_vec(&review).expect("json")
}

#[tokio::test]
async fn bad_input_gets_the_documented_answer() {
    let state = state();
    let good = common::fixture_bytes("statefulset-create.json");
    let review = common::fixture("statefulset-create.json");
    let uid = review["request"]["uid"].as_str().expect("uid").to_string();

    // Not JSON / not a review: HTTP 400 with the reason as text.
    let mut non_utf8 = good.clone();
    let at = non_utf8
        .windows(8)
        .position(|w| w == b"llama-ft")
        .expect("name in body");
    non_utf8[at] = 0xff;
    non_utf8[at + 1] = 0xfe;
    let mut wrong_api_version = review.clone();
    wrong_api_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut wrong_kind = review.clone();
    wrong_kind["kind"] = json!("StatefulSet");
    let http_400: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated JSON",
            good[..good.len() / 2].to_vec(),
            "not JSON",
        ),
        ("empty body", Vec::new(), "not JSON"),
        ("non-UTF-8", non_utf8, "not JSON"),
        ("a JSON array", b"[1,2]".to_vec(), "JSON array"),
        (
            "wrong apiVersion",
            serde_json::to_vec(&wrong_api_version).expect("json"),
            "admission.k8s.io/v1 only",
        ),
        (
            "wrong kind",
            serde_json::to_vec(&wrong_kind).expect("json"),
            "expected \"AdmissionReview\"",
        ),
    ];
    for (case, body, reason) in http_400 {
        let reply = post(&state, body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text()
        );
        assert!(reply.text().contains(reason), "{case}: {}", reply.text());
    }

    // A review the webhook cannot read: HTTP 200, `invalid` (allowed false,
    // code 400, the reason in status.message), uid echoed when readable.
    let object_kind_mismatch = with_request(review.clone(), |r| {
        r["object"] = common::fixture("job-indexed-create.json")["request"]["object"].clone();
    });
    let object_not_an_object = with_request(review.clone(), |r| r["object"] = json!("llama-ft"));
    let object_missing = with_request(review.clone(), |r| {
        r.as_object_mut().expect("map").remove("object");
    });
    let no_uid = with_request(review.clone(), |r| {
        r.as_object_mut().expect("map").remove("uid");
    });
    let bad_operation = with_request(review.clone(), |r| r["operation"] = json!("MERGE"));
    let scale_bad_replicas = {
        let mut scale = common::fixture("statefulset-scale-subresource.json");
        scale["request"]["object"]["spec"]["replicas"] = json!("two");
        serde_json::to_vec(&scale).expect("json")
    };
    let invalid: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "missing request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "",
            "no request",
        ),
        (
            "null request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#
                .to_vec(),
            "",
            "no request",
        ),
        (
            "object does not match its kind",
            object_kind_mismatch,
            &uid,
            "request.kind is apps/v1 StatefulSet but request.object is batch/v1 Job",
        ),
        (
            "object is a string",
            object_not_an_object,
            &uid,
            "not a StatefulSet",
        ),
        (
            "object missing",
            object_missing,
            &uid,
            "request.object is missing",
        ),
        ("no uid", no_uid, "", "uid"),
        ("unknown operation", bad_operation, &uid, "MERGE"),
        (
            "scale replicas not a number",
            scale_bad_replicas,
            "aa0fce72-9b80-4105-bc0e-8eab320a9ef2",
            "spec.replicas",
        ),
    ];
    for (case, body, uid, reason) in invalid {
        let reply = post(&state, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{case}: {}", reply.text());
        let response = check_review_envelope(&reply.json(), uid);
        assert_eq!(response["allowed"], false, "{case}: {response}");
        assert_eq!(response["status"]["code"], 400, "{case}: {response}");
        assert_eq!(
            response["status"]["reason"], "InvalidRequest",
            "{case}: {response}"
        );
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "{case}: {message}");
    }

    // Not JSON by Content-Type: 415.
    for content_type in [Some("text/plain"), Some("application/yaml"), None] {
        let mut request = Request::post("/mutate");
        if let Some(ct) = content_type {
            request = request.header(header::CONTENT_TYPE, ct);
        }
        let reply = send(&state, request.body(Body::from(good.clone())).expect("req")).await;
        assert_eq!(
            reply.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        assert!(
            reply.text().contains("application/json"),
            "{}",
            reply.text()
        );
    }
    // `application/json; charset=utf-8` is JSON.
    let reply = send(
        &state,
        Request::post("/mutate")
            .header(header::CONTENT_TYPE, "application/json; charset=utf-8")
            .body(Body::from(good.clone()))
            .expect("req"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);

    // Too large: 413, whether announced by Content-Length or streamed.
    let mut huge =
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"x\":\"".to_vec();
    huge.resize(5 * 1024 * 1024, b'a');
    huge.extend_from_slice(b"\"}");
    let reply = send(
        &state,
        Request::post("/mutate")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, huge.len())
            .body(Body::from(huge.clone()))
            .expect("req"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = huge
        .chunks(64 * 1024)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let reply = post(&state, Body::from_stream(futures::stream::iter(chunks))).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);

    // Wrong method and path.
    let reply = send(
        &state,
        Request::get("/mutate").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    let reply = send(
        &state,
        Request::post("/validate").body(Body::empty()).expect("req"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    // Every answer was counted, with closed label sets.
    let metrics = state.metrics.encode();
    for line in [
        "trainwire_webhook_rejected_requests_total{reason=\"bad_request\"} 6",
        "trainwire_webhook_rejected_requests_total{reason=\"unsupported_media_type\"} 3",
        "trainwire_webhook_rejected_requests_total{reason=\"too_large\"} 2",
        "trainwire_webhook_admissions_total{kind=\"Other\",operation=\"UNKNOWN\",outcome=\"invalid\"} 4",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

/// The StatefulSet the scale fixture scales, as the webhook would have
/// stored it (injected when the engine injects).
fn stored_statefulset(edit: impl FnOnce(&mut Value)) -> Value {
    let mut sts = common::fixture("statefulset-update-scale.json")["request"]["object"].clone();
    edit(&mut sts);
    match trainwire_engine::mutation::mutate(
        &sts,
        Some("trainwire-test"),
        &trainwire_engine::policy::Profile::default(),
    ) {
        Ok(trainwire_engine::mutation::Outcome::Mutated(m)) => m.object,
        _ => sts,
    }
}

async fn scale_answer(source: Arc<dyn StatefulSetSource>, body: Vec<u8>) -> Value {
    let state = state_with(source);
    let reply = post(&state, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    check_review_envelope(&reply.json(), "aa0fce72-9b80-4105-bc0e-8eab320a9ef2")
}

#[tokio::test]
async fn scale_guard_refuses_kubectl_scale_of_a_fixed_size_world() {
    let scale = common::fixture_bytes("statefulset-scale-subresource.json");
    let fixed = stored_statefulset(|_| {});
    let fake = FakeStatefulSets::found("trainwire-test", "llama-ft", fixed);
    let response = scale_answer(fake.clone(), scale).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 403, "{response}");
    let message = response["status"]["message"].as_str().expect("message");
    for words in ["kubectl apply", "kubectl patch", "replicas"] {
        assert!(message.contains(words), "{words} not in {message}");
    }
    assert_eq!(
        *fake.lookups.lock().expect("lock"),
        vec![("trainwire-test".to_string(), "llama-ft".to_string())]
    );
}

#[tokio::test]
async fn scale_guard_lets_an_elastic_world_scale_within_its_range() {
    let scale = common::fixture_bytes("statefulset-scale-subresource.json");
    let elastic = stored_statefulset(|sts| {
        sts["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("1:4");
    });
    let response = scale_answer(
        FakeStatefulSets::found("trainwire-test", "llama-ft", elastic),
        scale.clone(),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");

    // Outside the range: refused.
    let narrow = stored_statefulset(|sts| {
        sts["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("3:4");
    });
    let response = scale_answer(
        FakeStatefulSets::found("trainwire-test", "llama-ft", narrow),
        scale,
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
}

#[tokio::test]
async fn scale_guard_leaves_other_statefulsets_alone() {
    let scale = common::fixture_bytes("statefulset-scale-subresource.json");
    let plain = stored_statefulset(|sts| {
        sts["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove("trainwire.dev/inject");
    });
    let response = scale_answer(
        FakeStatefulSets::found("trainwire-test", "llama-ft", plain),
        scale.clone(),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");

    // Same size as before: no lookup at all.
    let mut same: Value = serde_json::from_slice(&scale).expect("json");
    same["request"]["object"]["spec"]["replicas"] = json!(3);
    let fake = Arc::new(FakeStatefulSets::default());
    let response = scale_answer(fake.clone(), serde_json::to_vec(&same).expect("json")).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(fake.lookups.lock().expect("lock").is_empty());
}

/// When the guard cannot know, it allows with a warning that says why, and
/// counts it: its own failure never denies a scale in the cluster.
#[tokio::test]
async fn scale_guard_allows_with_a_warning_when_it_cannot_know() {
    let scale = common::fixture_bytes("statefulset-scale-subresource.json");
    let cases: Vec<(Arc<dyn StatefulSetSource>, &str, &str)> = vec![
        (
            FakeStatefulSets::with(
                "trainwire-test",
                "llama-ft",
                Lookup::Unknown(
                    Unknown::watch_error,
                    "the webhook's StatefulSet watch is failing: error trying to connect: tcp connect error: Connection refused".into(),
                ),
            ),
            "Connection refused",
            "watch_error",
        ),
        (
            Arc::new(StatefulSetCache::unavailable("no kubeconfig found".into())),
            "no kubeconfig found",
            "no_client",
        ),
        (
            Arc::new(FakeStatefulSets::default()),
            "not in the webhook's StatefulSet cache yet",
            "not_cached",
        ),
    ];
    for (source, why, reason) in cases {
        let state = state_with(source);
        let reply = post(&state, scale.clone()).await;
        let response = check_review_envelope(&reply.json(), "aa0fce72-9b80-4105-bc0e-8eab320a9ef2");
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "{response}");
        let warning = response["warnings"][0].as_str().unwrap_or_default();
        assert!(
            warning
                .starts_with("trainwire could not check this scale of trainwire-test/llama-ft (")
                && warning.contains(why)
                && warning.contains("kubectl apply or patch"),
            "{warning}"
        );
        let metrics = state.metrics.encode();
        let line = format!("trainwire_webhook_scale_guard_unknown_total{{reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
}

#[tokio::test]
async fn probes_and_metrics() {
    let state = state();
    let probe = |path: &str| {
        let state = state.clone();
        let request = Request::get(path).body(Body::empty()).expect("req");
        async move {
            let response = probe_router(state)
                .oneshot(request)
                .await
                .expect("infallible");
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(probe("/healthz").await.0, StatusCode::OK);
    // Not bound, no certificate: not ready, and says why.
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("not bound"), "{body}");
    state.readiness.set_bound();
    let (status, body) = probe("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("no serving certificate"), "{body}");

    post(
        &state,
        common::fixture_bytes("pod-create-from-deployment.json"),
    )
    .await;
    let (status, metrics) = probe("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for needle in [
        "trainwire_webhook_admissions_total{kind=\"Pod\",operation=\"CREATE\",outcome=\"allowed\"} 1",
        "trainwire_webhook_admission_duration_seconds_bucket{le=",
        "trainwire_webhook_certificate_expiry_timestamp_seconds 0",
        "# EOF",
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
}

// Exact answers: each capture's expected AdmissionResponse is checked in
// (`tests/fixtures/admission/expected/<capture>.json`), the patch decoded from
// base64 to JSON so that a review shows what changed.
// `TRAINWIRE_BLESS=1 cargo nextest run -p trainwire-webhook --test router goldens`
// rewrites them.

/// The answer as checked in: the HTTP status and the review's `response`
/// without its `uid` (the request's), with the patch decoded.
fn golden_answer(reply: &Reply) -> Value {
    let mut response = reply.json()["response"].clone();
    if let Some(map) = response.as_object_mut() {
        map.remove("uid");
        if let Some(patch) = map.get("patch").and_then(Value::as_str) {
            let bytes = common::base64_decode(patch);
            let decoded: Value = serde_json::from_slice(&bytes).expect("the patch is JSON");
            map.insert("patch".to_string(), decoded);
        }
    }
    json!({ "httpStatus": reply.status.as_u16(), "response": response })
}

#[tokio::test]
async fn every_captured_review_gets_exactly_its_checked_in_answer() {
    let expected_dir = trainwire_test_support::admission_fixtures_dir().join("expected");
    let bless = std::env::var_os("TRAINWIRE_BLESS").is_some();
    if bless {
        std::fs::create_dir_all(&expected_dir).expect("create expected/");
    }
    // The same state as the other tests: the default policy, and a
    // StatefulSet source that knows no StatefulSet.
    let state = state();
    let names = common::fixture_names();
    let mut differences = Vec::new();
    for name in &names {
        let reply = post(&state, common::fixture_bytes(name)).await;
        let got = golden_answer(&reply);
        let path = expected_dir.join(name);
        let text = serde_json::to_string_pretty(&got).expect("serialize") + "\n";
        if bless {
            std::fs::write(&path, &text).expect("write the expected answer");
            continue;
        }
        match std::fs::read(&path) {
            Ok(bytes) => {
                let want: Value = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
                if want != got {
                    differences.push(format!("{name}: the answer changed; now:\n{text}"));
                }
            }
            Err(e) => differences.push(format!("{name}: no {} ({e})", path.display())),
        }
    }
    // An expected answer without its capture is stale.
    for entry in std::fs::read_dir(&expected_dir)
        .expect("read expected/")
        .flatten()
    {
        let file = entry.file_name().to_string_lossy().into_owned();
        if !names.contains(&file) {
            if bless {
                std::fs::remove_file(entry.path()).expect("remove a stale answer");
            } else {
                differences.push(format!("expected/{file} has no capture"));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{}\n\nIf the change is intended, rerun with TRAINWIRE_BLESS=1 and review the diff.",
        differences.join("\n")
    );
}

/// The StatefulSet created paused (`statefulset-create-zero-replicas.json`),
/// as the webhook stored it, behind the captured `kubectl scale`: refused
/// from 0 without `trainwire.dev/nnodes` (its pods hold no world size);
/// allowed with an annotation that covers the new size.
/// The review's text with `request.object` written before `request.kind`:
/// the webhook then cannot read the object in the same pass as the review
/// (it does not know its kind yet) and reads it as JSON text first.
fn object_first(review: &Value) -> Vec<u8> {
    let mut request = review["request"].clone();
    let object = request
        .as_object_mut()
        .and_then(|r| r.remove("object"))
        .unwrap_or(Value::Null);
    let rest = serde_json::to_string(&request).expect("json");
    let request = format!("{{\"object\":{object},{}", &rest[1..]);
    let mut envelope = review.clone();
    envelope["request"] = Value::Null;
    serde_json::to_string(&envelope)
        .expect("json")
        .replacen("\"request\":null", &format!("\"request\":{request}"), 1)
        .into_bytes()
}

/// A StatefulSet or Job review is read in one pass (the object straight
/// into the typed workload, `request.kind` coming first as the apiserver
/// writes it), any other in two. Both readings answer exactly alike, for
/// every capture and for objects the typed model cannot read.
#[tokio::test]
async fn the_one_pass_reading_answers_exactly_like_the_two_pass_one() {
    let state = state();
    let mut reviews: Vec<(String, Value)> = common::fixture_names()
        .into_iter()
        .map(|name| {
            let review = common::fixture(&name);
            (name, review)
        })
        .collect();
    let base = common::fixture("statefulset-create.json");
    type Edit = (&'static str, fn(&mut Value));
    let edits: [Edit; 6] = [
        ("replicas is a string", |o| {
            o["spec"]["replicas"] = "two".into()
        }),
        ("the object is a Job", |o| o["kind"] = "Job".into()),
        ("the object has no kind", |o| {
            o.as_object_mut().map(|m| m.remove("kind"));
        }),
        ("an annotation is a number", |o| {
            o["metadata"]["annotations"]["trainwire.dev/nnodes"] = 2.into()
        }),
        ("the object is an array", |o| *o = Value::Array(Vec::new())),
        ("the object is null", |o| *o = Value::Null),
    ];
    for (what, edit) in edits {
        let mut review = base.clone();
        edit(&mut review["request"]["object"]);
        reviews.push((what.to_string(), review));
    }
    for (what, review) in &reviews {
        let one_pass = post(&state, serde_json::to_vec(review).expect("json")).await;
        let two_pass = post(&state, object_first(review)).await;
        assert_eq!(one_pass.status, two_pass.status, "{what}");
        assert_eq!(one_pass.text(), two_pass.text(), "{what}");
    }
}

/// Every JSON pointer inside `v` (objects and arrays, leaves included).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

mod damaged {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// The two readings agree on reviews whose request has one member
        /// replaced by a small JSON value (a string for a number, null, an
        /// empty object, a mismatched kind...), StatefulSets and Jobs.
        #[test]
        fn the_two_readings_agree_on_damaged_reviews(
            capture in prop::sample::select(vec![
                "statefulset-create.json",
                "statefulset-update-template.json",
                "job-indexed-create.json",
                "job-nonindexed-create.json",
            ]),
            pick in any::<prop::sample::Index>(),
            value in prop_oneof![
                Just(Value::Null),
                Just(json!({})),
                Just(json!([])),
                Just(json!(true)),
                any::<i64>().prop_map(|n| json!(n)),
                "[a-zA-Z0-9/.:-]{0,12}".prop_map(Value::String),
            ],
        ) {
            let mut review = common::fixture(capture);
            let mut paths = Vec::new();
            pointers(&review["request"], String::new(), &mut paths);
            let path = paths[pick.index(paths.len())].clone();
            if let Some(slot) = review["request"].pointer_mut(&path) {
                *slot = value;
            }
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            let (one_pass, two_pass) = runtime.block_on(async {
                let state = state();
                (
                    post(&state, serde_json::to_vec(&review).expect("json")).await,
                    post(&state, object_first(&review)).await,
                )
            });
            prop_assert_eq!(one_pass.status, two_pass.status, "{}", path);
            prop_assert_eq!(one_pass.text(), two_pass.text(), "{}", path);
        }
    }
}

#[tokio::test]
async fn scale_guard_on_the_statefulset_created_paused() {
    let scale: Value = common::fixture("statefulset-scale-subresource.json");
    let mut from_zero = scale.clone();
    from_zero["request"]["oldObject"]["spec"]["replicas"] = json!(0);
    from_zero["request"]["object"]["spec"]["replicas"] = json!(2);
    let body = serde_json::to_vec(&from_zero).expect("json");
    let paused = |nnodes: Option<&str>| {
        let mut sts =
            common::fixture("statefulset-create-zero-replicas.json")["request"]["object"].clone();
        if let Some(n) = nnodes {
            sts["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!(n);
        }
        let Ok(trainwire_engine::mutation::Outcome::Mutated(m)) =
            trainwire_engine::mutation::mutate(
                &sts,
                Some("trainwire-test"),
                &trainwire_engine::policy::Profile::default(),
            )
        else {
            panic!("injected");
        };
        // Stored under the name the captured Scale is for.
        let mut stored = m.object;
        stored["metadata"]["name"] = json!("llama-ft");
        stored["metadata"]["namespace"] = json!("trainwire-test");
        stored
    };
    for (nnodes, allowed) in [
        (None, false),
        (Some("2"), true),
        (Some("1:4"), true),
        (Some("3"), false),
    ] {
        let response = scale_answer(
            FakeStatefulSets::found("trainwire-test", "llama-ft", paused(nnodes)),
            body.clone(),
        )
        .await;
        assert_eq!(
            response["allowed"], allowed,
            "nnodes {nnodes:?}: {response}"
        );
        if nnodes.is_none() {
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("injected paused"), "{message}");
        }
    }
}

/// `spec.ordinals.start` renumbers a StatefulSet's pods: no pod 0 hosts the
/// rendezvous. Refused on CREATE and on an UPDATE that sets it on an
/// injected StatefulSet, through the server's one-pass reading.
#[tokio::test]
async fn a_statefulset_whose_ordinals_do_not_start_at_zero_is_refused() {
    let state = state();
    for fixture in [
        "statefulset-create.json",
        "statefulset-update-template.json",
    ] {
        let review = common::fixture(fixture);
        let name = review["request"]["name"]
            .as_str()
            .expect("name")
            .to_string();
        let body = with_request(review, |request| {
            request["object"]["spec"]["ordinals"] = json!({"start": 3});
        });
        let reply = post(&state, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{fixture}: {}", reply.text());
        let response = reply.json()["response"].clone();
        assert_eq!(response["allowed"], false, "{fixture}: {response}");
        assert_eq!(response["status"]["code"], 403, "{fixture}: {response}");
        let message = response["status"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!(
                "StatefulSet {name} has spec.ordinals.start 3, so its pods are {name}-3, {name}-4, ...; a torchrun world needs pod {name}-0"
            )),
            "{fixture}: {message}"
        );
        assert!(
            message.ends_with("remove spec.ordinals or set start: 0"),
            "{message}"
        );
    }
}

/// A Job's template is immutable, so an UPDATE of an injected Job is let
/// through untouched; when it moves `parallelism` off the injected world
/// size (a `kubectl patch`, Kueue's partial admission) it says so.
#[tokio::test]
async fn a_job_update_that_leaves_its_world_size_is_warned() {
    let state = state();
    let create = common::fixture("job-indexed-create.json");
    let reply = post(&state, serde_json::to_vec(&create).expect("json")).await;
    let injected =
        common::apply_response_patch(&reply.json()["response"], &create["request"]["object"]);
    let name = injected["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    let parallelism = injected["spec"]["parallelism"]
        .as_i64()
        .expect("parallelism");
    for (new, warned) in [(parallelism, false), (parallelism + 1, true)] {
        let body = with_request(common::fixture("job-update-label.json"), |request| {
            request["name"] = json!(name);
            request["object"] = injected.clone();
            request["object"]["spec"]["parallelism"] = json!(new);
        });
        let reply = post(&state, body).await;
        let response = &reply.json()["response"];
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "{response}");
        let expected =
            format!("parallelism {new} does not fit PET_NNODES={parallelism} of the pods");
        let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            warnings
                .iter()
                .any(|w| w.as_str().is_some_and(|w| w.starts_with(&expected))),
            warned,
            "parallelism {new}: {response}"
        );
    }
}
