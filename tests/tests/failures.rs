//! The failure controller against a mock API server (the `tower-test`
//! pattern of tests/tests/reconciler.rs), with a fake clock: every request
//! it makes is checked and answered, and a test fails on one more.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use http::{Method, StatusCode};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use trainwire_controllers::failures::{self, Context};
use trainwire_controllers::metrics::Metrics;
use trainwire_controllers::reconcile::Shared;
use trainwire_tests::mock_api::{self, ApiServer, BOUND};
use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

const NS: &str = "ml";

struct World {
    ctx: Arc<Context>,
    api: ApiServer,
    clock: Arc<Mutex<Timestamp>>,
    nodes: Writer<Node>,
    statefulsets: Writer<StatefulSet>,
    metrics: Arc<Metrics>,
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn world(policy_yaml: &str) -> Result<World> {
    let (client, api) = mock_api::pair();
    let text =
        format!("apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n{policy_yaml}");
    let policy = Policy::from_yaml(&text, "test.yaml").map_err(|e| anyhow::anyhow!("{e}"))?;
    let (node_store, nodes) = reflector::store::<Node>();
    let (sts_store, statefulsets) = reflector::store::<StatefulSet>();
    let (job_store, _jobs) = reflector::store::<Job>();
    let clock = Arc::new(Mutex::new(at(0)));
    let c = clock.clone();
    let metrics = Arc::new(Metrics::new());
    let shared = Shared::new(
        client,
        SharedPolicy::new(policy),
        metrics.clone(),
        Box::new(move || *c.lock().unwrap_or_else(|p| p.into_inner())),
    );
    let ctx = Arc::new(Context::new(shared, node_store, sts_store, job_store));
    Ok(World {
        ctx,
        api,
        clock,
        nodes,
        statefulsets,
        metrics,
    })
}

impl World {
    fn set_time(&self, s: i64) {
        *self.clock.lock().unwrap_or_else(|p| p.into_inner()) = at(s);
    }
    fn node(&mut self, ready: &str, since: i64) -> Result<()> {
        let since = at(since).to_string();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "uid": "node-uid"},
            "status": {"conditions": [{"type": "Ready", "status": ready,
                "reason": if ready == "True" { "KubeletReady" } else { "NodeStatusUnknown" },
                "lastHeartbeatTime": since, "lastTransitionTime": since}]}
        }))?;
        self.nodes.apply_watcher_event(&watcher::Event::Apply(node));
        Ok(())
    }
    fn statefulset(&mut self, annotations: Value) -> Result<()> {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "llama", "namespace": NS, "uid": "sts-uid", "annotations": annotations},
            "spec": {"replicas": 4, "serviceName": "llama", "selector": {"matchLabels": {"app": "llama"}},
                     "template": {"metadata": {"annotations": {"trainwire.dev/status": "{}"}}, "spec": {"containers": []}}}
        }))?;
        self.statefulsets
            .apply_watcher_event(&watcher::Event::Apply(sts));
        Ok(())
    }
    /// Reconcile `pod`, which must stop the world: answers the StatefulSet
    /// PATCH (returning its body) and the `WorldStopped` Event.
    async fn reconcile_to_a_stop(&mut self, pod: Pod) -> Result<(Value, Value)> {
        let task = tokio::spawn(failures::reconcile_pod(Arc::new(pod), self.ctx.clone()));
        let patch = self
            .api
            .expect(
                Method::PATCH,
                &format!("/apis/apps/v1/namespaces/{NS}/statefulsets/llama"),
            )
            .await?;
        let body = patch.body.clone();
        patch.reply(StatusCode::OK, &body);
        let stopped = self.api.event(NS, "WorldStopped", "StatefulSet").await?;
        tokio::time::timeout(BOUND, task)
            .await??
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok((body, stopped))
    }
    async fn reconcile(&self, pod: &Pod) -> Result<kube::runtime::controller::Action> {
        let task = tokio::spawn(failures::reconcile_pod(
            Arc::new(pod.clone()),
            self.ctx.clone(),
        ));
        tokio::time::timeout(BOUND, task)
            .await
            .context("reconcile hung")??
            .map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// A StatefulSet pod as the apiserver stores it (the template's status
/// annotation copied, the controller ownerReference, bound to gpu-1).
fn pod(name: &str, uid: &str, trainer: Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "uid": uid,
            "labels": {"app": "llama", "apps.kubernetes.io/pod-index": "1"},
            "annotations": {"trainwire.dev/status": "{}"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llama",
                                  "uid": "sts-uid", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "trainer", "image": "t",
            "env": [{"name": "PET_RDZV_BACKEND", "value": "c10d"}]}]},
        "status": {"phase": "Running", "containerStatuses": [trainer]}
    }))?)
}

