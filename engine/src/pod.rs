//! What trainwire reads of a pod, in one place for every crate: whether it
//! was made from an injected template, which of its containers is the
//! trainer, whether it runs trainwire's sidecar, and whether the control
//! plane marked it lost (`DisruptionTarget`). The controllers, the world
//! status and the kubectl plugin all ask these questions; they get one
//! answer.
//!
//! The trainer is the container the injection's status record names
//! (`trainwire.dev/status`, which the pod carries from its template); a
//! pod whose record names none (or that has no readable record) falls back
//! to the container the engine gave the rendezvous env (torchrun's
//! `PET_RDZV_BACKEND`, TensorFlow's `TF_CONFIG`), then to `trainer`.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use trainwire_contract::annotations::STATUS;

use crate::mutation::status::{MAX_STATUS_BYTES, MAX_STATUS_ENTRIES, Status};

/// The pod condition the control plane (and trainwire's reclaim) sets on a
/// pod it is about to delete or has disrupted; a Job's injected
/// `podFailurePolicy` ignores failures that carry it.
pub use crate::mutation::job::DISRUPTION_TARGET;

/// The trainer's name when nothing on the pod names it.
pub const DEFAULT_TRAINER: &str = "trainer";

/// The env variables that mark the container the engine made the trainer:
/// torchrun's rendezvous backend and TensorFlow's cluster spec.
pub const TRAINER_ENV: [&str; 2] = ["PET_RDZV_BACKEND", "TF_CONFIG"];

/// Whether the pod was made from an injected template (it carries the
/// injection's status record).
pub fn injected(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(STATUS))
}

/// The injection's status record the pod carries, if any and readable
/// (bounded as [`crate::mutation::status::read`] bounds a template's).
pub fn status_record(meta: &ObjectMeta) -> Option<Status> {
    let raw = meta.annotations.as_ref()?.get(STATUS)?;
    if raw.len() > MAX_STATUS_BYTES {
        return None;
    }
    serde_json::from_str::<Status>(raw)
        .ok()
        .filter(|s| s.entries() <= MAX_STATUS_ENTRIES)
}

/// Whether a container carries the rendezvous env the engine gives the
/// trainer.
fn has_trainer_env(c: &Container) -> bool {
    c.env
        .iter()
        .flatten()
        .any(|e| TRAINER_ENV.contains(&e.name.as_str()))
}

/// The trainer container's name: the one the status record names, else the
/// one with the rendezvous env, else [`DEFAULT_TRAINER`].
pub fn trainer(pod: &Pod) -> String {
    trainer_of(pod, status_record(&pod.metadata).as_ref())
}

/// [`trainer`] with the record already read.
pub fn trainer_of(pod: &Pod, record: Option<&Status>) -> String {
    if let Some(name) = record
        .map(|s| s.container.as_str())
        .filter(|c| !c.is_empty())
    {
        return name.to_string();
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| has_trainer_env(c)))
        .map_or_else(|| DEFAULT_TRAINER.to_string(), |c| c.name.clone())
}

/// Whether the injection gave the pod trainwire's sidecar (its record has
/// a sidecar port): training can be observed from it.
pub fn runs_sidecar(record: Option<&Status>) -> bool {
    record.is_some_and(|s| s.sidecar_port.is_some())
}

/// The pod's `DisruptionTarget` condition, when it is `True`.
pub fn disruption(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True")
}

/// Whether the pod itself is lost: being deleted, or marked
/// `DisruptionTarget` by the control plane.
pub fn lost(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() || disruption(pod).is_some()
}

