//! The state of a training world as the controllers' world controller keeps
//! it on the workload, and the checkpoint record a sidecar keeps on its pod.
//!
//! [`ANNOTATION`] (`trainwire.dev/world`) on a StatefulSet or Job holds a JSON
//! [`WorldStatus`]: its nodes, how many losses it had, the last one and how
//! long training took to resume, the newest checkpoint the sidecars see, and
//! whether the world is stopped and why. A workload's `status` belongs to its
//! own controller, so this lives in an annotation; it outlives Events (which
//! expire after an hour) and reads with
//! `kubectl get sts NAME -o jsonpath='{.metadata.annotations.trainwire\.dev/world}'`.
//!
//! The schema is versioned ([`SCHEMA_VERSION`]): a field is only ever added
//! (optional) within a version; a reader refuses a newer version with a
//! message instead of misreading it. Times are RFC 3339 strings in UTC. The
//! checkpoint's *age* is not stored (it changes every second, and the
//! annotation is written only when something changes): readers compute it
//! from [`CheckpointSeen::newest_at`].
//!
//! [`CHECKPOINT_ANNOTATION`] (`trainwire.dev/checkpoint`) on a pod holds the
//! sidecar's [`CheckpointRecord`]: the newest complete checkpoint it sees
//! and its modification time, rewritten only when the newest one changes.

use serde::{Deserialize, Serialize};

pub mod rank_table;
pub use rank_table::NAMED_RANKS;

/// The workload annotation that holds the [`WorldStatus`].
pub const ANNOTATION: &str = crate::annotations::WORLD;

/// The pod annotation that holds the sidecar's [`CheckpointRecord`].
pub const CHECKPOINT_ANNOTATION: &str = crate::annotations::CHECKPOINT;

/// The newest version this build reads and writes. Version 2 writes the
/// rank table of a world larger than [`NAMED_RANKS`] pods in runs
/// ([`rank_table`]); a value is written with the oldest version that reads
/// it ([`WorldStatus::schema_version`]), so a world of at most
/// [`NAMED_RANKS`] pods stays readable by a version 1 reader.
pub const SCHEMA_VERSION: u32 = 2;

/// The first version whose rank table may be written in runs.
const RUNS_VERSION: u32 = 2;

/// At most this many actions are kept for one loss.
pub const MAX_ACTIONS: usize = 8;

/// Bound on an annotation value this crate parses (the API server's limit
/// for all of an object's annotations together is 256 KiB).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// Where the world is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Phase {
    /// Not every expected node is Ready yet, and no loss is open.
    #[default]
    Forming,
    /// Every expected node is Ready (and the dedicated store, if any), and
    /// no loss is open: training was seen running again after the last one.
    Running,
    /// A loss is open: the world is not whole again, or it is but training
    /// was not yet seen running after the loss ([`WorldStatus::waiting_for`]).
    Recovering,
    /// Stopped by trainwire's crash-loop stop (see [`Stopped`]).
    Stopped,
    /// Zero nodes asked for (a StatefulSet at `replicas: 0`, a suspended Job).
    Paused,
    /// The Job completed.
    Completed,
    /// The Job failed.
    Failed,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Nodes of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Nodes {
    /// Ranks below `expected` whose pod is Ready and not being deleted.
    pub ready: u32,
    /// StatefulSet `replicas`, Job `parallelism` (0 when paused): the
    /// pods asked for, hot spares included.
    pub expected: u32,
    /// Of `expected`, the hot spares (`trainwire.dev/spares`): the world
    /// trains with `expected - spares` of them Ready. Absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spares: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The last loss of a node, of the trainer in a pod, or of the dedicated
/// rendezvous store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Loss {
    /// The world's generation this loss started (the first loss is 1).
    pub generation: u64,
    /// The rank (pod index) that was lost; 0 for a loss of the store
    /// (see [`Loss::store`]).
    pub rank: u32,
    /// When it was first seen lost: the pod's `deletionTimestamp`, the
    /// trainer container's `finishedAt`, the sidecar's record time, or when
    /// the controller saw it.
    pub at: String,
    /// What showed it: `pod-deleted`, `pod-disrupted`, `pod-failed`,
    /// `pod-replaced`, `pod-gone`, `container-exited`, `sidecar`, and for
    /// the store `store-deleted`, `store-failed`, `store-exited`,
    /// `store-replaced`, `store-gone`.
    pub detected_by: String,
    /// The dedicated rendezvous store's pod, when the loss is the store's
    /// (every agent exits with it): then `rank` means nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// What was done, in order: each sidecar's action on it
    /// (`rank 0: restart-agent signalled`), at most [`MAX_ACTIONS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
    /// When training was seen running again: the earliest observation of
    /// it after the loss ([`Loss::resumed_by`] names which), never a pod's
    /// readiness. Absent while recovering, and for a loss that ended
    /// without training being seen ([`Loss::closed_by`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<String>,
    /// `resumedAt - at`, in whole seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_seconds: Option<u64>,
    /// The observation `resumedAt` comes from: a sidecar's record's
    /// `trainingSince`, by what it was seen
    /// ([`TrainingSeenBy`](crate::peer_loss::TrainingSeenBy):
    /// `collective-traffic`, `collective-formed`, `workers-started`),
    /// `spare-took-over` (a hot spare's record), `checkpoint` (a checkpoint
    /// written after the loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_by: Option<String>,
    /// Why the loss ended without a `resumedAt`: `paused` (scaled to zero),
    /// `stopped`, `finished` (the Job ended), `not-observable` (the world is
    /// whole again, but its pods have no sidecar to see training run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<String>,
}

