//! Crash-loop stop and resume: the failure controller's effects when a
//! world's trainers keep failing (the verdict of [`crate::crashloop`]):
//! the workload scaled to 0 or suspended with the evidence in its
//! annotations, and `trainwire.dev/resume` undoing it.

use super::*;
use crate::crashloop::{Limits, StopReason, Verdict};
use trainwire_engine::policy::{ExitCodes, FailureLimit};

fn limits_of(
    annotations: &BTreeMap<String, String>,
    policy: &trainwire_engine::policy::CrashLoopPolicy,
) -> Limits {
    let fail_fast: Option<ExitCodes> = annotations
        .get(ann::FAIL_FAST_EXIT_CODES)
        .and_then(|v| v.trim().parse().ok());
    let max: Option<FailureLimit> = annotations
        .get(ann::MAX_FAILURES)
        .and_then(|v| v.trim().parse().ok());
    Limits::resolve(policy, fail_fast, max)
}

pub(super) async fn crash_loop(
    ctx: &Context,
    pod: &Pod,
    owner: &Owner,
    own_loss: bool,
    policy: &trainwire_engine::policy::CrashLoopPolicy,
) -> Result<()> {
    let Some(annotations) = ctx.workload_annotations(owner) else {
        return Ok(());
    };
    if annotations.contains_key(ann::STOPPED_REASON) {
        return Ok(());
    }
    let limits = limits_of(&annotations, policy);
    let mut stop = None;
    {
        let mut st = ctx.state();
        let history = st.histories.entry(owner.uid.clone()).or_default();
        for t in crashloop::terminations(pod, &pod::trainer(pod)) {
            match history.observe(t, own_loss, &limits) {
                Verdict::Stop {
                    reason,
                    termination,
                } => {
                    history.reset();
                    stop = Some((reason, termination));
                    break;
                }
                Verdict::Counted { count } => {
                    info!(%owner, pod = %pod.name_any(), count, "trainer failure counted");
                }
                _ => {}
            }
        }
    }
    if let Some((reason, t)) = stop {
        stop_workload(ctx, owner, &reason, &t, &annotations).await?;
    }
    Ok(())
}

/// Scale a StatefulSet to 0 or suspend a Job, recording why.
async fn stop_workload(
    ctx: &Context,
    owner: &Owner,
    reason: &StopReason,
    t: &crashloop::Termination,
    _annotations: &BTreeMap<String, String>,
) -> Result<()> {
    let now = ctx.now();
    let message = match reason {
        StopReason::FailFastExitCode => format!(
            "stopped: the trainer in pod {} exited with code {}, a fail-fast exit code (trainwire.dev/fail-fast-exit-codes)",
            t.pod, t.exit_code
        ),
        StopReason::MaxFailures { failures, window } => format!(
            "stopped: {failures} trainer failures within {window} that no peer or node loss explains (trainwire.dev/max-failures); the last in pod {} with exit code {}",
            t.pod, t.exit_code
        ),
    };
    let mut stopped = json!({
        ann::STOPPED_REASON: reason.to_string(),
        ann::STOPPED_AT: now.to_string(),
        ann::STOPPED_EXIT_CODE: t.exit_code.to_string(),
        ann::STOPPED_POD: t.pod,
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let resume_hint;
    match owner.kind {
        "StatefulSet" => {
            let replicas = ctx
                .statefulsets
                .get(&ObjectRef::new(&owner.name).within(&owner.namespace))
                .and_then(|s| s.spec.as_ref().and_then(|s| s.replicas))
                .unwrap_or(1);
            stopped[ann::STOPPED_REPLICAS] = json!(replicas.to_string());
            let patch = json!({"metadata": {"annotations": stopped}, "spec": {"replicas": 0}});
            Api::<StatefulSet>::namespaced(ctx.client(), &owner.namespace)
                .patch(&owner.name, &params, &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::Api {
                    action: format!("stopping {owner}"),
                    source,
                })?;
            resume_hint = format!("scaled to 0 (was {replicas})");
        }
        _ => {
            let patch = json!({"metadata": {"annotations": stopped}, "spec": {"suspend": true}});
            Api::<Job>::namespaced(ctx.client(), &owner.namespace)
                .patch(&owner.name, &params, &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::Api {
                    action: format!("stopping {owner}"),
                    source,
                })?;
            resume_hint = "suspended".to_string();
        }
    }
    ctx.count(match reason {
        StopReason::FailFastExitCode => FailureAction::stop_fail_fast,
        StopReason::MaxFailures { .. } => FailureAction::stop_max_failures,
    });
    warn!(%owner, pod = %t.pod, exit_code = t.exit_code, reason = %reason, "stopped a crash-looping world");
    ctx.event(
        &owner.reference(),
        EventType::Warning,
        "WorldStopped",
        "Stop",
        format!("{message}; {resume_hint} to free its GPUs. Fix the script, then: kubectl annotate {} {} {}=now",
            owner.kind.to_lowercase(), owner.name, ann::RESUME),
    )
    .await;
    Ok(())
}

/// What resuming a stopped workload writes: the annotations removed, the
/// replicas back (StatefulSet) or `suspend: false` (Job). `None` when there
/// is nothing to resume.
pub fn resume_patch(
    kind: &str,
    annotations: &BTreeMap<String, String>,
) -> Option<serde_json::Value> {
    if !annotations.contains_key(ann::RESUME) {
        return None;
    }
    let mut clear = serde_json::Map::new();
    clear.insert(ann::RESUME.to_string(), serde_json::Value::Null);
    for k in ann::CONTROLLER_OWNED {
        if annotations.contains_key(*k) {
            clear.insert((*k).to_string(), serde_json::Value::Null);
        }
    }
    let stopped = annotations.contains_key(ann::STOPPED_REASON);
    let spec = match kind {
        "StatefulSet" if stopped => {
            let replicas = annotations
                .get(ann::STOPPED_REPLICAS)
                .and_then(|r| r.parse::<i32>().ok())
                .filter(|r| *r > 0)
                .unwrap_or(1);
            json!({"replicas": replicas})
        }
        "Job" if stopped => json!({"suspend": false}),
        _ => json!({}),
    };
    Some(json!({"metadata": {"annotations": clear}, "spec": spec}))
}

async fn resume<K>(object: Arc<K>, ctx: Arc<Context>, kind: &'static str) -> Result<Action>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let Some(patch) = resume_patch(kind, object.annotations()) else {
        return Ok(Action::await_change());
    };
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<K> = Api::namespaced(ctx.client(), &namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Api {
            action: format!("resuming {kind} {namespace}/{name}"),
            source,
        })?;
    if let Some(uid) = object.meta().uid.as_ref()
        && let Some(h) = ctx.state().histories.get_mut(uid)
    {
        h.reset();
    }
    ctx.count(FailureAction::resume);
    info!(kind, %namespace, %name, "resumed a stopped world");
    ctx.event(
        &object.object_ref(&()),
        EventType::Normal,
        "WorldResumed",
        "Resume",
        format!("resumed on {}: {}", ann::RESUME, patch["spec"]),
    )
    .await;
    Ok(Action::await_change())
}

/// Reconcile a StatefulSet: resume it when asked.
pub async fn reconcile_statefulset(sts: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    resume(sts, ctx, "StatefulSet").await
}

/// Reconcile a Job: resume it when asked.
pub async fn reconcile_job(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    resume(job, ctx, "Job").await
}
