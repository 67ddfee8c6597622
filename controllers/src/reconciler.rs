//! The one piece of cluster state admission cannot create: the headless
//! Service that gives an injected Job's pods (or a StatefulSet whose
//! `serviceName` Service is missing) their DNS names.
//!
//! Admission answers without side effects (`sideEffects: None`); this
//! reconciler acts afterwards, on the stored objects. It is a kube-rs
//! [`Controller`] over Jobs and over StatefulSets (started by
//! `trainwire-controllers`). For every workload whose pod
//! template carries trainwire's status annotation (so: injected) it makes
//! sure the Service its pods' DNS names hang on exists:
//!
//! - Job: a Service named after the template's `subdomain`, selecting
//!   `batch.kubernetes.io/job-name=<job>`;
//! - StatefulSet: the `spec.serviceName` Service, selecting the StatefulSet's
//!   `matchLabels`, only when it is missing (normally the user ships it).
//!
//! Both get `clusterIP: None`, `publishNotReadyAddresses: true` (pods must
//! resolve each other before they are Ready: the rendezvous comes first),
//! ports for the rendezvous and the sidecar, the label
//! `app.kubernetes.io/managed-by: trainwire`, and a controller owner
//! reference to the workload, so garbage collection deletes the Service with
//! it: there is nothing to do on delete.
//!
//! It never touches an object it did not create. A Service of that name that
//! is not owned by the workload is left as it is, logged, and reported once
//! as an Event on the workload (a Warning when it cannot work: not headless,
//! or not selecting the pods).
//!
//! The decisions are pure functions ([`Workload::from_job`],
//! [`Workload::from_statefulset`], [`plan`]); [`reconcile_job`] and
//! [`reconcile_statefulset`] do the API calls and are tested against a mock
//! API server.
//!
//! Several replicas may run it at once: creation is atomic, and the replica
//! that loses the race gets `AlreadyExists`, looks again and finds the
//! Service its peer made (owned by the same workload: up to date).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Future, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, PodTemplateSpec, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::reconcile::{Reconciler, Shared, error_policy};
use crate::watches::{Watches, new_generations};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "trainwire";

use trainwire_engine::service::{
    Kind, Plan, Workload, describe, identity, injected, job_finished, plan,
};

/// How long to wait before looking again at a name held by someone else.
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);
/// How long to wait for garbage collection of an earlier workload's Service.
const GC_RECHECK: Duration = Duration::from_secs(5);

/// Every Kubernetes API call the reconciler makes, as `(API group, resource,
/// verb)`. The ClusterRole in `manifests/base/rbac.yaml` grants exactly these
/// (plus the scale guard's `get statefulsets`); a test compares the two.
///
/// No `update` of `jobs/finalizers` or `statefulsets/finalizers`: the owner
/// reference is set without `blockOwnerDeletion`, which would need it.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("apps", "statefulsets", "list"),
    ("apps", "statefulsets", "watch"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("", "services", "get"),
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "services", "create"),
    ("", "services", "patch"),
    // The dedicated rendezvous stores (crate::rdzv_store).
    ("apps", "deployments", "get"),
    ("apps", "deployments", "list"),
    ("apps", "deployments", "watch"),
    ("apps", "deployments", "create"),
    ("apps", "deployments", "patch"),
    ("apps", "deployments", "delete"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
];

/// Shared by every reconcile of the reconciler: the process's [`Shared`]
/// part and the reports already made (each foreign Service is reported
/// once per workload).
pub struct Context {
    shared: Arc<Shared>,
    reported: Mutex<HashSet<(String, String)>>,
}

impl Reconciler for Context {
    const CONTROLLER: crate::metrics::Controller = crate::metrics::Controller::services;
    fn shared(&self) -> &Shared {
        &self.shared
    }
}

impl Context {
    pub fn new(shared: Arc<Shared>) -> Self {
        Context {
            shared,
            reported: Mutex::new(HashSet::new()),
        }
    }

    /// Publish an Event on the workload. A failure to publish is logged,
    /// never fails the reconcile.
    async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "EnsureHeadlessService".to_string(),
            secondary: None,
        };
        self.shared.publish(event, regarding).await;
    }

    /// True the first time for this (workload UID, message).
    fn first_report(&self, uid: &str, message: &str) -> bool {
        match self.reported.lock() {
            Ok(mut set) => set.insert((uid.to_string(), message.to_string())),
            Err(_) => true,
        }
    }
}