fn running() -> Value {
    json!({"name": "trainer", "image": "t", "imageID": "", "ready": true, "restartCount": 0,
           "state": {"running": {"startedAt": "2026-11-23T10:00:00Z"}}})
}

const RECLAIM: &str = "  - name: ml\n    namespaces: [ml]\n    nodeFailure: {reclaimAfter: 30s, maxPodsPerMinute: 5}\n";

/// Node goes Unknown → before the grace nothing (a requeue at the grace) →
/// at the grace the pod is force-deleted, with Events → again: nothing.
#[tokio::test]
async fn a_pod_on_a_dead_node_is_force_deleted_once_after_the_grace() -> Result<()> {
    let mut w = world(RECLAIM)?;
    let p = pod("llama-1", "pod-uid-1", running())?;
    w.node("Unknown", 0)?;
    w.set_time(10);
    let action = w.reconcile(&p).await?;
    ensure!(
        format!("{action:?}").contains("20s"),
        "requeue at the grace: {action:?}"
    );

    w.set_time(30);
    let task = tokio::spawn(failures::reconcile_pod(Arc::new(p.clone()), w.ctx.clone()));
    let started = Instant::now();
    w.api.event(NS, "PeerLost", "StatefulSet").await?;
    let delete = w
        .api
        .expect(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/llama-1"),
        )
        .await?;
    let reaction = started.elapsed();
    ensure!(
        delete.body["gracePeriodSeconds"] == 0,
        "grace 0: {}",
        delete.body
    );
    ensure!(
        delete.body["preconditions"]["uid"] == "pod-uid-1",
        "uid precondition: {}",
        delete.body
    );
    delete.reply(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    );
    let note = w.api.event(NS, "PodReclaimed", "StatefulSet").await?;
    ensure!(
        note["note"]
            .as_str()
            .is_some_and(|n| n.contains("loss generation 1")),
        "{note}"
    );
    w.api.event(NS, "PodReclaimed", "Pod").await?;
    tokio::time::timeout(BOUND, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!("controller reaction (reconcile at the grace to DELETE sent): {reaction:?}");
    ensure!(
        w.metrics
            .encode()
            .contains("trainwire_webhook_failure_actions_total{action=\"force_delete\"} 1")
    );

    // Seen again (the watch has not brought the deletion yet): nothing.
    w.set_time(40);
    w.reconcile(&p).await?;
    // The replacement (same name, new UID) on a healthy node: the story goes on.
    w.node("True", 45)?;
    let replacement = pod("llama-1", "pod-uid-2", running())?;
    let task = tokio::spawn(failures::reconcile_pod(
        Arc::new(replacement),
        w.ctx.clone(),
    ));
    w.api.event(NS, "PodReplaced", "StatefulSet").await?;
    tokio::time::timeout(BOUND, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    drop(w.ctx);
    w.api.done().await
}

/// A node back before the grace: nothing, ever; reclaim off: nothing.
#[tokio::test]
async fn a_node_back_before_the_grace_or_reclaim_off_is_left_alone() -> Result<()> {
    let mut w = world(RECLAIM)?;
    let p = pod("llama-1", "pod-uid-1", running())?;
    w.node("Unknown", 0)?;
    w.set_time(20);
    w.reconcile(&p).await?;
    w.node("True", 25)?;
    w.set_time(60);
    let action = w.reconcile(&p).await?;
    ensure!(
        format!("{action:?}").contains("None")
            || !format!("{action:?}").contains("requeue_after: Some"),
        "{action:?}"
    );

    let mut off = world("  - name: ml\n    namespaces: [ml]\n")?;
    off.node("Unknown", 0)?;
    off.set_time(3600);
    off.reconcile(&p).await?;
    drop((w.ctx, off.ctx));
    for api in [w.api, off.api] {
        api.done().await?;
    }
    Ok(())
}

fn exited(code: i32, restarts: i32, finished: i64) -> Value {
    json!({"name": "trainer", "image": "t", "imageID": "", "ready": false, "restartCount": restarts,
           "state": {"waiting": {"reason": "CrashLoopBackOff"}},
           "lastState": {"terminated": {"exitCode": code, "reason": "Error",
               "startedAt": at(finished - 5).to_string(), "finishedAt": at(finished).to_string()}}})
}

/// Crash-loop counters across container restarts, a pod replacement and a
/// peer loss: 3/1h stops at the third failure no loss explains, with the
/// evidence on the StatefulSet and `spec.replicas: 0`.
#[tokio::test]
async fn crash_loop_counts_across_restarts_and_replacements_but_not_peer_losses() -> Result<()> {
    let mut w = world(RECLAIM)?;
    w.node("True", 0)?;
    w.statefulset(json!({"trainwire.dev/max-failures": "3/1h"}))?;
    w.set_time(100);
    // Failure 1: pod 1, restart 1.
    w.reconcile(&pod("llama-1", "u1", exited(2, 1, 90))?)
        .await?;
    // The same exit seen again: not counted twice.
    w.reconcile(&pod("llama-1", "u1", exited(2, 1, 90))?)
        .await?;
    // A peer (pod 0) is lost at 200: the 137 at 205 is the sidecar's doing.
    let mut lost = pod("llama-0", "u0", running())?;
    lost.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        at(200),
    ));
    w.set_time(200);
    let task = tokio::spawn(failures::reconcile_pod(Arc::new(lost), w.ctx.clone()));
    w.api.event(NS, "PeerLost", "StatefulSet").await?;
    tokio::time::timeout(BOUND, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    w.set_time(210);
    w.reconcile(&pod("llama-1", "u1", exited(137, 2, 205))?)
        .await?;
    // Failure 2: a replaced pod 1 (new UID, restarts from 0).
    w.set_time(600);
    w.reconcile(&pod("llama-1", "u1b", exited(2, 1, 590))?)
        .await?;
    // Failure 3: stop.
    w.set_time(700);
    let (patch, stopped) = w
        .reconcile_to_a_stop(pod("llama-1", "u1b", exited(2, 2, 690))?)
        .await?;
    ensure!(patch["spec"]["replicas"] == 0, "{patch}");
    let a = &patch["metadata"]["annotations"];
    ensure!(a["trainwire.dev/stopped-replicas"] == "4", "{a}");
    ensure!(a["trainwire.dev/stopped-reason"] == "MaxFailures", "{a}");
    ensure!(a["trainwire.dev/stopped-exit-code"] == "2", "{a}");
    ensure!(a["trainwire.dev/stopped-pod"] == "llama-1", "{a}");
    ensure!(
        stopped["note"].as_str().is_some_and(
            |n| n.contains("kubectl annotate statefulset llama trainwire.dev/resume=now")
        ),
        "{stopped}"
    );
    Ok(())
}

/// One story: a loss the controller never saw itself (heartbeats only), but
/// that the sidecar recorded on its pod when it killed the local agent, is
/// counted as a loss generation and told on the workload, so the exit 137
/// the sidecar caused is not a script failure, even with a limit of 1.
#[tokio::test]
async fn the_sidecars_own_record_explains_the_exit_it_caused() -> Result<()> {
    use trainwire_contract::peer_loss::{ANNOTATION, PeerLossRecord};
    let mut w = world(RECLAIM)?;
    w.node("True", 0)?;
    w.statefulset(json!({"trainwire.dev/max-failures": "1/1h"}))?;
    w.set_time(300);
    let mut p = pod("llama-1", "u1", exited(137, 1, 296))?;
    let record = PeerLossRecord {
        generation: 1,
        lost_rank: 0,
        confirmed_by: "replacement-answers".into(),
        action: "restart-agent".into(),
        result: "signalled".into(),
        at: at(295).to_string(),
        ..Default::default()
    };
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            ANNOTATION.to_string(),
            record.to_annotation().context("json")?,
        );
    let task = tokio::spawn(failures::reconcile_pod(Arc::new(p.clone()), w.ctx.clone()));
    let event = w.api.event(NS, "PeerLost", "StatefulSet").await?;
    let note = event["note"].as_str().unwrap_or_default();
    ensure!(
        note.contains("the sidecar of pod llama-1 lost rank 0 (its generation 1, confirmed by replacement-answers): restart-agent signalled"),
        "{note}"
    );
    tokio::time::timeout(BOUND, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Seen again: no second Event, and still no stop (no request at all).
    w.reconcile(&p).await?;
    // A real script failure later is counted (limit 1: stop).
    w.set_time(900);
    let (patch, _) = w
        .reconcile_to_a_stop(pod("llama-1", "u1", exited(2, 2, 890))?)
        .await?;
    ensure!(
        patch["metadata"]["annotations"]["trainwire.dev/stopped-exit-code"] == "2",
        "{patch}"
    );
    Ok(())
}

/// A hot spare's take-over record and a sidecar's record of its own
/// trainer restarted say when training runs again: neither is a loss (no
/// `PeerLost` Event, no request), so neither explains a script failure
/// beside it (limit 1: the exit stops the world).
#[tokio::test]
async fn a_take_over_or_an_own_restart_record_is_not_a_loss() -> Result<()> {
    use trainwire_contract::peer_loss::{
        ANNOTATION, PeerLossRecord, SPARE_TOOK_OVER, TRAINER_RESTARTED,
    };
    for action in [SPARE_TOOK_OVER, TRAINER_RESTARTED] {
        let mut w = world(RECLAIM)?;
        w.node("True", 0)?;
        w.statefulset(json!({"trainwire.dev/max-failures": "1/1h"}))?;
        w.set_time(300);
        let record = PeerLossRecord {
            generation: 1,
            lost_rank: 0,
            action: action.into(),
            result: "training".into(),
            at: at(295).to_string(),
            training_since: Some(at(296).to_string()),
            ..Default::default()
        };
        let with_record = |mut p: Pod| -> Result<Pod> {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    ANNOTATION.to_string(),
                    record.to_annotation().context("json")?,
                );
            Ok(p)
        };
        // No Event: the reconcile would wait for its answer and hang.
        w.reconcile(&with_record(pod("llama-3", "u3", running())?)?)
            .await
            .with_context(|| format!("{action}: counted as a loss"))?;
        let (patch, _) = w
            .reconcile_to_a_stop(with_record(pod("llama-3", "u3", exited(2, 1, 297))?)?)
            .await?;
        ensure!(
            patch["metadata"]["annotations"]["trainwire.dev/stopped-exit-code"] == "2",
            "{action}: {patch}"
        );
    }
    Ok(())
}

