//! Policy enforcement through the engine, on the StatefulSet a real
//! kube-apiserver sent (`statefulset-create.json`): for each setting, a
//! default kept, a default overridden by the workload, an enforced value
//! refused (exact message) and overwritten (exact warning).

use rstest::rstest;
use serde_json::{Value, json};
use trainwire_engine::mutation::{self, Outcome};
use trainwire_engine::policy::Policy;

/// The StatefulSet `llama-ft` (namespace `trainwire-test`, 2 replicas, one
/// GPU, annotated `checkpoint-pvc: ckpt`) as the apiserver sent it.
fn statefulset() -> (Value, String) {
    trainwire_test_support::fixtures::request_object("statefulset-create.json")
}

/// A one-profile policy for the fixture's namespace.
fn policy(profile_body: &str) -> Policy {
    let text = format!(
        "apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: team\n    namespaces: [trainwire-test]\n{profile_body}"
    );
    Policy::from_yaml(&text, "policy.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// A change to the workload before admission.
#[derive(Clone, Copy, Debug)]
enum Edit {
    None,
    /// Set a `trainwire.dev/*` annotation on the workload.
    Annotate(&'static str, &'static str),
    /// Remove a `trainwire.dev/*` annotation.
    Unannotate(&'static str),
    /// Set an env var on the trainer container in the manifest.
    TrainerEnv(&'static str, &'static str),
    /// Set a node selector entry in the pod template.
    NodeSelector(&'static str, &'static str),
    /// Add a toleration to the pod template: key, effect, seconds.
    Toleration(&'static str, &'static str, Option<i64>),
    /// Remove the trainer's GPU limit from the manifest.
    NoManifestGpu,
}

fn apply(obj: &mut Value, edit: Edit) {
    match edit {
        Edit::None => {}
        Edit::Annotate(k, v) => {
            obj["metadata"]["annotations"][format!("trainwire.dev/{k}")] = json!(v);
        }
        Edit::Unannotate(k) => {
            if let Some(a) = obj["metadata"]["annotations"].as_object_mut() {
                a.remove(&format!("trainwire.dev/{k}"));
            }
        }
        Edit::TrainerEnv(k, v) => {
            let c = &mut obj["spec"]["template"]["spec"]["containers"][0];
            if c.get("env").is_none() {
                c["env"] = json!([]);
            }
            if let Some(env) = c["env"].as_array_mut() {
                env.push(json!({"name": k, "value": v}));
            }
        }
        Edit::NodeSelector(k, v) => {
            obj["spec"]["template"]["spec"]["nodeSelector"][k] = json!(v);
        }
        Edit::NoManifestGpu => {
            if let Some(r) =
                obj["spec"]["template"]["spec"]["containers"][0]["resources"].as_object_mut()
            {
                r.clear();
            }
        }
        Edit::Toleration(key, effect, seconds) => {
            let spec = &mut obj["spec"]["template"]["spec"];
            if spec.get("tolerations").is_none() {
                spec["tolerations"] = json!([]);
            }
            let mut t = json!({"key": key, "operator": "Exists", "effect": effect});
            if let Some(s) = seconds {
                t["tolerationSeconds"] = json!(s);
            }
            if let Some(list) = spec["tolerations"].as_array_mut() {
                list.push(t);
            }
        }
    }
}

/// What to look at in the mutated workload.
#[derive(Clone, Copy, Debug)]
enum Probe {
    /// The trainer container's env value.
    TrainerEnv(&'static str),
    NodeSelector(&'static str),
    /// `tolerationSeconds` of the toleration for this taint key.
    TolerationSeconds(&'static str),
    /// Whether a toleration for this key exists (value: "yes"/"no").
    HasToleration(&'static str),
    /// The claim of the volume mounted at this path in the trainer.
    ClaimAt(&'static str),
    /// `sizeLimit` of the `/dev/shm` volume, or "none".
    ShmSize,
    /// The image of the sidecar (init container with restartPolicy Always), or "none".
    SidecarImage,
    /// The sidecar's env value.
    SidecarEnv(&'static str),
    /// The GPU limit of the trainer.
    GpuLimit,
}

fn probe(obj: &Value, p: Probe) -> String {
    let spec = &obj["spec"]["template"]["spec"];
    let trainer = &spec["containers"][0];
    let env_of = |c: &Value, name: &str| {
        c["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == name))
            .map(|e| {
                e.get("value")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("from {}", e["valueFrom"]))
            })
            .unwrap_or_else(|| "unset".to_string())
    };
    let sidecar = spec["initContainers"].as_array().and_then(|list| {
        list.iter()
            .find(|c| c["restartPolicy"] == "Always")
            .cloned()
    });
    match p {
        Probe::TrainerEnv(name) => env_of(trainer, name),
        Probe::NodeSelector(key) => spec["nodeSelector"][key]
            .as_str()
            .unwrap_or("unset")
            .to_string(),
        Probe::TolerationSeconds(key) => spec["tolerations"]
            .as_array()
            .and_then(|l| l.iter().find(|t| t["key"] == key))
            .map(|t| t["tolerationSeconds"].to_string())
            .unwrap_or_else(|| "no toleration".to_string()),
        Probe::HasToleration(key) => {
            let has = spec["tolerations"]
                .as_array()
                .is_some_and(|l| l.iter().any(|t| t["key"] == key));
            if has { "yes" } else { "no" }.to_string()
        }
        Probe::ClaimAt(path) => {
            let Some(mount) = trainer["volumeMounts"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["mountPath"] == path))
            else {
                return "no mount".to_string();
            };
            spec["volumes"]
                .as_array()
                .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
                .and_then(|v| v["persistentVolumeClaim"]["claimName"].as_str())
                .unwrap_or("not a claim")
                .to_string()
        }
        Probe::ShmSize => {
            let Some(mount) = trainer["volumeMounts"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["mountPath"] == "/dev/shm"))
            else {
                return "none".to_string();
            };
            spec["volumes"]
                .as_array()
                .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
                .map(|v| {
                    v["emptyDir"]["sizeLimit"]
                        .as_str()
                        .unwrap_or("no limit")
                        .to_string()
                })
                .unwrap_or_else(|| "none".to_string())
        }
        Probe::SidecarImage => sidecar
            .and_then(|c| c["image"].as_str().map(str::to_string))
            .unwrap_or_else(|| "none".to_string()),
        Probe::SidecarEnv(name) => sidecar
            .map(|c| env_of(&c, name))
            .unwrap_or_else(|| "none".to_string()),
        Probe::GpuLimit => trainer["resources"]["limits"]["nvidia.com/gpu"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| trainer["resources"]["limits"]["nvidia.com/gpu"].to_string()),
    }
}

enum Expect {
    /// The probe's value, and the policy warnings (those starting with
    /// `policy profile`), exactly.
    Ok(&'static str, &'static [&'static str]),
    /// The exact refusal message.
    Refused(&'static str),
}

#[rstest]
// ---- NCCL env
#[case::nccl_default_kept(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1}\n",
    &[Edit::None], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"), Expect::Ok("net1", &[]))]
#[case::nccl_default_overridden_by_annotation(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1}\n",
    &[Edit::Annotate("nccl", "NCCL_SOCKET_IFNAME=eth0")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"), Expect::Ok("eth0", &[]))]
#[case::nccl_default_overridden_by_manifest_env(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1}\n",
    &[Edit::TrainerEnv("NCCL_SOCKET_IFNAME", "eth0")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"), Expect::Ok("eth0", &[]))]
#[case::nccl_enforced_refuse_annotation(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1, enforce: refuse}\n",
    &[Edit::Annotate("nccl", "NCCL_SOCKET_IFNAME=eth0")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"),
    Expect::Refused(r#"policy profile "team" rule nccl.NCCL_SOCKET_IFNAME: annotation trainwire.dev/nccl is "eth0", but the policy enforces "net1"; remove it or set it to that value"#))]
#[case::nccl_enforced_refuse_manifest_env(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1, enforce: refuse}\n",
    &[Edit::TrainerEnv("NCCL_SOCKET_IFNAME", "eth0")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"),
    Expect::Refused(r#"policy profile "team" rule nccl.NCCL_SOCKET_IFNAME: env NCCL_SOCKET_IFNAME of container "trainer" is "eth0", but the policy enforces "net1"; remove it or set it to that value"#))]
#[case::nccl_enforced_overwrite(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1, enforce: overwrite}\n",
    &[Edit::Annotate("nccl", "NCCL_SOCKET_IFNAME=eth0")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"),
    Expect::Ok("net1", &[r#"policy profile "team" rule nccl.NCCL_SOCKET_IFNAME: annotation trainwire.dev/nccl "eth0" overwritten with the enforced "net1""#]))]
#[case::nccl_enforced_same_value_is_no_conflict(
    "    nccl:\n      NCCL_SOCKET_IFNAME: {value: net1, enforce: refuse}\n",
    &[Edit::Annotate("nccl", "NCCL_SOCKET_IFNAME=net1")], Probe::TrainerEnv("NCCL_SOCKET_IFNAME"), Expect::Ok("net1", &[]))]
// ---- node selector
#[case::node_selector_default_kept(
    "    nodeSelector:\n      karpenter.sh/nodepool: {value: gpu-a100}\n",
    &[Edit::None], Probe::NodeSelector("karpenter.sh/nodepool"), Expect::Ok("gpu-a100", &[]))]
#[case::node_selector_default_overridden(
    "    nodeSelector:\n      karpenter.sh/nodepool: {value: gpu-a100}\n",
    &[Edit::NodeSelector("karpenter.sh/nodepool", "gpu-h100")], Probe::NodeSelector("karpenter.sh/nodepool"), Expect::Ok("gpu-h100", &[]))]
#[case::node_selector_enforced_refuse(
    "    nodeSelector:\n      karpenter.sh/nodepool: {value: gpu-a100, enforce: refuse}\n",
    &[Edit::NodeSelector("karpenter.sh/nodepool", "gpu-h100")], Probe::NodeSelector("karpenter.sh/nodepool"),
    Expect::Refused(r#"policy profile "team" rule nodeSelector.karpenter.sh/nodepool: nodeSelector karpenter.sh/nodepool of the pod template is "gpu-h100", but the policy enforces "gpu-a100"; remove it or set it to that value"#))]
#[case::node_selector_enforced_overwrite(
    "    nodeSelector:\n      karpenter.sh/nodepool: {value: gpu-a100, enforce: overwrite}\n",
    &[Edit::NodeSelector("karpenter.sh/nodepool", "gpu-h100")], Probe::NodeSelector("karpenter.sh/nodepool"),
    Expect::Ok("gpu-a100", &[r#"policy profile "team" rule nodeSelector.karpenter.sh/nodepool: nodeSelector karpenter.sh/nodepool of the pod template "gpu-h100" overwritten with the enforced "gpu-a100""#]))]
// ---- tolerations and tolerationSeconds
#[case::toleration_added(
    "    tolerations:\n      - {key: example.com/reserved, operator: Exists, effect: NoSchedule}\n",
    &[Edit::None], Probe::HasToleration("example.com/reserved"), Expect::Ok("yes", &[]))]
#[case::node_failure_default_kept(
    "    nodeFailureTolerationSeconds: {value: 30}\n",
    &[Edit::None], Probe::TolerationSeconds("node.kubernetes.io/unreachable"), Expect::Ok("30", &[]))]
#[case::node_failure_default_overridden(
    "    nodeFailureTolerationSeconds: {value: 30}\n",
    &[Edit::Toleration("node.kubernetes.io/unreachable", "NoExecute", Some(120))],
    Probe::TolerationSeconds("node.kubernetes.io/unreachable"), Expect::Ok("120", &[]))]
#[case::node_failure_enforced_refuse(
    "    nodeFailureTolerationSeconds: {value: 30, enforce: refuse}\n",
    &[Edit::Toleration("node.kubernetes.io/unreachable", "NoExecute", Some(120))],
    Probe::TolerationSeconds("node.kubernetes.io/unreachable"), Expect::Refused(r#"policy profile "team" rule nodeFailureTolerationSeconds: tolerationSeconds of the pod template's toleration for node.kubernetes.io/unreachable is 120, but the policy enforces 30; remove it or set it to that value"#))]
#[case::node_failure_enforced_refuse_forever(
    "    nodeFailureTolerationSeconds: {value: 30, enforce: refuse}\n",
    &[Edit::Toleration("node.kubernetes.io/not-ready", "NoExecute", None)],
    Probe::TolerationSeconds("node.kubernetes.io/not-ready"), Expect::Refused(r#"policy profile "team" rule nodeFailureTolerationSeconds: the pod template tolerates node.kubernetes.io/not-ready forever (no tolerationSeconds), but the policy enforces 30 s; remove that toleration or set tolerationSeconds: 30"#))]
#[case::node_failure_enforced_overwrite(
    "    nodeFailureTolerationSeconds: {value: 30, enforce: overwrite}\n",
    &[Edit::Toleration("node.kubernetes.io/unreachable", "NoExecute", Some(120))],
    Probe::TolerationSeconds("node.kubernetes.io/unreachable"), Expect::Ok("30", &[r#"policy profile "team" rule nodeFailureTolerationSeconds: tolerationSeconds of the pod template's toleration for node.kubernetes.io/unreachable 120 overwritten with the enforced 30"#]))]
// ---- checkpoint claim
#[case::checkpoint_default_kept(
    "    checkpoint: {claim: shared-ckpt, enforce: default}\n",
    &[Edit::Unannotate("checkpoint-pvc")], Probe::ClaimAt("/checkpoints"), Expect::Ok("shared-ckpt", &[]))]
#[case::checkpoint_default_overridden(
    "    checkpoint: {claim: shared-ckpt, enforce: default}\n",
    &[Edit::None], Probe::ClaimAt("/checkpoints"), Expect::Ok("ckpt", &[]))]
#[case::checkpoint_enforced_refuse(
    "    checkpoint: {claim: shared-ckpt, enforce: refuse}\n",
    &[Edit::None], Probe::ClaimAt("/checkpoints"), Expect::Refused(r#"policy profile "team" rule checkpoint: annotation trainwire.dev/checkpoint-pvc is "ckpt", but checkpoints must go to a claim matching "shared-ckpt""#))]
#[case::checkpoint_enforced_refuse_missing_is_mounted(
    "    checkpoint: {claim: shared-ckpt, enforce: refuse}\n",
    &[Edit::Unannotate("checkpoint-pvc")], Probe::ClaimAt("/checkpoints"), Expect::Ok("shared-ckpt", &[]))]
#[case::checkpoint_pattern_missing_is_refused(
    "    checkpoint: {claim: \"{namespace}-ckpt-*\", enforce: refuse}\n",
    &[Edit::Unannotate("checkpoint-pvc")], Probe::ClaimAt("/checkpoints"), Expect::Refused(r#"policy profile "team" rule checkpoint: every training workload must keep its checkpoints on a shared claim: annotate trainwire.dev/checkpoint-pvc with a claim matching "trainwire-test-ckpt-*""#))]
#[case::checkpoint_pattern_matching_claim(
    "    checkpoint: {claim: \"{namespace}-ckpt-*\", enforce: refuse}\n",
    &[Edit::Annotate("checkpoint-pvc", "trainwire-test-ckpt-a")], Probe::ClaimAt("/checkpoints"), Expect::Ok("trainwire-test-ckpt-a", &[]))]
#[case::checkpoint_enforced_overwrite(
    "    checkpoint: {claim: \"{namespace}-checkpoints\", mountPath: /ckpt, enforce: overwrite}\n",
    &[Edit::None], Probe::ClaimAt("/ckpt"), Expect::Ok("trainwire-test-checkpoints", &[r#"policy profile "team" rule checkpoint: annotation trainwire.dev/checkpoint-pvc "ckpt" overwritten with the required "trainwire-test-checkpoints""#]))]
#[case::checkpoint_path_default_overridden(
    "    checkpointPath: {value: /data/ckpt}\n",
    &[Edit::Annotate("checkpoint-path", "/mnt/ckpt")], Probe::ClaimAt("/mnt/ckpt"), Expect::Ok("ckpt", &[]))]
#[case::checkpoint_path_enforced_refuse(
    "    checkpointPath: {value: /data/ckpt, enforce: refuse}\n",
    &[Edit::Annotate("checkpoint-path", "/mnt/ckpt")], Probe::ClaimAt("/data/ckpt"), Expect::Refused(r#"policy profile "team" rule checkpointPath: annotation trainwire.dev/checkpoint-path is "/mnt/ckpt", but the policy enforces "/data/ckpt"; remove it or set it to that value"#))]
// ---- allowed claims
#[case::allowed_claim(
    "    allowedClaims: [ckpt, \"datasets-*\"]\n",
    &[Edit::Annotate("volumes", "datasets-imagenet:/data:ro")], Probe::ClaimAt("/data"), Expect::Ok("datasets-imagenet", &[]))]
#[case::claim_not_allowed_in_volumes(
    "    allowedClaims: [ckpt, \"datasets-*\"]\n",
    &[Edit::Annotate("volumes", "team-scratch:/scratch")], Probe::ClaimAt("/scratch"), Expect::Refused(r#"policy profile "team" rule allowedClaims: annotation trainwire.dev/volumes names claim "team-scratch", which is not among the allowed claims "ckpt", "datasets-*""#))]
#[case::checkpoint_claim_not_allowed(
    "    allowedClaims: [\"{namespace}-*\"]\n",
    &[Edit::None], Probe::ClaimAt("/checkpoints"), Expect::Refused(r#"policy profile "team" rule allowedClaims: annotation trainwire.dev/checkpoint-pvc names claim "ckpt", which is not among the allowed claims "trainwire-test-*""#))]
// ---- /dev/shm
#[case::shm_default_kept(
    "    shmSize: {value: 64Gi}\n",
    &[Edit::None], Probe::ShmSize, Expect::Ok("64Gi", &[]))]
#[case::shm_default_overridden(
    "    shmSize: {value: 64Gi}\n",
    &[Edit::Annotate("shm-size", "16Gi")], Probe::ShmSize, Expect::Ok("16Gi", &[]))]
#[case::shm_enforced_refuse_off(
    "    shmSize: {value: 64Gi, enforce: refuse}\n",
    &[Edit::Annotate("shm-size", "off")], Probe::ShmSize, Expect::Refused(r#"policy profile "team" rule shmSize: annotation trainwire.dev/shm-size is "off", but the policy enforces "64Gi"; remove it or set it to that value"#))]
#[case::shm_enforced_overwrite(
    "    shmSize: {value: 64Gi, enforce: overwrite}\n",
    &[Edit::Annotate("shm-size", "16Gi")], Probe::ShmSize, Expect::Ok("64Gi", &[r#"policy profile "team" rule shmSize: annotation trainwire.dev/shm-size "16Gi" overwritten with the enforced "64Gi""#]))]
// ---- max nodes and GPUs
#[case::max_nodes_within(
    "    maxNodes: 2\n",
    &[Edit::None], Probe::TrainerEnv("PET_NNODES"), Expect::Ok("2", &[]))]
#[case::max_nodes_exceeded(
    "    maxNodes: 2\n",
    &[Edit::Annotate("nnodes", "1:4")], Probe::TrainerEnv("PET_NNODES"), Expect::Refused(r#"policy profile "team" rule maxNodes: the world asks for up to 4 nodes (spec.replicas or annotation trainwire.dev/nnodes), more than the 2 allowed"#))]
#[case::max_gpus_within(
    "    maxGpusPerNode: 8\n",
    &[Edit::NoManifestGpu, Edit::Annotate("gpus-per-node", "8")], Probe::GpuLimit, Expect::Ok("8", &[]))]
#[case::max_gpus_exceeded(
    "    maxGpusPerNode: 4\n",
    &[Edit::NoManifestGpu, Edit::Annotate("gpus-per-node", "8")], Probe::GpuLimit, Expect::Refused(r#"policy profile "team" rule maxGpusPerNode: the trainer asks for 8 GPUs per node (annotation trainwire.dev/gpus-per-node or its nvidia.com/gpu resources), more than the 4 allowed; ask for at most 4"#))]
#[case::cpu_pool_refuses_the_manifest_gpu(
    "    maxGpusPerNode: 0\n",
    &[Edit::None], Probe::GpuLimit, Expect::Refused(r#"policy profile "team" rule maxGpusPerNode: the trainer asks for 1 GPU per node (annotation trainwire.dev/gpus-per-node or its nvidia.com/gpu resources), but this profile allows no GPUs; remove them, or run in a namespace of a GPU profile"#))]
// ---- rendezvous backend
// c10d under trainwire's rendezvous handler (the rdzvHandler default).
#[case::rdzv_default_kept(
    "    rdzvBackend: {value: c10d}\n",
    &[Edit::None], Probe::TrainerEnv("PET_RDZV_BACKEND"), Expect::Ok("trainwire-c10d", &[]))]
#[case::rdzv_default_overridden(
    "    rdzvBackend: {value: c10d}\n",
    &[Edit::Annotate("rdzv-backend", "static")], Probe::TrainerEnv("PET_RDZV_BACKEND"), Expect::Ok("static", &[]))]
#[case::rdzv_enforced_refuse(
    "    rdzvBackend: {value: etcd-v2, enforce: refuse}\n    etcdEndpoint: etcd.platform.svc:2379\n",
    &[Edit::Annotate("rdzv-backend", "c10d")], Probe::TrainerEnv("PET_RDZV_BACKEND"), Expect::Refused(r#"policy profile "team" rule rdzvBackend: annotation trainwire.dev/rdzv-backend is "c10d", but the policy enforces "etcd-v2"; remove it or set it to that value"#))]
#[case::rdzv_enforced_overwrite_etcd(
    "    rdzvBackend: {value: etcd-v2, enforce: overwrite}\n    etcdEndpoint: etcd.platform.svc:2379\n",
    &[Edit::Annotate("rdzv-backend", "c10d")], Probe::TrainerEnv("PET_RDZV_ENDPOINT"), Expect::Ok("etcd.platform.svc:2379", &[r#"policy profile "team" rule rdzvBackend: annotation trainwire.dev/rdzv-backend "c10d" overwritten with the enforced "etcd-v2""#]))]
// ---- sidecar
#[case::sidecar_image_from_policy(
    "    sidecar:\n      image: {value: registry.example/trainwire-sidecar:2.0}\n",
    &[Edit::None], Probe::SidecarImage, Expect::Ok("registry.example/trainwire-sidecar:2.0", &[]))]
#[case::sidecar_env_from_policy(
    "    sidecar:\n      env: {TRAINWIRE_HEARTBEAT_INTERVAL: 2s}\n",
    &[Edit::None], Probe::SidecarEnv("TRAINWIRE_HEARTBEAT_INTERVAL"), Expect::Ok("2s", &[]))]
#[case::sidecar_disabled_by_annotation(
    "    sidecar:\n      enabled: {value: true}\n",
    &[Edit::Annotate("sidecar", "false")], Probe::SidecarImage, Expect::Ok("none", &[]))]
