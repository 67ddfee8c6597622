//! The failure controller: dead-node reclaim and crash-loop stop, applied.
//!
//! It runs in `trainwire-controllers` on the replica that holds the
//! controllers' Lease ([`crate::lease`]). A kube-rs [`Controller`] over Pods
//! (re-triggered by Node changes through a Node reflector) judges every pod
//! of an injected workload (its template carries `trainwire.dev/status`, so
//! its pods do; the owner comes from the pod's controller ownerReference):
//!
//! - its node, with [`crate::nodefailure::decide`]: force-delete the pod or
//!   taint the node out-of-service once the node's `Ready` condition has
//!   been `Unknown`/`False` for the profile's `nodeFailure.reclaimAfter`,
//!   under the `maxPodsPerMinute` cap, once per pod (or node);
//! - its trainer's exits, with [`crate::crashloop::History::observe`]: a
//!   stop scales a StatefulSet to 0 (a merge patch of `spec.replicas`, which
//!   goes through admission and re-injects a paused world) or suspends a
//!   Job, and records the evidence in `trainwire.dev/stopped-*` annotations.
//!
//! Controllers over StatefulSets and Jobs resume a stopped world when the
//! user annotates it `trainwire.dev/resume` (any value).
//!
//! Every action is an Event on the workload and on the pod, a log line and a
//! count in `trainwire_webhook_failure_actions_total`. The Events tell the
//! story in order: `PeerLost` → `PodReclaimed`/`NodeOutOfService` →
//! `PodReplaced`, or `WorldStopped` → `WorldResumed`. Each names the
//! controller's loss generation of that workload (how many pod or node
//! losses it has seen).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::crashloop::{self, History};
use crate::error::{Error, Result};
use crate::metrics::{FailureAction, FailureLabels};
use crate::nodefailure::{self, NodeHealth, RateLimit, Reclaim};
use crate::reconcile::{Reconciler, Shared, error_policy};
use crate::watches::Watches;

mod stop;
use stop::crash_loop;
pub use stop::{reconcile_job, reconcile_statefulset, resume_patch};
use trainwire_engine::mutation::annotations as ann;
use trainwire_engine::pod;

/// The Kubernetes API calls the failure controller makes whatever its
/// [`Features`]: it watches the injected pods (label-selected) and tells
/// peer losses in Events on the workload. The rights of each feature are
/// [`crate::nodefailure::API_PERMISSIONS`] and
/// [`crate::crashloop::API_PERMISSIONS`], granted only by the kustomize
/// component that turns it on.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

/// The failure controller's features that act on the cluster. Each needs
/// rights of its own; off, its code makes no call and starts no watch (no
/// Node watch without dead-node reclaim, no StatefulSet or Job watch without
/// crash-loop stop), so the install grants nothing for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Dead-node reclaim (the profile's `nodeFailure`).
    pub node_failure: bool,
    /// Crash-loop stop and resume (`crashLoop`, `trainwire.dev/max-failures`,
    /// `trainwire.dev/fail-fast-exit-codes`).
    pub crash_loop: bool,
}

impl Features {
    /// Both on.
    pub const ALL: Features = Features {
        node_failure: true,
        crash_loop: true,
    };

    /// Every API call the controller makes with these features.
    pub fn permissions(self) -> Vec<(&'static str, &'static str, &'static str)> {
        let mut all = API_PERMISSIONS.to_vec();
        if self.node_failure {
            all.extend_from_slice(nodefailure::API_PERMISSIONS);
        }
        if self.crash_loop {
            all.extend_from_slice(crashloop::API_PERMISSIONS);
        }
        all
    }
}

/// The field manager of the controller's writes.
const FIELD_MANAGER: &str = "trainwire-failures";

