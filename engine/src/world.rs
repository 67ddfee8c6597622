//! The state of a training world as observed: pure functions from the pods
//! of one workload (as [`PodView`]s), its dedicated store's pods (as
//! [`StoreView`]s) and what was seen before ([`Memory`]) to the
//! `trainwire.dev/world` status ([`observe`]), and whether to write it
//! ([`decide_write`]). The world controller (`trainwire-controllers`) feeds
//! them from its watches; `kubectl trainwire status` from one list. Every
//! time is passed in: nothing here reads a clock.
//!
//! What counts as a **loss** (each opens an episode and adds one to the
//! world's generation):
//! - a pod of a rank below the expected size that gets a
//!   `deletionTimestamp`, a `DisruptionTarget` condition or phase `Failed`,
//!   or that disappears or is replaced (a new UID for its rank) without one
//!   of those being seen;
//! - its trainer container terminated (`state.terminated`, or a
//!   `lastState.terminated` newer than the last one seen), at the
//!   container's `finishedAt`: the kubelet shows that at once, while
//!   `restartCount` moves only when it restarts the container after its
//!   back-off;
//! - a sidecar's new `trainwire.dev/peer-loss` record, dated at its
//!   `suspectedAt` (for a survivor's heartbeats, the first beat the peer
//!   did not answer: a silent loss, `detectedBy: heartbeat`). The pod it names (the one holding
//!   the rank that existed at the loss) is then out of the world
//!   ([`Memory`]): its role `lost`, and its later deletion, disappearance,
//!   trainer exit, or its own sidecar's records of its peers, no new loss,
//!   until its own sidecar says it trains again after the loss;
//! - the dedicated store's pod deleted, failed, its container exited, or
//!   gone or replaced (a loss of its own: every agent exits with it).
//!
//! Signals about the same rank (or the store) while its loss is open are
//! that one loss; a trainer container that exits while a loss is open is a
//! consequence of it (agents exit when their store or rendezvous host goes),
//! noted in its actions, not a new loss.
//!
//! What counts as **resumed**: an observation that training runs again after
//! the loss (and after the last trainer exit it caused), never a pod's
//! readiness: a sidecar's record that the trainer's workers, started after
//! it, train (`trainingSince`, by what it saw), a hot spare's take-over
//! record, or a second checkpoint written after it (a node cut off mid-step
//! can still write the first). `resumedAt` is the earliest of the strongest
//! kind seen (the collective's traffic dates the first step; workers
//! started precede it), dated again when a stronger kind of the same
//! resumption comes later. The
//! loss closes when the world is whole again (the needed ranks Ready, their
//! trainers running, the store available) and training was seen; until then
//! the phase is `Recovering` and `waitingFor` says for what. A world whose
//! pods run no sidecar cannot show training: its loss closes as
//! `not-observable` once it is whole. Scaling to zero, a stop or a finished
//! Job close an open loss too (`closedBy`), without a `resumedAt`.
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
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use trainwire_contract::peer_loss::{self, PeerLossRecord};
use trainwire_contract::world::{
    self, CheckpointRecord, CheckpointSeen, Loss, MAX_ACTIONS, MAX_RANKS, Nodes, Phase, RankRole,
    Role, Stopped, StoreSeen, WorldStatus,
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
    /// The trainer container's latest exit the pod status shows (its
    /// `state.terminated` or `lastState.terminated`, `finishedAt`).
    pub trainer_exit: Option<Timestamp>,
    /// The trainer container is not running now (terminated, or waiting to
    /// be restarted after an exit).
    pub trainer_down: bool,
    /// The pod runs trainwire's sidecar (an init container that restarts
    /// always): training can be observed from it.
    pub sidecar: bool,
    /// Its `creationTimestamp`: a pod created after a loss of its rank is
    /// that rank's replacement, not the pod that was lost.
    pub created: Option<Timestamp>,
    pub peer_loss: Option<PeerLossRecord>,
    pub checkpoint: Option<CheckpointRecord>,
    /// Its sidecar's record of a stall (`trainwire.dev/stall`).
    pub stall: Option<trainwire_contract::stall::StallRecord>,
}

/// The container status of `name` among `statuses`, else of the only one.
fn trainer_status<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|c| c.name == name).or(match statuses {
        [only] => Some(only),
        _ => None,
    })
}

