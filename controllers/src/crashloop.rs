//! Crash-loop stop: the pure decisions. Every trainer termination the
//! controller sees is judged once: a success, a loss explained by a peer or
//! node loss (never counted), or a failure; a failure with a fail-fast exit
//! code stops the world at once, and the `N`-th counted failure within the
//! window stops it too. The controller ([`crate::failures`]) feeds it and
//! applies the stop.
//!
//! Fields relied on (Kubernetes API reference, core/v1 `ContainerStatus`):
//! `name`, `restartCount`, `state.terminated` and `lastState.terminated`
//! (`exitCode`, `reason` such as `Error` or `OOMKilled`, `finishedAt`);
//! `Pod.metadata.deletionTimestamp`; the pod condition `DisruptionTarget`
//! (`status: True`, set by the control plane when it evicts, preempts or
//! garbage-collects a pod).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use trainwire_engine::policy::{CrashLoopPolicy, ExitCodes, FailureLimit};

/// What crash-loop stop calls on top of the failure controller's own watch
/// of injected pods ([`crate::failures::API_PERMISSIONS`]), granted by
/// `manifests/components/crash-loop` only: it watches StatefulSets and Jobs
/// (their stop and resume annotations), scales a crash-looping StatefulSet
/// to 0 or suspends a Job (a merge patch with the evidence in annotations),
/// and undoes it on `trainwire.dev/resume`.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("apps", "statefulsets", "list"),
    ("apps", "statefulsets", "watch"),
    ("apps", "statefulsets", "patch"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("batch", "jobs", "patch"),
];

/// A trainer failure that finished this long before a peer loss is put down
/// to that loss (the survivor noticed a moment before the controller did).
pub const LOSS_BEFORE: Duration = Duration::from_secs(10);
/// A trainer failure that finished up to this long after a peer loss is put
/// down to that loss: the survivors' agents time out on the lost rendezvous
/// (`keep_alive` ~3 s, `read_timeout` 60 s) or are SIGKILLed by the sidecar
/// (exit 137), and the container may exit again while the replacement comes.
pub const LOSS_AFTER: Duration = Duration::from_secs(180);

/// One trainer container exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Termination {
    pub pod: String,
    pub pod_uid: String,
    pub exit_code: i32,
    pub reason: Option<String>,
    pub finished_at: Timestamp,
}

/// The limits in force for one workload: its annotations, else the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub fail_fast: ExitCodes,
    pub max_failures: FailureLimit,
}

impl Limits {
    pub fn resolve(
        policy: &CrashLoopPolicy,
        fail_fast: Option<ExitCodes>,
        max_failures: Option<FailureLimit>,
    ) -> Limits {
        Limits {
            fail_fast: fail_fast.unwrap_or_else(|| policy.fail_fast_exit_codes.clone()),
            max_failures: max_failures.unwrap_or(policy.max_failures),
        }
    }
}

/// Why a world is stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The trainer exited with a fail-fast code.
    FailFastExitCode,
    /// Too many counted failures within the window.
    MaxFailures { failures: u32, window: String },
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::FailFastExitCode => f.write_str("FailFastExitCode"),
            StopReason::MaxFailures { .. } => f.write_str("MaxFailures"),
        }
    }
}

/// What one termination means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Seen before (the same pod and finish time).
    AlreadySeen,
    /// Exit code 0.
    Success,
    /// Put down to a peer or node loss: never counted.
    Explained,
    /// Counted; `count` failures in the window so far.
    Counted { count: u32 },
    /// Stop the world.
    Stop {
        reason: StopReason,
        termination: Termination,
    },
}

/// What the controller remembers about one workload between reconciles.
#[derive(Debug, Default)]
pub struct History {
    seen: HashSet<(String, Timestamp)>,
    counted: VecDeque<Timestamp>,
    losses: Vec<Timestamp>,
    /// Peer losses seen so far (the controller's loss generation).
    pub generation: u64,
}

