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

/// How often [`watch_permission`] checks that the trainer may be signalled.
pub const PERMISSION_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How often, in a world with hot spares (whether this pod trains or waits
/// as a spare is shown within this).
pub const SPARE_CHECK_INTERVAL: Duration = Duration::from_secs(2);
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
    let mut last: Option<PermissionState> = None;
    let mut role = Role::default();
    let mut resumed = Resumed::default();
    let mut tick = tokio::time::interval(if shared.config.spares > 0 {
        SPARE_CHECK_INTERVAL
    } else {
        PERMISSION_CHECK_INTERVAL
    });
    type Found = (Permission, signal::Activity, Option<WorkersUp>);
    let mut running: Option<tokio::sync::oneshot::Receiver<Found>> = None;
    loop {
        tick.tick().await;
        let pending = match running.take() {
            Some(pending) => pending,
            None => {
                let matcher = matcher.clone();
                match signal::on_own_thread("trainwire-check", move || {
                    let root = std::path::Path::new("/proc");
                    let procs = signal::scan(root);
                    let trainers = signal::find_trainers(&procs, &matcher, self_pid);
                    let up = match (
                        signal::newest_worker_start(&trainers),
                        signal::uptime_ticks(root),
                    ) {
                        (Some(start), Some(uptime)) => Some(WorkersUp::at(start, uptime)),
                        _ => None,
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
        let found = tokio::time::timeout(PERMISSION_CHECK_TIMEOUT, &mut pending).await;
        if let Ok(Ok((_, activity, up))) = &found {
            role.observe(&shared, &events, *activity);
            if let Some(up) = up {
                resumed.observe(&shared, &events, *up, SystemTime::now());
            }
        }
        let found = found.map(|r| r.map(|(permission, _, _)| permission));
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

/// The trainer's newest worker: how long ago it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkersUp {
    /// Its age, from `/proc` (start ticks against the uptime).
    pub age: Duration,
}

impl WorkersUp {
    fn at(start_ticks: u64, uptime_ticks: u64) -> WorkersUp {
        let ticks = uptime_ticks.saturating_sub(start_ticks);
        WorkersUp {
            age: Duration::from_millis(ticks.saturating_mul(1000) / signal::TICKS_PER_SECOND),
        }
    }
}

/// After a loss this sidecar recorded, the first time the trainer's
/// workers started after it and are still there a settle time later: adds
/// their start time as `trainingSince` to the record on this pod, from
/// which the world controller takes `resumedAt`. Once per loss generation.
#[derive(Debug, Default)]
pub struct Resumed {
    /// The generation whose resumption was recorded.
    recorded: u64,
}

impl Resumed {
    /// The record to write, if the workers show training again.
    pub fn observe(
        &mut self,
        shared: &Shared,
        events: &EventSink,
        up: WorkersUp,
        now: SystemTime,
    ) -> Option<trainwire_contract::peer_loss::PeerLossRecord> {
        use trainwire_contract::peer_loss::{PeerLossRecord, TRAINING_SETTLE};
        let status = shared.status();
        let action = status.last_action.as_ref()?;
        if action.generation <= self.recorded || up.age < TRAINING_SETTLE {
            return None;
        }
        let loss = status
            .last_loss
            .as_ref()
            .filter(|l| l.generation == action.generation)
            .and_then(|l| l.suspected_at.parse::<k8s_openapi::jiff::Timestamp>().ok())?;
        let started = now.checked_sub(up.age)?;
        let started_at = k8s_openapi::jiff::Timestamp::try_from(started).ok()?;
        if started_at < loss {
            return None;
        }
        let record = PeerLossRecord {
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
            training_since: Some(rfc3339(started)),
            torch_rank: None,
        };
        drop(status);
        tracing::info!(
            generation = record.generation,
            since = record.training_since.as_deref().unwrap_or_default(),
            "training runs again: the trainer's workers started after the loss and stayed up"
        );
        events.record_peer_loss(&record);
        self.recorded = record.generation;
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
}

impl Role {
    fn observe(&mut self, shared: &Shared, events: &EventSink, now: signal::Activity) {
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
        let took_over = spares > 0
            && self.last == Some(signal::Activity::Waiting)
            && matches!(now, signal::Activity::Training { .. })
            && generation > self.took_over;
        let mut status = shared.status();
        status.trainer = Some(text);
        if took_over {
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
                    at: rfc3339(SystemTime::now()),
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
        role.observe(&shared, &events, signal::Activity::Waiting);
        role.observe(&shared, &events, training);
        assert_eq!(shared.metrics.spare_takeovers.get(), 0);
        // It waits as the spare; a peer is lost; it trains.
        role.observe(&shared, &events, signal::Activity::Waiting);
        let mut peers = Peers::with_spares(config.nnodes, 1, 1, 3, Instant::now());
        let at = Instant::now();
        for evidence in [
            Evidence::Alive(Identity {
                pod: "train-0".into(),
                uid: "new".into(),
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
                at,
            });
        }
        shared.publish_peers(&peers);
        role.observe(&shared, &events, training);
        role.observe(&shared, &events, training);
        assert_eq!(shared.metrics.spare_takeovers.get(), 1);
        assert!(
            shared
                .status()
                .trainer
                .as_deref()
                .is_some_and(|t| t.starts_with("training")),
        );
        let metrics = shared.encode_metrics();
        assert!(
            metrics.contains(r#"trainwire_sidecar_trainer{state="training"} 1"#),
            "{metrics}"
        );
    }
}
