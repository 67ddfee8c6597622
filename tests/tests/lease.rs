//! Two webhook replicas competing for the controllers' Lease, against an
//! in-memory Lease API (the `tower-test` mock client, answered by a small
//! fake of the apiserver's Lease semantics: GET, create, server-side apply
//! with a conflict on `holderIdentity` owned by another field manager, and
//! strategic merge). Only the holder acts; when the holder is cut off from
//! the API server, it stops acting and the other takes over and acts once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use trainwire_controllers::lease::{LeaseConfig, run_while_leader};

const NS: &str = "trainwire-system";

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The Lease as the fake apiserver stores it.
#[derive(Default)]
struct Store {
    lease: Option<Value>,
    /// The field manager that owns `spec.holderIdentity`.
    holder_manager: Option<String>,
    version: u64,
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": reason})
}

impl Store {
    fn answer(
        &mut self,
        method: &Method,
        query: &str,
        content_type: &str,
        body: &Value,
    ) -> (u16, Value) {
        let manager = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
            .unwrap_or_default()
            .to_string();
        match *method {
            Method::GET => match &self.lease {
                Some(l) => (200, l.clone()),
                None => (404, status(404, "NotFound")),
            },
            Method::POST => {
                if self.lease.is_some() {
                    return (409, status(409, "AlreadyExists"));
                }
                let mut l = body.clone();
                self.version += 1;
                l["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.lease = Some(l.clone());
                (201, l)
            }
            Method::PATCH => {
                let Some(lease) = self.lease.as_mut() else {
                    return (404, status(404, "NotFound"));
                };
                let spec = body["spec"].as_object().cloned().unwrap_or_default();
                if let Some(Value::String(new_holder)) = spec.get("holderIdentity") {
                    let current = lease["spec"]["holderIdentity"].as_str();
                    let owned_by_other =
                        self.holder_manager.as_ref().is_some_and(|m| *m != manager);
                    if content_type.contains("apply-patch")
                        && owned_by_other
                        && current.is_some_and(|c| c != new_holder)
                    {
                        return (409, status(409, "Conflict"));
                    }
                    self.holder_manager = Some(manager.clone());
                }
                if !lease["spec"].is_object() {
                    lease["spec"] = json!({});
                }
                for (k, v) in spec {
                    if v.is_null() {
                        if let Some(s) = lease["spec"].as_object_mut() {
                            s.remove(&k);
                        }
                        if k == "holderIdentity" {
                            self.holder_manager = None;
                        }
                    } else {
                        lease["spec"][k] = v;
                    }
                }
                self.version += 1;
                lease["metadata"]["resourceVersion"] = json!(self.version.to_string());
                (200, lease.clone())
            }
            _ => (405, status(405, "MethodNotAllowed")),
        }
    }
}

/// Answer one replica's requests from the shared store, or, once `cut` is
/// set, fail them as a replica cut off from the API server sees it.
async fn serve(mut handle: Handle, store: Arc<Mutex<Store>>, cut: Arc<AtomicBool>) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (code, reply) = if cut.load(Ordering::SeqCst) {
            (503, status(503, "ServiceUnavailable"))
        } else {
            let content_type = parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            store.lock().unwrap_or_else(|p| p.into_inner()).answer(
                &parts.method,
                parts.uri.query().unwrap_or_default(),
                &content_type,
                &body,
            )
        };
        let response = Response::builder()
            .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()));
        match response {
            Ok(r) => respond.send_response(r),
            Err(e) => respond.send_error(e),
        }
    }
}

/// What the replicas' controllers did, in order.
type Log = Arc<Mutex<Vec<String>>>;

fn log(l: &Log, line: String) {
    l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
}

fn lines(l: &Log) -> Vec<String> {
    l.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Records `stopped <id>` when the controllers' task is aborted.
struct Stopped(Log, &'static str);

impl Drop for Stopped {
    fn drop(&mut self) {
        log(&self.0, format!("stopped {}", self.1));
    }
}

fn replica(
    id: &'static str,
    store: Arc<Mutex<Store>>,
    cut: Arc<AtomicBool>,
    events: Log,
) -> tokio::task::JoinHandle<()> {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(serve(handle, store, cut));
    let client = Client::new(service, "default");
    let mut config = LeaseConfig::new(NS.to_string(), id.to_string());
    config.duration_seconds = 2;
    config.grace_seconds = 1;
    tokio::spawn(async move {
        // As `lease::supervise` does: start over after a Lease error.
        loop {
            let events = events.clone();
            let _ = run_while_leader(client.clone(), config.clone(), move || {
                let events = events.clone();
                async move {
                    let _guard = Stopped(events.clone(), id);
                    // "Acting": one force-delete, say, then wait as a
                    // controller does.
                    log(&events, format!("acted {id}"));
                    futures::future::pending::<()>().await;
                }
            })
            .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

async fn wait_for(events: &Log, what: impl Fn(&[String]) -> bool, within: Duration) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < within {
        if what(&lines(events)) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("timed out; events: {:?}", lines(events))
}

#[tokio::test]
async fn two_replicas_one_acts_and_the_other_takes_over_once() -> Result<()> {
    let store = Arc::new(Mutex::new(Store::default()));
    let events: Log = Arc::new(Mutex::new(Vec::new()));
    let cut_a = Arc::new(AtomicBool::new(false));
    let cut_b = Arc::new(AtomicBool::new(false));
    let a = replica("replica-a", store.clone(), cut_a.clone(), events.clone());
    let b = replica("replica-b", store.clone(), cut_b.clone(), events.clone());

    // One of them acts, the other does not, for several Lease durations
    // (renewals included).
    wait_for(
        &events,
        |e| e.iter().any(|l| l.starts_with("acted")),
        Duration::from_secs(10),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let first = lines(&events);
    ensure!(first.len() == 1, "exactly one replica acts: {first:?}");
    let holder = first[0].trim_start_matches("acted ").to_string();
    let (cut, other) = if holder == "replica-a" {
        (&cut_a, "replica-b")
    } else {
        (&cut_b, "replica-a")
    };
    let held_by = store
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .lease
        .clone();
    ensure!(
        held_by
            .as_ref()
            .and_then(|l| l["spec"]["holderIdentity"].as_str())
            == Some(holder.as_str()),
        "the Lease names the one that acts: {held_by:?}"
    );

    // The holder is cut off from the API server: it cannot renew.
    let cut_at = Instant::now();
    cut.store(true, Ordering::SeqCst);
    wait_for(
        &events,
        |e| e.iter().any(|l| *l == format!("acted {other}")),
        Duration::from_secs(15),
    )
    .await?;
    let takeover = cut_at.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let all = lines(&events);
    eprintln!("events: {all:?}; takeover {takeover:?} after the holder was cut off");
    let stopped = all.iter().position(|l| *l == format!("stopped {holder}"));
    let acted = all.iter().position(|l| *l == format!("acted {other}"));
    ensure!(
        matches!((stopped, acted), (Some(s), Some(a)) if s < a),
        "the cut-off holder stops before the other acts: {all:?}"
    );
    ensure!(
        all.iter()
            .filter(|l| **l == format!("acted {other}"))
            .count()
            == 1
            && all
                .iter()
                .filter(|l| **l == format!("acted {holder}"))
                .count()
                == 1,
        "each acts once: {all:?}"
    );
    a.abort();
    b.abort();
    Ok(())
}
