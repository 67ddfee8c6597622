//! Dead-node reclaim: the pure decisions. From a Node (its `Ready`
//! condition and taints), a trainwire pod on it and the policy's
//! `nodeFailure` rule, decide whether to wait, do nothing, force-delete the
//! pod or taint the node `out-of-service`. The controller
//! ([`crate::failures`]) only applies what these say.
//!
//! Fields relied on (Kubernetes API reference, core/v1):
//! - `Node.status.conditions[type=Ready]`: `status` `True`/`False`/`Unknown`
//!   and `lastTransitionTime` (when it last changed; the node controller
//!   sets `Unknown` when the kubelet stops renewing its Lease).
//! - `Node.spec.taints[]`: `key`, `value`, `effect` (to see an
//!   `out-of-service` taint already there).
//! - `Pod.spec.nodeName`, `Pod.status.phase`, `Pod.metadata.uid`.

use std::collections::VecDeque;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::jiff::Timestamp;

use trainwire_engine::policy::{NodeFailureAction, NodeFailurePolicy};

/// What dead-node reclaim calls on top of the failure controller's own
/// watch of injected pods ([`crate::failures::API_PERMISSIONS`]), granted by
/// `manifests/components/node-failure` only: it watches Nodes (their
/// `Ready` condition), force-deletes a pod on a dead node, first marking a
/// Job's pod Failed with a `DisruptionTarget` condition (`pods/status`), and
/// taints a dead node out-of-service (`nodes patch`, for `action:
/// out-of-service`).
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "nodes", "patch"),
    ("", "pods", "delete"),
    ("", "pods/status", "patch"),
];

/// The taint that lets the control plane delete a dead node's pods and
/// force-detach their volumes.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// Its value and effect, as the Kubernetes documentation gives them.
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";

/// A node's readiness as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeHealth {
    /// `Ready` is `True` (or the node has no Ready condition yet: treated as
    /// healthy, never reclaimed).
    pub ready: bool,
    /// When `Ready` last changed (`lastTransitionTime`).
    pub since: Option<Timestamp>,
    /// `Unknown` or `False`, for messages.
    pub status: String,
    pub out_of_service: bool,
}

impl NodeHealth {
    pub fn of(node: &Node) -> NodeHealth {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let out_of_service = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
        match ready {
            None => NodeHealth {
                ready: true,
                since: None,
                status: "absent".to_string(),
                out_of_service,
            },
            Some(c) => NodeHealth {
                ready: c.status == "True",
                since: c.last_transition_time.as_ref().map(|t| t.0),
                status: c.status.clone(),
                out_of_service,
            },
        }
    }
}

/// What to do about one trainwire pod on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reclaim {
    /// Nothing: the node is ready, reclaim is off, or the pod is finished.
    Nothing,
    /// The node is not ready, but not for long enough yet: look again then.
    WaitUntil(Timestamp),
    /// Delete the pod with grace period 0.
    ForceDelete,
    /// Taint the node out-of-service.
    TaintNode,
    /// The node is already tainted out-of-service: the control plane acts.
    AlreadyOutOfService,
}

/// Whether a pod is finished (its phase says so): nothing to reclaim.
pub fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The decision for one pod on `node`, at `now`.
pub fn decide(
    node: &NodeHealth,
    pod_finished: bool,
    policy: Option<&NodeFailurePolicy>,
    now: Timestamp,
) -> Reclaim {
    let Some(policy) = policy else {
        return Reclaim::Nothing;
    };
    if node.ready || pod_finished {
        return Reclaim::Nothing;
    }
    // Not ready with no time: the condition cannot be aged, so wait a whole
    // grace from now (the next status write brings a time).
    let Some(since) = node.since else {
        return Reclaim::WaitUntil(add(now, policy.reclaim_after.get()));
    };
    let due = add(since, policy.reclaim_after.get());
    if now < due {
        return Reclaim::WaitUntil(due);
    }
    match policy.action {
        NodeFailureAction::ForceDelete => Reclaim::ForceDelete,
        NodeFailureAction::OutOfService if node.out_of_service => Reclaim::AlreadyOutOfService,
        NodeFailureAction::OutOfService => Reclaim::TaintNode,
    }
}

fn add(t: Timestamp, d: std::time::Duration) -> Timestamp {
    let span = k8s_openapi::jiff::SignedDuration::try_from(d)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    t.checked_add(span).unwrap_or(Timestamp::MAX)
}

/// The taint [`Reclaim::TaintNode`] adds.
pub fn out_of_service_taint(now: Timestamp) -> Taint {
    Taint {
        key: OUT_OF_SERVICE_TAINT.to_string(),
        value: Some(OUT_OF_SERVICE_VALUE.to_string()),
        effect: OUT_OF_SERVICE_EFFECT.to_string(),
        time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
    }
}