#[case::sidecar_mandatory(
    "    sidecar:\n      enabled: {value: true, enforce: refuse}\n",
    &[Edit::Annotate("sidecar", "false")], Probe::SidecarImage, Expect::Refused(r#"policy profile "team" rule sidecar.enabled: annotation trainwire.dev/sidecar is false, but the policy enforces true; remove it or set it to that value"#))]
#[case::on_peer_loss_enforced_overwrite(
    "    sidecar:\n      onPeerLoss: {value: restart-agent, enforce: overwrite}\n",
    &[Edit::Annotate("on-peer-loss", "none")], Probe::SidecarEnv("TRAINWIRE_ON_PEER_LOSS"), Expect::Ok("restart-agent", &[r#"policy profile "team" rule sidecar.onPeerLoss: annotation trainwire.dev/on-peer-loss "none" overwritten with the enforced "restart-agent""#]))]
// ---- the loss window: set only when it differs from the default (1s)
#[case::loss_window_default_not_set(
    "    sidecar:\n      lossWindow: {value: 1s}\n",
    &[Edit::None], Probe::SidecarEnv("TRAINWIRE_LOSS_WINDOW"), Expect::Ok("unset", &[]))]
#[case::loss_window_from_policy(
    "    sidecar:\n      lossWindow: {value: 1.5s}\n",
    &[Edit::None], Probe::SidecarEnv("TRAINWIRE_LOSS_WINDOW"), Expect::Ok("1s500ms", &[]))]
