//! The signal permission and the trainer's activity, checked while nothing
//! is lost: whether this sidecar may signal the trainer's processes (a
//! sidecar that could not act says so at once, not at the first lost peer),
//! and whether this pod trains or waits as a hot spare (and the hand-over
//! of a spare that starts training after a loss). [`crate::signal`] finds
//! the processes and decides the permission; this module runs the check off
//! the runtime thread and publishes what it found (log, `/status`,
//! metrics, Events).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::events::EventSink;
use crate::signal::{self, AgentMatcher, Permission, PermissionState};
use crate::status::{Shared, StateLabels, TRAINER_STATES, rfc3339};
use trainwire_contract::peer_loss::TrainingSeenBy;

/// How often [`watch_permission`] checks that the trainer may be signalled.
pub const PERMISSION_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How often, in a world with hot spares (whether this pod trains or waits
/// as a spare is shown within this).
pub const SPARE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often while training is awaited after a loss or a restart of the
/// trainer, while no trainer runs (its start is awaited: a new pod, an
/// exited trainer), and while new workers are not yet seen training (so that
/// `trainingSince` is recorded within this of what shows it, ahead of the
/// next checkpoint, and the collective's bursts are counted at this pace),
/// for at most [`RESUMPTION_WATCH`] after the loss or the workers' start.
pub const RESUMPTION_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// How long after a loss training is awaited at the faster pace.
pub const RESUMPTION_WATCH: Duration = Duration::from_secs(300);
/// A `/proc` scan that takes longer than this is abandoned (and reported).
const PERMISSION_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks, while nothing is lost, that this sidecar may signal the trainer's
/// processes (`kill(pid, 0)`), so that a sidecar that could not act (another
/// user without `CAP_KILL`: the runtime drops added capabilities of a
/// non-root user at exec) says so at once, in the log, `/status`, the
/// `signal_permission` metric and a Warning Event, instead of at the first
/// lost peer. The `/proc` scan runs on a thread of its own (one check at a
/// time: a scan that hangs is not started again until it ends), off the
/// thread that answers heartbeats and probes and apart from the actions'.
pub async fn watch_permission(shared: Arc<Shared>, events: EventSink) {
    let matcher = AgentMatcher::new(shared.config.agent_match.clone());
    let self_pid = std::process::id() as i32;
    // Neither the store's connections nor the sidecar's own are the
    // collective's.
    let ports = crate::collective::Ports {
        store: shared.config.rdzv_port.into_iter().collect(),
        own: vec![shared.config.health_port],
    };
    let mut last: Option<PermissionState> = None;
    let mut role = Role::default();
    let mut resumed = Resumed::default();
    let mut training = crate::collective::Watch::default();
    let every = if shared.config.spares > 0 {
        SPARE_CHECK_INTERVAL
    } else {
        PERMISSION_CHECK_INTERVAL
    };
    type Found = (Permission, signal::Activity, TrainerSeen);
    let mut running: Option<tokio::sync::oneshot::Receiver<Found>> = None;
    let mut first = true;
    // Since when the scans find no trainer (none yet, or it exited): its
    // start is awaited at the fast pace too, for as long as a resumption.
    let mut no_trainer_since: Option<std::time::Instant> = None;
    loop {
        if !first {
            // The pace is judged again at every fast tick: a loss confirmed
            // (or a trainer gone) during a slow wait makes the next scan
            // come at once, not up to `every` later.
            let mut waited = Duration::ZERO;
            while waited < every {
                let loss = RecordedLoss::of(&shared.status());
                let now = SystemTime::now();
                let fast = resumed.awaits(loss.as_ref(), now)
                    || role.switch.is_some()
                    || training.pending(now, RESUMPTION_WATCH)
                    || no_trainer_since.is_some_and(|s| s.elapsed() < RESUMPTION_WATCH);
                let tick = RESUMPTION_CHECK_INTERVAL.min(every);
                tokio::time::sleep(tick).await;
                waited += tick;
                if fast {
                    break;
                }
            }
        }
        first = false;
        let pending = match running.take() {
            Some(pending) => pending,
            None => {
                let matcher = matcher.clone();
                let ports = ports.clone();
                let peers = shared.peer_addresses();
                let node_dir = shared.config.rendezvous_dir.clone();
                match signal::on_own_thread("trainwire-check", move || {
                    let root = std::path::Path::new("/proc");
                    let procs = signal::scan(root);
                    let trainers = signal::find_trainers(&procs, &matcher, self_pid);
                    let mut up =
                        TrainerSeen::of(&trainers, signal::uptime_ticks(root), SystemTime::now());
                    let workers = agent_workers(root, &trainers, node_dir.as_deref());
                    (up.collective, up.torch_rank) =
                        if workers.pids.is_empty() && !trainers.is_empty() {
                            let agents: Vec<i32> = trainers.iter().map(|t| t.agent.pid).collect();
                            (crate::collective::scan_agents(root, &agents), None)
                        } else {
                            crate::collective::scan(root, &workers, &ports, &peers)
                        };
                    (
                        signal::check_permission(&trainers),
                        signal::activity(&trainers),
                        up,
                    )
                }) {
                    Ok(pending) => pending,
                    Err(e) => {
                        publish_permission(
                            &shared,
                            &events,
                            &mut last,
                            PermissionState::Unknown,
                            format!("unknown: cannot start a thread to scan /proc: {e}"),
                        );
                        continue;
                    }
                }
            }
        };
        let mut pending = pending;
        let mut found = tokio::time::timeout(PERMISSION_CHECK_TIMEOUT, &mut pending).await;
        if let Ok(Ok((_, activity, up))) = &mut found {
            let now = SystemTime::now();
            // The workers are followed; an agent that runs none is too (only
            // a stand-in trainer that is not torchrun ever counts by it).
            let (key, started) = match up.workers_ticks {
                Some(w) => (Some(w), up.workers_started),
                None => (up.agents.iter().map(|(_, t)| *t).max(), up.agent_started),
            };
            up.training = training.observe(key, started, &up.collective, now);
            role.observe(&shared, &events, *activity, up);
            resumed.observe(&shared, &events, up, now);
        }
        let found = found.map(|r| r.map(|(permission, _, _)| permission));
        match &found {
            Ok(Ok(Permission::NoTrainer)) => {
                no_trainer_since.get_or_insert_with(std::time::Instant::now);
            }
            Ok(Ok(_)) => no_trainer_since = None,
            _ => {}
        }
        let (state, text) = match found {
            Ok(Ok(Permission::NoTrainer)) => {
                (PermissionState::NoTrainer, "no trainer running".to_string())
            }
            Ok(Ok(Permission::Permitted { processes })) => (
                PermissionState::Permitted,
                format!("permitted: may signal the trainer's {processes} processes"),
            ),
            Ok(Ok(Permission::Denied { pid, role, error })) => (
                PermissionState::Denied,
                format!(
                    "denied: signalling the trainer's {role} (pid {pid}) fails with {error}; the sidecar must run as the trainer's user, or as root with CAP_KILL (the webhook sets this from the trainer's runAsUser)"
                ),
            ),
            Ok(Err(_)) => (
                PermissionState::Unknown,
                "unknown: the check ended without a result".to_string(),
            ),
            Err(_) => {
                // Still scanning: the same scan is waited for again at
                // the next tick, no second one is started.
                running = Some(pending);
                (
                    PermissionState::Unknown,
                    format!(
                        "unknown: scanning /proc has taken over {}s",
                        PERMISSION_CHECK_TIMEOUT.as_secs()
                    ),
                )
            }
        };
        publish_permission(&shared, &events, &mut last, state, text);
    }
}

/// The trainer's workers for the collective's scan, with what the agent's
/// rendezvous handler wrote of its last round (in the channel directory
/// `node_dir`, when the handler is there): torch's node rank of workers
/// whose environment does not tell it (forkserver children, another
/// user's). Blocking.
pub fn agent_workers(
    root: &std::path::Path,
    trainers: &[signal::Trainer],
    node_dir: Option<&std::path::Path>,
) -> crate::collective::Workers {
    let agents: Vec<i32> = trainers.iter().map(|t| t.agent.pid).collect();
    let node = node_dir.and_then(|dir| crate::rendezvous::agent_node_of(dir, root, &agents));
    crate::collective::Workers::of(trainers, node.as_ref())
}

/// What one `/proc` scan shows of the trainer, for [`Resumed`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrainerSeen {
    /// The agents: (pid, start in clock ticks since boot), sorted. A
    /// different set than before is a new trainer.
    pub agents: Vec<(i32, u64)>,
    /// When the newest of the agents started.
    pub agent_started: Option<SystemTime>,
    /// When the newest worker started.
    pub workers_started: Option<SystemTime>,
    /// The newest worker's start in clock ticks since boot: the same
    /// workers from one scan to the next (their wall-clock start, derived
    /// from the uptime at each scan, moves by milliseconds).
    pub workers_ticks: Option<u64>,
    /// What the scan saw of the workers' collective ([`crate::collective`]).
    pub collective: crate::collective::Collective,
    /// When these workers were seen training, and by what
    /// ([`crate::collective::Watch`] over the scans so far).
    pub training: Option<(SystemTime, TrainingSeenBy)>,
    /// torch's node rank of the workers (`GROUP_RANK`), when readable.
    pub torch_rank: Option<u32>,
}

