//! Where the pods may run: policy node selectors and tolerations, the GPU
//! toleration, and how long pods stay bound to a failed node
//! (`tolerationSeconds` for `node.kubernetes.io/unreachable` and
//! `node.kubernetes.io/not-ready`; Kubernetes' default is 300 s, which is
//! the slow part of replacing a lost training node).

use k8s_openapi::api::core::v1::{PodSpec, Toleration};

use super::fingerprint::fingerprint;
use super::injection::{Ctx, Refusal};
use crate::policy::{self, Enforce};

pub const NODE_FAILURE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
];

fn operator(t: &Toleration) -> &str {
    t.operator.as_deref().unwrap_or("Equal")
}

/// Whether `existing` already tolerates what `wanted` tolerates.
fn covers(existing: &Toleration, wanted: &Toleration) -> bool {
    let key_ok = match existing.key.as_deref().filter(|k| !k.is_empty()) {
        None => operator(existing) == "Exists",
        Some(k) => Some(k) == wanted.key.as_deref(),
    };
    let effect_ok = match existing.effect.as_deref().filter(|e| !e.is_empty()) {
        None => true,
        Some(e) => Some(e) == wanted.effect.as_deref(),
    };
    let value_ok = operator(existing) == "Exists"
        || (operator(wanted) == "Equal" && existing.value == wanted.value);
    let seconds_ok = existing.toleration_seconds.is_none()
        || existing.toleration_seconds == wanted.toleration_seconds;
    key_ok && effect_ok && value_ok && seconds_ok
}

/// Add the toleration unless an existing one already covers it.
pub fn ensure_toleration(ctx: &mut Ctx<'_>, spec: &mut PodSpec, wanted: Toleration) {
    let tols = spec.tolerations.get_or_insert_with(Vec::new);
    if tols.iter().any(|t| covers(t, &wanted)) {
        return;
    }
    ctx.status.tolerations.push(fingerprint(&wanted));
    tols.push(wanted);
}

/// Policy node selectors, tolerations and node-failure toleration seconds.
pub fn apply(ctx: &mut Ctx<'_>, spec: &mut PodSpec) -> Result<(), Refusal> {
    let profile = ctx.profile;
    for (key, setting) in &profile.node_selector {
        let user = spec
            .node_selector
            .as_ref()
            .and_then(|s| s.get(key))
            .cloned();
        let source = format!("nodeSelector {key} of the pod template");
        let rule = format!("nodeSelector.{key}");
        let resolved = policy::resolve(
            profile,
            &rule,
            setting,
            user.clone().map(|u| (u, source.as_str())),
        )?;
        if let Some(w) = resolved.warning {
            ctx.warn(w);
        }
        if user.as_ref() != Some(&resolved.value) {
            if let Some(orig) = user {
                ctx.status.replaced_node_selector.insert(key.clone(), orig);
            }
            ctx.status
                .node_selector
                .insert(key.clone(), resolved.value.clone());
            spec.node_selector
                .get_or_insert_with(Default::default)
                .insert(key.clone(), resolved.value);
        }
    }
    for t in &profile.tolerations {
        ensure_toleration(ctx, spec, t.clone());
    }
    if let Some(setting) = &profile.node_failure_tolerations() {
        for taint in NODE_FAILURE_TAINTS {
            node_failure_toleration(ctx, spec, taint, setting)?;
        }
    }
    Ok(())
}

fn node_failure_toleration(
    ctx: &mut Ctx<'_>,
    spec: &mut PodSpec,
    taint: &str,
    setting: &policy::Setting<i64>,
) -> Result<(), Refusal> {
    let profile = ctx.profile;
    let rule = "nodeFailureTolerationSeconds";
    let wanted = Toleration {
        key: Some(taint.to_string()),
        operator: Some("Exists".to_string()),
        effect: Some("NoExecute".to_string()),
        toleration_seconds: Some(setting.value),
        value: None,
    };
    let tols = spec.tolerations.get_or_insert_with(Vec::new);
    let existing = tols.iter().position(|t| {
        t.key.as_deref() == Some(taint)
            && t.effect
                .as_deref()
                .is_none_or(|e| e == "NoExecute" || e.is_empty())
    });
    let Some(pos) = existing else {
        ctx.status.tolerations.push(fingerprint(&wanted));
        tols.push(wanted);
        return Ok(());
    };
    let source = format!("tolerationSeconds of the pod template's toleration for {taint}");
    let new_seconds = match tols[pos].toleration_seconds {
        Some(user) => {
            let r = policy::resolve(profile, rule, setting, Some((user, source.as_str())))?;
            if let Some(w) = r.warning {
                ctx.warn(w);
            }
            (r.value != user).then_some(r.value)
        }
        // Tolerated forever: a conflict with any enforced number of seconds.
        None => match setting.enforce {
            Enforce::Default => None,
            Enforce::Refuse => {
                return Err(Refusal::Policy {
                    profile: profile.name.clone(),
                    rule: rule.to_string(),
                    detail: format!(
                        "the pod template tolerates {taint} forever (no tolerationSeconds), but the policy enforces {} s; remove that toleration or set tolerationSeconds: {}",
                        setting.value, setting.value
                    ),
                });
            }
            Enforce::Overwrite => {
                ctx.warn(format!(
                    "policy profile {:?} rule {rule}: the toleration of {taint} for ever overwritten with the enforced {}s",
                    profile.name, setting.value
                ));
                Some(setting.value)
            }
        },
    };
    if let Some(seconds) = new_seconds {
        let mut t = tols[pos].clone();
        t.toleration_seconds = Some(seconds);
        let orig = std::mem::replace(&mut tols[pos], t.clone());
        ctx.status
            .replaced_tolerations
            .insert(fingerprint(&t), orig);
    }
    Ok(())
}
