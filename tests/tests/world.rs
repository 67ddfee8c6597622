//! The world controller against a mock API server (the `tower-test` pattern
//! of tests/tests/failures.rs), with a fake clock, fed with the object
//! shapes a real kube-apiserver produced (the captured StatefulSet and its
//! pods, `tests/fixtures/admission/`): a world forming, a loss and its
//! recovery, a stop and a resume. Every request it makes is checked and
//! answered; a write it should not make hangs the reconcile and fails the
//! test.

use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result, ensure};
use http::{Method, StatusCode};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use trainwire_contract::world::{Phase, WorldStatus};
use trainwire_controllers::metrics::Metrics;
use trainwire_controllers::reconcile::Shared;
use trainwire_controllers::world::{self, Context};
use trainwire_engine::policy::Policy;
use trainwire_policyfile::SharedPolicy;
use trainwire_tests::fixtures::request_object;
use trainwire_tests::mock_api::{self, ApiServer, BOUND};

const STS_UID: &str = "b3d1982f-226f-440e-8a7c-acca623461a5";

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The process's shared part, over the mock API server and a fake clock.
fn shared(client: kube::Client, clock: &Arc<Mutex<Timestamp>>) -> Arc<Shared> {
    let c = clock.clone();
    Shared::new(
        client,
        SharedPolicy::new(Policy::default()),
        Arc::new(Metrics::new()),
        Box::new(move || *c.lock().unwrap_or_else(|p| p.into_inner())),
    )
}

struct Cluster {
    ctx: Arc<Context>,
    api: ApiServer,
    clock: Arc<Mutex<Timestamp>>,
    pods: Writer<Pod>,
    /// The StatefulSet as stored, with the controller's writes applied.
    sts: Value,
    namespace: String,
}

/// The captured StatefulSet, as stored after injection (the template's
/// status annotation) with a UID.
fn captured_statefulset() -> (Value, String) {
    let (mut sts, namespace) = request_object("statefulset-create.json");
    sts["metadata"]["uid"] = json!(STS_UID);
    sts["metadata"]["namespace"] = json!(namespace);
    sts["spec"]["template"]["metadata"]["annotations"] = json!({"trainwire.dev/status": "{}"});
    (sts, namespace)
}

/// The captured pod of `rank`, running with a UID, Ready since `ready` (or
/// not Ready).
fn captured_pod(rank: u32, uid: &str, ready: Option<i64>) -> Value {
    let fixture = if rank == 0 {
        "pod-create-from-statefulset.json"
    } else {
        "pod-create-from-statefulset-index1.json"
    };
    let (mut pod, namespace) = request_object(fixture);
    pod["metadata"]["namespace"] = json!(namespace);
    pod["metadata"]["uid"] = json!(uid);
    pod["metadata"]["annotations"] =
        json!({"trainwire.dev/status": r#"{"container":"trainer","sidecarPort":29600}"#});
    let (status, since) = match ready {
        Some(t) => ("True", at(t)),
        None => ("False", at(0)),
    };
    pod["status"] = json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": since.to_string()}],
    });
    pod
}

impl Cluster {
    fn new() -> Cluster {
        let (client, api) = mock_api::pair();
        let (store, pods) = reflector::store::<Pod>();
        let clock = Arc::new(Mutex::new(at(0)));
        let ctx = Arc::new(Context::new(shared(client, &clock), store));
        let (sts, namespace) = captured_statefulset();
        Cluster {
            ctx,
            api,
            clock,
            pods,
            sts,
            namespace,
        }
    }

    fn set_time(&self, s: i64) {
        *self.clock.lock().unwrap_or_else(|p| p.into_inner()) = at(s);
    }

    fn pod(&mut self, pod: Value) -> Result<()> {
        let pod: Pod = serde_json::from_value(pod)?;
        self.pods.apply_watcher_event(&watcher::Event::Apply(pod));
        Ok(())
    }

    fn delete_pod(&mut self, pod: Value) -> Result<()> {
        let pod: Pod = serde_json::from_value(pod)?;
        self.pods.apply_watcher_event(&watcher::Event::Delete(pod));
        Ok(())
    }

    fn status(&self) -> Result<WorldStatus> {
        let text = self.sts["metadata"]["annotations"]["trainwire.dev/world"]
            .as_str()
            .context("no trainwire.dev/world annotation")?;
        Ok(WorldStatus::from_annotation(text)?)
    }