impl TrainerSeen {
    /// From the trainers found and the uptime (both in ticks), at `now`.
    fn of(trainers: &[signal::Trainer], uptime_ticks: Option<u64>, now: SystemTime) -> TrainerSeen {
        let mut agents: Vec<(i32, u64)> = trainers
            .iter()
            .map(|t| (t.agent.pid, t.agent.start_ticks))
            .collect();
        agents.sort_unstable();
        let at = |start: u64| {
            let ticks = uptime_ticks?.saturating_sub(start);
            now.checked_sub(Duration::from_millis(
                ticks.saturating_mul(1000) / signal::TICKS_PER_SECOND,
            ))
        };
        TrainerSeen {
            agent_started: agents.iter().map(|(_, s)| *s).max().and_then(at),
            workers_started: signal::newest_worker_start(trainers).and_then(at),
            workers_ticks: signal::newest_worker_start(trainers),
            collective: crate::collective::Collective::default(),
            training: None,
            torch_rank: None,
            agents,
        }
    }
}

/// A loss this sidecar recorded (its last action and episode in `/status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedLoss {
    pub generation: u64,
    pub lost_rank: u32,
    pub confirmed_by: String,
    pub action: String,
    pub result: String,
    /// When it acted, RFC 3339 (the record's `at`).
    pub at: String,
    /// When the loss became observable (the record's `suspectedAt`).
    pub suspected_at: SystemTime,
    /// The source that saw it first, and why (the record's `lostBy`,
    /// `reason`).
    pub lost_by: String,
    pub reason: String,
    /// For heartbeats: the lost pod's last answer (`lastAnswerAt`).
    pub last_answer_at: Option<String>,
}

