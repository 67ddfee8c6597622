//! The dedicated rendezvous store (`trainwire.dev/rdzv-store: dedicated`):
//! torch's own c10d `TCPStore`, run from the trainer's image (so its
//! protocol is the trainer's torch) as a workload of its own, so that no
//! training pod is special.
//!
//! For a workload `<name>` it is a Deployment `<name>-rdzv` (one pod,
//! `Recreate`: never two stores) and a ClusterIP Service `<name>-rdzv`
//! (a stable address, which a replaced store pod keeps). Every training
//! pod's `PET_RDZV_ENDPOINT` names the Service and its `PET_RDZV_CONF` says
//! `is_host=false`. The reconciler creates both, owned by the workload (so
//! they go with it); offline `inject` emits them without an owner.
//!
//! The objects are a pure function of the stored workload (its name,
//! namespace and UID, the trainer container of its pod template, the status
//! trainwire recorded) and the policy profile's `storePod` (placement,
//! priority, resources): [`desired`].
//!
//! Measured (torch 2.15, CPU build): the store process holds about 540 MB
//! resident (300 MB anonymous, the rest torch's libraries), most of it from
//! `import torch`; hence the default request of 1 GiB.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecurityContext,
    Service, ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::mutation::status::Status;
use crate::policy::Profile;

/// The label that selects a store's pod: the workload's name.
pub const STORE_LABEL: &str = trainwire_contract::labels::RDZV_STORE;
/// The store container's name.
pub const CONTAINER: &str = "store";
/// The env variable the script reads its port from.
pub const PORT_ENV: &str = "TRAINWIRE_STORE_PORT";
/// The port's name on the container and the Service.
pub const PORT_NAME: &str = "rdzv";

/// The program the store container runs (`python3 -c`): torch's TCPStore as
/// the c10d rendezvous master, in multi-tenant mode (each restarted agent
/// opens a new connection to the same store) and without waiting for any
/// worker; it ends on SIGTERM or SIGINT.
pub const SCRIPT: &str = r#"import os, signal, sys
sigs = {signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
from torch.distributed import TCPStore
port = int(os.environ["TRAINWIRE_STORE_PORT"])
store = TCPStore("localhost", port, is_master=True, multi_tenant=True, wait_for_workers=False)
print(f"trainwire rendezvous store: torch TCPStore listening on port {port}", flush=True)
sig = signal.sigwait(sigs)
print(f"trainwire rendezvous store: {signal.Signals(sig).name}, exiting", flush=True)
"#;

/// The workload a store is for.
#[derive(Clone, Debug)]
pub struct Owner<'a> {
    /// `apps/v1` or `batch/v1`.
    pub api_version: &'a str,
    /// `StatefulSet` or `Job`.
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    /// `None` offline (a manifest has no UID): no owner reference.
    pub uid: Option<&'a str>,
}

/// The store's two objects.
#[derive(Clone, Debug, PartialEq)]
pub struct Objects {
    pub deployment: Deployment,
    pub service: Service,
}

/// The store's resources when the policy's `storePod.resources` says
/// nothing: what `import torch` and the store hold, with room.
pub fn default_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q("100m")),
            ("memory".to_string(), q("1Gi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), q("2Gi"))])),
        ..ResourceRequirements::default()
    }
}

