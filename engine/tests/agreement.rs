//! The three readers of a value agree: for every generated string, the
//! annotation parser (`trainwire.dev/*`), the policy validator
//! (`policy check`, `Policy::from_yaml`) and the sidecar's configuration
//! parser (`TRAINWIRE_*`) accept or refuse it together, and when they accept
//! they read the same value. Where a component does not carry a value (the
//! policy has no node count or peer-loss action), the others are compared.
//!
//! One documented difference of context, not of grammar: an empty or blank
//! `TRAINWIRE_*` variable counts as unset (the sidecar's default), while a
//! blank annotation is refused. The webhook never injects a blank value;
//! for blank strings the test checks that the sidecar reads its default.

use proptest::prelude::*;
use serde_json::{Map, Value};
use trainwire_contract::config::Config;
use trainwire_contract::env;
use trainwire_engine::mutation::annotations;
use trainwire_engine::policy::Policy;

/// The annotations of a workload with one `trainwire.dev/*` value.
fn annotation(key: &str, value: &str) -> Result<annotations::Annotations, String> {
    let mut map = Map::new();
    map.insert(key.to_string(), Value::String(value.to_string()));
    annotations::parse(Some(&map)).map_err(|e| format!("{e:?}"))
}

/// A one-profile policy whose profile body is `body` (YAML lines indented by
/// four spaces), validated like `policy check` does.
fn policy(body: &str) -> Result<Policy, String> {
    let text =
        format!("apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: p\n{body}");
    Policy::from_yaml(&text, "policy.yaml").map_err(|e| e.to_string())
}

/// `value` as a YAML double-quoted scalar (JSON string syntax, ASCII input).
fn quoted(value: &str) -> String {
    serde_json::to_string(value).expect("a string serializes")
}

/// The sidecar's configuration of rank 0 of 1 with `pairs` added.
fn sidecar(pairs: &[(&str, &str)]) -> Result<Config, String> {
    let mut all = vec![(env::NNODES, "1"), (env::NODE_RANK, "0")];
    all.extend_from_slice(pairs);
    Config::from_source(all.as_slice()).map_err(|e| e.to_string())
}

/// Strings near each grammar (valid forms, near misses, overflow, spaces)
/// and plain noise.
fn duration_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,5}(ns|us|ms|s|m|h)",
        "([0-9]{1,3}(\\.[0-9]{1,2})?(h|m|s|ms)){1,3}",
        "[ +\\-]?[0-9]{0,3}\\.?[0-9]{0,3}(e[0-9]{1,2})?(s|m|h|d|µs|ns|)",
        "[0-9]{15,22}(s|h|ms)",
        " {0,2}[0-9]{1,4}(s|m) {0,2}",
        "[ -~]{0,10}",
    ]
}

fn size_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,6}(Ki|Mi|Gi|Ti|k|M|G|T|m|)",
        "[ +\\-]?[0-9]{0,4}\\.?[0-9]{0,3}(e[0-9]{1,2}|E[0-9])?(Gi|Mi|G|m|)",
        "[0-9]{18,24}(Gi|Ti|)",
        "(off|Off|OFF|none| off )",
        "[ -~]{0,10}",
    ]
}

fn nnodes_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,4}",
        "[0-9]{1,3}:[0-9]{1,3}",
        "[ +\\-]?[0-9]{0,11}(:[ +\\-]?[0-9]{0,11})?",
        " {0,2}[0-9]{1,2}(:[0-9]{1,2})? {0,2}",
        "[ -~]{0,8}",
    ]
}

