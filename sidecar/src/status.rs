//! What the sidecar knows, shared between its tasks and served on
//! `/status` (JSON) and `/metrics` (Prometheus text).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::config::Config;
use crate::peers::{Peers, State};
use crate::signal::Sent;

/// RFC 3339 text of a wall-clock time.
pub fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LossLabels {
    pub source: String,
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
    pub result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalFailureLabels {
    /// `agent`, `worker`, `worker-child`.
    pub role: String,
    /// The errno name (`EPERM`, ...): a small, bounded set.
    pub error: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfirmLabels {
    /// `kubernetes`, `replacement-answered`, `outage`.
    pub confirmation: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

/// The `state` label values of `trainwire_sidecar_peers` ([`State`] in kebab case).
const PEER_STATES: [&str; 7] = [
    "unknown",
    "absent",
    "not-watched",
    "healthy",
    "suspect",
    "lost",
    "replaced",
];

/// The `result` label values of `trainwire_sidecar_indirect_probes_total`.
pub const INDIRECT_RESULTS: [&str; 3] = ["reached", "unreached", "unasked"];

/// The `state` label values of `trainwire_sidecar_trainer`.
pub const TRAINER_STATES: [&str; 3] = ["training", "waiting", "no-trainer"];

/// The Prometheus metrics.
pub struct Metrics {
    pub peers_lost: Family<LossLabels, Counter>,
    pub actions: Family<ActionLabels, Counter>,
    pub detection_latency: Family<SourceLabels, Histogram>,
    pub peers: Family<StateLabels, Gauge>,
    pub generation: Gauge,
    pub checkpoint_age: Gauge<f64, AtomicU64>,
    pub checkpoint_stale: Gauge,
    pub checkpoint_stale_episodes: Counter,
    pub signal_failures: Family<SignalFailureLabels, Counter>,
    /// One series per state of the signal-permission check (`permitted`,
    /// `denied`, `no-trainer`, `unknown`): 1 for the current one.
    pub signal_permission: Family<StateLabels, Gauge>,
    pub losses_confirmed: Family<ConfirmLabels, Counter>,
    /// One series per state of the local trainer (`training`, `waiting`,
    /// `no-trainer`): 1 for the current one.
    pub trainer: Family<StateLabels, Gauge>,
    /// Times this pod waited as a hot spare and then started training.
    pub spare_takeovers: Counter,
    /// Heartbeat probes this sidecar sent (direct, search and on a peer's
    /// request).
    pub heartbeat_probes: Counter,
    /// `GET /heartbeat` requests this sidecar answered.
    pub heartbeats_served: Counter,
    /// Indirect confirmations of a silent peer, per helper asked: `reached`
    /// (the helper reaches it), `unreached`, `unasked` (the helper could not
    /// be asked or did not answer in time).
    pub indirect_probes: Family<ResultLabels, Counter>,
    /// Stalled worlds found ([`crate::progress`]), by action and result.
    pub stalls: Family<ActionLabels, Counter>,
    /// Time since this pod's workers last moved (0 when it cannot be told).
    pub progress_idle: Gauge<f64, AtomicU64>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

impl Metrics {
    fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            peers_lost: Family::default(),
            actions: Family::default(),
            detection_latency: Family::new_with_constructor(|| {
                Histogram::new([
                    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0,
                    120.0,
                ])
            }),
            peers: Family::default(),
            generation: Gauge::default(),
            checkpoint_age: Gauge::default(),
            checkpoint_stale: Gauge::default(),
            checkpoint_stale_episodes: Counter::default(),
            signal_failures: Family::default(),
            signal_permission: Family::default(),
            losses_confirmed: Family::default(),
            trainer: Family::default(),
            spare_takeovers: Counter::default(),
            heartbeat_probes: Counter::default(),
            heartbeats_served: Counter::default(),
            indirect_probes: Family::default(),
            stalls: Family::default(),
            progress_idle: Gauge::default(),
        };
        registry.register(
            "peers_lost",
            "Peers declared lost, by the source that saw it first and why",
            m.peers_lost.clone(),
        );
        registry.register(
            "actions",
            "Responses to lost peers, by planned action and result",
            m.actions.clone(),
        );
        registry.register_with_unit(
            "detection_latency",
            "Time from when a peer's loss was observable (its first missed heartbeat, or the watch event that showed it) to the decision that it is lost",
            prometheus_client::registry::Unit::Seconds,
            m.detection_latency.clone(),
        );
        registry.register("peers", "Peers by health state", m.peers.clone());
        registry.register(
            "loss_generation",
            "Losses seen since start",
            m.generation.clone(),
        );
        registry.register_with_unit(
            "checkpoint_age",
            "Age of the newest complete checkpoint (time since start if there is none)",
            prometheus_client::registry::Unit::Seconds,
            m.checkpoint_age.clone(),
        );
        registry.register(
            "checkpoint_stale",
            "1 while the newest checkpoint is older than the max age",
            m.checkpoint_stale.clone(),
        );
        registry.register(
            "checkpoint_stale_episodes",
            "Times the checkpoint became stale",
            m.checkpoint_stale_episodes.clone(),
        );
        registry.register(
            "signal_failures",
            "Signals to the trainer that failed, by process role and errno (EPERM: the sidecar's user may not signal the trainer's)",
            m.signal_failures.clone(),
        );
        registry.register(
            "signal_permission",
            "1 for the current result of the check that the sidecar may signal the trainer: permitted, denied (EPERM), no-trainer (none running), unknown (the check did not finish)",
            m.signal_permission.clone(),
        );
        registry.register(
            "losses_confirmed",
            "Peer losses confirmed (the only ones acted on), by what confirmed them",
            m.losses_confirmed.clone(),
        );
        registry.register(
            "trainer",
            "1 for what the local trainer does now: training (its agent runs workers), waiting (an agent without workers: a hot spare, or a rendezvous in progress), no-trainer",
            m.trainer.clone(),
        );
        registry.register(
            "spare_takeovers",
            "Times this pod waited as a hot spare and then started training after a peer was lost",
            m.spare_takeovers.clone(),
        );
        registry.register(
            "heartbeat_probes",
            "Heartbeat probes sent to peers (a bounded set: the ring neighbours and the rendezvous host), including those made for a peer's indirect confirmation",
            m.heartbeat_probes.clone(),
        );
        registry.register(
            "heartbeats_served",
            "Heartbeat requests answered (GET /heartbeat)",
            m.heartbeats_served.clone(),
        );
        registry.register(
            "indirect_probes",
            "Helpers asked to probe a silent peer before it is declared lost, by what they said: reached, unreached, unasked (could not be asked, or no answer within one interval)",
            m.indirect_probes.clone(),
        );
        registry.register(
            "stalls",
            "Stalled worlds found (no rank's collective traffic moved for the stall timeout), by action (restart-workers, none) and result",
            m.stalls.clone(),
        );
        registry.register_with_unit(
            "progress_idle",
            "Time since this pod's workers last moved: new bytes on their collective connections, their start, a new checkpoint (0 when it cannot be told)",
            prometheus_client::registry::Unit::Seconds,
            m.progress_idle.clone(),
        );
        m.signal_permission
            .get_or_create(&StateLabels {
                state: "unknown".into(),
            })
            .set(1);
        m.initialise();
        m
    }

    /// Creates every series whose labels are a known, small set, at 0, so
    /// that `/metrics` shows each family from the start and alerts see a
    /// series before the first event. `signal_failures` has an open `error`
    /// label (errno names): only `EPERM`, the failure that matters, is made.
    fn initialise(&self) {
        use crate::peers::{LossReason, Source};
        use crate::signal::{Outcome, PermissionState, Plan};
        let label = |s: &str| StateLabels { state: s.into() };
        for action in ["restart-workers", "none"] {
            for outcome in Outcome::ALL {
                let _ = self.stalls.get_or_create(&ActionLabels {
                    action: action.into(),
                    result: outcome.as_str().into(),
                });
            }
        }
        for source in Source::ALL {
            for reason in LossReason::ALL {
                let _ = self.peers_lost.get_or_create(&LossLabels {
                    source: source.as_str().into(),
                    reason: reason.as_str().into(),
                });
            }
            let _ = self.detection_latency.get_or_create(&SourceLabels {
                source: source.as_str().into(),
            });
        }
        for plan in Plan::ALL {
            for outcome in Outcome::ALL {
                let _ = self.actions.get_or_create(&ActionLabels {
                    action: plan.as_str().into(),
                    result: outcome.as_str().into(),
                });
            }
        }
        for role in crate::signal::Role::ALL {
            let _ = self.signal_failures.get_or_create(&SignalFailureLabels {
                role: role.as_str().into(),
                error: "EPERM".into(),
            });
        }
        for confirmation in crate::decide::Confirmation::LABELS {
            let _ = self.losses_confirmed.get_or_create(&ConfirmLabels {
                confirmation: confirmation.into(),
            });
        }
        for state in PEER_STATES {
            let _ = self.peers.get_or_create(&label(state));
        }
        for state in PermissionState::ALL {
            let _ = self.signal_permission.get_or_create(&label(state.as_str()));
        }
        for state in TRAINER_STATES {
            let _ = self.trainer.get_or_create(&label(state));
        }
        for result in INDIRECT_RESULTS {
            let _ = self.indirect_probes.get_or_create(&ResultLabels {
                result: result.into(),
            });
        }
    }
}

/// One peer in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct PeerStatus {
    pub rank: u32,
    pub state: State,
    pub since: String,
    pub pod: Option<String>,
    pub uid: Option<String>,
    pub lost_by: Option<&'static str>,
    pub reason: Option<&'static str>,
    pub detail: String,
    pub misses: u32,
}

/// The last action in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct ActionStatus {
    pub generation: u64,
    pub lost_rank: u32,
    pub lost_by: &'static str,
    pub reason: &'static str,
    /// What confirmed the loss (`null`: unconfirmed, reported only).
    pub confirmed_by: Option<crate::decide::Confirmation>,
    pub action: &'static str,
    pub result: &'static str,
    pub at: String,
    pub detection_latency_seconds: Option<f64>,
    pub signals: Vec<Sent>,
    pub detail: String,
}