/// The latest exit of a container and whether it is down now; `None` for
/// an exit that is a normal end (code 0 where the pod does not restart it).
fn container_exit(
    c: &ContainerStatus,
    restarts_always: bool,
    now: Timestamp,
) -> (Option<Timestamp>, bool) {
    let state = c.state.as_ref();
    let current = state.and_then(|s| s.terminated.as_ref());
    let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let waiting = state.is_some_and(|s| s.waiting.is_some());
    let ended = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        if t.exit_code == 0 && !restarts_always {
            return None;
        }
        Some(
            t.finished_at
                .as_ref()
                .or(t.started_at.as_ref())
                .map_or(now, |x| x.0),
        )
    };
    match (current, last) {
        (Some(t), _) => (ended(t), ended(t).is_some()),
        (None, Some(t)) => (ended(t), waiting && ended(t).is_some()),
        (None, None) => (None, false),
    }
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
        let (ready, ready_since) = ready_of(pod);
        let disrupted = crate::pod::disruption(pod);
        let phase = status.and_then(|s| s.phase.as_deref());
        let lost = if let Some(t) = deleted_at(meta) {
            Some((t, "pod-deleted"))
        } else if let Some(c) = disrupted {
            Some((
                c.last_transition_time.as_ref().map_or(now, |t| t.0),
                "pod-disrupted",
            ))
        } else if phase == Some("Failed") {
            Some((now, "pod-failed"))
        } else {
            None
        };
        let restarts_always = pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .is_none_or(|p| p == "Always");
        let statuses = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or(&[]);
        let record = crate::pod::status_record(meta);
        let (trainer, sidecar) = (
            crate::pod::trainer_of(pod, record.as_ref()),
            crate::pod::runs_sidecar(record.as_ref()),
        );
        let (trainer_exit, trainer_down) = match trainer_status(statuses, &trainer) {
            Some(c) if phase != Some("Succeeded") => container_exit(c, restarts_always, now),
            _ => (None, false),
        };
        let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key));
        Some(PodView {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            rank,
            ready,
            ready_since,
            lost,
            trainer_exit,
            trainer_down,
            sidecar,
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            peer_loss: annotation(peer_loss::ANNOTATION)
                .and_then(|v| PeerLossRecord::from_annotation(v)),
            checkpoint: annotation(world::CHECKPOINT_ANNOTATION)
                .and_then(|v| CheckpointRecord::from_annotation(v).ok()),
            stall: annotation(trainwire_contract::stall::ANNOTATION)
                .and_then(|v| trainwire_contract::stall::StallRecord::from_annotation(v)),
        })
    }

    /// Part of the world now: not lost, its trainer not down.
    fn up(&self) -> bool {
        self.lost.is_none() && !self.trainer_down
    }
}

/// When the pod's deletion was asked for: its `deletionTimestamp` is that
/// plus the grace period (the time by which it should be gone).
fn deleted_at(meta: &ObjectMeta) -> Option<Timestamp> {
    let t = meta.deletion_timestamp.as_ref()?.0;
    let grace = meta
        .deletion_grace_period_seconds
        .filter(|g| (0..=86_400 * 365).contains(g))
        .unwrap_or(0);
    Some(
        t.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(grace))
            .unwrap_or(t),
    )
}

/// A pod's `Ready` condition: whether `True`, and since when.
fn ready_of(pod: &Pod) -> (bool, Option<Timestamp>) {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
        .iter()
        .find(|c| c.type_ == "Ready");
    (
        ready.is_some_and(|c| c.status == "True"),
        ready.and_then(|c| c.last_transition_time.as_ref().map(|t| t.0)),
    )
}

/// One pod of a dedicated rendezvous store (label `trainwire.dev/rdzv-store`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreView {
    pub name: String,
    pub uid: String,
    pub ready: bool,
    pub ready_since: Option<Timestamp>,
    /// Lost: when, and what shows it (`store-deleted`, `store-failed`,
    /// `store-exited`).
    pub lost: Option<(Timestamp, &'static str)>,
}

impl StoreView {
    pub fn of(pod: &Pod, now: Timestamp) -> StoreView {
        let meta = &pod.metadata;
        let (ready, ready_since) = ready_of(pod);
        let status = pod.status.as_ref();
        let exit = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or(&[])
            .iter()
            .map(|c| container_exit(c, true, now))
            .find(|(_, down)| *down);
        let lost = if let Some(t) = deleted_at(meta) {
            Some((t, "store-deleted"))
        } else if status.and_then(|s| s.phase.as_deref()) == Some("Failed") {
            Some((now, "store-failed"))
        } else {
            exit.map(|(at, _)| (at.unwrap_or(now), "store-exited"))
        };
        StoreView {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            ready,
            ready_since,
            lost,
        }
    }

