//! The world's state on the workload: the `trainwire.dev/world` annotation
//! ([`trainwire_contract::world`]), kept by the world controller.
//!
//! It runs in `trainwire-controllers` on the replica that holds the
//! controllers' Lease ([`crate::lease`]), beside the failure controller. Two
//! kube-rs [`Controller`]s, over StatefulSets and over Jobs, are re-triggered
//! by the process's one watch of injected pods ([`crate::watches`]: a pod
//! maps to its controller ownerReference). For
//! every injected workload (its pod template carries `trainwire.dev/status`)
//! a reconcile:
//!
//! 1. turns each of the workload's pods into a [`PodView`] (rank, Ready and
//!    since when, being deleted or failed, the sidecar's
//!    `trainwire.dev/peer-loss` and `trainwire.dev/checkpoint` records);
//! 2. calls the pure [`observe`], which finds new losses against what this
//!    replica saw before ([`Memory`]) and derives the status from the last
//!    one (the annotation as read, or the one this replica computed last);
//! 3. calls the pure [`decide_write`]: nothing when only `updatedAt` would
//!    change, into or out of `Recovering` at once (a loss opened,
//!    training seen again),
//!    other changes in a merge patch of the annotation at most once per
//!    [`MIN_WRITE_INTERVAL`] per workload (a write held back is made at the
//!    end of the interval, with whatever is true then).
//!
//! What counts as a loss and as "resumed" is the engine's
//! ([`trainwire_engine::world`], docs/status.md): pod and container states,
//! the sidecars' records, and the dedicated store's pods, which the
//! watch of store pods follows by their label `trainwire.dev/rdzv-store` (its
//! value names the workload). A sidecar's record is an annotation of its
//! pod, so the pod watch reconciles the workload as soon as one is written:
//! `Running` follows the first record of training by one reconcile. A
//! reconcile of a world with an open loss is also repeated every
//! [`RECOVERING_RECHECK`], so the phase follows what is observed even when
//! nothing else changes.
//!
//! On a new leader, [`Memory`] starts empty: the first observation of a
//! workload only learns its pods (no loss is counted) and the history comes
//! from the annotation, so a loss that happens while no replica leads is
//! counted only if its signs are still visible afterwards (a replaced pod is
//! not).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};
use trainwire_contract::world::{self, WorldError, WorldStatus};

use trainwire_contract::annotations as ann;
use trainwire_engine::world::{
    Memory, PodView, StoreView, WorldOf, Write, decide_write, observe, parse_time,
};

use crate::error::{Error, Result};
use crate::reconcile::{Reconciler, Shared, error_policy};
use crate::watches::Watches;

/// Every Kubernetes API call the world controller makes.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("apps", "statefulsets", "list"),
    ("apps", "statefulsets", "watch"),
    ("apps", "statefulsets", "patch"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("batch", "jobs", "patch"),
];

/// At most one write of a workload's annotation per this interval.
pub const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(10);
/// How often a world with an open loss is looked at again, changes or not.
pub const RECOVERING_RECHECK: Duration = Duration::from_secs(5);
/// The field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "trainwire-world";

/// Shared by every reconcile of the world controller.
pub struct Context {
    shared: Arc<Shared>,
    pods: Store<Pod>,
    /// The dedicated stores' pods (label `trainwire.dev/rdzv-store`).
    store_pods: Option<Store<Pod>>,
    /// The workloads, to forget those deleted ([`Context::with_workloads`]).
    workloads: Option<(Store<StatefulSet>, Store<Job>)>,
    state: Mutex<HashMap<String, Memory>>,
    min_interval: Duration,
}

