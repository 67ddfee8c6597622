//! The one piece of cluster state admission cannot create: the headless
//! Service that gives an injected Job's pods (or a StatefulSet whose
//! `serviceName` Service is missing) their DNS names.
//!
//! Admission answers without side effects (`sideEffects: None`); this
//! reconciler acts afterwards, on the stored objects. It is a kube-rs
//! [`Controller`] over Jobs and over StatefulSets (started by
//! `trainwire-webhook controllers`). For every workload whose pod
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

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ObjectReference, PodTemplateSpec, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Client, Resource};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::scale::slim;

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "trainwire";
/// Label on every Service the reconciler creates (and the watch's selector).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "trainwire";
/// Annotation on a created Service naming the workload it is for
/// (`Job/<name>` or `StatefulSet/<name>`), for people reading it.
pub const SERVICE_FOR_ANNOTATION: &str = "trainwire.dev/service-for";
/// The label the Job controller puts on every pod of a Job.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Name of the rendezvous port on a created Service.
pub const RDZV_PORT_NAME: &str = "rdzv";
/// Name of the sidecar's port on a created Service.
pub const SIDECAR_PORT_NAME: &str = "trainwire";

use crate::mutation::annotations::{
    DEFAULT_RDZV_PORT, RDZV_PORT as RDZV_PORT_ANNOTATION, STATUS as STATUS_ANNOTATION,
};
use crate::mutation::sidecar_container::NAME as SIDECAR_CONTAINER;

/// How long to wait before looking again at a name held by someone else.
const FOREIGN_RECHECK: Duration = Duration::from_secs(60);
/// How long to wait for garbage collection of an earlier workload's Service.
const GC_RECHECK: Duration = Duration::from_secs(5);
/// Back-off after a failed reconcile.
const ERROR_RECHECK: Duration = Duration::from_secs(15);

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

/// Errors of one reconcile. Each is logged and retried after a back-off.
#[derive(Debug, Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action}: {source}{hint}", hint = forbidden_hint(source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The workload lacks a field every stored object has.
    #[error("{workload} has no {field}")]
    MissingField {
        workload: String,
        field: &'static str,
    },
}

fn forbidden_hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.is_forbidden() => {
            " (the ClusterRole trainwire-controllers in manifests/base/rbac.yaml grants what the reconciler needs; is it applied and bound to the ServiceAccount trainwire-controllers?)"
        }
        _ => "",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The workload kinds that get a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Job,
    StatefulSet,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Job => "batch/v1",
            Kind::StatefulSet => "apps/v1",
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::StatefulSet => "StatefulSet",
        }
    }
}

/// What the reconciler needs to know about one injected workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Name of the headless Service the pods' DNS names hang on.
    pub service: String,
    /// The selector a created Service gets.
    pub selector: BTreeMap<String, String>,
    /// Labels every pod of the workload carries (template labels, plus for a
    /// Job the ones the Job controller adds), to judge a foreign Service.
    pub pod_labels: BTreeMap<String, String>,
    pub ports: Vec<ServicePort>,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

fn describe(kind: Kind, meta: &ObjectMeta) -> String {
    format!(
        "{} {}/{}",
        kind.as_str(),
        meta.namespace.as_deref().unwrap_or("?"),
        meta.name.as_deref().unwrap_or("?")
    )
}

fn injected(template: &PodTemplateSpec) -> bool {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key(STATUS_ANNOTATION))
}

/// Identity fields every stored object has.
fn identity(kind: Kind, meta: &ObjectMeta) -> Result<(String, String, String)> {
    let missing = |field| Error::MissingField {
        workload: describe(kind, meta),
        field,
    };
    let namespace = meta
        .namespace
        .clone()
        .ok_or_else(|| missing("metadata.namespace"))?;
    let name = meta.name.clone().ok_or_else(|| missing("metadata.name"))?;
    let uid = meta.uid.clone().ok_or_else(|| missing("metadata.uid"))?;
    Ok((namespace, name, uid))
}

