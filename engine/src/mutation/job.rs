//! What a Job needs beyond its pod template to be a torchrun world: its
//! success policy (the world's minimum, not every index), its pod failure
//! policy (a lost node is a disruption, not a failure against
//! `backoffLimit`), its replacement policy, and the manifests the apiserver
//! would refuse, refused here with the fix.

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
    SuccessPolicy, SuccessPolicyRule,
};

use super::injection::{Ctx, Refusal};

/// The status `fields` entry for `spec.completionMode` made `Indexed` where
/// it was `NonIndexed` (the apiserver's default before admission); a plain
/// `completionMode` means it was absent.
pub const FIELD_NON_INDEXED: &str = "completionMode=NonIndexed";

/// The status `fields` entry for an injected `spec.podFailurePolicy`.
pub const FIELD_POD_FAILURE_POLICY: &str = "podFailurePolicy";
/// Fields of the manifest that the apiserver refuses and that the engine
/// could not patch around: a Job's `successPolicy` without rules (the
/// apiserver requires at least one; typed, it cannot be told from
/// `rules: []`, so a rule added to it would not apply to the object as
/// sent). Refused here with the fix, before anything is changed.
pub fn refuse_invalid(j: &Job) -> Result<(), Refusal> {
    if let Some(own) = j.spec.as_ref().and_then(|s| s.success_policy.as_ref())
        && own.rules.is_empty()
    {
        return Err(Refusal::Workload(format!(
            "Job {} has a spec.successPolicy without rules, which Kubernetes refuses: add a rule or remove it",
            j.metadata.name.as_deref().unwrap_or_default()
        )));
    }
    Ok(())
}

/// The status `fields` entry for a Job `successPolicy` trainwire set.
pub const FIELD_SUCCESS_POLICY: &str = "successPolicy";

/// A Job with spares finishes when its world does: when the world's
/// training pods have succeeded. The spares' torchrun exits 1 when the
/// rendezvous closes (measured with torch 2.15: a redundant node's agent
/// fails on the closed rendezvous), so an Indexed Job that waited for every
/// index would retry the spares and end Failed. On CREATE only (a Job's
/// spec is immutable after), with Kubernetes' Job success policy (1.31+,
/// GA in 1.33): `succeededCount` = the world's smallest size; the Job
/// controller then ends the remaining pods. A manifest's own policy is
/// kept, with a warning when it waits for more indexes than the world has.
pub fn success_policy(ctx: &mut Ctx<'_>, j: &mut Job, world_min: u32, spares: u32) {
    let Some(spec) = j.spec.as_mut() else {
        return;
    };
    if spares == 0 {
        return;
    }
    let count = i32::try_from(world_min).unwrap_or(i32::MAX);
    let backoff = spec.backoff_limit.unwrap_or(6);
    if spec.backoff_limit_per_index.is_none() && i64::from(backoff) < i64::from(spares) {
        ctx.warn(format!(
            "backoffLimit {backoff} is below the {spares} spares, whose pods fail (exit 1) when the world ends: set it >= {spares}"
        ));
    }
    if let Some(own) = &spec.success_policy {
        let fits = own.rules.iter().any(|r| {
            r.succeeded_indexes.is_none() && r.succeeded_count.is_some_and(|c| c <= count)
        });
        if !fits {
            ctx.warn(format!(
                "spec.successPolicy (kept) has no rule succeededCount <= {count}: with {spares} spares the Job may end Failed"
            ));
        }
        return;
    }
    spec.success_policy = Some(SuccessPolicy {
        rules: vec![SuccessPolicyRule {
            succeeded_count: Some(count),
            succeeded_indexes: None,
        }],
    });
    ctx.status.fields.push(FIELD_SUCCESS_POLICY.to_string());
}
/// A Job with a dedicated store: when the store is lost, every trainer's
/// torchrun fails (exit 1) once, and each failure counts against the
/// Job's `backoffLimit` (a pod failure with `Never`, a container restart
/// with `OnFailure`). Warned when the limit is below the Job's pods: one
/// store loss would end the Job Failed.
pub fn store_loss_budget(ctx: &mut Ctx<'_>, j: &Job) {
    let Some(spec) = j.spec.as_ref() else {
        return;
    };
    if spec.backoff_limit_per_index.is_some() {
        return;
    }
    let pods = spec.parallelism.unwrap_or(1);
    let backoff = spec.backoff_limit.unwrap_or(6);
    if backoff < pods {
        ctx.warn(format!(
            "backoffLimit {backoff} is below the {pods} pods, which all fail once if the rendezvous store is lost"
        ));
    }
}

