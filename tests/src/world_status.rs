//! The world controller's view in the end-to-end tests: what
//! `trainwire-controllers` would write in `trainwire.dev/world`, computed
//! by the engine's own `observe` from the pods a [`FakeApiServer`] holds,
//! with the real sidecars' records patched in, and checked against what
//! the trainers did (the first training step after a loss).
//!
//! The fake apiserver listens in a network namespace of its own on the
//! test's bridge ([`api_in`]), so the sidecars in the pods' namespaces reach
//! it as pods reach the apiserver, and a pod cut off loses it too.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod as KubePod;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use trainwire_contract::world::WorldStatus;
use trainwire_engine::world::{Memory, PodView, StoreView, WorldOf, observe, parse_time};

use crate::apiserver::FakeApiServer;
use crate::netns::{self, Network};

/// A fake apiserver in node `api` at `Network::addr(host)` of `net`,
/// applying the pods' patches, served by the returned runtime (keep it
/// until the sidecars are gone).
pub fn api_in(
    net: &mut Network,
    host: u8,
) -> Result<(FakeApiServer, tokio::runtime::Runtime), String> {
    let addr = Network::addr(host);
    let node = net.add_node_named("api", "api", addr, true)?;
    let listener = netns::listen_in(&node.ns, std::net::SocketAddr::from((addr, 0)))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let api = runtime
        .block_on(FakeApiServer::start_on(listener))
        .map_err(|e| format!("the fake apiserver: {e}"))?;
    api.apply_patches();
    Ok((api, runtime))
}

/// The world controller's view of this world, computed as the controller
/// computes it (the engine's `observe`, with its `Memory`) from the pods
/// the fake apiserver holds (the sidecars' records patched in) and the
/// dedicated store's pod, which the test keeps.
pub struct WorldController {
    memory: Memory,
    status: Option<WorldStatus>,
    workload: WorldOf,
    store: Value,
}

/// How long the controller's view may take to show a resumption.
pub const VIEW_WAIT: Duration = Duration::from_secs(30);
/// How far `resumedAt` may lie after the first training step after a loss.
pub const RESUMED_WITHIN: Duration = Duration::from_secs(2);
/// How far before it: the test reads rank 0's step line from a pipe, a few
/// milliseconds after the trainer wrote it, and the step's all-reduce (the
/// traffic the sidecar sees) precedes that line by the optimizer's step.
pub const READ_SLACK: Duration = Duration::from_millis(100);
/// What `resumedBy` may be where the sidecars read everything of the
/// trainer (as in these tests): the collective's traffic, or a spare's
/// take-over (dated by the same observation).
pub const OBSERVED_BY: [&str; 2] = ["collective-traffic", "spare-took-over"];