#[test]
fn resuming_restores_the_replicas_and_clears_the_evidence() {
    let a: BTreeMap<String, String> = [
        ("trainwire.dev/resume", "now"),
        ("trainwire.dev/stopped-reason", "FailFastExitCode"),
        ("trainwire.dev/stopped-replicas", "4"),
        ("trainwire.dev/stopped-pod", "llama-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let p = failures::resume_patch("StatefulSet", &a);
    assert_eq!(
        p,
        Some(
            json!({"metadata": {"annotations": {"trainwire.dev/resume": null,
            "trainwire.dev/stopped-reason": null, "trainwire.dev/stopped-replicas": null,
            "trainwire.dev/stopped-pod": null}}, "spec": {"replicas": 4}})
        )
    );
    assert_eq!(
        failures::resume_patch("Job", &a).map(|p| p["spec"].clone()),
        Some(json!({"suspend": false}))
    );
    assert_eq!(
        failures::resume_patch("StatefulSet", &BTreeMap::new()),
        None
    );
}

/// A Job pod on a dead node is marked `Failed` with a `DisruptionTarget`
/// condition before the force-delete: a Job with a `podFailurePolicy`
/// (`podReplacementPolicy: Failed`) replaces only a Failed pod, and the
/// injected Ignore rule keeps the loss off `backoffLimit`.
#[tokio::test]
async fn a_job_pod_on_a_dead_node_is_marked_disrupted_then_force_deleted() -> Result<()> {
    let mut w = world(RECLAIM)?;
    let mut p = pod("train-1-abcde", "job-pod-uid", running())?;
    p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid",
        "controller": true, "blockOwnerDeletion": true}))?]);
    w.node("Unknown", 0)?;
    w.set_time(31);
    let task = tokio::spawn(failures::reconcile_pod(Arc::new(p.clone()), w.ctx.clone()));
    w.api.event(NS, "PeerLost", "Job").await?;
    let status = w
        .api
        .expect(
            Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/pods/train-1-abcde/status"),
        )
        .await?;
    ensure!(
        status.query.contains("fieldManager=trainwire-failures"),
        "{}",
        status.query
    );
    ensure!(
        status.body["status"]["phase"] == "Failed",
        "{}",
        status.body
    );
    let condition = &status.body["status"]["conditions"][0];
    ensure!(
        condition["type"] == "DisruptionTarget"
            && condition["status"] == "True"
            && condition["reason"] == "DeletionByTrainwire",
        "{condition}"
    );
    let body = status.body.clone();
    status.reply(StatusCode::OK, &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-1-abcde", "namespace": NS}, "status": body["status"]}));
    let delete = w
        .api
        .expect(
            Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/train-1-abcde"),
        )
        .await?;
    ensure!(delete.body["gracePeriodSeconds"] == 0, "{}", delete.body);
    delete.reply(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    );
    w.api.event(NS, "PodReclaimed", "Job").await?;
    w.api.event(NS, "PodReclaimed", "Pod").await?;
    tokio::time::timeout(BOUND, task)
        .await??
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
