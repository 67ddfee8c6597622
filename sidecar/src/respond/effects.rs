//! Carrying out a step: the storm guard, the `/proc` scan and the signals
//! (on a thread of their own, with a time limit), and the record of what
//! happened (log, metrics, `/status`, Event) from the real outcome.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::events::EventSink;
use crate::signal::{self, AgentMatcher, Limiter, Outcome, Plan, Role, Sent};
use crate::status::{ActionLabels, ActionStatus, Shared, SignalFailureLabels, rfc3339};

use super::episode::Episode;
use super::policy::{MAX_ATTEMPTS, goal_reached, retry_after};

pub use crate::signal::EXECUTE_TIMEOUT;

/// What the executor did for one step.
pub(super) struct Executed {
    pub(super) outcome: Outcome,
    pub(super) signals: Vec<Sent>,
    pub(super) detail: String,
    /// Why nothing was sent at all, for a failure without signals
    /// (`timeout`, `no-thread`): the `error` label of the failure metric.
    pub(super) unsent: Option<&'static str>,
}

/// What carries the steps out: `/proc` and signals, or, in tests, a script
/// of outcomes.
pub(super) enum Executor {
    Proc,
    #[cfg(test)]
    Scripted(std::collections::VecDeque<Executed>),
}

/// Carries out the steps of every episode and records them; the storm
/// guard spans the episodes.
pub(super) struct Effects {
    shared: Arc<Shared>,
    limiter: Limiter,
    matcher: AgentMatcher,
    pub(super) proc_root: PathBuf,
    events: EventSink,
    self_pid: i32,
    pub(super) executor: Executor,
}

impl Effects {
    pub(super) fn new(shared: Arc<Shared>, events: EventSink) -> Self {
        let config = &shared.config;
        Effects {
            limiter: Limiter::new(config.limits),
            matcher: AgentMatcher::new(config.agent_match.clone()),
            proc_root: PathBuf::from("/proc"),
            events,
            self_pid: std::process::id() as i32,
            shared,
            executor: Executor::Proc,
        }
    }

