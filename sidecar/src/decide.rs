//! What to do about a lost peer, as a pure function.
//!
//! A missed beat only makes a peer *suspect*: it is reported (log, metric,
//! `/status`), never acted on. An action that kills needs a *confirmed* loss:
//! Kubernetes says the pod is gone, failed, replaced or its node is not
//! ready; or a different pod answers at the peer's name (its replacement
//! exists); or the outage outlasts `TRAINWIRE_CONFIRM_AFTER`, long enough
//! that training would not have ridden it out either. [`decide`] maps one
//! episode's situation to one [`Action`]; the responder carries it out.

use std::time::Duration;

use serde::Serialize;

use crate::config::{NodeCount, PeerLossAction};
use crate::peers::LossReason;
use crate::signal::{Plan, Stopped};

/// What confirmed a loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "by", content = "detail")]
pub enum Confirmation {
    /// The Kubernetes watch: deleted, failed, new UID, node not ready, ...
    Kubernetes(LossReason),
    /// A different pod (new UID or start time) answered at the peer's name.
    ReplacementAnswered,
    /// No answer for longer than `TRAINWIRE_CONFIRM_AFTER`.
    Outage,
}

impl Confirmation {
    /// Every value of [`Confirmation::as_str`].
    pub const LABELS: [&'static str; 3] = ["kubernetes", "replacement-answered", "outage"];

    pub fn as_str(self) -> &'static str {
        match self {
            Confirmation::Kubernetes(_) => "kubernetes",
            Confirmation::ReplacementAnswered => "replacement-answered",
            Confirmation::Outage => "outage",
        }
    }

    /// The confirmation a Kubernetes loss reason gives, if any. A pod that is
    /// merely not Ready (its readiness probe failed, the trainer is slow) is
    /// suspect, not confirmed.
    pub fn from_kubernetes(reason: LossReason) -> Option<Confirmation> {
        match reason {
            LossReason::NotReady | LossReason::MissedHeartbeats => None,
            LossReason::IdentityChanged
            | LossReason::Deleted
            | LossReason::Failed
            | LossReason::ContainerRestarted
            | LossReason::NodeUnreachable
            | LossReason::Disrupted
            | LossReason::StuckTerminating => Some(Confirmation::Kubernetes(reason)),
        }
    }
}

/// Everything [`decide`] looks at for one loss episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Situation {
    pub mode: PeerLossAction,
    pub lost_rank: u32,
    pub rdzv_host_rank: Option<u32>,
    pub nnodes: NodeCount,
    /// Hot spares of the world (pods beyond its size).
    pub spares: u32,
    /// Nodes of the world still up, this one included.
    pub survivors: u32,
    pub confirmation: Option<Confirmation>,
    /// A new pod answers at the lost peer's name (or, for a restarted
    /// container, the same pod is back): the rendezvous host is there.
    pub replacement_ready: bool,
    /// What of the trainer from before the loss was stopped in this
    /// episode.
    pub stopped: Stopped,
    /// Time since the confirmation (zero when unconfirmed).
    pub since_confirmed: Duration,
    pub replacement_wait: Duration,
    pub no_replacement_reported: bool,
    /// The replacement is up, but the lost peer's name still also leads to
    /// the lost pod's address (this one): DNS still publishes the old pod.
    pub name_leads_to_lost: Option<std::net::IpAddr>,
    /// The replacement of the rendezvous host is up and its name leads to
    /// it, but its rendezvous store there does not accept connections yet
    /// (its torchrun is not up: a large image still pulling, say).
    pub store_closed: Option<std::net::SocketAddr>,
    /// The lost rank's name does not resolve now (why): shown in what is
    /// waited for.
    pub name_error: Option<String>,
}