/// A workload a pod belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(
                if self.kind == "Job" {
                    "batch/v1"
                } else {
                    "apps/v1"
                }
                .to_string(),
            ),
            kind: Some(self.kind.to_string()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            ..ObjectReference::default()
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The StatefulSet or Job that controls a pod, from its ownerReferences.
pub fn owner(pod: &Pod) -> Option<Owner> {
    let o = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))?;
    let kind = match o.kind.as_str() {
        "StatefulSet" => "StatefulSet",
        "Job" => "Job",
        _ => return None,
    };
    Some(Owner {
        kind,
        namespace: pod.metadata.namespace.clone()?,
        name: o.name.clone(),
        uid: o.uid.clone(),
    })
}

#[derive(Default)]
struct State {
    rate: RateLimit,
    reclaimed: HashSet<String>,
    tainted: HashSet<String>,
    histories: HashMap<String, History>,
    /// Pods seen lost, by (namespace, name): the lost pod's UID.
    lost: HashMap<(String, String), String>,
    /// Sidecar peer-loss records already counted: (pod UID, generation).
    sidecar_losses: HashSet<(String, u64)>,
}

/// Shared by every reconcile of the failure controller.
pub struct Context {
    shared: Arc<Shared>,
    nodes: Store<Node>,
    statefulsets: Store<StatefulSet>,
    jobs: Store<Job>,
    state: Mutex<State>,
    features: Features,
}

impl Reconciler for Context {
    const CONTROLLER: crate::metrics::Controller = crate::metrics::Controller::failures;
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Context {
    pub fn new(
        shared: Arc<Shared>,
        nodes: Store<Node>,
        statefulsets: Store<StatefulSet>,
        jobs: Store<Job>,
    ) -> Self {
        Context {
            shared,
            nodes,
            statefulsets,
            jobs,
            state: Mutex::new(State::default()),
            features: Features::ALL,
        }
    }

    /// Only these features act (all of them by default).
    pub fn with_features(mut self, features: Features) -> Self {
        self.features = features;
        self
    }

    fn now(&self) -> Timestamp {
        self.shared.now()
    }

    fn client(&self) -> kube::Client {
        self.shared.client.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, action: FailureAction) {
        self.shared
            .metrics
            .failure_actions
            .get_or_create(&FailureLabels { action })
            .inc();
    }

    async fn event(
        &self,
        on: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        self.shared.publish(event, on).await;
    }

    /// The same Warning Event on the workload and on its pod (a reclaim).
    async fn event_on_both(
        &self,
        owner: &Owner,
        pod: &ObjectReference,
        reason: &str,
        note: String,
    ) {
        self.event(
            &owner.reference(),
            EventType::Warning,
            reason,
            "Reclaim",
            note.clone(),
        )
        .await;
        self.event(pod, EventType::Warning, reason, "Reclaim", note)
            .await;
    }

    /// The workload's annotations, from the cache.
    fn workload_annotations(&self, owner: &Owner) -> Option<BTreeMap<String, String>> {
        let r = |name: &str| name.to_string();
        match owner.kind {
            "StatefulSet" => self
                .statefulsets
                .get(&ObjectRef::new(&r(&owner.name)).within(&owner.namespace))
                .map(|s| s.annotations().clone()),
            _ => self
                .jobs
                .get(&ObjectRef::new(&r(&owner.name)).within(&owner.namespace))
                .map(|j| j.annotations().clone()),
        }
    }
}

fn requeue_at(now: Timestamp, at: Timestamp) -> Action {
    let wait = at
        .duration_since(now)
        .try_into()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1));
    Action::requeue(wait)
}

