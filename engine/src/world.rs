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
//!
//! The objects as the status reads them are in `world/view.rs`, what a
//! replica remembers between observations in `world/memory.rs`; this file
//! turns them into the status.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use trainwire_contract::peer_loss;
use trainwire_contract::world::{
    CheckpointRecord, CheckpointSeen, Loss, MAX_ACTIONS, MAX_RANKS, Nodes, Phase, RankRole, Role,
    StoreSeen, WorldStatus,
};

mod memory;
mod view;

pub use memory::Memory;
use memory::{Seen, Subject};
pub use view::{PodView, StoreView, WorldOf, parse_time};

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
        // A consequence (another rank's trainer exit, a survivor's report
        // of one) extends the disruption; news of the same loss (a
        // sidecar's late report of it, its pod object gone) does not:
        // training seen after the loss and before that news counts (torch
        // may take a spare in before the sidecars confirm the loss).
        if is_open && !same_subject(l) {
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
    // others; one that acted says what was done (another, in its cooldown
    // from the last stall, may have recorded it first), and of those the
    // one that saw the most stuck workers (a sidecar that asked after a
    // peer's workers were restarted saw none there) tells it best.
    records
        .into_iter()
        .filter(|(t, _)| *t >= since)
        .max_by_key(|(t, s)| {
            (
                s.result == trainwire_contract::stall::SIGNALLED,
                s.stuck,
                *t,
            )
        })
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
