//! `policy check` on broken policy files: each file's exact messages, and
//! the command's exit status and output streams.

use std::path::Path;
use std::process::Command;

use rstest::rstest;
use trainwire_engine::policy;

const DATA: &str = "tests/data/policy";

/// Every broken file and its exact messages, without the `file:` prefix.
#[rstest]
#[case::bad_api_version("bad-api-version", &[r#"1:13: apiVersion: unknown variant "trainwire.dev/v1", expected one of trainwire.dev/v1alpha1"#])]
#[case::bad_claim_pattern("bad-claim-pattern", &[r#"6:14: profiles[0].checkpoint.claim: "{team}-checkpoints" holds an unknown placeholder; the accepted ones are {namespace} and {name}"#])]
#[case::bad_duration("bad-duration", &[r#"5:31: profiles[0].checkpointMaxAge.value: "30 minutes" is not valid: " minutes" is not a unit; accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)"#])]
#[case::bad_etcd_endpoint("bad-etcd-endpoint", &[r#"6:19: profiles[0].etcdEndpoint: "http://etcd.platform.svc:2379" is not host:port (no scheme); accepted: etcd.example.svc:2379, 10.0.0.5:2379, [fd00::5]:2379"#])]
#[case::bad_glob("bad-glob", &[r#"5:18: profiles[0].namespaces[0]: "ml-[" is not a valid glob: unclosed character class; missing ']'"#])]
#[case::bad_nccl_key("bad-nccl-key", &[r#"6:7: profiles[0].nccl.SOCKET_IFNAME: "SOCKET_IFNAME" is not an NCCL variable: names start with NCCL_ or TORCH_NCCL_ and hold letters, digits and '_'"#])]
#[case::bad_node_selector("bad-node-selector", &[r#"6:7: profiles[0].nodeSelector["karpenter.sh/node pool"]: "karpenter.sh/node pool" is not a label key (an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"#, r#"7:38: profiles[0].nodeSelector["karpenter.sh/nodepool"].value: "gpu a100" is not a label value (empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"#])]
#[case::bad_resources("bad-resources", &[r#"8:9: profiles[0].sidecar.resources.limit: unknown field "limit", expected one of limits, requests (did you mean "limits"?)"#])]
#[case::bad_shm_size("bad-shm-size", &[r#"5:22: profiles[0].shmSize.value: "8GB" is not valid: "GB" is not a suffix; accepted: a size of at least 1Mi such as 8Gi, 512Mi or 64Gi, or off to leave /dev/shm alone"#])]
#[case::bad_sidecar_env("bad-sidecar-env", &[r#"7:9: profiles[0].sidecar.env.TRAINWIRE_HEARTBEAT_INTERVALS: "TRAINWIRE_HEARTBEAT_INTERVALS" is not a sidecar setting the policy may set; accepted: TRAINWIRE_CHECKPOINT_POLL, TRAINWIRE_DETECTION, TRAINWIRE_HEARTBEAT_INTERVAL, TRAINWIRE_HEARTBEAT_MISSES, TRAINWIRE_HEARTBEAT_TIMEOUT, TRAINWIRE_NOT_READY_GRACE, TRAINWIRE_ACTION_COOLDOWN, TRAINWIRE_MAX_ACTIONS, TRAINWIRE_ACTION_WINDOW, TRAINWIRE_CHECKPOINT_SETTLE, TRAINWIRE_CHECKPOINT_POLL_INTERVAL, TRAINWIRE_AGENT_MATCH, TRAINWIRE_LOG_FORMAT, TRAINWIRE_CONFIRM_AFTER, TRAINWIRE_REPLACEMENT_WAIT"#, r#"8:9: profiles[0].sidecar.env.TRAINWIRE_NODE_RANK: "TRAINWIRE_NODE_RANK" is not a sidecar setting the policy may set (the webhook sets it, or it has its own policy field); accepted: TRAINWIRE_CHECKPOINT_POLL, TRAINWIRE_DETECTION, TRAINWIRE_HEARTBEAT_INTERVAL, TRAINWIRE_HEARTBEAT_MISSES, TRAINWIRE_HEARTBEAT_TIMEOUT, TRAINWIRE_NOT_READY_GRACE, TRAINWIRE_ACTION_COOLDOWN, TRAINWIRE_MAX_ACTIONS, TRAINWIRE_ACTION_WINDOW, TRAINWIRE_CHECKPOINT_SETTLE, TRAINWIRE_CHECKPOINT_POLL_INTERVAL, TRAINWIRE_AGENT_MATCH, TRAINWIRE_LOG_FORMAT, TRAINWIRE_CONFIRM_AFTER, TRAINWIRE_REPLACEMENT_WAIT"#, r#"9:30: profiles[0].sidecar.env.TRAINWIRE_DETECTION: TRAINWIRE_DETECTION="gossip" is invalid: not one of the accepted names (accepted: auto, kubernetes (or k8s), heartbeat (or heartbeats), both); the sidecar would not start with it"#])]
#[case::bad_toleration_operator("bad-toleration-operator", &[r#"7:19: profiles[0].tolerations[0].operator: unknown variant "exists", expected one of Exists, Equal"#])]
#[case::checkpoint_not_allowed("checkpoint-not-allowed", &[r#"6:14: profiles[0].checkpoint.claim: claim "shared-ckpt" is not in allowedClaims, so every workload would be refused; add it to allowedClaims"#])]
#[case::checkpoint_pattern_overwrite("checkpoint-pattern-overwrite", &[r#"7:16: profiles[0].checkpoint.enforce: claim "ckpt-*" is a pattern, so trainwire cannot pick the claim for the workload; a pattern needs enforce: refuse (a workload must name a matching claim), or give a plain claim name"#])]
#[case::duplicate_key("duplicate-key", &[r#"6:5: profiles[0].maxNodes: "maxNodes" is given twice; keep one"#])]
#[case::duplicate_namespace("duplicate-namespace", &[r#"7:18: profiles[1].namespaces[0]: namespace "research" is already listed by profiles[0], which wins; list each namespace in one profile"#])]
#[case::duplicate_profile("duplicate-profile", &[r#"7:11: profiles[2].name: profile name "gpu" is already used by profiles[0]; profile names must be unique"#])]
#[case::etcd_endpoint_missing("etcd-endpoint-missing", &[r#"5:26: profiles[0].rdzvBackend.value: backend etcd-v2 needs etcdEndpoint (host:port of the external etcd)"#])]
#[case::max_nodes_zero("max-nodes-zero", &[r#"5:15: profiles[0].maxNodes: 0 would refuse every workload; give the largest node count allowed (1 or more), or remove maxNodes for no limit"#])]
#[case::missing_kind("missing-kind", &[r#"2:1: (document): missing field "kind"; a policy file is a mapping: apiVersion: trainwire.dev/v1alpha1, kind: Policy, profiles: [...]"#])]
#[case::missing_setting_value("missing-setting-value", &[r#"6:20: profiles[0].nccl.NCCL_DEBUG: missing field "value""#])]
#[case::negative_failure_toleration("negative-failure-toleration", &[r#"5:43: profiles[0].nodeFailureTolerationSeconds.value: -5 is negative; give the seconds a pod stays bound to an unreachable or not-ready node (0 or more; Kubernetes' default is 300)"#])]
#[case::no_profiles("no-profiles", &[r#"3:11: profiles: a policy needs at least one profile; without a policy file the embedded defaults apply"#])]
#[case::not_a_mapping("not-a-mapping", &[r#"1:1: (document): expected a mapping; a policy file is a mapping: apiVersion: trainwire.dev/v1alpha1, kind: Policy, profiles: [...]"#])]
#[case::setting_shorthand("setting-shorthand", &[r#"6:19: profiles[0].nccl.NCCL_DEBUG: expected a setting {value: ..., enforce: default|refuse|overwrite}; a plain value must be written {value: ...}"#])]
#[case::several_errors("several-errors", &[r#"4:11: profiles[0].name: "GPU" is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"#, r#"6:19: profiles[0].etcdEndpoint: "etcd" is not host:port (the port is missing); accepted: etcd.example.svc:2379, 10.0.0.5:2379, [fd00::5]:2379"#, r#"7:15: profiles[0].maxNodes: 0 would refuse every workload; give the largest node count allowed (1 or more), or remove maxNodes for no limit"#, r#"8:21: profiles[0].allowedClaims[0]: "Ckpt" is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"#])]
#[case::syntax_error("syntax-error", &[r#"7:12: profiles[0].nccl.NCCL_DEBUG: while parsing a flow mapping, did not find expected ',' or '}'"#])]
#[case::toleration_shape("toleration-shape", &[r#"8:16: profiles[0].tolerations[0].value: a toleration with operator Exists has no value; remove value or use operator Equal"#, r#"12:28: profiles[0].tolerations[1].tolerationSeconds: tolerationSeconds applies only to effect NoExecute; set effect: NoExecute or remove it"#])]
#[case::two_fallbacks("two-fallbacks", &[r#"5:11: profiles[1].name: profile "cpu" has no namespaces, like profiles[0] before it: only the first profile without namespaces is the fallback, so this one would never apply; give it namespaces"#])]
#[case::unknown_field("unknown-field", &[r#"5:5: profiles[0].shmsize: unknown field "shmsize", expected one of name, namespaces, nccl, nodeSelector, tolerations, nodeFailureTolerationSeconds, nodeFailure, crashLoop, checkpoint, checkpointPath, checkpointMaxAge, allowedClaims, shmSize, maxNodes, maxGpusPerNode, rdzvBackend, rdzvStore, rdzvHandler, spares, storePod, framework, etcdEndpoint, clusterDomain, sidecar (did you mean "shmSize"?)"#])]
#[case::unknown_toleration_field("unknown-toleration-field", &[r#"9:9: profiles[0].tolerations[0].tolerationSecond: unknown field "tolerationSecond", expected one of key, operator, value, effect, tolerationSeconds (did you mean "tolerationSeconds"?)"#])]
#[case::unknown_variant("unknown-variant", &[r#"9:18: profiles[0].nccl.NCCL_SOCKET_IFNAME.enforce: unknown variant "warn", expected one of default, refuse, overwrite"#])]
#[case::wrong_type("wrong-type", &[r#"5:15: profiles[0].maxNodes: expected a whole number (0 or more)"#])]
#[case::max_age_overflow("max-age-overflow", &[r#"5:31: profiles[0].checkpointMaxAge.value: "18446744073709551615s" is not valid: it is longer than 8760h; accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)"#])]
#[case::root_checkpoint_path("root-checkpoint-path", &[r#"5:29: profiles[0].checkpointPath.value: "//" is not valid: it is the root directory; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"#])]
#[case::blank_checkpoint_path("blank-checkpoint-path", &[r#"5:29: profiles[0].checkpointPath.value: "/ckpt /" is not valid: the segment "ckpt " starts or ends with a blank, which readers that trim values would drop; accepted: an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints"#])]
#[case::shm_fraction_of_a_byte("shm-fraction-of-a-byte", &[r#"5:22: profiles[0].shmSize.value: "512m" is not valid: m, u and n are thousandths, millionths and billionths (a fraction of a byte); write Mi or M for mebibytes or megabytes; accepted: a size of at least 1Mi such as 8Gi, 512Mi or 64Gi, or off to leave /dev/shm alone"#])]
#[case::sidecar_env_count_range("sidecar-env-count-range", &[r#"7:37: profiles[0].sidecar.env.TRAINWIRE_HEARTBEAT_MISSES: TRAINWIRE_HEARTBEAT_MISSES="4294967296" is invalid: above 4294967295 (accepted: a whole number from 1 to 4294967295, such as 8); the sidecar would not start with it"#])]
#[case::sidecar_env_overflow("sidecar-env-overflow", &[r#"7:39: profiles[0].sidecar.env.TRAINWIRE_HEARTBEAT_INTERVAL: TRAINWIRE_HEARTBEAT_INTERVAL="1e20" is invalid: "e" is not a unit (accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)); the sidecar would not start with it"#, r#"8:34: profiles[0].sidecar.env.TRAINWIRE_ACTION_WINDOW: TRAINWIRE_ACTION_WINDOW="18446744073709551615s" is invalid: it is longer than 8760h (accepted: a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)); the sidecar would not start with it"#, r#"9:9: profiles[0].sidecar.env.TRAINWIRE_HEALTH_PORT: "TRAINWIRE_HEALTH_PORT" is not a sidecar setting the policy may set (the webhook sets it, or it has its own policy field); accepted: TRAINWIRE_CHECKPOINT_POLL, TRAINWIRE_DETECTION, TRAINWIRE_HEARTBEAT_INTERVAL, TRAINWIRE_HEARTBEAT_MISSES, TRAINWIRE_HEARTBEAT_TIMEOUT, TRAINWIRE_NOT_READY_GRACE, TRAINWIRE_ACTION_COOLDOWN, TRAINWIRE_MAX_ACTIONS, TRAINWIRE_ACTION_WINDOW, TRAINWIRE_CHECKPOINT_SETTLE, TRAINWIRE_CHECKPOINT_POLL_INTERVAL, TRAINWIRE_AGENT_MATCH, TRAINWIRE_LOG_FORMAT, TRAINWIRE_CONFIRM_AFTER, TRAINWIRE_REPLACEMENT_WAIT"#])]
fn broken_policies(#[case] name: &str, #[case] expected: &[&str]) {
    let file = format!("{DATA}/{name}.yaml");
    let err =
        trainwire_policyfile::check(Path::new(&file)).expect_err("the policy must be refused");
    let prefixed: Vec<String> = expected.iter().map(|m| format!("{file}:{m}")).collect();
    assert_eq!(err.to_string(), prefixed.join("\n"));
    // Each diagnostic carries a line and column.
    for d in err.diagnostics() {
        assert!(d.line.is_some() && d.column.is_some(), "{d}");
    }
}

