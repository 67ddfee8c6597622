//! What a sidecar did about a lost peer, as it records it on its own pod for
//! the controllers' failure controller (and the world status) to read: one
//! story told by both.
//!
//! The sidecar writes the annotation [`ANNOTATION`] on its pod (a JSON
//! [`PeerLossRecord`]) each time it acts on a loss; the controller reads it
//! from its pod watch, counts the loss in the workload's loss generations (so
//! the trainer exit the sidecar's own action caused is never counted as a
//! script failure) and names it in the workload's `PeerLost` Event, with the
//! sidecar's generation, the one its `/status` shows.

use serde::{Deserialize, Serialize};

/// The pod annotation that holds the sidecar's last [`PeerLossRecord`].
pub const ANNOTATION: &str = crate::annotations::PEER_LOSS;

/// The `action` of the record a hot spare's sidecar writes when its pod,
/// which waited as a spare, starts training in place of `lost_rank`: the
/// moment the world trains again after that loss (`at`), which the pods'
/// readiness does not show (the spare was Ready all along).
pub const SPARE_TOOK_OVER: &str = "spare-took-over";

/// The `action` of the record a sidecar writes when its own pod's trainer
/// was restarted (its agent replaced by a new one, as when every agent
/// exits because the rendezvous store went away) and the new agent's
/// workers run: `at` is when the new agent started, `trainingSince` when
/// its workers did, `lostRank` this pod's own rank. Not a loss of a peer
/// (the loss is the world controller's to see: the trainer container's
/// exit, the store's pod), only the moment this pod trains again after it.
pub const TRAINER_RESTARTED: &str = "trainer-restarted";

/// `lostBy` of a loss that heartbeats saw first: the pod stopped
/// answering (its network cut, its node dead or frozen) while its object
/// said nothing.
pub const LOST_BY_HEARTBEAT: &str = "heartbeat";

/// `lostBy` of a loss that the Kubernetes watch saw first.
pub const LOST_BY_KUBERNETES: &str = "kubernetes";

/// The sidecar's last action on a lost peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PeerLossRecord {
    /// The sidecar's loss generation (`generation` in its `/status`).
    pub generation: u64,
    /// The rank of the peer that was lost.
    pub lost_rank: u32,
    /// What confirmed the loss (`pod-deleted`, `replacement-answers`, ...),
    /// empty when nothing did yet.
    #[serde(default)]
    pub confirmed_by: String,
    /// The action (`restart-workers`, `restart-agent`, `report`).
    pub action: String,
    /// Its result (`signalled`, `failed`, `reported`, ...).
    pub result: String,
    /// When, RFC 3339.
    pub at: String,
    /// When the loss became observable to the sidecar, RFC 3339: the
    /// first missed heartbeat (the end of the first interval without an
    /// answer), or the watch event that first showed the pod in trouble.
    /// The loss's time, which `at` (the action, at the confirmation) can
    /// follow by up to the confirmation limit. (Sidecars before `lostBy`
    /// wrote the moment they decided the loss, after all the misses.)
    /// Absent in records of older sidecars and in take-over records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspected_at: Option<String>,
    /// The source that saw the loss first: [`LOST_BY_HEARTBEAT`] (the
    /// pod stopped answering while its object was unchanged: a silent
    /// loss) or [`LOST_BY_KUBERNETES`] (the watch showed it deleted,
    /// failed, restarted, replaced, ...). Absent in records of older
    /// sidecars and in take-over and own-restart records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_by: Option<String>,
    /// Why it is lost, as the sidecar's `/status` and metrics say it
    /// (`missed-heartbeats`, `deleted`, `failed`, `not-ready`,
    /// `container-restarted`, `identity-changed`, `node-unreachable`,
    /// `disrupted`, `stuck-terminating`). Absent where `lostBy` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For a loss seen by heartbeats: the last answer of the lost pod
    /// before its outage, RFC 3339. The loss (the cut, the freeze) lies
    /// between it and `suspectedAt`, at most one heartbeat interval apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer_at: Option<String>,
    /// When this pod trains again after this loss, RFC 3339: the first
    /// `/proc` scan that saw its new workers (started after the loss, up a
    /// settle time, [`TRAINING_SETTLE`](crate::peer_loss::TRAINING_SETTLE))
    /// hold a connection to a peer (their collective formed); their start
    /// time when the sidecar cannot read their sockets. Absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_since: Option<String>,
    /// torch's node rank (`GROUP_RANK`) of those workers, when the sidecar
    /// could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_rank: Option<u32>,
    /// What `trainingSince` (or a take-over's `at`) was observed by, one of
    /// [`TrainingSeenBy`]; absent in records of older sidecars (read as
    /// `workers-started`). A string, so that a value a newer sidecar adds
    /// does not make the whole record unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_seen_by: Option<String>,
}