/// Reconcile one pod: its node, then its trainer's exits.
pub async fn reconcile_pod(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    if !pod::injected(&pod) {
        return Ok(Action::await_change());
    }
    let Some(owner) = owner(&pod) else {
        return Ok(Action::await_change());
    };
    let now = ctx.now();
    let namespace = owner.namespace.clone();
    let profile = ctx
        .shared
        .policy
        .current()
        .profile_for(&namespace)
        .into_owned();
    let pod_name = pod.name_any();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let pod_ref = pod.object_ref(&());
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let health = node_name
        .as_ref()
        .filter(|_| ctx.features.node_failure)
        .and_then(|n| ctx.nodes.get(&ObjectRef::new(n)))
        .map(|n| NodeHealth::of(&n));

    // A replacement of a pod seen lost.
    let replaced = {
        let mut st = ctx.state();
        match st.lost.get(&(namespace.clone(), pod_name.clone())) {
            Some(old) if *old != uid => {
                st.lost.remove(&(namespace.clone(), pod_name.clone()));
                true
            }
            _ => false,
        }
    };
    if replaced {
        let generation = ctx
            .state()
            .histories
            .get(&owner.uid)
            .map_or(0, |h| h.generation);
        ctx.event(
            &owner.reference(),
            EventType::Normal,
            "PodReplaced",
            "Replace",
            format!(
                "pod {pod_name} replaced (new pod{}); loss generation {generation}",
                node_name
                    .as_deref()
                    .map(|n| format!(" on node {n}"))
                    .unwrap_or_default()
            ),
        )
        .await;
    }

    let mut action = Action::await_change();
    let mut own_loss = pod::lost(&pod);
    if let Some(health) = &health {
        own_loss |= !health.ready;
        let node = node_name.clone().unwrap_or_default();
        match nodefailure::decide(
            health,
            nodefailure::pod_finished(&pod),
            profile.node_failure.as_ref(),
            now,
        ) {
            Reclaim::Nothing | Reclaim::AlreadyOutOfService => {}
            Reclaim::WaitUntil(at) => action = requeue_at(now, at),
            decision @ (Reclaim::ForceDelete | Reclaim::TaintNode) => {
                let taint = decision == Reclaim::TaintNode;
                let done = {
                    let st = ctx.state();
                    if taint {
                        st.tainted.contains(&node)
                    } else {
                        st.reclaimed.contains(&uid)
                    }
                };
                if !done {
                    let per_minute = profile
                        .node_failure
                        .as_ref()
                        .map_or(1, |n| n.max_pods_per_minute);
                    let allowed = ctx.state().rate.take(now, per_minute);
                    match allowed {
                        Err(next) => {
                            ctx.count(FailureAction::rate_limited);
                            warn!(pod = %pod_name, %namespace, node, "reclaim held back by nodeFailure.maxPodsPerMinute");
                            action = requeue_at(now, next);
                        }
                        Ok(()) => {
                            let since = health.since.map(|t| t.to_string()).unwrap_or_default();
                            let why = format!(
                                "node {node} has been Ready={} since {since} (reclaimAfter {})",
                                health.status,
                                profile
                                    .node_failure
                                    .as_ref()
                                    .map(|n| n.reclaim_after.to_string())
                                    .unwrap_or_default()
                            );
                            let generation = {
                                let mut st = ctx.state();
                                if taint {
                                    st.tainted.insert(node.clone());
                                } else {
                                    st.reclaimed.insert(uid.clone());
                                }
                                st.lost
                                    .insert((namespace.clone(), pod_name.clone()), uid.clone());
                                st.histories.entry(owner.uid.clone()).or_default().loss(now)
                            };
                            peer_lost_event(
                                &ctx,
                                &owner,
                                format!("pod {pod_name}: {why}; loss generation {generation}"),
                            )
                            .await;
                            if taint {
                                taint_node(&ctx, &node).await?;
                                ctx.count(FailureAction::out_of_service);
                                info!(%owner, pod = %pod_name, node, generation, "tainted the dead node out-of-service");
                                let note = format!(
                                    "tainted node {node} {}={}:{} so its pods are deleted and their volumes detached; loss generation {generation}",
                                    nodefailure::OUT_OF_SERVICE_TAINT,
                                    nodefailure::OUT_OF_SERVICE_VALUE,
                                    nodefailure::OUT_OF_SERVICE_EFFECT
                                );
                                ctx.event_on_both(&owner, &pod_ref, "NodeOutOfService", note)
                                    .await;
                            } else {
                                if owner.kind == "Job" {
                                    mark_disrupted(&ctx, &namespace, &pod_name, &why).await?;
                                }
                                force_delete(&ctx, &namespace, &pod_name, &uid).await?;
                                ctx.count(FailureAction::force_delete);
                                info!(%owner, pod = %pod_name, node, generation, "force-deleted a pod on a dead node");
                                let note = format!(
                                    "force-deleted pod {pod_name} (grace 0) because {why}, so the {} creates its replacement; loss generation {generation}",
                                    owner.kind
                                );
                                ctx.event_on_both(&owner, &pod_ref, "PodReclaimed", note)
                                    .await;
                            }
                        }
                    }
                }
            }
        }
    }

    // A pod lost another way (evicted, preempted, deleted): a peer loss.
    if pod::lost(&pod) {
        let first = {
            let mut st = ctx.state();
            let key = (namespace.clone(), pod_name.clone());
            if st.lost.get(&key) == Some(&uid) {
                None
            } else {
                st.lost.insert(key, uid.clone());
                Some(st.histories.entry(owner.uid.clone()).or_default().loss(now))
            }
        };
        if let Some(generation) = first {
            peer_lost_event(
                &ctx,
                &owner,
                format!(
                    "pod {pod_name} is being deleted or was disrupted; loss generation {generation}"
                ),
            )
            .await;
        }
    }

    sidecar_loss(&ctx, &pod, &owner, now).await;
    if ctx.features.crash_loop {
        crash_loop(&ctx, &pod, &owner, own_loss, &profile.crash_loop).await?;
    }
    Ok(action)
}

