//! The scale guard's decision, pure: whether a `statefulsets/scale` request
//! may change an injected StatefulSet's `replicas` without re-injection
//! ([`decide`], [`scale_allowed`]), and whether a Job's parallelism still
//! fits its injected world ([`job_size_warning`]). Where the StatefulSet
//! comes from (the admission server's watch cache) is the caller's.
//!
//! Its failure mode is an allowance, never a cluster-wide denial: when the
//! guard cannot know ([`Lookup::Unknown`], [`Lookup::Missing`]) the request
//! is allowed with an admission warning that says so. Only a known injected
//! StatefulSet whose new size its world does not cover is refused.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::mutation::annotations::Nnodes;
use crate::mutation::{Refusal, status};

/// What the guard knows about one StatefulSet.
#[derive(Clone, Debug)]
pub enum Lookup {
    Found(Arc<StatefulSet>),
    /// The cache is synced and does not hold it.
    Missing,
    /// The guard cannot know; the reason is shown to the user.
    Unknown(Unknown, String),
}

/// Why the guard could not know (the metric's label: a closed set).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Unknown {
    /// The server has no Kubernetes API client.
    no_client,
    /// The StatefulSet watch has not listed everything yet.
    not_synced,
    /// The watch is failing (RBAC, an unreachable apiserver): the cache may be stale.
    watch_error,
    /// The cache does not hold the StatefulSet (created a moment ago).
    not_cached,
    /// The StatefulSet's `trainwire.dev/status` cannot be read.
    unreadable_status,
}

impl Unknown {
    /// The reason as the metric's label shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unknown::no_client => "no_client",
            Unknown::not_synced => "not_synced",
            Unknown::watch_error => "watch_error",
            Unknown::not_cached => "not_cached",
            Unknown::unreadable_status => "unreadable_status",
        }
    }
}

/// The guard's verdict on one scale request.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Allow,
    /// Allowed, with this admission warning, because the guard could not know.
    AllowUnknown(Unknown, String),
    Refuse(Refusal),
}

/// Decide a `statefulsets/scale` UPDATE of `namespace/name` to `new_replicas`
/// (from `old_replicas`, when the review says). Pure: the lookup is done.
pub fn decide(
    lookup: impl FnOnce() -> Lookup,
    namespace: &str,
    name: &str,
    new_replicas: i32,
    old_replicas: Option<i32>,
) -> Verdict {
    if old_replicas == Some(new_replicas) {
        return Verdict::Allow;
    }
    let unknown = |reason: Unknown, why: &str| {
        Verdict::AllowUnknown(
            reason,
            format!(
                "trainwire could not check this scale of {namespace}/{name} ({why}): use kubectl apply or patch"
            ),
        )
    };
    let statefulset = match lookup() {
        Lookup::Unknown(reason, why) => return unknown(reason, &why),
        Lookup::Missing => {
            return unknown(
                Unknown::not_cached,
                "not in the webhook's StatefulSet cache yet",
            );
        }
        Lookup::Found(sts) => sts,
    };
    let Some(template) = statefulset.spec.as_ref().map(|s| &s.template) else {
        return Verdict::Allow;
    };
    let recorded = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(crate::mutation::annotations::STATUS));
    if recorded.is_none() {
        // Not injected: not trainwire's to guard.
        return Verdict::Allow;
    }
    let Some(status) = status::read(template) else {
        return unknown(
            Unknown::unreadable_status,
            "its trainwire.dev/status annotation cannot be read",
        );
    };
    match scale_allowed(name, &status, new_replicas) {
        Ok(()) => Verdict::Allow,
        Err(refusal) => Verdict::Refuse(refusal),
    }
}

/// Whether an injected StatefulSet whose template holds `status` may go to
/// `new_replicas` replicas through the scale subresource, which re-injects
/// nothing: yes when stopping (0), when the world is an elastic range that
/// covers the new size, or when the fixed world already is that size.
pub fn scale_allowed(
    name: &str,
    status: &status::Status,
    new_replicas: i32,
) -> Result<(), Refusal> {
    let new = u32::try_from(new_replicas).unwrap_or(0);
    if new == 0 {
        return Ok(());
    }
    let spares = status.spares;
    let detail = if status.nnodes.is_empty() {
        "it was injected paused (replicas 0, no trainwire.dev/nnodes), so its pods hold no world size".to_string()
    } else {
        match status.nnodes.parse::<Nnodes>() {
            Ok(n) if n.covers_with_spares(new, spares) => return Ok(()),
            Ok(Nnodes::Fixed(n)) if spares > 0 => format!(
                "its pods were injected with PET_NNODES={n} and {spares} spare(s), which takes {n} to {} pods",
                n.saturating_add(spares)
            ),
            Ok(Nnodes::Fixed(n)) => format!("its pods were injected with PET_NNODES={n}"),
            Ok(Nnodes::Elastic { min, max }) if spares > 0 => format!(
                "its elastic world is {min}:{max} with {spares} spare(s), which takes {min} to {} pods",
                max.saturating_add(spares)
            ),
            Ok(Nnodes::Elastic { min, max }) => {
                format!("its elastic world is {min}:{max}, which does not cover {new}")
            }
            Err(_) => format!("its recorded world size {:?} cannot be read", status.nnodes),
        }
    };
    Err(Refusal::Workload(format!(
        "StatefulSet {name}: scaling to {new} replicas with the scale subresource (kubectl scale) is refused because {detail} and it would go stale; change `replicas` with `kubectl apply` or `kubectl patch` (which re-injects PET_NNODES), or annotate an elastic range `trainwire.dev/nnodes: MIN:MAX` that covers {new}"
    )))
}

/// A warning for an UPDATE of an injected Job whose `parallelism` no
/// longer fits the world size its pods were injected with (a `kubectl
/// patch`, Kueue's partial admission): a Job's template cannot be
/// re-injected, so the pods keep `PET_NNODES` and the world waits for
/// nodes that do not run, or runs nodes it has no rank for. `None` while
/// suspended or at parallelism 0 (nothing runs), or when the size fits.
pub fn job_size_warning(job: &k8s_openapi::api::batch::v1::Job) -> Option<String> {
    let spec = job.spec.as_ref()?;
    if spec.suspend == Some(true) {
        return None;
    }
    let parallelism = u32::try_from(spec.parallelism.unwrap_or(1)).ok()?;
    if parallelism == 0 {
        return None;
    }
    let status = status::read(&spec.template)?;
    let world = status.nnodes.parse::<Nnodes>().ok()?;
    if world.covers_with_spares(parallelism, status.spares) {
        return None;
    }
    let spares = match status.spares {
        0 => String::new(),
        n => format!(" and {n} spare(s)"),
    };
    let injected = match world {
        Nnodes::Fixed(n) => format!("PET_NNODES={n}{spares}"),
        Nnodes::Elastic { min, max } => format!("the elastic world {min}:{max}{spares}"),
    };
    Some(format!(
        "parallelism {parallelism} does not fit {injected} of the pods: set it back, or recreate the Job"
    ))
}