/// The last loss episode in `/status`: from suspicion to the response.
#[derive(Debug, Clone, Serialize)]
pub struct EpisodeStatus {
    pub generation: u64,
    pub rank: u32,
    pub lost_by: &'static str,
    pub reason: &'static str,
    pub detail: String,
    /// `suspect` (reported, nothing touched), `confirmed`, `closed`.
    pub state: &'static str,
    /// When the loss became observable: the first missed heartbeat, or the
    /// watch event that first showed the pod in trouble (the record's
    /// `suspectedAt`).
    pub suspected_at: String,
    /// For a loss heartbeats saw: the lost pod's last answer before the
    /// outage (the loss lies between it and `suspected_at`).
    pub last_answer_at: Option<String>,
    /// When the loss was decided (the last missed beat, after the
    /// helpers' answers; the watch event).
    pub detected_at: String,
    pub confirmed_by: Option<crate::decide::Confirmation>,
    pub confirmed_at: Option<String>,
    pub replacement_ready: bool,
    /// A stop signal arrived at a worker in this episode.
    pub workers_stopped: bool,
    /// A SIGKILL arrived at the agent in this episode.
    pub agent_killed: bool,
    /// Killing steps of this episode that did not reach their goal.
    pub failed_attempts: u32,
    /// Why the last of them failed.
    pub last_failure: Option<String>,
    /// What the response waits for, if anything.
    pub waiting_for: Option<String>,
    /// The last decision, or why the episode closed.
    pub decision: String,
}

