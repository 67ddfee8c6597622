//! What the webhook sets in torchrun's c10d rendezvous (`PET_RDZV_CONF`) and
//! the sidecar derives its timing from: one place for both.
//!
//! torchrun's rendezvous declares a node dead once its keep-alive has been
//! missing for `keep_alive_interval × keep_alive_max_attempt` (15 s by
//! default; 3 s as trainwire injects it). After that window a lost node is
//! dropped from the next rendezvous round by torchrun itself. The sidecar
//! of an elastic world or of a world with hot spares confirms a silent
//! loss sooner, after its loss window ([`crate::LossWindow`], 1 s by
//! default), and tells trainwire's rendezvous handler, which evicts the
//! node at once (see [`crate::config::Config::confirm_after_for`]).

use std::time::Duration;

/// `keep_alive_interval` (seconds) merged into `PET_RDZV_CONF`.
pub const KEEP_ALIVE_INTERVAL: &str = "1";
/// `keep_alive_max_attempt` merged into `PET_RDZV_CONF`.
pub const KEEP_ALIVE_MAX_ATTEMPT: &str = "3";
/// The keep-alive window these give: interval × attempts.
pub const KEEP_ALIVE_WINDOW: Duration = Duration::from_secs(3);

/// The rendezvous backend of trainwire's handler for torchrun (torch's c10d
/// rendezvous that hears a loss from the sidecar), registered through the
/// `torchrun.handlers` entry point of the files the sidecar installs.
pub const HANDLER_BACKEND: &str = "trainwire-c10d";

/// Where the pod's shared emptyDir is mounted (the init container, the
/// sidecar and the trainer).
pub const SHARED_DIR: &str = "/run/trainwire";
/// The handler's Python files, put on the trainer's `PYTHONPATH`.
pub const HANDLER_DIR: &str = "/run/trainwire/python";
/// The channel between the sidecar and the handler
/// ([`crate::env::RENDEZVOUS_DIR`]): the sidecar's loss file
/// [`LOSS_FILE`], the handler's node file [`NODE_FILE`].
pub const CHANNEL_DIR: &str = "/run/trainwire/rendezvous";
/// `{"losses": [{"id": "<rank>-<generation>", "rank": R,
/// "confirmed_unix_ms": T}, ...]}`, the sidecar's most recent confirmed
/// losses, replaced atomically (a rename).
pub const LOSS_FILE: &str = "losses.json";
/// `{"addr", "pid", "local_id", "run_id", "fast", "why_not"}`: the agent's
/// rendezvous node and whether it hears losses (and why not).
pub const NODE_FILE: &str = "node.json";

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