impl RecordedLoss {
    /// The loss of the last action, when its episode says when it began.
    fn of(status: &crate::status::StatusDoc) -> Option<RecordedLoss> {
        let action = status.last_action.as_ref()?;
        let episode = status
            .last_loss
            .as_ref()
            .filter(|l| l.generation == action.generation)?;
        let suspected = episode
            .suspected_at
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()?;
        Some(RecordedLoss {
            generation: action.generation,
            lost_rank: action.lost_rank,
            confirmed_by: action
                .confirmed_by
                .map(|c| c.as_str())
                .unwrap_or_default()
                .to_string(),
            action: action.action.to_string(),
            result: action.result.to_string(),
            at: action.at.clone(),
            suspected_at: SystemTime::from(suspected),
            lost_by: action.lost_by.to_string(),
            reason: action.reason.to_string(),
            last_answer_at: episode.last_answer_at.clone(),
        })
    }
}

/// When training runs again on this pod, for the world controller's
/// `resumedAt`: the `trainingSince` of the record on this pod.
///
/// - After a loss this sidecar recorded, the first time the trainer's
///   workers started after it, are still there a settle time
///   ([`TRAINING_SETTLE`](trainwire_contract::peer_loss::TRAINING_SETTLE))
///   later and have formed their collective ([`crate::collective`]): that
///   loss's record with the time of the scan that saw it (their start when
///   their sockets cannot be read). Once per loss generation.
/// - After this pod's own trainer restarted (a new agent where another one
///   ran before: its container exited and came back, as every agent does
///   when the rendezvous store goes away), which no recorded loss covers:
///   a [`TRAINER_RESTARTED`](trainwire_contract::peer_loss::TRAINER_RESTARTED)
///   record once the new agent's workers are up a settle time. Once per
///   restart.
#[derive(Debug, Default)]
pub struct Resumed {
    /// The generation whose resumption was recorded.
    recorded: u64,
    /// The agents seen last (kept while no trainer runs).
    agents: Vec<(i32, u64)>,
    /// A restart seen and not yet resumed: when the new agent started.
    restarted: Option<SystemTime>,
}

impl Resumed {
    /// Whether training is awaited: a loss recorded (`loss`, the last)
    /// whose resumption is not, suspected less than [`RESUMPTION_WATCH`]
    /// before `now`, or a restart of the trainer not yet resumed.
    pub fn awaits(&self, loss: Option<&RecordedLoss>, now: SystemTime) -> bool {
        let recent = |since: SystemTime| {
            now.duration_since(since)
                .map_or(true, |age| age < RESUMPTION_WATCH)
        };
        loss.is_some_and(|l| l.generation > self.recorded && recent(l.suspected_at))
            || self.restarted.is_some_and(recent)
    }

    /// The record to write after this scan, if any. Pure: `loss` is the
    /// sidecar's last recorded loss, `own` its (generation, node rank).
    pub fn next(
        &mut self,
        loss: Option<&RecordedLoss>,
        seen: &TrainerSeen,
        own: (u64, u32),
        now: SystemTime,
    ) -> Option<trainwire_contract::peer_loss::PeerLossRecord> {
        use trainwire_contract::peer_loss::{PeerLossRecord, TRAINER_RESTARTED};
        if !seen.agents.is_empty() {
            if !self.agents.is_empty() && self.agents != seen.agents {
                self.restarted = Some(seen.agent_started.unwrap_or(now));
            }
            self.agents = seen.agents.clone();
        }
        // Training as the scans saw it (they run every
        // RESUMPTION_CHECK_INTERVAL while it is awaited), kept for these
        // workers even when the loss is recorded later (at its
        // confirmation).
        let (since, by) = seen.training?;
        // What trains: the workers, or an agent that runs none (a stand-in
        // trainer, crate::collective::scan_agents).
        let started = seen.workers_started.or(seen.agent_started)?;
        if let Some(loss) = loss
            && loss.generation > self.recorded
            && started >= loss.suspected_at
        {
            self.recorded = loss.generation;
            if self.restarted.is_some_and(|r| started >= r) {
                // The restart was part of this loss.
                self.restarted = None;
            }
            return Some(PeerLossRecord {
                generation: loss.generation,
                lost_rank: loss.lost_rank,
                confirmed_by: loss.confirmed_by.clone(),
                action: loss.action.clone(),
                result: loss.result.clone(),
                at: loss.at.clone(),
                suspected_at: Some(rfc3339(loss.suspected_at)),
                lost_by: Some(loss.lost_by.clone()),
                reason: Some(loss.reason.clone()),
                last_answer_at: loss.last_answer_at.clone(),
                training_since: Some(rfc3339(since)),
                torch_rank: seen.torch_rank,
                training_seen_by: Some(by.as_str().to_string()),
            });
        }
        let restarted = self.restarted?;
        if started < restarted {
            return None;
        }
        self.restarted = None;
        Some(PeerLossRecord {
            generation: own.0,
            lost_rank: own.1,
            confirmed_by: String::new(),
            action: TRAINER_RESTARTED.to_string(),
            result: "training".to_string(),
            at: rfc3339(restarted),
            training_since: Some(rfc3339(since)),
            torch_rank: seen.torch_rank,
            training_seen_by: Some(by.as_str().to_string()),
            ..PeerLossRecord::default()
        })
    }