    /// Reconcile, which must make no request.
    async fn reconcile_quietly(&self) -> Result<Action> {
        let sts: StatefulSet = serde_json::from_value(self.sts.clone())?;
        let task = tokio::spawn(world::reconcile_statefulset(
            Arc::new(sts),
            self.ctx.clone(),
        ));
        tokio::time::timeout(BOUND, task)
            .await
            .context("reconcile hung: it made a request")??
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// Reconcile, which must write the annotation (a merge patch of that
    /// key only, by the world field manager); applies it and returns the
    /// status written.
    async fn reconcile_to_a_write(&mut self) -> Result<WorldStatus> {
        let sts: StatefulSet = serde_json::from_value(self.sts.clone())?;
        let task = tokio::spawn(world::reconcile_statefulset(
            Arc::new(sts),
            self.ctx.clone(),
        ));
        let name = self.sts["metadata"]["name"].as_str().unwrap_or_default();
        let call = self
            .api
            .expect(
                Method::PATCH,
                &format!(
                    "/apis/apps/v1/namespaces/{}/statefulsets/{name}",
                    self.namespace
                ),
            )
            .await?;
        ensure!(
            call.content_type == "application/merge-patch+json",
            "{}",
            call.content_type
        );
        ensure!(
            call.query.contains("fieldManager=trainwire-world"),
            "{}",
            call.query
        );
        let annotations = call.body["metadata"]["annotations"]
            .as_object()
            .context("no annotations in the patch")?;
        ensure!(
            annotations.len() == 1 && call.body.as_object().map(|o| o.len()) == Some(1),
            "the patch writes more than the annotation: {}",
            call.body
        );
        json_patch::merge(&mut self.sts, &call.body);
        call.reply(StatusCode::OK, &self.sts);
        tokio::time::timeout(BOUND, task)
            .await??
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        self.status()
    }
}

/// The captured StatefulSet with a dedicated store, and a controller that
/// watches the store's pods.
fn with_store() -> (Cluster, Writer<Pod>) {
    let (client, api) = mock_api::pair();
    let (store, pods) = reflector::store::<Pod>();
    let (store_pods, store_writer) = reflector::store::<Pod>();
    let clock = Arc::new(Mutex::new(at(0)));
    let ctx = Arc::new(Context::new(shared(client, &clock), store).with_store_pods(store_pods));
    let (mut sts, namespace) = captured_statefulset();
    sts["spec"]["template"]["metadata"]["annotations"] =
        json!({"trainwire.dev/status": r#"{"rdzvStore":"llama-ft-rdzv"}"#});
    (
        Cluster {
            ctx,
            api,
            clock,
            pods,
            sts,
            namespace,
        },
        store_writer,
    )
}

/// The store's pod `uid`, Ready since `ready` (or not Ready), deleted at
/// `deleted`.
fn store_pod(namespace: &str, uid: &str, ready: Option<i64>, deleted: Option<i64>) -> Result<Pod> {
    let (status, since) = match ready {
        Some(t) => ("True", at(t)),
        None => ("False", at(0)),
    };
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("llama-ft-rdzv-6b8f9c7d54-{uid}"), "namespace": namespace,
                     "uid": uid, "labels": {"trainwire.dev/rdzv-store": "llama-ft"}},
        "spec": {"containers": [{"name": "store", "image": "ghcr.io/trainwire/sidecar:0.2.0"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": since.to_string()}]},
    });
    if let Some(t) = deleted {
        pod["metadata"]["deletionTimestamp"] = json!(at(t).to_string());
    }
    Ok(serde_json::from_value(pod)?)
}

/// A training pod whose trainer container exited at `exited` and runs
/// again (restarted by the kubelet), with its sidecar's
/// `trainer-restarted` record when `record` gives (agent start, workers'
/// start).
fn restarted_pod(rank: u32, uid: &str, exited: i64, record: Option<(i64, i64)>) -> Value {
    let mut pod = captured_pod(rank, uid, Some(5));
    pod["status"]["containerStatuses"] = json!([{
        "name": "trainer", "image": "t", "imageID": "", "ready": true, "restartCount": 1,
        "state": {"running": {"startedAt": at(exited + 1).to_string()}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
            "startedAt": at(0).to_string(), "finishedAt": at(exited).to_string()}},
    }]);
    if let Some((agent, workers)) = record {
        pod["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(
            json!({"generation": 0, "lostRank": rank, "confirmedBy": "",
                   "action": "trainer-restarted", "result": "training",
                   "at": at(agent).to_string(), "trainingSince": at(workers).to_string()})
            .to_string()
        );
    }
    pod
}

/// A first store loss in a world whose sidecars never recorded a loss:
/// their `trainer-restarted` records (not losses) give `resumedAt`, the
/// new workers' start, without a checkpoint.
#[tokio::test]
async fn a_store_loss_resumes_from_the_sidecars_trainer_restarted_records() -> Result<()> {
    let (mut c, mut stores) = with_store();
    let ns = c.namespace.clone();
    c.pod(captured_pod(0, "pod-0-a", Some(5)))?;
    c.pod(captured_pod(1, "pod-1-a", Some(5)))?;
    stores.apply_watcher_event(&watcher::Event::Apply(store_pod(&ns, "s1", Some(2), None)?));
    c.set_time(10);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running && s.generation == 0, "{s:?}");
    ensure!(s.store.as_ref().is_some_and(|st| st.available), "{s:?}");

    // The store's pod is deleted at 100; every trainer exits at 101.
    stores.apply_watcher_event(&watcher::Event::Apply(store_pod(
        &ns,
        "s1",
        Some(2),
        Some(100),
    )?));
    c.set_time(100);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.store.is_some() && loss.detected_by == "store-deleted",
        "{loss:?}"
    );