/// Drop from a watched pod what none of these questions, nor the
/// controllers' other readers (node, phase, conditions, container
/// statuses, annotations), needs: the bookkeeping
/// ([`crate::cache::slim`]), init containers, volumes, and of each
/// container everything but its name and the names of the env variables
/// that mark the trainer. The containers' specs are most of a pod.
pub fn slim(pod: &mut Pod) {
    crate::cache::slim(&mut pod.metadata);
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.init_containers = None;
    spec.volumes = None;
    for c in &mut spec.containers {
        let marks: Vec<EnvVar> = c
            .env
            .iter()
            .flatten()
            .filter(|e| TRAINER_ENV.contains(&e.name.as_str()))
            .map(|e| EnvVar {
                name: e.name.clone(),
                ..EnvVar::default()
            })
            .collect();
        *c = Container {
            name: std::mem::take(&mut c.name),
            env: (!marks.is_empty()).then_some(marks),
            ..Container::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap_or_default()
    }

    fn containers(env: &str) -> serde_json::Value {
        json!([
            {"name": "data-loader"},
            {"name": "worker", "image": "i", "env": [{"name": "OTHER", "value": "x"}, {"name": env, "value": "{}"}]}
        ])
    }

    #[test]
    fn the_record_names_the_trainer() {
        let p = pod(json!({
            "metadata": {"annotations": {STATUS: r#"{"container":"main","sidecarPort":29600}"#}},
            "spec": {"containers": containers("PET_RDZV_BACKEND")}
        }));
        assert_eq!(trainer(&p), "main");
        assert!(runs_sidecar(status_record(&p.metadata).as_ref()));
        assert!(injected(&p));
    }

    #[test]
    fn without_a_record_the_rendezvous_env_names_it_torch_and_tensorflow_alike() {
        for env in TRAINER_ENV {
            let p = pod(json!({"spec": {"containers": containers(env)}}));
            assert_eq!(trainer(&p), "worker", "{env}");
            assert!(!injected(&p));
        }
        let unreadable = pod(json!({
            "metadata": {"annotations": {STATUS: "not json"}},
            "spec": {"containers": containers("TF_CONFIG")}
        }));
        assert_eq!(trainer(&unreadable), "worker");
        assert!(!runs_sidecar(status_record(&unreadable.metadata).as_ref()));
    }

    #[test]
    fn nothing_names_it_so_it_is_trainer() {
        let p = pod(
            json!({"metadata": {"annotations": {STATUS: r#"{"container":""}"#}},
            "spec": {"containers": [{"name": "a"}]}}),
        );
        assert_eq!(trainer(&p), DEFAULT_TRAINER);
    }

    #[test]
    fn an_oversized_record_is_not_read() {
        let big = format!(
            r#"{{"container":"main","hash":"{}"}}"#,
            "x".repeat(MAX_STATUS_BYTES)
        );
        let p = pod(json!({"metadata": {"annotations": {STATUS: big}}}));
        assert_eq!(status_record(&p.metadata), None);
        assert_eq!(trainer(&p), DEFAULT_TRAINER);
    }

    #[test]
    fn lost_means_deleted_or_disrupted() {
        let disrupted = pod(json!({"status": {"conditions": [
            {"type": DISRUPTION_TARGET, "status": "True", "reason": "DeletionByTaintManager"}]}}));
        assert!(lost(&disrupted));
        let cleared = pod(json!({"status": {"conditions": [
            {"type": DISRUPTION_TARGET, "status": "False"}]}}));
        assert!(!lost(&cleared));
        let deleted = pod(json!({"metadata": {"deletionTimestamp": "2026-11-23T10:00:00Z"}}));
        assert!(lost(&deleted));
        assert!(!lost(&Pod::default()));
    }

    #[test]
    fn slim_keeps_what_the_questions_read() {
        let mut p = pod(json!({
            "metadata": {"managedFields": [{}]},
            "spec": {"nodeName": "n1", "containers": containers("TF_CONFIG"),
                     "initContainers": [{"name": "sidecar"}], "volumes": [{"name": "v"}]}
        }));
        slim(&mut p);
        assert_eq!(trainer(&p), "worker");
        let spec = p.spec.as_ref();
        assert_eq!(spec.and_then(|s| s.node_name.as_deref()), Some("n1"));
        assert_eq!(spec.and_then(|s| s.init_containers.as_ref()), None);
        let worker = spec.map(|s| &s.containers[1]);
        assert_eq!(worker.and_then(|c| c.image.as_deref()), None);
        let env = worker.and_then(|c| c.env.as_ref());
        assert_eq!(env.map(|e| e.len()), Some(1));
        assert_eq!(env.and_then(|e| e[0].value.as_deref()), None);
        assert_eq!(p.metadata.managed_fields, None);
    }
}
