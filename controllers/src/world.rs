//! The world's state on the workload: the `trainwire.dev/world` annotation
//! ([`trainwire_contract::world`]), kept by the world controller.
//!
//! It runs in `trainwire-controllers` on the replica that holds the
//! controllers' Lease ([`crate::lease`]), beside the failure controller. Two
//! kube-rs [`Controller`]s, over StatefulSets and over Jobs, are re-triggered
//! by a shared Pod watch (a pod maps to its controller ownerReference). For
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
//! the sidecars' records, and the dedicated store's pods, which a third
//! watch follows by their label `trainwire.dev/rdzv-store` (its value names
//! the workload). A sidecar's record is an annotation of its pod, so the pod
//! watch reconciles the workload as soon as one is written: `Running`
//! follows the first record of training by one reconcile. A reconcile of a
//! world with an open loss is also repeated every [`RECOVERING_RECHECK`], so
//! the phase follows what is observed even when nothing else changes.
//!
//! On a new leader, [`Memory`] starts empty: the first observation of a
//! workload only learns its pods (no loss is counted) and the history comes
//! from the annotation, so a loss that happens while no replica leads is
//! counted only if its signs are still visible afterwards (a replaced pod is
//! not).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use thiserror::Error;
use tracing::{info, warn};
use trainwire_contract::world::{self, WorldError, WorldStatus};

use trainwire_contract::annotations as ann;
use trainwire_engine::world::{
    Memory, PodView, StoreView, WorldOf, Write, decide_write, observe, parse_time,
};

use crate::metrics::Metrics;

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
/// Back-off after a failed reconcile.
const ERROR_RECHECK: Duration = Duration::from_secs(10);
/// The field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "trainwire-world";
#[derive(Debug, Error)]
pub enum Error {
    #[error("writing {annotation} on {kind} {namespace}/{name}: {source}", annotation = world::ANNOTATION)]
    Write {
        kind: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pods: Store<Pod>,
    /// The dedicated stores' pods (label `trainwire.dev/rdzv-store`).
    store_pods: Option<Store<Pod>>,
    /// The workloads, to forget those deleted ([`Context::with_workloads`]).
    workloads: Option<(Store<StatefulSet>, Store<Job>)>,
    clock: Box<dyn Fn() -> Timestamp + Send + Sync>,
    state: Mutex<HashMap<String, Memory>>,
    min_interval: Duration,
    metrics: Arc<Metrics>,
}

impl Context {
    pub fn new(
        client: Client,
        pods: Store<Pod>,
        clock: Box<dyn Fn() -> Timestamp + Send + Sync>,
    ) -> Self {
        Context {
            client,
            pods,
            store_pods: None,
            workloads: None,
            clock,
            state: Mutex::new(HashMap::new()),
            min_interval: MIN_WRITE_INTERVAL,
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// Count failed reconciles in these metrics (the process's).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
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
    let now = (ctx.clock)();
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
    Api::<K>::namespaced(ctx.client.clone(), &namespace)
        .patch(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|source| Error::Write {
            kind,
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
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

fn error_policy<K: Resource>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    crate::reconcile::retry_after_error(
        crate::metrics::Controller::world,
        &*object,
        error,
        &ctx.metrics,
        ERROR_RECHECK,
    )
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

/// Run the world controller until aborted.
pub async fn run(client: Client, _metrics: Arc<Metrics>) {
    let (pod_store, pod_writer) = reflector::store_shared::<Pod>(256);
    let Some(pod_events) = pod_writer.subscribe() else {
        warn!("world controller: no pod subscription; not started");
        return;
    };
    // Only the injected pods and workloads: the apiserver filters by label.
    let injected =
        watcher::Config::default().labels(&trainwire_contract::labels::injected_selector());
    let pods = watcher(Api::<Pod>::all(client.clone()), injected.clone())
        .default_backoff()
        .modify(|p: &mut Pod| {
            crate::reconcile::slim(p);
            if let Some(s) = p.spec.as_mut() {
                // Only nodeName is read; the containers are the big part.
                s.containers.clear();
                s.init_containers = None;
                s.volumes = None;
            }
        })
        .reflect_shared(pod_writer)
        .for_each(|_| futures::future::ready(()));
    // The dedicated stores' pods: a loss of the store is a loss of the world.
    let (store_pod_store, store_pod_writer) = reflector::store_shared::<Pod>(64);
    let Some(store_pod_events) = store_pod_writer.subscribe() else {
        warn!("world controller: no store pod subscription; not started");
        return;
    };
    let store_pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(trainwire_contract::labels::RDZV_STORE),
    )
    .default_backoff()
    .modify(|p: &mut Pod| {
        crate::reconcile::slim(p);
        if let Some(s) = p.spec.as_mut() {
            s.containers.clear();
            s.init_containers = None;
            s.volumes = None;
        }
    })
    .reflect_shared(store_pod_writer)
    .for_each(|_| futures::future::ready(()));
    let (sts_store, sts_writer) = reflector::store::<StatefulSet>();
    let sts_stream = watcher(Api::<StatefulSet>::all(client.clone()), injected.clone())
        .default_backoff()
        .modify(crate::reconcile::slim)
        .reflect(sts_writer)
        .applied_objects();
    let (job_store, job_writer) = reflector::store::<Job>();
    let job_stream = watcher(Api::<Job>::all(client.clone()), injected)
        .default_backoff()
        .modify(crate::reconcile::slim)
        .reflect(job_writer)
        .applied_objects();
    let ctx = Arc::new(
        Context::new(client, pod_store, Box::new(Timestamp::now))
            .with_workloads(sts_store.clone(), job_store.clone())
            .with_store_pods(store_pod_store),
    );
    let statefulsets = Controller::for_stream(sts_stream, sts_store)
        .watches_shared_stream(pod_events.clone(), |pod: Arc<Pod>| {
            owner_of::<StatefulSet>(&pod, "StatefulSet")
        })
        .watches_shared_stream(store_pod_events.clone(), |pod: Arc<Pod>| {
            store_owner::<StatefulSet>(&pod)
        })
        .run(reconcile_statefulset, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let jobs = Controller::for_stream(job_stream, job_store)
        .watches_shared_stream(pod_events, |pod: Arc<Pod>| owner_of::<Job>(&pod, "Job"))
        .watches_shared_stream(store_pod_events, |pod: Arc<Pod>| store_owner::<Job>(&pod))
        .run(reconcile_job, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    info!(
        "world controller started: {} on injected workloads",
        world::ANNOTATION
    );
    futures::join!(pods, store_pods, statefulsets, jobs);
}