    // The new store is Ready at 104, the trainers restarted at 102: whole,
    // training not seen yet.
    let old = store_pod(&ns, "s1", Some(2), Some(100))?;
    stores.apply_watcher_event(&watcher::Event::Delete(old));
    stores.apply_watcher_event(&watcher::Event::Apply(store_pod(
        &ns,
        "s2",
        Some(104),
        None,
    )?));
    c.pod(restarted_pod(0, "pod-0-a", 101, None))?;
    c.pod(restarted_pod(1, "pod-1-a", 101, None))?;
    c.set_time(110);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    ensure!(
        s.waiting_for
            .as_deref()
            .is_some_and(|w| w.starts_with("training to be seen running")),
        "{s:?}"
    );

    // The sidecars' records: new workers at 106 and 107, up since.
    c.pod(restarted_pod(0, "pod-0-a", 101, Some((102, 106))))?;
    c.pod(restarted_pod(1, "pod-1-a", 101, Some((102, 107))))?;
    c.set_time(120);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running, "{s:?}");
    ensure!(s.generation == 1, "the records are not losses: {s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.resumed_at == Some(at(106).to_string())
            && loss.resumed_by.as_deref() == Some("workers-started")
            && loss.recovery_seconds == Some(6),
        "{loss:?}"
    );
    ensure!(
        !loss.actions.iter().any(|a| a.contains("trainer-restarted")),
        "{loss:?}"
    );
    // Seen again with the loss closed: no new loss, no write.
    c.set_time(140);
    c.reconcile_quietly().await?;
    Ok(())
}

