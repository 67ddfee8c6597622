//! The state of a training world as observed: pure functions from the pods
//! of one workload (as [`PodView`]s) and what was seen before ([`Memory`]) to
//! the `trainwire.dev/world` status ([`observe`]), and whether to write it
//! ([`decide_write`]). The world controller (`trainwire-controllers`) feeds
//! them from its watches; `kubectl trainwire status` from one list.
//!
//! ([`trainwire_contract::world`]), kept by the world controller.
//!
//! It runs in `trainwire-controllers` on the replica that holds the
//! controllers' Lease ([`crate::lease`]), beside the failure controller. Two
//! kube-rs [`Controller`]s, over StatefulSets and over Jobs, are re-triggered
//! by a shared Pod watch (a pod maps to its controller ownerReference). For
//! every injected workload (its pod template carries `trainwire.dev/status`)
//! a reconcile:
//!
//! 1. turns each of the workload's pods into a [`PodView`] (rank, Ready and
//!    since when, being deleted or failed, the sidecar's
//!    `trainwire.dev/peer-loss` and `trainwire.dev/checkpoint` records);
//! 2. calls the pure [`observe`], which finds new losses against what this
//!    replica saw before ([`Memory`]) and derives the status from the last
//!    one (the annotation as read, or the one this replica computed last);
//! 3. calls the pure [`decide_write`]: nothing when only `updatedAt` would
//!    change, else a merge patch of the annotation, at most once per
//!    [`MIN_WRITE_INTERVAL`] per workload (a write held back is made at the
//!    end of the interval, with whatever is true then).
//!
//! What counts as a loss: a pod of a rank below the expected size that gets
//! a `deletionTimestamp`, fails, gets a `DisruptionTarget` condition,
//! disappears or is replaced (a new UID for its rank) without one of those
//! being seen; or a sidecar's new peer-loss record. Signals about the same
//! rank while its loss is open are that one loss (the sidecars of every
//! survivor report it, and a pod deletion is seen too); each loss adds one
//! to the world's generation.
//!
//! What counts as "resumed": the first observation after the loss at which
//! every expected rank has a pod that is Ready and not being deleted, with
//! at least one of them Ready since after the loss (or the world seen broken
//! since). `resumedAt` is the latest of those pods' Ready transition times
//! (the kubelet's clock, not this controller's delay). A Ready trainer is the
//! closest observable to "training again": torchrun's rendezvous and the
//! script's checkpoint load come after it (5 to 8 s in docs/recovery.md's
//! measurements), and a script step is not visible from the API.
//!
//! On a new leader, [`Memory`] starts empty: the first observation of a
//! workload only learns its pods (no loss is counted) and the history comes
//! from the annotation, so a loss that happens while no replica leads is
//! counted only if its signs are still visible afterwards (a replaced pod is
//! not).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use trainwire_contract::peer_loss::{self, PeerLossRecord};
use trainwire_contract::world::{
    self, CheckpointRecord, CheckpointSeen, Loss, MAX_ACTIONS, Nodes, Phase, SCHEMA_VERSION,
    Stopped, WorldStatus,
};

use crate::mutation::annotations as ann;

/// The label StatefulSet pods carry their index in.
const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
/// The label (and annotation) Indexed Job pods carry their index in.
const JOB_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// One pod of the world, as the status needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub rank: u32,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// When its `Ready` condition last changed (to `True` if `ready`).
    pub ready_since: Option<Timestamp>,
    /// Lost: when, and what shows it.
    pub lost: Option<(Timestamp, &'static str)>,
    pub peer_loss: Option<PeerLossRecord>,
    pub checkpoint: Option<CheckpointRecord>,
}

