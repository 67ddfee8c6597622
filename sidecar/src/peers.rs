//! The peers' health, as a pure state machine.
//!
//! Both detection sources (heartbeats and the Kubernetes watch) feed
//! [`Observation`]s into [`Peers::observe`]. A peer becomes `Lost` on the
//! first source that says so; each such transition opens a new loss
//! *generation*, and the caller acts at most once per generation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::config::NodeCount;

/// Which detector produced an observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Heartbeat,
    Kubernetes,
}

impl Source {
    pub const ALL: [Source; 2] = [Source::Heartbeat, Source::Kubernetes];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Heartbeat => trainwire_contract::peer_loss::LOST_BY_HEARTBEAT,
            Source::Kubernetes => trainwire_contract::peer_loss::LOST_BY_KUBERNETES,
        }
    }
}

/// Who a peer is: its pod UID and a start time. A change means the peer was
/// replaced (a new pod, or a restarted sidecar without a pod UID).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Identity {
    pub pod: String,
    pub uid: String,
    /// Start time, as the source reports it (RFC 3339).
    pub start_time: String,
    /// The pod's address: its `status.podIP` in the Kubernetes watch, the
    /// address that answered for heartbeats (`None` before the pod has one,
    /// or when the connection does not say).
    #[serde(skip)]
    pub address: Option<std::net::IpAddr>,
    /// Whether the pod is Ready, as the Kubernetes watch sees it (`false`
    /// from heartbeats: an answer is the stronger proof there).
    #[serde(skip)]
    pub ready: bool,
}

impl Identity {
    /// Whether `other` is the same pod: by UID when both have one, else by
    /// start time when both have one; with neither to compare, the same.
    /// (A sidecar restarted inside the same pod keeps its pod UID: not a loss.)
    pub fn same_as(&self, other: &Identity) -> bool {
        if !self.uid.is_empty() && !other.uid.is_empty() {
            self.uid == other.uid
        } else if !self.start_time.is_empty() && !other.start_time.is_empty() {
            self.start_time == other.start_time
        } else {
            true
        }
    }
}

/// Why a peer was declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum LossReason {
    MissedHeartbeats,
    IdentityChanged,
    Deleted,
    Failed,
    NotReady,
    ContainerRestarted,
    NodeUnreachable,
    Disrupted,
    StuckTerminating,
}

impl LossReason {
    pub const ALL: [LossReason; 9] = [
        LossReason::MissedHeartbeats,
        LossReason::IdentityChanged,
        LossReason::Deleted,
        LossReason::Failed,
        LossReason::NotReady,
        LossReason::ContainerRestarted,
        LossReason::NodeUnreachable,
        LossReason::Disrupted,
        LossReason::StuckTerminating,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::MissedHeartbeats => "missed-heartbeats",
            LossReason::IdentityChanged => "identity-changed",
            LossReason::Deleted => "deleted",
            LossReason::Failed => "failed",
            LossReason::NotReady => "not-ready",
            LossReason::ContainerRestarted => "container-restarted",
            LossReason::NodeUnreachable => "node-unreachable",
            LossReason::Disrupted => "disrupted",
            LossReason::StuckTerminating => "stuck-terminating",
        }
    }
}

/// One piece of evidence about one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// The peer answered / its pod looks healthy.
    Alive(Identity),
    /// A heartbeat probe failed (timeout, refused, DNS name not resolving).
    Missed(String),
    /// The source saw something wrong that is not yet a loss.
    Suspect(String),
    /// The source decided the peer is lost.
    Lost(LossReason, String),
}

/// An observation: evidence about `rank` from `source` at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub rank: u32,
    pub source: Source,
    pub evidence: Evidence,
    pub at: Instant,
}

/// A peer's health state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// Never seen yet (a DNS name that does not resolve yet, a pod not created yet).
    Unknown,
    /// Never seen, and its rank is above the elastic minimum: not expected to exist.
    Absent,
    /// Not watched by this sidecar (its heartbeats probe a bounded set of
    /// peers, [`crate::ring::watched`]); the peer's own watchers see its
    /// loss. Evidence about it, if any source sends some, makes it known.
    NotWatched,
    Healthy,
    /// Something is off (missed beats below the limit, not Ready within the grace).
    Suspect,
    Lost,
    /// A new identity appeared for a rank that was lost (or changed identity).
    Replaced,
}