/// One step of the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Nothing to do now; `Decision::waiting_for` says for what.
    Wait,
    /// SIGTERM the workers: frees the GPUs; the agent re-rendezvous.
    StopWorkers,
    /// SIGKILL the agent and its workers: the container exits once and the
    /// restarted torchrun joins the (new) store.
    KillAgent,
    /// Say (log, Warning Event) that no replacement came within the wait.
    ReportNoReplacement,
    /// The episode needs nothing more from this sidecar.
    Done,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Wait => "wait",
            Action::StopWorkers | Action::KillAgent => self.plan().as_str(),
            Action::ReportNoReplacement => "report-no-replacement",
            Action::Done => "done",
        }
    }

    /// The signals that carry this step out: the one place where a step
    /// meets a [`Plan`]. A step that signals nothing (waiting, reporting,
    /// closing the episode) is recorded as `report-only`.
    pub fn plan(self) -> Plan {
        match self {
            Action::StopWorkers => Plan::TermWorkers,
            Action::KillAgent => Plan::KillAgent,
            Action::Wait | Action::ReportNoReplacement | Action::Done => Plan::ReportOnly,
        }
    }
}

/// The decision and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// What the episode waits for (shown in `/status`), if anything.
    pub waiting_for: Option<String>,
    pub why: String,
}

fn decision(action: Action, waiting_for: Option<String>, why: impl Into<String>) -> Decision {
    Decision {
        action,
        waiting_for,
        why: why.into(),
    }
}