/// The store objects of a workload whose pod template trainwire injected
/// with a dedicated store (`status.rdzv_store` names them), or `None` when
/// it has none, or the trainer container or the store's port is not there.
pub fn desired(
    owner: &Owner<'_>,
    template: &PodTemplateSpec,
    status: &Status,
    profile: &Profile,
) -> Option<Objects> {
    if status.rdzv_store.is_empty() {
        return None;
    }
    let port = status.rdzv_port?;
    let pod = template.spec.as_ref()?;
    let trainer = pod.containers.iter().find(|c| c.name == status.container)?;
    let name = status.rdzv_store.clone();
    let selector = BTreeMap::from([(STORE_LABEL.to_string(), owner.name.to_string())]);
    let mut labels = selector.clone();
    labels.insert(
        trainwire_contract::labels::MANAGED_BY_LABEL.to_string(),
        trainwire_contract::labels::MANAGED_BY.to_string(),
    );
    labels.insert(
        "app.kubernetes.io/component".to_string(),
        "rdzv-store".to_string(),
    );
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: owner.namespace.map(str::to_string),
        labels: Some(labels.clone()),
        annotations: Some(BTreeMap::from([(
            trainwire_contract::annotations::SERVICE_FOR.to_string(),
            format!("{}/{}", owner.kind, owner.name),
        )])),
        owner_references: owner.uid.map(|uid| {
            vec![OwnerReference {
                api_version: owner.api_version.to_string(),
                kind: owner.kind.to_string(),
                name: owner.name.to_string(),
                uid: uid.to_string(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        }),
        ..ObjectMeta::default()
    };
    let tcp = |period: i32, failures: i32| Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(PORT_NAME.to_string()),
            host: None,
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Probe::default()
    };
    let trainer_security = trainer.security_context.clone().unwrap_or_default();
    let container = Container {
        name: CONTAINER.to_string(),
        image: trainer.image.clone(),
        image_pull_policy: trainer.image_pull_policy.clone(),
        command: Some(vec![
            "python3".to_string(),
            "-c".to_string(),
            SCRIPT.to_string(),
        ]),
        env: Some(vec![
            EnvVar {
                name: PORT_ENV.to_string(),
                value: Some(port.to_string()),
                value_from: None,
            },
            EnvVar {
                name: "PYTHONDONTWRITEBYTECODE".to_string(),
                value: Some("1".to_string()),
                value_from: None,
            },
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.to_string()),
            container_port: i32::from(port),
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        resources: Some(
            profile
                .store_pod
                .resources
                .clone()
                .unwrap_or_else(default_resources),
        ),
        // `import torch` on a busy node takes tens of seconds.
        startup_probe: Some(tcp(2, 150)),
        readiness_probe: Some(tcp(2, 2)),
        liveness_probe: Some(tcp(10, 3)),
        security_context: Some(SecurityContext {
            // The trainer's user (its image may need it), nothing more.
            run_as_user: trainer_security.run_as_user,
            run_as_group: trainer_security.run_as_group,
            run_as_non_root: trainer_security.run_as_non_root,
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".to_string(),
            mount_path: "/tmp".to_string(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let pod_security = pod.security_context.as_ref().map(|s| PodSecurityContext {
        run_as_user: s.run_as_user,
        run_as_group: s.run_as_group,
        run_as_non_root: s.run_as_non_root,
        fs_group: s.fs_group,
        supplemental_groups: s.supplemental_groups.clone(),
        ..PodSecurityContext::default()
    });
    let store_pod = &profile.store_pod;
    let spec = PodSpec {
        containers: vec![container],
        image_pull_secrets: pod.image_pull_secrets.clone(),
        security_context: pod_security,
        node_selector: (!store_pod.node_selector.is_empty())
            .then(|| store_pod.node_selector.clone()),
        tolerations: (!store_pod.tolerations.is_empty()).then(|| store_pod.tolerations.clone()),
        priority_class_name: store_pod.priority_class_name.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(5),
        volumes: Some(vec![Volume {
            name: "tmp".to_string(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }]),
        ..PodSpec::default()
    };
    let deployment = Deployment {
        metadata: meta.clone(),
        spec: Some(DeploymentSpec {
            replicas: Some(1),
            revision_history_limit: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                match_expressions: None,
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".to_string()),
                rolling_update: None,
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(spec),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    };
    let service = Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.to_string()),
                port: i32::from(port),
                target_port: Some(IntOrString::String(PORT_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    Some(Objects {
        deployment,
        service,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(status: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"annotations": {crate::mutation::annotations::STATUS: status.to_string()}},
            "spec": {
                "securityContext": {"runAsUser": 1000, "fsGroup": 1000, "sysctls": [{"name": "a", "value": "b"}]},
                "imagePullSecrets": [{"name": "registry"}],
                "containers": [
                    {"name": "log", "image": "busybox"},
                    {"name": "trainer", "image": "registry.example/train:2.15", "imagePullPolicy": "IfNotPresent",
                     "securityContext": {"privileged": true, "runAsNonRoot": true, "capabilities": {"add": ["IPC_LOCK"]}},
                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                ]
            }
        }))
        .unwrap_or_default()
    }

    fn status(t: &PodTemplateSpec) -> Status {
        crate::mutation::status::read(t).unwrap_or_default()
    }

    const OWNER: Owner<'static> = Owner {
        api_version: "apps/v1",
        kind: "StatefulSet",
        name: "llm",
        namespace: Some("ml"),
        uid: Some("u-1"),
    };

    #[test]
    fn the_store_runs_the_trainers_image_and_nothing_of_its_privileges() {
        let t =
            template(json!({"container": "trainer", "rdzvPort": 29500, "rdzvStore": "llm-rdzv"}));
        let Some(o) = desired(&OWNER, &t, &status(&t), &Profile::default()) else {
            panic!("a dedicated store");
        };
        let d = serde_json::to_value(&o.deployment).unwrap_or_default();
        assert_eq!(d["metadata"]["name"], "llm-rdzv");
        assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
        let pod = &d["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.example/train:2.15");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["command"][0], "python3");
        assert_eq!(c["env"][0], json!({"name": PORT_ENV, "value": "29500"}));
        assert_eq!(c["ports"][0]["containerPort"], 29500);
        // No GPU, no privilege, no capability; the trainer's user.
        assert_eq!(
            c["resources"],
            serde_json::to_value(default_resources()).unwrap_or_default()
        );
        assert_eq!(c["securityContext"]["runAsNonRoot"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert!(c["securityContext"].get("privileged").is_none());
        assert_eq!(
            pod["securityContext"],
            json!({"runAsUser": 1000, "fsGroup": 1000})
        );
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "registry"}]));
        assert_eq!(pod["automountServiceAccountToken"], false);
        let s = serde_json::to_value(&o.service).unwrap_or_default();
        assert_eq!(s["metadata"]["name"], "llm-rdzv");
        assert_eq!(s["spec"]["selector"], json!({STORE_LABEL: "llm"}));
        assert!(s["spec"].get("clusterIP").is_none(), "a ClusterIP Service");
        assert_eq!(s["spec"]["ports"][0]["port"], 29500);
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"][STORE_LABEL], "llm",
            "the Service selects the store's pod"
        );
    }

    #[test]
    fn the_policy_places_the_store() {
        let t =
            template(json!({"container": "trainer", "rdzvPort": 29400, "rdzvStore": "llm-rdzv"}));
        let mut profile = Profile::default();
        profile.store_pod.node_selector = BTreeMap::from([("pool".to_string(), "cpu".to_string())]);
        profile.store_pod.priority_class_name = Some("training-infra".to_string());
        let Some(o) = desired(&OWNER, &t, &status(&t), &profile) else {
            panic!("a dedicated store");
        };
        let pod = o
            .deployment
            .spec
            .and_then(|s| s.template.spec)
            .unwrap_or_default();
        assert_eq!(
            pod.node_selector,
            Some(profile.store_pod.node_selector.clone())
        );
        assert_eq!(pod.priority_class_name.as_deref(), Some("training-infra"));
    }

    #[test]
    fn no_store_without_a_recorded_one() {
        let t = template(json!({"container": "trainer", "rdzvPort": 29500}));
        assert_eq!(desired(&OWNER, &t, &status(&t), &Profile::default()), None);
        let t = template(json!({"container": "gone", "rdzvPort": 29500, "rdzvStore": "llm-rdzv"}));
        assert_eq!(desired(&OWNER, &t, &status(&t), &Profile::default()), None);
    }
}
