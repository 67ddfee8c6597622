//! What a sidecar did about a lost peer, as it records it on its own pod for
//! the webhook's failure controller to read: one story told by both.
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

/// The sidecar's last action on a lost peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl PeerLossRecord {
    /// The annotation's value; `None` only if serialisation fails.
    pub fn to_annotation(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }

    /// Read an annotation value; `None` when it is not a record.
    pub fn from_annotation(value: &str) -> Option<PeerLossRecord> {
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
        };
        let text = r.to_annotation().expect("json");
        assert_eq!(PeerLossRecord::from_annotation(&text), Some(r));
        assert_eq!(PeerLossRecord::from_annotation("{"), None);
        assert_eq!(PeerLossRecord::from_annotation("3"), None);
    }
}
