//! One loss episode, from suspicion to the end of the response, and whether
//! the new pod for a lost rank is there for a restarted torchrun: pure state
//! and pure checks, no I/O.

use std::time::{Instant, SystemTime};

use crate::decide::Confirmation;
use crate::peers::{Identity, LossReason, Source};
use crate::signal::{Role, Sent, Stopped};
use crate::status::{EpisodeStatus, rfc3339};

/// Whether the new pod for a lost rank is there for a restarted torchrun:
/// up (Ready in the Kubernetes watch, or answering heartbeats), and, when
/// the rank has a name (`has_name`), that name (`resolved`) leading to the
/// new pod's address and no longer to the lost pod's (`lost`). Restarting
/// the agent while the name still leads to the dead pod (DNS lags behind a
/// replacement and may cache the old answer; an Indexed Job's old pod stays
/// published while it is Terminating, beside its replacement) would leave
/// the new torchrun waiting on that address for its whole `read_timeout`,
/// then exiting again.
pub fn replacement_is_there(
    new: &Identity,
    has_name: bool,
    resolved: Option<&[std::net::IpAddr]>,
    lost: Option<std::net::IpAddr>,
) -> bool {
    if !new.ready {
        return false;
    }
    if !has_name {
        return true;
    }
    let Some(addrs) = resolved else {
        return new.address.is_none();
    };
    if name_leads_to_lost(new, addrs, lost).is_some() {
        return false;
    }
    match new.address {
        Some(ip) => addrs.contains(&ip),
        // No address reported: Ready is all there is.
        None => true,
    }
}

/// The lost pod's address, when the name still leads to it and the new pod
/// is elsewhere (a replacement may get the old address back).
pub(super) fn name_leads_to_lost(
    new: &Identity,
    addrs: &[std::net::IpAddr],
    lost: Option<std::net::IpAddr>,
) -> Option<std::net::IpAddr> {
    lost.filter(|old| Some(*old) != new.address && addrs.contains(old))
}

/// One loss, from suspicion to the end of the response.
#[derive(Debug, Clone)]
pub struct Episode {
    pub generation: u64,
    pub rank: u32,
    pub source: Source,
    pub reason: LossReason,
    pub detail: String,
    pub identity: Option<Identity>,
    /// When the loss was decided (the last miss, the watch event).
    pub suspected_at: Instant,
    pub suspected_wall: SystemTime,
    /// [`Episode::observable_at`] on the wall clock: the loss's time in
    /// `/status` and in the record on the pod (`suspectedAt`).
    pub observable_wall: SystemTime,
    /// [`Episode::last_good`] on the wall clock, for a loss heartbeats saw
    /// (the last answer before the outage).
    pub last_answer_wall: Option<SystemTime>,
    /// Last good evidence before the loss (outage start for heartbeats).
    pub last_good: Option<Instant>,
    /// When the loss became observable (the first missed beat, or the
    /// watch event that showed it): where detection latency and, for a
    /// loss the Kubernetes watch saw, the outage are counted from.
    pub observable_at: Instant,
    pub confirmation: Option<Confirmation>,
    pub confirmed_at: Option<Instant>,
    pub confirmed_wall: Option<SystemTime>,
    pub replacement_ready: bool,
    /// The new pod seen for the rank (Ready in the Kubernetes watch, or
    /// answering heartbeats), until the rank's name leads to it and no
    /// longer to the lost pod.
    pub replacement: Option<Identity>,
    /// The lost pod's address while the name still leads to it beside the
    /// replacement's.
    pub name_leads_to_lost: Option<std::net::IpAddr>,
    /// That was logged and sent as an Event (once per episode).
    pub stale_name_reported: bool,
    /// The replacement host's rendezvous store, while it does not accept
    /// connections yet.
    pub store_closed: Option<std::net::SocketAddr>,
    /// The rank's name, while it does not resolve (and why).
    pub name_error: Option<String>,
    /// What of the trainer from before the loss is stopped.
    pub stopped: Stopped,
    /// Signals of this episode that arrived (what `/status` reports as
    /// done).
    pub delivered: Vec<Sent>,
    /// Killing steps of this episode that did not reach their goal.
    pub failed_attempts: u32,
    /// When a failed step is tried again.
    pub retry_at: Option<Instant>,
    /// Why the last step failed.
    pub last_failure: Option<String>,
    pub no_replacement_reported: bool,
    /// A killing action of this episode passed the storm guard.
    pub admitted: bool,
    /// Why the episode needs nothing more, once it does not.
    pub closed: Option<String>,
    pub waiting_for: Option<String>,
    pub decision: String,
    /// The loss instant on the clock process start times use.
    pub loss_ticks: Option<u64>,
}