/// The world as this sidecar sees it.
#[derive(Debug, Clone, Serialize, Default)]
pub struct WorldStatus {
    pub nnodes: String,
    /// Ranks answering (this one included).
    pub up: Vec<u32>,
    /// Ranks suspect or lost.
    pub down: Vec<u32>,
    /// The controllers' view of the whole world (every pod's role, the
    /// phase, the last loss), as last read from the workload's
    /// `trainwire.dev/world` ([`crate::world`]); `null` without an API.
    pub controllers: Option<crate::world::Seen>,
}

/// Which detection sources run, and why.
#[derive(Debug, Clone, Serialize, Default)]
pub struct DetectionStatus {
    pub configured: String,
    pub active: Vec<&'static str>,
    pub why: String,
    /// A configuration that keeps the peers from being found (the peer
    /// names' cluster domain is not this pod's).
    pub problem: Option<String>,
    /// The label selector of the Kubernetes pod watch: the workload's, and
    /// the indices of the peers this sidecar watches (its ring neighbours
    /// and the rendezvous host).
    pub pod_watch: Option<String>,
}

/// Checkpoint freshness in `/status`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct CheckpointStatus {
    pub dir: String,
    pub watcher: &'static str,
    pub newest: Option<String>,
    pub modified: Option<String>,
    pub age_seconds: Option<f64>,
    pub max_age_seconds: f64,
    pub stale: bool,
    pub problem: Option<String>,
}

