//! The response to a lost peer: a pure decision ([`crate::decide`]) per loss
//! *episode*, and an executor that carries it out off the runtime thread
//! (the `/proc` scan and the signals run on a thread of their own, never
//! queued behind name lookups or anything else, with a time limit), guards
//! against restart storms, and records what happened (log, metrics, status,
//! Event) from the action's real outcome: a step whose signals did not
//! arrive is not done, and is retried with a back-off.
//!
//! An episode opens when the peers' state machine reports a loss (missed
//! beats: the peer is *suspect*; reported, never acted on), gets confirmed
//! by Kubernetes, by a different pod answering at the peer's name, or by an
//! outage longer than `TRAINWIRE_CONFIRM_AFTER`, and closes when the peer
//! answers again as itself (a blip) or when nothing more is to be done.
//!
//! This module keeps the episodes by rank and feeds them what is observed;
//! [`episode`] is an episode's state and the pure checks on a replacement,
//! `policy` what [`crate::decide`] is asked and when a step counts as done,
//! `effects` the execution of a step and its record.

mod effects;
pub mod episode;
mod policy;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::NodeCount;
use crate::decide::{self, Action, Confirmation};
use crate::dns::Resolver;
use crate::events::EventSink;
use crate::peers::{Evidence, Identity, Loss, LossReason, Observation, Peers, Source};
use crate::rendezvous;
use crate::signal::{self, Outcome, Stopped};
use crate::status::{ConfirmLabels, LossLabels, Shared, SourceLabels};

pub use effects::EXECUTE_TIMEOUT;
use effects::{Effects, Executed};
use episode::name_leads_to_lost;
pub use episode::{Episode, replacement_is_there};
pub use policy::{MAX_ATTEMPTS, retry_after};