    /// [`Resumed::next`] on this sidecar's state; writes the record on the
    /// pod (`trainwire.dev/peer-loss`).
    pub fn observe(
        &mut self,
        shared: &Shared,
        events: &EventSink,
        seen: &TrainerSeen,
        now: SystemTime,
    ) -> Option<trainwire_contract::peer_loss::PeerLossRecord> {
        let loss = RecordedLoss::of(&shared.status());
        let own = (shared.generation(), shared.config.node_rank);
        let record = self.next(loss.as_ref(), seen, own, now)?;
        tracing::info!(
            generation = record.generation,
            action = record.action,
            since = record.training_since.as_deref().unwrap_or_default(),
            "training runs again: the trainer's workers started after the loss and stayed up"
        );
        events.record_peer_loss(&record);
        Some(record)
    }
}

/// Whether this pod trains or waits (as a spare), and the hand-over of a
/// spare that starts training after a loss.
#[derive(Debug, Default)]
struct Role {
    last: Option<signal::Activity>,
    /// The loss generation whose take-over was already said.
    took_over: u64,
    /// A spare whose trainer went from waiting to training: when that was
    /// seen, and when its workers were first seen in their collective. Its
    /// take-over is said once both that and the loss are known (its
    /// sidecar may count the loss after torchrun took the spare in).
    switch: Option<Switch>,
}

#[derive(Debug, Clone, Copy)]
struct Switch {
    seen: std::time::Instant,
    /// When the switch was seen, in wall-clock time.
    seen_at: SystemTime,
    training: Option<(SystemTime, TrainingSeenBy)>,
}

/// How long a spare's switch to training waits for its sidecar to count
/// the loss it answers (a switch with no loss is the world forming).
const TAKEOVER_WINDOW: Duration = Duration::from_secs(60);

/// How long before its sidecar suspected the loss a spare's switch to
/// training may come and still answer it: torchrun can take the spare in
/// before the spare's own sidecar counts the loss (a survivor's workers
/// fail on the dead peer's closed connections at once; the watch says it
/// within about a second). A switch longer before is the world forming,
/// whose training a slow first observation could otherwise date after
/// the loss (on the real node: `resumedAt` 0.8 s before the first step).
const TAKEOVER_LEAD: Duration = Duration::from_secs(5);

/// Whether a spare's switch to training seen at `switch` can answer the
/// loss its sidecar suspected at `suspected`: not more than
/// [`TAKEOVER_LEAD`] before (unknown: it may).
fn answers(switch: SystemTime, suspected: Option<SystemTime>) -> bool {
    suspected.is_none_or(|s| switch + TAKEOVER_LEAD >= s)
}