/// When the local trainer's current workers were seen training, by what
/// ([`crate::collective::Watch`]), and torch's node rank they were given.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TrainingStatus {
    pub since: String,
    pub seen_by: &'static str,
    pub torch_rank: Option<u32>,
}

/// The whole `/status` document.
#[derive(Debug, Clone, Serialize)]
pub struct StatusDoc {
    pub pod: String,
    pub namespace: String,
    pub rank: u32,
    pub nnodes: String,
    /// `null` when the rendezvous store is outside the world (etcd-v2).
    pub rdzv_host_rank: Option<u32>,
    pub on_peer_loss: &'static str,
    pub started: String,
    pub detection: DetectionStatus,
    pub generation: u64,
    pub world: WorldStatus,
    /// The ranks this sidecar watches (in heartbeat mode a bounded set: its
    /// ring neighbours and the rendezvous host); the others' state is
    /// `not-watched`.
    pub watched: Vec<u32>,
    pub peers: Vec<PeerStatus>,
    /// The last loss: suspicion, confirmation, what is waited for.
    pub last_loss: Option<EpisodeStatus>,
    pub last_action: Option<ActionStatus>,
    pub actions_total: u64,
    pub checkpoint: Option<CheckpointStatus>,
    pub kubernetes_api: Option<String>,
    /// Whether this sidecar may signal the trainer, checked (without sending
    /// anything) while it runs, before any peer is lost.
    pub signal_permission: Option<String>,
    /// Hot spares of the world (pods beyond its size).
    pub spares: u32,
    /// What the local trainer does: training, or waiting (as a spare).
    pub trainer: Option<String>,
    /// Its current workers seen training; absent while they are not (or
    /// none run).
    pub training: Option<TrainingStatus>,
    /// Whether the world makes progress, and the last stall found.
    pub progress: Option<crate::stall::ProgressStatus>,
}

/// State shared by the sidecar's tasks and its HTTP server.
pub struct Shared {
    pub config: Config,
    pub started: SystemTime,
    pub started_text: String,
    pub registry: Registry,
    pub metrics: Metrics,
    status: Mutex<StatusDoc>,
    generation: AtomicU64,
    ready: AtomicBool,
    world: std::sync::OnceLock<crate::world::Reader>,
    /// The addresses of the peer pods seen (heartbeat answers, the pods'
    /// `status.podIP`), for telling the collective's connections apart.
    peer_addresses: Mutex<std::collections::BTreeSet<std::net::IpAddr>>,
}

impl Shared {
    pub fn new(config: Config) -> Arc<Self> {
        let mut registry = Registry::default();
        trainwire_runtime::exposition::register_build_info(&mut registry);
        let metrics = Metrics::new(registry.sub_registry_with_prefix("trainwire_sidecar"));
        let started = SystemTime::now();
        let started_text = rfc3339(started);
        let status = StatusDoc {
            pod: config.pod_name.clone(),
            namespace: config.namespace.clone(),
            rank: config.node_rank,
            nnodes: config.nnodes.to_string(),
            rdzv_host_rank: config.rdzv_host_rank,
            on_peer_loss: config.on_peer_loss.as_str(),
            started: started_text.clone(),
            detection: DetectionStatus::default(),
            generation: 0,
            world: WorldStatus::default(),
            watched: Vec::new(),
            peers: Vec::new(),
            last_loss: None,
            last_action: None,
            actions_total: 0,
            checkpoint: None,
            kubernetes_api: None,
            signal_permission: None,
            spares: config.spares,
            trainer: None,
            training: None,
            progress: None,
        };
        Arc::new(Shared {
            config,
            started,
            started_text,
            registry,
            metrics,
            status: Mutex::new(status),
            generation: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            world: std::sync::OnceLock::new(),
            peer_addresses: Mutex::new(Default::default()),
        })
    }

    /// Reads the controllers' view through `reader` from now on (set once).
    pub fn set_world_reader(&self, reader: crate::world::Reader) {
        let _ = self.world.set(reader);
    }

