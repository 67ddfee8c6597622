//! Engine tests: the real AdmissionReview fixtures, re-injection, the scale
//! guard, every refusal message, policy enforcement and property tests.

use proptest::prelude::*;
use rstest::rstest;
use serde_json::{Value, json};

use super::patch::apply_checked;
use super::*;
use crate::policy::{CheckpointRule, Enforce, Profile, RdzvBackend, Setting};

/// `(request.object, request.namespace)` of a captured AdmissionReview.
fn fixture(name: &str) -> (Value, String) {
    trainwire_test_support::fixtures::request_object(name)
}

/// Every warning any test here produces fits in [`MAX_WARNING_LEN`]
/// characters, but for these, which quote values of the manifest or the
/// policy that may be long by themselves (docs/warnings.md lists them).
const LONG_WARNINGS: &[&str] = &[
    // The manifest's value and trainwire's (a pod's DNS name).
    "env ",
    // The policy's rule, the manifest's value and the enforced one.
    "policy profile ",
];

/// The apiserver truncates an admission warning past 256 characters.
const MAX_ANY_WARNING: usize = 256;

fn check_warning(w: &str) {
    let n = w.chars().count();
    assert!(n <= MAX_ANY_WARNING, "warning of {n} characters: {w}");
    assert!(
        n <= MAX_WARNING_LEN || LONG_WARNINGS.iter().any(|p| w.starts_with(p)),
        "warning of {n} characters (at most {MAX_WARNING_LEN}; docs/warnings.md): {w}"
    );
}

fn mutated(obj: &Value, ns: Option<&str>, profile: &Profile) -> Mutation {
    match mutate(obj, ns, profile) {
        Ok(Outcome::Mutated(m)) => {
            for w in &m.warnings {
                check_warning(w);
            }
            m
        }
        other => panic!("expected a mutation, got {other:?}"),
    }
}

fn refusal(obj: &Value, profile: &Profile) -> String {
    match mutate(obj, None, profile) {
        Err(r) => r.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn trainer_env(obj: &Value) -> Vec<(String, Value)> {
    obj.pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                e.clone(),
            )
        })
        .collect()
}

fn env_value(obj: &Value, container: &str, name: &str) -> Option<String> {
    let containers = obj
        .pointer(&format!("/spec/template/spec/{container}"))
        .and_then(Value::as_array)?;
    containers
        .iter()
        .flat_map(|c| c["env"].as_array().into_iter().flatten())
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

fn trainer_value(obj: &Value, name: &str) -> Option<String> {
    env_value(obj, "containers", name)
}

/// The sidecar's init container in a pod spec (after the rendezvous
/// handler's installer, when there is one).
fn sidecar_of(spec: &Value) -> &Value {
    spec["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "trainwire-sidecar"))
        .unwrap_or(&Value::Null)
}

/// A container's mount of volume `name`.
fn mount_of<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == name))
        .unwrap_or(&Value::Null)
}

fn sidecar_value(obj: &Value, name: &str) -> Option<String> {
    env_value(obj, "initContainers", name)
}

/// The patch applies to the input (no add below a missing parent), gives the
/// output, and injecting the output again changes nothing.
fn check_round_trip(input: &Value, ns: Option<&str>, profile: &Profile) -> Mutation {
    let m = mutated(input, ns, profile);
    let patched = apply_checked(input, &m.patch).expect("patch applies");
    assert_eq!(
        patched, m.object,
        "patch applied to input == mutated object"
    );
    let again = mutated(&m.object, ns, profile);
    assert!(
        again.patch.0.is_empty(),
        "re-injection patch: {:?}",
        again.patch
    );
    assert_eq!(again.object, m.object);
    m
}

fn sts_fixture() -> (Value, String) {
    fixture("statefulset-create.json")
}

#[rstest]
#[case("statefulset-create.json")]
#[case("statefulset-create-dryrun.json")]
#[case("statefulset-create-kubectl-create.json")]
#[case("statefulset-update-scale.json")]
#[case("statefulset-update-template.json")]
#[case("job-indexed-create.json")]
#[case("job-indexed-create-dryrun.json")]
#[case("job-update-label.json")]
fn fixtures_inject_and_patch_applies(#[case] name: &str) {
    let (obj, ns) = fixture(name);
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    let names: Vec<String> = trainer_env(&m.object).into_iter().map(|(n, _)| n).collect();
    let mut dedup = names.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(names.len(), dedup.len(), "no duplicated env: {names:?}");
    let sts = obj["kind"] == "StatefulSet";
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let service = if sts {
        name.to_string()
    } else {
        "bert-pretrain".to_string()
    };
    assert_eq!(
        trainer_value(&m.object, "PET_RDZV_ENDPOINT"),
        Some(format!("{name}-0.{service}.{ns}.svc.cluster.local:29500"))
    );
    let size = if sts {
        &obj["spec"]["replicas"]
    } else {
        &obj["spec"]["parallelism"]
    };
    assert_eq!(
        trainer_value(&m.object, "PET_NNODES"),
        Some(size.to_string())
    );
    let rank = trainer_env(&m.object)
        .into_iter()
        .find(|(n, _)| n == "PET_NODE_RANK")
        .map(|(_, e)| e["valueFrom"]["fieldRef"]["fieldPath"].clone());
    let expected_rank = if sts {
        "metadata.labels['apps.kubernetes.io/pod-index']"
    } else {
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    };
    assert_eq!(rank, Some(json!(expected_rank)));
    assert_eq!(
        trainer_value(&m.object, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE").as_deref(),
        Some("1")
    );
    assert_eq!(
        trainer_value(&m.object, "PET_RDZV_CONF").as_deref(),
        Some("keep_alive_interval=1,keep_alive_max_attempt=3")
    );
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(spec["shareProcessNamespace"], json!(true));
    assert_eq!(sidecar_of(spec)["name"], json!("trainwire-sidecar"));
    assert_eq!(sidecar_of(spec)["restartPolicy"], json!("Always"));
    assert_eq!(
        sidecar_value(&m.object, "TRAINWIRE_PEER_HOSTS"),
        Some(format!("{name}-{{i}}.{service}.{ns}.svc.cluster.local"))
    );
    // Every fixture's trainer asks for a GPU but the kubectl-create one.
    let gpu_toleration = spec["tolerations"].as_array().is_some_and(|t| {
        t.iter()
            .any(|t| t["key"] == "nvidia.com/gpu" && t["effect"] == "NoSchedule")
    });
    assert_eq!(gpu_toleration, name != "opted-in", "{name}");
    assert!(
        m.object["spec"]["template"]["metadata"]["annotations"]["trainwire.dev/status"].is_string()
    );
}

#[test]
fn object_without_annotations_gets_a_whole_annotations_map() {
    let (obj, ns) = fixture("statefulset-create-kubectl-create.json");
    assert!(
        obj["spec"]["template"]["metadata"]
            .get("annotations")
            .is_none()
    );
    let m = mutated(&obj, Some(&ns), &Profile::default());
    let ops = serde_json::to_value(&m.patch).unwrap_or_default();
    let add = ops
        .as_array()
        .into_iter()
        .flatten()
        .find(|op| op["path"] == "/spec/template/metadata/annotations")
        .cloned();
    let add = add.expect("adds the annotations map whole");
    assert_eq!(add["op"], "add");
    assert!(add["value"]["trainwire.dev/status"].is_string());
    assert!(
        !ops.as_array().into_iter().flatten().any(|op| op["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/spec/template/metadata/annotations/"))),
        "never adds below the missing map"
    );
}