fn action_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "(auto|restart-workers|restart-agent|none)",
        "(Auto|NONE|restart_workers|restart agent| auto |kill|)",
        "[ -~]{0,14}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_max_age_reads_the_same_everywhere(s in duration_like()) {
        if s.trim().is_empty() {
            let blank = sidecar(&[(env::CHECKPOINT_DIR, "/c"), (env::CHECKPOINT_MAX_AGE, &s)]);
            let unset = sidecar(&[(env::CHECKPOINT_DIR, "/c")]);
            prop_assert_eq!(blank, unset);
            return Ok(());
        }
        let a = annotation("trainwire.dev/checkpoint-max-age", &s)
            .map(|a| a.checkpoint_max_age.map(|d| d.get()));
        let p = policy(&format!("    checkpointMaxAge: {{value: {}}}\n", quoted(&s)))
            .map(|p| Some(p.profile_for("any").checkpoint_max_age.value.get()));
        let c = sidecar(&[(env::CHECKPOINT_DIR, "/c"), (env::CHECKPOINT_MAX_AGE, &s)])
            .map(|c| c.checkpoint.map(|k| k.max_age));
        prop_assert_eq!(a.is_ok(), p.is_ok(), "annotation {:?} vs policy {:?} for {:?}", a, p, s);
        prop_assert_eq!(a.is_ok(), c.is_ok(), "annotation {:?} vs sidecar {:?} for {:?}", a, c, s);
        if let (Ok(a), Ok(p), Ok(c)) = (a, p, c) {
            prop_assert_eq!(a, p, "{:?}", s);
            prop_assert_eq!(a, c, "{:?}", s);
        }
    }

    /// A sidecar duration set through the policy (`sidecar.env`) passes
    /// `policy check` exactly when the sidecar itself accepts it.
    #[test]
    fn sidecar_durations_in_the_policy_pass_exactly_when_the_sidecar_starts(s in duration_like()) {
        let p = policy(&format!(
            "    sidecar:\n      env:\n        TRAINWIRE_ACTION_COOLDOWN: {}\n",
            quoted(&s)
        ));
        let c = sidecar(&[(env::ACTION_COOLDOWN, &s)]);
        prop_assert_eq!(p.is_ok(), c.is_ok(), "policy {:?} vs sidecar {:?} for {:?}", p.err(), c.err(), s);
    }

    #[test]
    fn shm_size_reads_the_same_in_annotation_and_policy(s in size_like()) {
        let a = annotation("trainwire.dev/shm-size", &s).map(|a| a.shm_size);
        let p = policy(&format!("    shmSize: {{value: {}}}\n", quoted(&s)))
            .map(|p| Some(p.profile_for("any").shm_size.value));
        prop_assert_eq!(a.is_ok(), p.is_ok(), "annotation {:?} vs policy {:?} for {:?}", a, p, s);
        if let (Ok(a), Ok(p)) = (a, p) {
            prop_assert_eq!(a, p, "{:?}", s);
        }
    }

    /// Written without quotes, YAML may read the value as a number first:
    /// the policy must still agree with the annotation.
    #[test]
    fn unquoted_policy_values_agree_with_the_annotation(
        size in "[+\\-]?[0-9]{1,9}(\\.[0-9]{0,2})?([eE][+\\-]?[0-9]{1,2})?",
        age in "[+\\-]?[0-9]{1,5}(\\.[0-9]{0,2})?([eE][0-9])?(s|m|h|)",
    ) {
        let a = annotation("trainwire.dev/shm-size", &size).map(|a| a.shm_size);
        let p = policy(&format!("    shmSize: {{value: {size}}}\n"))
            .map(|p| Some(p.profile_for("any").shm_size.value));
        prop_assert_eq!(a.is_ok(), p.is_ok(), "annotation {:?} vs policy {:?} for {}", a, p, size);
        if let (Ok(a), Ok(p)) = (a, p) {
            prop_assert_eq!(a, p, "{}", size);
        }
        let a = annotation("trainwire.dev/checkpoint-max-age", &age)
            .map(|a| a.checkpoint_max_age.map(|d| d.get()));
        let p = policy(&format!("    checkpointMaxAge: {{value: {age}}}\n"))
            .map(|p| Some(p.profile_for("any").checkpoint_max_age.value.get()));
        prop_assert_eq!(a.is_ok(), p.is_ok(), "annotation {:?} vs policy {:?} for {}", a, p, age);
        if let (Ok(a), Ok(p)) = (a, p) {
            prop_assert_eq!(a, p, "{}", age);
        }
    }

    #[test]
    fn node_counts_read_the_same_in_annotation_and_sidecar(s in nnodes_like()) {
        prop_assume!(!s.trim().is_empty(), "TRAINWIRE_NNODES is required: blank is missing");
        let a = annotation("trainwire.dev/nnodes", &s).map(|a| a.nnodes);
        let c = Config::from_source([(env::NNODES, s.as_str()), (env::NODE_RANK, "0")].as_slice())
            .map(|c| Some(c.nnodes))
            .map_err(|e| e.to_string());
        prop_assert_eq!(a.is_ok(), c.is_ok(), "annotation {:?} vs sidecar {:?} for {:?}", a, c, s);
        if let (Ok(a), Ok(c)) = (a, c) {
            prop_assert_eq!(a, c, "{:?}", s);
        }
    }

    #[test]
    fn peer_loss_action_reads_the_same_in_annotation_and_sidecar(s in action_like()) {
        if s.trim().is_empty() {
            prop_assert_eq!(sidecar(&[(env::ON_PEER_LOSS, &s)]), sidecar(&[]));
            return Ok(());
        }
        let a = annotation("trainwire.dev/on-peer-loss", &s).map(|a| a.on_peer_loss);
        let c = sidecar(&[(env::ON_PEER_LOSS, &s)]).map(|c| Some(c.on_peer_loss));
        prop_assert_eq!(a.is_ok(), c.is_ok(), "annotation {:?} vs sidecar {:?} for {:?}", a, c, s);
        if let (Ok(a), Ok(c)) = (a, c) {
            prop_assert_eq!(a, c, "{:?}", s);
        }
    }
}