#[tokio::test]
async fn a_world_forms_loses_a_node_recovers_stops_and_resumes() -> Result<()> {
    let mut c = Cluster::new();

    // Forming: pod 0 Ready, pod 1 starting.
    c.pod(captured_pod(0, "pod-0-a", Some(5)))?;
    c.pod(captured_pod(1, "pod-1-a", None))?;
    c.set_time(10);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Forming, "{s:?}");
    ensure!((s.nodes.ready, s.nodes.expected) == (1, 2), "{s:?}");
    ensure!(s.updated_at == at(10).to_string(), "{s:?}");
    // Nothing changed: no write, even after the interval.
    c.set_time(30);
    c.reconcile_quietly().await?;

    // Formed.
    c.pod(captured_pod(1, "pod-1-a", Some(31)))?;
    c.set_time(32);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running && s.nodes.ready == 2, "{s:?}");
    ensure!(s.generation == 0 && s.last_loss.is_none(), "{s:?}");

    // Rank 1's pod is deleted (its node died, say).
    let mut dying = captured_pod(1, "pod-1-a", Some(31));
    dying["metadata"]["deletionTimestamp"] = json!(at(100).to_string());
    c.pod(dying.clone())?;
    c.set_time(101);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.rank == 1 && loss.detected_by == "pod-deleted" && loss.at == at(100).to_string(),
        "{loss:?}"
    );

    // Rank 0's sidecar records what it did, 4 s after the last write: held
    // back by the rate limit (a requeue at the end of the interval).
    let mut survivor = captured_pod(0, "pod-0-a", Some(5));
    survivor["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(
        json!({"generation": 1, "lostRank": 1, "confirmedBy": "pod-deleted",
               "action": "report", "result": "reported", "at": at(102).to_string()})
        .to_string()
    );
    c.pod(survivor.clone())?;
    c.set_time(105);
    let action = c.reconcile_quietly().await?;
    ensure!(format!("{action:?}").contains("6s"), "{action:?}");
    c.set_time(111);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.generation == 1, "one loss, told twice: {s:?}");
    ensure!(
        s.last_loss.as_ref().map(|l| l.actions.clone())
            == Some(vec!["rank 0: report reported".to_string()]),
        "{s:?}"
    );

    // The replacement (a new UID) starts, then is Ready at 160.
    c.delete_pod(dying)?;
    c.pod(captured_pod(1, "pod-1-b", None))?;
    c.set_time(150);
    // The rank table changes (rank 1 waiting): written, still Recovering.
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering, "{s:?}");
    c.pod(captured_pod(1, "pod-1-b", Some(160)))?;
    c.set_time(161);
    // Whole again, but a Ready pod is not training: still Recovering, and
    // it says what it waits for (looked at again on a timer).
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    ensure!(
        s.waiting_for
            .as_deref()
            .is_some_and(|w| w.starts_with("training to be seen running")),
        "{s:?}"
    );
    ensure!(
        s.last_loss.as_ref().is_some_and(|l| l.resumed_at.is_none()),
        "{s:?}"
    );
    c.set_time(165);
    let action = c.reconcile_quietly().await?;
    ensure!(
        format!("{action:?}").contains("5s"),
        "requeued while recovering: {action:?}"
    );
    // The survivor's sidecar saw its new workers start at 166 and stay up.
    survivor["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(
        json!({"generation": 1, "lostRank": 1, "confirmedBy": "pod-deleted",
               "action": "report", "result": "reported", "at": at(102).to_string(),
               "trainingSince": at(166).to_string()})
        .to_string()
    );
    c.pod(survivor.clone())?;
    c.set_time(172);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running && s.generation == 1, "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.resumed_at == Some(at(166).to_string())
            && loss.recovery_seconds == Some(66)
            && loss.resumed_by.as_deref() == Some("workers-started"),
        "{loss:?}"
    );

    // Rank 1's trainer container exits in place (same pod): a loss at
    // once, from the container state, before any restartCount moves.
    let mut exited = captured_pod(1, "pod-1-b", None);
    exited["status"]["containerStatuses"] = json!([{
        "name": "trainer", "image": "t", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 137, "reason": "Error",
            "startedAt": at(161).to_string(), "finishedAt": at(180).to_string()}}}]);
    c.pod(exited)?;
    c.set_time(183);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 2, "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.rank == 1 && loss.detected_by == "container-exited" && loss.at == at(180).to_string(),
        "{loss:?}"
    );
    // Back, and training seen again at 190.
    let mut back = captured_pod(1, "pod-1-b", Some(188));
    back["status"]["containerStatuses"] = json!([{
        "name": "trainer", "image": "t", "imageID": "", "ready": true, "restartCount": 1,
        "state": {"running": {"startedAt": at(187).to_string()}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "Error",
            "startedAt": at(161).to_string(), "finishedAt": at(180).to_string()}}}]);
    c.pod(back)?;
    survivor["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(
        json!({"generation": 2, "lostRank": 1, "confirmedBy": "container-restarted",
               "action": "report", "result": "reported", "at": at(181).to_string(),
               "trainingSince": at(190).to_string()})
        .to_string()
    );
    c.pod(survivor.clone())?;
    c.set_time(194);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running && s.generation == 2, "{s:?}");
    ensure!(
        s.last_loss.as_ref().and_then(|l| l.resumed_at.clone()) == Some(at(190).to_string()),
        "{s:?}"
    );

    // The failure controller stops the world (its annotations, replicas 0).
    json_patch::merge(
        &mut c.sts,
        &json!({"metadata": {"annotations": {
            "trainwire.dev/stopped-reason": "FailFastExitCode",
            "trainwire.dev/stopped-at": at(200).to_string(),
            "trainwire.dev/stopped-exit-code": "3",
            "trainwire.dev/stopped-pod": "llama-ft-1",
            "trainwire.dev/stopped-replicas": "2"}},
            "spec": {"replicas": 0}}),
    );
    c.delete_pod(captured_pod(0, "pod-0-a", Some(5)))?;
    c.delete_pod(captured_pod(1, "pod-1-b", Some(188)))?;
    c.set_time(205);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Stopped, "{s:?}");
    let stopped = s.stopped.clone().context("no stop")?;
    ensure!(
        stopped.reason == "FailFastExitCode"
            && stopped.exit_code == Some(3)
            && stopped.pod == "llama-ft-1"
            && stopped.resume == "kubectl annotate statefulset llama-ft trainwire.dev/resume=now",
        "{stopped:?}"
    );
    ensure!(
        s.generation == 2,
        "a stop by scale-down is not a loss: {s:?}"
    );

    // Resumed: the annotations go, the replicas come back, pods start.
    json_patch::merge(
        &mut c.sts,
        &json!({"metadata": {"annotations": {
            "trainwire.dev/stopped-reason": null, "trainwire.dev/stopped-at": null,
            "trainwire.dev/stopped-exit-code": null, "trainwire.dev/stopped-pod": null,
            "trainwire.dev/stopped-replicas": null}},
            "spec": {"replicas": 2}}),
    );
    c.pod(captured_pod(0, "pod-0-c", Some(300)))?;
    c.pod(captured_pod(1, "pod-1-c", Some(301)))?;
    c.set_time(302);
    let s = c.reconcile_to_a_write().await?;
    ensure!(
        s.phase == Phase::Running && s.stopped.is_none() && s.generation == 2,
        "{s:?}"
    );
    Ok(())
}