/// The status `fields` entry for `spec.podReplacementPolicy` set to `Failed`
/// where it was absent; `podReplacementPolicy=<value>` when it had another
/// value (the apiserver defaults it to `TerminatingOrFailed` before
/// admission), so that stripping restores exactly what was there.
pub const FIELD_POD_REPLACEMENT_POLICY: &str = "podReplacementPolicy";

/// The pod condition the control plane sets on a pod it evicts, preempts or
/// deletes for a taint (and trainwire's controller on a pod it reclaims from
/// a dead node).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// The Job rule that keeps a lost node, an eviction or a preemption off the
/// Job's `backoffLimit`: `{action: Ignore, onPodConditions: [{type:
/// DisruptionTarget, status: "True"}]}` (`status` written out: it is the
/// apiserver's default, and the stored object must equal what was injected).
pub fn disruption_rule() -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: "Ignore".to_string(),
        on_exit_codes: None,
        on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
            type_: DISRUPTION_TARGET.to_string(),
            status: "True".to_string(),
        }]),
    }
}

/// Node loss is not a script failure (docs/failures.md). On CREATE of a Job
/// (its template is immutable after) whose profile turns `nodeFailure`
/// reclaim on and whose pods have `restartPolicy: Never` (the API refuses a
/// `podFailurePolicy` otherwise): inject [`disruption_rule`] and
/// `podReplacementPolicy: Failed`, the only value the API allows with a
/// `podFailurePolicy`. Under `Failed` a pod on a dead node gets no
/// replacement until it reaches `Failed`, which only the reclaim makes
/// happen: without `nodeFailure` nothing is injected. A manifest's own
/// `podFailurePolicy` is kept; without a `DisruptionTarget` rule it is
/// warned about.
pub fn disruption_policy(ctx: &mut Ctx<'_>, spec: &mut JobSpec) {
    let reclaim = ctx.profile.node_failure.is_some();
    if let Some(own) = &spec.pod_failure_policy {
        let has_rule = own.rules.iter().any(|r| {
            r.on_pod_conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == DISRUPTION_TARGET)
        });
        if !reclaim {
            ctx.warn(
                "spec.podFailurePolicy without the policy's nodeFailure reclaim: a pod on a dead node is never replaced"
                    .to_string(),
            );
        } else if !has_rule {
            ctx.warn(
                "spec.podFailurePolicy (kept) has no DisruptionTarget rule: a pod lost with its node counts against backoffLimit"
                    .to_string(),
            );
        }
        return;
    }
    let never = spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.restart_policy.as_deref())
        == Some("Never");
    if !reclaim || !never {
        return;
    }
    spec.pod_failure_policy = Some(PodFailurePolicy {
        rules: vec![disruption_rule()],
    });
    ctx.status.fields.push(FIELD_POD_FAILURE_POLICY.to_string());
    match spec.pod_replacement_policy.as_deref() {
        Some("Failed") => {}
        None => {
            spec.pod_replacement_policy = Some("Failed".to_string());
            ctx.status
                .fields
                .push(FIELD_POD_REPLACEMENT_POLICY.to_string());
        }
        Some(other) => {
            ctx.status
                .fields
                .push(format!("{FIELD_POD_REPLACEMENT_POLICY}={other}"));
            spec.pod_replacement_policy = Some("Failed".to_string());
        }
    }
}