impl Reconciler for Context {
    const CONTROLLER: crate::metrics::Controller = crate::metrics::Controller::world;
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Context {
    /// The world controller's context over the injected pods in `pods`.
    pub fn new(shared: Arc<Shared>, pods: Store<Pod>) -> Self {
        Context {
            shared,
            pods,
            store_pods: None,
            workloads: None,
            state: Mutex::new(HashMap::new()),
            min_interval: MIN_WRITE_INTERVAL,
        }
    }

    /// Read the dedicated stores' pods from this store.
    pub fn with_store_pods(mut self, store_pods: Store<Pod>) -> Self {
        self.store_pods = Some(store_pods);
        self
    }

    /// The pods of the dedicated store of workload `name` in `namespace`;
    /// `None` when the store pods are not watched.
    fn store_of(&self, namespace: &str, name: &str, now: Timestamp) -> Option<Vec<StoreView>> {
        let pods = self.store_pods.as_ref()?;
        Some(
            pods.state()
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
                .filter(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(trainwire_contract::labels::RDZV_STORE))
                        .is_some_and(|v| v == name)
                })
                .map(|p| StoreView::of(p, now))
                .collect(),
        )
    }

    /// Forget the memory of workloads no longer in these stores.
    pub fn with_workloads(mut self, statefulsets: Store<StatefulSet>, jobs: Store<Job>) -> Self {
        self.workloads = Some((statefulsets, jobs));
        self
    }

    /// Drop the memory of deleted workloads (bounded by the live ones).
    fn forget_deleted(&self) {
        let Some((statefulsets, jobs)) = &self.workloads else {
            return;
        };
        let mut state = self.state();
        if state.len() <= statefulsets.state().len() + jobs.state().len() {
            return;
        }
        let live: std::collections::HashSet<String> = statefulsets
            .state()
            .iter()
            .filter_map(|s| s.metadata.uid.clone())
            .chain(jobs.state().iter().filter_map(|j| j.metadata.uid.clone()))
            .collect();
        state.retain(|uid, _| live.contains(uid));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memory>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The views of the pods a workload controls.
    fn pods_of(&self, uid: &str, now: Timestamp) -> Vec<PodView> {
        self.pods
            .state()
            .iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.controller == Some(true) && o.uid == uid)
            })
            .filter_map(|p| PodView::of(p, now))
            .collect()
    }
}

fn injected(template: Option<&PodTemplateSpec>) -> bool {
    template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key(ann::STATUS))
}

/// Reconcile one workload: compute its status, write it when it changed.
async fn reconcile<K>(
    object: Arc<K>,
    ctx: Arc<Context>,
    kind: &'static str,
    template: Option<&PodTemplateSpec>,
    workload: WorldOf,
) -> Result<Action>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let uid = object.meta().uid.clone().unwrap_or_default();
    if !injected(template) || object.meta().deletion_timestamp.is_some() {
        ctx.state().remove(&uid);
        return Ok(Action::await_change());
    }
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let current = match object.annotations().get(world::ANNOTATION) {
        None => None,
        Some(v) => match WorldStatus::from_annotation(v) {
            Ok(s) => Some(s),
            Err(e @ WorldError::NewerVersion { .. }) => {
                warn!(kind, %namespace, %name, error = %e, "leaving the world status to a newer trainwire");
                return Ok(Action::await_change());
            }
            Err(e) => {
                warn!(kind, %namespace, %name, error = %e, "replacing an unreadable world status");
                None
            }
        },
    };
    ctx.forget_deleted();
    let now = ctx.shared.now();
    let pods = ctx.pods_of(&uid, now);
    let store = ctx.store_of(&namespace, &name, now);
    let (desired, write) = {
        let mut state = ctx.state();
        let memory = state.entry(uid.clone()).or_default();
        let base = memory.status.clone().or_else(|| current.clone());
        let mut desired = observe(
            base.as_ref(),
            memory,
            &workload,
            &pods,
            store.as_deref(),
            now,
        );
        let last_write = memory.last_write.or_else(|| {
            current
                .as_ref()
                .and_then(|c| parse_time(&c.updated_at))
                .filter(|t| *t <= now)
        });
        let write = decide_write(
            current.as_ref(),
            &desired,
            last_write,
            now,
            ctx.min_interval,
        );
        if write == Write::Now {
            desired.updated_at = now.to_string();
        }
        memory.status = Some(desired.clone());
        (desired, write)
    };
    // While a loss is open, look again on a timer: the phase must follow
    // what is observed even when no watch event comes.
    let recovering = desired.phase == world::Phase::Recovering;
    let idle = if recovering {
        Action::requeue(RECOVERING_RECHECK)
    } else {
        Action::await_change()
    };
    match write {
        Write::Unchanged => return Ok(idle),
        Write::After(wait) => return Ok(Action::requeue(wait)),
        Write::Now => {}
    }
    let patch = json!({"metadata": {"annotations": {world::ANNOTATION: desired.to_annotation()}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    Api::<K>::namespaced(ctx.shared.client.clone(), &namespace)
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(Error::api(format!(
            "writing {} on {kind} {namespace}/{name}",
            world::ANNOTATION
        )))?;
    if let Some(m) = ctx.state().get_mut(&uid) {
        m.last_write = Some(now);
    }
    info!(kind, %namespace, %name, phase = %desired.phase, generation = desired.generation,
        ready = desired.nodes.ready, expected = desired.nodes.expected, "world status written");
    Ok(idle)
}

/// Reconcile a StatefulSet's world status.
pub async fn reconcile_statefulset(sts: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    let workload = WorldOf::of_statefulset(&sts);
    let template = sts.spec.as_ref().map(|s| s.template.clone());
    reconcile(sts, ctx, "StatefulSet", template.as_ref(), workload).await
}

/// Reconcile a Job's world status.
pub async fn reconcile_job(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    let workload = WorldOf::of_job(&job);
    let template = job.spec.as_ref().map(|s| s.template.clone());
    reconcile(job, ctx, "Job", template.as_ref(), workload).await
}

/// The workload a pod belongs to, if it is of `kind`.
fn owner_of<K>(pod: &Pod, kind: &str) -> Option<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    let o = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == kind)?;
    Some(ObjectRef::new(&o.name).within(pod.metadata.namespace.as_deref()?))
}

