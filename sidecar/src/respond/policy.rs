//! What to do for a loss: the situation [`crate::decide`] looks at, built
//! from an episode, and when a killing step counts as done or is tried
//! again.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::decide::Situation;
use crate::peers::Peers;
use crate::signal::{Outcome, Plan, Sent};

use super::episode::Episode;

/// Attempts of one killing step whose signals did not arrive, before the
/// episode gives up (and says so).
pub const MAX_ATTEMPTS: u32 = 5;

/// The wait before attempt `n + 1` of a step that failed `n` times.
pub fn retry_after(failed: u32) -> Duration {
    Duration::from_millis(500)
        .saturating_mul(1 << failed.min(6))
        .min(Duration::from_secs(15))
}

/// Whether a killing step reached its goal: every signal it needs arrived
/// (the workers' for `restart-workers`, the agent's for `restart-agent`),
/// or nothing from before the loss runs any more.
pub(super) fn goal_reached(plan: Plan, outcome: Outcome, signals: &[Sent]) -> bool {
    let mut needed = signals.iter().filter(|s| plan.needs(s.role)).peekable();
    match outcome {
        Outcome::NoTrainer => true,
        Outcome::Failed => false,
        Outcome::Signalled | Outcome::Partial => {
            plan == Plan::ReportOnly
                || (needed.peek().is_some() && needed.all(|s| s.error.is_none()))
        }
        Outcome::Reported | Outcome::Cooldown | Outcome::Capped => false,
    }
}

/// What [`crate::decide::decide`] looks at for `ep` now: the episode, the
/// configuration and the peers still up (those this sidecar does not watch
/// by the controllers' `view`, when one was read since the loss).
pub(super) fn situation(
    ep: &Episode,
    config: &Config,
    peers: &Peers,
    view: Option<&trainwire_contract::world::WorldStatus>,
    now: Instant,
) -> Situation {
    let rank = ep.rank;
    let survivors = crate::world::survivors(rank, peers, view);
    Situation {
        mode: config.on_peer_loss,
        lost_rank: rank,
        rdzv_host_rank: config.rdzv_host_rank,
        nnodes: config.nnodes,
        spares: config.spares,
        survivors,
        confirmation: ep.confirmation,
        replacement_ready: ep.replacement_ready,
        stopped: ep.stopped,
        since_confirmed: ep
            .confirmed_at
            .map(|c| now.saturating_duration_since(c))
            .unwrap_or_default(),
        replacement_wait: config.replacement_wait,
        no_replacement_reported: ep.no_replacement_reported,
        name_leads_to_lost: ep.name_leads_to_lost,
        store_closed: ep.store_closed,
        name_error: ep.name_error.clone(),
    }
}

/// What `plan` waits for, while a failed attempt of it waits out its
/// back-off ([`retry_after`]); `None` once it may be tried again.
pub(super) fn retry_wait(ep: &Episode, plan: Plan, now: Instant) -> Option<String> {
    let at = ep.retry_at.filter(|at| *at > now)?;
    Some(format!(
        "attempt {} of {} of {} in {:.1}s (the last failed: {})",
        ep.failed_attempts + 1,
        MAX_ATTEMPTS,
        plan.as_str(),
        at.saturating_duration_since(now).as_secs_f64(),
        ep.last_failure.as_deref().unwrap_or_default()
    ))
}