impl WorldController {
    /// The controller of the injected StatefulSet `sts` (as rendered), in
    /// namespace `namespace`, whose dedicated store (if any) runs.
    pub fn new(sts: &Value, namespace: &str) -> Result<WorldController, String> {
        let set = sts["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let sts: StatefulSet = serde_json::from_value(sts.clone())
            .map_err(|e| format!("the rendered StatefulSet: {e}"))?;
        Ok(WorldController {
            memory: Memory::default(),
            status: None,
            workload: WorldOf::of_statefulset(&sts),
            store: json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("{set}-rdzv-0"), "namespace": namespace,
                    "uid": "store-1", "labels": {"trainwire.dev/rdzv-store": set}},
                "status": {"phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-11-28T00:00:00Z"}],
                    "containerStatuses": [{"name": "store", "image": "s", "imageID": "",
                        "ready": true, "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-11-28T00:00:00Z"}}}]}
            }),
        })
    }

    /// One reconcile: the status now.
    pub fn observe(&mut self, api: &FakeApiServer) -> Result<WorldStatus, String> {
        let now = Timestamp::now();
        let pods: Vec<PodView> = api
            .pods()
            .into_iter()
            .filter_map(|v| serde_json::from_value::<KubePod>(v).ok())
            .filter_map(|p| PodView::of(&p, now))
            .collect();
        let store: KubePod = serde_json::from_value(self.store.clone())
            .map_err(|e| format!("the store pod: {e}"))?;
        let status = observe(
            self.status.as_ref(),
            &mut self.memory,
            &self.workload,
            &pods,
            Some(&[StoreView::of(&store, now)]),
            now,
        );
        self.status = Some(status.clone());
        Ok(status)
    }

    /// The store's container exits now (its pod stays).
    pub fn store_exits(&mut self) {
        let now = Timestamp::now().to_string();
        self.store["status"]["conditions"][0]["status"] = json!("False");
        self.store["status"]["conditions"][0]["lastTransitionTime"] = json!(now);
        self.store["status"]["containerStatuses"][0]["ready"] = json!(false);
        self.store["status"]["containerStatuses"][0]["state"] =
            json!({"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}});
    }

    /// The store's container runs again, Ready, since `at`.
    pub fn store_back(&mut self, at: Timestamp) {
        let at = at.to_string();
        let last = self.store["status"]["containerStatuses"][0]["state"].clone();
        self.store["status"]["conditions"][0]["status"] = json!("True");
        self.store["status"]["conditions"][0]["lastTransitionTime"] = json!(at);
        let c = &mut self.store["status"]["containerStatuses"][0];
        c["ready"] = json!(true);
        c["restartCount"] = json!(1);
        c["lastState"] = last;
        c["state"] = json!({"running": {"startedAt": at}});
    }
}

/// A [`WorldController`] reconciling on its own thread every
/// [`RECONCILE_EVERY`], as the real one reconciles on every pod change: a
/// loss is seen when it happens, not when the test looks.
pub struct Watching {
    controller: std::sync::Arc<std::sync::Mutex<WorldController>>,
    api: FakeApiServer,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often a [`Watching`] controller reconciles.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(250);

impl WorldController {
    /// Reconciles `api`'s pods now and then every [`RECONCILE_EVERY`].
    pub fn watch(mut self, api: &FakeApiServer) -> Result<Watching, String> {
        self.observe(api)?;
        let controller = std::sync::Arc::new(std::sync::Mutex::new(self));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (controller, stop, api) = (controller.clone(), stop.clone(), api.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(mut c) = controller.lock() {
                        let _ = c.observe(&api);
                    }
                    std::thread::sleep(RECONCILE_EVERY);
                }
            })
        };
        Ok(Watching {
            controller,
            api: api.clone(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Watching {
    /// `f` on the controller, between two reconciles.
    pub fn with<R>(&self, f: impl FnOnce(&mut WorldController) -> R) -> Result<R, String> {
        let mut c = self
            .controller
            .lock()
            .map_err(|_| "the controller's thread panicked".to_string())?;
        Ok(f(&mut c))
    }

    /// Reconciles until the last loss is resumed; that status.
    pub fn until_resumed(&self) -> Result<WorldStatus, String> {
        self.until("a resumption", |s| {
            s.last_loss.as_ref().is_some_and(|l| l.resumed_at.is_some())
        })
    }

    /// Reconciles until `done` holds of the status (at most
    /// [`VIEW_WAIT`]); that status.
    pub fn until(
        &self,
        what: &str,
        done: impl Fn(&WorldStatus) -> bool,
    ) -> Result<WorldStatus, String> {
        let api = self.api.clone();
        let deadline = Instant::now() + VIEW_WAIT;
        loop {
            let status = self.with(|c| c.observe(&api))??;
            if done(&status) {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the world status shows no {what} within {VIEW_WAIT:?}: {}",
                    status.to_annotation()
                ));
            }
            std::thread::sleep(RECONCILE_EVERY);
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The wall-clock time of `at`.
pub fn wall(at: Instant) -> Result<Timestamp, String> {
    let t = std::time::SystemTime::now()
        .checked_sub(at.elapsed())
        .ok_or("a time before the epoch")?;
    Timestamp::try_from(t).map_err(|e| format!("{e}"))
}

/// `status`'s last loss against the first training step after it: opened
/// at or after `disrupted` (the cut), resumed at or after the loss, not
/// before `first_step` (but for [`READ_SLACK`]) and within
/// [`RESUMED_WITHIN`] after it, by one of [`OBSERVED_BY`]. The signed gap,
/// in seconds.
pub fn check_resumed(
    status: &WorldStatus,
    disrupted: Timestamp,
    first_step: Timestamp,
) -> Result<f64, String> {
    let loss = status.last_loss.as_ref().ok_or("no loss recorded")?;
    let text = || status.to_annotation();
    let at = parse_time(&loss.at).ok_or_else(|| format!("lastLoss.at: {}", text()))?;
    let resumed = loss
        .resumed_at
        .as_deref()
        .and_then(parse_time)
        .ok_or_else(|| format!("no resumedAt: {}", text()))?;
    // The sidecars' clock is this machine's: the loss is not older than
    // the disruption (a second for the timestamps' rounding).
    if at < disrupted - k8s_openapi::jiff::SignedDuration::from_secs(1) {
        return Err(format!(
            "the loss at {at} is before the disruption at {disrupted}: {}",
            text()
        ));
    }
    if resumed < at {
        return Err(format!(
            "resumed at {resumed}, before the loss at {at}: {}",
            text()
        ));
    }
    let gap = resumed.duration_since(first_step).as_secs_f64();
    if gap < -READ_SLACK.as_secs_f64() || gap > RESUMED_WITHIN.as_secs_f64() {
        return Err(format!(
            "resumedAt {resumed} is {gap:.2}s from the first training step {first_step} (bounds: not before it, at most {RESUMED_WITHIN:?} after): {}",
            text()
        ));
    }
    let by = loss.resumed_by.as_deref().unwrap_or_default();
    if !OBSERVED_BY.contains(&by) {
        return Err(format!(
            "resumedBy {by:?}, expected one of {OBSERVED_BY:?} with the trainer's sockets readable: {}",
            text()
        ));
    }
    Ok(gap)
}