    /// Runs one killing step through the storm guard and the executor.
    /// Returns whether the step reached its goal (the episode may go on to
    /// its next step); a step that did not is tried again after
    /// [`retry_after`], at most [`MAX_ATTEMPTS`] times.
    pub(super) async fn act(&mut self, e: &mut Episode, plan: Plan, why: &str) -> bool {
        let ep = e.clone();
        let now = Instant::now();
        let config = &self.shared.config;
        // The second step of one episode (the agent after the workers) is
        // the same response, not a new one: the guard admits it.
        if !ep.admitted
            && let Err(skip) = self.limiter.check(ep.generation, now)
        {
            {
                let detail = match skip {
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
                e.closed = Some(format!("{why}; not done: {detail}"));
                self.record(
                    &ep,
                    plan,
                    Executed {
                        outcome: skip,
                        signals: Vec::new(),
                        detail,
                        unsent: None,
                    },
                );
                return false;
            }
        }
        let ticks = ep.loss_ticks.unwrap_or(u64::MAX);
        let executed = match &mut self.executor {
            Executor::Proc => {
                execute_off_loop(
                    self.proc_root.clone(),
                    self.matcher.clone(),
                    self.self_pid,
                    plan,
                    ticks,
                )
                .await
            }
            #[cfg(test)]
            Executor::Scripted(script) => script.pop_front().unwrap_or(Executed {
                outcome: Outcome::NoTrainer,
                signals: Vec::new(),
                detail: "the script is over".into(),
                unsent: None,
            }),
        };
        if matches!(
            executed.outcome,
            Outcome::Signalled | Outcome::Partial | Outcome::Failed
        ) && !ep.admitted
        {
            self.limiter.record(ep.generation, now);
        }
        let reached = goal_reached(plan, executed.outcome, &executed.signals);
        let detail = format!("{why}: {}", executed.detail);
        e.admitted = true;
        e.delivered.extend(
            executed
                .signals
                .iter()
                .filter(|s| s.error.is_none())
                .cloned(),
        );
        if reached {
            e.retry_at = None;
            e.stopped = e.stopped.max(plan.stops());
        } else {
            e.failed_attempts += 1;
            e.last_failure = Some(executed.detail.clone());
            if e.failed_attempts >= MAX_ATTEMPTS {
                e.retry_at = None;
                e.closed = Some(format!(
                    "{why}; FAILED {} times, given up: {}. The trainer from before the loss may still run: restart it by hand (kubectl delete pod, or kubectl exec to kill torchrun)",
                    e.failed_attempts, executed.detail
                ));
            } else {
                e.retry_at = Some(Instant::now() + retry_after(e.failed_attempts));
            }
        }
        self.record(e, plan, Executed { detail, ..executed });
        reached
    }

    /// `ep` as the last loss in `/status`.
    pub(super) fn publish(&self, ep: &Episode) {
        self.shared.status().last_loss = Some(ep.status());
    }

    /// Log, metrics, status and Event of one step.
    pub(super) fn record(&mut self, ep: &Episode, plan: Plan, executed: Executed) {
        let metrics = &self.shared.metrics;
        let Executed {
            outcome,
            signals,
            detail,
            unsent: executed_unsent,
        } = executed;
        let failures: Vec<Sent> = signals
            .iter()
            .filter(|s| s.error.is_some())
            .cloned()
            .collect();
        for f in &failures {
            metrics
                .signal_failures
                .get_or_create(&SignalFailureLabels {
                    role: f.role.as_str().into(),
                    error: signal::errno_label(f.error.as_deref().unwrap_or_default()).into(),
                })
                .inc();
        }
        // Nothing could be sent at all: a failure all the same.
        if let Some(why) = executed_unsent {
            metrics
                .signal_failures
                .get_or_create(&SignalFailureLabels {
                    role: if plan.needs(Role::Agent) {
                        Role::Agent
                    } else {
                        Role::Worker
                    }
                    .as_str()
                    .into(),
                    error: why.into(),
                })
                .inc();
        }
        let failed = matches!(outcome, Outcome::Failed | Outcome::Partial) || !failures.is_empty();
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
        let level_warn = failed || outcome == Outcome::Capped;
        let confirmation = ep.confirmation.map(|c| c.as_str());
        if level_warn {
            tracing::warn!(
                generation = ep.generation,
                rank = ep.rank,
                source = ep.source.as_str(),
                reason = ep.reason.as_str(),
                confirmation,
                action = plan.as_str(),
                result = outcome.as_str(),
                "peer lost: {}; {detail}",
                ep.detail
            );
        } else {
            tracing::info!(
                generation = ep.generation,
                rank = ep.rank,
                source = ep.source.as_str(),
                reason = ep.reason.as_str(),
                confirmation,
                action = plan.as_str(),
                result = outcome.as_str(),
                "peer lost: {}; {detail}",
                ep.detail
            );
        }
        let latency = ep.suspected_at.saturating_duration_since(ep.observable_at);
        let record = ActionStatus {
            generation: ep.generation,
            lost_rank: ep.rank,
            lost_by: ep.source.as_str(),
            reason: ep.reason.as_str(),
            confirmed_by: ep.confirmation,
            action: plan.as_str(),
            result: outcome.as_str(),
            at: rfc3339(SystemTime::now()),
            detection_latency_seconds: Some(latency.as_secs_f64()),
            signals,
            detail: detail.clone(),
        };
        {
            let mut s = self.shared.status();
            s.last_action = Some(record);
            if matches!(outcome, Outcome::Signalled | Outcome::Partial) {
                s.actions_total += 1;
            }
        }
        self.events
            .record_peer_loss(&trainwire_contract::peer_loss::PeerLossRecord {
                generation: ep.generation,
                lost_rank: ep.rank,
                confirmed_by: confirmation.unwrap_or_default().to_string(),
                action: plan.as_str().to_string(),
                result: outcome.as_str().to_string(),
                at: rfc3339(SystemTime::now()),
                suspected_at: Some(rfc3339(ep.observable_wall)),
                lost_by: Some(ep.source.as_str().to_string()),
                reason: Some(ep.reason.as_str().to_string()),
                last_answer_at: ep.last_answer_wall.map(rfc3339),
                ..Default::default()
            });
        let warning = !matches!(outcome, Outcome::Reported);
        self.events.publish(
            warning,
            if failed { "SignalFailed" } else { "PeerLost" },
            plan.as_str(),
            format!(
                "rank {} lost ({}, seen by {}, confirmed by {}): {}; action {}: {} ({detail})",
                ep.rank,
                ep.reason.as_str(),
                ep.source.as_str(),
                confirmation.unwrap_or("nothing yet"),
                ep.detail,
                plan.as_str(),
                outcome.as_str()
            ),
        );
    }
}

/// The `/proc` scan and the signals, on a thread of their own, with a time
/// limit.
async fn execute_off_loop(
    proc_root: PathBuf,
    matcher: AgentMatcher,
    self_pid: i32,
    plan: Plan,
    ticks: u64,
) -> Executed {
    let work = signal::on_own_thread("trainwire-act", move || {
        let procs = signal::scan(&proc_root);
        let trainers =
            signal::trainers_before(signal::find_trainers(&procs, &matcher, self_pid), ticks);
        if trainers.is_empty() {
            return Executed {
                outcome: Outcome::NoTrainer,
                signals: Vec::new(),
                detail: "no trainer agent that started before the loss is running".into(),
                unsent: None,
            };
        }
        let signals = signal::execute(plan, &trainers, ticks);
        let ok = signals.iter().filter(|s| s.error.is_none()).count();
        let list = |signals: &[Sent]| {
            signals
                .iter()
                .filter(|s| s.error.is_none())
                .map(|s| format!("{} {} {}", s.signal, s.role, s.pid))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if signals.is_empty() {
            Executed {
                outcome: Outcome::NoTrainer,
                signals,
                detail: "the agent has no workers that started before the loss".into(),
                unsent: None,
            }
        } else if ok == 0 {
            let first = signals
                .iter()
                .filter_map(|s| s.error.clone())
                .next()
                .unwrap_or_default();
            Executed {
                outcome: Outcome::Failed,
                signals,
                detail: format!("every signal failed: {first}"),
                unsent: None,
            }
        } else if ok < signals.len() {
            Executed {
                outcome: Outcome::Partial,
                detail: format!(
                    "{ok} of {} signals delivered ({})",
                    signals.len(),
                    list(&signals)
                ),
                signals,
                unsent: None,
            }
        } else {
            Executed {
                outcome: Outcome::Signalled,
                detail: format!(
                    "{ok} of {} signals delivered ({})",
                    signals.len(),
                    list(&signals)
                ),
                signals,
                unsent: None,
            }
        }
    });
    let failed = |detail: String, unsent: &'static str| Executed {
        outcome: Outcome::Failed,
        signals: Vec::new(),
        detail,
        unsent: Some(unsent),
    };
    let work = match work {
        Ok(work) => work,
        Err(e) => {
            return failed(
                format!("cannot start a thread to scan /proc: {e}"),
                "no-thread",
            );
        }
    };
    match tokio::time::timeout(EXECUTE_TIMEOUT, work).await {
        Ok(Ok(e)) => e,
        Ok(Err(_)) => failed("the /proc scan ended without a result".into(), "no-result"),
        Err(_) => failed(
            format!(
                "scanning /proc and signalling took over {}s; nothing was sent",
                EXECUTE_TIMEOUT.as_secs()
            ),
            "timeout",
        ),
    }
}