#[test]
fn checkpoint_pvc_annotation_mounts_in_trainer_and_sidecar() {
    let (obj, ns) = sts_fixture();
    let m = mutated(&obj, Some(&ns), &Profile::default());
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(
        spec["volumes"][0],
        json!({"name": "trainwire-checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}})
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"][0],
        json!({"name": "trainwire-checkpoint", "mountPath": "/checkpoints"})
    );
    assert_eq!(
        mount_of(sidecar_of(spec), "trainwire-checkpoint"),
        &json!({"name": "trainwire-checkpoint", "mountPath": "/checkpoints", "readOnly": true})
    );
    assert_eq!(
        trainer_value(&m.object, "CHECKPOINT_DIR").as_deref(),
        Some("/checkpoints")
    );
    assert_eq!(
        sidecar_value(&m.object, "TRAINWIRE_CHECKPOINT_DIR").as_deref(),
        Some("/checkpoints")
    );
    assert_eq!(
        sidecar_value(&m.object, "TRAINWIRE_CHECKPOINT_MAX_AGE").as_deref(),
        Some("30m")
    );
    assert_eq!(
        spec["volumes"][1]["emptyDir"],
        json!({"medium": "Memory", "sizeLimit": "8Gi"})
    );
}

#[test]
fn reinjection_recomputes_trainwire_entries_after_replicas_change() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let mut scaled = first.object.clone();
    scaled["spec"]["replicas"] = json!(3);
    let m = check_round_trip(&scaled, Some(&ns), &Profile::default());
    assert_eq!(trainer_value(&m.object, "PET_NNODES").as_deref(), Some("3"));
    assert_eq!(trainer_value(&m.object, "NNODES").as_deref(), Some("3"));
    assert_eq!(trainer_value(&m.object, "WORLD_SIZE").as_deref(), Some("3"));
    assert_eq!(
        sidecar_value(&m.object, "TRAINWIRE_NNODES").as_deref(),
        Some("3")
    );
    // The rendezvous handler's installer and the sidecar.
    assert_eq!(
        m.object["spec"]["template"]["spec"]["initContainers"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    assert_eq!(
        trainer_env(&m.object).len(),
        trainer_env(&first.object).len()
    );
    // Only what changed is patched.
    let paths: Vec<String> = serde_json::to_value(&m.patch)
        .unwrap_or_default()
        .as_array()
        .into_iter()
        .flatten()
        .map(|op| op["path"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(paths.iter().all(|p| !p.contains("volumes")), "{paths:?}");
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
}

#[test]
fn reinjection_after_the_real_kubectl_patch_update() {
    // The fixture is `kubectl patch --type=merge -p '{"spec":{"replicas":3}}'` on a
    // StatefulSet the webhook did not inject yet: injecting it sets 3.
    let (obj, ns) = fixture("statefulset-update-scale.json");
    let m = mutated(&obj, Some(&ns), &Profile::default());
    assert_eq!(trainer_value(&m.object, "PET_NNODES").as_deref(), Some("3"));
}

#[test]
fn a_value_the_user_edited_after_injection_is_theirs() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let mut edited = first.object.clone();
    let env = edited
        .pointer_mut("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array_mut)
        .expect("env");
    for e in env.iter_mut() {
        if e["name"] == "PET_MAX_RESTARTS" {
            e["value"] = json!("10");
        }
    }
    edited["spec"]["replicas"] = json!(4);
    let m = check_round_trip(&edited, Some(&ns), &Profile::default());
    assert_eq!(
        trainer_value(&m.object, "PET_MAX_RESTARTS").as_deref(),
        Some("10")
    );
    assert_eq!(trainer_value(&m.object, "PET_NNODES").as_deref(), Some("4"));
    assert!(
        m.warnings.iter().any(|w| w.contains("PET_MAX_RESTARTS")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn turning_the_sidecar_off_removes_it_on_reinjection() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let mut off = first.object.clone();
    off["metadata"]["annotations"]["trainwire.dev/sidecar"] = json!("false");
    let m = check_round_trip(&off, Some(&ns), &Profile::default());
    let spec = &m.object["spec"]["template"]["spec"];
    assert!(spec.get("initContainers").is_none(), "{spec}");
    assert!(spec.get("shareProcessNamespace").is_none());
}

#[test]
fn the_input_hash_decides_a_no_op() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let again = mutated(&first.object, Some(&ns), &Profile::default());
    assert!(again.patch.0.is_empty());
    // Another namespace is another input: the endpoints change.
    let other = mutated(&first.object, Some("elsewhere"), &Profile::default());
    assert!(!other.patch.0.is_empty());
    assert_eq!(
        trainer_value(&other.object, "PET_RDZV_ENDPOINT").as_deref(),
        Some("llama-ft-0.llama-ft.elsewhere.svc.cluster.local:29500")
    );
}

/// The injected label: on every injected template, never part of the
/// input (a template that already carries it, with any value, injects to
/// the same hash and the same pods).
#[test]
fn injected_pods_carry_the_label_and_it_is_not_an_input() {
    use trainwire_contract::labels::{INJECTED, INJECTED_VALUE};
    let label = format!(
        "/spec/template/metadata/labels/{}",
        INJECTED.replace('/', "~1")
    );
    let status = "/spec/template/metadata/annotations/trainwire.dev~1status";
    let (obj, ns) = sts_fixture();
    let first = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(first.object.pointer(&label), Some(&json!(INJECTED_VALUE)));
    let mut preset = obj.clone();
    preset["spec"]["template"]["metadata"]["labels"][INJECTED] = json!("no");
    let again = mutated(&preset, Some(&ns), &Profile::default());
    assert_eq!(again.object.pointer(&label), Some(&json!(INJECTED_VALUE)));
    assert_eq!(again.object.pointer(status), first.object.pointer(status));
    // A Job too.
    let (job, ns) = fixture("job-indexed-create.json");
    let m = check_round_trip(&job, Some(&ns), &Profile::default());
    assert_eq!(m.object.pointer(&label), Some(&json!(INJECTED_VALUE)));
    // And the workloads themselves (their watches select on it too).
    let own = format!("/metadata/labels/{}", INJECTED.replace('/', "~1"));
    assert_eq!(first.object.pointer(&own), Some(&json!(INJECTED_VALUE)));
    assert_eq!(m.object.pointer(&own), Some(&json!(INJECTED_VALUE)));
}

#[test]
fn not_managed_objects_pass() {
    for name in [
        "pod-create-from-statefulset.json",
        "pod-create-from-deployment.json",
        "statefulset-scale-subresource.json",
    ] {
        let (obj, ns) = fixture(name);
        assert!(
            matches!(
                mutate(&obj, Some(&ns), &Profile::default()),
                Ok(Outcome::NotManaged)
            ),
            "{name}"
        );
    }
    let (mut obj, ns) = sts_fixture();
    obj["metadata"]["annotations"]["trainwire.dev/inject"] = json!("false");
    assert!(matches!(
        mutate(&obj, Some(&ns), &Profile::default()),
        Ok(Outcome::NotManaged)
    ));
    // Being deleted: even a workload that would be refused passes.
    let (mut obj, ns) = fixture("job-nonindexed-create.json");
    obj["metadata"]["deletionTimestamp"] = json!("2026-11-21T17:00:00Z");
    assert!(matches!(
        mutate(&obj, Some(&ns), &Profile::default()),
        Ok(Outcome::NotManaged)
    ));
}

#[test]
fn job_gets_indexed_completions_and_subdomain() {
    let (mut obj, ns) = fixture("job-indexed-create.json");
    let spec = obj["spec"].as_object_mut().expect("spec");
    spec.remove("completionMode");
    spec.remove("completions");
    obj["spec"]["template"]["spec"]
        .as_object_mut()
        .expect("pod spec")
        .remove("subdomain");
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(m.object["spec"]["completionMode"], "Indexed");
    assert_eq!(m.object["spec"]["completions"], 2);
    assert_eq!(
        m.object["spec"]["template"]["spec"]["subdomain"],
        "bert-pretrain"
    );
    assert_eq!(
        sidecar_value(&m.object, "TRAINWIRE_SELECTOR").as_deref(),
        Some("batch.kubernetes.io/job-name=bert-pretrain")
    );
}

#[test]
fn retrofit_keeps_the_manifest_values_and_warns() {
    let (mut obj, ns) = sts_fixture();
    obj["spec"]["replicas"] = json!(4);
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        {"name": "NNODES", "value": "3"},
        {"name": "MASTER_ADDR", "value": "train-rdzv"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "PET_RDZV_CONF", "value": "join_timeout=900,keep_alive_interval=5"},
    ]);
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(trainer_value(&m.object, "NNODES").as_deref(), Some("3"));
    assert_eq!(
        trainer_value(&m.object, "MASTER_ADDR").as_deref(),
        Some("train-rdzv")
    );
    assert_eq!(
        trainer_value(&m.object, "PET_RDZV_CONF").as_deref(),
        Some("join_timeout=900,keep_alive_interval=5,keep_alive_max_attempt=3")
    );
    assert_eq!(
        m.warnings,
        vec![
            workload::ORDERED_READY_WARNING.to_string(),
            "env PET_RDZV_CONF of container \"trainer\": keep_alive_interval=5 kept, trainwire would set keep_alive_interval=1".to_string(),
            "env MASTER_ADDR of container \"trainer\": the manifest's \"train-rdzv\" is kept; trainwire would set \"llama-ft-0.llama-ft.trainwire-test.svc.cluster.local\"".to_string(),
            "env NNODES of container \"trainer\": the manifest's \"3\" is kept; trainwire would set \"4\" (spec.replicas)".to_string(),
        ]
    );
    let count = |n: &str| {
        trainer_env(&m.object)
            .iter()
            .filter(|(x, _)| x == n)
            .count()
    };
    assert_eq!(count("NNODES"), 1);
    assert_eq!(count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 1);
    // Restored on re-injection: the user's original value comes back first.
    let mut again = m.object.clone();
    again["spec"]["replicas"] = json!(3);
    let m2 = check_round_trip(&again, Some(&ns), &Profile::default());
    assert_eq!(
        trainer_value(&m2.object, "PET_RDZV_CONF").as_deref(),
        Some("join_timeout=900,keep_alive_interval=5,keep_alive_max_attempt=3")
    );
}

#[test]
fn elastic_range_and_gpus_per_node() {
    let (mut obj, ns) = fixture("statefulset-create-kubectl-create.json");
    let ann = &mut obj["metadata"]["annotations"];
    ann["trainwire.dev/nnodes"] = json!("1:4");
    ann["trainwire.dev/gpus-per-node"] = json!("8");
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(
        trainer_value(&m.object, "PET_NNODES").as_deref(),
        Some("1:4")
    );
    assert_eq!(
        trainer_value(&m.object, "PET_NPROC_PER_NODE").as_deref(),
        Some("8")
    );
    assert_eq!(trainer_value(&m.object, "WORLD_SIZE"), None);
    assert_eq!(trainer_value(&m.object, "NNODES"), None);
    let res = &m.object["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(
        res,
        &json!({"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}})
    );
    assert!(scale_allowed(&m.object, 4).is_ok());
    assert!(scale_allowed(&m.object, 5).is_err());
}

/// The scale guard's verdict on a stored StatefulSet (see `crate::scale`).
fn scale_allowed(object: &Value, new: i32) -> Result<(), Refusal> {
    let sts: k8s_openapi::api::apps::v1::StatefulSet =
        serde_json::from_value(object.clone()).expect("a StatefulSet");
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match crate::scale::decide(
        || crate::scale::Lookup::Found(std::sync::Arc::new(sts)),
        "trainwire-test",
        name,
        new,
        None,
    ) {
        crate::scale::Verdict::Allow => Ok(()),
        crate::scale::Verdict::Refuse(r) => Err(r),
        crate::scale::Verdict::AllowUnknown(_, w) => panic!("unknown: {w}"),
    }
}

#[test]
fn scale_guard() {
    let (obj, ns) = sts_fixture();
    assert_eq!(scale_allowed(&obj, 5), Ok(()), "not injected");
    let m = mutated(&obj, Some(&ns), &Profile::default());
    assert_eq!(scale_allowed(&m.object, 2), Ok(()));
    assert_eq!(scale_allowed(&m.object, 0), Ok(()), "stopping is fine");
    assert_eq!(
        scale_allowed(&m.object, 3).map_err(|e| e.to_string()),
        Err("StatefulSet llama-ft: scaling to 3 replicas with the scale subresource (kubectl scale) is refused because its pods were injected with PET_NNODES=2 and it would go stale; change `replicas` with `kubectl apply` or `kubectl patch` (which re-injects PET_NNODES), or annotate an elastic range `trainwire.dev/nnodes: MIN:MAX` that covers 3".to_string())
    );
}

fn with_annotation(key: &str, value: &str) -> Value {
    let (mut obj, _) = sts_fixture();
    obj["metadata"]["annotations"][key] = json!(value);
    obj
}

#[rstest]
#[case(
    with_annotation("trainwire.dev/inject", "yes"),
    "annotation trainwire.dev/inject: \"yes\" is not valid: not a boolean string; accepted: \"true\" or \"false\" (quoted in YAML)"
)]
#[case(
    with_annotation("trainwire.dev/container", "worker"),
    "annotation trainwire.dev/container: \"worker\" is not valid: no container of the pod template has this name; accepted: one of \"trainer\""
)]
#[case(
    with_annotation("trainwire.dev/container", "Bad_Name"),
    "annotation trainwire.dev/container: \"Bad_Name\" is not valid: not a container name; accepted: the name of a container of the pod template (a DNS-1123 label)"
)]
#[case(
    with_annotation("trainwire.dev/nnodes", "4:2"),
    "annotation trainwire.dev/nnodes: \"4:2\" is not valid: MIN is above MAX; accepted: a whole number N from 1 such as 4, or an elastic range MIN:MAX such as 2:8 with 1 <= MIN <= MAX"
)]
#[case(
    with_annotation("trainwire.dev/nproc-per-node", "0"),
    "annotation trainwire.dev/nproc-per-node: \"0\" is not valid: not a process count; accepted: a positive integer such as \"8\", or one of torchrun's \"auto\", \"gpu\", \"cpu\""
)]
#[case(
    with_annotation("trainwire.dev/gpus-per-node", "two"),
    "annotation trainwire.dev/gpus-per-node: \"two\" is not valid: not a whole number; accepted: a whole number from 1 to 4294967295, such as 8"
)]
#[case(
    with_annotation("trainwire.dev/rdzv-backend", "etcd"),
    "annotation trainwire.dev/rdzv-backend: \"etcd\" is not valid: not one of the accepted names; accepted: c10d, static, etcd-v2"
)]
#[case(
    with_annotation("trainwire.dev/rdzv-port", "70000"),
    "annotation trainwire.dev/rdzv-port: \"70000\" is not valid: above 65535; accepted: a TCP port from 1 to 65535, such as 29500"
)]
#[case(
    with_annotation("trainwire.dev/max-restarts", "-1"),
    "annotation trainwire.dev/max-restarts: \"-1\" is not valid: not a whole number; accepted: a whole number from 0 to 4294967295, such as 3"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-pvc", "Ckpt!"),
    "annotation trainwire.dev/checkpoint-pvc: \"Ckpt!\" is not valid: not a PersistentVolumeClaim name; accepted: the name of a PersistentVolumeClaim in the namespace (a DNS-1123 subdomain)"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-path", "ckpt"),
    "annotation trainwire.dev/checkpoint-path: \"ckpt\" is not valid: not an absolute path; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-max-age", "30 minutes"),
    "annotation trainwire.dev/checkpoint-max-age: \"30 minutes\" is not valid: \" minutes\" is not a unit; accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)"
)]
// Found by fuzzing: mounted at "/ckpt " while the sidecar (which trims its
// env) watched "/ckpt".
#[case(
    with_annotation("trainwire.dev/checkpoint-path", "/ckpt /"),
    "annotation trainwire.dev/checkpoint-path: \"/ckpt /\" is not valid: the segment \"ckpt \" starts or ends with a blank, which readers that trim values would drop; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-path", "/ckpt "),
    "annotation trainwire.dev/checkpoint-path: \"/ckpt \" is not valid: it starts or ends with a blank, which readers that trim values would drop; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"
)]
#[case(
    with_annotation("trainwire.dev/volumes", "data:/d /:ro"),
    "annotation trainwire.dev/volumes: \"data:/d /:ro\" is not valid: \"/d /\" is not a mount path: the segment \"d \" starts or ends with a blank, which readers that trim values would drop; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "data"),
    "annotation trainwire.dev/volumes: \"data\" is not valid: entry \"data\" has no mount path; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "data:/data:rx"),
    "annotation trainwire.dev/volumes: \"data:/data:rx\" is not valid: entry \"data:/data:rx\" has a mode that is neither ro nor rw; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "data:/data:ro:x"),
    "annotation trainwire.dev/volumes: \"data:/data:ro:x\" is not valid: entry \"data:/data:ro:x\" has too many \":\"; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "Data:/data"),
    "annotation trainwire.dev/volumes: \"Data:/data\" is not valid: \"Data\" is not a PersistentVolumeClaim name; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "data:data"),
    "annotation trainwire.dev/volumes: \"data:data\" is not valid: \"data\" is not a mount path: not an absolute path; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/volumes", "a:/data,b:/data"),
    "annotation trainwire.dev/volumes: \"a:/data,b:/data\" is not valid: \"/data\" is mounted twice; accepted: comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\""
)]
#[case(
    with_annotation("trainwire.dev/nccl", "NCCL_DEBUG"),
    "annotation trainwire.dev/nccl: \"NCCL_DEBUG\" is not valid: entry \"NCCL_DEBUG\" has no \"=\"; accepted: comma-separated KEY=VALUE with keys starting NCCL_ or TORCH_NCCL_, e.g. \"NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth0\""
)]
#[case(
    with_annotation("trainwire.dev/nccl", "LD_PRELOAD=x"),
    "annotation trainwire.dev/nccl: \"LD_PRELOAD=x\" is not valid: \"LD_PRELOAD\" is not an NCCL_* or TORCH_NCCL_* variable; accepted: comma-separated KEY=VALUE with keys starting NCCL_ or TORCH_NCCL_, e.g. \"NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth0\""
)]
#[case(
    with_annotation("trainwire.dev/nccl", "NCCL_DEBUG=INFO,NCCL_DEBUG=WARN"),
    "annotation trainwire.dev/nccl: \"NCCL_DEBUG=INFO,NCCL_DEBUG=WARN\" is not valid: NCCL_DEBUG is given twice; accepted: comma-separated KEY=VALUE with keys starting NCCL_ or TORCH_NCCL_, e.g. \"NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth0\""
)]
#[case(
    with_annotation("trainwire.dev/shm-size", "lots"),
    "annotation trainwire.dev/shm-size: \"lots\" is not valid: it does not start with a number; accepted: a size of at least 1Mi such as 8Gi, 512Mi or 64Gi, or off to leave /dev/shm alone"
)]
#[case(
    with_annotation("trainwire.dev/sidecar", "no"),
    "annotation trainwire.dev/sidecar: \"no\" is not valid: not a boolean; accepted: \"true\" or \"false\""
)]
#[case(
    with_annotation("trainwire.dev/on-peer-loss", "restart"),
    "annotation trainwire.dev/on-peer-loss: \"restart\" is not valid: not one of the accepted names; accepted: auto, restart-workers, restart-agent, none"
)]
// Regressions (issue 11): one grammar with the policy and the sidecar.
#[case(
    with_annotation("trainwire.dev/shm-size", "512m"),
    "annotation trainwire.dev/shm-size: \"512m\" is not valid: m, u and n are thousandths, millionths and billionths (a fraction of a byte); write Mi or M for mebibytes or megabytes; accepted: a size of at least 1Mi such as 8Gi, 512Mi or 64Gi, or off to leave /dev/shm alone"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-path", "//"),
    "annotation trainwire.dev/checkpoint-path: \"//\" is not valid: it is the root directory; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-max-age", "18446744073709551615s"),
    "annotation trainwire.dev/checkpoint-max-age: \"18446744073709551615s\" is not valid: it is longer than 8760h; accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)"
)]
#[case(
    with_annotation("trainwire.dev/checkpoint-max-age", "1d"),
    "annotation trainwire.dev/checkpoint-max-age: \"1d\" is not valid: d is not a unit of Go durations; write 24h for a day; accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)"
)]
fn annotation_refusals(#[case] obj: Value, #[case] message: &str) {
    assert_eq!(refusal(&obj, &Profile::default()), message);
}

fn with_annotations(pairs: &[(&str, &str)]) -> Value {
    let (mut obj, _) = sts_fixture();
    for (k, v) in pairs {
        obj["metadata"]["annotations"][*k] = json!(v);
    }
    obj
}

fn without(pointer: &str, key: &str) -> Value {
    let (mut obj, _) = sts_fixture();
    if let Some(m) = obj.pointer_mut(pointer).and_then(Value::as_object_mut) {
        m.remove(key);
    }
    obj
}

#[rstest]
#[case(with_annotations(&[("trainwire.dev/inject", "true")]).pipe(|mut o| { o["metadata"]["annotations"]["trainwire.dev/sidecar"] = json!(false); o }),
    "trainwire.dev/sidecar: false is a YAML boolean, annotation values are strings: write \"false\" in quotes")]
