//! What the sidecar shows of a hung world (`/status` → `progress`, the
//! peers' `/progress` answers): the types only, shared by the progress
//! scan ([`crate::progress`]) and the status document ([`crate::status`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A worker that does not run: stopped (`T`, `t`: a signal or a
/// debugger), in uninterruptible sleep for [`STUCK_AFTER`] or more (`D`: a
/// hung volume, a driver), or a zombie nobody reaped (`Z`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckWorker {
    pub pid: i32,
    /// `stopped`, `uninterruptible`, `zombie`.
    pub state: String,
    /// Since when it has been seen so, RFC 3339.
    pub since: String,
}

/// One rank's progress as [`judge`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankProgress {
    pub rank: u32,
    /// How long since it last moved; `None` when it cannot be told (no
    /// workers, a spare, traffic unreadable, no answer).
    pub idle_ms: Option<u64>,
    #[serde(default)]
    pub stuck: Vec<StuckWorker>,
    /// Why its progress cannot be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

impl RankProgress {
    pub(crate) fn idle(&self) -> Option<Duration> {
        self.idle_ms.map(Duration::from_millis)
    }
}

/// The `progress` section of `/status`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ProgressStatus {
    /// `off` or the timeout.
    pub stall_timeout: String,
    pub on_stall: &'static str,
    /// When this pod's workers last moved (RFC 3339).
    pub last_moved_at: Option<String>,
    pub idle_seconds: Option<f64>,
    /// Why this pod's progress cannot be told, when it cannot.
    pub unknown: Option<String>,
    pub stuck: Vec<StuckWorker>,
    /// The world's current verdict: `moving`, `unknown`, `stalled`, or
    /// `local-idle` (this pod idle past the timeout, its peers not yet
    /// asked or one of them moving).
    pub world: &'static str,
    /// The last stall found, and what was done.
    pub last_stall: Option<StallRecord>,
    pub stalls_total: u64,
}

/// A stall found: when, which ranks showed what, the action and its result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StallRecord {
    pub at: String,
    pub idle_seconds: f64,
    /// Every rank asked: its idle time, stuck workers, or why unknown.
    pub ranks: Vec<RankProgress>,
    pub action: &'static str,
    pub result: &'static str,
    pub detail: String,
}