/// The observation a sidecar saw its pod's trainer train by, strongest
/// first; the one grammar of `trainingSeenBy` and of the world status's
/// `resumedBy` for the sidecars' records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TrainingSeenBy {
    /// The workers' connections to their peers carried traffic, alike in
    /// the last [`STEP_BURSTS`] scans that saw any, after their collective formed: the
    /// collectives of training steps (gloo, NCCL over sockets). The time is
    /// the scan that saw the last of them.
    CollectiveTraffic,
    /// The workers formed their collective (a connection to a peer), and
    /// its traffic could not be seen (NCCL over RDMA, no socket
    /// diagnostics) within [`TRAFFIC_WAIT`]: the time is when it formed,
    /// which precedes the first step by the checkpoint load and the first
    /// step itself.
    CollectiveFormed,
    /// The workers started and stayed up [`TRAINING_SETTLE`], and nothing
    /// more can be seen: their sockets are not readable (another user
    /// without `CAP_SYS_PTRACE`), they were given no peers on other nodes
    /// (a launcher that is not torchrun, a world of one node), or they hold
    /// no TCP connection at all [`UNCONNECTED_WAIT`] after their start. The
    /// time is their start.
    WorkersStarted,
}

impl TrainingSeenBy {
    pub const ALL: [TrainingSeenBy; 3] = [
        TrainingSeenBy::CollectiveTraffic,
        TrainingSeenBy::CollectiveFormed,
        TrainingSeenBy::WorkersStarted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TrainingSeenBy::CollectiveTraffic => "collective-traffic",
            TrainingSeenBy::CollectiveFormed => "collective-formed",
            TrainingSeenBy::WorkersStarted => "workers-started",
        }
    }

    /// A record's `trainingSeenBy`: absent or unknown (an older or newer
    /// sidecar) reads as the weakest, [`TrainingSeenBy::WorkersStarted`].
    pub fn of_record(value: Option<&str>) -> TrainingSeenBy {
        Self::ALL
            .into_iter()
            .find(|k| Some(k.as_str()) == value)
            .unwrap_or(TrainingSeenBy::WorkersStarted)
    }
}

/// How many of the last scans that saw new bytes on the workers' peer
/// connections, all alike in size ([`BURST_LIKENESS`]), make training seen
/// after the collective formed ([`TrainingSeenBy::CollectiveTraffic`]). A training
/// step moves the same bytes every time (its gradients' all-reduce), a
/// scan catching one or two of them; a trainer's start-up sends less, and
/// in pieces of any number: torch's object broadcast of the checkpoint
/// choice (bytes), DDP's check of the parameters' shapes across ranks
/// (bytes, sent by each rank as it arrives from its checkpoint load, so in
/// as many scans as the ranks arrive apart), then DDP's broadcast of the
/// parameters, as large as a step's. Counting every scan with new bytes
/// dated a resumption 0.3 s before the first step on the real node, when
/// the ranks of a replacement came out of their checkpoint load apart; so
/// the last three must be alike: the parameters' broadcast (or it and the
/// first step in one scan) and two steps' all-reduces.
pub const STEP_BURSTS: usize = 3;

/// The [`STEP_BURSTS`] scans are alike when the least of them carried at
/// least this fraction (one over it) of the most: a scan holds one
/// training step's all-reduce or two, a start-up's small pieces hold a
/// hundredth of them or less.
pub const BURST_LIKENESS: u64 = 4;

/// How long after their start workers that expect peers but hold no TCP
/// connection at all (not even to the rendezvous store, which torch's
/// workers reach first) and have not loaded torch, or a trainer that runs no
/// workers, holds no connection and has not loaded torch, are waited for
/// before their start is taken as their training
/// ([`TrainingSeenBy::WorkersStarted`]): stand-in trainers, not torchrun.
pub const UNCONNECTED_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long after the collective formed a sidecar waits for its traffic
/// before it says training by the forming alone
/// ([`TrainingSeenBy::CollectiveFormed`]).
pub const TRAFFIC_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the trainer's new workers must stay up before a sidecar says
/// training runs again (a worker that dies at once, in a rendezvous that
/// fails, is not training).
pub const TRAINING_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Bound on the record's annotation value.
pub const MAX_RECORD_BYTES: usize = 4 * 1024;

impl PeerLossRecord {
    /// Whether the loss was seen by heartbeats ([`PeerLossRecord::lost_by`]):
    /// a peer that stopped answering, its pod object possibly unchanged.
    pub fn lost_by_heartbeat(&self) -> bool {
        matches!(self.lost_by.as_deref(), Some("heartbeat" | "heartbeats"))
    }