impl Role {
    fn observe(
        &mut self,
        shared: &Shared,
        events: &EventSink,
        now: signal::Activity,
        seen: &TrainerSeen,
    ) {
        let spares = shared.config.spares;
        let text = match now {
            signal::Activity::Training { workers } => {
                format!("training: the agent runs {workers} workers")
            }
            signal::Activity::Waiting if spares > 0 => {
                "waiting: the agent runs no workers (a hot spare while the world is complete, or a rendezvous in progress)".to_string()
            }
            signal::Activity::Waiting => {
                "waiting: the agent runs no workers (a rendezvous in progress)".to_string()
            }
            signal::Activity::NoTrainer => "no trainer running".to_string(),
        };
        let label = match now {
            signal::Activity::Training { .. } => "training",
            signal::Activity::Waiting => "waiting",
            signal::Activity::NoTrainer => "no-trainer",
        };
        for state in TRAINER_STATES {
            shared
                .metrics
                .trainer
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(i64::from(state == label));
        }
        let generation = shared.generation();
        let training = matches!(now, signal::Activity::Training { .. });
        if spares > 0 && self.last == Some(signal::Activity::Waiting) && training {
            self.switch = Some(Switch {
                seen: std::time::Instant::now(),
                seen_at: SystemTime::now(),
                training: None,
            });
        }
        if !training
            || self
                .switch
                .is_some_and(|s| s.seen.elapsed() > TAKEOVER_WINDOW)
        {
            self.switch = None;
        }
        // The spare trains from when its workers were seen training.
        if let Some(sw) = self.switch.as_mut()
            && sw.training.is_none()
        {
            sw.training = seen.training;
        }
        let suspected = shared
            .status()
            .last_loss
            .as_ref()
            .filter(|l| l.generation == generation)
            .and_then(|l| l.suspected_at.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(SystemTime::from);
        let took_over = self
            .switch
            .filter(|s| answers(s.seen_at, suspected))
            .and_then(|s| s.training)
            .filter(|_| generation > self.took_over);
        if took_over.is_some() {
            self.switch = None;
        }
        let mut status = shared.status();
        status.trainer = Some(text);
        status.training = seen
            .training
            .map(|(since, by)| crate::status::TrainingStatus {
                since: rfc3339(since),
                seen_by: by.as_str(),
                torch_rank: seen.torch_rank,
            });
        if let Some((took_over_at, by)) = took_over {
            let lost_rank = status.last_loss.as_ref().map(|l| l.rank);
            let lost = status
                .last_loss
                .as_ref()
                .map(|l| format!("rank {} ({})", l.rank, l.detail))
                .unwrap_or_else(|| "a lost node".into());
            drop(status);
            // On this pod, for the world controller: when the world trains
            // again after that loss.
            if let Some(lost_rank) = lost_rank {
                events.record_peer_loss(&trainwire_contract::peer_loss::PeerLossRecord {
                    generation,
                    lost_rank,
                    confirmed_by: String::new(),
                    action: trainwire_contract::peer_loss::SPARE_TOOK_OVER.to_string(),
                    result: "training".to_string(),
                    at: rfc3339(took_over_at),
                    torch_rank: seen.torch_rank,
                    training_seen_by: Some(by.as_str().to_string()),
                    ..Default::default()
                });
            }
            let note = format!(
                "this pod ({}) waited as a spare and now trains in place of lost {lost} (loss generation {generation})",
                shared.config.pod_name
            );
            tracing::info!("spare took over: {note}");
            events.publish(false, "SpareTookOver", "take-over", note);
            shared.metrics.spare_takeovers.inc();
            self.took_over = generation;
        }
        self.last = Some(now);
    }
}

fn publish_permission(
    shared: &Shared,
    events: &EventSink,
    last: &mut Option<PermissionState>,
    state: PermissionState,
    text: String,
) {
    for s in PermissionState::ALL {
        shared
            .metrics
            .signal_permission
            .get_or_create(&StateLabels {
                state: s.as_str().into(),
            })
            .set(i64::from(s == state));
    }
    shared.status().signal_permission = Some(text.clone());
    if *last != Some(state) {
        match state {
            PermissionState::Denied => {
                tracing::warn!(result = "denied", "signal permission: {text}");
                events.publish(true, "CannotSignalTrainer", "check-permission", text);
            }
            PermissionState::Unknown => tracing::warn!("signal permission: {text}"),
            _ => tracing::info!("signal permission: {text}"),
        }
    }
    *last = Some(state);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::peers::{Evidence, Identity, LossReason, Observation, Peers, Source};
    use std::time::Instant;

    /// Rank 1 of 2 on heartbeats, one hot spare, no rendezvous host; no
    /// agent to signal.
    fn spare_config() -> Config {
        use crate::env;
        Config::from_source(
            [
                (env::NNODES, "2"),
                (env::NODE_RANK, "1"),
                (env::PEER_HOSTS, "127.0.0.1{i}"),
                (env::RDZV_HOST_RANK, "none"),
                (env::ON_PEER_LOSS, "auto"),
                (env::DETECTION, "heartbeat"),
                // Matches no process on this machine: nothing is signalled.
                (env::AGENT_MATCH, "trainwire_agent=no-such-agent-7f3a9c"),
                (env::SPARES, "1"),
            ]
            .as_slice(),
        )
        .expect("config")
    }

    /// Rank 0, seen once, is lost (pod deleted): the sidecar's generation 1.
    fn lose_rank_0(shared: &Shared, config: &crate::config::Config) {
        let mut peers = Peers::with_spares(config.nnodes, 1, 1, 3, Instant::now());
        for evidence in [
            Evidence::Alive(Identity {
                pod: "train-0".into(),
                uid: "a".into(),
                address: Some("10.0.0.1".parse().expect("ip")),
                ready: true,
                ..Identity::default()
            }),
            Evidence::Lost(LossReason::Deleted, "pod train-0 was deleted".into()),
        ] {
            peers.observe(Observation {
                rank: 0,
                source: Source::Kubernetes,
                evidence,
                at: Instant::now(),
            });
        }
        shared.publish_peers(&peers);
    }

    /// A spare's sidecar: waiting, then training after a loss, is one
    /// take-over (counted and said once per loss); training before any loss
    /// (the world forming) is none.
    #[test]
    fn a_spare_that_starts_training_after_a_loss_took_over_once() {
        let config = spare_config();
        let shared = Shared::new(config.clone());
        let events = EventSink::disabled();
        let mut role = Role::default();
        let training = signal::Activity::Training { workers: 2 };
        // The world forms with this pod waiting, then training: no loss yet.
        // Whether the scans saw the workers train (collective::Watch).
        let seen = |trains: bool| TrainerSeen {
            training: trains.then(|| (SystemTime::now(), TrainingSeenBy::CollectiveTraffic)),
            ..TrainerSeen::default()
        };
        role.observe(&shared, &events, signal::Activity::Waiting, &seen(false));
        role.observe(&shared, &events, training, &seen(true));
        assert_eq!(shared.metrics.spare_takeovers.get(), 0);
        // It waits as the spare; a peer is lost; it trains.
        role.observe(&shared, &events, signal::Activity::Waiting, &seen(false));
        lose_rank_0(&shared, &config);
        // Its workers start but are not seen training yet.
        role.observe(&shared, &events, training, &seen(false));
        assert_eq!(shared.metrics.spare_takeovers.get(), 0);
        role.observe(&shared, &events, training, &seen(true));
        role.observe(&shared, &events, training, &seen(true));
        assert_eq!(shared.metrics.spare_takeovers.get(), 1);
        assert!(
            shared
                .status()
                .trainer
                .as_deref()
                .is_some_and(|t| t.starts_with("training")),
        );
        assert_eq!(
            shared.status().training.as_ref().map(|t| t.seen_by),
            Some("collective-traffic")
        );
        let metrics = shared.encode_metrics();
        assert!(
            metrics.contains(r#"trainwire_sidecar_trainer{state="training"} 1"#),
            "{metrics}"
        );
        // Waiting again: nothing seen training.
        role.observe(&shared, &events, signal::Activity::Waiting, &seen(false));
        assert_eq!(shared.status().training, None);
    }

    /// torchrun may take the spare in before its sidecar counts the loss
    /// (the keep-alive expires before the missed heartbeats add up): the
    /// take-over is said once the loss is counted, still within the window.
    #[test]
    fn a_spare_that_trains_before_its_sidecar_counts_the_loss_took_over() {
        let config = spare_config();
        let shared = Shared::new(config.clone());
        let events = EventSink::disabled();
        let mut role = Role::default();
        let training = signal::Activity::Training { workers: 2 };
        let connected = TrainerSeen {
            training: Some((SystemTime::now(), TrainingSeenBy::CollectiveFormed)),
            ..TrainerSeen::default()
        };
        role.observe(&shared, &events, signal::Activity::Waiting, &connected);
        role.observe(&shared, &events, training, &connected);
        assert_eq!(shared.metrics.spare_takeovers.get(), 0);
        lose_rank_0(&shared, &config);
        assert_eq!(shared.generation(), 1);
        role.observe(&shared, &events, training, &connected);
        assert_eq!(shared.metrics.spare_takeovers.get(), 1);
    }

    mod resumed {
        use super::super::{RecordedLoss, Resumed, TrainerSeen};
        use crate::collective::{Collective, Watch};
        use std::collections::BTreeMap;
        use std::time::{Duration, SystemTime};
        use trainwire_contract::peer_loss::{
            BURST_LIKENESS, PeerLossRecord, STEP_BURSTS, TRAFFIC_WAIT, TRAINER_RESTARTED,
            TRAINING_SETTLE, TrainingSeenBy,
        };

        /// The sidecar's scans as the permission loop runs them: the
        /// collective watched, then the record decided.
        #[derive(Default)]
        struct Scans {
            resumed: Resumed,
            watch: Watch,
        }

        impl Scans {
            fn next(
                &mut self,
                loss: Option<&RecordedLoss>,
                seen: &TrainerSeen,
                own: (u64, u32),
                now: SystemTime,
            ) -> Option<PeerLossRecord> {
                let mut seen = seen.clone();
                seen.training = self.watch.observe(
                    seen.workers_ticks,
                    seen.workers_started,
                    &seen.collective,
                    now,
                );
                self.resumed.next(loss, &seen, own, now)
            }

            fn awaits(&self, loss: Option<&RecordedLoss>, now: SystemTime) -> bool {
                self.resumed.awaits(loss, now)
            }
        }

        fn t(secs: u64) -> SystemTime {
            // 2026-11-19T10:00:00Z + secs
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_082_400 + secs)
        }

        fn text(secs: u64) -> String {
            crate::status::rfc3339(t(secs))
        }

        fn loss(generation: u64, suspected: u64) -> RecordedLoss {
            RecordedLoss {
                generation,
                lost_rank: 1,
                confirmed_by: "pod-deleted".into(),
                action: "restart-workers".into(),
                result: "signalled".into(),
                at: text(suspected + 1),
                suspected_at: t(suspected),
                lost_by: "kubernetes".into(),
                reason: "deleted".into(),
                last_answer_at: None,
            }
        }

        /// Agent `pid` (started at `agent`), its workers started at `workers`.
        fn up(pid: i32, agent: u64, workers: Option<u64>) -> TrainerSeen {
            TrainerSeen {
                agents: vec![(pid, agent * 100)],
                agent_started: Some(t(agent)),
                workers_started: workers.map(t),
                workers_ticks: workers.map(|w| w * 100),
                collective: Collective::Unreadable,
                training: None,
                torch_rank: None,
            }
        }

        const OWN: (u64, u32) = (0, 2);

        #[test]
        fn workers_started_after_the_loss_and_still_up_resume_it_once() {
            let mut r = Scans::default();
            let l = loss(1, 100);
            // Training before the loss: nothing.
            assert_eq!(r.next(None, &up(7, 0, Some(10)), OWN, t(50)), None);
            // The loss; the workers are those from before it: nothing.
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(10)), OWN, t(101)), None);
            // New workers at 105, not yet a settle time old: nothing.
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(105)), OWN, t(105)), None);
            let settled = t(105) + TRAINING_SETTLE;
            let record = r
                .next(Some(&l), &up(7, 0, Some(105)), OWN, settled)
                .expect("the record");
            assert_eq!(record.generation, 1);
            assert_eq!(record.lost_rank, 1);
            assert_eq!(record.action, "restart-workers");
            assert_eq!(record.result, "signalled");
            assert_eq!(record.confirmed_by, "pod-deleted");
            assert_eq!(record.at, text(101));
            assert_eq!(record.training_since, Some(text(105)));
            // One write per loss generation.
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(105)), OWN, t(120)), None);
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(115)), OWN, t(130)), None);
            // The next loss gets its own.
            let l2 = loss(2, 200);
            assert_eq!(r.next(Some(&l2), &up(7, 0, Some(115)), OWN, t(210)), None);
            let record = r
                .next(Some(&l2), &up(7, 0, Some(220)), OWN, t(230))
                .expect("the second record");
            assert_eq!(record.generation, 2);
            assert_eq!(record.training_since, Some(text(220)));
        }

        /// With their sockets readable, the workers train once they have
        /// formed their collective: the record says when that was seen.
        #[test]
        fn the_collective_formed_is_when_training_runs_again() {
            let mut r = Scans::default();
            let l = loss(1, 100);
            let mut seen = up(7, 0, Some(105));
            seen.collective = Collective::Forming;
            // Started and settled, still importing or waiting for peers.
            assert_eq!(r.next(Some(&l), &seen, OWN, t(107)), None);
            assert_eq!(r.next(Some(&l), &seen, OWN, t(108)), None);
            // Formed, its traffic not readable (no socket diagnostics).
            seen.collective = Collective::Formed { traffic: None };
            seen.torch_rank = Some(1);
            let record = r.next(Some(&l), &seen, OWN, t(109)).expect("the record");
            assert_eq!(record.training_since, Some(text(109)));
            assert_eq!(
                record.training_seen_by.as_deref(),
                Some("collective-formed")
            );
            assert_eq!(record.torch_rank, Some(1));
            assert_eq!(r.next(Some(&l), &seen, OWN, t(110)), None);
            // Training seen before the loss is recorded (at its
            // confirmation, later): the record says when it was seen.
            let mut r = Scans::default();
            let mut seen = up(7, 0, Some(105));
            seen.collective = Collective::Formed { traffic: None };
            assert_eq!(r.next(None, &seen, OWN, t(107)), None);
            let record = r.next(Some(&l), &seen, OWN, t(130)).expect("the record");
            assert_eq!(record.training_since, Some(text(107)));
            assert_eq!(record.suspected_at, Some(text(100)));
        }

        /// A spare's switch to training answers a loss its sidecar
        /// suspected at most TAKEOVER_LEAD after it (torchrun may take the
        /// spare in first), never one that came long after: that switch
        /// was the world forming.
        #[test]
        fn a_switch_long_before_the_loss_is_the_world_forming() {
            let suspected = Some(t(100));
            assert!(super::super::answers(t(100), suspected));
            assert!(super::super::answers(t(120), suspected));
            assert!(super::super::answers(
                t(100) - super::super::TAKEOVER_LEAD,
                suspected
            ));
            assert!(!super::super::answers(t(94), suspected));
            assert!(!super::super::answers(t(80), suspected));
            assert!(super::super::answers(t(80), None));
        }

        /// With the collective's traffic readable, training is the third
        /// of the scans with new bytes both ways, alike, after it formed: the
        /// start-up's pieces (the checkpoint choice's broadcast, DDP's
        /// shape check sent by each rank as it comes out of its checkpoint
        /// load) are small beside the parameters' broadcast and the steps'
        /// all-reduces; a collective that stays silent (NCCL over RDMA)
        /// counts from its forming after the wait.
        #[test]
        fn training_is_the_collectives_traffic_after_it_formed() {
            let l = loss(1, 100);
            let formed = |bytes: &[(u64, u64)]| Collective::Formed {
                traffic: Some(
                    bytes
                        .iter()
                        .map(|(inode, n)| (*inode, crate::collective::Carried::each_way(*n)))
                        .collect::<BTreeMap<_, _>>(),
                ),
            };
            let mut r = Scans::default();
            let mut seen = up(7, 0, Some(105));
            seen.collective = Collective::Forming;
            assert_eq!(r.next(Some(&l), &seen, OWN, t(107)), None);
            // Formed at 108; the checkpoint choice's broadcast at 109;
            // the shape check's pieces at 110 and 111 as the ranks arrive
            // (a connection opened at 111 counts from the next scan);
            // nothing at 112; the parameters' broadcast at 113; the first
            // step at 114, the second at 115. Every scan with new bytes
            // counted, the fourth (113) would precede the first step.
            let scans = [
                (108, vec![(1, 300)]),
                (109, vec![(1, 600)]),
                (110, vec![(1, 640)]),
                (111, vec![(1, 700), (2, 40_000)]),
                (112, vec![(1, 700), (2, 40_000)]),
                (113, vec![(1, 60_700), (2, 40_000)]),
                (114, vec![(1, 150_700), (2, 40_000)]),
            ];
            for (at, bytes) in scans {
                seen.collective = formed(&bytes);
                assert_eq!(r.next(Some(&l), &seen, OWN, t(at)), None, "at {at}");
            }
            seen.collective = formed(&[(1, 240_700), (2, 40_000)]);
            let record = r.next(Some(&l), &seen, OWN, t(115)).expect("the record");
            assert_eq!((STEP_BURSTS, BURST_LIKENESS), (3, 4));
            assert_eq!(record.training_since, Some(text(115)));
            assert_eq!(
                record.training_seen_by.as_deref(),
                Some("collective-traffic")
            );

            // Formed, then silent: its forming, once the wait is over.
            let mut r = Scans::default();
            seen.collective = formed(&[(1, 300)]);
            assert_eq!(r.next(Some(&l), &seen, OWN, t(108)), None);
            let wait = t(108) + TRAFFIC_WAIT;
            let before = wait - Duration::from_millis(1);
            assert_eq!(r.next(Some(&l), &seen, OWN, before), None);
            let record = r.next(Some(&l), &seen, OWN, wait).expect("the record");
            assert_eq!(record.training_since, Some(text(108)));
            assert_eq!(
                record.training_seen_by.as_deref(),
                Some("collective-formed")
            );
        }

        /// Workers given no peers on other nodes (a launcher that is not
        /// torchrun, a world of one node) have no collective to see: their
        /// start, settled, is all there is, and it says so.
        #[test]
        fn workers_without_peers_to_form_a_collective_with_count_from_their_start() {
            let l = loss(1, 100);
            let mut r = Scans::default();
            let mut seen = up(7, 0, Some(105));
            seen.collective = Collective::NotExpected;
            assert_eq!(r.next(Some(&l), &seen, OWN, t(105)), None);
            let record = r
                .next(Some(&l), &seen, OWN, t(105) + TRAINING_SETTLE)
                .expect("the record");
            assert_eq!(record.training_since, Some(text(105)));
            assert_eq!(record.training_seen_by.as_deref(), Some("workers-started"));
            assert_eq!(
                TrainingSeenBy::of_record(record.training_seen_by.as_deref()),
                TrainingSeenBy::WorkersStarted
            );
        }

        /// Training is awaited (the scan runs faster) from a recorded loss
        /// until its resumption is recorded, or for at most the watch.
        #[test]
        fn training_is_awaited_until_the_resumption_is_recorded() {
            use super::super::RESUMPTION_WATCH;
            let mut r = Scans::default();
            assert!(!r.awaits(None, t(50)));
            let l = loss(1, 100);
            assert!(r.awaits(Some(&l), t(101)));
            // Given up after the watch.
            assert!(!r.awaits(Some(&l), t(100) + RESUMPTION_WATCH));
            let settled = t(105) + TRAINING_SETTLE;
            assert!(
                r.next(Some(&l), &up(7, 0, Some(105)), OWN, settled)
                    .is_some()
            );
            assert!(!r.awaits(Some(&l), settled));
            // A restart of the trainer no loss covers is awaited too.
            assert_eq!(r.next(Some(&l), &up(8, 200, None), OWN, t(200)), None);
            assert!(r.awaits(Some(&l), t(201)));
            assert!(
                r.next(Some(&l), &up(8, 200, Some(202)), OWN, t(204))
                    .is_some()
            );
            assert!(!r.awaits(Some(&l), t(204)));
        }

        #[test]
        fn workers_that_vanish_within_the_settle_time_are_not_training() {
            let mut r = Scans::default();
            let l = loss(1, 100);
            // Up at 105, gone before a settle time passed (a failed
            // rendezvous), then none, then new ones that die young too.
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(105)), OWN, t(105)), None);
            assert_eq!(r.next(Some(&l), &up(7, 0, None), OWN, t(107)), None);
            let young = t(110) + TRAINING_SETTLE - Duration::from_millis(1);
            assert_eq!(r.next(Some(&l), &up(7, 0, Some(110)), OWN, young), None);
            assert_eq!(r.next(Some(&l), &up(7, 0, None), OWN, t(112)), None);
            // No trainer at all: nothing.
            assert_eq!(r.next(Some(&l), &TrainerSeen::default(), OWN, t(113)), None);
            // Those that stay: the record, with their start.
            let record = r
                .next(Some(&l), &up(7, 0, Some(114)), OWN, t(116))
                .expect("the record");
            assert_eq!(record.training_since, Some(text(114)));
        }

        #[test]
        fn an_own_trainer_restart_without_a_recorded_loss_is_told_once() {
            let mut r = Scans::default();
            // The trainer as the sidecar first finds it: not a restart.
            assert_eq!(r.next(None, &up(7, 0, Some(10)), OWN, t(50)), None);
            // The store goes: the agent exits (no trainer), a new one starts
            // at 100, its workers at 103.
            assert_eq!(r.next(None, &TrainerSeen::default(), OWN, t(99)), None);
            assert_eq!(r.next(None, &up(9, 100, None), OWN, t(101)), None);
            assert_eq!(r.next(None, &up(9, 100, Some(103)), OWN, t(103)), None);
            let record = r
                .next(None, &up(9, 100, Some(103)), OWN, t(105))
                .expect("the record");
            assert_eq!(record.action, TRAINER_RESTARTED);
            assert!(!record.is_loss());
            assert_eq!(record.generation, 0);
            assert_eq!(record.lost_rank, 2);
            assert_eq!(record.at, text(100));
            assert_eq!(record.training_since, Some(text(103)));
            // Once per restart.
            assert_eq!(r.next(None, &up(9, 100, Some(103)), OWN, t(120)), None);
            // Replaced between two scans (never seen without a trainer):
            // a restart too.
            assert_eq!(r.next(None, &up(11, 130, Some(131)), OWN, t(131)), None);
            let record = r
                .next(None, &up(11, 130, Some(131)), OWN, t(133))
                .expect("the second record");
            assert_eq!(record.at, text(130));
            assert_eq!(record.training_since, Some(text(131)));
        }

        #[test]
        fn a_restart_within_a_recorded_loss_is_that_loss_resumed() {
            let mut r = Scans::default();
            let l = loss(3, 100);
            assert_eq!(r.next(None, &up(7, 0, Some(10)), OWN, t(50)), None);
            // The sidecar restarted the agent for the loss.
            let record = r
                .next(Some(&l), &up(8, 102, Some(104)), OWN, t(106))
                .expect("the loss's record");
            assert_eq!(record.generation, 3);
            assert_eq!(record.action, "restart-workers");
            // No second record for the same restart.
            assert_eq!(r.next(Some(&l), &up(8, 102, Some(104)), OWN, t(110)), None);
        }
    }
}