/// No broken file is left out of the table.
#[test]
fn every_broken_file_is_in_the_table() {
    let mut files: Vec<String> = std::fs::read_dir(DATA)
        .expect("test data dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let source = include_str!("policy_check.rs");
    for f in files {
        let name = f.trim_end_matches(".yaml");
        assert!(
            source.contains(&format!("(\"{name}\", &[")),
            "{f} has no case in the table"
        );
    }
}

fn run_check(file: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args(["policy", "check", file])
        .output()
        .expect("run trainwire-webhook")
}

#[test]
fn check_command_accepts_the_example_policy() {
    let out = run_check("../examples/policy.yaml");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok: 3 profiles (gpu-a100, resilient, cpu)\n"
    );
    assert!(out.stderr.is_empty());
}

#[test]
fn check_command_fails_with_the_messages_on_stderr() {
    let file = format!("{DATA}/several-errors.yaml");
    let out = run_check(&file);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 4, "{stderr}");
    assert!(
        stderr.starts_with(&format!("{file}:4:11: profiles[0].name: ")),
        "{stderr}"
    );
}

#[test]
fn check_command_reports_a_missing_file() {
    let out = run_check("tests/data/policy/no-such-file.yaml");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("tests/data/policy/no-such-file.yaml: cannot read the policy file: "),
        "{stderr}"
    );
}