/// The `PeerLost` Event on the workload: every loss the controller counts.
async fn peer_lost_event(ctx: &Context, owner: &Owner, note: String) {
    ctx.event(
        &owner.reference(),
        EventType::Warning,
        "PeerLost",
        "Detect",
        note,
    )
    .await;
}

/// The sidecar's own record of a peer loss it acted on
/// ([`trainwire_contract::peer_loss`]): counted once as a loss of the
/// workload, so the trainer exit its action caused is never a script
/// failure, and told in the workload's Events with the sidecar's generation.
async fn sidecar_loss(ctx: &Context, pod: &Pod, owner: &Owner, now: Timestamp) {
    use trainwire_contract::peer_loss::{ANNOTATION, PeerLossRecord};
    let Some(record) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .and_then(|v| PeerLossRecord::from_annotation(v))
        // A spare's take-over and the sidecar's own trainer restarted are
        // not losses: they say when training runs again.
        .filter(PeerLossRecord::is_loss)
    else {
        return;
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    // The sidecar's clock, but never in the future of ours.
    let at = record
        .at
        .parse::<Timestamp>()
        .ok()
        .filter(|t| *t <= now)
        .unwrap_or(now);
    let generation = {
        let mut st = ctx.state();
        if !st.sidecar_losses.insert((uid, record.generation)) {
            return;
        }
        st.histories.entry(owner.uid.clone()).or_default().loss(at)
    };
    let confirmed_by = if record.confirmed_by.is_empty() {
        "nothing yet"
    } else {
        &record.confirmed_by
    };
    let note = format!(
        "the sidecar of pod {} lost rank {} (its generation {}, confirmed by {confirmed_by}): {} {}; loss generation {generation}",
        pod.name_any(),
        record.lost_rank,
        record.generation,
        record.action,
        record.result,
    );
    peer_lost_event(ctx, owner, note).await;
}

/// The pod condition reason trainwire writes on a pod it reclaims.
pub const DISRUPTION_REASON: &str = "DeletionByTrainwire";

/// What the reclaim writes to a Job pod's status before the force-delete:
/// phase `Failed` and a `DisruptionTarget` condition, as the control plane's
/// pod GC does for a pod on an out-of-service node. A Job with a
/// `podFailurePolicy` (hence `podReplacementPolicy: Failed`) replaces a pod
/// only once it is `Failed`, which a pod on a dead node never becomes by
/// itself; the injected `{action: Ignore, onPodConditions: [{type:
/// DisruptionTarget}]}` rule then keeps the loss off `backoffLimit`.
pub fn disrupted_status(why: &str, now: Timestamp) -> serde_json::Value {
    json!({"status": {
        "phase": "Failed",
        "conditions": [{
            "type": pod::DISRUPTION_TARGET,
            "status": "True",
            "reason": DISRUPTION_REASON,
            "message": format!("trainwire reclaims the pod: {why}"),
            "lastTransitionTime": now.to_string(),
        }],
    }})
}

async fn mark_disrupted(ctx: &Context, namespace: &str, name: &str, why: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client(), namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let patch = disrupted_status(why, ctx.now());
    match api
        .patch_status(name, &params, &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Api {
            action: format!("marking pod {namespace}/{name} Failed (DisruptionTarget)"),
            source,
        }),
    }
}

