//! The scale guard's StatefulSet watch cache against a mock API server
//! (kube-rs's `tower-test` pattern): unknown until the first list, then
//! answering from the cache with no request per lookup, unknown (allow with
//! a warning) while the watch fails, and known again once it recovers.
//!
//! The StatefulSet is the one a real kube-apiserver sent
//! (`tests/fixtures/admission/statefulset-create.json`), injected by the real
//! engine, as stored.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use trainwire_webhook::scale::{self, Lookup, StatefulSetCache, StatefulSetSource, Unknown};

const BOUND: Duration = Duration::from_secs(30);
const NS: &str = "trainwire-test";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn stored_statefulset() -> Result<Value> {
    let path = trainwire_tests::admission_fixtures_dir().join("statefulset-create.json");
    let review: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let object = &review["request"]["object"];
    let Ok(trainwire_engine::mutation::Outcome::Mutated(m)) = trainwire_engine::mutation::mutate(
        object,
        Some(NS),
        &trainwire_engine::policy::Profile::default(),
    ) else {
        bail!("the fixture is injected");
    };
    let mut stored = m.object;
    stored["metadata"]["uid"] = json!("6a1f0f3e-0d3b-4a36-9d6a-1b3c51d8a002");
    stored["metadata"]["resourceVersion"] = json!("1001");
    Ok(stored)
}

fn reply(
    respond: tower_test::mock::SendResponse<Response<Body>>,
    status: StatusCode,
    body: &Value,
) {
    let response = Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()));
    match response {
        Ok(r) => respond.send_response(r),
        Err(e) => respond.send_error(e),
    }
}

/// The next request, which must be a list (not a watch) of StatefulSets.
async fn next(
    handle: &mut Handle,
) -> Result<(
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
)> {
    let (request, respond) = tokio::time::timeout(BOUND, handle.next_request())
        .await
        .context("no request from the watch")?
        .context("the client is gone")?;
    ensure!(
        request.uri().path() == "/apis/apps/v1/statefulsets",
        "unexpected request {}",
        request.uri()
    );
    Ok((request, respond))
}

fn is_watch(request: &Request<Body>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.contains("watch=true"))
}

/// Waits (bounded) until the cache's answer satisfies `pred`.
async fn until(cache: &StatefulSetCache, what: &str, pred: impl Fn(&Lookup) -> bool) -> Result<()> {
    let start = Instant::now();
    loop {
        if pred(&cache.lookup(NS, "llama-ft")) {
            return Ok(());
        }
        if start.elapsed() > BOUND {
            bail!(
                "timed out waiting for: {what}; last {:?}",
                cache.lookup(NS, "llama-ft")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_guard_answers_from_the_watch_cache_and_allows_when_it_cannot_know() -> Result<()> {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let (cache, writer) = StatefulSetCache::new();

    // Before the first list: not synced, so a scale is allowed with a warning.
    assert!(matches!(
        cache.lookup(NS, "llama-ft"),
        Lookup::Unknown(Unknown::not_synced, _)
    ));
    let watch = tokio::spawn(cache.clone().run(client, writer));

    // The initial list holds the injected StatefulSet.
    let sts = stored_statefulset()?;
    let (request, respond) = next(&mut handle).await?;
    ensure!(
        !is_watch(&request),
        "expected the initial list, got {}",
        request.uri()
    );
    reply(
        respond,
        StatusCode::OK,
        &json!({"apiVersion": "apps/v1", "kind": "StatefulSetList",
                "metadata": {"resourceVersion": "1001"}, "items": [sts]}),
    );
    until(&cache, "the StatefulSet is cached", |l| {
        matches!(l, Lookup::Found(_))
    })
    .await?;

    // Answered from the cache: the guard refuses the fixed world's scale,
    // allows a StatefulSet it does not hold with a warning, and makes no
    // request for either.
    let (request, held_watch) = next(&mut handle).await?;
    ensure!(
        is_watch(&request),
        "expected the watch, got {}",
        request.uri()
    );
    let verdict = scale::decide(|| cache.lookup(NS, "llama-ft"), NS, "llama-ft", 3, Some(2));
    ensure!(matches!(verdict, scale::Verdict::Refuse(_)), "{verdict:?}");
    let verdict = scale::decide(|| cache.lookup(NS, "redis"), NS, "redis", 3, Some(2));
    ensure!(
        matches!(
            verdict,
            scale::Verdict::AllowUnknown(Unknown::not_cached, _)
        ),
        "{verdict:?}"
    );

    // The watch fails (RBAC taken away): unknown, allowed with a warning.
    reply(
        held_watch,
        StatusCode::FORBIDDEN,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "statefulsets.apps is forbidden: User \"system:serviceaccount:trainwire-system:trainwire-webhook\" cannot watch resource \"statefulsets\"",
                "reason": "Forbidden", "code": 403}),
    );
    until(
        &cache,
        "the watch error is known",
        |l| matches!(l, Lookup::Unknown(Unknown::watch_error, why) if why.contains("forbidden")),
    )
    .await?;
    let verdict = scale::decide(|| cache.lookup(NS, "llama-ft"), NS, "llama-ft", 3, Some(2));
    let scale::Verdict::AllowUnknown(Unknown::watch_error, warning) = verdict else {
        bail!("{verdict:?}");
    };
    ensure!(warning.contains("use kubectl apply or patch"), "{warning}");

    // It recovers (the watcher backs off and watches again, or lists
    // again): the next event makes the cache trusted again.
    let mut modified = stored_statefulset()?;
    modified["metadata"]["resourceVersion"] = json!("1002");
    let (request, respond) = next(&mut handle).await?;
    if is_watch(&request) {
        let event = json!({"type": "MODIFIED", "object": modified});
        let response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from(format!("{event}\n").into_bytes()))?;
        respond.send_response(response);
    } else {
        reply(
            respond,
            StatusCode::OK,
            &json!({"apiVersion": "apps/v1", "kind": "StatefulSetList",
                    "metadata": {"resourceVersion": "1002"}, "items": [modified]}),
        );
    }
    until(&cache, "the cache is trusted again", |l| {
        matches!(l, Lookup::Found(_))
    })
    .await?;
    watch.abort();
    Ok(())
}