#[case(with_annotations(&[("trainwire.dev/rdzv-backend", "static"), ("trainwire.dev/nnodes", "1:2")]),
    "annotation trainwire.dev/nnodes: \"1:2\" is not valid: the static rendezvous backend cannot run an elastic world; accepted: a fixed node count such as \"4\" with rdzv-backend static, or rdzv-backend c10d for MIN:MAX")]
#[case(
    without("/spec", "serviceName"),
    "StatefulSet llama-ft has no spec.serviceName; trainwire needs a headless Service (clusterIP: None) selecting its pods and named in spec.serviceName, so that pod 0 has the DNS name llama-ft-0.<service>.trainwire-test.svc.<cluster domain> for the rendezvous"
)]
#[case(sts_fixture().0.pipe(|mut o| { o["spec"]["ordinals"] = json!({"start": 1}); o }),
    "StatefulSet llama-ft has spec.ordinals.start 1, so its pods are llama-ft-1, llama-ft-2, ...; a torchrun world needs pod llama-ft-0 (the rendezvous host, llama-ft-0.llama-ft.trainwire-test.svc) and node ranks 0 to replicas-1, which trainwire reads from the pod index; remove spec.ordinals or set start: 0")]
#[case(
    without("/metadata", "name"),
    "the StatefulSet has no metadata.name; trainwire needs a fixed name for the pods' DNS names (generateName is not supported)"
)]
#[case(fixture("job-nonindexed-create.json").0.pipe(|mut o| { o["spec"]["completionMode"] = json!("Sparse"); o }),
    "Job eval-nonindexed has spec.completionMode \"Sparse\", which trainwire does not know; a torchrun world needs a node rank per pod, which only an Indexed Job gives: set completionMode: Indexed, or leave it out and trainwire sets it")]
#[case(fixture("job-create-no-completion-mode.json").0.pipe(|mut o| { o["spec"]["parallelism"] = json!(0); o }),
    "Job ddp-default has spec.parallelism 0 and no annotation trainwire.dev/nnodes: a torchrun world of 0 nodes cannot run, and a Job's pod template cannot be re-injected later; set spec.parallelism to the number of nodes")]
#[case(sts_fixture().0.pipe(|mut o| { o["spec"]["template"]["spec"]["containers"] = json!([]); o }),
    "the pod template has no containers; add the trainer container")]
#[case(sts_fixture().0.pipe(|mut o| { o["spec"]["template"]["spec"]["containers"] = json!("x"); o }),
    "the StatefulSet cannot be read: invalid type: string \"x\", expected a sequence")]
#[case(with_annotations(&[("trainwire.dev/rdzv-backend", "etcd-v2")]),
    "policy profile \"default\" rule etcdEndpoint: the etcd-v2 rendezvous backend needs an etcd endpoint and the policy gives none; use rdzv-backend c10d, or ask the platform team to set etcdEndpoint")]
fn workload_refusals(#[case] obj: Value, #[case] message: &str) {
    assert_eq!(refusal(&obj, &Profile::default()), message);
}

/// `spec.ordinals` that keeps the first ordinal at 0 (the default) changes
/// nothing trainwire relies on: pod 0 is still the rendezvous host.
#[rstest]
#[case(json!({}))]
#[case(json!({"start": 0}))]
fn ordinals_starting_at_zero_are_injected(#[case] ordinals: Value) {
    let (mut obj, _) = sts_fixture();
    obj["spec"]["ordinals"] = ordinals.clone();
    let m = mutated(&obj, None, &Profile::default());
    assert_eq!(
        trainer_value(&m.object, "PET_RDZV_ENDPOINT").as_deref(),
        Some("llama-ft-0.llama-ft.trainwire-test.svc.cluster.local:29500")
    );
    assert_eq!(m.object["spec"]["ordinals"], ordinals);
}

/// A resize that the StatefulSet's update strategy does not roll out to
/// every pod leaves agents that disagree on the world size: warned.
#[rstest]
#[case::on_delete(json!({"type": "OnDelete"}), 3, true)]
#[case::partition(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}), 3, true)]
#[case::rolling(json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}), 3, false)]
#[case::on_delete_same_size(json!({"type": "OnDelete"}), 2, false)]
fn a_resize_held_back_by_the_update_strategy_is_warned(
    #[case] strategy: Value,
    #[case] replicas: i64,
    #[case] warned: bool,
) {
    let (mut obj, _) = sts_fixture();
    obj["spec"]["updateStrategy"] = strategy;
    let injected = mutated(&obj, None, &Profile::default()).object;
    let mut update = injected.clone();
    update["spec"]["replicas"] = json!(replicas);
    // A real change besides, so that the same size still re-injects.
    update["spec"]["template"]["spec"]["containers"][0]["image"] = json!("trainer:v2");
    let m = mutated(&update, None, &Profile::default());
    let expected = "world size 2 -> 3, but ";
    assert_eq!(
        m.warnings.iter().any(|w| w.starts_with(expected)),
        warned,
        "{:?}",
        m.warnings
    );
    if warned {
        assert!(
            m.warnings
                .iter()
                .any(|w| w.ends_with("on the old size: delete those pods")),
            "{:?}",
            m.warnings
        );
    }
}

trait Pipe: Sized {
    fn pipe(self, f: impl FnOnce(Self) -> Self) -> Self {
        f(self)
    }
}
impl Pipe for Value {}

fn profile(f: impl FnOnce(&mut Profile)) -> Profile {
    let mut p = Profile {
        name: "ml".to_string(),
        ..Profile::default()
    };
    f(&mut p);
    p
}

fn enforced<T>(value: T, enforce: Enforce) -> Setting<T> {
    Setting { value, enforce }
}

#[rstest]
#[case(profile(|p| p.max_nodes = Some(1)), sts_fixture().0,
    "policy profile \"ml\" rule maxNodes: the world asks for up to 2 nodes (spec.replicas or annotation trainwire.dev/nnodes), more than the 1 allowed")]
#[case(profile(|p| p.max_gpus_per_node = Some(4)), with_annotations(&[("trainwire.dev/gpus-per-node", "8")]).pipe(|mut o| { o["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({}); o }),
    "policy profile \"ml\" rule maxGpusPerNode: the trainer asks for 8 GPUs per node (annotation trainwire.dev/gpus-per-node or its nvidia.com/gpu resources), more than the 4 allowed; ask for at most 4")]
#[case(profile(|p| { p.nccl.insert("NCCL_SOCKET_IFNAME".into(), enforced("eth1".to_string(), Enforce::Refuse)); }),
    with_annotations(&[("trainwire.dev/nccl", "NCCL_SOCKET_IFNAME=eth0")]),
    "policy profile \"ml\" rule nccl.NCCL_SOCKET_IFNAME: annotation trainwire.dev/nccl is \"eth0\", but the policy enforces \"eth1\"; remove it or set it to that value")]
#[case(profile(|p| { p.nccl.insert("NCCL_SOCKET_IFNAME".into(), enforced("eth1".to_string(), Enforce::Refuse)); }),
    sts_fixture().0.pipe(|mut o| { o["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "NCCL_SOCKET_IFNAME", "value": "ib0"}]); o }),
    "policy profile \"ml\" rule nccl.NCCL_SOCKET_IFNAME: env NCCL_SOCKET_IFNAME of container \"trainer\" is \"ib0\", but the policy enforces \"eth1\"; remove it or set it to that value")]
#[case(profile(|p| p.allowed_claims = Some(vec!["team-*".into()])), sts_fixture().0,
    "policy profile \"ml\" rule allowedClaims: annotation trainwire.dev/checkpoint-pvc names claim \"ckpt\", which is not among the allowed claims \"team-*\"")]
#[case(profile(|p| p.allowed_claims = Some(vec!["{namespace}-*".into(), "ckpt".into()])), with_annotations(&[("trainwire.dev/volumes", "other:/data")]),
    "policy profile \"ml\" rule allowedClaims: annotation trainwire.dev/volumes names claim \"other\", which is not among the allowed claims \"trainwire-test-*\", \"ckpt\"")]
#[case(profile(|p| p.checkpoint = Some(CheckpointRule { claim: "{name}-ckpt".into(), mount_path: None, enforce: Enforce::Refuse })), sts_fixture().0,
    "policy profile \"ml\" rule checkpoint: annotation trainwire.dev/checkpoint-pvc is \"ckpt\", but checkpoints must go to a claim matching \"llama-ft-ckpt\"")]
#[case(profile(|p| p.checkpoint = Some(CheckpointRule { claim: "ckpt-*".into(), mount_path: None, enforce: Enforce::Refuse })), without("/metadata/annotations", "trainwire.dev/checkpoint-pvc"),
    "policy profile \"ml\" rule checkpoint: every training workload must keep its checkpoints on a shared claim: annotate trainwire.dev/checkpoint-pvc with a claim matching \"ckpt-*\"")]
#[case(profile(|p| p.shm_size = enforced("16Gi".parse().expect("size"), Enforce::Refuse)), with_annotations(&[("trainwire.dev/shm-size", "off")]),
    "policy profile \"ml\" rule shmSize: annotation trainwire.dev/shm-size is \"off\", but the policy enforces \"16Gi\"; remove it or set it to that value")]
#[case(profile(|p| p.rdzv_backend = enforced(RdzvBackend::C10d, Enforce::Refuse)), with_annotations(&[("trainwire.dev/rdzv-backend", "static")]),
    "policy profile \"ml\" rule rdzvBackend: annotation trainwire.dev/rdzv-backend is \"static\", but the policy enforces \"c10d\"; remove it or set it to that value")]
#[case(profile(|p| p.sidecar.enabled = enforced(true, Enforce::Refuse)), with_annotations(&[("trainwire.dev/sidecar", "false")]),
    "policy profile \"ml\" rule sidecar.enabled: annotation trainwire.dev/sidecar is false, but the policy enforces true; remove it or set it to that value")]
#[case(profile(|p| { p.node_selector.insert("pool".into(), enforced("gpu".to_string(), Enforce::Refuse)); }),
    sts_fixture().0.pipe(|mut o| { o["spec"]["template"]["spec"]["nodeSelector"] = json!({"pool": "cpu"}); o }),
    "policy profile \"ml\" rule nodeSelector.pool: nodeSelector pool of the pod template is \"cpu\", but the policy enforces \"gpu\"; remove it or set it to that value")]
#[case(profile(|p| p.node_failure_toleration_seconds = Some(enforced(30, Enforce::Refuse))),
    sts_fixture().0.pipe(|mut o| { o["spec"]["template"]["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]); o }),
    "policy profile \"ml\" rule nodeFailureTolerationSeconds: the pod template tolerates node.kubernetes.io/unreachable forever (no tolerationSeconds), but the policy enforces 30 s; remove that toleration or set tolerationSeconds: 30")]
#[case(profile(|p| p.max_nodes = Some(2)), spare_sts(),
    "policy profile \"ml\" rule maxNodes: the world asks for up to 2 nodes (spec.replicas or annotation trainwire.dev/nnodes) plus 1 spares (trainwire.dev/spares), more than the 2 allowed")]
fn policy_refusals(#[case] profile: Profile, #[case] obj: Value, #[case] message: &str) {
    assert_eq!(refusal(&obj, &profile), message);
}

#[test]
fn policy_overwrites_defaults_and_placement() {
    let p = profile(|p| {
        p.nccl.insert(
            "NCCL_SOCKET_IFNAME".into(),
            enforced("eth1".to_string(), Enforce::Overwrite),
        );
        p.nccl.insert(
            "NCCL_DEBUG".into(),
            enforced("WARN".to_string(), Enforce::Default),
        );
        p.node_selector.insert(
            "pool".into(),
            enforced("gpu".to_string(), Enforce::Overwrite),
        );
        p.tolerations.push(k8s_openapi::api::core::v1::Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("ml".into()),
            effect: Some("NoSchedule".into()),
            toleration_seconds: None,
        });
        p.node_failure_toleration_seconds = Some(enforced(30, Enforce::Overwrite));
        p.shm_size = enforced("16Gi".parse().expect("size"), Enforce::Default);
        p.sidecar.image = enforced("registry.example/sidecar:2".into(), Enforce::Refuse);
        p.checkpoint = Some(CheckpointRule {
            claim: "{name}-ckpt".into(),
            mount_path: Some("/ckpt".parse().expect("path")),
            enforce: Enforce::Overwrite,
        });
    });
    let (mut obj, ns) = sts_fixture();
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        {"name": "NCCL_SOCKET_IFNAME", "value": "ib0"},
        {"name": "NCCL_DEBUG", "value": "INFO"},
    ]);
    obj["spec"]["template"]["spec"]["nodeSelector"] = json!({"pool": "cpu"});
    obj["spec"]["template"]["spec"]["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    ]);
    let m = check_round_trip(&obj, Some(&ns), &p);
    assert_eq!(
        trainer_value(&m.object, "NCCL_SOCKET_IFNAME").as_deref(),
        Some("eth1")
    );
    assert_eq!(
        trainer_value(&m.object, "NCCL_DEBUG").as_deref(),
        Some("INFO"),
        "a default yields to the manifest"
    );
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(spec["nodeSelector"], json!({"pool": "gpu"}));
    assert_eq!(
        spec["tolerations"],
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        ])
    );
    assert_eq!(sidecar_of(spec)["image"], "registry.example/sidecar:2");
    assert_eq!(
        spec["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "llama-ft-ckpt"
    );
    assert_eq!(
        trainer_value(&m.object, "CHECKPOINT_DIR").as_deref(),
        Some("/ckpt")
    );
    assert_eq!(spec["volumes"][1]["emptyDir"]["sizeLimit"], "16Gi");
    assert_eq!(
        m.warnings,
        vec![
            workload::ORDERED_READY_WARNING.to_string(),
            "policy profile \"ml\" rule checkpoint: annotation trainwire.dev/checkpoint-pvc \"ckpt\" overwritten with the required \"llama-ft-ckpt\"".to_string(),
            "policy profile \"ml\" rule nccl.NCCL_SOCKET_IFNAME: env NCCL_SOCKET_IFNAME of container \"trainer\" \"ib0\" overwritten with the enforced \"eth1\"".to_string(),
            "policy profile \"ml\" rule nodeSelector.pool: nodeSelector pool of the pod template \"cpu\" overwritten with the enforced \"gpu\"".to_string(),
            "policy profile \"ml\" rule nodeFailureTolerationSeconds: tolerationSeconds of the pod template's toleration for node.kubernetes.io/not-ready 300 overwritten with the enforced 30".to_string(),
        ]
    );
    // A policy that stops enforcing gives the user's values back, at the
    // user's next real change (here: replicas 2 -> 3).
    let relaxed = Profile {
        name: "ml".into(),
        ..Profile::default()
    };
    let mut changed = m.object.clone();
    changed["spec"]["replicas"] = json!(3);
    let back = check_round_trip(&changed, Some(&ns), &relaxed);
    assert_eq!(
        trainer_value(&back.object, "NCCL_SOCKET_IFNAME").as_deref(),
        Some("ib0")
    );
    let spec = &back.object["spec"]["template"]["spec"];
    assert_eq!(spec["nodeSelector"], json!({"pool": "cpu"}));
    assert_eq!(spec["tolerations"][0]["tolerationSeconds"], 300);
}