/// What is known about one peer.
#[derive(Debug, Clone)]
pub struct Peer {
    pub rank: u32,
    pub state: State,
    pub since: Instant,
    pub since_wall: SystemTime,
    pub identity: Option<Identity>,
    pub misses: u32,
    pub last_good: Option<Instant>,
    /// The last heartbeat answer (the last good evidence of heartbeats).
    pub last_answer: Option<Instant>,
    /// When the trouble that led (or may lead) to a loss was first
    /// observable: the first missed beat, or the first watch event that
    /// showed the pod in trouble. Cleared by good evidence.
    pub trouble_since: Option<Instant>,
    pub lost_by: Option<Source>,
    pub reason: Option<LossReason>,
    pub detail: String,
}

/// A loss decided by the state machine: act on it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    pub generation: u64,
    pub rank: u32,
    pub source: Source,
    pub reason: LossReason,
    pub detail: String,
    /// The instant the loss was decided.
    pub seen_at: Instant,
    /// The last good evidence about the peer before the loss (heartbeat
    /// reply or healthy pod state); `None` if the source could not know.
    pub last_good: Option<Instant>,
    /// The last heartbeat answer before the loss, if any: for a loss
    /// heartbeats saw, the outage began after it.
    pub last_answer: Option<Instant>,
    /// When the loss became observable: the first missed beat, or the
    /// watch event that first showed the pod in trouble (this loss's own
    /// event when nothing came before it).
    pub observable_at: Instant,
    /// The identity that was lost.
    pub identity: Option<Identity>,
}

impl Loss {
    /// Time from when the loss was observable to the decision. (Not from
    /// the last good evidence: a pod's last status update may be minutes
    /// old when it is deleted.)
    pub fn detection_latency(&self) -> Duration {
        self.seen_at.saturating_duration_since(self.observable_at)
    }
}

/// The peers of this node.
#[derive(Debug, Clone)]
pub struct Peers {
    peers: BTreeMap<u32, Peer>,
    misses_allowed: u32,
    generation: u64,
}

impl Peers {
    /// All ranks of `nnodes` except `self_rank`, each `Unknown` (or `Absent`
    /// above an elastic minimum).
    pub fn new(nnodes: NodeCount, self_rank: u32, misses_allowed: u32, now: Instant) -> Self {
        Self::with_spares(nnodes, 0, self_rank, misses_allowed, now)
    }

    /// [`Peers::new`] with `spares` more ranks after the world's largest
    /// size: hot spares, expected to exist in a fixed world (`Unknown`),
    /// `Absent` like the ranks above an elastic minimum otherwise.
    pub fn with_spares(
        nnodes: NodeCount,
        spares: u32,
        self_rank: u32,
        misses_allowed: u32,
        now: Instant,
    ) -> Self {
        let wall = SystemTime::now();
        let expected = match nnodes {
            NodeCount::Fixed(n) => n.saturating_add(spares),
            NodeCount::Elastic { min, .. } => min,
        };
        let peers = (0..nnodes.max().saturating_add(spares))
            .filter(|r| *r != self_rank)
            .map(|rank| {
                let state = if rank >= expected {
                    State::Absent
                } else {
                    State::Unknown
                };
                (
                    rank,
                    Peer {
                        rank,
                        state,
                        since: now,
                        since_wall: wall,
                        identity: None,
                        misses: 0,
                        last_good: None,
                        last_answer: None,
                        trouble_since: None,
                        lost_by: None,
                        reason: None,
                        detail: String::new(),
                    },
                )
            })
            .collect();
        Peers {
            peers,
            misses_allowed: misses_allowed.max(1),
            generation: 0,
        }
    }

    /// The same table, with every rank outside `watched` marked
    /// [`State::NotWatched`]: a sidecar that probes only its ring
    /// neighbours (and the rendezvous host) says so for the others instead
    /// of keeping them `unknown` forever.
    pub fn watching(mut self, watched: &std::collections::BTreeSet<u32>) -> Self {
        for peer in self.peers.values_mut() {
            if !watched.contains(&peer.rank) {
                peer.state = State::NotWatched;
            }
        }
        self
    }