/// The ports a created Service exposes, from the typed status the engine
/// recorded: the rendezvous (where pod 0 serves the c10d store; none with an
/// external etcd) and the sidecar's. A status written by trainwire 0.1.0 has
/// neither: the defaults then (the annotation's port, the sidecar's default).
fn ports(meta: &ObjectMeta, template: &PodTemplateSpec) -> Vec<ServicePort> {
    let status = crate::mutation::status::read(template).unwrap_or_default();
    let legacy = status.service.is_empty();
    let mut out = Vec::new();
    let rdzv = if legacy {
        Some(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(RDZV_PORT_ANNOTATION))
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p > 0)
                .unwrap_or(DEFAULT_RDZV_PORT),
        )
    } else {
        status.rdzv_port
    };
    if let Some(port) = rdzv {
        out.push(service_port(RDZV_PORT_NAME, port));
    }
    let sidecar = if legacy {
        has_sidecar(template).then_some(trainwire_contract::env::DEFAULT_HEALTH_PORT)
    } else {
        status.sidecar_port
    };
    if let Some(port) = sidecar {
        out.push(service_port(SIDECAR_PORT_NAME, port));
    }
    // Two names for one port would be refused by the apiserver.
    out.dedup_by_key(|p| p.port);
    out
}

/// Whether the template has the injected sidecar.
fn has_sidecar(template: &PodTemplateSpec) -> bool {
    template
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == SIDECAR_CONTAINER))
}

fn service_port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port: i32::from(port),
        target_port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }
}

fn template_labels(template: &PodTemplateSpec) -> BTreeMap<String, String> {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

impl Workload {
    /// The Service an injected Job needs, or `None` when the Job is not
    /// injected, is being deleted, has finished, or has no `subdomain`.
    pub fn from_job(job: &Job) -> Result<Option<Workload>> {
        let meta = &job.metadata;
        let Some(spec) = job.spec.as_ref() else {
            return Ok(None);
        };
        if meta.deletion_timestamp.is_some() || !injected(&spec.template) || job_finished(job) {
            return Ok(None);
        }
        let Some(service) = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.subdomain.clone())
            .filter(|s| !s.is_empty())
        else {
            return Ok(None);
        };
        let (namespace, name, uid) = identity(Kind::Job, meta)?;
        let selector = BTreeMap::from([(JOB_NAME_LABEL.to_string(), name.clone())]);
        let mut pod_labels = template_labels(&spec.template);
        pod_labels.insert(JOB_NAME_LABEL.to_string(), name.clone());
        pod_labels.insert("job-name".to_string(), name.clone());
        Ok(Some(Workload {
            kind: Kind::Job,
            ports: ports(meta, &spec.template),
            namespace,
            name,
            uid,
            service,
            selector,
            pod_labels,
        }))
    }

    /// The Service an injected StatefulSet names in `serviceName`, or `None`
    /// when it is not injected, is being deleted, or its selector cannot be
    /// written as a Service selector (only `matchExpressions`).
    pub fn from_statefulset(sts: &StatefulSet) -> Result<Option<Workload>> {
        let meta = &sts.metadata;
        let Some(spec) = sts.spec.as_ref() else {
            return Ok(None);
        };
        if meta.deletion_timestamp.is_some() || !injected(&spec.template) {
            return Ok(None);
        }
        let Some(service) = spec.service_name.clone().filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let selector = spec.selector.match_labels.clone().unwrap_or_default();
        if selector.is_empty() {
            return Ok(None);
        }
        let (namespace, name, uid) = identity(Kind::StatefulSet, meta)?;
        Ok(Some(Workload {
            kind: Kind::StatefulSet,
            ports: ports(meta, &spec.template),
            namespace,
            name,
            uid,
            service,
            selector,
            pod_labels: template_labels(&spec.template),
        }))
    }

    /// The controller owner reference a created Service carries. No
    /// `blockOwnerDeletion`: setting it needs `update` on the owner's
    /// finalizers, and nothing waits on the Service's deletion.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.kind.api_version().to_string(),
            kind: self.kind.as_str().to_string(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }
    }

    /// The Service this workload needs.
    pub fn desired_service(&self) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(self.service.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGED_BY.to_string(),
                )])),
                annotations: Some(BTreeMap::from([(
                    SERVICE_FOR_ANNOTATION.to_string(),
                    format!("{}/{}", self.kind.as_str(), self.name),
                )])),
                owner_references: Some(vec![self.owner_reference()]),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".to_string()),
                selector: Some(self.selector.clone()),
                publish_not_ready_addresses: Some(true),
                ports: (!self.ports.is_empty()).then(|| self.ports.clone()),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }
}