/// The sidecar's identity (see `sidecar_container::identity`): the trainer's
/// UID when known, with no capability; root with only KILL when not; the
/// policy's pinned UID otherwise.
#[rstest]
// The image's user (unknown): root with KILL only (Pod Security baseline).
#[case(json!(null), json!(null), None,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"add": ["KILL"], "drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsNonRoot": false, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
// A non-root trainer (container): its UID and group, no capability (restricted).
#[case(json!({"runAsUser": 1000, "runAsGroup": 1000}), json!(null), None,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsGroup": 1000, "runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
// The pod's UID when the container does not say; the container's wins.
#[case(json!(null), json!({"runAsUser": 2000, "runAsGroup": 3000, "fsGroup": 3000}), None,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsGroup": 3000, "runAsNonRoot": true, "runAsUser": 2000, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
#[case(json!({"runAsUser": 1001}), json!({"runAsUser": 2000}), None,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "runAsUser": 1001, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
// An explicitly root trainer: root, and the same UID needs no capability.
#[case(json!({"runAsUser": 0}), json!(null), None,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsNonRoot": false, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
// Pinned by the policy to another non-root UID: cannot signal, said so.
#[case(json!({"runAsUser": 1000}), json!(null), Some(65532),
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}), true)]
// Pinned to root: KILL reaches the trainer.
#[case(json!({"runAsUser": 1000}), json!(null), Some(0),
    json!({"allowPrivilegeEscalation": false, "capabilities": {"add": ["KILL"], "drop": ["ALL"]}, "privileged": false, "readOnlyRootFilesystem": true, "runAsNonRoot": false, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}), false)]
fn the_sidecar_runs_as_the_trainer_or_as_root_with_kill_only(
    #[case] container: Value,
    #[case] pod: Value,
    #[case] pinned: Option<i64>,
    #[case] expected: Value,
    #[case] warned: bool,
) {
    let (mut obj, ns) = sts_fixture();
    if !container.is_null() {
        obj["spec"]["template"]["spec"]["containers"][0]["securityContext"] = container;
    }
    if !pod.is_null() {
        obj["spec"]["template"]["spec"]["securityContext"] = pod;
    }
    let p = profile(|p| p.sidecar.run_as_user = pinned);
    let m = check_round_trip(&obj, Some(&ns), &p);
    let sc = &sidecar_of(&m.object["spec"]["template"]["spec"])["securityContext"];
    assert_eq!(sc, &expected);
    assert_eq!(
        m.warnings
            .iter()
            .any(|w| w.contains("it can report a lost peer, not restart")),
        warned,
        "{:?}",
        m.warnings
    );
}

/// `runAsNonRoot` without a UID, on the pod or on the trainer container
/// (the container's wins, as for the UID): the sidecar must run as root to
/// signal a trainer of unknown UID, which Pod Security `restricted` refuses;
/// one warning says so and names where it was set.
#[rstest]
#[case::pod(json!(null), json!({"runAsNonRoot": true}), Some("the pod"))]
#[case::container(json!({"runAsNonRoot": true}), json!(null), Some("the trainer container"))]
#[case::both(json!({"runAsNonRoot": true}), json!({"runAsNonRoot": true}), Some("the trainer container"))]
#[case::container_overrides_pod(json!({"runAsNonRoot": false}), json!({"runAsNonRoot": true}), None)]
#[case::container_over_pod_false(json!({"runAsNonRoot": true}), json!({"runAsNonRoot": false}), Some("the trainer container"))]
#[case::uid_known(json!({"runAsNonRoot": true, "runAsUser": 1000}), json!(null), None)]
#[case::pod_uid_known(json!({"runAsNonRoot": true}), json!({"runAsUser": 1000}), None)]
fn a_root_sidecar_beside_a_run_as_non_root_trainer_is_explained(
    #[case] container: Value,
    #[case] pod: Value,
    #[case] whose: Option<&str>,
) {
    let (mut obj, ns) = sts_fixture();
    if !container.is_null() {
        obj["spec"]["template"]["spec"]["containers"][0]["securityContext"] = container;
    }
    if !pod.is_null() {
        obj["spec"]["template"]["spec"]["securityContext"] = pod;
    }
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    let sc = &sidecar_of(&m.object["spec"]["template"]["spec"])["securityContext"];
    let warned: Vec<&String> = m
        .warnings
        .iter()
        .filter(|w| w.contains("sets runAsNonRoot"))
        .collect();
    match whose {
        Some(whose) => {
            assert_eq!(sc["runAsUser"], 0);
            assert_eq!(sc["runAsNonRoot"], false);
            assert_eq!(
                warned,
                [&format!(
                    "{whose} sets runAsNonRoot but no runAsUser: the sidecar is root, refused by restricted Pod Security"
                )]
            );
        }
        None => assert!(warned.is_empty(), "{warned:?}"),
    }
}

#[test]
fn unknown_fields_of_a_newer_apiserver_are_kept() {
    let (mut obj, ns) = sts_fixture();
    obj["spec"]["template"]["spec"]["futureField"] = json!({"x": 1});
    obj["spec"]["template"]["spec"]["containers"][0]["futureField"] = json!(true);
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(
        m.object["spec"]["template"]["spec"]["futureField"],
        json!({"x": 1})
    );
    assert_eq!(
        m.object["spec"]["template"]["spec"]["containers"][0]["futureField"],
        json!(true)
    );
}

const KEYS: &[&str] = &[
    "trainwire.dev/container",
    "trainwire.dev/nnodes",
    "trainwire.dev/nproc-per-node",
    "trainwire.dev/gpus-per-node",
    "trainwire.dev/rdzv-backend",
    "trainwire.dev/rdzv-port",
    "trainwire.dev/max-restarts",
    "trainwire.dev/checkpoint-pvc",
    "trainwire.dev/checkpoint-path",
    "trainwire.dev/checkpoint-max-age",
    "trainwire.dev/volumes",
    "trainwire.dev/nccl",
    "trainwire.dev/shm-size",
    "trainwire.dev/sidecar",
    "trainwire.dev/on-peer-loss",
    "trainwire.dev/unknown",
];

fn plausible_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("trainer".to_string()),
        Just("2:8".to_string()),
        Just("3".to_string()),
        Just("off".to_string()),
        Just("16Gi".to_string()),
        Just("false".to_string()),
        Just("static".to_string()),
        Just("restart-agent".to_string()),
        Just("data:/data:ro,models:/models".to_string()),
        Just("NCCL_DEBUG=INFO".to_string()),
        Just("/ckpt".to_string()),
        Just("ckpt".to_string()),
        "[ -~]{0,24}",
        any::<String>(),
    ]
}

/// The workloads the idempotency property starts from: a StatefulSet, an
/// Indexed Job, and Jobs the apiserver defaulted to `NonIndexed`.
const WORKLOADS: [&str; 4] = [
    "statefulset-create.json",
    "job-indexed-create.json",
    "job-create-no-completion-mode.json",
    "job-nonindexed-create.json",
];

/// Empty fields a user may write (`parent`, key, JSON value).
const EMPTY_FIELDS: [(&str, &str, &str); 9] = [
    (
        "/spec/template/spec/containers/0",
        "resources",
        r#"{"requests":{}}"#,
    ),
    (
        "/spec/template/spec/containers/0",
        "resources",
        r#"{"limits":{}}"#,
    ),
    ("/spec/template/spec/containers/0", "env", "[]"),
    ("/spec/template/spec/containers/0", "volumeMounts", "[]"),
    ("/spec/template/spec", "volumes", "[]"),
    ("/spec/template/spec", "initContainers", "[]"),
    ("/spec/template/spec", "tolerations", "[]"),
    ("/spec/template/spec", "nodeSelector", "{}"),
    ("/spec/template", "metadata", r#"{"annotations":{}}"#),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn arbitrary_annotations_never_panic_and_round_trip(
        pairs in proptest::collection::vec((0..KEYS.len(), plausible_value()), 0..6),
        replicas in 0i32..6,
        kind in 0..WORKLOADS.len(),
        empties in proptest::collection::vec(0..EMPTY_FIELDS.len(), 0..4),
    ) {
        let (mut obj, ns) = fixture(WORKLOADS[kind]);
        let job = obj["kind"] == "Job";
        if !job {
            obj["spec"]["replicas"] = json!(replicas);
        }
        for e in &empties {
            let (parent, key, value) = EMPTY_FIELDS[*e];
            if let Some(at) = obj.pointer_mut(parent) {
                at[key] = serde_json::from_str(value).expect("json");
            }
        }
        for (k, v) in &pairs {
            obj["metadata"]["annotations"][KEYS[*k]] = json!(v);
        }
        if let Ok(Outcome::Mutated(m)) = mutate(&obj, Some(&ns), &Profile::default()) {
            let patched = apply_checked(&obj, &m.patch);
            prop_assert_eq!(patched.as_ref(), Ok(&m.object));
            match mutate(&m.object, Some(&ns), &Profile::default()) {
                Ok(Outcome::Mutated(again)) => {
                    prop_assert!(again.patch.0.is_empty());
                    prop_assert_eq!(&again.object, &m.object);
                }
                other => prop_assert!(false, "re-injection: {:?}", other),
            }
            // Changing the size re-injects to the same result as a fresh injection.
            if !job {
                let mut resized = m.object.clone();
                resized["spec"]["replicas"] = json!(replicas + 1);
                let mut fresh = obj.clone();
                fresh["spec"]["replicas"] = json!(replicas + 1);
                let a = mutate(&resized, Some(&ns), &Profile::default());
                let b = mutate(&fresh, Some(&ns), &Profile::default());
                match (a, b) {
                    (Ok(Outcome::Mutated(a)), Ok(Outcome::Mutated(b))) => {
                        let applied = apply_checked(&resized, &a.patch);
                        prop_assert_eq!(applied.as_ref(), Ok(&a.object));
                        prop_assert_eq!(&a.object["spec"]["template"]["spec"], &b.object["spec"]["template"]["spec"]);
                    }
                    (Err(a), Err(b)) => prop_assert_eq!(a, b),
                    (a, b) => prop_assert!(false, "{:?} vs {:?}", a, b),
                }
            }
        }
    }

    #[test]
    fn any_annotation_string_never_panics(key in "trainwire\\.dev/[a-z-]{0,20}", value in any::<String>()) {
        let (mut obj, ns) = sts_fixture();
        obj["metadata"]["annotations"][key.as_str()] = json!(value);
        let _ = mutate(&obj, Some(&ns), &Profile::default());
    }
}

#[test]
fn a_deleted_trainwire_entry_comes_back() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let mut edited = first.object.clone();
    edited["spec"]["template"]["spec"]
        .as_object_mut()
        .expect("pod spec")
        .remove("initContainers");
    let m = check_round_trip(&edited, Some(&ns), &Profile::default());
    assert_eq!(m.object, first.object);
}

#[test]
fn quantities_the_apiserver_respells_are_still_recognised() {
    let (mut obj, ns) = sts_fixture();
    obj["metadata"]["annotations"]["trainwire.dev/shm-size"] = json!("1024Mi");
    let first = mutated(&obj, Some(&ns), &Profile::default());
    // What the apiserver stores: the canonical spelling.
    let mut stored = first.object.clone();
    let volumes = stored
        .pointer_mut("/spec/template/spec/volumes")
        .and_then(Value::as_array_mut)
        .expect("volumes");
    for v in volumes.iter_mut() {
        if v["name"] == "trainwire-shm" {
            v["emptyDir"]["sizeLimit"] = json!("1Gi");
        }
    }
    let again = mutated(&stored, Some(&ns), &Profile::default());
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
    stored["spec"]["replicas"] = json!(3);
    let resized = check_round_trip(&stored, Some(&ns), &Profile::default());
    let vols = resized.object["spec"]["template"]["spec"]["volumes"].clone();
    // /dev/shm, the checkpoints, the rendezvous handler's directory.
    assert_eq!(vols.as_array().map(Vec::len), Some(3), "{vols}");
    assert!(resized.warnings.is_empty(), "{:?}", resized.warnings);
}

#[test]
fn a_job_that_never_restarts_is_warned_about() {
    let (obj, ns) = fixture("job-indexed-create.json");
    let m = mutated(&obj, Some(&ns), &Profile::default());
    assert_eq!(
        m.warnings,
        vec!["restartPolicy Never: each trainer restart fails the pod and counts against backoffLimit; OnFailure restarts in place".to_string()]
    );
}