    /// The ranks watched (every rank in the table but the
    /// [`State::NotWatched`] ones).
    pub fn watched(&self) -> Vec<u32> {
        self.peers
            .values()
            .filter(|p| p.state != State::NotWatched)
            .map(|p| p.rank)
            .collect()
    }

    /// The current loss generation (the number of losses seen so far).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn get(&self, rank: u32) -> Option<&Peer> {
        self.peers.get(&rank)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }

    /// Applies one observation; returns the loss it decides, if any.
    pub fn observe(&mut self, obs: Observation) -> Option<Loss> {
        let misses_allowed = self.misses_allowed;
        let peer = self.peers.get_mut(&obs.rank)?;
        let at = obs.at;
        let mut lost: Option<(LossReason, String)> = None;
        let mut lost_identity = None;
        match obs.evidence {
            Evidence::Alive(identity) => {
                let known = peer.identity.clone();
                // A pod the watch shows healthy while its heartbeats are
                // missed is no answer: its object does not change when its
                // network dies. Only an answer ends missed beats.
                let heals = !(obs.source == Source::Kubernetes && peer.misses > 0);
                match (peer.state, known) {
                    (State::Unknown | State::Absent | State::NotWatched, _) | (_, None) => {
                        set_state(peer, State::Healthy, at);
                        peer.identity = Some(identity);
                    }
                    (State::Lost, Some(old)) => {
                        if !old.same_as(&identity) {
                            set_state(peer, State::Replaced, at);
                            peer.identity = Some(identity);
                            peer.reason = None;
                            // The replacement has not answered yet: its
                            // silence while it starts is no loss.
                            peer.last_answer = None;
                        } else if peer.lost_by == Some(obs.source) {
                            // The same peer is back (it was frozen, or its
                            // pod became Ready again): the source that lost it
                            // says it is alive.
                            set_state(peer, State::Healthy, at);
                            peer.reason = None;
                        }
                        // Otherwise another source still sees the old pod
                        // (a deleted pod's sidecar answers until it exits):
                        // first source wins, stay Lost.
                    }
                    (State::Healthy | State::Suspect | State::Replaced, Some(old)) => {
                        if !old.same_as(&identity) {
                            lost = Some((
                                LossReason::IdentityChanged,
                                format!(
                                    "identity changed from uid {:?} started {} to uid {:?} started {}",
                                    old.uid, old.start_time, identity.uid, identity.start_time
                                ),
                            ));
                            lost_identity = Some(old);
                            peer.identity = Some(identity);
                        } else if peer.state != State::Healthy && heals {
                            // A suspect that answers again, or a replacement
                            // that keeps answering, is healthy.
                            set_state(peer, State::Healthy, at);
                            peer.reason = None;
                        }
                    }
                }
                if obs.source == Source::Heartbeat {
                    peer.last_answer = Some(at);
                }
                if lost.is_none() && heals {
                    peer.misses = 0;
                    peer.last_good = Some(at);
                    peer.trouble_since = None;
                    if peer.state == State::Healthy {
                        peer.detail.clear();
                    }
                }
            }
            Evidence::Missed(detail) => match peer.state {
                // Never seen yet: not a miss, but the reason it is not seen
                // (a name that does not resolve, say) is shown.
                State::Unknown | State::Absent => peer.detail = detail,
                State::Lost | State::NotWatched => {}
                // Seen by the watch only, never by an answer (a replacement
                // whose sidecar is still starting): heartbeats cannot lose
                // what they never saw alive; the watch sees it fail.
                State::Healthy | State::Suspect | State::Replaced if peer.last_answer.is_none() => {
                    peer.detail = detail
                }
                State::Healthy | State::Suspect | State::Replaced => {
                    peer.trouble_since.get_or_insert(at);
                    peer.misses += 1;
                    peer.detail = detail.clone();
                    if peer.misses >= misses_allowed {
                        lost = Some((
                            LossReason::MissedHeartbeats,
                            format!("{} heartbeats missed, last: {detail}", peer.misses),
                        ));
                    } else if peer.state != State::Suspect {
                        set_state(peer, State::Suspect, at);
                    }
                }
            },
            Evidence::Suspect(detail) => match peer.state {
                State::Healthy | State::Replaced => {
                    peer.trouble_since.get_or_insert(at);
                    set_state(peer, State::Suspect, at);
                    peer.detail = detail;
                }
                // Still suspect, for a new reason (missed beats, then a
                // helper that reaches it: a partition, not a loss).
                State::Suspect => peer.detail = detail,
                _ => {}
            },
            Evidence::Lost(reason, detail) => match peer.state {
                // A peer never seen alive cannot be lost: nothing ran there
                // that the local trainer could be waiting on.
                State::Lost | State::Unknown | State::Absent | State::NotWatched => {}
                _ => lost = Some((reason, detail)),
            },
        }
        let (reason, detail) = lost?;
        self.generation += 1;
        let observable_at = peer.trouble_since.take().unwrap_or(at).min(at);
        let identity = lost_identity.or_else(|| peer.identity.clone());
        let replaced = reason == LossReason::IdentityChanged;
        set_state(
            peer,
            if replaced {
                State::Replaced
            } else {
                State::Lost
            },
            at,
        );
        peer.lost_by = Some(obs.source);
        peer.reason = Some(reason);
        peer.detail = detail.clone();
        peer.misses = 0;
        Some(Loss {
            generation: self.generation,
            rank: obs.rank,
            source: obs.source,
            reason,
            detail,
            seen_at: at,
            last_good: peer.last_good,
            last_answer: peer.last_answer,
            observable_at,
            identity,
        })
    }
}