impl History {
    /// A peer or node loss of this workload at `at`. Returns the new
    /// generation.
    pub fn loss(&mut self, at: Timestamp) -> u64 {
        self.losses.push(at);
        // Keep what can still explain a failure.
        let keep =
            SignedDuration::try_from(LOSS_AFTER + LOSS_BEFORE).unwrap_or(SignedDuration::MAX);
        if let Ok(cut) = at.checked_sub(keep) {
            self.losses.retain(|l| *l >= cut);
        }
        self.generation += 1;
        self.generation
    }

    fn explained(&self, finished: Timestamp) -> bool {
        let before = SignedDuration::try_from(LOSS_BEFORE).unwrap_or(SignedDuration::MAX);
        let after = SignedDuration::try_from(LOSS_AFTER).unwrap_or(SignedDuration::MAX);
        self.losses.iter().any(|l| {
            l.checked_sub(before).is_ok_and(|lo| finished >= lo)
                && l.checked_add(after).is_ok_and(|hi| finished <= hi)
        })
    }

    /// Judge one termination. `own_loss`: the pod itself was lost (being
    /// deleted, a `DisruptionTarget`, its node not ready).
    pub fn observe(&mut self, t: Termination, own_loss: bool, limits: &Limits) -> Verdict {
        if !self.seen.insert((t.pod_uid.clone(), t.finished_at)) {
            return Verdict::AlreadySeen;
        }
        if t.exit_code == 0 {
            return Verdict::Success;
        }
        if own_loss || self.explained(t.finished_at) {
            return Verdict::Explained;
        }
        if limits.fail_fast.contains(t.exit_code) {
            return Verdict::Stop {
                reason: StopReason::FailFastExitCode,
                termination: t,
            };
        }
        let window = SignedDuration::try_from(limits.max_failures.window.get())
            .unwrap_or(SignedDuration::MAX);
        let cut = t.finished_at.checked_sub(window).unwrap_or(Timestamp::MIN);
        self.counted.push_back(t.finished_at);
        self.counted.retain(|c| *c > cut);
        let count = u32::try_from(self.counted.len()).unwrap_or(u32::MAX);
        if !limits.max_failures.disabled() && count >= limits.max_failures.failures {
            return Verdict::Stop {
                reason: StopReason::MaxFailures {
                    failures: count,
                    window: limits.max_failures.window.to_string(),
                },
                termination: t,
            };
        }
        Verdict::Counted { count }
    }

    /// Forget the counted failures (after a stop or a resume).
    pub fn reset(&mut self) {
        self.counted.clear();
    }
}

/// The trainer's status in a pod: the container named `trainer` in the
/// status record, else the one with the injected `PET_RDZV_BACKEND` env.
pub fn trainer_status<'a>(pod: &'a Pod, trainer: &str) -> Option<&'a ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == trainer)
}