#[test]
fn a_per_pod_claim_at_the_checkpoint_path_is_named_in_the_warning() {
    let (mut obj, ns) = sts_fixture();
    obj["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "ckpt-local", "mountPath": "/checkpoints"}]);
    obj["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "ckpt-local"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}]);
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(
        m.warnings,
        vec![
            workload::ORDERED_READY_WARNING.to_string(),
            "container \"trainer\" mounts per-pod \"ckpt-local\" at /checkpoints (kept), not claim \"ckpt\" (trainwire.dev/checkpoint-pvc)".to_string()
        ]
    );
    // The sidecar watches that mount.
    assert_eq!(
        mount_of(
            sidecar_of(&m.object["spec"]["template"]["spec"]),
            "ckpt-local"
        )["mountPath"],
        "/checkpoints"
    );
}

#[test]
fn a_policy_edit_that_does_not_touch_the_workload_changes_nothing() {
    let (obj, ns) = sts_fixture();
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let raised = profile(|p| p.max_nodes = Some(64));
    let again = mutated(&first.object, Some(&ns), &raised);
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
    // A policy edit that does touch it, or a new sidecar image, waits for the
    // user's next real change: an upgrade never rolls running training.
    let nccl = profile(|p| {
        p.nccl.insert(
            "NCCL_DEBUG".into(),
            enforced("WARN".to_string(), Enforce::Default),
        );
        p.sidecar.image = enforced("registry.example/sidecar:9".to_string(), Enforce::Default);
    });
    let untouched = mutated(&first.object, Some(&ns), &nccl);
    assert!(untouched.patch.0.is_empty(), "{:?}", untouched.patch);
    // A label (not an input of the injection) is no real change either: the
    // template stays; only the workload's own injected label, which the
    // new label map dropped, is put back.
    let mut labelled = first.object.clone();
    labelled["metadata"]["labels"] = json!({"team": "ml"});
    let untouched = mutated(&labelled, Some(&ns), &nccl);
    let paths: Vec<String> = untouched
        .patch
        .0
        .iter()
        .map(|op| op.path().to_string())
        .collect();
    assert_eq!(paths, ["/metadata/labels/trainwire.dev~1injected"]);
    let mut kept = labelled.clone();
    kept["metadata"]["labels"]["trainwire.dev/injected"] = json!("true");
    assert!(mutated(&kept, Some(&ns), &nccl).patch.0.is_empty());
    // A real change (replicas 2 -> 3) re-injects with the current settings.
    let mut scaled = first.object.clone();
    scaled["spec"]["replicas"] = json!(3);
    let changed = check_round_trip(&scaled, Some(&ns), &nccl);
    assert_eq!(
        trainer_value(&changed.object, "NCCL_DEBUG").as_deref(),
        Some("WARN")
    );
    assert_eq!(
        trainer_value(&changed.object, "PET_NNODES").as_deref(),
        Some("3")
    );
    assert_eq!(
        sidecar_of(&changed.object["spec"]["template"]["spec"])["image"],
        "registry.example/sidecar:9"
    );
}

/// A Job that arrived `NonIndexed` records the value it replaced, so its
/// re-admission strips back to the input that was hashed: the same input is
/// a no-op even under another policy or sidecar image, as for any workload.
#[rstest]
#[case("job-create-no-completion-mode.json")]
#[case("job-apply-no-completion-mode.json")]
#[case("job-nonindexed-create.json")]
fn a_nonindexed_job_keeps_its_injection_under_a_new_policy(#[case] name: &str) {
    let (obj, ns) = fixture(name);
    let first = mutated(&obj, Some(&ns), &Profile::default());
    let st = status_of(&first.object);
    assert!(
        st.fields.iter().any(|f| f == "completionMode=NonIndexed"),
        "{:?}",
        st.fields
    );
    let upgraded = profile(|p| {
        p.sidecar.image = enforced("registry.example/sidecar:9".to_string(), Enforce::Default);
    });
    let again = mutated(&first.object, Some(&ns), &upgraded);
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
}

fn status_of(obj: &Value) -> status::Status {
    let raw = obj["spec"]["template"]["metadata"]["annotations"]["trainwire.dev/status"]
        .as_str()
        .expect("status annotation");
    serde_json::from_str(raw).expect("status")
}

/// The injected sidecar's startupProbe holds the trainer until the sidecar
/// serves `/readyz` (a native sidecar without one lets the kubelet start the
/// next container at once). An object injected before the probe existed
/// keeps its sidecar on an update that changes nothing the user controls
/// (an upgrade never rolls training), and gets the probe, replacing the old
/// sidecar, at the user's next real change.
#[test]
fn the_sidecar_has_a_startup_probe_and_old_injections_keep_theirs_until_a_real_change() {
    let (obj, ns) = sts_fixture();
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    let sidecar = sidecar_of(&m.object["spec"]["template"]["spec"]);
    assert_eq!(sidecar["name"], "trainwire-sidecar");
    assert_eq!(
        sidecar["startupProbe"],
        json!({
            "httpGet": {"path": "/readyz", "port": 29600, "scheme": "HTTP"},
            "periodSeconds": 1, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 60,
        })
    );

    // What an engine without the probe wrote: its sidecar, its fingerprint.
    let mut old = m.object.clone();
    let old_sidecar = {
        let s = old["spec"]["template"]["spec"]["initContainers"]
            .as_array_mut()
            .and_then(|c| c.iter_mut().find(|c| c["name"] == "trainwire-sidecar"))
            .expect("sidecar");
        s.as_object_mut().expect("sidecar").remove("startupProbe");
        s.clone()
    };
    let typed: k8s_openapi::api::core::v1::Container =
        serde_json::from_value(old_sidecar.clone()).expect("container");
    let mut st = status_of(&old);
    st.init_containers
        .insert("trainwire-sidecar".into(), fingerprint::fingerprint(&typed));
    old["spec"]["template"]["metadata"]["annotations"]["trainwire.dev/status"] =
        json!(serde_json::to_string(&st).expect("json"));

    let kept = mutated(&old, Some(&ns), &Profile::default());
    assert!(kept.patch.0.is_empty(), "{:?}", kept.patch);

    let mut scaled = old.clone();
    scaled["spec"]["replicas"] = json!(3);
    let changed = check_round_trip(&scaled, Some(&ns), &Profile::default());
    let inits = changed.object["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .expect("init containers");
    // The rendezvous handler's installer and the sidecar.
    assert_eq!(inits.len(), 2, "{inits:?}");
    assert_eq!(
        sidecar_of(&changed.object["spec"]["template"]["spec"])["startupProbe"],
        sidecar["startupProbe"]
    );
}

/// Found by fuzzing `inject`: a workload whose name is not a DNS-1123 label
/// (here with a trailing no-break space) is refused, naming the name; its
/// pods' DNS names, and offline the Job's Service, could not be right.
#[rstest]
#[case::nbsp("eval-nonindexed\u{a0}")]
#[case::dot("a.b")]
#[case::upper("Train")]
#[case::long(&"a".repeat(64))]
fn a_workload_name_that_is_not_a_dns_label_is_refused(#[case] name: &str) {
    for fixture_name in ["job-nonindexed-create.json", "statefulset-create.json"] {
        let (mut obj, _) = fixture(fixture_name);
        obj["metadata"]["name"] = json!(name);
        let message = refusal(&obj, &Profile::default());
        assert!(
            message.contains(&format!("metadata.name {name:?} is not a DNS-1123 label")),
            "{message}"
        );
    }
}

#[rstest]
#[case("job-create-no-completion-mode.json", 2)]
#[case("job-apply-no-completion-mode.json", 2)]
#[case("job-nonindexed-create.json", 1)]
fn a_nonindexed_job_becomes_indexed_with_a_warning(#[case] name: &str, #[case] size: i64) {
    let (obj, ns) = fixture(name);
    assert_eq!(obj["spec"]["completionMode"], "NonIndexed");
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    assert_eq!(m.object["spec"]["completionMode"], "Indexed");
    assert_eq!(m.object["spec"]["completions"], size);
    assert_eq!(
        trainer_value(&m.object, "PET_NNODES").as_deref(),
        Some(size.to_string().as_str())
    );
    assert_eq!(m.warnings[0], workload::NON_INDEXED_WARNING);
    // Injecting the result again changes nothing.
    let again = mutated(&m.object, Some(&ns), &Profile::default());
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
}

#[test]
fn a_statefulset_created_at_zero_replicas_never_gets_a_world_of_zero() {
    let (obj, ns) = fixture("statefulset-create-zero-replicas.json");
    assert_eq!(obj["spec"]["replicas"], 0);
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    for var in ["PET_NNODES", "WORLD_SIZE", "NNODES"] {
        assert_eq!(trainer_value(&m.object, var), None, "{var}");
    }
    let sidecar = sidecar_of(&m.object["spec"]["template"]["spec"]);
    assert!(
        !sidecar["env"].to_string().contains("TRAINWIRE_NNODES"),
        "{sidecar}"
    );
    let status = status::read(
        &serde_json::from_value(m.object["spec"]["template"].clone()).expect("template"),
    )
    .expect("status");
    assert_eq!(status.nnodes, "");
    assert!(
        m.warnings.iter().any(|w| w.contains("replicas 0")),
        "{:?}",
        m.warnings
    );
    // Scaled up through a path that re-injects: the right world.
    let mut up = m.object.clone();
    up["spec"]["replicas"] = json!(3);
    let m3 = check_round_trip(&up, Some(&ns), &Profile::default());
    assert_eq!(
        trainer_value(&m3.object, "PET_NNODES").as_deref(),
        Some("3")
    );
    // With the annotation, the paused StatefulSet already holds its world.
    let mut annotated = obj.clone();
    annotated["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("4");
    let m4 = check_round_trip(&annotated, Some(&ns), &Profile::default());
    assert_eq!(
        trainer_value(&m4.object, "PET_NNODES").as_deref(),
        Some("4")
    );
}

// ---- issue 11 regressions: one grammar, compared by value ----

fn with_checkpoint(pairs: &[(&str, &str)]) -> Value {
    let mut all = vec![("trainwire.dev/checkpoint-pvc", "ckpt")];
    all.extend_from_slice(pairs);
    with_annotations(&all)
}

#[rstest]
#[case::duration_in_another_spelling(
    profile(|p| p.checkpoint_max_age = enforced("30m".parse().expect("duration"), Enforce::Refuse)),
    with_checkpoint(&[("trainwire.dev/checkpoint-max-age", "1800s")])
)]
#[case::go_duration_in_the_policy(
    profile(|p| p.checkpoint_max_age = enforced("1h30m".parse().expect("duration"), Enforce::Refuse)),
    with_checkpoint(&[("trainwire.dev/checkpoint-max-age", "90m")])
)]
#[case::size_in_another_unit(
    profile(|p| p.shm_size = enforced("64Gi".parse().expect("size"), Enforce::Refuse)),
    with_annotations(&[("trainwire.dev/shm-size", "65536Mi")])
)]
#[case::path_with_a_trailing_slash(
    profile(|p| p.checkpoint_path = enforced("/ckpt".parse().expect("path"), Enforce::Refuse)),
    with_checkpoint(&[("trainwire.dev/checkpoint-path", "//ckpt/")])
)]
fn enforced_settings_compare_by_value(#[case] p: Profile, #[case] obj: Value) {
    let m = mutated(&obj, None, &p);
    assert!(
        m.warnings.iter().all(|w| !w.contains("overwritten")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn the_sidecar_gets_the_max_age_in_the_contract_grammar() {
    let obj = with_checkpoint(&[("trainwire.dev/checkpoint-max-age", "5400s")]);
    let m = mutated(&obj, None, &Profile::default());
    let sidecar = &sidecar_of(&m.object["spec"]["template"]["spec"])["env"];
    let age = sidecar
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "TRAINWIRE_CHECKPOINT_MAX_AGE")
        .and_then(|e| e["value"].as_str());
    assert_eq!(age, Some("1h30m"));
}

fn with_status(raw: &str) -> Value {
    let (mut obj, _) = sts_fixture();
    obj["spec"]["template"]["metadata"]["annotations"]["trainwire.dev/status"] = json!(raw);
    obj
}

#[test]
fn an_unreadable_status_is_handled_the_same_on_every_pass() {
    for raw in ["", "not json", "{\"hash\": 3}", "[]", "null"] {
        let first = mutated(&with_status(raw), None, &Profile::default());
        let second = mutated(&first.object, None, &Profile::default());
        assert!(second.patch.0.is_empty(), "{raw:?}: {:?}", second.patch);
        assert_eq!(second.object, first.object, "{raw:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// `mutate` is idempotent whatever the status annotation holds.
    #[test]
    fn mutate_is_idempotent_on_any_status_annotation(raw in "\\PC{0,40}") {
        let first = mutated(&with_status(&raw), None, &Profile::default());
        let second = mutated(&first.object, None, &Profile::default());
        prop_assert!(second.patch.0.is_empty(), "{:?}: {:?}", raw, second.patch);
    }
}

/// A profile with dead-node reclaim on.
fn reclaiming() -> Profile {
    profile(|p| {
        p.node_failure = Some(crate::policy::NodeFailurePolicy {
            reclaim_after: "30s".parse().expect("duration"),
            action: Default::default(),
            max_pods_per_minute: 10,
        });
    })
}

fn job_with(f: impl FnOnce(&mut Value)) -> Value {
    let (mut obj, _) = fixture("job-indexed-create.json");
    f(&mut obj);
    obj
}

/// Node loss is not a script failure: which Jobs get the `DisruptionTarget`
/// rule (docs/failures.md), what the status records, and what is warned.
#[rstest]
// The real capture (restartPolicy Never, podReplacementPolicy defaulted to
// TerminatingOrFailed by the apiserver) under a reclaiming profile.
#[case::never_reclaim(reclaiming(), job_with(|_| {}), true, Some("Failed"),
    Some("podReplacementPolicy=TerminatingOrFailed"), None)]
// Offline: no podReplacementPolicy at all.
#[case::never_reclaim_offline(reclaiming(), job_with(|o| { o["spec"].as_object_mut().map(|s| s.remove("podReplacementPolicy")); }),
    true, Some("Failed"), Some("podReplacementPolicy"), None)]
// Without reclaim, Failed would leave a Job on a dead node without a replacement.
#[case::never_no_reclaim(Profile::default(), job_with(|_| {}), false, Some("TerminatingOrFailed"), None, None)]
// restartPolicy OnFailure: the API refuses a podFailurePolicy.
#[case::on_failure(reclaiming(), fixture("job-create-no-completion-mode.json").0, false, Some("TerminatingOrFailed"), None, None)]
// The manifest's own policy is kept; without a DisruptionTarget rule, a warning.
#[case::own_policy(reclaiming(), job_with(|o| { o["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}); o["spec"]["podReplacementPolicy"] = json!("Failed"); }),
    false, Some("Failed"), None,
    Some("spec.podFailurePolicy (kept) has no DisruptionTarget rule: a pod lost with its node counts against backoffLimit"))]
#[case::own_policy_with_rule(reclaiming(), job_with(|o| { o["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}); o["spec"]["podReplacementPolicy"] = json!("Failed"); }),
    false, Some("Failed"), None, None)]
#[case::own_policy_no_reclaim(Profile::default(), job_with(|o| { o["spec"]["podFailurePolicy"] = json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}); o["spec"]["podReplacementPolicy"] = json!("Failed"); }),
    false, Some("Failed"), None,
    Some("spec.podFailurePolicy without the policy's nodeFailure reclaim: a pod on a dead node is never replaced"))]