/// A new leader starts from the annotation: it counts nothing it did not
/// see happen, keeps the history, and rate-limits from `updatedAt`.
/// A silent loss through the controller: rank 1's network is cut at 100
/// (its pod stays Ready); rank 0's sidecar records the loss by heartbeats
/// at 103 (the first beat unanswered at 101). Training resumes at 107 and
/// its record comes 5 s after the last write: a new phase is written at
/// once, not held back by the write interval. The cut pod deleted later
/// opens no second loss.
#[tokio::test]
async fn a_silent_loss_is_dated_at_the_cut_and_its_deletion_is_no_new_loss() -> Result<()> {
    let mut c = Cluster::new();
    c.pod(captured_pod(0, "pod-0-a", Some(5)))?;
    c.pod(captured_pod(1, "pod-1-a", Some(5)))?;
    c.set_time(10);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running, "{s:?}");

    let record = |since: Option<i64>| {
        let mut r = json!({"generation": 1, "lostRank": 1, "action": "report", "result": "reported",
            "at": at(103).to_string(), "suspectedAt": at(101).to_string(),
            "lostBy": "heartbeat"});
        if let Some(t) = since {
            r["trainingSince"] = json!(at(t).to_string());
            r["trainingSeenBy"] = json!("collective-traffic");
        }
        r.to_string()
    };
    let mut survivor = captured_pod(0, "pod-0-a", Some(5));
    survivor["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(record(None));
    c.pod(survivor.clone())?;
    c.set_time(103);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.rank == 1 && loss.at == at(101).to_string() && loss.detected_by == "heartbeat",
        "{loss:?}"
    );
    ensure!(
        s.ranks.get(1).map(|r| (r.role, r.from.as_str()))
            == Some((trainwire_contract::world::Role::Lost, "peer-loss")),
        "{s:?}"
    );

    survivor["metadata"]["annotations"]["trainwire.dev/peer-loss"] = json!(record(Some(107)));
    c.pod(survivor.clone())?;
    c.set_time(108);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running && s.generation == 1, "{s:?}");
    ensure!(s.updated_at == at(108).to_string(), "{s:?}");
    let loss = s.last_loss.clone().context("no loss")?;
    ensure!(
        loss.resumed_at == Some(at(107).to_string())
            && loss.resumed_by.as_deref() == Some("collective-traffic"),
        "{loss:?}"
    );

    let mut cut = captured_pod(1, "pod-1-a", Some(5));
    cut["metadata"]["deletionTimestamp"] = json!(at(133).to_string());
    c.pod(cut.clone())?;
    c.set_time(134);
    let s = c.reconcile_to_a_write().await?;
    // Not whole (no spare), but no loss open: not Recovering.
    ensure!(s.phase == Phase::Forming && s.generation == 1, "{s:?}");
    ensure!(
        s.last_loss.as_ref().is_some_and(|l| l
            .actions
            .contains(&"rank 1: pod-deleted after its loss".to_string())),
        "{s:?}"
    );
    c.delete_pod(cut)?;
    c.set_time(150);
    let s = c.reconcile_to_a_write().await?;
    // Gone: the world of 2 without a spare is not whole (Forming), and no
    // loss is open.
    ensure!(
        s.generation == 1 && s.phase == Phase::Forming,
        "gone, no new loss: {s:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_new_leader_keeps_the_history_it_reads() -> Result<()> {
    let mut c = Cluster::new();
    // Written by the last leader at 95 (not `Recovering`, which would be
    // left at once): the write interval runs from then.
    let written = json!({"version": 1, "phase": "Forming", "nodes": {"ready": 0, "expected": 2},
        "generation": 4, "updatedAt": at(95).to_string()});
    c.sts["metadata"]["annotations"]["trainwire.dev/world"] = json!(written.to_string());
    c.pod(captured_pod(0, "pod-0-a", Some(5)))?;
    c.pod(captured_pod(1, "pod-1-a", None))?;
    c.set_time(100);
    let action = c.reconcile_quietly().await?;
    ensure!(format!("{action:?}").contains("5s"), "{action:?}");
    c.set_time(105);
    let s = c.reconcile_to_a_write().await?;
    ensure!(
        s.generation == 4 && s.phase == Phase::Forming && s.nodes.ready == 1,
        "{s:?}"
    );
    Ok(())
}