/// The next step for one loss episode.
pub fn decide(s: &Situation) -> Decision {
    let rank = s.lost_rank;
    if s.mode == PeerLossAction::None {
        return decision(Action::Done, None, "on-peer-loss is none: reporting only");
    }
    if s.confirmation.is_none() {
        return decision(
            Action::Wait,
            Some(format!(
                "confirmation that rank {rank} is lost (Kubernetes, a different pod answering at its name, or a longer outage)"
            )),
            format!("rank {rank} is suspect, not confirmed lost: nothing is touched"),
        );
    }
    let is_host = Some(rank) == s.rdzv_host_rank;
    match s.mode {
        PeerLossAction::None => decision(Action::Done, None, "on-peer-loss is none"),
        PeerLossAction::RestartWorkers if s.stopped == Stopped::None => {
            decision(Action::StopWorkers, None, "on-peer-loss is restart-workers")
        }
        PeerLossAction::RestartAgent if s.stopped < Stopped::Trainer => {
            decision(Action::KillAgent, None, "on-peer-loss is restart-agent")
        }
        PeerLossAction::RestartWorkers | PeerLossAction::RestartAgent => {
            decision(Action::Done, None, "already acted on this loss")
        }
        PeerLossAction::Auto if is_host => {
            if s.stopped == Stopped::Trainer {
                return decision(
                    Action::Done,
                    None,
                    "the agent from before the loss is gone (killed, or it had exited): the restarted torchrun joins the new store",
                );
            }
            if s.replacement_ready {
                return decision(
                    Action::KillAgent,
                    None,
                    format!(
                        "the rendezvous host (rank {rank}) is replaced and answers at its name: restart the agent once so torchrun joins the new store"
                    ),
                );
            }
            let waiting = Some(match (s.name_leads_to_lost, s.store_closed) {
                (Some(old), _) => format!(
                    "the name of the rendezvous host (rank {rank}) to stop leading to the lost pod's address {old}: the replacement is up, but a restarted torchrun could connect to the dead address and wait out its read_timeout (the old pod leaves the Service's DNS once it is deleted)"
                ),
                (None, Some(store)) => format!(
                    "the rendezvous store of rank {rank} (replaced, or its trainer restarted) to accept connections at {store}: the pod is up, its torchrun is not yet, and a torchrun restarted now would wait for it for at most its read_timeout, then exit again"
                ),
                (None, None) => match &s.name_error {
                    Some(e) => format!(
                        "the replacement of the rendezvous host (rank {rank}) to answer at its name ({e})"
                    ),
                    None => format!(
                        "the replacement of the rendezvous host (rank {rank}) to answer at its name"
                    ),
                },
            });
            if s.stopped == Stopped::None {
                return decision(
                    Action::StopWorkers,
                    waiting,
                    format!(
                        "the rendezvous host (rank {rank}) is lost: stop the workers (free the GPUs); the agent is restarted when the replacement is there"
                    ),
                );
            }
            if s.since_confirmed >= s.replacement_wait && !s.no_replacement_reported {
                let why = match (s.name_leads_to_lost, s.store_closed) {
                    (Some(old), _) => format!(
                        "the replacement of the rendezvous host (rank {rank}) is up, but after {}s its name still leads to the lost pod's address {old} as well; the GPUs stay free. The old pod is still published: delete it (kubectl delete pod --grace-period=0 --force) or let the policy's nodeFailure reclaim do it",
                        s.replacement_wait.as_secs()
                    ),
                    (None, Some(store)) => format!(
                        "the replacement of the rendezvous host (rank {rank}) is up, but its rendezvous store at {store} has not accepted connections within {}s; the GPUs stay free. Look at its trainer container (an image pull, a crash loop)",
                        s.replacement_wait.as_secs()
                    ),
                    (None, None) => format!(
                        "no replacement of the rendezvous host (rank {rank}) within {}s; the GPUs stay free",
                        s.replacement_wait.as_secs()
                    ),
                };
                return decision(Action::ReportNoReplacement, waiting, why);
            }
            decision(Action::Wait, waiting, "the workers are stopped")
        }
        // A spare waits in torchrun's rendezvous: when the lost node's
        // keep-alive expires, it moves to the wait list, the survivors' agents
        // see a waiting node and restart their workers, and the next round
        // forms with it. Nothing to do here (restarting the workers early
        // would only spend a max_restarts attempt).
        PeerLossAction::Auto if s.spares > 0 => decision(
            Action::Done,
            None,
            format!(
                "rank {rank} lost; a spare ({} in the world) takes its place: torchrun forms the next round with it",
                s.spares
            ),
        ),
        PeerLossAction::Auto => match s.nnodes {
            NodeCount::Elastic { min, .. } if s.survivors >= min => {
                if s.stopped > Stopped::None {
                    decision(
                        Action::Done,
                        None,
                        "the workers were restarted; torchrun re-rendezvous without the lost node",
                    )
                } else {
                    decision(
                        Action::StopWorkers,
                        None,
                        format!(
                            "elastic world: {} survivors ≥ {min}: restart the workers so the world shrinks and goes on",
                            s.survivors
                        ),
                    )
                }
            }
            NodeCount::Elastic { min, .. } => decision(
                Action::Done,
                None,
                format!(
                    "elastic world: {} survivors < {min}: torchrun recovers by itself once a replacement joins",
                    s.survivors
                ),
            ),
            NodeCount::Fixed(_) => decision(
                Action::Done,
                None,
                match s.rdzv_host_rank {
                    Some(host) => format!(
                        "rank {rank} is not the rendezvous host (rank {host}): torchrun recovers by itself once a replacement joins"
                    ),
                    None => format!(
                        "rank {rank} lost; the rendezvous store is outside the world: torchrun recovers by itself once a replacement joins"
                    ),
                },
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODES: [PeerLossAction; 4] = [
        PeerLossAction::Auto,
        PeerLossAction::RestartWorkers,
        PeerLossAction::RestartAgent,
        PeerLossAction::None,
    ];
    const TOPOLOGIES: [NodeCount; 3] = [
        NodeCount::Fixed(2),
        NodeCount::Fixed(4),
        NodeCount::Elastic { min: 2, max: 3 },
    ];
    const CONFIRMATIONS: [Option<Confirmation>; 5] = [
        None,
        Some(Confirmation::Outage),
        Some(Confirmation::ReplacementAnswered),
        Some(Confirmation::Kubernetes(LossReason::Deleted)),
        Some(Confirmation::Kubernetes(LossReason::NodeUnreachable)),
    ];

    fn base(mode: PeerLossAction, nnodes: NodeCount, lost_rank: u32) -> Situation {
        Situation {
            mode,
            lost_rank,
            rdzv_host_rank: Some(0),
            nnodes,
            spares: 0,
            survivors: nnodes.max() - 1,
            confirmation: None,
            replacement_ready: false,
            stopped: Stopped::None,
            since_confirmed: Duration::ZERO,
            replacement_wait: Duration::from_secs(600),
            no_replacement_reported: false,
            name_leads_to_lost: None,
            store_closed: None,
            name_error: None,
        }
    }

    fn kills(a: Action) -> bool {
        matches!(a, Action::StopWorkers | Action::KillAgent)
    }

    /// The signals of a confirmed loss's decisive step (the replacement is
    /// there), by mode: in `auto` only the rendezvous host's loss kills the
    /// agent, since torchrun recovers from any other lost peer by itself
    /// once a replacement joins, while an agent whose c10d store died never
    /// does and ignores SIGTERM.
    #[test]
    fn plans() {
        let plan = |mode, lost_rank, rdzv_host_rank| {
            let mut s = base(mode, NodeCount::Fixed(2), lost_rank);
            s.rdzv_host_rank = rdzv_host_rank;
            s.confirmation = Some(Confirmation::Outage);
            s.replacement_ready = true;
            decide(&s).action.plan()
        };
        assert_eq!(plan(PeerLossAction::Auto, 0, Some(0)), Plan::KillAgent);
        assert_eq!(plan(PeerLossAction::Auto, 1, Some(0)), Plan::ReportOnly);
        // An external store (etcd-v2): no peer's loss strands the agent.
        assert_eq!(plan(PeerLossAction::Auto, 0, None), Plan::ReportOnly);
        assert_eq!(
            plan(PeerLossAction::RestartWorkers, 0, Some(0)),
            Plan::TermWorkers
        );
        assert_eq!(
            plan(PeerLossAction::RestartAgent, 2, Some(0)),
            Plan::KillAgent
        );
        assert_eq!(plan(PeerLossAction::RestartAgent, 2, None), Plan::KillAgent);
        assert_eq!(plan(PeerLossAction::None, 0, Some(0)), Plan::ReportOnly);
    }

    /// Every (mode, topology, lost rank, host placement, survivors,
    /// confirmation, replacement, progress) combination.
    fn all() -> Vec<Situation> {
        let mut out = Vec::new();
        for mode in MODES {
            for nnodes in TOPOLOGIES {
                for lost_rank in 0..nnodes.max().min(3) {
                    for host in [Some(0), None] {
                        for survivors in [1, 2] {
                            for confirmation in CONFIRMATIONS {
                                for replacement_ready in [false, true] {
                                    for stopped in
                                        [Stopped::None, Stopped::Workers, Stopped::Trainer]
                                    {
                                        for since in [0, 601] {
                                            let mut s = base(mode, nnodes, lost_rank);
                                            s.rdzv_host_rank = host;
                                            s.survivors = survivors;
                                            s.confirmation = confirmation;
                                            s.replacement_ready = replacement_ready;
                                            s.stopped = stopped;
                                            s.since_confirmed = Duration::from_secs(since);
                                            if !replacement_ready {
                                                // Up, but DNS still has the old pod.
                                                out.push(Situation {
                                                    name_leads_to_lost: Some([10, 0, 0, 9].into()),
                                                    ..s.clone()
                                                });
                                                // Up, its store not yet.
                                                out.push(Situation {
                                                    store_closed: Some(
                                                        ([10, 0, 0, 5], 29500).into(),
                                                    ),
                                                    ..s.clone()
                                                });
                                            }
                                            // With a spare waiting.
                                            out.push(Situation {
                                                spares: 1,
                                                ..s.clone()
                                            });
                                            out.push(s);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// With a spare and the store outside the world, `auto` touches
    /// nothing: the spare takes the lost node's place in torchrun's next
    /// round. With the store on pod 0, losing pod 0 still follows the
    /// rendezvous host's recipe.
    #[test]
    fn a_spare_takes_the_place_of_any_lost_node() {
        for lost_rank in 0..3 {
            let mut s = base(PeerLossAction::Auto, NodeCount::Fixed(3), lost_rank);
            s.spares = 1;
            s.rdzv_host_rank = None;
            s.confirmation = Some(Confirmation::Kubernetes(LossReason::Deleted));
            let d = decide(&s);
            assert_eq!(d.action, Action::Done, "{d:?}");
            assert!(d.why.contains("a spare"), "{d:?}");
        }
        let mut s = base(PeerLossAction::Auto, NodeCount::Fixed(3), 0);
        s.spares = 1;
        s.confirmation = Some(Confirmation::Kubernetes(LossReason::Deleted));
        assert_eq!(decide(&s).action, Action::StopWorkers);
    }

    #[test]
    fn no_action_without_confirmation() {
        for s in all().into_iter().filter(|s| s.confirmation.is_none()) {
            let d = decide(&s);
            assert!(!kills(d.action), "{s:?} → {d:?}");
            assert!(
                matches!(d.action, Action::Wait | Action::Done),
                "{s:?} → {d:?}"
            );
        }
    }

    #[test]
    fn none_never_acts_and_nothing_is_done_twice() {
        for s in all() {
            let d = decide(&s);
            if s.mode == PeerLossAction::None {
                assert_eq!(d.action, Action::Done, "{s:?}");
            }
            if s.stopped == Stopped::Trainer {
                assert!(!kills(d.action), "acted after the agent was killed: {s:?}");
            }
            if s.stopped >= Stopped::Workers {
                assert_ne!(d.action, Action::StopWorkers, "{s:?}");
            }
        }
    }

    #[test]
    fn the_agent_is_killed_in_auto_only_when_the_host_replacement_is_there() {
        for s in all().into_iter().filter(|s| s.mode == PeerLossAction::Auto) {
            let d = decide(&s);
            if d.action == Action::KillAgent {
                assert_eq!(Some(s.lost_rank), s.rdzv_host_rank, "{s:?}");
                assert!(s.replacement_ready && s.confirmation.is_some(), "{s:?}");
            }
        }
    }

    #[test]
    fn a_lost_non_host_in_a_fixed_world_is_hands_off() {
        for s in all().into_iter().filter(|s| {
            s.mode == PeerLossAction::Auto
                && matches!(s.nnodes, NodeCount::Fixed(_))
                && Some(s.lost_rank) != s.rdzv_host_rank
        }) {
            let d = decide(&s);
            assert!(!kills(d.action), "{s:?} → {d:?}");
        }
    }

    #[test]
    fn table() {
        let confirmed = |mut s: Situation| {
            s.confirmation = Some(Confirmation::Outage);
            s
        };
        // Rendezvous host lost, confirmed, no replacement yet: free the GPUs.
        let s = confirmed(base(PeerLossAction::Auto, NodeCount::Fixed(2), 0));
        let d = decide(&s);
        assert_eq!(d.action, Action::StopWorkers);
        assert!(d.waiting_for.is_some_and(|w| w.contains("replacement")));
        // ... then wait for the replacement ...
        let s = Situation {
            stopped: Stopped::Workers,
            since_confirmed: Duration::from_secs(5),
            ..s
        };
        assert_eq!(decide(&s).action, Action::Wait);
        // ... report once when none came ...
        let late = Situation {
            since_confirmed: Duration::from_secs(600),
            ..s.clone()
        };
        assert_eq!(decide(&late).action, Action::ReportNoReplacement);
        let reported = Situation {
            no_replacement_reported: true,
            ..late
        };
        assert_eq!(decide(&reported).action, Action::Wait);
        // ... and restart the agent once it is there, even late.
        let there = Situation {
            replacement_ready: true,
            ..reported
        };
        assert_eq!(decide(&there).action, Action::KillAgent);
        // The replacement answers, but the name still also leads to the lost
        // pod: free the GPUs and wait, saying for what; never restart the
        // agent into the dead address.
        let mut s = base(PeerLossAction::Auto, NodeCount::Fixed(2), 0);
        s.confirmation = Some(Confirmation::ReplacementAnswered);
        s.name_leads_to_lost = Some([10, 0, 0, 9].into());
        let d = decide(&s);
        assert_eq!(d.action, Action::StopWorkers);
        assert!(
            d.waiting_for
                .as_deref()
                .is_some_and(|w| w.contains("to stop leading to the lost pod's address 10.0.0.9")),
            "{d:?}"
        );
        s.stopped = Stopped::Workers;
        assert_eq!(decide(&s).action, Action::Wait);
        s.since_confirmed = Duration::from_secs(600);
        let d = decide(&s);
        assert_eq!(d.action, Action::ReportNoReplacement);
        assert!(
            d.why
                .contains("still leads to the lost pod's address 10.0.0.9"),
            "{d:?}"
        );
        // Up and named, its store not listening yet: wait, saying for what.
        let mut s = base(PeerLossAction::Auto, NodeCount::Fixed(2), 0);
        s.confirmation = Some(Confirmation::ReplacementAnswered);
        s.stopped = Stopped::Workers;
        s.store_closed = Some(([10, 0, 0, 5], 29500).into());
        let d = decide(&s);
        assert_eq!(d.action, Action::Wait);
        assert!(
            d.waiting_for
                .as_deref()
                .is_some_and(|w| w.contains("to accept connections at 10.0.0.5:29500")),
            "{d:?}"
        );
        // A replacement that answers confirms and is there at once: one step.
        let mut s = base(PeerLossAction::Auto, NodeCount::Fixed(2), 0);
        s.confirmation = Some(Confirmation::ReplacementAnswered);
        s.replacement_ready = true;
        assert_eq!(decide(&s).action, Action::KillAgent);
        // Elastic 2:3 loses rank 2, two survivors: shrink.
        let s = confirmed(base(
            PeerLossAction::Auto,
            NodeCount::Elastic { min: 2, max: 3 },
            2,
        ));
        assert_eq!(s.survivors, 2);
        assert_eq!(decide(&s).action, Action::StopWorkers);
        // One survivor is below the minimum: hands off.
        let below = Situation { survivors: 1, ..s };
        assert_eq!(decide(&below).action, Action::Done);
        // An external store (etcd-v2): losing rank 0 is like any other rank.
        let mut s = confirmed(base(PeerLossAction::Auto, NodeCount::Fixed(2), 0));
        s.rdzv_host_rank = None;
        assert_eq!(decide(&s).action, Action::Done);
        // Forced modes act on confirmation only.
        let s = base(PeerLossAction::RestartAgent, NodeCount::Fixed(2), 1);
        assert_eq!(decide(&s).action, Action::Wait);
        assert_eq!(decide(&confirmed(s)).action, Action::KillAgent);
        let s = confirmed(base(PeerLossAction::RestartWorkers, NodeCount::Fixed(2), 1));
        assert_eq!(decide(&s).action, Action::StopWorkers);
    }

    #[test]
    fn kubernetes_reasons_that_confirm() {
        assert_eq!(Confirmation::from_kubernetes(LossReason::NotReady), None);
        assert_eq!(
            Confirmation::from_kubernetes(LossReason::MissedHeartbeats),
            None
        );
        for r in [
            LossReason::Deleted,
            LossReason::Failed,
            LossReason::IdentityChanged,
            LossReason::ContainerRestarted,
            LossReason::NodeUnreachable,
            LossReason::Disrupted,
            LossReason::StuckTerminating,
        ] {
            assert_eq!(
                Confirmation::from_kubernetes(r),
                Some(Confirmation::Kubernetes(r))
            );
        }
    }
}