    /// Whether the record tells of a lost peer (to count as a loss):
    /// not a spare's take-over nor this pod's own trainer restarted, which
    /// only say when training runs again.
    pub fn is_loss(&self) -> bool {
        self.action != SPARE_TOOK_OVER && self.action != TRAINER_RESTARTED
    }

    /// The annotation's value; `None` only if serialisation fails.
    pub fn to_annotation(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }

    /// Read an annotation value; `None` when it is not a record.
    pub fn from_annotation(value: &str) -> Option<PeerLossRecord> {
        if value.len() > MAX_RECORD_BYTES {
            return None;
        }
        serde_json::from_str(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_text() {
        let r = PeerLossRecord {
            generation: 3,
            lost_rank: 0,
            confirmed_by: "replacement-answers".into(),
            action: "restart-agent".into(),
            result: "signalled".into(),
            at: "2026-11-23T18:00:00Z".into(),
            suspected_at: Some("2026-11-23T17:59:57Z".into()),
            lost_by: Some(LOST_BY_HEARTBEAT.into()),
            reason: Some("missed-heartbeats".into()),
            last_answer_at: Some("2026-11-23T17:59:56.4Z".into()),
            training_since: None,
            torch_rank: None,
            training_seen_by: None,
        };
        let text = r.to_annotation().expect("json");
        assert!(
            text.contains(r#""lostBy":"heartbeat","reason":"missed-heartbeats","lastAnswerAt":"2026-11-23T17:59:56.4Z""#),
            "{text}"
        );
        assert_eq!(PeerLossRecord::from_annotation(&text), Some(r.clone()));
        assert_eq!(PeerLossRecord::from_annotation("{"), None);
        assert_eq!(PeerLossRecord::from_annotation("3"), None);
        // A record of an older sidecar (no trainingSince) still reads.
        let old = r#"{"generation":1,"lostRank":1,"confirmedBy":"","action":"report","result":"reported","at":"2026-11-23T18:00:00Z"}"#;
        assert!(PeerLossRecord::from_annotation(old).is_some_and(|r| r.training_since.is_none()));
        let resumed = PeerLossRecord {
            training_since: Some("2026-11-23T18:00:07Z".into()),
            torch_rank: Some(1),
            training_seen_by: Some("collective-traffic".into()),
            ..r
        };
        let text = resumed.to_annotation().expect("json");
        assert!(
            text.contains(r#""trainingSince":"2026-11-23T18:00:07Z""#),
            "{text}"
        );
        assert_eq!(PeerLossRecord::from_annotation(&text), Some(resumed));
        assert_eq!(
            PeerLossRecord::from_annotation(&" ".repeat(MAX_RECORD_BYTES + 1)),
            None
        );
    }

    #[test]
    fn training_seen_by_reads_every_value_and_falls_back_to_the_weakest() {
        for k in TrainingSeenBy::ALL {
            assert_eq!(TrainingSeenBy::of_record(Some(k.as_str())), k);
        }
        assert_eq!(
            TrainingSeenBy::of_record(None),
            TrainingSeenBy::WorkersStarted
        );
        assert_eq!(
            TrainingSeenBy::of_record(Some("a-future-observation")),
            TrainingSeenBy::WorkersStarted
        );
    }

    #[test]
    fn a_silent_loss_names_heartbeats() {
        let record = |lost_by: Option<&str>| PeerLossRecord {
            lost_by: lost_by.map(str::to_string),
            ..PeerLossRecord::default()
        };
        assert!(record(Some(LOST_BY_HEARTBEAT)).lost_by_heartbeat());
        assert!(record(Some("heartbeats")).lost_by_heartbeat());
        assert!(!record(Some("kubernetes")).lost_by_heartbeat());
        assert!(!record(None).lost_by_heartbeat());
        let text = r#"{"generation":2,"lostRank":1,"action":"report","result":"reported","at":"2026-11-23T18:00:03Z","suspectedAt":"2026-11-23T18:00:02Z","lostBy":"heartbeat","reason":"missed-heartbeats"}"#;
        let read = PeerLossRecord::from_annotation(text).expect("reads");
        assert_eq!(read.reason.as_deref(), Some("missed-heartbeats"));
        assert!(read.lost_by_heartbeat());
    }

    #[test]
    fn a_take_over_and_an_own_restart_are_not_losses() {
        let record = |action: &str| PeerLossRecord {
            action: action.into(),
            ..PeerLossRecord::default()
        };
        assert!(record("restart-workers").is_loss());
        assert!(record("report").is_loss());
        assert!(!record(SPARE_TOOK_OVER).is_loss());
        assert!(!record(TRAINER_RESTARTED).is_loss());
    }
}