impl PodView {
    /// The view of a pod; `None` without a rank (index label).
    pub fn of(pod: &Pod, now: Timestamp) -> Option<PodView> {
        let meta = &pod.metadata;
        let rank = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(POD_INDEX).or_else(|| l.get(JOB_INDEX)))
            .or_else(|| meta.annotations.as_ref().and_then(|a| a.get(JOB_INDEX)))
            .and_then(|v| v.parse::<u32>().ok())?;
        let status = pod.status.as_ref();
        let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
        let ready_condition = conditions.iter().find(|c| c.type_ == "Ready");
        let ready = ready_condition.is_some_and(|c| c.status == "True");
        let ready_since =
            ready_condition.and_then(|c| c.last_transition_time.as_ref().map(|t| t.0));
        let disrupted = conditions
            .iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True");
        let lost = if let Some(t) = &meta.deletion_timestamp {
            Some((t.0, "pod-deleted"))
        } else if let Some(c) = disrupted {
            Some((
                c.last_transition_time.as_ref().map_or(now, |t| t.0),
                "pod-disrupted",
            ))
        } else if status.and_then(|s| s.phase.as_deref()) == Some("Failed") {
            Some((now, "pod-failed"))
        } else {
            None
        };
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key));
        Some(PodView {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            rank,
            ready,
            ready_since,
            lost,
            peer_loss: annotation(peer_loss::ANNOTATION)
                .and_then(|v| PeerLossRecord::from_annotation(v)),
            checkpoint: annotation(world::CHECKPOINT_ANNOTATION)
                .and_then(|v| CheckpointRecord::from_annotation(v).ok()),
        })
    }
}

/// The workload's side: its size, whether it is stopped or finished.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorldOf {
    /// Nodes asked for (0 when paused), hot spares included.
    pub expected: u32,
    /// Of `expected`, the hot spares its pods were injected with.
    pub spares: u32,
    /// From the `trainwire.dev/stopped-*` annotations.
    pub stopped: Option<Stopped>,
    /// `Completed` or `Failed` for a finished Job.
    pub finished: Option<Phase>,
}

fn stopped_of(kind: &str, meta: &ObjectMeta) -> Option<Stopped> {
    let name = meta.name.as_deref().unwrap_or_default();
    let annotations = meta.annotations.as_ref()?;
    let reason = annotations.get(ann::STOPPED_REASON)?;
    Some(Stopped {
        reason: reason.clone(),
        at: annotations
            .get(ann::STOPPED_AT)
            .cloned()
            .unwrap_or_default(),
        pod: annotations
            .get(ann::STOPPED_POD)
            .cloned()
            .unwrap_or_default(),
        exit_code: annotations
            .get(ann::STOPPED_EXIT_CODE)
            .and_then(|c| c.parse().ok()),
        resume: format!(
            "kubectl annotate {} {name} {}=now",
            kind.to_lowercase(),
            ann::RESUME
        ),
    })
}

/// The hot spares recorded in the template's `trainwire.dev/status`.
fn spares_of(template: &PodTemplateSpec) -> u32 {
    crate::mutation::status::read(template).map_or(0, |s| s.spares)
}

impl WorldOf {
    /// The pods that must be Ready for the world to train.
    pub fn needed(&self) -> u32 {
        self.expected.saturating_sub(self.spares)
    }

    pub fn of_statefulset(sts: &StatefulSet) -> WorldOf {
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        WorldOf {
            expected: u32::try_from(replicas).unwrap_or(0),
            spares: sts.spec.as_ref().map_or(0, |s| spares_of(&s.template)),
            stopped: stopped_of("StatefulSet", &sts.metadata),
            finished: None,
        }
    }

    pub fn of_job(job: &Job) -> WorldOf {
        let spec = job.spec.as_ref();
        let suspended = spec.and_then(|s| s.suspend).unwrap_or(false);
        let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
        let condition = |t: &str| {
            job.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
        };
        let finished = if condition("Complete") {
            Some(Phase::Completed)
        } else if condition("Failed") {
            Some(Phase::Failed)
        } else {
            None
        };
        WorldOf {
            expected: if suspended {
                0
            } else {
                u32::try_from(parallelism).unwrap_or(0)
            },
            spares: spec.map_or(0, |s| spares_of(&s.template)),
            stopped: stopped_of("Job", &job.metadata),
            finished,
        }
    }
}

/// What this replica remembers of one workload between reconciles.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    /// Whether the pods were observed once (the first observation counts
    /// no loss: it only learns).
    primed: bool,
    /// The current pod of each rank, by UID.
    ranks: BTreeMap<u32, String>,
    /// UIDs of pods already counted lost.
    lost: BTreeSet<String>,
    /// Sidecar records already counted: (pod UID, the sidecar's generation).
    records: BTreeSet<(String, u64)>,
    /// The world was seen not whole since the open loss.
    broken_since_loss: bool,
    /// The last status computed (written, or waiting for the interval).
    pub status: Option<WorldStatus>,
    /// When this replica last wrote the annotation.
    pub last_write: Option<Timestamp>,
}