impl Loss {
    /// Whether the loss is still open: neither resumed nor closed.
    pub fn is_open(&self) -> bool {
        self.resumed_at.is_none() && self.closed_by.is_none()
    }

    /// What was lost, for people: `rank N` or `store POD`.
    pub fn subject(&self) -> String {
        match &self.store {
            Some(pod) => format!("store {pod}"),
            None => format!("rank {}", self.rank),
        }
    }
}

/// The dedicated rendezvous store (`trainwire.dev/rdzv-store: dedicated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct StoreSeen {
    /// Its pod (label `trainwire.dev/rdzv-store=<workload>`); empty when
    /// there is none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// Its pod is Ready, not being deleted, its container running.
    pub available: bool,
    /// When its `Ready` condition last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// The most pods [`WorldStatus::ranks`] holds.
pub const MAX_RANKS: usize = 8192;

/// What a pod does in the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// It trains: its sidecar saw the trainer's workers, or (without hot
    /// spares) its pod is Ready.
    Training,
    /// A hot spare: Ready, its trainer waiting on torchrun's redundancy list.
    Spare,
    /// Not Ready yet (starting, or its trainer restarting).
    Waiting,
    /// Being deleted, failed, or its trainer container has exited.
    Lost,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Training => "training",
            Role::Spare => "spare",
            Role::Waiting => "waiting",
            Role::Lost => "lost",
        })
    }
}

/// One pod of the world and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankRole {
    /// The pod index (`apps.kubernetes.io/pod-index`, the Job's completion
    /// index): trainwire's node rank, not torch's with hot spares.
    pub index: u32,
    pub pod: String,
    pub role: Role,
    /// torch's node rank (`GROUP_RANK` of the pod's workers) when its
    /// sidecar reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_rank: Option<u32>,
    /// Where the role comes from: `sidecar` (its `/proc` scan), `spare-took-over`,
    /// `pod` (readiness and containers), `index` (with hot spares and no
    /// sidecar report: the lowest Ready indices are taken to train).
    pub from: String,
}

/// The newest checkpoint the sidecars report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSeen {
    /// Its name (file or directory), as the sidecar reports it.
    pub name: String,
    /// Its modification time; its age is now minus this.
    pub newest_at: String,
    /// How many pods report a checkpoint.
    pub reported_by: u32,
}

/// Why and since when the world is stopped (the workload's
/// `trainwire.dev/stopped-*` annotations).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Stopped {
    /// The `trainwire.dev/stopped-reason` annotation: `FailFastExitCode` or
    /// `MaxFailures`.
    pub reason: String,
    pub at: String,
    /// The pod whose trainer exit stopped it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The command that resumes it.
    pub resume: String,
}

/// The `trainwire.dev/world` annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct WorldStatus {
    /// The oldest schema version that reads this value
    /// ([`WorldStatus::schema_version`]), at most [`SCHEMA_VERSION`].
    pub version: u32,
    pub phase: Phase,
    pub nodes: Nodes,
    /// Losses so far (0 for a world that never lost a node).
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_loss: Option<Loss>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointSeen>,
    /// The newest stall a sidecar of the world found (its pod's
    /// `trainwire.dev/stall`): when, which ranks showed what, the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stall: Option<crate::stall::StallRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
    /// What a `Recovering` world waits for (the pods, the store, training
    /// to be seen running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The dedicated rendezvous store, when the world has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreSeen>,
    /// Each pod's role, by index (at most [`MAX_RANKS`]), written in runs
    /// beyond [`NAMED_RANKS`] pods ([`rank_table`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "rank_table")]
    pub ranks: Vec<RankRole>,
    /// Pods left out at the end of `ranks` so that the value stays within
    /// [`MAX_VALUE_BYTES`] (only a world of thousands of pods whose roles
    /// alternate needs it); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ranks_omitted: u32,
    /// When the controller wrote this value.
    #[serde(default)]
    pub updated_at: String,
}