impl Episode {
    /// When the outage began: the last good beat for heartbeats, the
    /// observable moment for what the Kubernetes watch saw.
    pub(super) fn outage_start(&self) -> Instant {
        match self.source {
            Source::Heartbeat => self.last_good.unwrap_or(self.observable_at),
            Source::Kubernetes => self.observable_at,
        }
    }

    pub(super) fn status(&self) -> EpisodeStatus {
        let state = match (&self.closed, self.confirmation) {
            (Some(_), _) => "closed",
            (None, None) => "suspect",
            (None, Some(_)) => "confirmed",
        };
        EpisodeStatus {
            generation: self.generation,
            rank: self.rank,
            lost_by: self.source.as_str(),
            reason: self.reason.as_str(),
            detail: self.detail.clone(),
            state,
            suspected_at: rfc3339(self.observable_wall),
            last_answer_at: self.last_answer_wall.map(rfc3339),
            detected_at: rfc3339(self.suspected_wall),
            confirmed_by: self.confirmation,
            confirmed_at: self.confirmed_wall.map(rfc3339),
            replacement_ready: self.replacement_ready,
            // What arrived, not what was planned.
            workers_stopped: self.delivered.iter().any(|s| s.role != Role::Agent),
            agent_killed: self.delivered.iter().any(|s| s.role == Role::Agent),
            failed_attempts: self.failed_attempts,
            last_failure: self.last_failure.clone(),
            waiting_for: if self.closed.is_some() {
                None
            } else {
                self.waiting_for.clone()
            },
            decision: self.closed.clone().unwrap_or_else(|| self.decision.clone()),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::net::IpAddr;

    /// A new pod `train-0`, Ready or not, at `address`.
    pub(in crate::respond) fn pod(ready: bool, address: Option<&str>) -> Identity {
        Identity {
            pod: "train-0".into(),
            uid: "new".into(),
            address: address.map(|a| a.parse().expect("ip")),
            ready,
            ..Identity::default()
        }
    }

    #[test]
    fn a_replacement_is_there_when_ready_and_its_name_leads_to_it() {
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let new = pod(true, Some("10.1.2.3"));
        let dead = Some(ip("10.9.9.9"));
        // DNS already follows the new pod.
        assert!(replacement_is_there(
            &new,
            true,
            Some(&[ip("10.1.2.3")]),
            dead
        ));
        assert!(replacement_is_there(
            &new,
            true,
            Some(&[ip("10.1.2.3")]),
            None
        ));
        // DNS still answers with the dead pod, or with nothing yet.
        assert!(!replacement_is_there(
            &new,
            true,
            Some(&[ip("10.9.9.9")]),
            dead
        ));
        assert!(!replacement_is_there(&new, true, Some(&[]), dead));
        assert!(!replacement_is_there(&new, true, None, dead));
        // Both, in either order (an Indexed Job's old pod is published while
        // it is Terminating): a restarted torchrun could pick the dead one.
        for both in [
            [ip("10.1.2.3"), ip("10.9.9.9")],
            [ip("10.9.9.9"), ip("10.1.2.3")],
        ] {
            assert!(!replacement_is_there(&new, true, Some(&both), dead));
            assert_eq!(name_leads_to_lost(&new, &both, dead), dead);
        }
        // The replacement got the lost pod's address back: nothing stale.
        assert!(replacement_is_there(
            &new,
            true,
            Some(&[ip("10.1.2.3")]),
            Some(ip("10.1.2.3"))
        ));
        assert_eq!(
            name_leads_to_lost(&new, &[ip("10.1.2.3")], Some(ip("10.1.2.3"))),
            None
        );
        // Not Ready: never, whatever DNS says.
        let starting = pod(false, Some("10.1.2.3"));
        assert!(!replacement_is_there(
            &starting,
            true,
            Some(&[ip("10.1.2.3")]),
            None
        ));
        // Nothing to check the name against: Ready is all there is.
        assert!(replacement_is_there(&new, false, None, dead));
        assert!(replacement_is_there(&pod(true, None), true, None, dead));
        assert!(!replacement_is_there(&pod(false, None), false, None, None));
        // No address reported, the name still leads to the lost pod.
        assert!(!replacement_is_there(
            &pod(true, None),
            true,
            Some(&[ip("10.9.9.9")]),
            dead
        ));
    }
}
