//! The pure decisions of the pod watch: a pod as the decisions see it
//! ([`PodView`]) and what its snapshots say about each peer ([`Tracker`]).
//! Nothing here does I/O, so the decisions are tested on recorded event
//! sequences; the watch driver ([`super::run`]) feeds them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use crate::peers::{Evidence, Identity, LossReason};

/// Label of StatefulSet pods holding the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Label and annotation of Indexed Job pods holding the completion index.
pub const JOB_INDEX_KEY: &str = "batch.kubernetes.io/job-completion-index";

/// What the decision needs from a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub rank: Option<u32>,
    pub created: Option<Timestamp>,
    pub phase: String,
    pub status_reason: Option<String>,
    pub ready: Option<bool>,
    pub ready_since: Option<Timestamp>,
    pub ready_reason: Option<String>,
    pub disruption: Option<String>,
    pub deletion: Option<Timestamp>,
    pub node: Option<String>,
    /// `status.podIP`.
    pub address: Option<std::net::IpAddr>,
    /// Restart counts of the regular containers (not the init/sidecar ones).
    pub restarts: BTreeMap<String, i32>,
    /// Regular containers that exited and do not run now (their state is
    /// `terminated`, or `waiting` after a `terminated` last state): the
    /// trainer, whose exit is in the pod status at once, while the restart
    /// count moves only when the kubelet restarts it after its back-off.
    pub exited: BTreeMap<String, Exit>,
    /// Each regular container's exit before its current run
    /// (`lastState.terminated`), by [`Exit::key`].
    pub last_exit: BTreeMap<String, String>,
}

/// One exit of a container, from its `terminated` state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// What tells this exit apart from the container's others: the exited
    /// container's ID, else its finish time (the same in `state` and, after
    /// the restart, in `lastState`).
    pub key: String,
    pub code: i32,
    pub reason: Option<String>,
}

impl Exit {
    fn of(t: &k8s_openapi::api::core::v1::ContainerStateTerminated) -> Exit {
        let key = t
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or_else(|| t.finished_at.as_ref().map(|f| f.0.to_string()))
            .unwrap_or_default();
        Exit {
            key,
            code: t.exit_code,
            reason: t.reason.clone(),
        }
    }

    /// A loss: the container failed (a code other than 0: an error, a
    /// signal, the OOM killer). A container that exits 0 finished its work
    /// (the end of training on that node; the pod then succeeds, or its
    /// restart is seen by the restart count).
    pub fn is_failure(&self) -> bool {
        self.code != 0
    }
}

impl PodView {
    /// Extracts the view from a pod object.
    pub fn of(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let name = meta.name.clone().unwrap_or_default();
        let rank = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(POD_INDEX_LABEL).or_else(|| l.get(JOB_INDEX_KEY)))
            .or_else(|| meta.annotations.as_ref().and_then(|a| a.get(JOB_INDEX_KEY)))
            .and_then(|v| v.parse().ok())
            .or_else(|| name.rsplit('-').next().and_then(|s| s.parse().ok()));
        let status = pod.status.as_ref();
        let conditions = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let ready_cond = conditions.iter().find(|c| c.type_ == "Ready");
        let disruption = conditions
            .iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
            .map(|c| {
                format!(
                    "{}{}",
                    c.reason
                        .clone()
                        .unwrap_or_else(|| "DisruptionTarget".into()),
                    c.message
                        .as_ref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                )
            });
        let containers = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        let restarts = containers
            .iter()
            .map(|c| (c.name.clone(), c.restart_count))
            .collect();
        let mut exited = BTreeMap::new();
        let mut last_exit = BTreeMap::new();
        for c in containers {
            let state = c.state.as_ref();
            let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
            if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
                exited.insert(c.name.clone(), Exit::of(t));
            } else if let Some(t) = last.filter(|_| state.is_some_and(|s| s.waiting.is_some())) {
                exited.insert(c.name.clone(), Exit::of(t));
            }
            if let Some(t) = last {
                last_exit.insert(c.name.clone(), Exit::of(t).key);
            }
        }
        PodView {
            name,
            uid: meta.uid.clone().unwrap_or_default(),
            rank,
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            status_reason: status.and_then(|s| s.reason.clone()),
            ready: ready_cond.map(|c| c.status == "True"),
            ready_since: ready_cond.and_then(|c| c.last_transition_time.as_ref().map(|t| t.0)),
            ready_reason: ready_cond.and_then(|c| c.reason.clone()),
            disruption,
            deletion: meta.deletion_timestamp.as_ref().map(|t| t.0),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            address: status
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok()),
            restarts,
            exited,
            last_exit,
        }
    }

    fn identity(&self) -> Identity {
        Identity {
            pod: self.name.clone(),
            uid: self.uid.clone(),
            start_time: String::new(),
            address: self.address,
            ready: self.ready == Some(true),
        }
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    view: PodView,
    was_ready: bool,
    /// The last failed exit seen while its container was down, by
    /// container: already a loss, so the restart that follows it (the
    /// same exit in `lastState`, the restart count + 1) is not another.
    exits_seen: BTreeMap<String, String>,
}

