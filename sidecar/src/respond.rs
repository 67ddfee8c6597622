//! The response to a lost peer: plan, guard against restart storms, signal
//! the local trainer, and record what happened (log, metrics, status, Event).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::events::EventSink;
use crate::peers::Loss;
use crate::signal::{self, AgentMatcher, Limiter, Outcome, Plan};
use crate::status::{ActionLabels, ActionStatus, LossLabels, Shared, SourceLabels, rfc3339};

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
        metrics
            .actions
            .get_or_create(&ActionLabels {
                action: plan.as_str().into(),
                result: outcome.as_str().into(),
            })
            .inc();
        let level_warn = matches!(outcome, Outcome::Failed | Outcome::Capped);
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
            "PeerLost",
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