/// Reconcile one Job: its headless Service, and its dedicated store while
/// it runs (deleted once the Job has finished: nothing rendezvouses then).
pub async fn reconcile_job(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    let workload = Workload::from_job(&job)?;
    let spec = job.spec.as_ref().map(|s| &s.template);
    let store = if job_finished(&job) {
        StoreWanted::Removed
    } else {
        StoreWanted::Present
    };
    reconcile(
        &ctx,
        Kind::Job,
        &job.metadata,
        job.object_ref(&()),
        workload,
        spec,
        store,
    )
    .await
}

/// Reconcile one StatefulSet: its headless Service (when missing) and its
/// dedicated store.
pub async fn reconcile_statefulset(sts: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    let workload = Workload::from_statefulset(&sts)?;
    let spec = sts.spec.as_ref().map(|s| &s.template);
    let regarding = sts.object_ref(&());
    reconcile(
        &ctx,
        Kind::StatefulSet,
        &sts.metadata,
        regarding,
        workload,
        spec,
        StoreWanted::Present,
    )
    .await
}

/// Whether a workload's dedicated store should run.
enum StoreWanted {
    Present,
    /// The Job finished: nothing rendezvouses any more.
    Removed,
}

/// The Service and the store of one workload, as the kinds share them.
async fn reconcile(
    ctx: &Context,
    kind: Kind,
    meta: &ObjectMeta,
    regarding: ObjectReference,
    workload: Option<Workload>,
    template: Option<&PodTemplateSpec>,
    store: StoreWanted,
) -> Result<Action> {
    let service = match workload {
        Some(workload) => ensure_service(ctx, &workload, &regarding).await?,
        None => Action::await_change(),
    };
    let Some(template) = template else {
        return Ok(service);
    };
    if meta.deletion_timestamp.is_some() {
        return Ok(service);
    }
    let store = match store {
        StoreWanted::Removed => remove_store(ctx, kind, meta, template).await?,
        StoreWanted::Present => ensure_store(ctx, kind, meta, template, &regarding).await?,
    };
    Ok(sooner(service, store))
}

/// The action that looks again sooner (an `await_change` is never sooner).
fn sooner(a: Action, b: Action) -> Action {
    if a == Action::await_change() { b } else { a }
}

/// Whether `object` is controlled by the workload with this UID.
fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The dedicated store objects the workload needs, if any.
fn store_objects(
    ctx: &Context,
    kind: Kind,
    meta: &ObjectMeta,
    template: &PodTemplateSpec,
) -> Result<Option<trainwire_engine::store::Objects>> {
    if !injected(template) {
        return Ok(None);
    }
    let Some(status) = trainwire_engine::mutation::status::read(template) else {
        return Ok(None);
    };
    if status.rdzv_store.is_empty() {
        return Ok(None);
    }
    let (namespace, name, uid) = identity(kind, meta)?;
    let policy = ctx.shared.policy.current();
    let profile = policy.profile_for(&namespace);
    let owner = trainwire_engine::store::Owner {
        api_version: kind.api_version(),
        kind: kind.as_str(),
        name: &name,
        namespace: Some(&namespace),
        uid: Some(&uid),
    };
    Ok(trainwire_engine::store::desired(
        &owner, template, &status, &profile,
    ))
}