/// Evidence about one rank, decided from pod snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub rank: u32,
    pub evidence: Evidence,
}

/// The pure decision logic over the pods of the workload.
#[derive(Debug, Clone)]
pub struct Tracker {
    self_name: String,
    grace: Duration,
    pods: BTreeMap<String, Tracked>,
    unreachable_nodes: BTreeSet<String>,
    relist: Option<BTreeSet<String>>,
}

fn since(now: Timestamp, then: Timestamp) -> Duration {
    now.duration_since(then)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

impl Tracker {
    /// `self_name`: this pod (never a peer); `grace`: how long a pod may stay
    /// not Ready or Terminating.
    pub fn new(self_name: &str, grace: Duration) -> Self {
        Tracker {
            self_name: self_name.to_string(),
            grace,
            pods: BTreeMap::new(),
            unreachable_nodes: BTreeSet::new(),
            relist: None,
        }
    }

    /// Whether `uid` is the newest pod of its rank (an old pod being
    /// replaced says nothing about the peer any more).
    fn is_current(&self, uid: &str) -> bool {
        let Some(t) = self.pods.get(uid) else {
            return false;
        };
        let Some(rank) = t.view.rank else {
            return false;
        };
        !self.pods.values().any(|o| {
            o.view.uid != uid && o.view.rank == Some(rank) && o.view.created > t.view.created
        })
    }

    fn judge(&self, t: &Tracked, prev: Option<&PodView>, now: Timestamp) -> Option<Evidence> {
        let v = &t.view;
        if v.phase == "Failed" {
            return Some(Evidence::Lost(
                LossReason::Failed,
                format!(
                    "pod {} failed{}",
                    v.name,
                    v.status_reason
                        .as_ref()
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default()
                ),
            ));
        }
        if v.phase == "Succeeded" {
            // The trainer finished on that node: the end of training, not a loss.
            return None;
        }
        if v.status_reason.as_deref() == Some("NodeLost") {
            return Some(Evidence::Lost(
                LossReason::NodeUnreachable,
                format!("pod {}: its node is unresponsive (NodeLost)", v.name),
            ));
        }
        if let Some(node) = &v.node
            && self.unreachable_nodes.contains(node)
            && t.was_ready
        {
            return Some(Evidence::Lost(
                LossReason::NodeUnreachable,
                format!("pod {}: node {node} is unreachable or not ready", v.name),
            ));
        }
        if let Some(prev) = prev
            && prev.uid == v.uid
        {
            for (container, count) in &v.restarts {
                let before = prev.restarts.get(container).copied().unwrap_or(0);
                let exit_seen = v
                    .last_exit
                    .get(container)
                    .is_some_and(|k| !k.is_empty() && t.exits_seen.get(container) == Some(k));
                if *count > before && !exit_seen {
                    return Some(Evidence::Lost(
                        LossReason::ContainerRestarted,
                        format!(
                            "pod {}: container {container} restarted (restartCount {before} -> {count})",
                            v.name
                        ),
                    ));
                }
            }
        }
        if let Some(d) = &v.disruption {
            return Some(Evidence::Lost(
                LossReason::Disrupted,
                format!("pod {} is about to be disrupted: {d}", v.name),
            ));
        }
        // A container that failed is a loss at once (a pod being deleted
        // stops its containers: that is the deletion's, below).
        if v.deletion.is_none()
            && let Some((container, exit)) = v.exited.iter().find(|(_, e)| e.is_failure())
        {
            return Some(Evidence::Lost(
                LossReason::ContainerRestarted,
                format!(
                    "pod {}: container {container} terminated (exit code {}{})",
                    v.name,
                    exit.code,
                    exit.reason
                        .as_ref()
                        .map(|r| format!(", {r}"))
                        .unwrap_or_default()
                ),
            ));
        }
        if let Some(deleted) = v.deletion {
            if now > deleted && since(now, deleted) >= self.grace {
                return Some(Evidence::Lost(
                    LossReason::StuckTerminating,
                    format!(
                        "pod {} still Terminating {}s after its deletion deadline {deleted}",
                        v.name,
                        since(now, deleted).as_secs()
                    ),
                ));
            }
            return Some(Evidence::Suspect(format!("pod {} is terminating", v.name)));
        }
        match v.ready {
            Some(true) => Some(Evidence::Alive(v.identity())),
            _ if !t.was_ready => {
                // Never Ready yet (starting, or a replacement pulling its
                // image): present, not lost.
                Some(Evidence::Alive(v.identity()))
            }
            _ => {
                let reason = v.ready_reason.clone().unwrap_or_else(|| "not ready".into());
                let for_how_long = v.ready_since.map(|s| since(now, s)).unwrap_or_default();
                if for_how_long >= self.grace {
                    Some(Evidence::Lost(
                        LossReason::NotReady,
                        format!(
                            "pod {} not Ready for {}s ({reason})",
                            v.name,
                            for_how_long.as_secs()
                        ),
                    ))
                } else {
                    Some(Evidence::Suspect(format!(
                        "pod {} not Ready ({reason})",
                        v.name
                    )))
                }
            }
        }
    }

    /// A pod was added or changed.
    pub fn apply(&mut self, view: PodView, now: Timestamp) -> Vec<Verdict> {
        if view.name == self.self_name || view.uid.is_empty() {
            return Vec::new();
        }
        if let Some(seen) = &mut self.relist {
            seen.insert(view.uid.clone());
        }
        let uid = view.uid.clone();
        let known = self.pods.get(&uid);
        let prev = known.map(|t| t.view.clone());
        let was_ready = known.is_some_and(|t| t.was_ready) || view.ready == Some(true);
        let exits_seen = known.map(|t| t.exits_seen.clone()).unwrap_or_default();
        let tracked = Tracked {
            view,
            was_ready,
            exits_seen,
        };
        self.pods.insert(uid.clone(), tracked.clone());
        let verdicts = self.verdicts(&uid, &tracked, prev.as_ref(), now);
        // The failed exits judged now are remembered with the pod: the
        // restart that follows one (the same exit in `lastState`) is the
        // same loss, not a second.
        if let Some(t) = self.pods.get_mut(&uid) {
            for (container, exit) in &tracked.view.exited {
                if exit.is_failure() && !exit.key.is_empty() {
                    t.exits_seen.insert(container.clone(), exit.key.clone());
                }
            }
        }
        verdicts
    }

    /// The verdicts on the update `tracked` of the pod `uid`.
    fn verdicts(
        &self,
        uid: &str,
        tracked: &Tracked,
        prev: Option<&PodView>,
        now: Timestamp,
    ) -> Vec<Verdict> {
        if !self.is_current(uid) {
            return Vec::new();
        }
        let Some(rank) = tracked.view.rank else {
            return Vec::new();
        };
        let Some(evidence) = self.judge(tracked, prev, now) else {
            return Vec::new();
        };
        // A container restarted in place (same pod, same address) that is
        // Ready again in the same update is back: the loss, then the peer
        // alive again, so that its next loss is a loss of its own. (When
        // it is not Ready yet, a later update says so.)
        let back = matches!(evidence, Evidence::Lost(LossReason::ContainerRestarted, _))
            && tracked.view.ready == Some(true);
        let mut verdicts = vec![Verdict { rank, evidence }];
        if back {
            verdicts.push(Verdict {
                rank,
                evidence: Evidence::Alive(tracked.view.identity()),
            });
        }
        verdicts
    }

    /// A pod was deleted.
    pub fn delete(&mut self, view: &PodView) -> Vec<Verdict> {
        if view.name == self.self_name {
            return Vec::new();
        }
        let current = self.is_current(&view.uid) || !self.pods.contains_key(&view.uid);
        let newer_exists = self.pods.values().any(|o| {
            o.view.uid != view.uid && o.view.rank == view.rank && o.view.created > view.created
        });
        self.pods.remove(&view.uid);
        match view.rank {
            Some(rank) if current && !newer_exists && view.phase != "Succeeded" => vec![Verdict {
                rank,
                evidence: Evidence::Lost(
                    LossReason::Deleted,
                    format!("pod {} was deleted", view.name),
                ),
            }],
            _ => Vec::new(),
        }
    }

    /// The watch restarted: a full list follows.
    pub fn relist_started(&mut self) {
        self.relist = Some(BTreeSet::new());
    }

    /// The full list is complete: pods not in it were deleted while the
    /// watch was down.
    pub fn relist_done(&mut self) -> Vec<Verdict> {
        let Some(seen) = self.relist.take() else {
            return Vec::new();
        };
        let gone: Vec<PodView> = self
            .pods
            .values()
            .filter(|t| !seen.contains(&t.view.uid))
            .map(|t| t.view.clone())
            .collect();
        gone.iter().flat_map(|v| self.delete(v)).collect()
    }

    /// Time passed: pods not Ready or Terminating past the grace are lost.
    pub fn tick(&mut self, now: Timestamp) -> Vec<Verdict> {
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        self.losses_among(uids, now)
    }

    /// The losses among the pods `uids`: each current pod with a rank that
    /// is judged lost at `now`.
    fn losses_among(&self, uids: Vec<String>, now: Timestamp) -> Vec<Verdict> {
        let mut out = Vec::new();
        for uid in uids {
            if !self.is_current(&uid) {
                continue;
            }
            let Some(t) = self.pods.get(&uid) else {
                continue;
            };
            let Some(rank) = t.view.rank else { continue };
            if let Some(e @ Evidence::Lost(..)) = self.judge(t, None, now) {
                out.push(Verdict { rank, evidence: e });
            }
        }
        out
    }

    /// The node `node` was found unreachable (or reachable again).
    pub fn node_unreachable(
        &mut self,
        node: &str,
        unreachable: bool,
        now: Timestamp,
    ) -> Vec<Verdict> {
        if unreachable {
            self.unreachable_nodes.insert(node.to_string());
            let uids: Vec<String> = self
                .pods
                .values()
                .filter(|t| t.view.node.as_deref() == Some(node))
                .map(|t| t.view.uid.clone())
                .collect();
            self.losses_among(uids, now)
        } else {
            self.unreachable_nodes.remove(node);
            Vec::new()
        }
    }

    /// Nodes of current pods that look unhealthy (not Ready after having
    /// been Ready): worth a look at the node's taints.
    pub fn suspicious_nodes(&self) -> BTreeSet<String> {
        self.pods
            .values()
            .filter(|t| t.was_ready && t.view.ready != Some(true) && self.is_current(&t.view.uid))
            .filter_map(|t| t.view.node.clone())
            .collect()
    }
}

/// Whether a node object says the node is gone: the unreachable or
/// not-ready taint, or a Ready condition that is not True.
pub fn node_is_unreachable(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == "node.kubernetes.io/unreachable" || t.key == "node.kubernetes.io/not-ready"
            })
        });
    let not_ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status != "True");
    tainted || not_ready
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::{Observation, Source};
    use std::time::Instant;

    fn pod(json: serde_json::Value) -> PodView {
        PodView::of(&serde_json::from_value::<Pod>(json).expect("pod"))
    }

    #[test]
    fn rank_from_label_annotation_or_name() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "a-3", "uid": "u", "labels": {POD_INDEX_LABEL: "1"}}}),
        );
        assert_eq!(p.rank, Some(1));
        let p = pod(
            serde_json::json!({"metadata": {"name": "j-0-abcde", "uid": "u", "annotations": {JOB_INDEX_KEY: "2"}}}),
        );
        assert_eq!(p.rank, Some(2));
        let p = pod(serde_json::json!({"metadata": {"name": "a-3", "uid": "u"}}));
        assert_eq!(p.rank, Some(3));
    }

    /// The identity a pod gives carries its address and readiness: what a
    /// replacement of the rendezvous host must show before the survivors'
    /// agents are restarted (Kubernetes detection alone).
    #[test]
    fn identity_has_the_address_and_readiness() {
        let ready = pod(serde_json::json!({
            "metadata": {"name": "t-0", "uid": "u"},
            "status": {"podIP": "10.244.1.7", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .identity();
        assert_eq!(ready.address, Some([10, 244, 1, 7].into()));
        assert!(ready.ready);
        let v6 = pod(serde_json::json!({
            "metadata": {"name": "t-0", "uid": "u"},
            "status": {"podIP": "fd00::7", "conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .identity();
        assert_eq!(v6.address, "fd00::7".parse().ok());
        assert!(!v6.ready);
        let pending = pod(serde_json::json!({"metadata": {"name": "t-0", "uid": "u"}, "status": {"podIP": "not an ip"}}))
            .identity();
        assert_eq!(pending.address, None);
        assert!(!pending.ready);
    }

    /// Pod `train-0` at `rv`: its trainer `state` and `lastState`, its
    /// restart count, Ready or not.
    fn trainer_pod(
        state: serde_json::Value,
        last: serde_json::Value,
        restarts: i32,
        ready: bool,
    ) -> PodView {
        pod(serde_json::json!({
            "metadata": {"name": "train-0", "uid": "u0", "labels": {POD_INDEX_LABEL: "0"},
                         "creationTimestamp": "2026-11-25T08:00:00Z"},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.10",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                "lastTransitionTime": "2026-11-25T08:10:00Z"}],
                "containerStatuses": [{"name": "trainer", "image": "t", "imageID": "", "ready": ready,
                                       "restartCount": restarts, "state": state, "lastState": last}],
                "initContainerStatuses": [{"name": "trainwire-sidecar", "image": "s", "imageID": "", "ready": true,
                                           "restartCount": 0, "state": {"running": {}}}]
            }
        }))
    }

    fn reasons(verdicts: &[Verdict]) -> Vec<String> {
        verdicts
            .iter()
            .map(|v| match &v.evidence {
                Evidence::Alive(_) => "alive".to_string(),
                Evidence::Suspect(_) => "suspect".to_string(),
                Evidence::Missed(_) => "missed".to_string(),
                Evidence::Lost(r, _) => format!("lost:{}", r.as_str()),
            })
            .collect()
    }

    /// The trainer's exit is a loss at once, from its state; the restart
    /// that follows it after the back-off is the same loss, and Ready again
    /// closes it.
    #[test]
    fn a_terminated_trainer_is_lost_at_once_and_its_restart_is_the_same_loss() {
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        let mut t = Tracker::new("train-1", Duration::from_secs(30));
        let running = serde_json::json!({"running": {"startedAt": "2026-11-25T08:00:05Z"}});
        let up = trainer_pod(running.clone(), serde_json::json!({}), 0, true);
        assert_eq!(reasons(&t.apply(up, at("2026-11-25T08:00:10Z"))), ["alive"]);

        let exit = serde_json::json!({"terminated": {"exitCode": 137, "reason": "Error",
            "containerID": "containerd://aa", "finishedAt": "2026-11-25T08:10:00Z"}});
        let down = trainer_pod(exit.clone(), serde_json::json!({}), 0, false);
        assert_eq!(down.exited.get("trainer").map(|e| e.code), Some(137));
        let v = t.apply(down, at("2026-11-25T08:10:00Z"));
        assert_eq!(reasons(&v), ["lost:container-restarted"], "{v:?}");
        // In back-off: still down, the same loss.
        let waiting = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let backoff = trainer_pod(waiting, exit.clone(), 0, false);
        assert_eq!(
            reasons(&t.apply(backoff, at("2026-11-25T08:10:05Z"))),
            ["lost:container-restarted"]
        );
        // Restarted after the back-off (restart count + 1, the same exit as
        // its last state), not Ready yet: no second loss.
        let restarted = trainer_pod(running.clone(), exit.clone(), 1, false);
        assert_eq!(
            reasons(&t.apply(restarted, at("2026-11-25T08:10:11Z"))),
            ["suspect"]
        );
        // Ready again: alive (the peers' state machine closes the loss).
        let back = trainer_pod(running.clone(), exit.clone(), 1, true);
        assert_eq!(
            reasons(&t.apply(back, at("2026-11-25T08:10:12Z"))),
            ["alive"]
        );

        // A restart whose exit was never seen (the watch was down) is still
        // a loss, and back in the same update.
        let other_exit = serde_json::json!({"terminated": {"exitCode": 1,
            "containerID": "containerd://bb", "finishedAt": "2026-11-25T08:20:00Z"}});
        let again = trainer_pod(running, other_exit, 2, true);
        assert_eq!(
            reasons(&t.apply(again, at("2026-11-25T08:20:01Z"))),
            ["lost:container-restarted", "alive"]
        );
    }

    /// Through the peers' state machine: one loss (one generation) for one
    /// exit, healthy again once Ready.
    #[test]
    fn one_exit_is_one_generation() {
        use crate::config::NodeCount;
        use crate::peers::{Peers, State};
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        let mut t = Tracker::new("train-1", Duration::from_secs(30));
        let mut peers = Peers::new(NodeCount::Fixed(2), 1, 3, Instant::now());
        let mut losses = Vec::new();
        let running = serde_json::json!({"running": {}});
        let exit =
            serde_json::json!({"terminated": {"exitCode": 143, "containerID": "containerd://cc"}});
        let steps = [
            (
                trainer_pod(running.clone(), serde_json::json!({}), 0, true),
                "2026-11-25T08:00:10Z",
            ),
            (
                trainer_pod(exit.clone(), serde_json::json!({}), 0, false),
                "2026-11-25T08:10:00Z",
            ),
            (
                trainer_pod(running.clone(), exit.clone(), 1, true),
                "2026-11-25T08:10:10Z",
            ),
        ];
        for (view, now) in steps {
            for v in t.apply(view, at(now)) {
                losses.extend(peers.observe(Observation {
                    rank: v.rank,
                    source: Source::Kubernetes,
                    evidence: v.evidence,
                    at: Instant::now(),
                }));
            }
        }
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].generation, 1);
        assert_eq!(peers.get(0).map(|p| p.state), Some(State::Healthy));
    }

    /// A trainer that exits 0 finished its work: not a loss by itself; a
    /// pod being deleted stops its containers, which is the deletion's.
    #[test]
    fn a_completed_trainer_or_a_deleted_pod_is_not_a_container_loss() {
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        let mut t = Tracker::new("train-1", Duration::from_secs(30));
        let running = serde_json::json!({"running": {}});
        t.apply(
            trainer_pod(running, serde_json::json!({}), 0, true),
            at("2026-11-25T08:00:10Z"),
        );
        let done = serde_json::json!({"terminated": {"exitCode": 0, "reason": "Completed", "containerID": "containerd://dd"}});
        assert_eq!(
            reasons(&t.apply(
                trainer_pod(done, serde_json::json!({}), 0, false),
                at("2026-11-25T08:10:01Z")
            )),
            ["suspect"]
        );
        let stopped =
            serde_json::json!({"terminated": {"exitCode": 143, "containerID": "containerd://ee"}});
        let mut deleting = trainer_pod(stopped, serde_json::json!({}), 0, false);
        deleting.deletion = Some(at("2026-11-25T08:11:30Z"));
        assert_eq!(
            reasons(&t.apply(deleting, at("2026-11-25T08:11:01Z"))),
            ["suspect"]
        );
    }

    /// What happens to rank 0's pod in one step of a sequence.
    #[derive(Debug, Clone)]
    enum Step {
        /// Its trainer container restarts (same pod, same address), Ready
        /// again in the same update or not yet.
        RestartInPlace {
            ready: bool,
        },
        /// Its trainer container exits with an error (state `terminated`,
        /// not Ready; the restart count not moved yet).
        TrainerExits,
        BecomeReady,
        /// Not Ready (within the grace: suspect only).
        NotReady,
        /// Deleted, and a new pod (new UID, new address) comes up Ready.
        Replace,
        /// Deleted, nothing new yet.
        Delete,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            any::<bool>().prop_map(|ready| Step::RestartInPlace { ready }),
            Just(Step::TrainerExits),
            Just(Step::BecomeReady),
            Just(Step::NotReady),
            Just(Step::Replace),
            Just(Step::Delete),
        ]
    }

    proptest::proptest! {
        /// Over any sequence of container restarts, replacements, recoveries
        /// and losses, driven through the watch's decisions into the peers'
        /// state machine: no state is terminal (a pod that is Ready again is
        /// up again), every loss of a peer that was up is a loss with the
        /// next generation, and nothing else is.
        #[test]
        fn no_peer_state_is_terminal_and_every_loss_has_a_generation(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            use crate::config::NodeCount;
            use crate::peers::{Peers, State};
            let t0 = Instant::now();
            let start = Timestamp::from_second(1_700_000_000).expect("time");
            let mut tracker = Tracker::new("train-1", Duration::from_secs(30));
            let mut peers = Peers::new(NodeCount::Fixed(2), 1, 3, t0);
            let mut serial = 0u32;
            let new_pod = |serial: u32| PodView {
                name: "train-0".into(),
                uid: format!("u{serial}"),
                rank: Some(0),
                created: start.checked_add(jiff_seconds(serial)).ok(),
                phase: "Running".into(),
                status_reason: None,
                ready: Some(true),
                ready_since: start.checked_add(jiff_seconds(serial)).ok(),
                ready_reason: None,
                disruption: None,
                deletion: None,
                node: Some("n1".into()),
                address: Some(std::net::IpAddr::from([10, 0, 0, serial as u8])),
                restarts: BTreeMap::from([("trainer".to_string(), 0)]),
                exited: BTreeMap::new(),
                last_exit: BTreeMap::new(),
            };
            let mut pod = Some(new_pod(serial));
            let mut exits = 0u32;
            let feed = |peers: &mut Peers, verdicts: Vec<Verdict>| -> Vec<u64> {
                verdicts
                    .into_iter()
                    .filter_map(|v| {
                        peers.observe(Observation {
                            rank: v.rank,
                            source: Source::Kubernetes,
                            evidence: v.evidence,
                            at: Instant::now(),
                        })
                    })
                    .map(|l| l.generation)
                    .collect()
            };
            let now = start.checked_add(jiff_seconds(1)).expect("time");
            let v = tracker.apply(pod.clone().expect("pod"), now);
            feed(&mut peers, v);
            proptest::prop_assert_eq!(peers.get(0).map(|p| p.state), Some(State::Healthy));
            for step in steps {
                let before = peers.get(0).map(|p| p.state).expect("rank 0");
                let up = matches!(before, State::Healthy | State::Suspect | State::Replaced);
                let generation = peers.generation();
                let mut verdicts = Vec::new();
                let expect_loss;
                match (&step, pod.as_mut()) {
                    (Step::RestartInPlace { ready }, Some(p)) => {
                        *p.restarts.entry("trainer".into()).or_default() += 1;
                        // The exit it restarts from is its last state now.
                        match p.exited.remove("trainer") {
                            Some(exit) => {
                                p.last_exit.insert("trainer".into(), exit.key);
                            }
                            None => {
                                p.last_exit.insert("trainer".into(), format!("unseen-{exits}"));
                                exits += 1;
                            }
                        }
                        p.ready = Some(*ready);
                        p.ready_since = Some(now);
                        verdicts.extend(tracker.apply(p.clone(), now));
                        // Once per exit: an exit already seen was the loss.
                        expect_loss = up;
                    }
                    (Step::TrainerExits, Some(p)) => {
                        p.exited.insert(
                            "trainer".into(),
                            Exit { key: format!("exit-{exits}"), code: 137, reason: Some("Error".into()) },
                        );
                        exits += 1;
                        p.ready = Some(false);
                        p.ready_since = Some(now);
                        verdicts.extend(tracker.apply(p.clone(), now));
                        expect_loss = up;
                    }
                    // A pod is not Ready while its trainer is down.
                    (Step::BecomeReady, Some(p)) if !p.exited.is_empty() => expect_loss = false,
                    (Step::BecomeReady, Some(p)) => {
                        p.ready = Some(true);
                        verdicts.extend(tracker.apply(p.clone(), now));
                        expect_loss = false;
                    }
                    (Step::NotReady, Some(p)) => {
                        p.ready = Some(false);
                        p.ready_since = Some(now);
                        verdicts.extend(tracker.apply(p.clone(), now));
                        expect_loss = false;
                    }
                    (Step::Replace | Step::Delete, Some(p)) => {
                        verdicts.extend(tracker.delete(p));
                        expect_loss = up;
                        pod = None;
                    }
                    (_, None) => expect_loss = false,
                }
                if matches!(step, Step::Replace) {
                    serial += 1;
                    let p = new_pod(serial);
                    verdicts.extend(tracker.apply(p.clone(), now));
                    pod = Some(p);
                }
                let losses = feed(&mut peers, verdicts);
                if expect_loss {
                    proptest::prop_assert_eq!(&losses, &vec![generation + 1], "{:?} from {:?}", step, before);
                } else {
                    proptest::prop_assert!(losses.is_empty(), "{:?} from {:?}: {:?}", step, before, losses);
                }
                let after = peers.get(0).map(|p| p.state).expect("rank 0");
                // A pod that is there and Ready is up, whatever came before.
                if pod.as_ref().is_some_and(|p| p.ready == Some(true)) {
                    proptest::prop_assert!(
                        matches!(after, State::Healthy | State::Replaced),
                        "{:?} from {:?} left {:?}", step, before, after
                    );
                }
            }
        }
    }

    fn jiff_seconds(n: u32) -> k8s_openapi::jiff::SignedDuration {
        k8s_openapi::jiff::SignedDuration::from_secs(i64::from(n))
    }
}
