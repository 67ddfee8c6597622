//! A hung world: the stall timeout and what the sidecar does on a stall
//! (`trainwire.dev/stall-timeout`, `trainwire.dev/on-stall`, the sidecar's
//! `TRAINWIRE_STALL_TIMEOUT` and `TRAINWIRE_ON_STALL`, the policy's
//! `sidecar.stallTimeout` and `sidecar.onStall`).

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, PositiveDuration, string_value};

/// The default stall timeout: 15 minutes. A phase without any collective
/// traffic on any rank (a checkpoint save, an evaluation on one rank while
/// the others wait in a barrier) longer than NCCL's own watchdog (10
/// minutes) already ends an NCCL job, so a job that runs today has none;
/// the default leaves half that again as margin, and is half of gloo's
/// 30 minutes. A world whose saves or evaluations are longer sets its own.
pub const DEFAULT_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The signal a sidecar sends a stalled world's workers before it restarts
/// them, for their Python stacks: trainwire's `sitecustomize` (on the
/// trainer's `PYTHONPATH` with the rendezvous handler) registers Python's
/// `faulthandler` for it, which writes every thread's stack to the process's
/// standard error from the signal handler itself. SIGPWR: applications
/// leave it alone (SIGUSR1 and SIGUSR2 are often taken: job requeue,
/// profilers), and its default action ends a process without a handler
/// with no core dump, as the SIGTERM that follows would.
pub const STACKS_SIGNAL: &str = "SIGPWR";
/// The trainer's variable that names [`STACKS_SIGNAL`] to trainwire's
/// `sitecustomize` (by its name, as Python's `signal` module spells it);
/// unset or empty, nothing is registered.
pub const STACKS_SIGNAL_ENV: &str = "TRAINWIRE_STACKS_SIGNAL";
/// How long a sidecar waits after asking for the stacks (and resuming a
/// stopped worker) before it stops the workers: the dump takes
/// milliseconds once the process runs.
pub const STACKS_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// `off`, or how long no rank's collective traffic may stand still before
/// the world is stalled.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum StallTimeout {
    Off,
    After(PositiveDuration),
}

impl StallTimeout {
    /// The built-in default ([`DEFAULT_STALL_TIMEOUT`]).
    pub fn default_value() -> StallTimeout {
        PositiveDuration::new(DEFAULT_STALL_TIMEOUT).map_or(StallTimeout::Off, StallTimeout::After)
    }

    /// The timeout, `None` when off.
    pub fn get(self) -> Option<std::time::Duration> {
        match self {
            StallTimeout::Off => None,
            StallTimeout::After(d) => Some(d.get()),
        }
    }
}

impl Default for StallTimeout {
    fn default() -> Self {
        StallTimeout::default_value()
    }
}

impl FromStr for StallTimeout {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        if s == "off" {
            return Ok(StallTimeout::Off);
        }
        s.parse::<PositiveDuration>()
            .map(StallTimeout::After)
            .map_err(|e| Invalid::new(s, e.reason, <StallTimeout as Grammar>::ACCEPTED))
    }
}

impl fmt::Display for StallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StallTimeout::Off => f.write_str("off"),
            StallTimeout::After(d) => write!(f, "{d}"),
        }
    }
}

impl Grammar for StallTimeout {
    const ACCEPTED: &'static str =
        "off, or a Go duration above zero such as 90s, 20m, 1h (at most 8760h)";
}

string_value!(StallTimeout);

crate::values::choice!(
    /// What the sidecar does when the world is stalled (docs/sidecar.md).
    StallAction, "restart-workers, none", {
    /// Restart the local workers (torchrun restarts them from the newest
    /// checkpoint, and the world with them).
    RestartWorkers => "restart-workers",
    /// Report only.
    None => "none",
});

/// The pod annotation a sidecar writes when its world stalled
/// ([`StallRecord`]); the world controller reads it.
pub const ANNOTATION: &str = crate::annotations::STALL;
/// The longest record read.
pub const MAX_RECORD_BYTES: usize = 4096;
/// The most ranks a record names one by one.
pub const MAX_RANKS_NAMED: usize = 8;

/// What a sidecar records on its own pod about a stall it found: when,
/// which ranks showed what, and what it did. The world status keeps the
/// newest of its pods' records (`lastStall`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StallRecord {
    /// When the stall was found (RFC 3339).
    pub at: String,
    /// Which ranks showed what, at most [`MAX_RANKS_NAMED`] named
    /// (`rank 0 worker 4242 stopped; 2 ranks idle 21s or more`).
    pub ranks: String,
    /// `restart-workers` or `none`.
    pub action: String,
    /// `signalled`, `reported`, `cooldown`, ...
    pub result: String,
    /// How many stuck workers (stopped, uninterruptible, zombie) the
    /// sidecar saw on the ranks it asked.
    #[serde(default)]
    pub stuck: u32,
}

/// A [`StallRecord::result`] of a sidecar that acted: it signalled its
/// workers (the sidecar's outcome of that name).
pub const SIGNALLED: &str = "signalled";

/// Records of one stall: the sidecars of a stalled world each record it
/// within this of each other.
pub const SAME_STALL: std::time::Duration = std::time::Duration::from_secs(60);

impl StallRecord {
    /// The annotation's value; `None` only if serialisation fails.
    pub fn to_annotation(&self) -> Option<String> {
        serde_json::to_string(self).ok()
    }

    /// Read an annotation value; `None` when it is not a record (or too long).
    pub fn from_annotation(value: &str) -> Option<StallRecord> {
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
    fn a_record_round_trips_and_a_long_one_is_refused() {
        let r = StallRecord {
            at: "2026-12-04T16:40:00Z".into(),
            ranks: "rank 0 worker 42 stopped; 1 rank idle 21s or more".into(),
            action: "restart-workers".into(),
            result: "signalled".into(),
            stuck: 1,
        };
        let text = r.to_annotation().expect("json");
        assert!(text.contains("\"ranks\""), "{text}");
        assert_eq!(StallRecord::from_annotation(&text), Some(r));
        assert_eq!(StallRecord::from_annotation("{"), None);
        assert_eq!(
            StallRecord::from_annotation(&" ".repeat(MAX_RECORD_BYTES + 1)),
            None
        );
    }

    #[test]
    fn off_or_a_positive_duration_round_trips() {
        for text in ["off", "20s", "15m", "1h30m"] {
            let t: StallTimeout = text.parse().expect(text);
            assert_eq!(t.to_string().parse::<StallTimeout>(), Ok(t), "{text}");
        }
        assert_eq!(
            "off".parse::<StallTimeout>().map(StallTimeout::get),
            Ok(None)
        );
        assert_eq!(
            StallTimeout::default().get(),
            Some(std::time::Duration::from_secs(900))
        );
        assert_eq!(
            StallTimeout::read(" 90s ").map(|t| t.get()),
            Ok(Some(std::time::Duration::from_secs(90)))
        );
        for bad in ["0s", "0", "-1m", "1d", "Off", "", "never"] {
            let e = bad.parse::<StallTimeout>().expect_err(bad);
            assert_eq!(e.accepted, <StallTimeout as Grammar>::ACCEPTED);
        }
        assert_eq!("restart-workers".parse(), Ok(StallAction::RestartWorkers));
        assert_eq!("none".parse(), Ok(StallAction::None));
        assert!("restart-agent".parse::<StallAction>().is_err());
    }
}