    fn available(&self) -> bool {
        self.ready && self.lost.is_none()
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
    /// It was injected with a dedicated rendezvous store (`<name>-rdzv`).
    pub dedicated_store: bool,
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

/// The hot spares and whether a dedicated store was injected, from the
/// template's `trainwire.dev/status`.
fn injected_of(template: &PodTemplateSpec) -> (u32, bool) {
    crate::mutation::status::read(template)
        .map_or((0, false), |s| (s.spares, !s.rdzv_store.is_empty()))
}

impl WorldOf {
    /// The pods that must be Ready for the world to train.
    pub fn needed(&self) -> u32 {
        self.expected.saturating_sub(self.spares)
    }

    pub fn of_statefulset(sts: &StatefulSet) -> WorldOf {
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let (spares, dedicated_store) = sts
            .spec
            .as_ref()
            .map_or((0, false), |s| injected_of(&s.template));
        WorldOf {
            expected: u32::try_from(replicas).unwrap_or(0),
            spares,
            stopped: stopped_of("StatefulSet", &sts.metadata),
            finished: None,
            dedicated_store,
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
        let (spares, dedicated_store) = spec.map_or((0, false), |s| injected_of(&s.template));
        WorldOf {
            expected: if suspended {
                0
            } else {
                u32::try_from(parallelism).unwrap_or(0)
            },
            spares,
            stopped: stopped_of("Job", &job.metadata),
            finished,
            dedicated_store,
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
    /// The latest trainer exit seen per pod UID.
    exits: BTreeMap<String, Timestamp>,
    /// Sidecar records already counted: (pod UID, the sidecar's generation).
    records: BTreeSet<(String, u64)>,
    /// The store's current pod.
    store: Option<StoreMemory>,
    /// The latest disruption of the open loss (the loss, and the trainer
    /// exits it caused): training seen after it resumes the loss.
    disrupted_until: Option<Timestamp>,
    /// The first checkpoint seen written after that disruption (with the
    /// disruption it is after): a node cut off mid-step can still finish
    /// its step and write one (4 s after a cut in `spares_e2e`, 0.8 s after
    /// a store loss), so only a checkpoint with another name after it shows
    /// training.
    checkpoint_after: Option<(Timestamp, String)>,
    /// Pods still there that a survivor's sidecar counted lost (a silent
    /// loss: their pod object unchanged), by UID, with the loss's time: out
    /// of the world until their own sidecar says they train again after it.
    /// Their deletion, disappearance or trainer exit, and the losses their
    /// own sidecar tells of, are not new losses.
    out: BTreeMap<String, Timestamp>,
    /// The last loss's resumption while a stronger observation may still
    /// date it better: the disruption it is after, and the strength of
    /// what it resumed by ([`strength`]).
    resumed: Option<(Timestamp, u8)>,
    /// The last status computed (written, or waiting for the interval).
    pub status: Option<WorldStatus>,
    /// When this replica last wrote the annotation.
    pub last_write: Option<Timestamp>,
}

/// What a loss is of.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Subject {
    Rank(u32),
    Store(String),
}

/// A loss seen in one observation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    subject: Subject,
    at: Timestamp,
    detected_by: &'static str,
    action: Option<String>,
    /// A trainer exit or a sidecar's report: while another loss is open it
    /// is a consequence of that one (agents exit when their store or
    /// rendezvous host goes; survivors report the exits), not a new loss.
    consequence: bool,
    /// A sidecar's record (said late, it may still be about the last loss).
    record: bool,
    /// Of a pod already out of the world ([`Memory::out`]): a note on the
    /// loss that counted it, never a new loss.
    out: bool,
}

impl Memory {
    /// New losses in `pods` and `store` since the last observation; learns
    /// them.
    fn losses(
        &mut self,
        pods: &[PodView],
        store: Option<&[StoreView]>,
        expected: u32,
        now: Timestamp,
    ) -> Vec<Seen> {
        let count = self.primed;
        self.primed = true;
        let mut out = Vec::new();
        let seen = |subject: Subject, at: Timestamp, detected_by: &'static str| Seen {
            subject,
            at,
            detected_by,
            action: None,
            consequence: false,
            record: false,
            out: false,
        };
        for p in pods {
            let Some(r) = &p.peer_loss else { continue };
            if !r.is_loss() {
                // A spare's take-over, this pod's own trainer restarted:
                // not a loss, when the world trains again (see `observe`).
                continue;
            }
            if !self.records.insert((p.uid.clone(), r.generation)) {
                continue;
            }
            if self.out.contains_key(&p.uid) {
                // A pod cut off from its peers tells of their loss: the
                // mirror of its own.
                continue;
            }
            let at = record_loss_time(r, now);
            // The pod of the rank it tells of, when still there and not
            // lost by its own signs (a silent loss): out of the world from
            // the loss. Not its replacement (created after it); on a first
            // observation, only a pod known to be older than the loss.
            if r.lost_rank != p.rank {
                for q in pods.iter().filter(|q| {
                    q.rank == r.lost_rank
                        && q.uid != p.uid
                        && q.lost.is_none()
                        && q.created.map_or(count, |c| c <= at)
                }) {
                    self.out.entry(q.uid.clone()).or_insert(at);
                }
            }
            if count {
                out.push(Seen {
                    action: Some(format!("rank {}: {} {}", p.rank, r.action, r.result)),
                    consequence: true,
                    record: true,
                    ..seen(
                        Subject::Rank(r.lost_rank),
                        at,
                        if r.lost_by_heartbeat() {
                            "heartbeat"
                        } else {
                            "sidecar"
                        },
                    )
                });
            }
        }
        // Back in the world: its own sidecar says it trains after its loss.
        self.out.retain(|uid, since| {
            !pods
                .iter()
                .any(|p| p.uid == *uid && trains_since(p).is_some_and(|t| t >= *since))
        });
        for p in pods {
            let was_out = self.out.contains_key(&p.uid);
            if let Some((at, how)) = p.lost
                && self.lost.insert(p.uid.clone())
                && count
                && p.rank < expected
            {
                out.push(Seen {
                    action: was_out.then(|| format!("rank {}: {how} after its loss", p.rank)),
                    out: was_out,
                    ..seen(Subject::Rank(p.rank), at, how)
                });
            }
            if let Some(exit) = p.trainer_exit {
                let newer = self.exits.get(&p.uid).is_none_or(|seen| exit > *seen);
                self.exits.insert(p.uid.clone(), exit);
                if newer && count && p.rank < expected && p.lost.is_none() && !was_out {
                    out.push(Seen {
                        action: Some(format!("rank {}: trainer exited", p.rank)),
                        consequence: true,
                        ..seen(Subject::Rank(p.rank), exit.min(now), "container-exited")
                    });
                }
            }
        }
        for (rank, uid) in &self.ranks {
            if pods.iter().any(|p| p.uid == *uid) || self.lost.contains(uid) {
                continue;
            }
            self.lost.insert(uid.clone());
            if *rank < expected {
                let replaced = pods.iter().any(|p| p.rank == *rank);
                let how = if replaced { "pod-replaced" } else { "pod-gone" };
                let was_out = self.out.contains_key(uid);
                out.push(Seen {
                    action: was_out.then(|| format!("rank {rank}: {how} after its loss")),
                    out: was_out,
                    ..seen(Subject::Rank(*rank), now, how)
                });
            }
        }
        if let Some(stores) = store {
            out.extend(self.store_losses(stores, count && expected > 0, now));
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
        self.exits.retain(|u, _| present.contains(u));
        self.records.retain(|(u, _)| present.contains(u));
        self.out.retain(|u, _| present.contains(u));
        out.sort_by_key(|s| s.at);
        out
    }

    /// A loss of the store: its current pod lost, gone or replaced.
    fn store_losses(&mut self, stores: &[StoreView], count: bool, now: Timestamp) -> Vec<Seen> {
        let mut out = Vec::new();
        let mut seen = |subject: String, at: Timestamp, how: &'static str| {
            if count {
                out.push(Seen {
                    subject: Subject::Store(subject),
                    at,
                    detected_by: how,
                    action: None,
                    consequence: false,
                    record: false,
                    out: false,
                });
            }
        };
        if let Some(known) = self.store.clone() {
            match stores.iter().find(|s| s.uid == known.uid) {
                Some(s) => {
                    if let Some((at, how)) = s.lost
                        && !known.counted
                    {
                        seen(s.name.clone(), at, how);
                        self.store = Some(StoreMemory {
                            counted: true,
                            ..known
                        });
                    } else if s.lost.is_none() && known.counted {
                        // Its container runs again: a next exit is a new loss.
                        self.store = Some(StoreMemory {
                            counted: false,
                            ..known
                        });
                    }
                }
                None => {
                    if !known.counted {
                        let how = if stores.is_empty() {
                            "store-gone"
                        } else {
                            "store-replaced"
                        };
                        seen(known.name.clone(), now, how);
                    }
                    self.store = None;
                }
            }
        }
        // Follow the store's new pod (a replacement is a new life).
        let current = stores
            .iter()
            .find(|s| s.lost.is_none())
            .or_else(|| stores.first());
        if let Some(c) = current
            && self
                .store
                .as_ref()
                .is_none_or(|k| k.counted && k.uid != c.uid)
        {
            self.store = Some(StoreMemory {
                uid: c.uid.clone(),
                name: c.name.clone(),
                // First seen already lost: not counted again.
                counted: c.lost.is_some(),
            });
        }
        out
    }
}

/// The store pod a [`Memory`] follows.
#[derive(Clone, Debug)]
struct StoreMemory {
    uid: String,
    name: String,
    /// Its loss was counted.
    counted: bool,
}

pub fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

/// A sidecar's loss record's time of the loss: the earliest of
/// `suspectedAt` (the first heartbeat unanswered, or the watch event that
/// first showed it) and `at` (its action, at the confirmation); the
/// sidecar's clock, but never in the future of ours.
fn record_loss_time(r: &PeerLossRecord, now: Timestamp) -> Timestamp {
    [Some(r.at.as_str()), r.suspected_at.as_deref()]
        .into_iter()
        .flatten()
        .filter_map(parse_time)
        .min()
        .map_or(now, |t| t.min(now))
}

/// Since when a pod's own sidecar says it trains: its record's
/// `trainingSince`, or its take-over as a spare.
fn trains_since(p: &PodView) -> Option<Timestamp> {
    let r = p.peer_loss.as_ref()?;
    r.training_since
        .as_deref()
        .and_then(parse_time)
        .or_else(|| {
            (r.action == peer_loss::SPARE_TOOK_OVER)
                .then(|| parse_time(&r.at))
                .flatten()
        })
}

/// How well an observation dates the first training step, best first: the
/// collective's traffic is seen at the step; a second checkpoint after it;
/// the collective formed, or the workers started, before it (by the
/// rendezvous, the checkpoint load). Anything else reads as the weakest.
fn strength(by: &str) -> u8 {
    match by {
        "collective-traffic" => 0,
        "checkpoint" => 1,
        "collective-formed" => 2,
        _ => 3,
    }
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

/// Ranks below `expected` with no pod Ready, not lost, its trainer up.
fn down_ranks(expected: u32, pods: &[PodView]) -> Vec<u32> {
    let up: std::collections::BTreeSet<u32> = pods
        .iter()
        .filter(|p| p.ready && p.up())
        .map(|p| p.rank)
        .collect();
    (0..expected).filter(|r| !up.contains(r)).collect()
}

/// The store's state: `None` without a dedicated store.
fn store_seen(workload: &WorldOf, store: Option<&[StoreView]>) -> Option<StoreSeen> {
    if !workload.dedicated_store {
        return None;
    }
    let stores = store.unwrap_or(&[]);
    let current = stores
        .iter()
        .find(|s| s.available())
        .or_else(|| stores.iter().find(|s| s.lost.is_none()))
        .or_else(|| stores.first());
    Some(match current {
        None => StoreSeen::default(),
        Some(s) => StoreSeen {
            pod: s.name.clone(),
            available: s.available(),
            since: s.ready_since.map(|t| t.to_string()),
        },
    })
}

/// What keeps the world from being whole, `None` when it is.
fn missing(workload: &WorldOf, pods: &[PodView], store: Option<&StoreSeen>) -> Option<String> {
    let mut what = Vec::new();
    let down = down_ranks(workload.expected, pods);
    let up = workload
        .expected
        .saturating_sub(u32::try_from(down.len()).unwrap_or(u32::MAX));
    if up < workload.needed() {
        let named: Vec<String> = down.iter().take(8).map(u32::to_string).collect();
        let more = match down.len() {
            n if n > named.len() => format!(", and {} more", n - named.len()),
            _ => String::new(),
        };
        what.push(format!(
            "{} of {} needed pods Ready with their trainer running (not: rank {}{more})",
            up,
            workload.needed(),
            named.join(", ")
        ));
    }
    if let Some(s) = store
        && !s.available
    {
        what.push(if s.pod.is_empty() {
            "the rendezvous store's pod to exist".to_string()
        } else {
            format!("the rendezvous store {} to be Ready", s.pod)
        });
    }
    (!what.is_empty()).then(|| what.join("; "))
}

/// The best observation at or after `since` that training runs, with its
/// [`strength`]: a sidecar's `trainingSince`, a spare's take-over, or a
/// second checkpoint written after it (`first_checkpoint` keeps the first:
/// a step in flight on a node cut off, or while the store goes, can still
/// end in one). The strongest kind seen, and of it the earliest: the
/// collective's traffic dates the first step, a spare's workers started
/// before it. Pods out of the world are not asked. Times from the
/// sidecars' clocks, never after `now`.
fn training_seen(
    pods: &[PodView],
    out: &BTreeMap<String, Timestamp>,
    since: Timestamp,
    now: Timestamp,
    first_checkpoint: &mut Option<(Timestamp, String)>,
) -> Option<(Timestamp, &'static str, u8)> {
    let mut seen: Vec<(Timestamp, &'static str, u8)> = Vec::new();
    let mut checkpoints: Vec<(Timestamp, &str)> = Vec::new();
    for p in pods.iter().filter(|p| p.up() && !out.contains_key(&p.uid)) {
        if let Some(r) = &p.peer_loss {
            let by = peer_loss::TrainingSeenBy::of_record(r.training_seen_by.as_deref());
            // Any record's `trainingSince`: a loss's, or a `trainer-restarted`
            // one (the pod's trainer came back, after a store loss too).
            if let Some(t) = r.training_since.as_deref().and_then(parse_time) {
                seen.push((t, by.as_str(), strength(by.as_str())));
            }
            if r.action == peer_loss::SPARE_TOOK_OVER
                && let Some(t) = parse_time(&r.at)
            {
                seen.push((t, "spare-took-over", strength(by.as_str())));
            }
        }
        if let Some(c) = &p.checkpoint
            && let Some(t) = parse_time(&c.at)
            && t >= since
        {
            checkpoints.push((t, c.name.as_str()));
        }
    }
    checkpoints.sort();
    if first_checkpoint.as_ref().is_some_and(|(s, _)| *s != since) {
        // A later disruption: the checkpoints before it no longer count.
        *first_checkpoint = None;
    }
    if first_checkpoint.is_none()
        && let Some((_, name)) = checkpoints.first()
    {
        *first_checkpoint = Some((since, (*name).to_string()));
    }
    if let Some((_, first)) = first_checkpoint.as_ref()
        && let Some((t, _)) = checkpoints.iter().find(|(_, n)| n != first)
    {
        seen.push((*t, "checkpoint", strength("checkpoint")));
    }
    seen.into_iter()
        .filter(|(t, _, _)| *t >= since)
        .min_by_key(|(t, _, strength)| (*strength, *t))
        .map(|(t, how, strength)| (t.min(now), how, strength))
}

fn add_loss(status: &mut WorldStatus, seen: Seen, memory: &mut Memory) -> bool {
    let same_subject = |l: &Loss| match &seen.subject {
        Subject::Rank(r) => l.store.is_none() && l.rank == *r,
        Subject::Store(_) => l.store.is_some(),
    };
    if seen.out {
        // Its pod was already out of the world: what happens to it now
        // interrupts nothing. A note on the loss that counted it.
        if let Some(l) = status.last_loss.as_mut()
            && same_subject(l)
            && let Some(a) = seen.action
            && !l.actions.contains(&a)
            && l.actions.len() < MAX_ACTIONS
        {
            l.actions.push(a);
        }
        return false;
    }
    let fold = status.last_loss.as_ref().is_some_and(|l| {
        if l.is_open() {
            same_subject(l) || seen.consequence
        } else {
            // Told late: said before the loss resumed (a survivor's
            // record of it included).
            same_subject(l)
                && (!seen.consequence || seen.record)
                && l.resumed_at
                    .as_deref()
                    .and_then(parse_time)
                    .is_some_and(|r| seen.at <= r)
        }
    });
    if fold && let Some(l) = status.last_loss.as_mut() {
        let is_open = l.is_open();
        if is_open && same_subject(l) && parse_time(&l.at).is_none_or(|at| seen.at < at) {
            // Dated earlier by another source (a survivor's heartbeats
            // before the pod's deletion): that source showed it first.
            l.at = seen.at.to_string();
            l.detected_by = seen.detected_by.to_string();
        }
        if let Some(a) = seen.action
            && !l.actions.contains(&a)
            && l.actions.len() < MAX_ACTIONS
        {
            l.actions.push(a);
        }
        if is_open {
            memory.disrupted_until =
                Some(memory.disrupted_until.map_or(seen.at, |d| d.max(seen.at)));
        }
        return false;
    }
    status.generation += 1;
    let (rank, store) = match seen.subject {
        Subject::Rank(r) => (r, None),
        Subject::Store(pod) => (0, Some(pod)),
    };
    let action = if seen.detected_by == "container-exited" {
        None
    } else {
        seen.action
    };
    status.last_loss = Some(Loss {
        generation: status.generation,
        rank,
        at: seen.at.to_string(),
        detected_by: seen.detected_by.to_string(),
        store,
        actions: action.into_iter().collect(),
        ..Loss::default()
    });
    memory.disrupted_until = Some(seen.at);
    memory.checkpoint_after = None;
    memory.resumed = None;
    true
}

/// Each pod's role, by index then name; a pod out of the world
/// ([`Memory::out`]) is lost.
fn roles(workload: &WorldOf, pods: &[PodView], out: &BTreeMap<String, Timestamp>) -> Vec<RankRole> {
    let mut sorted: Vec<&PodView> = pods.iter().filter(|p| p.rank < workload.expected).collect();
    sorted.sort_by(|a, b| (a.rank, &a.name).cmp(&(b.rank, &b.name)));
    let mut out: Vec<RankRole> = sorted
        .iter()
        .take(MAX_RANKS)
        .map(|p| {
            let record = p.peer_loss.as_ref();
            let torch_rank = record.and_then(|r| r.torch_rank);
            let (role, from) = if !p.up() {
                (Role::Lost, "pod")
            } else if out.contains_key(&p.uid) {
                (Role::Lost, "peer-loss")
            } else if !p.ready {
                (Role::Waiting, "pod")
            } else if record.is_some_and(|r| r.action == peer_loss::SPARE_TOOK_OVER) {
                (Role::Training, "spare-took-over")
            } else if record.is_some_and(|r| r.training_since.is_some()) {
                (Role::Training, "sidecar")
            } else if workload.spares == 0 {
                (Role::Training, "pod")
            } else {
                // Decided below: with hot spares, which Ready pods train
                // is torchrun's choice.
                (Role::Spare, "index")
            };
            RankRole {
                index: p.rank,
                pod: p.name.clone(),
                role,
                torch_rank,
                from: from.to_string(),
            }
        })
        .collect();
    let known = out.iter().filter(|r| r.role == Role::Training).count();
    let mut free = usize::try_from(workload.needed())
        .unwrap_or(usize::MAX)
        .saturating_sub(known);
    for r in out.iter_mut().filter(|r| r.from == "index") {
        if free > 0 {
            r.role = Role::Training;
            free -= 1;
        }
    }
    out
}

/// The world's status now: `previous` (the annotation as read, or what this
/// replica computed last) moved on by what `pods` and the dedicated store's
/// pods (`store`, `None` when not watched) show. Pure but for `memory`,
/// which it updates.
pub fn observe(
    previous: Option<&WorldStatus>,
    memory: &mut Memory,
    workload: &WorldOf,
    pods: &[PodView],
    store: Option<&[StoreView]>,
    now: Timestamp,
) -> WorldStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let store_watched = if workload.dedicated_store {
        store
    } else {
        None
    };
    for seen in memory.losses(pods, store_watched, workload.expected, now) {
        add_loss(&mut status, seen, memory);
    }
    status.store = store_seen(workload, store);
    let missing = missing(workload, pods, status.store.as_ref());
    status.waiting_for = None;
    let ended = if workload.stopped.is_some() {
        Some("stopped")
    } else if workload.finished.is_some() {
        Some("finished")
    } else if workload.expected == 0 {
        Some("paused")
    } else {
        None
    };
    if let Some(l) = status.last_loss.as_mut()
        && l.is_open()
    {
        let loss_at = parse_time(&l.at).unwrap_or(now);
        let since = memory.disrupted_until.map_or(loss_at, |d| d.max(loss_at));
        let observable = pods.iter().any(|p| p.sidecar);
        let seen = training_seen(pods, &memory.out, since, now, &mut memory.checkpoint_after);
        if let Some(why) = ended {
            l.closed_by = Some(why.to_string());
        } else if let Some(why) = &missing {
            status.waiting_for = Some(why.clone());
        } else if let Some((at, how, strength)) = seen {
            resume(l, loss_at, at, how);
            memory.resumed = Some((since, strength));
        } else if !observable {
            l.closed_by = Some("not-observable".to_string());
        } else {
            status.waiting_for = Some(format!(
                "training to be seen running after {}: a sidecar's record that the trainer's workers train since (trainingSince), a spare's take-over, or a second checkpoint written since",
                since
            ));
        }
        if !l.is_open() {
            memory.disrupted_until = None;
            memory.checkpoint_after = None;
        }
    } else if let Some(l) = status.last_loss.as_mut()
        && let Some((since, was)) = memory.resumed
        && was > 0
        && let Some(loss_at) = parse_time(&l.at)
    {
        // Resumed by a weaker observation (a spare's workers started): a
        // stronger one of the same resumption, seen since, dates it better.
        if let Some((at, how, strength)) = training_seen(pods, &memory.out, since, now, &mut None)
            && strength < was
        {
            resume(l, loss_at, at, how);
            memory.resumed = Some((since, strength));
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
    status.last_stall = newest_stall(pods).or(status.last_stall.take());
    status.stopped = workload.stopped.clone();
    status.ranks = roles(workload, pods, &memory.out);
    status.ranks_omitted = 0;
    status.version = status.schema_version();
    let open = status.last_loss.as_ref().is_some_and(Loss::is_open);
    status.phase = if status.stopped.is_some() {
        Phase::Stopped
    } else if let Some(finished) = workload.finished {
        finished
    } else if workload.expected == 0 {
        Phase::Paused
    } else if open {
        Phase::Recovering
    } else if workload.needed() > 0 && missing.is_none() {
        Phase::Running
    } else {
        Phase::Forming
    };
    status
}

/// The loss resumed at `at` (never before the loss), by `how`.
fn resume(l: &mut Loss, loss_at: Timestamp, at: Timestamp, how: &str) {
    let at = at.max(loss_at);
    l.resumed_at = Some(at.to_string());
    l.recovery_seconds = at.duration_since(loss_at).as_secs().try_into().ok();
    l.resumed_by = Some(how.to_string());
}

/// The newest stall record among the pods' (by when it was found).
fn newest_stall(pods: &[PodView]) -> Option<trainwire_contract::stall::StallRecord> {
    let records: Vec<(Timestamp, &trainwire_contract::stall::StallRecord)> = pods
        .iter()
        .filter_map(|p| p.stall.as_ref())
        .filter_map(|s| parse_time(&s.at).map(|t| (t, s)))
        .collect();
    let newest = records.iter().map(|(t, _)| *t).max()?;
    let since = newest
        .checked_sub(trainwire_contract::stall::SAME_STALL)
        .unwrap_or(newest);
    // Every sidecar of a stalled world records it within seconds of the
    // others; the one that saw the most stuck workers (a sidecar that asked
    // after a peer's workers were restarted saw none there) tells it best.
    records
        .into_iter()
        .filter(|(t, _)| *t >= since)
        .max_by_key(|(t, s)| (s.stuck, *t))
        .map(|(_, s)| s.clone())
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
/// given the last write (this replica's, else `current.updatedAt`): into or
/// out of `Recovering` at once, other changes at most once per
/// `min_interval`.
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
    if current.is_some_and(|c| {
        c.phase != desired.phase
            && (c.phase == Phase::Recovering || desired.phase == Phase::Recovering)
    }) {
        // Into or out of `Recovering` (a loss opened, training seen again)
        // is written at once; the interval holds back the rest (a pod's
        // readiness flapping between `Running` and `Forming`).
        return Write::Now;
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
