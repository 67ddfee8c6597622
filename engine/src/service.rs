//! The headless Service an injected workload's pods hang their DNS names
//! on, as pure functions of the stored workload: what it should be
//! ([`Workload::from_job`], [`Workload::from_statefulset`],
//! [`Workload::desired_service`]), what to do about the Service of that name
//! that exists ([`plan`]), and the Service offline `inject` emits beside a
//! Job ([`offline_job_service`]). The controllers' reconciler
//! (`trainwire-controllers`) applies them; `inject` renders them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PodTemplateSpec, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use thiserror::Error;
use trainwire_contract::annotations::SERVICE_FOR as SERVICE_FOR_ANNOTATION;
use trainwire_contract::labels::{MANAGED_BY, MANAGED_BY_LABEL};

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

/// A stored workload without a field every stored object has.
#[derive(Debug, Error)]
#[error("{workload} has no {field}")]
pub struct MissingField {
    pub workload: String,
    pub field: &'static str,
}

pub type Result<T, E = MissingField> = std::result::Result<T, E>;

/// The workload kinds that get a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Job,
    StatefulSet,
}

impl Kind {
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Job => "batch/v1",
            Kind::StatefulSet => "apps/v1",
        }
    }
    pub fn as_str(self) -> &'static str {
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

pub fn describe(kind: Kind, meta: &ObjectMeta) -> String {
    format!(
        "{} {}/{}",
        kind.as_str(),
        meta.namespace.as_deref().unwrap_or("?"),
        meta.name.as_deref().unwrap_or("?")
    )
}

pub fn injected(template: &PodTemplateSpec) -> bool {
    template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key(STATUS_ANNOTATION))
}

/// Identity fields every stored object has.
pub fn identity(kind: Kind, meta: &ObjectMeta) -> Result<(String, String, String)> {
    let missing = |field| MissingField {
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

pub fn job_finished(job: &Job) -> bool {
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