/// The captured pod shape as pod `rank` of a larger world: its name, its
/// index label and the StatefulSet's hostname for it.
fn pod_of_many(rank: u32, uid: &str, ready: Option<i64>) -> Value {
    let mut pod = captured_pod(1, uid, ready);
    let sts = pod["metadata"]["ownerReferences"][0]["name"]
        .as_str()
        .unwrap_or("llama")
        .to_string();
    pod["metadata"]["name"] = json!(format!("{sts}-{rank}"));
    pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] = json!(rank.to_string());
    pod["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] =
        json!(format!("{sts}-{rank}"));
    pod
}

/// A world of 1,024 pods: the controller's table holds every pod (a loss
/// past the first 512 included), the annotation it writes stays a few
/// hundred bytes, and a reconcile with nothing new writes nothing.
#[tokio::test]
async fn a_world_of_1024_pods_is_one_small_annotation_with_every_pod() -> Result<()> {
    let mut c = Cluster::new();
    c.sts["spec"]["replicas"] = json!(1024);
    for rank in 0..1024 {
        c.pod(pod_of_many(rank, &format!("pod-{rank}-a"), Some(5)))?;
    }
    c.set_time(10);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Running, "{s:?}");
    ensure!(
        (s.nodes.ready, s.nodes.expected) == (1024, 1024),
        "{:?}",
        s.nodes
    );
    ensure!(s.ranks.len() == 1024, "{} ranks", s.ranks.len());
    let written = c.sts["metadata"]["annotations"]["trainwire.dev/world"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(written.len() < 512, "{} bytes: {written}", written.len());

    // Pod 900 is deleted.
    let mut dying = pod_of_many(900, "pod-900-a", Some(5));
    dying["metadata"]["deletionTimestamp"] = json!(at(100).to_string());
    c.pod(dying)?;
    c.set_time(101);
    let s = c.reconcile_to_a_write().await?;
    ensure!(s.phase == Phase::Recovering && s.generation == 1, "{s:?}");
    ensure!(s.last_loss.as_ref().map(|l| l.rank) == Some(900), "{s:?}");
    let lost: Vec<u32> = s
        .ranks
        .iter()
        .filter(|r| r.role == trainwire_contract::world::Role::Lost)
        .map(|r| r.index)
        .collect();
    ensure!(lost == vec![900], "lost {lost:?}");
    let written = c.sts["metadata"]["annotations"]["trainwire.dev/world"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(written.len() < 1024, "{} bytes: {written}", written.len());

    // Nothing new: the value read back is what it computes, no write.
    c.set_time(130);
    c.reconcile_quietly().await?;
    Ok(())
}