fn jobs_get_the_disruption_rule_only_with_reclaim(
    #[case] profile: Profile,
    #[case] obj: Value,
    #[case] injected: bool,
    #[case] replacement: Option<&str>,
    #[case] field: Option<&str>,
    #[case] warning: Option<&str>,
) {
    let own = obj["spec"].get("podFailurePolicy").cloned();
    let m = check_round_trip(&obj, Some("trainwire-test"), &profile);
    let spec = &m.object["spec"];
    assert_eq!(spec["podReplacementPolicy"].as_str(), replacement, "{spec}");
    if injected {
        assert_eq!(
            spec["podFailurePolicy"],
            json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]})
        );
    } else {
        assert_eq!(spec.get("podFailurePolicy").cloned(), own);
    }
    let status = status::read(&serde_json::from_value(spec["template"].clone()).expect("template"))
        .expect("status");
    assert_eq!(
        status.fields.iter().any(|f| f == "podFailurePolicy"),
        injected,
        "{:?}",
        status.fields
    );
    if let Some(field) = field {
        assert!(
            status.fields.iter().any(|f| f == field),
            "{:?}",
            status.fields
        );
    }
    let warned: Vec<&String> = m
        .warnings
        .iter()
        .filter(|w| w.contains("podFailurePolicy"))
        .collect();
    assert_eq!(
        warned.first().map(|w| w.as_str()),
        warning,
        "{:?}",
        m.warnings
    );
}

#[test]
fn the_disruption_rule_patch_on_the_real_capture_is_exact() {
    let (obj, ns) = fixture("job-indexed-create.json");
    let m = mutated(&obj, Some(&ns), &reclaiming());
    let ops: Vec<Value> = serde_json::to_value(&m.patch)
        .expect("patch")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|op| {
            op["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/spec/pod"))
        })
        .collect();
    assert_eq!(
        ops,
        vec![
            json!({"op": "add", "path": "/spec/podFailurePolicy", "value": {"rules": [{"action": "Ignore", "onPodConditions": [{"status": "True", "type": "DisruptionTarget"}]}]}}),
            json!({"op": "replace", "path": "/spec/podReplacementPolicy", "value": "Failed"}),
        ]
    );
}

/// One edit of a typed workload, for the typed diff's oracle below.
#[derive(Clone, Debug)]
enum Edit {
    InsertEnv(usize),
    RemoveEnv(usize),
    ChangeEnv(usize),
    SwapEnv(usize, usize),
    DropAllEnv,
    Annotation(u8),
    Label(u8),
    Replicas(i32),
    PushVolume(u8),
    RemoveVolume(usize),
    PushInit(u8),
    RemoveInit(usize),
    ShareProcessNamespace(Option<bool>),
    Toleration(u8),
    Image(u8),
    Hostname(u8),
    MemoryLimit(u8),
    PushContainer(u8),
    MountAt(usize, u8),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (0usize..40).prop_map(Edit::InsertEnv),
        (0usize..40).prop_map(Edit::RemoveEnv),
        (0usize..40).prop_map(Edit::ChangeEnv),
        (0usize..40, 0usize..40).prop_map(|(a, b)| Edit::SwapEnv(a, b)),
        Just(Edit::DropAllEnv),
        any::<u8>().prop_map(Edit::Annotation),
        any::<u8>().prop_map(Edit::Label),
        (0i32..9).prop_map(Edit::Replicas),
        any::<u8>().prop_map(Edit::PushVolume),
        (0usize..6).prop_map(Edit::RemoveVolume),
        any::<u8>().prop_map(Edit::PushInit),
        (0usize..4).prop_map(Edit::RemoveInit),
        prop_oneof![Just(None), Just(Some(true)), Just(Some(false))]
            .prop_map(Edit::ShareProcessNamespace),
        any::<u8>().prop_map(Edit::Toleration),
        any::<u8>().prop_map(Edit::Image),
        any::<u8>().prop_map(Edit::Hostname),
        any::<u8>().prop_map(Edit::MemoryLimit),
        any::<u8>().prop_map(Edit::PushContainer),
        (0usize..6, any::<u8>()).prop_map(|(i, n)| Edit::MountAt(i, n)),
    ]
}

fn apply_edit(w: &mut workload::Workload, e: &Edit) {
    use k8s_openapi::api::core::v1::{Container, EnvVar, Toleration, Volume, VolumeMount};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let workload::Workload::StatefulSet(s) = w else {
        return;
    };
    let Some(spec) = s.spec.as_mut() else {
        return;
    };
    if let Edit::Replicas(r) = e {
        spec.replicas = Some(*r);
        return;
    }
    let template = &mut spec.template;
    let meta = template.metadata.get_or_insert_with(Default::default);
    match e {
        Edit::Annotation(n) => {
            let map = meta.annotations.get_or_insert_with(Default::default);
            let key = format!("a/{}", n % 5);
            if map.remove(&key).is_none() {
                map.insert(key, format!("v{n}"));
            }
            return;
        }
        Edit::Label(n) => {
            let map = meta.labels.get_or_insert_with(Default::default);
            map.insert(format!("l{}", n % 3), format!("v{n}"));
            return;
        }
        _ => {}
    }
    let Some(pod) = template.spec.as_mut() else {
        return;
    };
    let len = |v: &Option<Vec<EnvVar>>| v.as_ref().map_or(0, Vec::len);
    match e {
        Edit::InsertEnv(i) => {
            let env = pod.containers[0].env.get_or_insert_with(Vec::new);
            let at = i % (env.len() + 1);
            env.insert(
                at,
                EnvVar {
                    name: format!("NEW_{i}_{}", env.len()),
                    value: Some(format!("{i}")),
                    value_from: None,
                },
            );
        }
        Edit::RemoveEnv(i) if len(&pod.containers[0].env) > 0 => {
            let env = pod.containers[0].env.get_or_insert_with(Vec::new);
            let at = i % env.len();
            env.remove(at);
        }
        Edit::ChangeEnv(i) if len(&pod.containers[0].env) > 0 => {
            let env = pod.containers[0].env.get_or_insert_with(Vec::new);
            let at = i % env.len();
            env[at].value = Some(format!("changed-{i}"));
        }
        Edit::SwapEnv(a, b) if len(&pod.containers[0].env) > 0 => {
            let env = pod.containers[0].env.get_or_insert_with(Vec::new);
            let n = env.len();
            env.swap(a % n, b % n);
        }
        Edit::DropAllEnv => pod.containers[0].env = None,
        Edit::PushVolume(n) => pod.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: format!("vol-{n}"),
            empty_dir: Some(Default::default()),
            ..Default::default()
        }),
        Edit::RemoveVolume(i) => {
            if let Some(v) = pod.volumes.as_mut().filter(|v| !v.is_empty()) {
                let at = i % v.len();
                v.remove(at);
            }
        }
        Edit::PushInit(n) => pod
            .init_containers
            .get_or_insert_with(Vec::new)
            .push(Container {
                name: format!("init-{n}"),
                image: Some("busybox".into()),
                ..Default::default()
            }),
        Edit::RemoveInit(i) => {
            if let Some(v) = pod.init_containers.as_mut().filter(|v| !v.is_empty()) {
                let at = i % v.len();
                v.remove(at);
            }
        }
        Edit::ShareProcessNamespace(v) => pod.share_process_namespace = *v,
        Edit::Toleration(n) => pod
            .tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                key: Some(format!("k{n}")),
                operator: Some("Exists".into()),
                ..Default::default()
            }),
        Edit::Image(n) => pod.containers[0].image = Some(format!("img:{n}")),
        Edit::Hostname(n) => pod.hostname = Some(format!("h{n}")),
        Edit::MemoryLimit(n) => {
            pod.containers[0]
                .resources
                .get_or_insert_with(Default::default)
                .limits
                .get_or_insert_with(Default::default)
                .insert(
                    "memory".into(),
                    Quantity(format!("{}Mi", u32::from(*n) + 1)),
                );
        }
        Edit::PushContainer(n) => pod.containers.push(Container {
            name: format!("extra-{n}"),
            ..Default::default()
        }),
        Edit::MountAt(i, n) => {
            let mounts = pod.containers[0].volume_mounts.get_or_insert_with(Vec::new);
            let at = i % (mounts.len() + 1);
            mounts.insert(
                at,
                VolumeMount {
                    name: format!("m{n}"),
                    mount_path: format!("/m/{n}/{at}"),
                    ..Default::default()
                },
            );
        }
        _ => {}
    }
}

fn as_json(w: &workload::Workload) -> Value {
    match w {
        workload::Workload::StatefulSet(s) => serde_json::to_value(s),
        workload::Workload::Job(j) => serde_json::to_value(j),
    }
    .expect("json")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// The typed diff against an oracle: for any edits of a typed workload
    /// (env inserted, removed, changed or reordered, annotations, labels,
    /// volumes, init containers, tolerations, resources, other fields), the
    /// patch applied to the JSON of the before (with the checks a
    /// kube-apiserver makes) gives exactly the JSON of the after.
    #[test]
    fn the_typed_diff_turns_before_into_after(
        before_edits in proptest::collection::vec(edit(), 0..8),
        edits in proptest::collection::vec(edit(), 1..12),
    ) {
        let (obj, _) = sts_fixture();
        let mut before = workload::Workload::from_json("StatefulSet", obj).expect("typed");
        for e in &before_edits {
            apply_edit(&mut before, e);
        }
        let mut after = before.clone();
        for e in &edits {
            apply_edit(&mut after, e);
        }
        let (left, right) = (as_json(&before), as_json(&after));
        let ops = super::diff::diff(before, after);
        let patch = ops.to_patch();
        prop_assert_eq!(apply_checked(&left, &patch), Ok(right), "{:?}", patch);
        // The text the answer carries is that patch, as json_patch writes it.
        let mut text = Vec::new();
        ops.write_json(&mut text).expect("write");
        let written: Value = serde_json::from_slice(&text).expect("the patch text is JSON");
        prop_assert_eq!(written, serde_json::to_value(&patch).expect("json"));
    }
}

/// On the host's network the apiserver's default `dnsPolicy: ClusterFirst`
/// gives the node's resolver: pod names would not resolve. trainwire sets
/// `ClusterFirstWithHostNet`, records it, and gives `ClusterFirst` back when
/// the pods leave the host's network.
#[test]
fn host_network_pods_get_the_cluster_dns() {
    let (mut obj, ns) = sts_fixture();
    let spec = &mut obj["spec"]["template"]["spec"];
    spec["hostNetwork"] = json!(true);
    spec["dnsPolicy"] = json!("ClusterFirst");
    let m = check_round_trip(&obj, Some(&ns), &Profile::default());
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(spec["dnsPolicy"], json!("ClusterFirstWithHostNet"));
    assert!(
        m.warnings
            .iter()
            .any(|w| w.starts_with("hostNetwork: dnsPolicy set to ClusterFirstWithHostNet")),
        "{:?}",
        m.warnings
    );

    // Off the host's network again: the user's ClusterFirst comes back.
    let mut off = m.object.clone();
    off["spec"]["template"]["spec"]["hostNetwork"] = json!(false);
    let back = check_round_trip(&off, Some(&ns), &Profile::default());
    assert_eq!(
        back.object["spec"]["template"]["spec"]["dnsPolicy"],
        json!("ClusterFirst")
    );

    // A resolver the user chose is kept, with a warning.
    let mut own = obj.clone();
    own["spec"]["template"]["spec"]["dnsPolicy"] = json!("Default");
    let kept = check_round_trip(&own, Some(&ns), &Profile::default());
    assert_eq!(
        kept.object["spec"]["template"]["spec"]["dnsPolicy"],
        json!("Default")
    );
    assert!(
        kept.warnings
            .iter()
            .any(|w| w.starts_with("hostNetwork with dnsPolicy Default (kept)")),
        "{:?}",
        kept.warnings
    );

    // Not on the host's network: untouched.
    let (plain, ns) = sts_fixture();
    let m = mutated(&plain, Some(&ns), &Profile::default());
    assert_eq!(
        m.object["spec"]["template"]["spec"].get("dnsPolicy"),
        plain["spec"]["template"]["spec"].get("dnsPolicy")
    );
}

/// Warnings are capped: the first [`MAX_WARNINGS`] distinct ones, then one
/// that counts the rest; duplicates are never repeated.
#[test]
fn warnings_are_capped_and_counted() {
    let profile = crate::policy::Profile::default();
    let mut ctx = Ctx::new(&profile);
    for i in 0..1000 {
        ctx.warn(format!("warning {i}"));
        ctx.warn(format!("warning {i}"));
    }
    let warnings = ctx.into_warnings();
    assert_eq!(warnings.len(), MAX_WARNINGS + 1);
    assert_eq!(warnings[0], "warning 0");
    assert_eq!(
        warnings.last().map(String::as_str),
        Some("968 more warnings are not shown")
    );
}

/// The bounds on a template's lists hold whatever the object's size: a
/// small object with 1,025 volumes is refused like a large one; 1,024 pass.
#[test]
fn templates_over_the_list_bounds_are_refused() {
    let (mut obj, ns) = fixture("statefulset-create.json");
    let volumes = |n: usize| -> Value {
        json!(
            (0..n)
                .map(|i| json!({"name": format!("v{i}"), "emptyDir": {}}))
                .collect::<Vec<_>>()
        )
    };
    obj["spec"]["template"]["spec"]["volumes"] = volumes(workload::MAX_VOLUMES);
    assert!(matches!(
        mutate(&obj, Some(&ns), &Profile::default()),
        Ok(Outcome::Mutated(_))
    ));
    obj["spec"]["template"]["spec"]["volumes"] = volumes(workload::MAX_VOLUMES + 1);
    let text = obj.to_string();
    assert_eq!(
        mutate(&obj, Some(&ns), &Profile::default()).err(),
        Some(Refusal::Workload(
            "the StatefulSet's pod template has 1025 volumes; trainwire injects into pods of at most 1024".to_string()
        ))
    );
    assert_eq!(
        workload::Outline::of(&text),
        Some(workload::Outline::Managed(workload::Sizes {
            volumes: 1025,
            containers: 1
        }))
    );
    let containers: Vec<Value> = (0..=workload::MAX_CONTAINERS)
        .map(|i| json!({"name": format!("c{i}"), "image": "x"}))
        .collect();
    obj["spec"]["template"]["spec"]["volumes"] = Value::Null;
    obj["spec"]["template"]["spec"]["initContainers"] = json!(containers);
    assert!(matches!(
        mutate(&obj, Some(&ns), &Profile::default()),
        Err(Refusal::Workload(m)) if m.contains("258 containers")
    ));
}