/// The headless Service an injected Job needs, as offline `inject` emits it
/// for a manifest that does not have it: the same Service the reconciler
/// creates (name, selector, ports, `publishNotReadyAddresses`, labels), but
/// with no owner reference, since a manifest has no UID yet. `None` when the
/// Job is not injected.
pub fn offline_job_service(job: &Job) -> Result<Option<Service>> {
    let mut job = job.clone();
    // Identity fields a stored Job always has; the UID only feeds the owner
    // reference, which is dropped below.
    job.metadata.uid.get_or_insert_with(String::new);
    let namespace = job.metadata.namespace.clone();
    job.metadata.namespace.get_or_insert_with(String::new);
    let Some(workload) = Workload::from_job(&job)? else {
        return Ok(None);
    };
    let mut service = workload.desired_service();
    service.metadata.owner_references = None;
    service.metadata.namespace = namespace.filter(|n| !n.is_empty());
    Ok(Some(service))
}

fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// What to do about a workload's Service.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Missing: create it.
    Create(Service),
    /// Ours and as it should be: no write.
    UpToDate,
    /// Ours but changed (by hand, or the workload's ports changed): apply.
    Update(Service),
    /// A Service trainwire made for an earlier workload of the same name,
    /// about to be garbage collected: look again shortly.
    WaitForGarbageCollection,
    /// Not ours: left alone. `problems` says why it cannot serve the pods'
    /// DNS (empty when it can).
    Foreign { problems: Vec<String> },
}

fn normalised_ports(
    ports: Option<&Vec<ServicePort>>,
) -> BTreeSet<(Option<String>, i32, String, i32)> {
    ports
        .into_iter()
        .flatten()
        .map(|p| {
            let target = match &p.target_port {
                Some(IntOrString::Int(t)) => *t,
                _ => p.port,
            };
            (
                p.name.clone(),
                p.port,
                p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                target,
            )
        })
        .collect()
}

/// Decide, from the workload and what the API server holds under the
/// Service's name.
pub fn plan(workload: &Workload, existing: Option<&Service>) -> Plan {
    let desired = workload.desired_service();
    let Some(existing) = existing else {
        return Plan::Create(desired);
    };
    let controller = existing
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let labelled = existing
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY);
    match controller {
        Some(o) if o.uid == workload.uid => {
            let spec = existing.spec.clone().unwrap_or_default();
            let want = desired.spec.clone().unwrap_or_default();
            let same = labelled
                && spec.cluster_ip.as_deref() == Some("None")
                && spec.selector == want.selector
                && spec.publish_not_ready_addresses == Some(true)
                && normalised_ports(spec.ports.as_ref()) == normalised_ports(want.ports.as_ref());
            if same {
                Plan::UpToDate
            } else {
                Plan::Update(desired)
            }
        }
        Some(o) if labelled && o.kind == workload.kind.as_str() && o.name == workload.name => {
            Plan::WaitForGarbageCollection
        }
        _ => Plan::Foreign {
            problems: foreign_problems(workload, existing),
        },
    }
}