/// A loss seen in one observation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    rank: u32,
    at: Timestamp,
    detected_by: &'static str,
    action: Option<String>,
}

impl Memory {
    /// New losses in `pods` since the last observation; learns them.
    fn losses(&mut self, pods: &[PodView], expected: u32, now: Timestamp) -> Vec<Seen> {
        let count = self.primed;
        self.primed = true;
        let mut out = Vec::new();
        for p in pods {
            if let Some((at, how)) = p.lost
                && self.lost.insert(p.uid.clone())
                && count
                && p.rank < expected
            {
                out.push(Seen {
                    rank: p.rank,
                    at,
                    detected_by: how,
                    action: None,
                });
            }
        }
        for (rank, uid) in &self.ranks {
            if pods.iter().any(|p| p.uid == *uid) || self.lost.contains(uid) {
                continue;
            }
            self.lost.insert(uid.clone());
            if *rank < expected {
                let replaced = pods.iter().any(|p| p.rank == *rank);
                out.push(Seen {
                    rank: *rank,
                    at: now,
                    detected_by: if replaced { "pod-replaced" } else { "pod-gone" },
                    action: None,
                });
            }
        }
        for p in pods {
            let Some(r) = &p.peer_loss else { continue };
            if r.action == peer_loss::SPARE_TOOK_OVER {
                // Not a loss: when the world trains again (see `observe`).
                continue;
            }
            if self.records.insert((p.uid.clone(), r.generation)) && count {
                // The sidecar's clock, but never in the future of ours.
                let at =
                    r.at.parse::<Timestamp>()
                        .ok()
                        .filter(|t| *t <= now)
                        .unwrap_or(now);
                out.push(Seen {
                    rank: r.lost_rank,
                    at,
                    detected_by: "sidecar",
                    action: Some(format!("rank {}: {} {}", p.rank, r.action, r.result)),
                });
            }
        }
        // The current pod of each rank: one not lost, else the newest seen.
        let mut ranks = BTreeMap::new();
        for p in pods {
            if p.lost.is_none() || !ranks.contains_key(&p.rank) {
                ranks.insert(p.rank, p.uid.clone());
            }
        }
        self.ranks = ranks;
        // Bounded by the pods that exist.
        let present: BTreeSet<&String> = pods.iter().map(|p| &p.uid).collect();
        self.lost.retain(|u| present.contains(u));
        self.records.retain(|(u, _)| present.contains(u));
        out.sort_by_key(|s| s.at);
        out
    }
}

pub fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

/// Ranks below `expected` with a Ready pod not being deleted.
fn ready_ranks(expected: u32, pods: &[PodView]) -> u32 {
    (0..expected)
        .filter(|r| {
            pods.iter()
                .any(|p| p.rank == *r && p.ready && p.lost.is_none())
        })
        .count()
        .try_into()
        .unwrap_or(u32::MAX)
}

/// Whether the world can train: every rank below `expected` has a Ready pod
/// not being deleted, or, with hot spares, at least `expected - spares` do.
fn whole(workload: &WorldOf, pods: &[PodView]) -> bool {
    workload.needed() > 0 && ready_ranks(workload.expected, pods) >= workload.needed()
}

/// The earliest take-over of `rank` by a hot spare at or after `since`
/// (the spare's sidecar record, its clock, never after `now`).
fn spare_took_over(
    pods: &[PodView],
    rank: u32,
    since: Timestamp,
    now: Timestamp,
) -> Option<Timestamp> {
    pods.iter()
        .filter_map(|p| p.peer_loss.as_ref())
        .filter(|r| r.action == peer_loss::SPARE_TOOK_OVER && r.lost_rank == rank)
        .filter_map(|r| parse_time(&r.at))
        .filter(|t| *t >= since)
        .min()
        .map(|t| t.min(now))
}

fn add_loss(status: &mut WorldStatus, seen: Seen) -> bool {
    if let Some(l) = status.last_loss.as_mut()
        && l.rank == seen.rank
    {
        let open = l.resumed_at.is_none();
        let before_resume = l
            .resumed_at
            .as_deref()
            .and_then(parse_time)
            .is_some_and(|r| seen.at <= r);
        if open || before_resume {
            // The same loss, told by another source.
            if parse_time(&l.at).is_none_or(|at| seen.at < at) && open {
                l.at = seen.at.to_string();
            }
            if let Some(a) = seen.action
                && !l.actions.contains(&a)
                && l.actions.len() < MAX_ACTIONS
            {
                l.actions.push(a);
            }
            return false;
        }
    }
    status.generation += 1;
    status.last_loss = Some(Loss {
        generation: status.generation,
        rank: seen.rank,
        at: seen.at.to_string(),
        detected_by: seen.detected_by.to_string(),
        actions: seen.action.into_iter().collect(),
        resumed_at: None,
        recovery_seconds: None,
    });
    true
}