/// An annotation value that is not a status this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorldError {
    #[error("annotation {annotation}: {bytes} bytes is more than the {MAX_VALUE_BYTES} accepted")]
    TooLarge {
        annotation: &'static str,
        bytes: usize,
    },
    #[error("annotation {annotation}: not the JSON this schema describes: {reason}")]
    NotJson {
        annotation: &'static str,
        reason: String,
    },
    #[error(
        "annotation {ANNOTATION}: schema version {found} was written by a newer trainwire; this one reads up to {SCHEMA_VERSION}: upgrade it"
    )]
    NewerVersion { found: u32 },
}

fn bounded(annotation: &'static str, value: &str) -> Result<(), WorldError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(WorldError::TooLarge {
            annotation,
            bytes: value.len(),
        });
    }
    Ok(())
}

impl WorldStatus {
    /// The annotation's value (compact JSON), at most [`MAX_VALUE_BYTES`]
    /// when the table is what makes it large: past the bound the torch
    /// ranks are left out of the table, then the pods at its end
    /// ([`WorldStatus::ranks_omitted`]).
    pub fn to_annotation(&self) -> String {
        let mut lean = self.clone();
        lean.version = self.schema_version();
        let text = serde_json::to_string(&lean).unwrap_or_default();
        if text.len() <= MAX_VALUE_BYTES {
            return text;
        }
        for r in &mut lean.ranks {
            r.torch_rank = None;
        }
        let text = serde_json::to_string(&lean).unwrap_or_default();
        if text.len() <= MAX_VALUE_BYTES {
            return text;
        }
        let all = lean.ranks.clone();
        let with_first = |n: usize| {
            let mut cut = lean.clone();
            cut.ranks = all[..n].to_vec();
            cut.ranks_omitted = u32::try_from(all.len() - n)
                .unwrap_or(u32::MAX)
                .saturating_add(self.ranks_omitted);
            serde_json::to_string(&cut).unwrap_or_default()
        };
        // The most pods whose value fits: fewer pods never make it longer.
        let (mut fits, mut over) = (0, all.len());
        while over - fits > 1 {
            let mid = fits + (over - fits) / 2;
            if with_first(mid).len() <= MAX_VALUE_BYTES {
                fits = mid;
            } else {
                over = mid;
            }
        }
        with_first(fits)
    }

    /// The oldest schema version that reads this value: 1 while the rank
    /// table names every pod, [`RUNS_VERSION`] when it is written in runs
    /// or leaves pods out.
    pub fn schema_version(&self) -> u32 {
        if self.ranks.len() > NAMED_RANKS || self.ranks_omitted > 0 {
            RUNS_VERSION
        } else {
            1
        }
    }

    /// Read an annotation value.
    pub fn from_annotation(value: &str) -> Result<WorldStatus, WorldError> {
        bounded(ANNOTATION, value)?;
        let status: WorldStatus = serde_json::from_str(value).map_err(|e| WorldError::NotJson {
            annotation: ANNOTATION,
            reason: e.to_string(),
        })?;
        if status.version > SCHEMA_VERSION {
            return Err(WorldError::NewerVersion {
                found: status.version,
            });
        }
        Ok(status)
    }

    /// Equal as written but for `updatedAt`: whether writing `other` would
    /// change anything a reader cares about (a large table names no pods,
    /// so a status read back equals the one it was written from).
    pub fn same_as(&self, other: &WorldStatus) -> bool {
        let written = |s: &WorldStatus| {
            WorldStatus {
                updated_at: String::new(),
                ..s.clone()
            }
            .to_annotation()
        };
        written(self) == written(other)
    }
}

/// What a sidecar records on its pod about the checkpoint directory: the
/// newest complete checkpoint and its modification time. Written when the
/// newest checkpoint changes, never to refresh an age.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRecord {
    /// Its name in the checkpoint directory.
    pub name: String,
    /// Its modification time, RFC 3339.
    pub at: String,
}