#[case::loss_window_by_annotation(
    "    sidecar:\n      lossWindow: {value: 1.5s}\n",
    &[Edit::Annotate("loss-window", "2s")], Probe::SidecarEnv("TRAINWIRE_LOSS_WINDOW"), Expect::Ok("2s", &[]))]
#[case::loss_window_enforced_refuse(
    "    sidecar:\n      lossWindow: {value: 2s, enforce: refuse}\n",
    &[Edit::Annotate("loss-window", "1s")], Probe::SidecarEnv("TRAINWIRE_LOSS_WINDOW"), Expect::Refused(r#"policy profile "team" rule sidecar.lossWindow: annotation trainwire.dev/loss-window is "1s", but the policy enforces "2s"; remove it or set it to that value"#))]
#[case::loss_window_enforced_overwrite(
    "    sidecar:\n      lossWindow: {value: 2s, enforce: overwrite}\n",
    &[Edit::Annotate("loss-window", "500ms")], Probe::SidecarEnv("TRAINWIRE_LOSS_WINDOW"), Expect::Ok("2s", &[r#"policy profile "team" rule sidecar.lossWindow: annotation trainwire.dev/loss-window "500ms" overwritten with the enforced "2s""#]))]
fn enforcement(
    #[case] profile: &str,
    #[case] edits: &[Edit],
    #[case] what: Probe,
    #[case] expect: Expect,
) {
    let policy = policy(profile);
    let (mut obj, namespace) = statefulset();
    for edit in edits {
        apply(&mut obj, *edit);
    }
    let profile = policy.profile_for(&namespace);
    assert_eq!(profile.name, "team");
    let got = mutation::mutate(&obj, Some(&namespace), &profile);
    match (got, expect) {
        (Ok(Outcome::Mutated(m)), Expect::Ok(value, warnings)) => {
            assert_eq!(probe(&m.object, what), value, "{what:?}");
            let policy_warnings: Vec<&str> = m
                .warnings
                .iter()
                .map(String::as_str)
                .filter(|w| w.starts_with("policy profile"))
                .collect();
            assert_eq!(policy_warnings, warnings);
        }
        (Err(refusal), Expect::Refused(message)) => assert_eq!(refusal.to_string(), message),
        (Ok(Outcome::Mutated(m)), Expect::Refused(message)) => panic!(
            "expected the refusal {message:?}, got {:?} = {:?} with warnings {:?}",
            what,
            probe(&m.object, what),
            m.warnings
        ),
        (Err(refusal), Expect::Ok(..)) => panic!("refused: {refusal}"),
        (Ok(Outcome::NotManaged), _) => panic!("not managed"),
    }
}