/// Make the workload's dedicated store (Deployment and Service) exist as it
/// should: created when missing, applied when ours (a server-side apply of
/// an unchanged object writes nothing), left alone and reported once when
/// an object of that name is not ours.
pub async fn ensure_store(
    ctx: &Context,
    kind: Kind,
    meta: &ObjectMeta,
    template: &PodTemplateSpec,
    regarding: &ObjectReference,
) -> Result<Action> {
    let Some(objects) = store_objects(ctx, kind, meta, template)? else {
        return Ok(Action::await_change());
    };
    let (namespace, _, uid) = identity(kind, meta)?;
    let workload = describe(kind, meta);
    let deployments: Api<Deployment> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let mut action = Action::await_change();
    let name = objects.deployment.metadata.name.clone().unwrap_or_default();
    let deployment = apply_owned(
        ctx,
        &deployments,
        &objects.deployment,
        &uid,
        &workload,
        regarding,
    )
    .await?;
    let service = apply_owned(ctx, &services, &objects.service, &uid, &workload, regarding).await?;
    if deployment == Applied::Foreign || service == Applied::Foreign {
        action = Action::requeue(FOREIGN_RECHECK);
    }
    if deployment == Applied::Created {
        info!(%workload, store = %name, "created the dedicated rendezvous store");
        ctx.event(
            regarding,
            EventType::Normal,
            "StoreCreated",
            format!(
                "created the dedicated rendezvous store {namespace}/{name} (Deployment and Service)"
            ),
        )
        .await;
    }
    Ok(action)
}

/// What [`apply_owned`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Applied {
    Created,
    Updated,
    Foreign,
}

async fn apply_owned<K>(
    ctx: &Context,
    api: &Api<K>,
    desired: &K,
    uid: &str,
    workload: &str,
    regarding: &ObjectReference,
) -> Result<Applied>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let what = format!(
        "{} {}/{}",
        K::kind(&()),
        desired.meta().namespace.as_deref().unwrap_or_default(),
        name
    );
    let existing = api
        .get_opt(&name)
        .await
        .map_err(Error::api(format!("reading {what} for {workload}")))?;
    match existing {
        None => {
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PostParams::default()
            };
            match api.create(&params, desired).await {
                Ok(_) => Ok(Applied::Created),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Applied::Updated),
                Err(source) => Err(Error::api(format!("creating {what} for {workload}"))(
                    source,
                )),
            }
        }
        Some(existing) if owned_by(existing.meta(), uid) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&name, &params, &Patch::Apply(desired))
                .await
                .map_err(Error::api(format!("updating {what} for {workload}")))?;
            Ok(Applied::Updated)
        }
        Some(_) => {
            let note = format!(
                "{what} exists and was not created by trainwire for this workload, so the dedicated rendezvous store cannot run under that name and the world does not form; delete it or rename the workload"
            );
            if ctx.first_report(uid, &note) {
                warn!(%workload, object = %what, "a foreign object holds the dedicated store's name; left alone");
                ctx.event(regarding, EventType::Warning, "StoreConflict", note)
                    .await;
            }
            Ok(Applied::Foreign)
        }
    }
}

/// Delete the store Deployment of a finished Job (its pod would run for
/// nothing); the Service stays with the Job.
async fn remove_store(
    ctx: &Context,
    kind: Kind,
    meta: &ObjectMeta,
    template: &PodTemplateSpec,
) -> Result<Action> {
    let Some(objects) = store_objects(ctx, kind, meta, template)? else {
        return Ok(Action::await_change());
    };
    let (namespace, _, uid) = identity(kind, meta)?;
    let name = objects.deployment.metadata.name.clone().unwrap_or_default();
    let api: Api<Deployment> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let existing = api
        .get_opt(&name)
        .await
        .map_err(Error::api(format!("reading Deployment {namespace}/{name}")))?;
    if let Some(existing) = existing
        && owned_by(&existing.metadata, &uid)
    {
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {
                info!(workload = %describe(kind, meta), store = %name, "the Job finished: deleted its rendezvous store");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::api(format!(
                    "deleting Deployment {namespace}/{name} of a finished Job"
                ))(source));
            }
        }
    }
    Ok(Action::await_change())
}