impl CheckpointRecord {
    /// The annotation's value (compact JSON).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read an annotation value.
    pub fn from_annotation(value: &str) -> Result<CheckpointRecord, WorldError> {
        bounded(CHECKPOINT_ANNOTATION, value)?;
        serde_json::from_str(value).map_err(|e| WorldError::NotJson {
            annotation: CHECKPOINT_ANNOTATION,
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        "[ -~]{0,24}"
    }

    fn phase() -> impl Strategy<Value = Phase> {
        prop_oneof![
            Just(Phase::Forming),
            Just(Phase::Running),
            Just(Phase::Recovering),
            Just(Phase::Stopped),
            Just(Phase::Paused),
            Just(Phase::Completed),
            Just(Phase::Failed),
        ]
    }

    prop_compose! {
        fn loss()(generation in any::<u64>(), rank in any::<u32>(), at in text(), detected_by in text(),
                  actions in proptest::collection::vec(text(), 0..MAX_ACTIONS),
                  resumed_at in proptest::option::of(text()), recovery_seconds in proptest::option::of(any::<u64>())) -> Loss {
            Loss { generation, rank, at, detected_by, actions, resumed_at, recovery_seconds, ..Loss::default() }
        }
    }

    prop_compose! {
        fn status()(phase in phase(), ready in any::<u32>(), expected in any::<u32>(), spares in 0u32..4, generation in any::<u64>(),
                    last_loss in proptest::option::of(loss()),
                    checkpoint in proptest::option::of((text(), text(), any::<u32>())),
                    stopped in proptest::option::of((text(), text(), text(), proptest::option::of(any::<i32>()), text())),
                    ranks in proptest::collection::vec((0u8..4, proptest::option::of(0u32..2000), 0u8..3), 0..150),
                    updated_at in text()) -> WorldStatus {
            let ranks: Vec<RankRole> = ranks.into_iter().enumerate().map(|(i, (role, torch_rank, from))| RankRole {
                index: u32::try_from(i).unwrap_or(0),
                pod: format!("w-{i}"),
                role: [Role::Training, Role::Spare, Role::Waiting, Role::Lost][usize::from(role)],
                torch_rank,
                from: ["pod", "sidecar", "index"][usize::from(from)].to_string(),
            }).collect();
            // A large table is read back without the pods' names.
            let ranks = if ranks.len() > NAMED_RANKS {
                ranks.into_iter().map(|r| RankRole { pod: String::new(), ..r }).collect()
            } else {
                ranks
            };
            let mut s = WorldStatus {
                phase,
                nodes: Nodes { ready, expected, spares },
                generation,
                last_loss,
                checkpoint: checkpoint.map(|(name, newest_at, reported_by)| CheckpointSeen { name, newest_at, reported_by }),
                last_stall: None,
                stopped: stopped.map(|(reason, at, pod, exit_code, resume)| Stopped { reason, at, pod, exit_code, resume }),
                ranks,
                updated_at,
                ..WorldStatus::default()
            };
            s.version = s.schema_version();
            s
        }
    }

    proptest! {
        #[test]
        fn world_status_round_trips(s in status()) {
            let text = s.to_annotation();
            prop_assert_eq!(WorldStatus::from_annotation(&text), Ok(s));
        }

        #[test]
        fn checkpoint_record_round_trips(name in text(), at in text()) {
            let r = CheckpointRecord { name, at };
            prop_assert_eq!(CheckpointRecord::from_annotation(&r.to_annotation()), Ok(r));
        }
    }

    #[test]
    fn the_documented_example_reads() {
        let text = r#"{"version":1,"phase":"Running","nodes":{"ready":4,"expected":4},"generation":1,
            "lastLoss":{"generation":1,"rank":1,"at":"2026-11-25T08:10:00Z","detectedBy":"pod-deleted",
              "actions":["rank 0: report reported"],"resumedAt":"2026-11-25T08:11:02Z","recoverySeconds":62},
            "checkpoint":{"name":"step-1200","newestAt":"2026-11-25T08:05:00Z","reportedBy":4},
            "updatedAt":"2026-11-25T08:11:05Z"}"#;
        let s = WorldStatus::from_annotation(text).expect("reads");
        assert_eq!(s.phase, Phase::Running);
        assert_eq!(s.last_loss.and_then(|l| l.recovery_seconds), Some(62));
    }

    #[test]
    fn refuses_newer_versions_garbage_and_huge_values() {
        let newer = WorldStatus {
            version: SCHEMA_VERSION + 1,
            ..WorldStatus::default()
        };
        assert_eq!(
            WorldStatus::from_annotation(&serde_json::to_string(&newer).unwrap_or_default()),
            Err(WorldError::NewerVersion {
                found: SCHEMA_VERSION + 1
            })
        );
        let err = WorldStatus::from_annotation("{").expect_err("not json");
        assert!(err.to_string().contains("trainwire.dev/world"), "{err}");
        let huge = " ".repeat(MAX_VALUE_BYTES + 1);
        assert!(matches!(
            CheckpointRecord::from_annotation(&huge),
            Err(WorldError::TooLarge { .. })
        ));
    }

    fn alternating(n: u32) -> WorldStatus {
        WorldStatus {
            version: SCHEMA_VERSION,
            phase: Phase::Recovering,
            nodes: Nodes {
                ready: n / 2,
                expected: n,
                spares: 0,
            },
            ranks: (0..n)
                .map(|i| RankRole {
                    index: i,
                    pod: format!("llama-pretrain-{i}"),
                    role: if i % 2 == 0 {
                        Role::Training
                    } else {
                        Role::Lost
                    },
                    torch_rank: (i % 2 == 0).then_some(n - 1 - i),
                    from: "sidecar".into(),
                })
                .collect(),
            ..WorldStatus::default()
        }
    }

    #[test]
    fn a_table_too_large_for_the_bound_leaves_out_torch_ranks_then_its_last_pods() {
        // 1,024 pods whose roles alternate: every entry its own, all kept.
        let s = alternating(1024);
        let text = s.to_annotation();
        assert!(text.len() <= MAX_VALUE_BYTES, "{} bytes", text.len());
        let back = WorldStatus::from_annotation(&text).expect("reads");
        assert_eq!(back.ranks.len(), 1024);
        assert_eq!(back.ranks_omitted, 0);
        assert_eq!(back.ranks[1022].role, Role::Training);
        assert_eq!(back.ranks[1023].role, Role::Lost);
        // 8,192 of them: the torch ranks go, then the last pods.
        let s = alternating(8192);
        let text = s.to_annotation();
        assert!(text.len() <= MAX_VALUE_BYTES, "{} bytes", text.len());
        let back = WorldStatus::from_annotation(&text).expect("reads");
        assert!(back.ranks_omitted > 0);
        assert_eq!(
            back.ranks.len() + usize::try_from(back.ranks_omitted).unwrap_or(0),
            8192
        );
        assert!(back.ranks.iter().all(|r| r.torch_rank.is_none()));
        assert!(
            back.ranks
                .iter()
                .zip(&s.ranks)
                .all(|(b, r)| (b.index, b.role) == (r.index, r.role))
        );
        // Read back and written again, it is the same value.
        assert!(back.same_as(&s));
        assert_eq!(back.to_annotation(), text);
    }

    #[test]
    fn a_value_is_written_with_the_oldest_version_that_reads_it() {
        // At most 64 pods: one named entry each, as version 1 wrote it, so a
        // version 1 reader (a sidecar or plugin of the previous release)
        // still reads it.
        let small = alternating(64);
        let text = small.to_annotation();
        assert!(text.starts_with(r#"{"version":1,"#), "{text}");
        assert!(!text.contains("count") && text.contains(r#""pod":"llama-pretrain-63""#));
        // More: in runs, version 2, which a version 1 reader refuses.
        let text = alternating(65).to_annotation();
        assert!(text.starts_with(r#"{"version":2,"#), "{text}");
        let mut runs = alternating(200);
        for r in &mut runs.ranks {
            r.role = Role::Training;
        }
        assert!(runs.to_annotation().contains(r#""count":200"#));
    }

    #[test]
    fn a_large_world_read_back_is_the_same_as_the_one_computed() {
        let mut computed = alternating(200);
        for r in &mut computed.ranks {
            r.role = Role::Training;
        }
        let back = WorldStatus::from_annotation(&computed.to_annotation()).expect("reads");
        assert!(back.ranks.iter().all(|r| r.pod.is_empty()));
        assert!(back.same_as(&computed));
        computed.ranks[3].role = Role::Lost;
        assert!(!back.same_as(&computed));
    }

    #[test]
    fn same_as_ignores_only_the_write_time() {
        let a = WorldStatus {
            version: 1,
            updated_at: "a".into(),
            ..WorldStatus::default()
        };
        let mut b = WorldStatus {
            updated_at: "b".into(),
            ..a.clone()
        };
        assert!(a.same_as(&b));
        b.generation = 1;
        assert!(!a.same_as(&b));
    }
}