async fn force_delete(ctx: &Context, namespace: &str, name: &str, uid: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client(), namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or a new pod of that name (the UID precondition).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(source) => Err(Error::Api {
            action: format!("force-deleting pod {namespace}/{name}"),
            source,
        }),
    }
}

async fn taint_node(ctx: &Context, node: &str) -> Result<()> {
    let api: Api<Node> = Api::all(ctx.client());
    let taint =
        serde_json::to_value(nodefailure::out_of_service_taint(ctx.now())).unwrap_or_default();
    let has_taints = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(|t| !t.is_empty())
        })
        .unwrap_or(false);
    let patch = if has_taints {
        json!([{"op": "add", "path": "/spec/taints/-", "value": taint}])
    } else {
        json!([{"op": "add", "path": "/spec/taints", "value": [taint]}])
    };
    let patch: json_patch::Patch = serde_json::from_value(patch).unwrap_or_default();
    api.patch(node, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::Api {
            action: format!("tainting node {node} out-of-service"),
            source,
        })
}

/// The failure controller with `features` only, subscribed to the
/// process's watches: the injected pods (its primary), the Nodes (re-trigger
/// the pods on them) for dead-node reclaim only, the StatefulSets and Jobs
/// for crash-loop stop and resume only. It runs until aborted.
pub fn run(
    shared: Arc<Shared>,
    watches: &Watches,
    features: Features,
) -> impl Future<Output = ()> + use<> {
    use futures::FutureExt as _;
    let mut tasks: Vec<futures::future::BoxFuture<'static, ()>> = Vec::new();
    let ctx = Arc::new(
        Context::new(
            shared,
            watches.nodes.store(),
            watches.statefulsets.store(),
            watches.jobs.store(),
        )
        .with_features(features),
    );
    let pod_controller =
        Controller::for_shared_stream(watches.pods.subscribe(), watches.pods.store());
    let pod_controller = if features.node_failure {
        let pods_by_node = watches.pods.store();
        pod_controller.watches_shared_stream(watches.nodes.subscribe(), move |node: Arc<Node>| {
            let name = node.name_any();
            pods_by_node
                .state()
                .into_iter()
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())
                })
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
    } else {
        pod_controller
    };
    tasks.push(
        pod_controller
            .run(reconcile_pod, error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
            .boxed(),
    );
    if features.crash_loop {
        tasks.push(
            Controller::for_shared_stream(
                watches.statefulsets.subscribe(),
                watches.statefulsets.store(),
            )
            .run(reconcile_statefulset, error_policy, ctx.clone())
            .for_each(|_| futures::future::ready(()))
            .boxed(),
        );
        tasks.push(
            Controller::for_shared_stream(watches.jobs.subscribe(), watches.jobs.store())
                .run(reconcile_job, error_policy, ctx)
                .for_each(|_| futures::future::ready(()))
                .boxed(),
        );
    }
    async move {
        info!(
            node_failure = features.node_failure,
            crash_loop = features.crash_loop,
            "failure controller started: peer-loss Events{}{}",
            if features.node_failure {
                ", dead-node reclaim"
            } else {
                ""
            },
            if features.crash_loop {
                ", crash-loop stop"
            } else {
                ""
            }
        );
        futures::future::join_all(tasks).await;
    }
}