/// The outline of a workload's text: not managed without the opt-in
/// annotation or while being deleted; `None` for a shape it cannot read.
#[test]
fn outlines() {
    use workload::{Outline, Sizes};
    assert_eq!(Outline::of(r#"{"metadata":{}}"#), Some(Outline::NotManaged));
    assert_eq!(
        Outline::of(r#"{"metadata":{"annotations":{"trainwire.dev/inject":"true"}}}"#),
        Some(Outline::Managed(Sizes::default()))
    );
    assert_eq!(
        Outline::of(
            r#"{"metadata":{"annotations":{"trainwire.dev/inject":"true"},"deletionTimestamp":"2026-01-01T00:00:00Z"}}"#
        ),
        Some(Outline::NotManaged)
    );
    assert_eq!(
        Outline::of(
            r#"{"metadata":{"annotations":{"trainwire.dev/inject":"true"}},"spec":{"template":{"spec":{"volumes":null,"containers":[{},{}],"ephemeralContainers":[{}]}}}}"#
        ),
        Some(Outline::Managed(Sizes {
            volumes: 0,
            containers: 3
        }))
    );
    assert_eq!(
        Outline::of(r#"{"metadata":{"annotations":{"trainwire.dev/inject":"false"}}}"#),
        Some(Outline::NotManaged)
    );
    assert_eq!(
        Outline::of(r#"{"metadata":{"annotations":{"trainwire.dev/inject":"yes"}}}"#),
        None
    );
    assert_eq!(
        Outline::of(r#"{"spec":{"template":{"spec":{"volumes":7}}}}"#),
        None
    );
    assert_eq!(Outline::of("not json"), None);
}

/// An entry the engine edits without a field Kubernetes requires (found by
/// fuzzing: a re-injected object whose `/dev/shm` mount had lost its
/// `mountPath` got a patch that replaced a member the object did not have)
/// is refused, saying what is missing where.
#[test]
fn entries_without_required_fields_are_refused() {
    let (obj, ns) = fixture("statefulset-create.json");
    let cases = [
        (
            "/spec/template/spec/containers/0/volumeMounts",
            json!([{"name": "trainwire-shm"}]),
            "a volumeMount without mountPath (container \"trainer\", volumeMounts 0)",
        ),
        (
            "/spec/template/spec/containers/0/volumeMounts",
            json!([{"mountPath": "/x", "name": ""}]),
            "a volumeMount without name (container \"trainer\", volumeMounts 0)",
        ),
        (
            "/spec/template/spec/containers/0/env",
            json!([{"value": "1"}]),
            "an env entry without a name (container \"trainer\", env 0)",
        ),
        (
            "/spec/template/spec/volumes",
            json!([{"emptyDir": {}}]),
            "a volume without a name (volumes 0)",
        ),
    ];
    for (path, value, what) in cases {
        let mut o = obj.clone();
        if let Some(slot) = o.pointer_mut(path) {
            *slot = value;
        } else {
            let (parent, key) = path.rsplit_once('/').unwrap_or_default();
            o.pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .map(|m| m.insert(key.to_string(), value));
        }
        assert_eq!(
            mutate(&o, Some(&ns), &Profile::default()).err(),
            Some(Refusal::Workload(format!(
                "the StatefulSet's pod template has {what}; Kubernetes requires it"
            ))),
            "{path}"
        );
    }
}

/// Found by fuzzing: a Job that arrived `NonIndexed` (so its re-admission
/// recomputes the injection) with an empty field of the user's lost that
/// field on re-admission, and got a new status hash. Empty user fields are
/// the user's: kept on the first injection and on every later one, for
/// Jobs and StatefulSets alike.
#[rstest]
#[case::requests("/spec/template/spec/containers/0", "resources", json!({"requests": {}}))]
#[case::limits("/spec/template/spec/containers/0", "resources", json!({"limits": {}}))]
#[case::both("/spec/template/spec/containers/0", "resources", json!({"limits": {}, "requests": {}}))]
#[case::env("/spec/template/spec/containers/0", "env", json!([]))]
#[case::mounts("/spec/template/spec/containers/0", "volumeMounts", json!([]))]
#[case::volumes("/spec/template/spec", "volumes", json!([]))]
#[case::init_containers("/spec/template/spec", "initContainers", json!([]))]
#[case::tolerations("/spec/template/spec", "tolerations", json!([]))]
#[case::node_selector("/spec/template/spec", "nodeSelector", json!({}))]
fn empty_user_fields_are_kept_on_reinjection(
    #[case] parent: &str,
    #[case] key: &str,
    #[case] value: Value,
) {
    for name in [
        "job-create-no-completion-mode.json",
        "job-apply-no-completion-mode.json",
        "job-nonindexed-create.json",
        "job-indexed-create.json",
        "statefulset-create.json",
    ] {
        let (mut obj, ns) = fixture(name);
        let at = obj.pointer_mut(parent).expect("parent");
        at[key] = value.clone();
        let m = check_round_trip(&obj, Some(&ns), &Profile::default());
        // Still there when trainwire adds nothing to it.
        let out = &m.object.pointer(parent).expect("parent")[key];
        if out.as_array().is_some_and(Vec::is_empty)
            || out.as_object().is_some_and(serde_json::Map::is_empty)
            || value.get("limits").is_some()
        {
            assert_eq!(out, &value, "{name}: {parent}/{key}");
        }
    }
}

/// What offline `inject` says about objects the engine passes through.
#[test]
fn objects_meant_for_trainwire_but_not_managed_are_named() {
    let warned = |v: Value| not_managed_warnings(&v);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"trainwire.dev/inject": "true"}}});
    assert_eq!(
        warned(deployment),
        vec!["trainwire.dev/inject is ignored on kind Deployment: trainwire injects only apps/v1 StatefulSets and batch/v1 Jobs".to_string()]
    );
    let old = json!({"apiVersion": "apps/v1beta2", "kind": "StatefulSet",
        "metadata": {"name": "x", "annotations": {"trainwire.dev/inject": true}}});
    assert!(warned(old)[0].contains("kind apps/v1beta2 StatefulSet"));
    let not_opted = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {"trainwire.dev/inject": "false"}}});
    assert!(warned(not_opted).is_empty());
    let template = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"template": {"metadata": {"annotations": {"trainwire.dev/inject": "true"}}}}});
    assert_eq!(
        warned(template),
        vec!["trainwire.dev/inject is on the pod template: not injected; put it in the Job's own metadata.annotations".to_string()]
    );
    for w in [
        workload::ORDERED_READY_WARNING,
        workload::NON_INDEXED_WARNING,
    ] {
        check_warning(w);
    }
}

/// Injecting `obj` gives a warning that starts with `expected` (and every
/// warning fits, checked by [`mutated`]).
fn assert_warns(obj: &Value, ns: &str, expected: &str) {
    let m = mutated(obj, Some(ns), &Profile::default());
    assert!(
        m.warnings.iter().any(|w| w.starts_with(expected)),
        "{expected:?} not in {:?}",
        m.warnings
    );
}

/// Each warning the other tests here do not produce, produced once, so that
/// every warning the engine gives is checked against [`MAX_WARNING_LEN`]
/// (by [`mutated`]).
#[rstest]
#[case::gpus(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/gpus-per-node"] = json!("4");
    o["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
}, "container \"trainer\" asks for nvidia.com/gpu 8 (kept)")]
#[case::checkpoint_path(|o: &mut Value| {
    if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
        a.remove("trainwire.dev/checkpoint-pvc");
    }
    o["metadata"]["annotations"]["trainwire.dev/checkpoint-path"] = json!("/ckpt");
}, "trainwire.dev/checkpoint-path set but no checkpoint volume")]
#[case::shm_kept(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/shm-size"] = json!("16Gi");
    o["spec"]["template"]["spec"]["volumes"] = json!([{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]);
    o["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "dshm", "mountPath": "/dev/shm"}]);
}, "the volume \"dshm\" mounted at /dev/shm (64Gi) kept")]
#[case::own_init_container(|o: &mut Value| {
    o["spec"]["template"]["spec"]["initContainers"] = json!([{"name": "trainwire-sidecar", "image": "x"}]);
}, "init container \"trainwire-sidecar\" was not written by trainwire")]
#[case::no_shared_pids(|o: &mut Value| {
    o["spec"]["template"]["spec"]["shareProcessNamespace"] = json!(false);
}, "shareProcessNamespace: false (kept)")]
#[case::tensorflow_without_script(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/framework"] = json!("tensorflow");
    o["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["/usr/local/bin/trainer"]);
    o["spec"]["template"]["spec"]["containers"][0]["args"] = json!([]);
}, "tensorflow: no Python script in the trainer's command")]
#[case::torchrun_annotation_with_tensorflow(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/framework"] = json!("tensorflow");
    o["metadata"]["annotations"]["trainwire.dev/max-restarts"] = json!("5");
}, "annotation trainwire.dev/max-restarts is for torchrun")]
#[case::spares_short(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("2");
    o["metadata"]["annotations"]["trainwire.dev/spares"] = json!("2");
    o["spec"]["replicas"] = json!(3);
}, "spec.replicas 3 holds 1 of the 2 spares")]
#[case::spares_on_pod0_store(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("2");
    o["metadata"]["annotations"]["trainwire.dev/spares"] = json!("1");
    o["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("pod0");
    o["spec"]["replicas"] = json!(3);
}, "spares replace any lost node but pod 0")]
#[case::short_join_timeout(|o: &mut Value| {
    o["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "PET_RDZV_CONF", "value": "join_timeout=60"}]);
}, "env PET_RDZV_CONF of container \"trainer\": join_timeout=60 is below")]
#[case::rdzv_conf_reference(|o: &mut Value| {
    o["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{"name": "PET_RDZV_CONF", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]);
}, "env PET_RDZV_CONF of container \"trainer\" is a reference")]
fn every_other_warning_fits_in_a_terminal_line(
    #[case] edit: fn(&mut Value),
    #[case] expected: &str,
) {
    let (mut obj, ns) = sts_fixture();
    obj["spec"]["podManagementPolicy"] = json!("Parallel");
    edit(&mut obj);
    assert_warns(&obj, &ns, expected);
}

/// The Job warnings the other tests do not produce.
#[rstest]
#[case::completions(|o: &mut Value| {
    o["spec"]["completions"] = json!(3);
}, "spec.completions 3 differs from spec.parallelism 2")]
#[case::success_policy(|o: &mut Value| {
    o["metadata"]["annotations"]["trainwire.dev/nnodes"] = json!("2");
    o["metadata"]["annotations"]["trainwire.dev/spares"] = json!("1");
    o["spec"]["parallelism"] = json!(3);
    o["spec"]["completions"] = json!(3);
    o["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 3}]});
}, "spec.successPolicy (kept) has no rule succeededCount <= 2")]
fn every_other_job_warning_fits_in_a_terminal_line(
    #[case] edit: fn(&mut Value),
    #[case] expected: &str,
) {
    let (mut obj, ns) = fixture("job-indexed-create.json");
    obj["spec"]["parallelism"] = json!(2);
    obj["spec"]["completions"] = json!(2);
    edit(&mut obj);
    assert_warns(&obj, &ns, expected);
}

/// A world of 2 with one hot spare and a dedicated store (3 pods).
fn spare_sts() -> Value {
    with_annotations(&[
        ("trainwire.dev/nnodes", "2"),
        ("trainwire.dev/spares", "1"),
        ("trainwire.dev/rdzv-store", "dedicated"),
    ])
    .pipe(|mut o| {
        o["spec"]["replicas"] = json!(3);
        o["spec"]["podManagementPolicy"] = json!("Parallel");
        o
    })
}

#[test]
fn spares_and_a_dedicated_store_point_every_node_at_the_store() {
    let m = check_round_trip(&spare_sts(), None, &Profile::default());
    let o = &m.object;
    assert_eq!(
        trainer_value(o, "PET_RDZV_ENDPOINT").as_deref(),
        Some("llama-ft-rdzv.trainwire-test.svc.cluster.local:29500")
    );
    assert_eq!(
        trainer_value(o, "PET_RDZV_CONF").as_deref(),
        Some("keep_alive_interval=1,keep_alive_max_attempt=3,is_host=false")
    );
    // The world stays 2; the third pod is the spare.
    assert_eq!(trainer_value(o, "PET_NNODES").as_deref(), Some("2"));
    assert_eq!(trainer_value(o, "WORLD_SIZE").as_deref(), Some("2"));
    assert_eq!(o["spec"]["replicas"], json!(3));
    assert_eq!(sidecar_value(o, "TRAINWIRE_SPARES").as_deref(), Some("1"));
    assert_eq!(
        sidecar_value(o, "TRAINWIRE_RDZV_HOST_RANK").as_deref(),
        Some("none")
    );
    // The store's port: its connections (every agent's keep-alive) are not
    // the collective's.
    assert_eq!(
        sidecar_value(o, "TRAINWIRE_RDZV_PORT").as_deref(),
        Some("29500")
    );
    let status =
        status::read(&serde_json::from_value(o["spec"]["template"].clone()).expect("template"))
            .expect("status");
    assert_eq!(
        (status.spares, status.rdzv_store.as_str()),
        (1, "llama-ft-rdzv")
    );
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
}

/// Without `trainwire.dev/nnodes`, the world is the pods less the spares.
#[test]
fn spares_come_out_of_replicas_when_nnodes_is_not_given() {
    let obj = with_annotations(&[
        ("trainwire.dev/spares", "1"),
        ("trainwire.dev/rdzv-store", "dedicated"),
    ])
    .pipe(|mut o| {
        o["spec"]["replicas"] = json!(3);
        o
    });
    let m = mutated(&obj, None, &Profile::default());
    assert_eq!(trainer_value(&m.object, "PET_NNODES").as_deref(), Some("2"));
    assert_eq!(m.object["spec"]["replicas"], json!(3));
}

/// The status hash covers the topology: changing the spares or the store
/// re-injects.
#[test]
fn the_topology_is_part_of_the_input_hash() {
    let m = mutated(&spare_sts(), None, &Profile::default());
    let mut changed = m.object.clone();
    changed["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("pod0");
    let again = mutated(&changed, None, &Profile::default());
    assert_eq!(
        trainer_value(&again.object, "PET_RDZV_ENDPOINT").as_deref(),
        Some("llama-ft-0.llama-ft.trainwire-test.svc.cluster.local:29500")
    );
    assert_eq!(
        trainer_value(&again.object, "PET_RDZV_CONF").as_deref(),
        Some("keep_alive_interval=1,keep_alive_max_attempt=3")
    );
}

#[rstest]
#[case::spares_with_the_store_on_pod_0(
    with_annotations(&[("trainwire.dev/nnodes", "2"), ("trainwire.dev/spares", "1")]).pipe(|mut o| { o["spec"]["replicas"] = json!(3); o }),
    "spares replace any lost node but pod 0, whose loss stops the store: add trainwire.dev/rdzv-store: dedicated")]