/// The world's status now: `previous` (the annotation as read, or what this
/// replica computed last) moved on by what `pods` show. Pure but for
/// `memory`, which it updates.
pub fn observe(
    previous: Option<&WorldStatus>,
    memory: &mut Memory,
    workload: &WorldOf,
    pods: &[PodView],
    now: Timestamp,
) -> WorldStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.version = SCHEMA_VERSION;
    for seen in memory.losses(pods, workload.expected, now) {
        if add_loss(&mut status, seen) {
            memory.broken_since_loss = false;
        }
    }
    let is_whole = whole(workload, pods);
    if let Some(l) = status.last_loss.as_mut()
        && l.resumed_at.is_none()
    {
        let loss_at = parse_time(&l.at).unwrap_or(now);
        if let Some(took_over) = spare_took_over(pods, l.rank, loss_at, now)
            && is_whole
        {
            // A hot spare trains in the lost node's place: the world
            // trains again from then, whatever the replacement does.
            l.resumed_at = Some(took_over.to_string());
            l.recovery_seconds = took_over.duration_since(loss_at).as_secs().try_into().ok();
            memory.broken_since_loss = false;
        } else if !is_whole {
            memory.broken_since_loss = true;
        } else {
            let latest_ready = pods
                .iter()
                .filter(|p| p.rank < workload.expected && p.ready && p.lost.is_none())
                .filter_map(|p| p.ready_since)
                .max();
            if latest_ready.is_some_and(|r| r >= loss_at) || memory.broken_since_loss {
                let resumed = latest_ready.unwrap_or(now).max(loss_at).min(now);
                l.resumed_at = Some(resumed.to_string());
                l.recovery_seconds = resumed.duration_since(loss_at).as_secs().try_into().ok();
                memory.broken_since_loss = false;
            }
        }
    }
    status.nodes = Nodes {
        ready: ready_ranks(workload.expected, pods),
        expected: workload.expected,
        spares: workload.spares,
    };
    let records: Vec<(&CheckpointRecord, Timestamp)> = pods
        .iter()
        .filter_map(|p| p.checkpoint.as_ref())
        .filter_map(|c| parse_time(&c.at).map(|t| (c, t)))
        .collect();
    status.checkpoint = records
        .iter()
        .max_by_key(|(_, t)| *t)
        .map(|(c, t)| CheckpointSeen {
            name: c.name.clone(),
            newest_at: t.to_string(),
            reported_by: records.len().try_into().unwrap_or(u32::MAX),
        });
    status.stopped = workload.stopped.clone();
    let open = status
        .last_loss
        .as_ref()
        .is_some_and(|l| l.resumed_at.is_none());
    status.phase = if status.stopped.is_some() {
        Phase::Stopped
    } else if let Some(finished) = workload.finished {
        finished
    } else if workload.expected == 0 {
        Phase::Paused
    } else if open {
        Phase::Recovering
    } else if is_whole {
        Phase::Running
    } else {
        Phase::Forming
    };
    status
}

/// What to do with a computed status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// The annotation already says it.
    Unchanged,
    /// Write it now.
    Now,
    /// Written too recently: look again after this long.
    After(Duration),
}

/// Whether to write `desired` over `current` (the annotation as read),
/// given the last write (this replica's, else `current.updatedAt`).
pub fn decide_write(
    current: Option<&WorldStatus>,
    desired: &WorldStatus,
    last_write: Option<Timestamp>,
    now: Timestamp,
    min_interval: Duration,
) -> Write {
    if current.is_some_and(|c| c.same_as(desired)) {
        return Write::Unchanged;
    }
    let next = last_write.and_then(|t| t.checked_add(min_interval).ok());
    match next {
        Some(next) if next > now => Write::After(
            next.duration_since(now)
                .try_into()
                .unwrap_or(min_interval)
                .max(Duration::from_secs(1)),
        ),
        _ => Write::Now,
    }
}

#[cfg(test)]
mod tests;