/// Make the workload's Service exist, as [`plan`] says.
pub async fn ensure_service(
    ctx: &Context,
    workload: &Workload,
    regarding: &ObjectReference,
) -> Result<Action> {
    let api: Api<Service> = Api::namespaced(ctx.shared.client.clone(), &workload.namespace);
    let service_ref = format!("Service {}/{}", workload.namespace, workload.service);
    let existing = api
        .get_opt(&workload.service)
        .await
        .map_err(Error::api(format!("reading {service_ref} for {workload}")))?;
    match plan(workload, existing.as_ref()) {
        Plan::UpToDate => {
            debug!(%workload, service = %workload.service, "headless Service up to date");
            Ok(Action::await_change())
        }
        Plan::Create(service) => {
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PostParams::default()
            };
            match api.create(&params, &service).await {
                Ok(_) => {
                    info!(%workload, service = %workload.service, "created headless Service");
                    ctx.event(
                        regarding,
                        EventType::Normal,
                        "ServiceCreated",
                        format!("created headless {service_ref} for the pods' DNS names"),
                    )
                    .await;
                    Ok(Action::await_change())
                }
                // Another replica created it first: look at it again.
                Err(kube::Error::Api(s)) if s.is_already_exists() => {
                    Ok(Action::requeue(Duration::from_secs(1)))
                }
                Err(source) => {
                    Err(Error::api(format!("creating {service_ref} for {workload}"))(source))
                }
            }
        }
        Plan::Update(service) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&workload.service, &params, &Patch::Apply(&service))
                .await
                .map_err(Error::api(format!("updating {service_ref} for {workload}")))?;
            info!(%workload, service = %workload.service, "brought headless Service back in line");
            ctx.event(
                regarding,
                EventType::Normal,
                "ServiceUpdated",
                format!("set headless {service_ref} back to what the pods need"),
            )
            .await;
            Ok(Action::await_change())
        }
        Plan::WaitForGarbageCollection => {
            info!(%workload, service = %workload.service, "Service of an earlier workload of the same name is still there; waiting for garbage collection");
            Ok(Action::requeue(GC_RECHECK))
        }
        Plan::Foreign { problems } if problems.is_empty() => {
            // A user's own Service is the normal case for a StatefulSet.
            if workload.kind == Kind::Job {
                let note = format!(
                    "{service_ref} exists and was not created by trainwire; leaving it as it is (it is headless and selects this Job's pods)"
                );
                if ctx.first_report(&workload.uid, &note) {
                    info!(%workload, service = %workload.service, "Service not created by trainwire; left alone");
                    ctx.event(regarding, EventType::Normal, "ServiceNotManaged", note)
                        .await;
                }
            }
            Ok(Action::await_change())
        }
        Plan::Foreign { problems } => {
            let note = format!(
                "{service_ref} exists and was not created by trainwire, so it is left alone, but the pods cannot use it: {}. Delete it (trainwire then creates a headless one) or fix it",
                problems.join("; ")
            );
            if ctx.first_report(&workload.uid, &note) {
                warn!(%workload, service = %workload.service, problems = ?problems, "Service not created by trainwire is in the way; left alone");
                ctx.event(regarding, EventType::Warning, "ServiceConflict", note)
                    .await;
            }
            Ok(Action::requeue(FOREIGN_RECHECK))
        }
    }
}

fn log_result<K, E1: std::fmt::Display, E2: std::fmt::Display>(
    result: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E1, E2>>,
) -> futures::future::Ready<()>
where
    K: Resource,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match result {
        Ok((object, _)) => debug!(object = %object, "reconciled"),
        Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
        Err(e) => warn!(error = %e, "reconciler"),
    }
    futures::future::ready(())
}

/// The reconciler, subscribed to the process's watches: the injected
/// StatefulSets and Jobs (their new generations only) and trainwire's own
/// Services and Deployments (which re-trigger their owner). It runs until
/// aborted.
pub fn run(shared: Arc<Shared>, watches: &Watches) -> impl Future<Output = ()> + use<> {
    let ctx = Arc::new(Context::new(shared));
    let jobs = Controller::for_shared_stream(
        new_generations(watches.jobs.subscribe()),
        watches.jobs.store(),
    )
    .owns_shared_stream(watches.services.subscribe())
    .owns_shared_stream(watches.deployments.subscribe())
    .run(reconcile_job, error_policy, ctx.clone())
    .for_each(log_result);
    let statefulsets = Controller::for_shared_stream(
        new_generations(watches.statefulsets.subscribe()),
        watches.statefulsets.store(),
    )
    .owns_shared_stream(watches.services.subscribe())
    .owns_shared_stream(watches.deployments.subscribe())
    .run(reconcile_statefulset, error_policy, ctx)
    .for_each(log_result);
    async move {
        info!(
            "reconciler started: headless Services and dedicated rendezvous stores for injected Jobs and StatefulSets"
        );
        futures::join!(jobs, statefulsets);
    }
}
