//! What the webhook sets in torchrun's c10d rendezvous (`PET_RDZV_CONF`) and
//! the sidecar derives its timing from: one place for both.
//!
//! torchrun's rendezvous declares a node dead once its keep-alive has been
//! missing for `keep_alive_interval × keep_alive_max_attempt` (15 s by
//! default; 3 s as trainwire injects it). After that window a lost node is
//! dropped from the next rendezvous round by torchrun itself, so the
//! sidecar of an elastic world confirms a loss after the same window (see
//! [`crate::config::Config::confirm_after_for`]).

use std::time::Duration;

/// `keep_alive_interval` (seconds) merged into `PET_RDZV_CONF`.
pub const KEEP_ALIVE_INTERVAL: &str = "1";
/// `keep_alive_max_attempt` merged into `PET_RDZV_CONF`.
pub const KEEP_ALIVE_MAX_ATTEMPT: &str = "3";
/// The keep-alive window these give: interval × attempts.
pub const KEEP_ALIVE_WINDOW: Duration = Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_interval_times_attempts() {
        let interval: u64 = KEEP_ALIVE_INTERVAL.parse().expect("interval");
        let attempts: u64 = KEEP_ALIVE_MAX_ATTEMPT.parse().expect("attempts");
        assert_eq!(KEEP_ALIVE_WINDOW, Duration::from_secs(interval * attempts));
    }
}
