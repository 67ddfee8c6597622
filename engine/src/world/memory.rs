//! What one replica remembers of a workload between observations
//! ([`Memory`]), and the losses it finds in a new one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use trainwire_contract::peer_loss::{self, PeerLossRecord};
use trainwire_contract::world::WorldStatus;

use super::view::{PodView, StoreView, parse_time};

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
    pub(super) store: Option<StoreMemory>,
    /// The latest disruption of the open loss (the loss, and the trainer
    /// exits it caused): training seen after it resumes the loss.
    pub(super) disrupted_until: Option<Timestamp>,
    /// The first checkpoint seen written after that disruption (with the
    /// disruption it is after): a node cut off mid-step can still finish
    /// its step and write one (4 s after a cut in `spares_e2e`, 0.8 s after
    /// a store loss), so only a checkpoint with another name after it shows
    /// training.
    pub(super) checkpoint_after: Option<(Timestamp, String)>,
    /// Pods still there that a survivor's sidecar counted lost (a silent
    /// loss: their pod object unchanged), by UID, with the loss's time: out
    /// of the world until their own sidecar says they train again after it.
    /// Their deletion, disappearance or trainer exit, and the losses their
    /// own sidecar tells of, are not new losses.
    pub(super) out: BTreeMap<String, Timestamp>,
    /// The last loss's resumption while a stronger observation may still
    /// date it better: the disruption it is after, and the strength of
    /// what it resumed by ([`strength`]).
    pub(super) resumed: Option<(Timestamp, u8)>,
    /// The last status computed (written, or waiting for the interval).
    pub status: Option<WorldStatus>,
    /// When this replica last wrote the annotation.
    pub last_write: Option<Timestamp>,
}

/// What a loss is of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Subject {
    Rank(u32),
    Store(String),
}

/// A loss seen in one observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) subject: Subject,
    pub(super) at: Timestamp,
    pub(super) detected_by: &'static str,
    pub(super) action: Option<String>,
    /// A trainer exit or a sidecar's report: while another loss is open it
    /// is a consequence of that one (agents exit when their store or
    /// rendezvous host goes; survivors report the exits), not a new loss.
    pub(super) consequence: bool,
    /// A sidecar's record (said late, it may still be about the last loss).
    pub(super) record: bool,
    /// Of a pod already out of the world ([`Memory::out`]): a note on the
    /// loss that counted it, never a new loss.
    pub(super) out: bool,
}

impl Memory {
    /// New losses in `pods` and `store` since the last observation; learns
    /// them.
    pub(super) fn losses(
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
pub(super) struct StoreMemory {
    uid: String,
    name: String,
    /// Its loss was counted.
    pub(super) counted: bool,
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