/// Why a Service trainwire did not create cannot give the pods DNS names.
fn foreign_problems(workload: &Workload, existing: &Service) -> Vec<String> {
    let mut problems = Vec::new();
    let spec = existing.spec.clone().unwrap_or_default();
    if spec.cluster_ip.as_deref() != Some("None") {
        problems.push(format!(
            "it is not headless (spec.clusterIP is {:?}, needs \"None\"), so the pods get no DNS names",
            spec.cluster_ip.unwrap_or_default()
        ));
    }
    let selector = spec.selector.unwrap_or_default();
    let selects = !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| workload.pod_labels.get(k) == Some(v));
    if !selects {
        problems.push(format!(
            "its selector {selector:?} does not select the {} pods (they carry {:?})",
            workload.kind.as_str(),
            workload.pod_labels
        ));
    }
    problems
}

/// Shared by every reconcile: the client, the event recorder, and the
/// reports already made (each foreign Service is reported once per workload).
pub struct Context {
    pub client: Client,
    recorder: Recorder,
    reported: Mutex<HashSet<(String, String)>>,
    /// The policy (the dedicated store's placement, per namespace).
    policy: crate::policy::SharedPolicy,
}

/// The Event recorder of the webhook's controllers: reported as
/// `trainwire-webhook`, the instance being the pod's name.
pub fn recorder(client: Client) -> Recorder {
    let reporter = Reporter {
        controller: "trainwire-webhook".to_string(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    Recorder::new(client, reporter)
}

impl Context {
    pub fn new(client: Client, policy: crate::policy::SharedPolicy) -> Self {
        Context {
            recorder: recorder(client.clone()),
            client,
            reported: Mutex::new(HashSet::new()),
            policy,
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
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            warn!(error = %e, reason, "could not publish an Event");
        }
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
    let regarding = job.object_ref(&());
    let service = match Workload::from_job(&job)? {
        Some(workload) => ensure_service(&ctx, &workload, &regarding).await?,
        None => Action::await_change(),
    };
    let Some(spec) = job.spec.as_ref() else {
        return Ok(service);
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Ok(service);
    }
    let store = if job_finished(&job) {
        remove_store(&ctx, Kind::Job, &job.metadata, &spec.template).await?
    } else {
        ensure_store(&ctx, Kind::Job, &job.metadata, &spec.template, &regarding).await?
    };
    Ok(sooner(service, store))
}

/// Reconcile one StatefulSet: its headless Service (when missing) and its
/// dedicated store.
pub async fn reconcile_statefulset(sts: Arc<StatefulSet>, ctx: Arc<Context>) -> Result<Action> {
    let regarding = sts.object_ref(&());
    let service = match Workload::from_statefulset(&sts)? {
        Some(workload) => ensure_service(&ctx, &workload, &regarding).await?,
        None => Action::await_change(),
    };
    let Some(spec) = sts.spec.as_ref() else {
        return Ok(service);
    };
    if sts.metadata.deletion_timestamp.is_some() {
        return Ok(service);
    }
    let store = ensure_store(
        &ctx,
        Kind::StatefulSet,
        &sts.metadata,
        &spec.template,
        &regarding,
    )
    .await?;
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
) -> Result<Option<crate::rdzv_store::Objects>> {
    if !injected(template) {
        return Ok(None);
    }
    let Some(status) = crate::mutation::status::read(template) else {
        return Ok(None);
    };
    if status.rdzv_store.is_empty() {
        return Ok(None);
    }
    let (namespace, name, uid) = identity(kind, meta)?;
    let policy = ctx.policy.current();
    let profile = policy.profile_for(&namespace);
    let owner = crate::rdzv_store::Owner {
        api_version: kind.api_version(),
        kind: kind.as_str(),
        name: &name,
        namespace: Some(&namespace),
        uid: Some(&uid),
    };
    Ok(crate::rdzv_store::desired(
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
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
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
    let existing = api.get_opt(&name).await.map_err(|source| Error::Api {
        action: format!("reading {what} for {workload}"),
        source,
    })?;
    match existing {
        None => {
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PostParams::default()
            };
            match api.create(&params, desired).await {
                Ok(_) => Ok(Applied::Created),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Applied::Updated),
                Err(source) => Err(Error::Api {
                    action: format!("creating {what} for {workload}"),
                    source,
                }),
            }
        }
        Some(existing) if owned_by(existing.meta(), uid) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&name, &params, &Patch::Apply(desired))
                .await
                .map_err(|source| Error::Api {
                    action: format!("updating {what} for {workload}"),
                    source,
                })?;
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
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = api.get_opt(&name).await.map_err(|source| Error::Api {
        action: format!("reading Deployment {namespace}/{name}"),
        source,
    })?;
    if let Some(existing) = existing
        && owned_by(&existing.metadata, &uid)
    {
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {
                info!(workload = %describe(kind, meta), store = %name, "the Job finished: deleted its rendezvous store");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(Error::Api {
                    action: format!("deleting Deployment {namespace}/{name} of a finished Job"),
                    source,
                });
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
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &workload.namespace);
    let service_ref = format!("Service {}/{}", workload.namespace, workload.service);
    let existing = api
        .get_opt(&workload.service)
        .await
        .map_err(|source| Error::Api {
            action: format!("reading {service_ref} for {workload}"),
            source,
        })?;
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
                Err(source) => Err(Error::Api {
                    action: format!("creating {service_ref} for {workload}"),
                    source,
                }),
            }
        }
        Plan::Update(service) => {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            api.patch(&workload.service, &params, &Patch::Apply(&service))
                .await
                .map_err(|source| Error::Api {
                    action: format!("updating {service_ref} for {workload}"),
                    source,
                })?;
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

fn error_policy<K>(object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action
where
    K: Resource,
{
    warn!(
        namespace = object.meta().namespace.as_deref().unwrap_or_default(),
        name = object.meta().name.as_deref().unwrap_or_default(),
        error = %error,
        "reconcile failed; retrying"
    );
    Action::requeue(ERROR_RECHECK)
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

/// Run the reconciler until the process shuts down. Its StatefulSet and Job
/// watches select the injected workloads (label
/// [`trainwire_contract::labels::INJECTED`], which the engine puts on every
/// workload it injects).
pub async fn run(client: kube::Client, policy: crate::policy::SharedPolicy) -> anyhow::Result<()> {
    let ctx = Arc::new(Context::new(client.clone(), policy));
    let owned = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let injected =
        watcher::Config::default().labels(&trainwire_contract::labels::injected_selector());

    let (job_store, job_writer) = reflector::store::<Job>();
    let job_stream = watcher(Api::<Job>::all(client.clone()), injected.clone())
        .default_backoff()
        .modify(slim)
        .reflect(job_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let jobs = Controller::for_stream(job_stream, job_store)
        .owns(Api::<Service>::all(client.clone()), owned.clone())
        .owns(Api::<Deployment>::all(client.clone()), owned.clone())
        .run(reconcile_job, error_policy, ctx.clone())
        .for_each(log_result);

    let (sts_store, sts_writer) = reflector::store::<StatefulSet>();
    let sts_stream = watcher(Api::<StatefulSet>::all(client.clone()), injected)
        .default_backoff()
        .modify(slim)
        .reflect(sts_writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    let statefulsets = Controller::for_stream(sts_stream, sts_store)
        .owns(Api::<Service>::all(client.clone()), owned.clone())
        .owns(Api::<Deployment>::all(client), owned)
        .run(reconcile_statefulset, error_policy, ctx)
        .for_each(log_result);

    info!(
        "reconciler started: headless Services and dedicated rendezvous stores for injected Jobs and StatefulSets"
    );
    futures::join!(jobs, statefulsets);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: serde_json::Value, sidecar: bool) -> Job {
        let init = if sidecar {
            json!([{"name": SIDECAR_CONTAINER, "image": "s"}])
        } else {
            json!([])
        };
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "spec": {"template": {
                "metadata": {"annotations": {STATUS_ANNOTATION: status.to_string()}, "labels": {"team": "a"}},
                "spec": {"subdomain": "j", "restartPolicy": "Never",
                         "containers": [{"name": "trainer"}],
                         "initContainers": init}}}
        }))
        .unwrap_or_default()
    }

    fn ports_of(j: &Job) -> Option<Vec<(Option<String>, i32)>> {
        Workload::from_job(j)
            .ok()
            .flatten()
            .map(|w| w.ports.into_iter().map(|p| (p.name, p.port)).collect())
    }

    #[test]
    fn the_ports_come_from_the_typed_status() {
        let sidecar = (
            Some(SIDECAR_PORT_NAME.to_string()),
            i32::from(trainwire_contract::env::DEFAULT_HEALTH_PORT),
        );
        // An external etcd store: no rendezvous port.
        let j = job(json!({"service": "j", "sidecarPort": 29600}), true);
        assert_eq!(ports_of(&j), Some(vec![sidecar.clone()]));
        // The store's port as recorded (the manifest's endpoint, say).
        let j = job(
            json!({"service": "j", "rdzvPort": 29400, "sidecarPort": 29600}),
            true,
        );
        assert_eq!(
            ports_of(&j),
            Some(vec![
                (Some(RDZV_PORT_NAME.to_string()), 29400),
                sidecar.clone()
            ])
        );
        // The same port twice is listed once; no sidecar, no sidecar port.
        let j = job(
            json!({"service": "j", "rdzvPort": 29600, "sidecarPort": 29600}),
            true,
        );
        assert_eq!(ports_of(&j).map(|p| p.len()), Some(1));
        let j = job(json!({"service": "j", "rdzvPort": 29500}), false);
        assert_eq!(
            ports_of(&j),
            Some(vec![(Some(RDZV_PORT_NAME.to_string()), 29500)])
        );
        // A status from trainwire 0.1.0 (no service recorded): the defaults.
        let j = job(json!({"version": "0.1.0"}), true);
        assert_eq!(
            ports_of(&j),
            Some(vec![
                (
                    Some(RDZV_PORT_NAME.to_string()),
                    i32::from(DEFAULT_RDZV_PORT)
                ),
                sidecar
            ])
        );
    }

    #[test]
    fn a_foreign_service_is_judged_on_headlessness_and_selection() {
        let Some(w) = Workload::from_job(&job(json!({"service": "j"}), false))
            .ok()
            .flatten()
        else {
            panic!("injected job")
        };
        let svc =
            |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap_or_default() };
        let fine = svc(
            json!({"metadata": {"name": "j"}, "spec": {"clusterIP": "None", "selector": {"job-name": "j"}}}),
        );
        assert_eq!(plan(&w, Some(&fine)), Plan::Foreign { problems: vec![] });
        let by_team = svc(
            json!({"metadata": {"name": "j"}, "spec": {"clusterIP": "None", "selector": {"team": "a"}}}),
        );
        assert_eq!(plan(&w, Some(&by_team)), Plan::Foreign { problems: vec![] });
        let no_selector = svc(json!({"metadata": {"name": "j"}, "spec": {"clusterIP": "None"}}));
        assert!(
            matches!(plan(&w, Some(&no_selector)), Plan::Foreign { problems } if problems.len() == 1)
        );
        // Labelled as ours but owned by nothing: not ours, never touched.
        let unowned = svc(
            json!({"metadata": {"name": "j", "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                                 "spec": {"clusterIP": "10.0.0.1", "selector": {"job-name": "j"}}}),
        );
        assert!(
            matches!(plan(&w, Some(&unowned)), Plan::Foreign { problems } if problems.len() == 1)
        );
    }
}