/// Time limit of one lookup of a peer's name.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Time limit of one connection attempt to a replacement's rendezvous store.
pub const STORE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether something accepts TCP connections at `addr` now (the connection
/// is closed at once; torchrun's store takes that as a client gone).
async fn accepts(addr: std::net::SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(STORE_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// Acts on losses: one episode per lost rank.
pub struct Responder {
    shared: Arc<Shared>,
    events: EventSink,
    episodes: BTreeMap<u32, Episode>,
    /// Whether heartbeats run: then only a heartbeat answer proves that the
    /// replacement answers at the peer's name.
    heartbeats: bool,
    names: Resolver,
    /// What carries the steps out and records them.
    effects: Effects,
    /// The trainer's rendezvous handler, told of each confirmed loss.
    handler: Option<rendezvous::Channel>,
}

impl Responder {
    pub fn new(shared: Arc<Shared>, events: EventSink, heartbeats: bool, names: Resolver) -> Self {
        let handler = shared
            .config
            .rendezvous_dir
            .as_deref()
            .map(rendezvous::Channel::new);
        Responder {
            effects: Effects::new(shared.clone(), events.clone()),
            events,
            shared,
            episodes: BTreeMap::new(),
            heartbeats,
            names,
            handler,
        }
    }

    /// The open episodes (for tests and status).
    pub fn episodes(&self) -> impl Iterator<Item = &Episode> {
        self.episodes.values()
    }

    /// A loss decided by the peers' state machine opens an episode.
    pub async fn on_loss(&mut self, loss: &Loss, peers: &Peers) {
        let metrics = &self.shared.metrics;
        metrics
            .peers_lost
            .get_or_create(&LossLabels {
                source: loss.source.as_str().into(),
                reason: loss.reason.as_str().into(),
            })
            .inc();
        let latency = loss.detection_latency();
        metrics
            .detection_latency
            .get_or_create(&SourceLabels {
                source: loss.source.as_str().into(),
            })
            .observe(latency.as_secs_f64());
        let now = Instant::now();
        let loss_ticks = signal::uptime_ticks(&self.effects.proc_root).map(|t| {
            let ago = now.saturating_duration_since(loss.seen_at);
            t.saturating_sub((ago.as_secs_f64() * signal::TICKS_PER_SECOND as f64) as u64)
        });
        let wall_of = |at: Instant| {
            SystemTime::now()
                .checked_sub(now.saturating_duration_since(at))
                .unwrap_or_else(SystemTime::now)
        };
        let wall = wall_of(loss.seen_at);
        // A lost identity already replaced (the replacement answered first).
        let confirmation = match (loss.source, loss.reason) {
            (Source::Heartbeat, LossReason::IdentityChanged) => {
                Some(Confirmation::ReplacementAnswered)
            }
            (Source::Kubernetes, reason) => Confirmation::from_kubernetes(reason),
            _ => None,
        };
        // The new pod, when the loss is its appearance: answering heartbeats
        // (up), or, without heartbeats, seen by the Kubernetes watch (it
        // must be Ready). A restarted container is the same pod at the same
        // address, back at once. Either way the rank's name must lead to it
        // and no longer to the lost pod, and a rendezvous host's store must
        // accept connections (see `check_replacement`).
        let replacement = match loss.reason {
            LossReason::IdentityChanged if loss.source == Source::Heartbeat || !self.heartbeats => {
                peers
                    .get(loss.rank)
                    .and_then(|p| p.identity.clone())
                    .map(|new| Identity {
                        ready: new.ready || loss.source == Source::Heartbeat,
                        ..new
                    })
            }
            LossReason::ContainerRestarted => loss.identity.clone().map(|same| Identity {
                ready: true,
                ..same
            }),
            _ => None,
        };
        tracing::warn!(
            generation = loss.generation,
            rank = loss.rank,
            source = loss.source.as_str(),
            reason = loss.reason.as_str(),
            latency_ms = latency.as_millis() as u64,
            confirmed = confirmation.map(|c| c.as_str()),
            "peer lost: {}",
            loss.detail
        );
        let ep = Episode {
            generation: loss.generation,
            rank: loss.rank,
            source: loss.source,
            reason: loss.reason,
            detail: loss.detail.clone(),
            identity: loss.identity.clone(),
            suspected_at: loss.seen_at,
            suspected_wall: wall,
            observable_wall: wall_of(loss.observable_at),
            last_answer_wall: match loss.source {
                Source::Heartbeat => loss.last_answer.map(wall_of),
                Source::Kubernetes => None,
            },
            // For heartbeats the outage runs from the last answer (the
            // watch may have shown the pod healthy since).
            last_good: match loss.source {
                Source::Heartbeat => loss.last_answer.or(loss.last_good),
                Source::Kubernetes => loss.last_good,
            },
            observable_at: loss.observable_at,
            confirmation: None,
            confirmed_at: None,
            confirmed_wall: None,
            replacement_ready: false,
            replacement,
            name_leads_to_lost: None,
            stale_name_reported: false,
            store_closed: None,
            name_error: None,
            stopped: Stopped::None,
            delivered: Vec::new(),
            failed_attempts: 0,
            retry_at: None,
            last_failure: None,
            no_replacement_reported: false,
            admitted: false,
            closed: None,
            waiting_for: None,
            decision: String::new(),
            loss_ticks,
        };
        self.episodes.insert(loss.rank, ep);
        if let Some(c) = confirmation {
            self.confirm(loss.rank, c, now);
        }
        // An outage already long enough confirms at once, not at the next
        // tick.
        self.confirm_outage(loss.rank, now);
        self.check_replacement(loss.rank).await;
        // An elastic world's decision counts the survivors: the peers this
        // sidecar does not watch by the controllers' view, read now.
        if matches!(self.shared.config.nnodes, NodeCount::Elastic { .. })
            && let Some(reader) = self.shared.world_reader()
        {
            reader
                .refresh(Duration::ZERO, crate::world::DECISION_WAIT)
                .await;
        }
        self.step(loss.rank, peers).await;
    }

    /// Any observation may confirm, heal or complete an open episode.
    pub async fn on_observation(&mut self, obs: &Observation, peers: &Peers) {
        let Some(ep) = self.episodes.get_mut(&obs.rank) else {
            return;
        };
        if ep.closed.is_some() {
            return;
        }
        let now = obs.at;
        let mut confirm = None;
        match &obs.evidence {
            Evidence::Lost(reason, _) if obs.source == Source::Kubernetes => {
                confirm = Confirmation::from_kubernetes(*reason);
                if *reason == LossReason::ContainerRestarted && ep.replacement.is_none() {
                    // The same pod, its trainer restarted: back at its
                    // address once its name and (for the rendezvous host)
                    // its store answer.
                    ep.replacement = peers
                        .get(obs.rank)
                        .and_then(|p| p.identity.clone())
                        .or_else(|| ep.identity.clone())
                        .map(|same| Identity {
                            ready: true,
                            ..same
                        });
                }
            }
            Evidence::Alive(identity) => {
                let same = ep.identity.as_ref().is_none_or(|old| old.same_as(identity));
                if same {
                    if obs.source == ep.source && ep.confirmation.is_none() {
                        // The peer answers again as itself: a blip, survived.
                        ep.closed = Some(format!(
                            "rank {} answers again as the same pod: an outage of {:.1}s that training rides out; nothing was touched",
                            ep.rank,
                            now.saturating_duration_since(ep.outage_start())
                                .as_secs_f64()
                        ));
                        tracing::info!(
                            rank = ep.rank,
                            generation = ep.generation,
                            "peer back: {}",
                            ep.closed.as_deref().unwrap_or_default()
                        );
                    } else if obs.source == Source::Heartbeat
                        && ep.confirmation == Some(Confirmation::Outage)
                        && ep.stopped < Stopped::Trainer
                    {
                        // Back after a long outage: its store and agent are
                        // the same; torchrun re-rendezvous with it.
                        ep.closed = Some(format!(
                            "rank {} answers again as the same pod after the outage",
                            ep.rank
                        ));
                        tracing::info!(
                            rank = ep.rank,
                            generation = ep.generation,
                            "peer back: {}",
                            ep.closed.as_deref().unwrap_or_default()
                        );
                    }
                } else {
                    confirm = Some(match obs.source {
                        Source::Heartbeat => Confirmation::ReplacementAnswered,
                        Source::Kubernetes => Confirmation::Kubernetes(LossReason::IdentityChanged),
                    });
                    if obs.source == Source::Heartbeat {
                        // It answers: it is up.
                        ep.replacement = Some(Identity {
                            ready: true,
                            ..identity.clone()
                        });
                    } else if !self.heartbeats {
                        ep.replacement = Some(identity.clone());
                    }
                }
            }
            _ => {}
        }
        if let Some(c) = confirm {
            self.confirm(obs.rank, c, now);
        }
        self.check_replacement(obs.rank).await;
        self.step(obs.rank, peers).await;
    }

    /// Time passes: an outage may now confirm; a wait may run out.
    pub async fn tick(&mut self, now: Instant, peers: &Peers) {
        let ranks: Vec<u32> = self.episodes.keys().copied().collect();
        for rank in ranks {
            let Some(ep) = self.episodes.get(&rank) else {
                continue;
            };
            if ep.closed.is_some() {
                continue;
            }
            self.confirm_outage(rank, now);
            self.check_replacement(rank).await;
            self.step(rank, peers).await;
        }
    }

    /// Whether the new pod seen for `rank` (or the same pod, its container
    /// restarted) is there for a restarted torchrun to reach, once it is up,
    /// by resolving the rank's name (at most [`RESOLVE_TIMEOUT`] per try, on
    /// the runtime, retried each tick).
    async fn check_replacement(&mut self, rank: u32) {
        let Some(ep) = self.episodes.get(&rank) else {
            return;
        };
        let Some(new) = ep.replacement.clone() else {
            return;
        };
        if ep.replacement_ready || ep.closed.is_some() || !new.ready {
            return;
        }
        let lost = ep.identity.as_ref().and_then(|i| i.address);
        let host = self.shared.config.heartbeat.host_of(rank);
        let (resolved, name_error) = match &host {
            Some(host) => match self.names.lookup(host).await {
                Ok(addrs) => (Some(addrs), None),
                Err(e) => (Some(Vec::new()), Some(e.to_string())),
            },
            None => (None, None),
        };
        let mut there = replacement_is_there(&new, host.is_some(), resolved.as_deref(), lost);
        let stale = resolved
            .as_deref()
            .and_then(|addrs| name_leads_to_lost(&new, addrs, lost));
        // The rendezvous host's replacement must also run its store: its
        // sidecar starts first and answers while a large trainer image may
        // still be pulling, and a torchrun restarted before the store
        // listens waits for it for at most its read_timeout, then exits.
        let store = match (there, self.shared.config.rdzv_port) {
            (true, Some(port)) if Some(rank) == self.shared.config.rdzv_host_rank => new
                .address
                .or_else(|| resolved.as_deref().and_then(|a| a.first().copied()))
                .map(|ip| std::net::SocketAddr::new(ip, port)),
            _ => None,
        };
        let mut store_closed = None;
        if let Some(store) = store
            && !accepts(store).await
        {
            there = false;
            store_closed = Some(store);
        }
        let Some(ep) = self.episodes.get_mut(&rank) else {
            return;
        };
        ep.name_leads_to_lost = stale;
        if name_error.is_some() && ep.name_error.is_none() {
            tracing::warn!(
                rank,
                pod = %new.pod,
                "{}: the agent is restarted once it leads to the pod",
                name_error.as_deref().unwrap_or_default()
            );
        }
        ep.name_error = name_error;
        if store_closed.is_some() && ep.store_closed.is_none() {
            tracing::info!(
                rank,
                pod = %new.pod,
                store = ?store_closed,
                "the rendezvous host's pod is up (replaced, or its trainer restarted), but its rendezvous store does not accept connections yet: the agent is restarted once it does"
            );
        }
        ep.store_closed = store_closed;
        if let Some(old) = stale
            && !ep.stale_name_reported
        {
            ep.stale_name_reported = true;
            let note = format!(
                "the replacement of rank {rank} ({}) is up, but the rank's name still leads to the lost pod's address {old} too (resolved: {}); a torchrun restarted now could connect to the dead address, so the agent is restarted once the name no longer does. The lost pod is still published (a Terminating pod of a Service with publishNotReadyAddresses): deleting it, or the policy's nodeFailure reclaim, ends the wait",
                new.pod,
                resolved
                    .iter()
                    .flatten()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            tracing::warn!(rank, lost = %old, "{note}");
            self.events
                .publish(true, "NameLeadsToLostPod", "wait", note);
        }
        if there {
            tracing::info!(
                rank,
                pod = %new.pod,
                address = ?new.address,
                "the replacement is up and the rank's name leads to it"
            );
            ep.replacement_ready = true;
        }
    }

    /// When the next heartbeat loss is due to be confirmed by its outage
    /// (the earliest open, unconfirmed heartbeat episode's last answer plus
    /// its confirmation outage): the coordinator wakes up then, not a tick
    /// later. `None` when no such episode is open.
    pub fn next_confirmation(&self) -> Option<Instant> {
        self.episodes
            .iter()
            .filter(|(_, ep)| {
                ep.confirmation.is_none() && ep.closed.is_none() && ep.source == Source::Heartbeat
            })
            .map(|(&rank, ep)| ep.outage_start() + self.shared.config.confirm_after_for(rank))
            .min()
    }

    /// Confirms `rank`'s loss seen by heartbeats once its outage (from the
    /// last answer) reaches `TRAINWIRE_CONFIRM_AFTER` for it: longer than
    /// training itself rides out. The Kubernetes watch may still show the
    /// pod Ready meanwhile (a partition, a dead node within the node
    /// controller's grace): that is no answer.
    fn confirm_outage(&mut self, rank: u32, now: Instant) {
        let Some(ep) = self.episodes.get(&rank) else {
            return;
        };
        if ep.confirmation.is_none() && ep.closed.is_none() && ep.source == Source::Heartbeat {
            let limit = self.shared.config.confirm_after_for(rank);
            if now.saturating_duration_since(ep.outage_start()) >= limit {
                self.confirm(rank, Confirmation::Outage, now);
            }
        }
    }

    fn confirm(&mut self, rank: u32, c: Confirmation, now: Instant) {
        let Some(ep) = self.episodes.get_mut(&rank) else {
            return;
        };
        if ep.confirmation.is_some() || ep.closed.is_some() {
            return;
        }
        ep.confirmation = Some(c);
        ep.confirmed_at = Some(now);
        let wall = SystemTime::now();
        ep.confirmed_wall = Some(wall);
        // torch hears it at once: the trainer's handler evicts the lost
        // pod's agent (unless it beat since) and restarts its workers.
        if let (Some(handler), true) = (&self.handler, handler_hears(&self.shared.config, rank, c))
        {
            handler.tell_in_background(rendezvous::LossEntry::new(rank, ep.generation, wall));
        }
        self.shared
            .metrics
            .losses_confirmed
            .get_or_create(&ConfirmLabels {
                confirmation: c.as_str().into(),
            })
            .inc();
        let outage = now.saturating_duration_since(ep.outage_start());
        tracing::warn!(
            rank,
            generation = ep.generation,
            confirmation = c.as_str(),
            outage_ms = outage.as_millis() as u64,
            "peer loss confirmed"
        );
    }

    /// Decide and carry out the next steps of `rank`'s episode.
    async fn step(&mut self, rank: u32, peers: &Peers) {
        // At most two steps per call (stop the workers, then the agent).
        for _ in 0..3 {
            let Some(ep) = self.episodes.get(&rank) else {
                return;
            };
            if ep.closed.is_some() {
                break;
            }
            let now = Instant::now();
            let seen = matches!(self.shared.config.nnodes, NodeCount::Elastic { .. })
                .then(|| self.shared.world_reader().map(|r| r.seen()))
                .flatten();
            let view = seen.as_ref().and_then(|s| s.fresh_since(ep.suspected_at));
            let situation = policy::situation(ep, &self.shared.config, peers, view, now);
            let d = decide::decide(&situation);
            let changed = ep.decision != d.why || ep.waiting_for != d.waiting_for;
            if let Some(ep) = self.episodes.get_mut(&rank) {
                ep.decision = d.why.clone();
                ep.waiting_for = d.waiting_for.clone();
            }
            match d.action {
                Action::Wait => {
                    if changed {
                        tracing::info!(rank, waiting_for = d.waiting_for.as_deref(), "{}", d.why);
                        self.publish(rank);
                    }
                    break;
                }
                Action::Done => {
                    if let Some(ep) = self.episodes.get_mut(&rank) {
                        ep.closed = Some(d.why.clone());
                        if ep.stopped == Stopped::None {
                            self.effects.record(
                                ep,
                                d.action.plan(),
                                Executed {
                                    outcome: Outcome::Reported,
                                    signals: Vec::new(),
                                    detail: d.why.clone(),
                                    unsent: None,
                                },
                            );
                        }
                    }
                    self.publish(rank);
                    break;
                }
                Action::ReportNoReplacement => {
                    if let Some(ep) = self.episodes.get_mut(&rank) {
                        ep.no_replacement_reported = true;
                    }
                    tracing::warn!(rank, "{}", d.why);
                    self.events
                        .publish(true, "NoReplacement", "report", d.why.clone());
                    self.publish(rank);
                }
                Action::StopWorkers | Action::KillAgent => {
                    let plan = d.action.plan();
                    let Some(ep) = self.episodes.get_mut(&rank) else {
                        return;
                    };
                    // A step that failed is tried again after its back-off.
                    if let Some(waiting) = policy::retry_wait(ep, plan, now) {
                        ep.waiting_for = Some(waiting);
                        if changed {
                            self.publish(rank);
                        }
                        break;
                    }
                    let done = self.effects.act(ep, plan, &d.why).await;
                    self.publish(rank);
                    if !done {
                        break;
                    }
                }
            }
        }
    }

    /// `rank`'s episode as the last loss in `/status`.
    fn publish(&self, rank: u32) {
        if let Some(ep) = self.episodes.get(&rank) {
            self.effects.publish(ep);
        }
    }
}

/// Whether the trainer's rendezvous handler is told of `rank`'s loss: not
/// of the pod that ran the rendezvous store (pod 0 without a dedicated
/// store), whose state went with it (the survivors' agents are restarted
/// against the replacement's store instead); not when the loss was
/// confirmed by the replacement answering, whose agent may have joined
/// before that confirmation and would be evicted in the lost node's place
/// (the lost node's keep-alive has expired by then: torch dropped it).
fn handler_hears(config: &crate::config::Config, rank: u32, c: Confirmation) -> bool {
    Some(rank) != config.rdzv_host_rank && c != Confirmation::ReplacementAnswered
}

#[cfg(test)]
mod tests {
    use super::episode::tests::pod;
    use super::*;
    use crate::config::Config;
    use crate::peers::State;
    use crate::signal::{Role, Sent};
    use effects::Executor;
    use std::net::IpAddr;

    /// Rank 1 of 2, `auto`, rank 0 the rendezvous host at `peer_hosts`,
    /// detected by `detection` (with `more`); no agent to signal.
    fn host_loss_config(peer_hosts: &str, detection: &str, more: &[(&str, &str)]) -> Config {
        use crate::env;
        let mut vars = vec![
            (env::NNODES, "2"),
            (env::NODE_RANK, "1"),
            (env::PEER_HOSTS, peer_hosts),
            (env::RDZV_HOST_RANK, "0"),
            (env::ON_PEER_LOSS, "auto"),
            (env::DETECTION, detection),
            // Matches no process on this machine: nothing is signalled.
            (env::AGENT_MATCH, "trainwire_agent=no-such-agent-7f3a9c"),
        ];
        vars.extend_from_slice(more);
        Config::from_source(vars.as_slice()).expect("config")
    }

    /// One observation of rank 0 from `source`, through the peers' state
    /// machine to the responder.
    async fn feed(
        peers: &mut Peers,
        responder: &mut Responder,
        source: Source,
        evidence: Evidence,
    ) {
        let obs = Observation {
            rank: 0,
            source,
            evidence,
            at: Instant::now(),
        };
        match peers.observe(obs.clone()) {
            Some(loss) => responder.on_loss(&loss, peers).await,
            None => responder.on_observation(&obs, peers).await,
        }
    }

    /// Rank 0's episode: (confirmed, replacement ready, what is stopped).
    fn host_episode(r: &Responder) -> Option<(bool, bool, Stopped)> {
        r.episodes()
            .find(|e| e.rank == 0)
            .map(|e| (e.confirmation.is_some(), e.replacement_ready, e.stopped))
    }

    /// A heartbeat answer of pod `uid` from `from`.
    fn beat(uid: &str, from: IpAddr) -> Identity {
        Identity {
            uid: uid.into(),
            address: Some(from),
            ..Identity::default()
        }
    }

    /// A survivor on heartbeats that looks names up in `table`, whose rank
    /// 0 answered once from `dead`, then missed three beats: lost, not yet
    /// confirmed.
    async fn lost_host_on_heartbeats(
        config: &Config,
        names: &Resolver,
        dead: IpAddr,
    ) -> (Responder, Peers) {
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(shared, EventSink::disabled(), true, names.clone());
        let mut peers = Peers::new(config.nnodes, 1, 3, Instant::now());
        let evidence = std::iter::once(Evidence::Alive(beat("old", dead)))
            .chain((0..3).map(|_| Evidence::Missed("no answer".into())));
        for e in evidence {
            feed(&mut peers, &mut responder, Source::Heartbeat, e).await;
        }
        (responder, peers)
    }

    /// A confirmed loss is handed to the trainer's rendezvous handler,
    /// unless the lost pod ran the store (pod 0 without a dedicated store).
    #[test]
    fn the_handler_hears_a_loss_unless_the_store_went_with_it() {
        use crate::env;
        let outage = Confirmation::Outage;
        let replaced = Confirmation::ReplacementAnswered;
        for (host, rank, c, told) in [
            ("0", 0, outage, false),
            ("0", 1, outage, true),
            ("none", 0, outage, true),
            ("0", 1, replaced, false),
            ("none", 0, replaced, false),
        ] {
            let config = host_loss_config(
                "train-{i}.train",
                "heartbeat",
                &[(env::RDZV_HOST_RANK, host)],
            );
            assert_eq!(
                handler_hears(&config, rank, c),
                told,
                "store host {host}, rank {rank} lost, {c:?}"
            );
        }
    }

    /// The default on a real node: `auto` runs the Kubernetes watch and
    /// heartbeats, a world of 2 with a hot spare and its store outside the
    /// world. Rank 0's network is cut: its pod object stays as it was (the
    /// watch keeps saying Ready), its heartbeats stop. After the misses the
    /// loss is confirmed by the outage (torchrun's keep-alive window: the
    /// spare takes its place) and recorded at once, dated at the first
    /// missed beat, with the last answer before it and its source; the
    /// watch's Ready changes nothing, and a deletion later is no new loss.
    #[tokio::test]
    async fn a_silent_loss_is_recorded_while_the_watch_still_shows_the_pod_ready() {
        use crate::env;
        let config = host_loss_config(
            "train-{i}.train",
            "both",
            &[
                (env::SPARES, "1"),
                (env::RDZV_HOST_RANK, "none"),
                (env::SELECTOR, "app=train"),
            ],
        );
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(
            shared.clone(),
            EventSink::disabled(),
            true,
            Resolver::table(Default::default()),
        );
        let mut peers = Peers::with_spares(config.nnodes, 1, 1, 3, Instant::now());
        let t0 = Instant::now() - Duration::from_millis(3500);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let ready = Identity {
            uid: "pod0".into(),
            ready: true,
            ..Identity::default()
        };
        let answer = Identity {
            uid: "pod0".into(),
            start_time: "sidecar-start".into(),
            ..Identity::default()
        };
        let mut observe = async |source, evidence, ms| {
            let obs = Observation {
                rank: 0,
                source,
                evidence,
                at: at(ms),
            };
            match peers.observe(obs.clone()) {
                Some(loss) => responder.on_loss(&loss, &peers).await,
                None => responder.on_observation(&obs, &peers).await,
            }
        };
        observe(Source::Kubernetes, Evidence::Alive(ready.clone()), 0).await;
        observe(Source::Heartbeat, Evidence::Alive(answer), 0).await;
        // The cut: no answer in three intervals, the watch unchanged.
        for ms in [1000, 2000] {
            observe(Source::Heartbeat, Evidence::Missed("no answer".into()), ms).await;
            observe(Source::Kubernetes, Evidence::Alive(ready.clone()), ms).await;
        }
        observe(
            Source::Heartbeat,
            Evidence::Missed("no answer".into()),
            3000,
        )
        .await;
        {
            let status = shared.status();
            let last = status.last_loss.as_ref().expect("a loss");
            assert_eq!(last.lost_by, "heartbeat");
            assert_eq!(last.reason, "missed-heartbeats");
            assert_eq!(last.state, "closed", "{last:?}");
            assert!(
                matches!(last.confirmed_by, Some(Confirmation::Outage)),
                "{last:?}"
            );
            let time = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().expect("a time");
            let first_miss = time(&last.suspected_at);
            let last_answer = time(last.last_answer_at.as_deref().expect("the last answer"));
            let decided = time(&last.detected_at);
            let gap = |a: k8s_openapi::jiff::Timestamp, b: k8s_openapi::jiff::Timestamp| {
                b.as_millisecond() - a.as_millisecond()
            };
            assert!(
                (900..=1100).contains(&gap(last_answer, first_miss)),
                "{last:?}"
            );
            assert!(
                (1900..=2100).contains(&gap(first_miss, decided)),
                "{last:?}"
            );
            let action = status.last_action.as_ref().expect("recorded");
            assert_eq!((action.action, action.result), ("report-only", "reported"));
            assert_eq!(action.lost_by, "heartbeat");
        }
        let metrics = shared.encode_metrics();
        for series in [
            r#"trainwire_sidecar_peers_lost_total{source="heartbeat",reason="missed-heartbeats"} 1"#,
            r#"trainwire_sidecar_losses_confirmed_total{confirmation="outage"} 1"#,
            r#"trainwire_sidecar_actions_total{action="report-only",result="reported"} 1"#,
        ] {
            assert!(metrics.lines().any(|l| l == series), "{series}:\n{metrics}");
        }
        // The watch still says Ready, then the pod is deleted: the same
        // loss, no second one.
        observe(Source::Kubernetes, Evidence::Alive(ready.clone()), 3400).await;
        observe(
            Source::Kubernetes,
            Evidence::Lost(LossReason::Deleted, "pod train-0 was deleted".into()),
            3450,
        )
        .await;
        assert_eq!(peers.generation(), 1);
        assert_eq!(peers.get(0).map(|p| p.state), Some(State::Lost));
        assert_eq!(shared.status().actions_total, 0, "nothing signalled");
    }

    /// A blip shorter than the confirmation is reported suspect and closes
    /// when the peer answers again: nothing recorded as an action.
    #[tokio::test]
    async fn a_blip_with_spares_is_not_recorded() {
        use crate::env;
        let config = host_loss_config(
            "train-{i}.train",
            "heartbeat",
            &[(env::SPARES, "1"), (env::RDZV_HOST_RANK, "none")],
        );
        // 3 misses of 500 ms: lost after 1.5 s (the peers' count),
        // confirmed only at 2 s (never before interval × the 4 misses the
        // configuration counts, above the 1 s window).
        let config = Config {
            heartbeat: crate::config::HeartbeatConfig {
                interval: Duration::from_millis(500),
                ..config.heartbeat.clone()
            },
            ..config
        };
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(
            shared.clone(),
            EventSink::disabled(),
            true,
            Resolver::table(Default::default()),
        );
        let mut peers = Peers::with_spares(config.nnodes, 1, 1, 3, Instant::now());
        let t0 = Instant::now() - Duration::from_millis(1600);
        let answer = Identity {
            uid: "pod0".into(),
            ..Identity::default()
        };
        let evidence = [
            (Evidence::Alive(answer.clone()), 0),
            (Evidence::Missed("no answer".into()), 500),
            (Evidence::Missed("no answer".into()), 1000),
            (Evidence::Missed("no answer".into()), 1500),
        ];
        for (evidence, ms) in evidence {
            let obs = Observation {
                rank: 0,
                source: Source::Heartbeat,
                evidence,
                at: t0 + Duration::from_millis(ms),
            };
            match peers.observe(obs.clone()) {
                Some(loss) => responder.on_loss(&loss, &peers).await,
                None => responder.on_observation(&obs, &peers).await,
            }
        }
        assert_eq!(
            shared.status().last_loss.as_ref().map(|l| l.state),
            Some("suspect")
        );
        let back = Observation {
            rank: 0,
            source: Source::Heartbeat,
            evidence: Evidence::Alive(answer),
            at: Instant::now(),
        };
        assert!(peers.observe(back.clone()).is_none());
        responder.on_observation(&back, &peers).await;
        responder
            .tick(Instant::now() + Duration::from_secs(5), &peers)
            .await;
        let status = shared.status();
        assert!(status.last_action.is_none(), "{:?}", status.last_action);
    }

    /// With the default window (1 s) and hot spares, a silent non-host
    /// peer is suspect after four missed 200 ms beats, and its confirmation
    /// is due exactly one window after its last answer: the coordinator
    /// wakes up then ([`Responder::next_confirmation`]), and not before.
    #[tokio::test]
    async fn a_silent_loss_is_due_for_confirmation_one_window_after_the_last_answer() {
        use crate::env;
        let config = host_loss_config(
            "train-{i}.train",
            "heartbeat",
            &[(env::SPARES, "1"), (env::RDZV_HOST_RANK, "none")],
        );
        assert_eq!(config.heartbeat.interval, Duration::from_millis(200));
        assert_eq!(config.heartbeat.misses, 4);
        assert_eq!(config.confirm_after_for(0), Duration::from_secs(1));
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(
            shared.clone(),
            EventSink::disabled(),
            true,
            Resolver::table(Default::default()),
        );
        let mut peers = Peers::with_spares(config.nnodes, 1, 1, 4, Instant::now());
        assert_eq!(responder.next_confirmation(), None);
        // The last answer 850 ms ago, then four missed beats.
        let t0 = Instant::now() - Duration::from_millis(850);
        let answer = Identity {
            uid: "pod0".into(),
            ..Identity::default()
        };
        let mut evidence = vec![(Evidence::Alive(answer), 0)];
        for ms in [200, 400, 600, 800] {
            evidence.push((Evidence::Missed("no answer".into()), ms));
        }
        for (evidence, ms) in evidence {
            let obs = Observation {
                rank: 0,
                source: Source::Heartbeat,
                evidence,
                at: t0 + Duration::from_millis(ms),
            };
            match peers.observe(obs.clone()) {
                Some(loss) => responder.on_loss(&loss, &peers).await,
                None => responder.on_observation(&obs, &peers).await,
            }
        }
        let due = responder
            .next_confirmation()
            .expect("a confirmation is due");
        assert_eq!(due, t0 + Duration::from_secs(1));
        // Just before it: still suspect.
        responder.tick(due - Duration::from_millis(1), &peers).await;
        assert_eq!(
            shared.status().last_loss.as_ref().map(|l| l.state),
            Some("suspect")
        );
        // At it: confirmed, and nothing more is due.
        responder.tick(due, &peers).await;
        let status = shared.status();
        let last = status.last_loss.as_ref().expect("a loss");
        assert!(
            matches!(last.confirmed_by, Some(Confirmation::Outage)),
            "{last:?}"
        );
        assert_eq!(responder.next_confirmation(), None);
    }

    /// Kubernetes detection alone (no heartbeats), rendezvous host lost: the
    /// agent is restarted only once the new pod 0 is Ready and pod 0's name
    /// leads to its address, not when the watch first shows it.
    #[tokio::test]
    async fn without_heartbeats_the_agent_waits_for_the_name_to_lead_to_the_new_pod() {
        use crate::env;
        // Pod 0's name is 127.0.0.10: an address that "DNS" gives at once.
        let config = host_loss_config(
            "127.0.0.1{i}",
            "kubernetes",
            &[(env::SELECTOR, "app=train")],
        );
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(
            shared,
            EventSink::disabled(),
            false,
            Resolver::table(Default::default()),
        );
        let mut peers = Peers::new(config.nnodes, 1, 3, Instant::now());
        let feed = async |peers: &mut Peers, responder: &mut Responder, evidence: Evidence| {
            feed(peers, responder, Source::Kubernetes, evidence).await
        };
        let old = Identity {
            uid: "old".into(),
            ..pod(true, Some("10.9.9.9"))
        };
        feed(&mut peers, &mut responder, Evidence::Alive(old)).await;
        feed(
            &mut peers,
            &mut responder,
            Evidence::Lost(LossReason::Deleted, "pod train-0 was deleted".into()),
        )
        .await;
        // (confirmed, replacement ready, what is stopped)
        let state = host_episode;
        // Confirmed by Kubernetes: the workers are stopped, the agent waits.
        assert_eq!(state(&responder), Some((true, false, Stopped::Workers)));

        // The new pod appears, not Ready yet; then Ready while the name
        // still leads elsewhere (DNS behind); neither restarts the agent.
        for step in [pod(false, Some("127.0.0.10")), pod(true, Some("10.1.2.3"))] {
            feed(&mut peers, &mut responder, Evidence::Alive(step)).await;
            assert_eq!(state(&responder), Some((true, false, Stopped::Workers)));
        }
        // Ready at the address the name now gives.
        feed(
            &mut peers,
            &mut responder,
            Evidence::Alive(pod(true, Some("127.0.0.10"))),
        )
        .await;
        assert_eq!(state(&responder), Some((true, true, Stopped::Trainer)));
    }

    /// Heartbeats, rendezvous host lost, and a replacement that answers at
    /// pod 0's name while the name still also leads to the lost pod (an
    /// Indexed Job's old pod stays published while Terminating): the workers
    /// are stopped, /status says what is waited for, and the agent is
    /// restarted only once the name leads to the new pod alone.
    #[tokio::test]
    async fn with_heartbeats_the_agent_waits_until_the_name_no_longer_leads_to_the_lost_pod() {
        let config = host_loss_config("train-{i}.train", "heartbeat", &[]);
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let (dead, new) = (ip("10.9.9.9"), ip("10.1.2.3"));
        let table = Resolver::table(Default::default());
        let publish = |addrs: Vec<IpAddr>| table.set("train-0.train", addrs);
        publish(vec![dead]);
        let (mut responder, mut peers) = lost_host_on_heartbeats(&config, &table, dead).await;
        let feed = async |peers: &mut Peers, responder: &mut Responder, evidence: Evidence| {
            feed(peers, responder, Source::Heartbeat, evidence).await
        };
        // (confirmed, replacement ready, what is stopped)
        let state = host_episode;
        assert_eq!(state(&responder), Some((false, false, Stopped::None)));

        // The replacement answers; the name leads to it and to the dead pod.
        publish(vec![dead, new]);
        feed(
            &mut peers,
            &mut responder,
            Evidence::Alive(beat("new", new)),
        )
        .await;
        assert_eq!(state(&responder), Some((true, false, Stopped::Workers)));
        let waiting = responder
            .episodes()
            .find(|e| e.rank == 0)
            .and_then(|e| e.waiting_for.clone())
            .unwrap_or_default();
        assert!(
            waiting.contains("to stop leading to the lost pod's address 10.9.9.9"),
            "{waiting}"
        );
        let episode = |r: &Responder| r.episodes().find(|e| e.rank == 0).cloned();
        assert!(
            episode(&responder)
                .is_some_and(|e| e.stale_name_reported && e.name_leads_to_lost == Some(dead))
        );
        // Time passes, the old pod is still published: still waiting.
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(state(&responder), Some((true, false, Stopped::Workers)));

        // The old pod leaves DNS: the agent is restarted at the next look.
        publish(vec![new]);
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(state(&responder), Some((true, true, Stopped::Trainer)));
        assert!(episode(&responder).is_some_and(|e| e.name_leads_to_lost.is_none()));
    }

    /// A signal to `role` that arrived (`None`) or failed.
    fn sent(role: Role, signal: &'static str, error: Option<&str>) -> Sent {
        Sent {
            pid: 4242,
            role,
            signal,
            error: error.map(str::to_string),
        }
    }

    /// A step whose signals did not arrive is not done: `/status`, the
    /// metrics and the next decision say so, and it is tried again after
    /// its back-off until it reaches its goal (or gives up).
    #[tokio::test]
    async fn a_failed_step_is_not_shown_done_and_is_tried_again() {
        let config = host_loss_config(
            "127.0.0.1{i}",
            "kubernetes",
            &[(crate::env::SELECTOR, "app=train")],
        );
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(
            shared.clone(),
            EventSink::disabled(),
            false,
            Resolver::table(Default::default()),
        );
        responder.effects.executor = Executor::Scripted(
            [
                // The workers: the scan took too long, nothing was sent.
                Executed {
                    outcome: Outcome::Failed,
                    signals: Vec::new(),
                    detail: "scanning /proc and signalling took over 10s; nothing was sent".into(),
                    unsent: Some("timeout"),
                },
                // Again: one of two workers refused (EPERM).
                Executed {
                    outcome: Outcome::Partial,
                    signals: vec![
                        sent(Role::Worker, "SIGTERM", None),
                        sent(
                            Role::Worker,
                            "SIGTERM",
                            Some("EPERM: Operation not permitted"),
                        ),
                    ],
                    detail: "1 of 2 signals delivered".into(),
                    unsent: None,
                },
                // Then both arrive.
                Executed {
                    outcome: Outcome::Signalled,
                    signals: vec![sent(Role::Worker, "SIGTERM", None)],
                    detail: "1 of 1 signals delivered".into(),
                    unsent: None,
                },
            ]
            .into(),
        );
        let mut peers = Peers::new(config.nnodes, 1, 3, Instant::now());
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Alive(pod(true, Some("10.9.9.9"))),
        )
        .await;
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Lost(LossReason::Deleted, "pod train-0 was deleted".into()),
        )
        .await;
        let episode = |r: &Responder| r.episodes().find(|e| e.rank == 0).cloned();
        let ep = episode(&responder).expect("an episode");
        assert!(
            ep.stopped == Stopped::None && ep.failed_attempts == 1,
            "{ep:?}"
        );
        let retry = ep.retry_at.expect("a retry is planned");
        {
            let status = shared.status();
            let last = status.last_loss.as_ref().expect("last loss");
            assert!(!last.workers_stopped && !last.agent_killed);
            assert_eq!(last.failed_attempts, 1);
            assert_eq!(
                status.last_action.as_ref().map(|a| a.result),
                Some("failed")
            );
        }
        let metrics = shared.encode_metrics();
        assert!(
            metrics.contains(
                r#"trainwire_sidecar_signal_failures_total{role="worker",error="timeout"} 1"#
            ),
            "{metrics}"
        );
        // Before the back-off: nothing is tried, /status says what is waited for.
        responder.tick(Instant::now(), &peers).await;
        let ep = episode(&responder).expect("an episode");
        assert_eq!(ep.failed_attempts, 1);
        assert!(
            ep.waiting_for
                .as_deref()
                .is_some_and(|w| w.starts_with("attempt 2 of 5 of restart-workers")),
            "{:?}",
            ep.waiting_for
        );
        // After it: the partial step is not done either.
        responder
            .episodes
            .entry(0)
            .and_modify(|e| e.retry_at = Some(retry - Duration::from_secs(60)));
        responder.tick(Instant::now(), &peers).await;
        let ep = episode(&responder).expect("an episode");
        assert!(
            ep.stopped == Stopped::None && ep.failed_attempts == 2,
            "{ep:?}"
        );
        assert_eq!(
            shared.status().last_action.as_ref().map(|a| a.result),
            Some("partial")
        );
        // The third arrives: done, and /status shows what arrived.
        responder
            .episodes
            .entry(0)
            .and_modify(|e| e.retry_at = Some(Instant::now()));
        responder.tick(Instant::now(), &peers).await;
        let ep = episode(&responder).expect("an episode");
        assert!(
            ep.stopped == Stopped::Workers && ep.retry_at.is_none(),
            "{ep:?}"
        );
        let status = shared.status();
        let last = status.last_loss.as_ref().expect("last loss");
        assert!(last.workers_stopped && !last.agent_killed);
        assert_eq!(
            status.last_action.as_ref().map(|a| a.result),
            Some("signalled")
        );
    }

    /// The rendezvous host's trainer container restarts in place (same pod,
    /// same address): the survivor's agent is restarted only once pod 0's
    /// name leads to it and its new store accepts connections, never at
    /// the restart itself; and the peer is healthy again afterwards, so a
    /// later loss is a new generation that is acted on again.
    #[tokio::test]
    async fn a_restarted_host_container_is_waited_for_like_a_replacement() {
        use crate::env;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let config = host_loss_config(
            "train-{i}.train",
            "kubernetes",
            &[(env::RDZV_PORT, &port), (env::SELECTOR, "app=train")],
        );
        let names = Resolver::table(Default::default());
        let shared = Shared::new(config.clone());
        let mut responder = Responder::new(shared, EventSink::disabled(), false, names.clone());
        let mut peers = Peers::new(config.nnodes, 1, 3, Instant::now());
        let host = IpAddr::from([127, 0, 0, 1]);
        let same = Identity {
            uid: "pod0".into(),
            ..pod(true, Some("127.0.0.1"))
        };
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Alive(same.clone()),
        )
        .await;
        // The trainer restarts; the name does not resolve (no cluster DNS).
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Lost(
                LossReason::ContainerRestarted,
                "pod train-0: container trainer restarted (restartCount 0 -> 1)".into(),
            ),
        )
        .await;
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Alive(same.clone()),
        )
        .await;
        assert_eq!(peers.get(0).map(|p| p.state), Some(State::Healthy));
        // (confirmed, replacement ready, what is stopped)
        assert_eq!(
            host_episode(&responder),
            Some((true, false, Stopped::Workers))
        );
        let episode = |r: &Responder| r.episodes().find(|e| e.rank == 0).cloned();
        let waiting = episode(&responder)
            .and_then(|e| e.waiting_for)
            .unwrap_or_default();
        assert!(
            waiting.contains("name train-0.train does not resolve"),
            "{waiting}"
        );
        // The name resolves; the new torchrun's store does not listen yet.
        names.set("train-0.train", vec![host]);
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(
            host_episode(&responder),
            Some((true, false, Stopped::Workers))
        );
        assert!(episode(&responder).is_some_and(|e| e.store_closed.is_some()));
        // It listens: now the agent is restarted.
        let _store = std::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().expect("port")))
            .expect("bind the store's port");
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(
            host_episode(&responder),
            Some((true, true, Stopped::Trainer))
        );
        assert_eq!(peers.generation(), 1);
        // Lost again later (deleted): a new generation, acted on again.
        feed(
            &mut peers,
            &mut responder,
            Source::Kubernetes,
            Evidence::Lost(LossReason::Deleted, "pod train-0 was deleted".into()),
        )
        .await;
        assert_eq!(peers.generation(), 2);
        assert!(episode(&responder).is_some_and(|e| e.generation == 2));
        assert_eq!(
            host_episode(&responder),
            Some((true, false, Stopped::Workers))
        );
    }
    /// Heartbeats, rendezvous host lost, its replacement answers at pod 0's
    /// name while its trainer (torchrun, which runs the store) is not up
    /// yet: the agent is restarted only once the store accepts connections.

    #[tokio::test]
    async fn the_agent_waits_for_the_replacements_store_to_listen() {
        use crate::env;
        // A port nothing listens on, then the replacement's store on it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let config = host_loss_config("train-{i}.train", "heartbeat", &[(env::RDZV_PORT, &port)]);
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let (dead, new) = (ip("10.9.9.9"), ip("127.0.0.1"));
        let table = Resolver::table(BTreeMap::from([("train-0.train".to_string(), vec![dead])]));
        let (mut responder, mut peers) = lost_host_on_heartbeats(&config, &table, dead).await;
        let feed = async |peers: &mut Peers, responder: &mut Responder, evidence: Evidence| {
            feed(peers, responder, Source::Heartbeat, evidence).await
        };
        // The name follows the replacement, whose sidecar answers; its
        // store does not listen yet.
        table.set("train-0.train", vec![new]);
        feed(
            &mut peers,
            &mut responder,
            Evidence::Alive(beat("new", new)),
        )
        .await;
        assert_eq!(
            host_episode(&responder),
            Some((true, false, Stopped::Workers))
        );
        let episode = |r: &Responder| r.episodes().find(|e| e.rank == 0).cloned();
        let store: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        assert!(episode(&responder).is_some_and(|e| {
            e.store_closed == Some(store)
                && e.waiting_for
                    .as_deref()
                    .is_some_and(|w| w.contains("to accept connections"))
        }));
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(
            host_episode(&responder),
            Some((true, false, Stopped::Workers))
        );

        // torchrun is up in the replacement: its store listens.
        let _store = std::net::TcpListener::bind(store).expect("bind the store's port");
        responder.tick(Instant::now(), &peers).await;
        assert_eq!(
            host_episode(&responder),
            Some((true, true, Stopped::Trainer))
        );
        assert!(episode(&responder).is_some_and(|e| e.store_closed.is_none()));
    }
}