/// The cap on actions per minute: a sliding window of the last minute's
/// actions.
#[derive(Debug, Default)]
pub struct RateLimit {
    taken: VecDeque<Timestamp>,
}

impl RateLimit {
    /// Take one action at `now` if fewer than `per_minute` were taken in the
    /// minute before; else `Err(when the next one is allowed)`.
    pub fn take(&mut self, now: Timestamp, per_minute: u32) -> Result<(), Timestamp> {
        let minute = std::time::Duration::from_secs(60);
        while self.taken.front().is_some_and(|t| add(*t, minute) <= now) {
            self.taken.pop_front();
        }
        if self.taken.len() < per_minute as usize {
            self.taken.push_back(now);
            Ok(())
        } else {
            Err(self.taken.front().map_or(now, |t| add(*t, minute)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn node(status: &str, since: Option<i64>, oos: bool) -> NodeHealth {
        NodeHealth {
            ready: status == "True",
            since: since.map(ts),
            status: status.to_string(),
            out_of_service: oos,
        }
    }

    fn policy(action: NodeFailureAction) -> NodeFailurePolicy {
        NodeFailurePolicy {
            reclaim_after: "30s".parse().unwrap_or_else(|_| panic!("30s")),
            action,
            max_pods_per_minute: 2,
        }
    }

    use NodeFailureAction::{ForceDelete as FD, OutOfService as OOS};

    #[rstest]
    #[case::ready_node("True", Some(0), false, false, Some(FD), 100, Reclaim::Nothing)]
    #[case::reclaim_off("Unknown", Some(0), false, false, None, 100, Reclaim::Nothing)]
    #[case::unknown_within_grace(
        "Unknown",
        Some(0),
        false,
        false,
        Some(FD),
        10,
        Reclaim::WaitUntil(ts(30))
    )]
    #[case::unknown_at_grace("Unknown", Some(0), false, false, Some(FD), 30, Reclaim::ForceDelete)]
    #[case::false_past_grace("False", Some(0), false, false, Some(FD), 31, Reclaim::ForceDelete)]
    #[case::back_before_grace_then_ready(
        "True",
        Some(20),
        false,
        false,
        Some(FD),
        40,
        Reclaim::Nothing
    )]
    #[case::flapped_recently(
        "Unknown",
        Some(25),
        false,
        false,
        Some(FD),
        40,
        Reclaim::WaitUntil(ts(55))
    )]
    #[case::finished_pod("Unknown", Some(0), false, true, Some(FD), 100, Reclaim::Nothing)]
    #[case::no_transition_time(
        "Unknown",
        None,
        false,
        false,
        Some(FD),
        100,
        Reclaim::WaitUntil(ts(130))
    )]
    #[case::taint("Unknown", Some(0), false, false, Some(OOS), 30, Reclaim::TaintNode)]
    #[case::taint_already_there(
        "Unknown",
        Some(0),
        true,
        false,
        Some(OOS),
        30,
        Reclaim::AlreadyOutOfService
    )]
    fn decisions(
        #[case] status: &str,
        #[case] since: Option<i64>,
        #[case] oos: bool,
        #[case] finished: bool,
        #[case] action: Option<NodeFailureAction>,
        #[case] now: i64,
        #[case] expected: Reclaim,
    ) {
        let p = action.map(policy);
        assert_eq!(
            decide(&node(status, since, oos), finished, p.as_ref(), ts(now)),
            expected
        );
    }

    #[test]
    fn node_health_reads_the_ready_condition_and_the_taint() {
        let n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1"},
            "spec": {"taints": [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-11-23T10:00:20Z"},
                {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "Unknown", "lastTransitionTime": "2026-11-23T10:00:20Z"},
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status.",
                 "lastHeartbeatTime": "2026-11-23T09:59:58Z",
                 "lastTransitionTime": "2026-11-23T10:00:20Z"}]}
        }))
        .unwrap_or_default();
        let h = NodeHealth::of(&n);
        assert!(!h.ready && h.out_of_service);
        assert_eq!(h.status, "Unknown");
        assert_eq!(
            h.since.map(|t| t.to_string()).as_deref(),
            Some("2026-11-23T10:00:20Z")
        );
        assert!(NodeHealth::of(&Node::default()).ready);
    }

    #[test]
    fn the_rate_limit_is_a_sliding_minute() {
        let mut r = RateLimit::default();
        assert_eq!(r.take(ts(0), 2), Ok(()));
        assert_eq!(r.take(ts(10), 2), Ok(()));
        assert_eq!(r.take(ts(20), 2), Err(ts(60)));
        assert_eq!(r.take(ts(60), 2), Ok(()));
        assert_eq!(r.take(ts(65), 2), Err(ts(70)));
    }
}