#[case::a_spare_short(
    spare_sts().pipe(|mut o| { o["metadata"]["annotations"]["trainwire.dev/spares"] = json!("2"); o }),
    "spec.replicas 3 holds 1 of the 2 spares of trainwire.dev/spares: set it to 4")]
#[case::more_pods_than_world_and_spares(
    spare_sts().pipe(|mut o| { o["spec"]["replicas"] = json!(5); o }),
    "trainwire.dev/nnodes is 2 with 1 spares but spec.replicas is 5: the world leaves pods out until they agree")]
fn topology_warnings(#[case] obj: Value, #[case] warning: &str) {
    let m = mutated(&obj, None, &Profile::default());
    assert!(m.warnings.iter().any(|w| w == warning), "{:?}", m.warnings);
}

#[rstest]
#[case::spares_need_c10d(
    spare_sts().pipe(|mut o| { o["metadata"]["annotations"]["trainwire.dev/rdzv-backend"] = json!("static"); o["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("pod0"); o }),
    "annotation trainwire.dev/spares: \"1\" is not valid: spares wait in the c10d rendezvous, and the backend is static; accepted: 0, or spares with rdzv-backend c10d (the default)")]
#[case::a_dedicated_store_needs_c10d(
    with_annotations(&[("trainwire.dev/rdzv-store", "dedicated"), ("trainwire.dev/rdzv-backend", "static")]),
    "annotation trainwire.dev/rdzv-store: \"dedicated\" is not valid: a dedicated store is torch's c10d TCPStore, and the rendezvous backend is static; accepted: dedicated with rdzv-backend c10d (the default); etcd-v2's store is already outside the pods")]
#[case::no_training_node_left(
    with_annotations(&[("trainwire.dev/spares", "2"), ("trainwire.dev/rdzv-store", "dedicated")]),
    "StatefulSet llama-ft: spec.replicas 2 leaves no training node beside 2 spares (trainwire.dev/spares); set spec.replicas to nodes + spares, or annotate trainwire.dev/nnodes")]
#[case::tensorflow_has_no_spares(
    spare_sts().pipe(|mut o| { o["metadata"]["annotations"]["trainwire.dev/framework"] = json!("tensorflow"); o["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("pod0"); o }),
    "annotation trainwire.dev/spares: \"1\" is not valid: trainwire.dev/framework: tensorflow runs a fixed set of workers with no torchrun rendezvous; accepted: 0 with framework tensorflow, or framework pytorch (torchrun)")]
#[case::tensorflow_has_no_store(
    with_annotations(&[("trainwire.dev/framework", "tensorflow"), ("trainwire.dev/rdzv-store", "dedicated")]),
    "annotation trainwire.dev/rdzv-store: \"dedicated\" is not valid: trainwire.dev/framework: tensorflow runs a fixed set of workers with no torchrun rendezvous; accepted: pod0 with framework tensorflow, or framework pytorch (torchrun)")]
#[case::a_spare_count_out_of_bounds(
    with_annotations(&[("trainwire.dev/spares", "1025")]),
    "annotation trainwire.dev/spares: \"1025\" is not valid: more than 1024 spares; accepted: a whole number of spare pods from 0 to 1024, such as 1")]
#[case::a_store_name_too_long(
    with_annotations(&[("trainwire.dev/rdzv-store", "dedicated")]).pipe(|mut o| { o["metadata"]["name"] = json!("a".repeat(59)); o }),
    "StatefulSet aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: the dedicated store's Service would be named \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-rdzv\", which is not a DNS-1035 label (a letter first, at most 63 characters); shorten the name to at most 58 characters starting with a letter, or use trainwire.dev/rdzv-store: pod0")]
fn topology_refusals(#[case] obj: Value, #[case] message: &str) {
    assert_eq!(refusal(&obj, &Profile::default()), message);
}

/// The policy's default store applies where the workload says nothing;
/// an enforced one refuses the other choice.
#[test]
fn the_policy_sets_and_enforces_the_store() {
    let dedicated = profile(|p| {
        p.rdzv_store = Setting::default_value(trainwire_contract::RdzvStore::Dedicated)
    });
    let m = mutated(&sts_fixture().0, None, &dedicated);
    assert_eq!(
        trainer_value(&m.object, "PET_RDZV_ENDPOINT").as_deref(),
        Some("llama-ft-rdzv.trainwire-test.svc.cluster.local:29500")
    );
    let enforcing = profile(|p| {
        p.rdzv_store = enforced(trainwire_contract::RdzvStore::Dedicated, Enforce::Refuse)
    });
    assert_eq!(
        refusal(
            &with_annotations(&[("trainwire.dev/rdzv-store", "pod0")]),
            &enforcing
        ),
        "policy profile \"ml\" rule rdzvStore: annotation trainwire.dev/rdzv-store is \"pod0\", but the policy enforces \"dedicated\"; remove it or set it to that value"
    );
}

/// A Job with a spare: parallelism and completions hold the spare, the
/// Job succeeds when the world's nodes did (the spare's torchrun exits 1
/// when the rendezvous closes), and a backoffLimit below the spares is
/// warned.
#[test]
fn a_job_with_spares_succeeds_on_the_worlds_nodes() {
    let (mut job, ns) = fixture("job-indexed-create.json");
    job["metadata"]["annotations"]["trainwire.dev/spares"] = json!("1");
    job["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("dedicated");
    job["spec"]["parallelism"] = json!(3);
    job["spec"]["completions"] = json!(3);
    let m = check_round_trip(&job, Some(&ns), &Profile::default());
    assert_eq!(trainer_value(&m.object, "PET_NNODES").as_deref(), Some("2"));
    assert_eq!(
        m.object["spec"]["successPolicy"],
        json!({"rules": [{"succeededCount": 2}]})
    );
    assert!(
        m.warnings.iter().any(|w| w
            == "backoffLimit 0 is below the 1 spares, whose pods fail (exit 1) when the world ends: set it >= 1"),
        "{:?}",
        m.warnings
    );
    // One store loss fails every pod once: a budget below that is warned.
    assert!(
        m.warnings.iter().any(|w| w
            == "backoffLimit 0 is below the 3 pods, which all fail once if the rendezvous store is lost"),
        "{:?}",
        m.warnings
    );
    // The user's own rule is kept.
    job["spec"]["backoffLimit"] = json!(1);
    job["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 3}]});
    let m = mutated(&job, Some(&ns), &Profile::default());
    assert_eq!(
        m.object["spec"]["successPolicy"],
        json!({"rules": [{"succeededCount": 3}]})
    );
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("spec.successPolicy (kept) has no rule succeededCount <= 2")),
        "{:?}",
        m.warnings
    );
}

/// Fuzz finding (admission, seed 2211): a Job whose `successPolicy` has no
/// rules (`{}` or a map of anything else) was given a rule by a patch that
/// did not apply to the object as sent. The apiserver refuses such a Job
/// anyway: refused first, with the fix, whether injected before or not.
#[rstest]
#[case::first_injection(false)]
#[case::reinjection(true)]
fn a_success_policy_without_rules_is_refused(#[case] injected_before: bool) {
    let (mut job, ns) = fixture("job-indexed-create.json");
    job["metadata"]["annotations"]["trainwire.dev/spares"] = json!("1");
    job["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("dedicated");
    job["spec"]["parallelism"] = json!(3);
    job["spec"]["completions"] = json!(3);
    if injected_before {
        job = mutated(&job, Some(&ns), &Profile::default()).object;
    }
    for policy in [json!({}), json!({"group": "batch"})] {
        job["spec"]["successPolicy"] = policy;
        assert_eq!(
            refusal(&job, &Profile::default()),
            "Job bert-pretrain has a spec.successPolicy without rules, which Kubernetes refuses: add a rule or remove it"
        );
    }
}

/// Fuzz finding (inject, seed 2211, input 347,767): a trainer env that
/// names a variable twice, the first of which an enforced policy value
/// overwrites. trainwire replaces only the first entry of a name, so a
/// re-injection must strip only that one: the second, equal to the
/// enforced value, is the manifest's own. Injecting again changes nothing.
#[test]
fn a_repeated_env_name_under_an_enforced_value_is_stable() {
    let p = profile(|p| {
        p.nccl.insert(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING".into(),
            enforced("1".to_string(), Enforce::Overwrite),
        );
    });
    let (mut obj, _) = sts_fixture();
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "INFO"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
    ]);
    let m = check_round_trip(&obj, None, &p);
    let values: Vec<String> = trainer_env(&m.object)
        .into_iter()
        .filter(|(n, _)| n == "TORCH_NCCL_ASYNC_ERROR_HANDLING")
        .map(|(_, e)| e["value"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(values, ["1", "1"]);
}

fn enforced_shm() -> Profile {
    profile(|p| p.shm_size = enforced("64Gi".parse().expect("size"), Enforce::Overwrite))
}

/// The StatefulSet fixture whose pod has `volumes` and whose trainer mounts
/// `mounts`.
fn with_volumes(volumes: Value, mounts: Value) -> Value {
    let (mut obj, _) = sts_fixture();
    obj["spec"]["template"]["spec"]["volumes"] = volumes;
    obj["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = mounts;
    obj
}

/// An enforced `/dev/shm` size turns the volume mounted there into a memory
/// emptyDir in place (a second container sharing it at `/dev/shm` keeps
/// it); re-injection gives the user's volume back first, so the output is a
/// fixed point.
#[test]
fn an_enforced_shm_replaces_the_volume_mounted_only_there() {
    let mut obj = with_volumes(
        json!([
            {"name": "scratch", "hostPath": {"path": "/mnt/shm"}},
            {"name": "cache", "emptyDir": {}},
        ]),
        json!([{"name": "scratch", "mountPath": "/dev/shm/"}]),
    );
    obj["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
        .push(json!({"name": "loader", "image": "loader:1",
            "volumeMounts": [{"name": "scratch", "mountPath": "/dev/shm"}]}));
    let m = check_round_trip(&obj, None, &enforced_shm());
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(
        spec["volumes"][0],
        json!({"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}})
    );
    assert_eq!(spec["volumes"][1]["name"], "cache");
    assert!(
        spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .all(|v| v["name"] != "trainwire-shm"),
        "{}",
        spec["volumes"]
    );
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("the volume \"scratch\" mounted at /dev/shm")),
        "{:?}",
        m.warnings
    );
    let st = status_of(&m.object);
    assert_eq!(
        serde_json::to_value(&st.replaced_volumes["scratch"]).expect("json"),
        json!({"name": "scratch", "hostPath": {"path": "/mnt/shm"}})
    );
}

/// A volume mounted at `/dev/shm` that is also data elsewhere (mounted at
/// another path, or a claim trainwire mounts for `trainwire.dev/volumes`),
/// or a per-pod claim, cannot become the enforced memory `/dev/shm`: the
/// workload is refused, naming the other mount (found by fuzzing: under the
/// example policy, a Job whose `datasets-pvc` volume was also mounted at
/// `/dev/shm` got its `/data` turned into memory, and re-injection moved its
/// volumes).
#[rstest]
#[case::mounted_elsewhere(
    with_volumes(
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}]),
        json!([{"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": "/dev/shm"}]),
    ),
    "container \"trainer\" also mounts it at /data, which would become empty memory"
)]
#[case::a_claim_trainwire_mounts(
    with_volumes(json!([]), json!([{"name": "datasets-pvc", "mountPath": "/dev/shm", "readOnly": true}]))
        .pipe(|mut o| { o["metadata"]["annotations"]["trainwire.dev/volumes"] = json!("datasets-pvc:/data:ro"); o }),
    "container \"trainer\" also mounts it at /data, which would become empty memory"
)]
#[case::per_pod_claim(
    with_volumes(json!([]), json!([{"name": "shm-claim", "mountPath": "/dev/shm"}])),
    "the pod has no volume \"shm-claim\" (a per-pod claim cannot be replaced)"
)]
fn an_enforced_shm_does_not_replace_data(#[case] obj: Value, #[case] why: &str) {
    let message = refusal(&obj, &enforced_shm());
    assert!(
        message.starts_with("policy profile \"ml\" rule shmSize: the enforced memory /dev/shm of 64Gi cannot replace the volume"),
        "{message}"
    );
    assert!(message.contains(why), "{message}");
    assert!(
        message.ends_with("mount a volume of its own at /dev/shm (or none: trainwire adds it)"),
        "{message}"
    );
}

/// The same manifests with a `/dev/shm` size that is only a default: the
/// user's volume is kept as it is, and nothing is refused.
#[rstest]
#[case(with_volumes(
    json!([{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}]),
    json!([{"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": "/dev/shm"}]),
))]
#[case(with_volumes(json!([]), json!([{"name": "shm-claim", "mountPath": "/dev/shm"}])))]
fn a_default_shm_keeps_the_volume_mounted_there(#[case] obj: Value) {
    let p = profile(|p| p.shm_size = enforced("64Gi".parse().expect("size"), Enforce::Default));
    let m = check_round_trip(&obj, None, &p);
    let (before, after) = (
        &obj["spec"]["template"]["spec"],
        &m.object["spec"]["template"]["spec"],
    );
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    for mount in list(&before["containers"][0]["volumeMounts"]) {
        assert!(
            list(&after["containers"][0]["volumeMounts"]).contains(&mount),
            "{mount} kept: {}",
            after["containers"][0]["volumeMounts"]
        );
    }
    for volume in list(&before["volumes"]) {
        assert!(list(&after["volumes"]).contains(&volume), "{volume} kept");
    }
    assert!(
        list(&after["volumes"])
            .iter()
            .all(|v| v["name"] != "trainwire-shm"),
        "{}",
        after["volumes"]
    );
}

/// A scratch `emptyDir` at `/dev/shm` and at another path holds no data to
/// lose: the enforced size replaces it, both mounts keep it.
#[test]
fn an_enforced_shm_replaces_a_scratch_volume_shared_elsewhere() {
    let obj = with_volumes(
        json!([{"name": "scratch", "emptyDir": {}}]),
        json!([{"name": "scratch", "mountPath": "/tmp"}, {"name": "scratch", "mountPath": "/dev/shm"}]),
    );
    let m = check_round_trip(&obj, None, &enforced_shm());
    let spec = &m.object["spec"]["template"]["spec"];
    assert_eq!(
        spec["volumes"][0],
        json!({"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}})
    );
    let mounts = spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts");
    assert_eq!(
        mounts.iter().filter(|m| m["name"] == "scratch").count(),
        2,
        "{mounts:?}"
    );
}