    /// The reader of the controllers' view, once set.
    pub fn world_reader(&self) -> Option<&crate::world::Reader> {
        self.world.get()
    }

    /// The status document, for reading or updating.
    pub fn status(&self) -> MutexGuard<'_, StatusDoc> {
        match self.status.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The addresses of the peer pods seen so far.
    pub fn peer_addresses(&self) -> std::collections::BTreeSet<std::net::IpAddr> {
        match self.peer_addresses.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Copies the peers' state machine into `/status` and the gauges.
    pub fn publish_peers(&self, peers: &Peers) {
        let addresses = peers
            .iter()
            .filter_map(|p| p.identity.as_ref()?.address)
            .collect();
        match self.peer_addresses.lock() {
            Ok(mut g) => *g = addresses,
            Err(poisoned) => *poisoned.into_inner() = addresses,
        }
        let now = Instant::now();
        let wall = SystemTime::now();
        let list: Vec<PeerStatus> = peers
            .iter()
            .map(|p| PeerStatus {
                rank: p.rank,
                state: p.state,
                since: rfc3339(
                    wall.checked_sub(now.saturating_duration_since(p.since))
                        .unwrap_or(wall),
                ),
                pod: p.identity.as_ref().map(|i| i.pod.clone()),
                uid: p.identity.as_ref().map(|i| i.uid.clone()),
                lost_by: p.lost_by.map(|s| s.as_str()),
                reason: p.reason.map(|r| r.as_str()),
                detail: p.detail.clone(),
                misses: p.misses,
            })
            .collect();
        for state in PEER_STATES {
            let n = list
                .iter()
                .filter(|p| {
                    serde_json::to_value(p.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        == Some(state.to_string())
                })
                .count();
            self.metrics
                .peers
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(n as i64);
        }
        self.generation.store(peers.generation(), Ordering::Relaxed);
        self.metrics.generation.set(peers.generation() as i64);
        let mut up: Vec<u32> = peers
            .iter()
            .filter(|p| matches!(p.state, State::Healthy | State::Replaced))
            .map(|p| p.rank)
            .chain(std::iter::once(self.config.node_rank))
            .collect();
        up.sort_unstable();
        let down = peers
            .iter()
            .filter(|p| matches!(p.state, State::Suspect | State::Lost))
            .map(|p| p.rank)
            .collect();
        let mut s = self.status();
        s.world = WorldStatus {
            nnodes: self.config.nnodes.to_string(),
            up,
            down,
            controllers: None,
        };
        s.peers = list;
        s.watched = peers.watched();
        s.generation = peers.generation();
    }

    /// Prometheus text of all metrics.
    pub fn encode_metrics(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_is_reported() {
        let shared = Shared::new(
            Config::from_source(
                [(crate::env::NNODES, "2"), (crate::env::NODE_RANK, "0")].as_slice(),
            )
            .expect("config"),
        );
        let text = shared.encode_metrics();
        let version = format!(
            "trainwire_build_info{{version=\"{}\"",
            trainwire_contract::release::VERSION
        );
        assert!(text.contains(&version), "{text}");
        assert!(text.contains("trainwire_sidecar_loss_generation"), "{text}");
    }

    #[test]
    fn every_family_has_series_before_any_event() {
        let mut registry = Registry::with_prefix("trainwire_sidecar");
        let _metrics = Metrics::new(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(families.len() >= 13, "{text}");
        for family in families {
            assert!(
                text.lines()
                    .any(|l| !l.starts_with('#') && l.starts_with(family)),
                "{family} has no series at start:\n{text}"
            );
        }
        for series in [
            r#"trainwire_sidecar_actions_total{action="restart-agent",result="failed"} 0"#,
            r#"trainwire_sidecar_peers_lost_total{source="heartbeat",reason="missed-heartbeats"} 0"#,
            r#"trainwire_sidecar_signal_failures_total{role="agent",error="EPERM"} 0"#,
            r#"trainwire_sidecar_signal_permission{state="denied"} 0"#,
            r#"trainwire_sidecar_signal_permission{state="unknown"} 1"#,
            r#"trainwire_sidecar_peers{state="lost"} 0"#,
            r#"trainwire_sidecar_trainer{state="training"} 0"#,
            r#"trainwire_sidecar_losses_confirmed_total{confirmation="outage"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == series),
                "{series} missing:\n{text}"
            );
        }
    }
}
