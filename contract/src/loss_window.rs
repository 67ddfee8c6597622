//! The loss window: how long a peer may be silent before its sidecar
//! confirms it lost (`trainwire.dev/loss-window`, the policy's
//! `sidecar.lossWindow`, the sidecar's `TRAINWIRE_LOSS_WINDOW`).
//!
//! The heartbeats derive from it ([`LossWindow::heartbeat_interval`],
//! [`LossWindow::heartbeat_misses`], [`LossWindow::probe_timeout`]): a
//! probe every fifth of the window, a peer suspect after four intervals in
//! a row without an answer (confirmed through up to two other sidecars
//! first), and the loss confirmed once no answer came for the whole window
//! where torchrun itself drops a silent node (a non-host peer of an elastic
//! world or of a world with hot spares). A stall shorter than the window
//! costs nothing; a longer window trades speed for tolerance of blips.

use std::fmt;
use std::str::FromStr;
use std::time::Duration as Std;

use crate::{Duration, Grammar, Invalid, string_value};

/// The default window: 1 s.
pub const DEFAULT_LOSS_WINDOW: Std = Std::from_secs(1);
/// The shortest window: 200 ms (a probe every 40 ms; shorter is not
/// heartbeating, it is a busy loop on a loaded node).
pub const MIN_LOSS_WINDOW: Std = Std::from_millis(200);
/// The longest window: 10 minutes (beyond, NCCL's own watchdog has ended
/// the job already).
pub const MAX_LOSS_WINDOW: Std = Std::from_secs(600);

/// Probes per window ([`LossWindow::heartbeat_interval`]).
pub const PROBES_PER_WINDOW: u32 = 5;
/// Intervals in a row without an answer after which a peer is suspect
/// ([`LossWindow::heartbeat_misses`]).
pub const MISSES: u32 = 4;

/// How long a peer may be silent before its loss is confirmed, from 200 ms
/// to 10 m.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LossWindow(Std);

impl LossWindow {
    /// A window, if it is within the bounds.
    pub fn new(d: Std) -> Option<LossWindow> {
        (MIN_LOSS_WINDOW..=MAX_LOSS_WINDOW)
            .contains(&d)
            .then_some(LossWindow(d))
    }

    /// The window.
    pub fn get(self) -> Std {
        self.0
    }

    /// The heartbeat probe period: a fifth of the window (200 ms at 1 s).
    pub fn heartbeat_interval(self) -> Std {
        self.0 / PROBES_PER_WINDOW
    }

    /// Intervals in a row without an answer after which a peer is suspect
    /// (and its other watchers are asked): 4, so a silent peer is suspect
    /// at four fifths of the window and its loss confirmed at the window.
    pub fn heartbeat_misses(self) -> u32 {
        MISSES
    }

    /// How long one probe may wait for its answer: 1.2 × the window, so an
    /// answer slower than the window (added latency) still counts.
    pub fn probe_timeout(self) -> Std {
        self.0 * 6 / 5
    }
}

impl Default for LossWindow {
    fn default() -> Self {
        LossWindow(DEFAULT_LOSS_WINDOW)
    }
}

impl FromStr for LossWindow {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |reason: String| Invalid::new(s, reason, <LossWindow as Grammar>::ACCEPTED);
        let d = s.parse::<Duration>().map_err(|e| bad(e.reason))?.get();
        if d < MIN_LOSS_WINDOW {
            return Err(bad("it is shorter than 200ms".into()));
        }
        if d > MAX_LOSS_WINDOW {
            return Err(bad("it is longer than 10m".into()));
        }
        Ok(LossWindow(d))
    }
}

/// In the contract's duration form (`1s`, `1s500ms`, `2m`).
impl fmt::Display for LossWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match Duration::new(self.0) {
            Some(d) => d.fmt(f),
            None => write!(f, "{}ms", self.0.as_millis()),
        }
    }
}

impl Grammar for LossWindow {
    const ACCEPTED: &'static str =
        "a Go duration from 200ms to 10m, such as 1s, 1500ms, 1.5s, 2s, 30s";
}

string_value!(LossWindow);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    #[rstest]
    #[case("1s", 1000)]
    #[case("1500ms", 1500)]
    #[case("1.5s", 1500)]
    #[case("1s500ms", 1500)]
    #[case("200ms", 200)]
    #[case("10m", 600_000)]
    #[case("2s", 2000)]
    fn parses(#[case] text: &str, #[case] ms: u64) {
        assert_eq!(
            text.parse::<LossWindow>().map(LossWindow::get),
            Ok(Std::from_millis(ms))
        );
    }

    #[rstest]
    #[case("199ms", "shorter than 200ms")]
    #[case("0s", "shorter than 200ms")]
    #[case("10m1ms", "longer than 10m")]
    #[case("1h", "longer than 10m")]
    #[case("1", "no unit")]
    #[case("", "empty")]
    #[case("1d", "24h")]
    #[case("-1s", "negative")]
    #[case("fast", "must follow")]
    #[case("5x", "not a unit")]
    fn refuses_naming_the_accepted_forms(#[case] text: &str, #[case] why: &str) {
        let e = text.parse::<LossWindow>().expect_err(text);
        assert!(e.reason.contains(why), "{text}: {e}");
        assert_eq!(e.accepted, <LossWindow as Grammar>::ACCEPTED);
        assert!(e.to_string().contains("1500ms"), "{e}");
    }

    #[test]
    fn the_default_and_what_derives_from_it() {
        let w = LossWindow::default();
        assert_eq!(w.get(), Std::from_secs(1));
        assert_eq!(w.to_string(), "1s");
        assert_eq!(w.heartbeat_interval(), Std::from_millis(200));
        assert_eq!(w.heartbeat_misses(), 4);
        assert_eq!(w.probe_timeout(), Std::from_millis(1200));
        let w: LossWindow = "1.5s".parse().expect("1.5s");
        assert_eq!(w.to_string(), "1s500ms");
        assert_eq!(w.heartbeat_interval(), Std::from_millis(300));
        assert_eq!(w.probe_timeout(), Std::from_millis(1800));
        assert_eq!(LossWindow::read(" 2s "), Ok(LossWindow(Std::from_secs(2))));
        assert_eq!(LossWindow::new(Std::from_millis(100)), None);
    }

    proptest! {
        #[test]
        fn round_trips(ms in 200u64..=600_000, ns in 0u32..1_000_000) {
            let d = Std::from_millis(ms) + Std::from_nanos(u64::from(ns));
            if let Some(w) = LossWindow::new(d) {
                prop_assert_eq!(w.to_string().parse::<LossWindow>(), Ok(w));
            }
        }

        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = s.parse::<LossWindow>();
        }

        #[test]
        fn never_panics_on_duration_shapes(s in "[-+]?[0-9.]{0,30}(ns|us|ms|s|m|h|d)?([0-9.]{0,25}(ns|us|ms|s|m|h)){0,3}") {
            if let Ok(w) = s.parse::<LossWindow>() {
                prop_assert!(w.get() >= MIN_LOSS_WINDOW && w.get() <= MAX_LOSS_WINDOW);
            }
        }
    }
}