/// The policy shipped in the kustomize base must load: a broken one would
/// keep the webhook from starting.
#[test]
fn the_manifests_configmap_policy_is_valid() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let text = std::fs::read_to_string("../manifests/base/policy.yaml").expect("read manifest");
    let cm: ConfigMap = serde_saphyr::from_str(&text).expect("a ConfigMap");
    let data = cm.data.expect("data");
    let policy_text = data.get("policy.yaml").expect("data[policy.yaml]");
    let policy = policy::Policy::from_yaml(policy_text, "manifests/base/policy.yaml#policy.yaml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!policy.profiles.is_empty());
}

/// Regression (issue 11): what the sidecar documents, the policy accepts;
/// enforced values compare by value; and a policy that passes the check
/// gives every sidecar a configuration it starts with.
#[test]
fn sidecar_documented_values_pass_the_check() {
    let text = r#"apiVersion: trainwire.dev/v1alpha1
kind: Policy
profiles:
  - name: default
    checkpointMaxAge: {value: 1h30m, enforce: refuse}
    shmSize: {value: 64Gi, enforce: refuse}
    sidecar:
      env:
        TRAINWIRE_MAX_ACTIONS: "0"
        TRAINWIRE_CHECKPOINT_POLL: auto
        TRAINWIRE_DETECTION: k8s
        TRAINWIRE_HEARTBEAT_MISSES: "4294967295"
        TRAINWIRE_HEARTBEAT_INTERVAL: 1.5s
"#;
    let p = policy::Policy::from_yaml(text, "inline.yaml").unwrap_or_else(|e| panic!("{e}"));
    let profile = p.profile_for("any");
    assert_eq!(
        profile.checkpoint_max_age.value,
        "5400s".parse().expect("duration")
    );
    assert_eq!(profile.shm_size.value, "65536Mi".parse().expect("size"));
}
