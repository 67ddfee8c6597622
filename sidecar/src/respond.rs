//! The response to a lost peer: plan, guard against restart storms, signal
//! the local trainer, and record what happened (log, metrics, status, Event).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::events::EventSink;
use crate::peers::Loss;
use crate::signal::{self, AgentMatcher, Limiter, Outcome, Permission, Plan};
use crate::status::{
    ActionLabels, ActionStatus, LossLabels, Shared, SignalFailureLabels, SourceLabels, rfc3339,
};

/// Acts on losses, once per generation.
pub struct Responder {
    shared: Arc<Shared>,
    limiter: Limiter,
    matcher: AgentMatcher,
    proc_root: PathBuf,
    events: EventSink,
    self_pid: i32,
}

impl Responder {
    pub fn new(shared: Arc<Shared>, events: EventSink) -> Self {
        let config = &shared.config;
        Responder {
            limiter: Limiter::new(config.limits),
            matcher: AgentMatcher::new(config.agent_match.clone()),
            proc_root: PathBuf::from("/proc"),
            events,
            self_pid: std::process::id() as i32,
            shared,
        }
    }

    /// Handles one loss decided by the peers' state machine.
    pub fn handle(&mut self, loss: &Loss) -> Outcome {
        let config = &self.shared.config;
        let metrics = &self.shared.metrics;
        let now = Instant::now();
        metrics
            .peers_lost
            .get_or_create(&LossLabels {
                source: loss.source.as_str().into(),
                reason: loss.reason.as_str().into(),
            })
            .inc();
        let latency = loss.detection_latency();
        if let Some(l) = latency {
            metrics
                .detection_latency
                .get_or_create(&SourceLabels {
                    source: loss.source.as_str().into(),
                })
                .observe(l.as_secs_f64());
        }
        // The loss instant on the clock process start times use.
        let loss_ticks = signal::uptime_ticks(&self.proc_root).map(|t| {
            let ago = now.saturating_duration_since(loss.seen_at);
            t.saturating_sub((ago.as_secs_f64() * signal::TICKS_PER_SECOND as f64) as u64)
        });

        let plan = signal::plan(config.on_peer_loss, loss.rank, config.rdzv_host_rank);
        let mut signals = Vec::new();
        let (outcome, detail) = match plan {
            Plan::ReportOnly => {
                let why = if config.on_peer_loss == crate::config::OnPeerLoss::None {
                    "on-peer-loss is none: reporting only".to_string()
                } else {
                    match config.rdzv_host_rank {
                        Some(host) => format!(
                            "rank {} is not the rendezvous host (rank {host}): torchrun recovers by itself once a replacement joins",
                            loss.rank
                        ),
                        None => format!(
                            "rank {} lost; the rendezvous store is outside the world: torchrun recovers by itself once a replacement joins",
                            loss.rank
                        ),
                    }
                };
                (Outcome::Reported, why)
            }
            Plan::TermWorkers | Plan::KillAgent => match self.limiter.check(loss.generation, now) {
                Err(skip) => {
                    let why = match skip {
                        Outcome::Cooldown => format!(
                            "within the cooldown ({}s left)",
                            self.limiter.cooldown_left(now).as_secs()
                        ),
                        Outcome::Capped => format!(
                            "{} actions already within {}",
                            config.limits.max_actions,
                            crate::config::format_duration(config.limits.window)
                        ),
                        _ => "already acted on this loss".to_string(),
                    };
                    (skip, why)
                }
                Ok(()) => {
                    let ticks = loss_ticks.unwrap_or(u64::MAX);
                    let procs = signal::scan(&self.proc_root);
                    let trainers = signal::trainers_before(
                        signal::find_trainers(&procs, &self.matcher, self.self_pid),
                        ticks,
                    );
                    if trainers.is_empty() {
                        (
                            Outcome::NoTrainer,
                            "no trainer agent that started before the loss is running".to_string(),
                        )
                    } else {
                        signals = signal::execute(plan, &trainers, ticks);
                        self.limiter.record(loss.generation, now);
                        let ok = signals.iter().filter(|s| s.error.is_none()).count();
                        if signals.is_empty() {
                            (
                                Outcome::NoTrainer,
                                "the agent has no workers that started before the loss".to_string(),
                            )
                        } else if ok == 0 {
                            (
                                Outcome::Failed,
                                format!(
                                    "every signal failed: {}",
                                    signals
                                        .iter()
                                        .filter_map(|s| s.error.clone())
                                        .next()
                                        .unwrap_or_default()
                                ),
                            )
                        } else {
                            (
                                Outcome::Signalled,
                                format!(
                                    "{} of {} signals delivered ({})",
                                    ok,
                                    signals.len(),
                                    signals
                                        .iter()
                                        .map(|s| format!("{} {} {}", s.signal, s.role, s.pid))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                            )
                        }
                    }
                }
            },
        };
        let failures: Vec<signal::Sent> = signals
            .iter()
            .filter(|s| s.error.is_some())
            .cloned()
            .collect();
        for f in &failures {
            metrics
                .signal_failures
                .get_or_create(&SignalFailureLabels {
                    role: f.role.into(),
                    error: signal::errno_label(f.error.as_deref().unwrap_or_default()).into(),
                })
                .inc();
        }
        let detail = if failures.is_empty() || outcome == Outcome::Failed {
            detail
        } else {
            format!(
                "{detail}; FAILED: {}",
                failures
                    .iter()
                    .map(|f| format!(
                        "{} {} {}: {}",
                        f.signal,
                        f.role,
                        f.pid,
                        f.error.as_deref().unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        metrics
            .actions
            .get_or_create(&ActionLabels {
                action: plan.as_str().into(),
                result: outcome.as_str().into(),
            })
            .inc();
        // A signal that did not arrive is never silent: a warning line, a
        // Warning Event, the metric above and the status below.
        let level_warn =
            matches!(outcome, Outcome::Failed | Outcome::Capped) || !failures.is_empty();
        if level_warn {
            tracing::warn!(
                generation = loss.generation,
                rank = loss.rank,
                source = loss.source.as_str(),
                reason = loss.reason.as_str(),
                action = plan.as_str(),
                result = outcome.as_str(),
                "peer lost: {}; {detail}",
                loss.detail
            );
        } else {
            tracing::info!(
                generation = loss.generation,
                rank = loss.rank,
                source = loss.source.as_str(),
                reason = loss.reason.as_str(),
                action = plan.as_str(),
                result = outcome.as_str(),
                latency_ms = latency.map(|l| l.as_millis() as u64),
                "peer lost: {}; {detail}",
                loss.detail
            );
        }
        let record = ActionStatus {
            generation: loss.generation,
            lost_rank: loss.rank,
            lost_by: loss.source.as_str(),
            reason: loss.reason.as_str(),
            action: plan.as_str(),
            result: outcome.as_str(),
            at: rfc3339(SystemTime::now()),
            detection_latency_seconds: latency.map(|l| l.as_secs_f64()),
            signals,
            detail: detail.clone(),
        };
        {
            let mut s = self.shared.status();
            s.last_action = Some(record);
            if outcome == Outcome::Signalled {
                s.actions_total += 1;
            }
        }
        let warning = !matches!(outcome, Outcome::Reported);
        self.events.publish(
            warning,
            if failures.is_empty() {
                "PeerLost"
            } else {
                "SignalFailed"
            },
            plan.as_str(),
            format!(
                "rank {} lost ({}, seen by {}): {}; action {}: {} ({detail})",
                loss.rank,
                loss.reason.as_str(),
                loss.source.as_str(),
                loss.detail,
                plan.as_str(),
                outcome.as_str()
            ),
        );
        outcome
    }
}

/// How often [`watch_permission`] checks that the trainer may be signalled.
pub const PERMISSION_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// A `/proc` scan that takes longer than this is abandoned (and reported).
const PERMISSION_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks, while nothing is lost, that this sidecar may signal the trainer's
/// processes (`kill(pid, 0)`), so that a sidecar that could not act (another
/// user without `CAP_KILL`: the runtime drops added capabilities of a
/// non-root user at exec) says so at once, in the log, `/status`, the
/// `signal_permitted` metric and a Warning Event, instead of at the first
/// lost peer. The `/proc` scan runs on the blocking pool, off the thread that
/// answers heartbeats and probes.
pub async fn watch_permission(shared: Arc<Shared>, events: EventSink) {
    let matcher = AgentMatcher::new(shared.config.agent_match.clone());
    let self_pid = std::process::id() as i32;
    let mut last: Option<String> = None;
    let mut tick = tokio::time::interval(PERMISSION_CHECK_INTERVAL);
    loop {
        tick.tick().await;
        let matcher = matcher.clone();
        let scan = tokio::task::spawn_blocking(move || {
            let procs = signal::scan(std::path::Path::new("/proc"));
            signal::check_permission(&signal::find_trainers(&procs, &matcher, self_pid))
        });
        let (text, gauge, denied) = match tokio::time::timeout(PERMISSION_CHECK_TIMEOUT, scan).await
        {
            Ok(Ok(Permission::NoTrainer)) => ("no trainer running".to_string(), -1, false),
            Ok(Ok(Permission::Permitted { processes })) => (
                format!("permitted: may signal the trainer's {processes} processes"),
                1,
                false,
            ),
            Ok(Ok(Permission::Denied { pid, role, error })) => (
                format!(
                    "denied: signalling the trainer's {role} (pid {pid}) fails with {error}; the sidecar must run as the trainer's user, or as root with CAP_KILL (the webhook sets this from the trainer's runAsUser)"
                ),
                0,
                true,
            ),
            Ok(Err(e)) => (format!("unknown: the check failed: {e}"), -1, false),
            Err(_) => (
                format!(
                    "unknown: scanning /proc took over {}s",
                    PERMISSION_CHECK_TIMEOUT.as_secs()
                ),
                -1,
                false,
            ),
        };
        shared.metrics.signal_permitted.set(gauge);
        shared.status().signal_permission = Some(text.clone());
        let changed = last.as_deref().map(|l| l.split(':').next()) != Some(text.split(':').next());
        if changed {
            if denied {
                tracing::warn!(result = "denied", "signal permission: {text}");
                events.publish(
                    true,
                    "CannotSignalTrainer",
                    "check-permission",
                    text.clone(),
                );
            } else {
                tracing::info!("signal permission: {text}");
            }
        }
        last = Some(text);
    }
}
