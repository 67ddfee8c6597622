//! The world's objects as the status needs them: a pod of the world
//! ([`PodView`]), a pod of its dedicated store ([`StoreView`]) and the
//! workload itself ([`WorldOf`]), each read from its Kubernetes object.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use trainwire_contract::peer_loss::{self, PeerLossRecord};
use trainwire_contract::world::{self, CheckpointRecord, Phase, Stopped};

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
    pub(super) fn up(&self) -> bool {
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

    pub(super) fn available(&self) -> bool {
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

pub fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}