/// The workloads a dedicated store's pod belongs to: its label names the
/// workload, a StatefulSet or a Job of the pod's namespace.
fn store_owner<K>(pod: &Pod) -> Option<ObjectRef<K>>
where
    K: Resource<DynamicType = ()>,
{
    let name = pod
        .metadata
        .labels
        .as_ref()?
        .get(trainwire_contract::labels::RDZV_STORE)?;
    Some(ObjectRef::new(name).within(pod.metadata.namespace.as_deref()?))
}

/// The world controller, subscribed to the process's watches of injected
/// pods, the dedicated stores' pods, StatefulSets and Jobs; it runs until
/// aborted.
pub fn run(shared: Arc<Shared>, watches: &Watches) -> impl Future<Output = ()> + use<> {
    let ctx = Arc::new(
        Context::new(shared, watches.pods.store())
            .with_workloads(watches.statefulsets.store(), watches.jobs.store())
            .with_store_pods(watches.store_pods.store()),
    );
    let statefulsets = Controller::for_shared_stream(
        watches.statefulsets.subscribe(),
        watches.statefulsets.store(),
    )
    .watches_shared_stream(watches.pods.subscribe(), |pod: Arc<Pod>| {
        owner_of::<StatefulSet>(&pod, "StatefulSet")
    })
    .watches_shared_stream(watches.store_pods.subscribe(), |pod: Arc<Pod>| {
        store_owner::<StatefulSet>(&pod)
    })
    .run(reconcile_statefulset, error_policy, ctx.clone())
    .for_each(|_| futures::future::ready(()));
    let jobs = Controller::for_shared_stream(watches.jobs.subscribe(), watches.jobs.store())
        .watches_shared_stream(watches.pods.subscribe(), |pod: Arc<Pod>| {
            owner_of::<Job>(&pod, "Job")
        })
        .watches_shared_stream(watches.store_pods.subscribe(), |pod: Arc<Pod>| {
            store_owner::<Job>(&pod)
        })
        .run(reconcile_job, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    async move {
        info!(
            "world controller started: {} on injected workloads",
            world::ANNOTATION
        );
        futures::join!(statefulsets, jobs);
    }
}