fn set_state(peer: &mut Peer, state: State, at: Instant) {
    if peer.state != state {
        peer.state = state;
        peer.since = at;
        peer.since_wall = SystemTime::now()
            .checked_sub(Instant::now().saturating_duration_since(at))
            .unwrap_or_else(SystemTime::now);
    }
}

/// The heartbeat URL of rank `rank`'s sidecar (its probe; the other
/// endpoints of a peer's sidecar are on the same host and port).
pub fn url_of(config: &crate::config::Config, rank: u32) -> Option<String> {
    let host = config.heartbeat.host_of(rank)?;
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    Some(format!("http://{host}:{}/heartbeat", config.health_port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(uid: &str) -> Identity {
        Identity {
            pod: "p".into(),
            uid: uid.into(),
            start_time: "t0".into(),
            ..Identity::default()
        }
    }

    fn obs(rank: u32, source: Source, evidence: Evidence, at: Instant) -> Observation {
        Observation {
            rank,
            source,
            evidence,
            at,
        }
    }

    #[test]
    fn lost_after_misses_of_a_seen_peer_once() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(3), 0, 3, t);
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Unknown));
        // Misses of a never-seen peer do nothing.
        for _ in 0..5 {
            assert!(
                p.observe(obs(1, Source::Heartbeat, Evidence::Missed("dns".into()), t))
                    .is_none()
            );
        }
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Unknown));
        let t1 = t + Duration::from_secs(1);
        assert!(
            p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("a")), t1))
                .is_none()
        );
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Healthy));
        let miss = |p: &mut Peers, s| {
            p.observe(obs(
                1,
                Source::Heartbeat,
                Evidence::Missed("timeout".into()),
                t1 + Duration::from_secs(s),
            ))
        };
        assert!(miss(&mut p, 1).is_none());
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Suspect));
        assert!(miss(&mut p, 2).is_none());
        let loss = miss(&mut p, 3).expect("third miss loses the peer");
        assert_eq!(loss.generation, 1);
        assert_eq!(loss.rank, 1);
        assert_eq!(loss.reason, LossReason::MissedHeartbeats);
        // Observable from the first missed beat on.
        assert_eq!(loss.detection_latency(), Duration::from_secs(2));
        assert_eq!(loss.last_good, Some(t1));
        assert!(miss(&mut p, 4).is_none(), "one loss per generation");
        assert_eq!(p.generation(), 1);
        // The Kubernetes watch agreeing later changes nothing: first source wins.
        assert!(
            p.observe(obs(
                1,
                Source::Kubernetes,
                Evidence::Lost(LossReason::Deleted, "deleted".into()),
                t1 + Duration::from_secs(5)
            ))
            .is_none()
        );
        assert_eq!(p.get(1).map(|x| x.lost_by), Some(Some(Source::Heartbeat)));
    }

    /// The watch showing the pod healthy while its heartbeats are missed
    /// (its network cut, its object unchanged) does not reset the misses:
    /// the peer is lost after them all the same.
    #[test]
    fn a_ready_pod_in_the_watch_does_not_answer_for_missed_beats() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 0, 3, t);
        let at = |s| t + Duration::from_secs(s);
        p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("a")), at(0)));
        p.observe(obs(1, Source::Kubernetes, Evidence::Alive(id("a")), at(0)));
        for s in [1, 2] {
            let miss = Evidence::Missed("timeout".into());
            assert!(p.observe(obs(1, Source::Heartbeat, miss, at(s))).is_none());
            let ready = Evidence::Alive(id("a"));
            assert!(
                p.observe(obs(1, Source::Kubernetes, ready, at(s)))
                    .is_none()
            );
            assert_eq!(p.get(1).map(|x| x.state), Some(State::Suspect));
        }
        let loss = p
            .observe(obs(
                1,
                Source::Heartbeat,
                Evidence::Missed("timeout".into()),
                at(3),
            ))
            .expect("lost after three misses");
        assert_eq!(loss.last_answer, Some(at(0)));
        assert_eq!(loss.observable_at, at(1));
        // A new pod in the watch is still a replacement.
        p.observe(obs(1, Source::Kubernetes, Evidence::Alive(id("b")), at(4)));
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Replaced));
        // While its sidecar starts it answers nothing: no second loss (the
        // deleted cut pod's replacement on a real node).
        for s in 5..10 {
            let miss = Evidence::Missed("connection refused".into());
            assert!(p.observe(obs(1, Source::Heartbeat, miss, at(s))).is_none());
        }
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Replaced));
        // Once it answered, its silence counts again.
        p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("b")), at(10)));
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Healthy));
        let lost = (11..14).find_map(|s| {
            let miss = Evidence::Missed("timeout".into());
            p.observe(obs(1, Source::Heartbeat, miss, at(s)))
        });
        assert!(
            lost.is_some(),
            "a replacement seen alive is lost by its silence"
        );
    }

    #[test]
    fn a_good_beat_resets_the_miss_count() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 0, 2, t);
        p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("a")), t));
        p.observe(obs(1, Source::Heartbeat, Evidence::Missed("x".into()), t));
        p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("a")), t));
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Healthy));
        assert!(
            p.observe(obs(1, Source::Heartbeat, Evidence::Missed("x".into()), t))
                .is_none()
        );
    }

    #[test]
    fn identity_change_is_a_loss_and_a_replacement() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 1, 3, t);
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("a")), t));
        let loss = p
            .observe(obs(0, Source::Heartbeat, Evidence::Alive(id("b")), t))
            .expect("new uid");
        assert_eq!(loss.reason, LossReason::IdentityChanged);
        assert_eq!(loss.identity.map(|i| i.uid), Some("a".to_string()));
        assert_eq!(p.get(0).map(|x| x.state), Some(State::Replaced));
        // A replacement that answers again is healthy: the state tells the truth.
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("b")), t));
        assert_eq!(p.get(0).map(|x| x.state), Some(State::Healthy));
        // The replacement can be lost in turn: a new generation.
        for _ in 0..2 {
            assert!(
                p.observe(obs(0, Source::Heartbeat, Evidence::Missed("t".into()), t))
                    .is_none()
            );
        }
        let second = p
            .observe(obs(0, Source::Heartbeat, Evidence::Missed("t".into()), t))
            .expect("second loss");
        assert_eq!(second.generation, 2);
    }

    #[test]
    fn frozen_peer_that_comes_back_is_healthy_again() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 1, 1, t);
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("a")), t));
        assert!(
            p.observe(obs(0, Source::Heartbeat, Evidence::Missed("t".into()), t))
                .is_some()
        );
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("a")), t));
        assert_eq!(p.get(0).map(|x| x.state), Some(State::Healthy));
    }

    #[test]
    fn lost_by_kubernetes_stays_lost_while_the_old_sidecar_still_answers() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 1, 3, t);
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("a")), t));
        let loss = p
            .observe(obs(
                0,
                Source::Kubernetes,
                Evidence::Lost(LossReason::Deleted, "pod deleted".into()),
                t,
            ))
            .expect("deleted");
        assert_eq!(loss.source, Source::Kubernetes);
        p.observe(obs(0, Source::Heartbeat, Evidence::Alive(id("a")), t));
        assert_eq!(p.get(0).map(|x| x.state), Some(State::Lost));
        p.observe(obs(0, Source::Kubernetes, Evidence::Alive(id("b")), t));
        assert_eq!(p.get(0).map(|x| x.state), Some(State::Replaced));
    }

    #[test]
    fn spares_are_peers_too() {
        let t = Instant::now();
        let p = Peers::with_spares(NodeCount::Fixed(2), 1, 0, 3, t);
        let states: Vec<_> = p.iter().map(|x| (x.rank, x.state)).collect();
        assert_eq!(states, vec![(1, State::Unknown), (2, State::Unknown)]);
        let p = Peers::with_spares(NodeCount::Elastic { min: 1, max: 2 }, 1, 0, 3, t);
        let states: Vec<_> = p.iter().map(|x| (x.rank, x.state)).collect();
        assert_eq!(states, vec![(1, State::Absent), (2, State::Absent)]);
    }

    /// A sidecar that watches a bounded set says so for the others; they
    /// are never lost by it, and any evidence of life makes them known.
    #[test]
    fn unwatched_peers_are_not_watched() {
        let t = Instant::now();
        let watched = std::collections::BTreeSet::from([1, 2, 6, 7]);
        let mut p = Peers::new(NodeCount::Fixed(8), 0, 3, t).watching(&watched);
        assert_eq!(p.watched(), vec![1, 2, 6, 7]);
        assert_eq!(p.get(4).map(|x| x.state), Some(State::NotWatched));
        assert_eq!(p.get(1).map(|x| x.state), Some(State::Unknown));
        for _ in 0..5 {
            let miss = obs(4, Source::Heartbeat, Evidence::Missed("x".into()), t);
            assert!(p.observe(miss).is_none());
        }
        let lost = obs(
            4,
            Source::Kubernetes,
            Evidence::Lost(LossReason::Failed, "x".into()),
            t,
        );
        assert!(p.observe(lost).is_none());
        assert_eq!(p.get(4).map(|x| x.state), Some(State::NotWatched));
        assert!(
            p.observe(obs(4, Source::Kubernetes, Evidence::Alive(id("a")), t))
                .is_none()
        );
        assert_eq!(p.get(4).map(|x| x.state), Some(State::Healthy));
        assert_eq!(p.watched(), vec![1, 2, 4, 6, 7]);
    }

    /// A suspect peer that a helper still reaches stays suspect, with the
    /// new reason; it is not lost.
    #[test]
    fn a_suspect_keeps_the_latest_reason() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(3), 0, 3, t);
        p.observe(obs(1, Source::Heartbeat, Evidence::Alive(id("a")), t));
        for _ in 0..2 {
            p.observe(obs(
                1,
                Source::Heartbeat,
                Evidence::Missed("timeout".into()),
                t,
            ));
        }
        let partition = Evidence::Suspect("rank 2 reaches it".into());
        assert!(p.observe(obs(1, Source::Heartbeat, partition, t)).is_none());
        let peer = p.get(1).expect("rank 1");
        assert_eq!(peer.state, State::Suspect);
        assert_eq!(peer.detail, "rank 2 reaches it");
        assert_eq!(p.generation(), 0);
    }

    #[test]
    fn elastic_ranks_above_min_start_absent() {
        let t = Instant::now();
        let p = Peers::new(NodeCount::Elastic { min: 2, max: 4 }, 0, 3, t);
        let states: Vec<_> = p.iter().map(|x| (x.rank, x.state)).collect();
        assert_eq!(
            states,
            vec![(1, State::Unknown), (2, State::Absent), (3, State::Absent)]
        );
    }

    #[test]
    fn unknown_ranks_and_self_are_ignored() {
        let t = Instant::now();
        let mut p = Peers::new(NodeCount::Fixed(2), 0, 3, t);
        assert!(
            p.observe(obs(
                0,
                Source::Kubernetes,
                Evidence::Lost(LossReason::Failed, "x".into()),
                t
            ))
            .is_none()
        );
        assert!(
            p.observe(obs(
                7,
                Source::Kubernetes,
                Evidence::Lost(LossReason::Failed, "x".into()),
                t
            ))
            .is_none()
        );
        assert_eq!(p.generation(), 0);
    }
}
