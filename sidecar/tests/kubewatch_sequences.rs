//! The Kubernetes-watch decisions, replayed on recorded pod event sequences
//! (tests/data/kubewatch/*.json, built from a pod a real kube-apiserver
//! created), through the pure tracker and the peers' state machine.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use rstest::rstest;
use serde::Deserialize;
use trainwire_sidecar::config::NodeCount;
use trainwire_sidecar::kubewatch::{PodView, Tracker, Verdict};
use trainwire_sidecar::peers::{Evidence, Observation, Peers, Source};

#[derive(Deserialize)]
struct Sequence {
    #[serde(rename = "self")]
    self_name: String,
    grace_seconds: u64,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    at: String,
    #[serde(rename = "type")]
    type_: String,
    object: Option<Pod>,
    node: Option<String>,
    expect: Vec<String>,
}

fn short(v: &Verdict) -> String {
    match &v.evidence {
        Evidence::Alive(_) => "alive".into(),
        Evidence::Suspect(_) => "suspect".into(),
        Evidence::Missed(_) => "missed".into(),
        Evidence::Lost(r, _) => format!("lost:{}", r.as_str()),
    }
}

#[rstest]
#[case("deleted", &["deleted"])]
#[case("failed", &["failed"])]
#[case("not-ready", &["not-ready"])]
#[case("starting-not-ready-is-not-lost", &[])]
#[case("container-restarted", &["container-restarted"])]
#[case("node-unreachable", &["node-unreachable"])]
#[case("disruption-target", &["disrupted"])]
#[case("node-lost-reason", &["node-unreachable"])]
#[case("stuck-terminating", &["stuck-terminating"])]
#[case("recreated-new-uid", &["identity-changed"])]
#[case("deleted-during-watch-gap", &["deleted"])]
#[case("own-pod-and-succeeded", &[])]
#[case("container-terminated", &["container-restarted"])]
fn recorded_sequence(#[case] name: &str, #[case] losses: &[&str]) -> anyhow::Result<()> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/kubewatch")
        .join(format!("{name}.json"));
    let seq: Sequence = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut tracker = Tracker::new(&seq.self_name, Duration::from_secs(seq.grace_seconds));
    let t0 = Instant::now();
    let mut peers = Peers::new(NodeCount::Fixed(2), 1, 3, t0);
    let mut got_losses = Vec::new();
    for (i, step) in seq.steps.iter().enumerate() {
        let now: Timestamp = step.at.parse()?;
        let view = step.object.as_ref().map(PodView::of);
        let verdicts = match (step.type_.as_str(), view) {
            ("Applied", Some(v)) => tracker.apply(v, now),
            ("Deleted", Some(v)) => tracker.delete(&v),
            ("Tick", _) => tracker.tick(now),
            ("Init", _) => {
                tracker.relist_started();
                Vec::new()
            }
            ("InitDone", _) => tracker.relist_done(),
            ("NodeUnreachable", _) => {
                let node = step.node.clone().unwrap_or_default();
                assert!(
                    tracker.suspicious_nodes().contains(&node),
                    "{name} step {i}: node not suspicious"
                );
                tracker.node_unreachable(&node, true, now)
            }
            (other, _) => anyhow::bail!("{name} step {i}: unknown step {other}"),
        };
        let got: Vec<String> = verdicts.iter().map(short).collect();
        assert_eq!(
            got, step.expect,
            "{name} step {i} ({}) at {}",
            step.type_, step.at
        );
        for v in verdicts {
            if let Some(loss) = peers.observe(Observation {
                rank: v.rank,
                source: Source::Kubernetes,
                evidence: v.evidence,
                at: t0 + Duration::from_secs(i as u64),
            }) {
                got_losses.push(loss.reason.as_str().to_string());
            }
        }
    }
    assert_eq!(got_losses, losses, "{name}: losses");
    Ok(())
}
