//! Hostile input: reviews far larger than any real pod, up to the body limit,
//! are answered in bounded time and memory (the array diff used to allocate a
//! quadratic table: 10 s and 3 GB for 20,000 env entries). The bounds are
//! loose (debug build, shared machine); `admission-bench` measures the real
//! figures in release.
//!
//! Each test runs in its own process under nextest, so the process's peak
//! RSS (`VmHWM`) is the test's.

#[allow(unused_imports)] // not every shared helper is used here
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use trainwire_webhook::scale::StatefulSetCache;
use trainwire_webhook::serve::{AppState, MAX_BODY_BYTES, router};

fn state() -> AppState {
    common::app_state(Arc::new(StatefulSetCache::unavailable(
        "no API in this test".to_string(),
    )))
}

/// The captured StatefulSet CREATE with `n` extra env entries on the trainer
///.
fn review_with_env(n: usize) -> (Value, Vec<u8>) {
    let mut review = common::fixture("statefulset-create.json");
    let env: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("USER_VAR_{i:07}"), "value": format!("value-{i:07}")}))
        .collect();
    review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["env"] = json!(env);
    let body = serde_json::to_vec(&review).expect("json");
    (review, body)
}

fn peak_rss_kib() -> u64 {
    trainwire_test_support::process::status_kib("self", "VmHWM").unwrap_or(0)
}

/// Post the review, check it is patched, and return the elapsed time and
/// the growth of the peak RSS in MiB.
async fn admit(review: &Value, body: Vec<u8>) -> (Duration, f64) {
    let (response, elapsed, grown) = post(body).await;
    let response = &response;
    assert_eq!(response["allowed"], true, "{response}");
    let patched = common::apply_response_patch(response, &review["request"]["object"]);
    let env = common::trainer(&patched)["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        common::env_value(common::trainer(&patched), "PET_NNODES").is_some(),
        "injected"
    );
    let user = review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(
        env.len() > user,
        "the user's env is kept, trainwire's added"
    );
    (elapsed, grown)
}

#[tokio::test]
async fn twenty_thousand_env_entries_are_answered_quickly() {
    let (review, body) = review_with_env(20_000);
    let (elapsed, grown) = admit(&review, body).await;
    // Release: a few ms (docs/benchmarks.md). The quadratic diff took 10 s
    // and 3.25 GB.
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert!(grown < 256.0, "peak RSS grew by {grown:.0} MiB");
}

#[tokio::test]
async fn a_review_at_the_body_limit_is_answered_in_bounded_time() {
    // Grow the env until the body is just under the limit.
    let base = review_with_env(0).1.len();
    let thousand = review_with_env(1_000).1.len() - base;
    let n = (MAX_BODY_BYTES - base) * 1_000 / thousand - 100;
    let (review, body) = review_with_env(n);
    assert!(body.len() <= MAX_BODY_BYTES, "{} bytes", body.len());
    assert!(body.len() > MAX_BODY_BYTES * 9 / 10, "{} bytes", body.len());
    let (elapsed, grown) = admit(&review, body).await;
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    assert!(grown < 1024.0, "peak RSS grew by {grown:.0} MiB");
}

/// The captured StatefulSet CREATE with the template's volumes replaced by
/// `n` one-line `emptyDir` volumes (about 30 bytes of JSON each, 3.2 KB each
/// once typed), as large as the body limit allows; with or without the
/// opt-in annotation.
fn review_with_volumes(opted_in: bool) -> (Value, Vec<u8>) {
    let mut review = common::fixture("statefulset-create.json");
    if !opted_in
        && let Some(a) = review["request"]["object"]["metadata"]["annotations"].as_object_mut()
    {
        a.retain(|k, _| !k.starts_with("trainwire.dev/"));
    }
    let base = serde_json::to_vec(&review).expect("json").len();
    let n = (MAX_BODY_BYTES - base) / r#"{"name":"v000000","emptyDir":{}},"#.len() - 100;
    let volumes: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("v{i:06}"), "emptyDir": {}}))
        .collect();
    review["request"]["object"]["spec"]["template"]["spec"]["volumes"] = json!(volumes);
    let body = serde_json::to_vec(&review).expect("json");
    assert!(body.len() <= MAX_BODY_BYTES, "{} bytes", body.len());
    assert!(body.len() > MAX_BODY_BYTES * 9 / 10, "{} bytes", body.len());
    (review, body)
}

/// Post a review; the answer's `response`, the time and the growth of the
/// peak RSS in MiB.
async fn post(body: Vec<u8>) -> (Value, Duration, f64) {
    let router = router(state());
    let before = peak_rss_kib();
    let started = Instant::now();
    let response = router
        .oneshot(
            Request::post("/mutate")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body))
                .expect("request"),
        )
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let elapsed = started.elapsed();
    let grown = peak_rss_kib().saturating_sub(before) as f64 / 1024.0;
    let answer: Value = serde_json::from_slice(&bytes).expect("a review");
    (answer["response"].clone(), elapsed, grown)
}

/// An opted-in StatefulSet with 130,000 volumes (typed, over 400 MB) is
/// refused from a quick pass over its text, naming the count and the bound.
#[tokio::test]
async fn an_opted_in_template_with_a_hundred_thousand_volumes_is_refused_cheaply() {
    let (_, body) = review_with_volumes(true);
    let (response, elapsed, grown) = post(body).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("volumes; trainwire injects into pods of at most 1024"),
        "{message}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(grown < 128.0, "peak RSS grew by {grown:.0} MiB");
}

/// The same StatefulSet without the opt-in annotation is not trainwire's:
/// allowed untouched, never read into the typed model.
#[tokio::test]
async fn a_template_with_a_hundred_thousand_volumes_not_opted_in_passes_cheaply() {
    let (_, body) = review_with_volumes(false);
    let (response, elapsed, grown) = post(body).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(grown < 128.0, "peak RSS grew by {grown:.0} MiB");
}

/// Fuzzing finds, kept: each answer is a refusal or a patch that applies to
/// the object (`tests/data/fuzz/`; the file names say what was mutated).
#[tokio::test]
async fn fuzzed_reviews_get_a_refusal_or_a_patch_that_applies() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/data/fuzz") {
        let path = entry.expect("entry").path();
        let body = std::fs::read(&path).expect("read");
        let review: Value = serde_json::from_slice(&body).expect("json");
        let (response, _, _) = post(body).await;
        if response["allowed"] == true {
            // Panics if the patch does not apply.
            common::apply_response_patch(&response, &review["request"]["object"]);
        } else {
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "{}: {response}", path.display());
            assert!(
                !message.contains("internal error"),
                "{}: {message}",
                path.display()
            );
        }
        seen += 1;
    }
    assert!(seen > 0, "no fuzzed reviews in {}", dir.display());
}