/// Every trainer exit a pod shows: the current state (a Job pod that
/// failed, or between restarts) and the last one (a restarted container).
pub fn terminations(pod: &Pod, trainer: &str) -> Vec<Termination> {
    let Some(status) = trainer_status(pod, trainer) else {
        return Vec::new();
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    [
        status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref()),
        status.state.as_ref().and_then(|s| s.terminated.as_ref()),
    ]
    .into_iter()
    .flatten()
    .filter_map(|t| {
        Some(Termination {
            pod: name.clone(),
            pod_uid: uid.clone(),
            exit_code: t.exit_code,
            reason: t.reason.clone(),
            finished_at: t.finished_at.as_ref()?.0,
        })
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde_json::json;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn term(pod: &str, uid: &str, code: i32, at: i64) -> Termination {
        Termination {
            pod: pod.to_string(),
            pod_uid: uid.to_string(),
            exit_code: code,
            reason: Some("Error".to_string()),
            finished_at: ts(at),
        }
    }

    fn limits(fail_fast: &str, max: &str) -> Limits {
        Limits {
            fail_fast: fail_fast.parse().unwrap_or_default(),
            max_failures: max.parse().unwrap_or_else(|_| panic!("{max}")),
        }
    }

    /// (pod uid, exit code, finished at, own loss, peer loss at) per step;
    /// the verdict of the last step.
    #[rstest]
    #[case::fail_fast_at_first(vec![("a", 1, 0, false, None)], "1,2,126-127", "0", "stop FailFastExitCode 1")]
    #[case::not_fail_fast_counts(vec![("a", 3, 0, false, None)], "1", "5", "counted 1")]
    #[case::success_is_not_a_failure(vec![("a", 0, 0, false, None)], "1", "1", "success")]
    #[case::sidecar_kill_after_peer_loss(vec![("a", 137, 5, false, Some(0))], "137", "1", "explained")]
    #[case::own_loss(vec![("a", 1, 5, true, None)], "1", "1", "explained")]
    #[case::loss_long_ago_explains_nothing(vec![("a", 1, 500, false, Some(0))], "1", "0", "stop FailFastExitCode 1")]
    #[case::nth_failure_within_window(vec![("a", 3, 0, false, None), ("a", 3, 10, false, None), ("b", 3, 20, false, None)], "none", "3/1m", "stop MaxFailures 3")]
    #[case::old_failures_leave_the_window(vec![("a", 3, 0, false, None), ("a", 3, 10, false, None), ("b", 3, 100, false, None)], "none", "3/1m", "counted 1")]
    #[case::a_peer_loss_in_between_does_not_count(vec![("a", 3, 0, false, None), ("a", 137, 10, false, Some(8)), ("b", 3, 300, false, None)], "none", "3/1h", "counted 2")]
    #[case::same_exit_twice_counted_once(vec![("a", 3, 0, false, None), ("a", 3, 0, false, None)], "none", "3/1h", "seen")]
    #[case::zero_never_stops(vec![("a", 3, 0, false, None), ("a", 3, 1, false, None), ("a", 3, 2, false, None)], "none", "0", "counted 3")]
    fn verdicts(
        #[case] steps: Vec<(&str, i32, i64, bool, Option<i64>)>,
        #[case] fail_fast: &str,
        #[case] max: &str,
        #[case] expected: &str,
    ) {
        let l = limits(fail_fast, max);
        let mut h = History::default();
        let mut last = Verdict::AlreadySeen;
        for (uid, code, at, own, loss) in steps {
            if let Some(loss) = loss {
                h.loss(ts(loss));
            }
            last = h.observe(term("p", uid, code, at), own, &l);
        }
        let got = match last {
            Verdict::AlreadySeen => "seen".to_string(),
            Verdict::Success => "success".to_string(),
            Verdict::Explained => "explained".to_string(),
            Verdict::Counted { count } => format!("counted {count}"),
            Verdict::Stop {
                reason: StopReason::MaxFailures { failures, .. },
                ..
            } => {
                format!("stop MaxFailures {failures}")
            }
            Verdict::Stop {
                reason,
                termination,
            } => format!("stop {reason} {}", termination.exit_code),
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn terminations_come_from_state_and_last_state() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "w-0", "uid": "u0"},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "trainer", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                   "startedAt": "2026-11-23T10:00:00Z", "finishedAt": "2026-11-23T10:00:05Z"}}},
                {"name": "other", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                 "lastState": {"terminated": {"exitCode": 9, "finishedAt": "2026-11-23T10:00:05Z"}}}]}
        }))
        .unwrap_or_default();
        let t = terminations(&pod, "trainer");
        assert_eq!(t.len(), 1);
        assert_eq!((t[0].exit_code, t[0].pod.as_str()), (1, "w-0"));
        assert!(!trainwire_engine::pod::lost(&pod));
        let evicted: Pod = serde_json::from_value(json!({
            "metadata": {"name": "w-1"},
            "status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
              "reason": "DeletionByTaintManager", "lastTransitionTime": "2026-11-23T10:00:00Z"}]}
        }))
        .unwrap_or_default();
        assert!(trainwire_engine::pod::lost(&evicted));
    }
}
