//! Whether the world makes progress, and what to do when it does not (a
//! hung world: a worker stopped, stuck in uninterruptible I/O, a deadlock,
//! while every process is alive and every pod Ready).
//!
//! Each sidecar sees its own pod only: the bytes its workers' collective
//! connections carried ([`crate::collective::scan`], the kernel's socket
//! diagnostics), the workers' process states (`/proc/<pid>/stat`, readable
//! by anyone: `T` stopped, `D` uninterruptible for long, `Z` a zombie) and
//! the newest complete checkpoint. From these [`Local`] keeps when this
//! pod last moved. The world is judged by [`judge`], a pure function of
//! every rank's report: stalled when no rank that can be read moved for the
//! stall timeout, never while one did. A sidecar whose own pod has not
//! moved for the timeout asks its peers (`GET /progress`, answered by
//! every sidecar) and acts only when none of them moved either; every
//! sidecar of a hung world does so within one scan of the others, each
//! restarting its own workers ([`StallAction::RestartWorkers`]), after
//! which torchrun re-forms the world from the newest checkpoint.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use crate::stall::{ProgressStatus, RankProgress, StallRecord, StuckWorker};

use crate::collective::Collective;
use crate::config::ActionLimits;
use crate::events::EventSink;
use crate::signal::{self, AgentMatcher, Limiter, Outcome, Plan, parse_state};
use crate::status::{Shared, rfc3339};
use trainwire_contract::StallAction;

/// How long a worker stays in uninterruptible sleep (`D`) before it is
/// shown as stuck (a read from a healthy disk takes milliseconds).
pub const STUCK_AFTER: Duration = Duration::from_secs(10);
/// The longest time between two scans.
const MAX_SCAN_EVERY: Duration = Duration::from_secs(10);
/// The shortest.
const MIN_SCAN_EVERY: Duration = Duration::from_secs(1);
/// The most peers asked at once.
const MAX_ASKED_AT_ONCE: usize = 32;
/// How long NCCL's RAS service may take to answer (it asks every rank).
const RAS_TIMEOUT: Duration = Duration::from_secs(3);
/// How long after it did not answer it is asked again.
const RAS_RETRY: Duration = Duration::from_secs(60);
/// A `/proc` scan that takes longer is abandoned for this round.
const SCAN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the progress is scanned for a stall timeout: a tenth of it,
/// within 1 s and 10 s (a stall is found within the timeout plus this and
/// the peers' answers).
pub fn scan_every(timeout: Duration) -> Duration {
    (timeout / 10).clamp(MIN_SCAN_EVERY, MAX_SCAN_EVERY)
}

/// The state letters of `pids` (absent when gone).
pub fn states(proc_root: &Path, pids: &[i32]) -> Vec<(i32, char)> {
    pids.iter()
        .filter_map(|&pid| {
            let stat =
                std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
            Some((pid, parse_state(&stat)?))
        })
        .collect()
}

/// What one scan saw of this pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// The workers' start (newest, in clock ticks): another value is
    /// another set of workers.
    pub workers: Option<u64>,
    /// When they started.
    pub started: Option<SystemTime>,
    /// The bytes each of their collective connections carried; `None` when
    /// unreadable or not formed.
    pub traffic: Option<crate::collective::Traffic>,
    /// Their process states.
    pub states: Vec<(i32, char)>,
    /// The collective operations NCCL's RAS service counts for the job
    /// ([`crate::ras`]), when it answers: they move where no TCP byte does.
    pub collectives: Option<u64>,
    /// When the newest complete checkpoint was written.
    pub checkpoint: Option<SystemTime>,
}

/// When this pod last moved, from scan to scan.
#[derive(Debug, Default)]
pub struct Local {
    workers: Option<u64>,
    last: Option<crate::collective::Traffic>,
    last_collectives: Option<u64>,
    moved_at: Option<SystemTime>,
    /// Since when each worker has been in a state other than running.
    odd: BTreeMap<i32, (char, SystemTime)>,
}

/// This pod as [`Local`] sees it after a scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Own {
    /// When it last moved: new bytes on a collective connection, the
    /// workers' start, a new checkpoint. `None`: nothing to judge (no
    /// workers, or their traffic cannot be read yet).
    pub moved_at: Option<SystemTime>,
    pub stuck: Vec<StuckWorker>,
    /// Why there is nothing to judge.
    pub unknown: Option<&'static str>,
}

impl Local {
    /// Follows the workers through one scan at `now`.
    pub fn observe(&mut self, s: &Sample, now: SystemTime) -> Own {
        let Some(workers) = s.workers else {
            *self = Local::default();
            return Own {
                unknown: Some("no workers run"),
                ..Own::default()
            };
        };
        if self.workers != Some(workers) {
            *self = Local {
                workers: Some(workers),
                moved_at: Some(s.started.unwrap_or(now).min(now)),
                ..Local::default()
            };
        }
        if let Some(carried) = &s.traffic {
            let grew = match &self.last {
                None => false,
                Some(before) => carried.iter().any(|(inode, c)| {
                    before
                        .get(inode)
                        .map_or(c.total() > 0, |b| c.total() > b.total())
                }),
            };
            if grew {
                self.moved_at = Some(now);
            }
            self.last = Some(carried.clone());
        }
        if let Some(count) = s.collectives {
            if self.last_collectives.is_some_and(|before| count > before) {
                self.moved_at = Some(now);
            }
            self.last_collectives = Some(count);
        }
        if let Some(written) = s.checkpoint.filter(|w| *w <= now)
            && self.moved_at.is_some_and(|m| written > m)
        {
            self.moved_at = Some(written);
        }
        self.odd
            .retain(|pid, (state, _)| s.states.contains(&(*pid, *state)));
        for &(pid, state) in &s.states {
            if matches!(state, 'T' | 't' | 'D' | 'Z') {
                self.odd.entry(pid).or_insert((state, now));
            }
        }
        let stuck = self
            .odd
            .iter()
            .filter(|(_, (state, since))| {
                *state != 'D' || now.duration_since(*since).is_ok_and(|d| d >= STUCK_AFTER)
            })
            .map(|(pid, (state, since))| StuckWorker {
                pid: *pid,
                state: match state {
                    'D' => "uninterruptible",
                    'Z' => "zombie",
                    _ => "stopped",
                }
                .to_string(),
                since: rfc3339(*since),
            })
            .collect();
        if self.last.is_none() && self.last_collectives.is_none() {
            return Own {
                moved_at: None,
                stuck,
                unknown: Some(
                    "the workers' collective traffic is not readable (not formed yet, their sockets not readable by this user, or no socket diagnostics)",
                ),
            };
        }
        Own {
            moved_at: self.moved_at,
            stuck,
            unknown: None,
        }
    }
}

/// The world's progress, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A rank moved within the timeout (the one that moved last).
    Moving { rank: u32, idle: Duration },
    /// No rank's progress can be told.
    Unknown,
    /// No rank that can be read moved for the timeout: the shortest idle
    /// time among them, and the ranks with stuck workers.
    Stalled {
        idle: Duration,
        stuck: Vec<(u32, StuckWorker)>,
    },
}

/// The world's verdict from every rank's report (`ranks`), for `timeout`.
/// Pure. Never stalled while a rank moved within the timeout; always
/// stalled when every rank that can be read has been idle past it (and
/// there is one).
pub fn judge(timeout: Duration, ranks: &[RankProgress]) -> Verdict {
    let known = ranks.iter().filter_map(|r| Some((r.rank, r.idle()?)));
    let Some((rank, idle)) = known.min_by_key(|(_, idle)| *idle) else {
        return Verdict::Unknown;
    };
    if idle < timeout {
        return Verdict::Moving { rank, idle };
    }
    Verdict::Stalled {
        idle,
        stuck: ranks
            .iter()
            .flat_map(|r| r.stuck.iter().map(|s| (r.rank, s.clone())))
            .collect(),
    }
}

/// How long the longest-stopped of `stuck` (state `stopped`) has been so.
fn stopped_for(stuck: &[StuckWorker], now: SystemTime) -> Option<Duration> {
    stuck
        .iter()
        .filter(|w| w.state == "stopped")
        .filter_map(|w| w.since.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|since| {
            now.duration_since(SystemTime::from(since))
                .unwrap_or_default()
        })
        .max()
}

/// What `GET /progress` answers: this pod's [`RankProgress`].
pub fn answer(shared: &Shared) -> RankProgress {
    let now = SystemTime::now();
    let status = shared.status();
    let p = status.progress.as_ref();
    let moved = p
        .and_then(|p| p.last_moved_at.as_deref())
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(SystemTime::from);
    RankProgress {
        rank: shared.config.node_rank,
        idle_ms: moved.map(|m| {
            u64::try_from(now.duration_since(m).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
        }),
        stuck: p.map(|p| p.stuck.clone()).unwrap_or_default(),
        unknown: match p {
            None => Some("not scanned yet".into()),
            Some(p) => p.unknown.clone(),
        },
    }
}

/// Scans this pod's progress, asks the peers when it stands still, and acts
/// on a stalled world. Runs until the sidecar stops; does nothing when
/// `TRAINWIRE_STALL_TIMEOUT=off`.
pub async fn run(shared: Arc<Shared>, events: EventSink, names: crate::dns::Resolver) {
    let config = shared.config.clone();
    let Some(timeout) = config.stall_timeout else {
        return;
    };
    let every = scan_every(timeout);
    let matcher = AgentMatcher::new(config.agent_match.clone());
    // Neither the store's connections nor the sidecar's own are the
    // collective's (as for the training scan, crate::permission).
    let ports = crate::collective::Ports {
        store: config.rdzv_port.into_iter().collect(),
        own: vec![config.health_port],
    };
    let self_pid = std::process::id() as i32;
    let http = client(config.heartbeat.timeout, names);
    let mut local = Local::default();
    let mut limiter = Limiter::new(stall_limits(config.limits, timeout));
    let mut stalls: u64 = 0;
    let mut acted = Acted::default();
    let mut ras_next: Option<std::time::Instant> = None;
    {
        let mut s = shared.status();
        s.progress = Some(ProgressStatus {
            stall_timeout: crate::config::format_duration(timeout),
            on_stall: config.on_stall.as_str(),
            world: "unknown",
            ..ProgressStatus::default()
        });
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let matcher = matcher.clone();
        let ports = ports.clone();
        let peers = shared.peer_addresses();
        let Ok(pending) = signal::on_own_thread("trainwire-progress", move || {
            sample(Path::new("/proc"), &matcher, self_pid, &ports, &peers)
        }) else {
            continue;
        };
        let Ok(Ok(mut sample)) = tokio::time::timeout(SCAN_TIMEOUT, pending).await else {
            continue;
        };
        sample.checkpoint = newest_checkpoint(&shared);
        // NCCL's RAS service, when the traffic cannot be read (collectives
        // over RDMA) and it listens in the pod (not asked again for a minute
        // after it did not). Its status is gathered from every rank of the
        // job, so it is not asked where the traffic says enough.
        if sample.workers.is_some()
            && sample.traffic.is_none()
            && ras_next.is_none_or(|n| std::time::Instant::now() >= n)
        {
            match crate::ras::status(crate::ras::DEFAULT_ADDR, RAS_TIMEOUT).await {
                Ok(status) => {
                    sample.collectives = Some(status.collectives());
                    ras_next = None;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no NCCL RAS answer");
                    ras_next = Some(std::time::Instant::now() + RAS_RETRY);
                }
            }
        }
        let now = SystemTime::now();
        let own = local.observe(&sample, now);
        let idle = own
            .moved_at
            .map(|m| now.duration_since(m).unwrap_or_default());
        shared
            .metrics
            .progress_idle
            .set(idle.map_or(0.0, |d| d.as_secs_f64()));
        let mut world = match idle {
            None => "unknown",
            Some(i) if i < timeout => "moving",
            Some(_) => "local-idle",
        };
        {
            let mut s = shared.status();
            if let Some(p) = s.progress.as_mut() {
                p.last_moved_at = own.moved_at.map(rfc3339);
                p.idle_seconds = idle.map(|d| d.as_secs_f64());
                p.unknown = own.unknown.map(str::to_string);
                p.stuck = own.stuck.clone();
                p.world = world;
            }
        }
        // A local worker stopped (SIGSTOP, `T`) for the timeout stalls the
        // world whatever the traffic says: bytes still reach a stopped
        // worker's sockets (a peer's restart closes its connections), and
        // a peer whose workers restarted first moves again while this one
        // stays stopped, which torch's agent then waits 30 s to kill.
        let stopped = stopped_for(&own.stuck, now).filter(|d| *d >= timeout);
        let Some(idle) = idle.filter(|i| *i >= timeout).or(stopped) else {
            continue;
        };
        if acted.settled(sample.workers, std::time::Instant::now()) {
            continue;
        }
        // This pod stood still for the timeout: ask every peer.
        let mut ranks = vec![RankProgress {
            rank: config.node_rank,
            idle_ms: Some(u64::try_from(idle.as_millis()).unwrap_or(u64::MAX)),
            stuck: own.stuck.clone(),
            unknown: None,
        }];
        ranks.extend(ask_peers(&http, &config).await);
        let verdict = match stopped {
            Some(stopped) => Verdict::Stalled {
                idle: stopped,
                stuck: own
                    .stuck
                    .iter()
                    .map(|w| (config.node_rank, w.clone()))
                    .collect(),
            },
            None => judge(timeout, &ranks),
        };
        let Verdict::Stalled {
            idle: world_idle,
            stuck,
        } = verdict
        else {
            continue;
        };
        world = "stalled";
        stalls += 1;
        acted.done(sample.workers);
        let shown: Vec<String> = ranks
            .iter()
            .map(|r| match (&r.idle_ms, &r.unknown) {
                (Some(ms), _) => format!("rank {} idle {}s", r.rank, ms / 1000),
                (None, Some(why)) => format!("rank {} unknown ({why})", r.rank),
                (None, None) => format!("rank {} unknown", r.rank),
            })
            .collect();
        let stuck_text: Vec<String> = stuck
            .iter()
            .map(|(rank, s)| format!("rank {rank} worker {} {} since {}", s.pid, s.state, s.since))
            .collect();
        let (action, result, detail) = match config.on_stall {
            StallAction::None => (
                "none",
                Outcome::Reported,
                "report only (on-stall: none)".to_string(),
            ),
            StallAction::RestartWorkers => match limiter.check(stalls, std::time::Instant::now()) {
                Err(skip) => {
                    let now = std::time::Instant::now();
                    let detail = if skip == Outcome::Cooldown {
                        let left = limiter.cooldown_left(now);
                        acted.retry(sample.workers, now + left);
                        format!(
                            "not done yet: cooldown, asked again in {}s if still stalled",
                            left.as_secs_f64().ceil()
                        )
                    } else {
                        format!("not done: {}", skip.as_str())
                    };
                    ("restart-workers", skip, detail)
                }
                Ok(()) => {
                    let (outcome, detail) = restart_workers(&config).await;
                    if matches!(outcome, Outcome::Signalled | Outcome::Partial) {
                        limiter.record(stalls, std::time::Instant::now());
                    }
                    ("restart-workers", outcome, detail)
                }
            },
        };
        let note = format!(
            "the world is stalled: no rank's collective traffic moved for {}s (stall-timeout {}); {}{}; action {action}: {} ({detail})",
            world_idle.as_secs(),
            crate::config::format_duration(timeout),
            shown.join(", "),
            if stuck_text.is_empty() {
                String::new()
            } else {
                format!("; stuck: {}", stuck_text.join(", "))
            },
            result.as_str(),
        );
        tracing::warn!(action, result = result.as_str(), "{note}");
        events.publish(true, "WorldStalled", action, note.clone());
        events.record_stall(&trainwire_contract::stall::StallRecord {
            at: rfc3339(now),
            ranks: ranks_shown(&ranks, timeout),
            action: action.to_string(),
            result: result.as_str().to_string(),
            stuck: u32::try_from(stuck.len()).unwrap_or(u32::MAX),
        });
        shared
            .metrics
            .stalls
            .get_or_create(&crate::status::ActionLabels {
                action: action.into(),
                result: result.as_str().into(),
            })
            .inc();
        let mut s = shared.status();
        if let Some(p) = s.progress.as_mut() {
            p.world = world;
            p.stalls_total = stalls;
            p.last_stall = Some(StallRecord {
                at: rfc3339(now),
                idle_seconds: world_idle.as_secs_f64(),
                ranks,
                action,
                result: result.as_str(),
                detail,
            });
        }
    }
}

/// The storm guard's limits for stalls. A stall of restarted workers is
/// found no sooner than the stall timeout after they started (their start
/// counts as progress), so the timeout already spaces two restarts for
/// stalls; a longer cooldown would only leave a second, separate hang
/// unanswered (found, then refused) while the cap per window still stops a
/// world that hangs again and again.
pub fn stall_limits(limits: ActionLimits, timeout: Duration) -> ActionLimits {
    ActionLimits {
        cooldown: limits.cooldown.min(timeout),
        ..limits
    }
}

/// Which set of workers (their start) the last stall verdict was about,
/// and until when it stands: a stall is acted on once per set of workers,
/// but one refused for the cooldown is judged again when the cooldown ends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Acted(Option<(Option<u64>, Option<std::time::Instant>)>);

impl Acted {
    /// Whether the last verdict about `workers` still stands at `now` (no
    /// new one is wanted).
    pub fn settled(&self, workers: Option<u64>, now: std::time::Instant) -> bool {
        match self.0 {
            Some((judged, until)) if judged == workers => until.is_none_or(|at| now < at),
            _ => false,
        }
    }

    /// A verdict about `workers` fell, for good.
    pub fn done(&mut self, workers: Option<u64>) {
        self.0 = Some((workers, None));
    }

    /// A verdict about `workers` fell but could not be acted on before `at`.
    pub fn retry(&mut self, workers: Option<u64>, at: std::time::Instant) {
        self.0 = Some((workers, Some(at)));
    }
}

/// Which ranks showed what, for the pod record and the world status: the
/// ranks with stuck workers by name (at most
/// [`MAX_RANKS_NAMED`](trainwire_contract::stall::MAX_RANKS_NAMED)), then
/// how many were idle and how many could not be told.
pub fn ranks_shown(ranks: &[RankProgress], timeout: Duration) -> String {
    use trainwire_contract::stall::MAX_RANKS_NAMED;
    let mut sorted: Vec<&RankProgress> = ranks.iter().collect();
    sorted.sort_by_key(|r| r.rank);
    let stuck: Vec<String> = sorted
        .iter()
        .flat_map(|r| {
            r.stuck
                .iter()
                .map(move |s| format!("rank {} worker {} {}", r.rank, s.pid, s.state))
        })
        .collect();
    let mut parts: Vec<String> = stuck.iter().take(MAX_RANKS_NAMED).cloned().collect();
    if stuck.len() > MAX_RANKS_NAMED {
        parts.push(format!(
            "{} more stuck workers",
            stuck.len() - MAX_RANKS_NAMED
        ));
    }
    let idle = sorted.iter().filter(|r| r.idle_ms.is_some()).count();
    let unknown = sorted.len() - idle;
    parts.push(format!(
        "{idle} {} idle {} or more",
        if idle == 1 { "rank" } else { "ranks" },
        crate::config::format_duration(timeout)
    ));
    if unknown > 0 {
        parts.push(format!("{unknown} unknown"));
    }
    parts.join("; ")
}

/// One scan: the trainer's workers, their collective's traffic and states.
fn sample(
    root: &Path,
    matcher: &AgentMatcher,
    self_pid: i32,
    ports: &crate::collective::Ports,
    peers: &std::collections::BTreeSet<std::net::IpAddr>,
) -> Sample {
    let procs = signal::scan(root);
    let trainers = signal::find_trainers(&procs, matcher, self_pid);
    // Forkserver children too (their parent is the agent's forkserver).
    let scanned = crate::collective::Workers::of(&trainers, None);
    let workers = scanned.pids.clone();
    let start = signal::newest_worker_start(&trainers);
    let started = start.and_then(|s| {
        let ticks = signal::uptime_ticks(root)?.saturating_sub(s);
        SystemTime::now().checked_sub(Duration::from_millis(
            ticks.saturating_mul(1000) / signal::TICKS_PER_SECOND,
        ))
    });
    let traffic = match crate::collective::scan(root, &scanned, ports, peers).0 {
        Collective::Formed { traffic } => traffic,
        _ => None,
    };
    Sample {
        workers: start,
        started,
        traffic,
        states: states(root, &workers),
        checkpoint: None,
        collectives: None,
    }
}

/// When the newest complete checkpoint was written, from `/status`.
fn newest_checkpoint(shared: &Shared) -> Option<SystemTime> {
    let s = shared.status();
    let text = s.checkpoint.as_ref()?.modified.as_deref()?;
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(SystemTime::from)
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector<crate::dns::Resolver>,
    http_body_util::Empty<bytes::Bytes>,
>;

fn client(timeout: Duration, resolver: crate::dns::Resolver) -> HttpClient {
    let mut connector =
        hyper_util::client::legacy::connect::HttpConnector::new_with_resolver(resolver);
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeout));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .build(connector)
}

/// Every other pod's progress (`GET /progress`), [`MAX_ASKED_AT_ONCE`] at
/// a time, each within the heartbeat timeout; a peer that does not answer
/// is unknown.
async fn ask_peers(http: &HttpClient, config: &crate::config::Config) -> Vec<RankProgress> {
    use futures::StreamExt;
    let limit = config.heartbeat.timeout;
    let ranks = (0..config.pods()).filter(|r| *r != config.node_rank);
    futures::stream::iter(ranks)
        .map(|rank| async move {
            let unknown = |why: String| RankProgress {
                rank,
                idle_ms: None,
                stuck: Vec::new(),
                unknown: Some(why),
            };
            let Some(url) =
                crate::peers::url_of(config, rank).map(|u| u.replace("/heartbeat", "/progress"))
            else {
                return unknown("no peer host pattern".into());
            };
            match tokio::time::timeout(limit, fetch(http, &url)).await {
                Ok(Ok(p)) if p.rank == rank => p,
                Ok(Ok(p)) => unknown(format!("answered as rank {}", p.rank)),
                Ok(Err(e)) => unknown(e),
                Err(_) => unknown(format!("no answer within {}ms", limit.as_millis())),
            }
        })
        .buffer_unordered(MAX_ASKED_AT_ONCE)
        .collect()
        .await
}

async fn fetch(http: &HttpClient, url: &str) -> Result<RankProgress, String> {
    use http_body_util::BodyExt;
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
    let resp = http.get(uri).await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let body = http_body_util::Limited::new(resp.into_body(), 256 * 1024)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| format!("not a progress answer: {e}"))
}

/// How long workers signalled for a stall may take to end before they are
/// killed: a worker whose system call does not return (a hung volume
/// holds it in a wait only SIGKILL ends) or that ignores SIGTERM would
/// otherwise hold torchrun's restart for its own 30 s.
pub const KILL_AFTER: Duration = Duration::from_secs(5);

/// The workers among `workers` still there (same process, same start, not
/// a zombie) after `grace`, SIGKILLed; what was sent.
pub fn kill_leftovers(
    root: &Path,
    workers: &[signal::Process],
    grace: Duration,
) -> Vec<signal::Sent> {
    let alive = |w: &signal::Process| {
        std::fs::read_to_string(root.join(w.pid.to_string()).join("stat"))
            .ok()
            .is_some_and(|stat| {
                signal::parse_stat(&stat).is_some_and(|(_, start)| start == w.start_ticks)
                    && parse_state(&stat).is_some_and(|s| s != 'Z' && s != 'X')
            })
    };
    let deadline = std::time::Instant::now() + grace;
    while workers.iter().any(alive) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    workers
        .iter()
        .filter(|w| alive(w))
        .map(|w| {
            let error = match nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(w.pid),
                nix::sys::signal::Signal::SIGKILL,
            ) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => None,
                Err(e) => Some(e.to_string()),
            };
            signal::Sent {
                pid: w.pid,
                role: signal::Role::Worker,
                signal: "SIGKILL",
                error,
            }
        })
        .collect()
}

/// Asks each worker for its Python stacks
/// ([`STACKS_SIGNAL`](trainwire_contract::stall::STACKS_SIGNAL), SIGPWR, which
/// trainwire's `sitecustomize` registers with `faulthandler`), resumes a
/// stopped one so that it writes them now, and gives them
/// [`STACKS_WAIT`](trainwire_contract::stall::STACKS_WAIT) to do so. A
/// worker in an uninterruptible wait writes nothing; one without the
/// registration ends (the signal's default action, no core dump), as its
/// SIGTERM would have made it.
pub fn ask_for_stacks(workers: &[signal::Process]) -> Vec<signal::Sent> {
    use nix::sys::signal::Signal;
    use trainwire_contract::stall::{STACKS_SIGNAL, STACKS_WAIT};
    let Ok(stacks) = STACKS_SIGNAL.parse::<Signal>() else {
        return Vec::new();
    };
    let sent: Vec<signal::Sent> = workers
        .iter()
        .map(|w| {
            let pid = nix::unistd::Pid::from_raw(w.pid);
            let error = match nix::sys::signal::kill(pid, stacks) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => None,
                Err(e) => Some(e.to_string()),
            };
            let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
            signal::Sent {
                pid: w.pid,
                role: signal::Role::Worker,
                signal: stacks.as_str(),
                error,
            }
        })
        .collect();
    if !sent.is_empty() {
        std::thread::sleep(STACKS_WAIT);
    }
    sent
}

/// The restart-workers effect for a stall: where the trainer has
/// trainwire's Python files (the rendezvous handler's channel is
/// configured), first each worker's Python stacks into the trainer's log
/// ([`ask_for_stacks`]); then SIGTERM the workers ([`Plan::TermWorkers`])
/// and SIGCONT them, so that a stopped worker receives its SIGTERM now
/// rather than when torchrun's own stop gives up waiting (30 s) and kills
/// it; those still there after [`KILL_AFTER`] are killed. On a thread of
/// its own, with a time limit.
async fn restart_workers(config: &crate::config::Config) -> (Outcome, String) {
    let matcher = AgentMatcher::new(config.agent_match.clone());
    let self_pid = std::process::id() as i32;
    let stacks = config.rendezvous_dir.is_some();
    let work = signal::on_own_thread("trainwire-stall", move || {
        let procs = signal::scan(Path::new("/proc"));
        let trainers = signal::find_trainers(&procs, &matcher, self_pid);
        let workers: Vec<signal::Process> = trainers
            .iter()
            .flat_map(|t| t.workers.iter().cloned())
            .collect();
        let mut sent = if stacks {
            ask_for_stacks(&workers)
        } else {
            Vec::new()
        };
        sent.extend(signal::execute(Plan::TermWorkers, &trainers, u64::MAX));
        for w in &workers {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(w.pid),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
        sent.extend(kill_leftovers(Path::new("/proc"), &workers, KILL_AFTER));
        sent
    });
    let sent = match work {
        Err(e) => return (Outcome::Failed, format!("cannot start a thread: {e}")),
        Ok(rx) => match tokio::time::timeout(signal::EXECUTE_TIMEOUT, rx).await {
            Ok(Ok(sent)) => sent,
            _ => {
                return (
                    Outcome::Failed,
                    "the /proc scan and signals did not finish in time".into(),
                );
            }
        },
    };
    let failed = sent.iter().filter(|s| s.error.is_some()).count();
    let terminated = sent.iter().filter(|s| s.signal == "SIGTERM").count();
    let text = sent
        .iter()
        .map(|s| match &s.error {
            None => format!("{} {} {}", s.signal, s.role, s.pid),
            Some(e) => format!("{} {} {} FAILED: {e}", s.signal, s.role, s.pid),
        })
        .collect::<Vec<_>>()
        .join(", ");
    match (sent.len(), failed) {
        (0, _) => (Outcome::NoTrainer, "no worker to restart".into()),
        (_, 0) if terminated == 0 => (Outcome::NoTrainer, "no worker to restart".into()),
        (_, 0) => (
            Outcome::Signalled,
            format!("{terminated} workers signalled: {text}"),
        ),
        (n, f) if f == n => (Outcome::Failed, text),
        _ => (Outcome::Partial, text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    #[test]
    fn the_state_is_read_after_the_command_name() {
        let stat = "4242 (pt (main) x) T 4200 4242 4242 0 -1 4194560 100 0 0 0 3 1";
        assert_eq!(parse_state(stat), Some('T'));
        assert_eq!(parse_state("1 (a) D 0"), Some('D'));
        assert_eq!(parse_state("garbage"), None);
        assert_eq!(parse_state("1 (a)"), None);
        // This process runs.
        let me = std::process::id() as i32;
        let s = states(Path::new("/proc"), &[me, i32::MAX]);
        assert_eq!(s.len(), 1);
        assert!(matches!(s[0].1, 'R' | 'S'), "{s:?}");
    }

    /// A second hang soon after a restart is acted on: the storm guard's
    /// cooldown for stalls is never longer than the stall timeout, and a
    /// verdict refused for the cooldown is judged again when it ends.
    #[test]
    fn a_stall_refused_for_the_cooldown_is_acted_on_when_it_ends() {
        let limits = ActionLimits {
            cooldown: Duration::from_secs(30),
            max_actions: 3,
            window: Duration::from_secs(600),
        };
        assert_eq!(
            stall_limits(limits, Duration::from_secs(20)).cooldown,
            Duration::from_secs(20)
        );
        assert_eq!(stall_limits(limits, Duration::from_secs(900)), limits);

        let start = std::time::Instant::now();
        let mut acted = Acted::default();
        assert!(!acted.settled(Some(1), start), "nothing judged yet");
        acted.done(Some(1));
        assert!(acted.settled(Some(1), start + Duration::from_secs(3600)));
        assert!(
            !acted.settled(Some(2), start),
            "new workers are judged afresh"
        );
        acted.retry(Some(2), start + Duration::from_secs(10));
        assert!(acted.settled(Some(2), start + Duration::from_secs(9)));
        assert!(!acted.settled(Some(2), start + Duration::from_secs(10)));
        assert!(!acted.settled(Some(3), start));

        // The limiter with the stall limits: an action, then the next
        // stall of restarted workers (found a timeout after they started)
        // passes the guard.
        let mut limiter = Limiter::new(stall_limits(limits, Duration::from_secs(20)));
        assert_eq!(limiter.check(1, start), Ok(()));
        limiter.record(1, start);
        assert_eq!(
            limiter.check(2, start + Duration::from_secs(19)),
            Err(Outcome::Cooldown)
        );
        assert_eq!(limiter.check(2, start + Duration::from_secs(21)), Ok(()));
    }

    /// A real stopped process is seen stopped at once.
    #[test]
    fn a_stopped_child_is_stuck() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id() as i32;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .expect("stop");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut local = Local::default();
        let own = loop {
            let sample = Sample {
                workers: Some(1),
                started: Some(t(0)),
                traffic: Some(BTreeMap::new()),
                states: states(Path::new("/proc"), &[pid]),
                checkpoint: None,
                collectives: None,
            };
            let own = local.observe(&sample, t(5));
            if !own.stuck.is_empty() || std::time::Instant::now() > deadline {
                break own;
            }
            std::thread::yield_now();
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(own.stuck.len(), 1, "{own:?}");
        assert_eq!(own.stuck[0].state, "stopped");
        assert_eq!(own.stuck[0].pid, pid);
    }

    /// A worker that ignores SIGTERM (or whose system call does not
    /// return) is killed after the grace; one that ended is left alone.
    #[test]
    fn workers_still_there_after_the_grace_are_killed() {
        let spawn = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .spawn()
                .expect("sh")
        };
        let mut stubborn = spawn("trap '' TERM; exec sleep 30");
        let mut done = spawn("exit 0");
        let _ = done.wait();
        let root = Path::new("/proc");
        let process = |pid: u32| {
            let pid = pid as i32;
            let stat = std::fs::read_to_string(root.join(pid.to_string()).join("stat"))
                .unwrap_or_default();
            signal::Process {
                pid,
                ppid: 0,
                start_ticks: signal::parse_stat(&stat).map_or(0, |(_, s)| s),
                argv: Vec::new(),
            }
        };
        let workers = vec![process(stubborn.id()), process(done.id())];
        let sent = kill_leftovers(root, &workers, Duration::from_millis(300));
        let status = stubborn.wait().expect("wait");
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0].pid, stubborn.id() as i32);
        assert_eq!(sent[0].signal, "SIGKILL");
        assert_eq!(sent[0].error, None);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
        // Nothing left: nothing sent, no wait.
        let started = std::time::Instant::now();
        assert!(kill_leftovers(root, &workers, Duration::from_secs(5)).is_empty());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn traffic_growth_new_workers_and_checkpoints_are_progress() {
        let mut l = Local::default();
        let traffic = |b: u64| {
            Some(BTreeMap::from([(
                1,
                crate::collective::Carried {
                    sent: b,
                    received: 0,
                },
            )]))
        };
        let s = |b: Option<crate::collective::Traffic>| Sample {
            workers: Some(100),
            started: Some(t(0)),
            traffic: b,
            ..Sample::default()
        };
        // Not formed yet: unknown.
        let own = l.observe(&s(None), t(1));
        assert_eq!(own.moved_at, None);
        assert!(own.unknown.is_some());
        // Formed: the start counts until the bytes grow.
        assert_eq!(l.observe(&s(traffic(10)), t(2)).moved_at, Some(t(0)));
        assert_eq!(l.observe(&s(traffic(20)), t(3)).moved_at, Some(t(3)));
        assert_eq!(l.observe(&s(traffic(20)), t(30)).moved_at, Some(t(3)));
        // A new checkpoint written at 25.
        let mut c = s(traffic(20));
        c.checkpoint = Some(t(25));
        assert_eq!(l.observe(&c, t(31)).moved_at, Some(t(25)));
        // New workers: their start.
        let mut n = s(traffic(5));
        n.workers = Some(200);
        n.started = Some(t(40));
        assert_eq!(l.observe(&n, t(41)).moved_at, Some(t(40)));
        // None: unknown.
        assert!(l.observe(&Sample::default(), t(42)).moved_at.is_none());
    }

    /// Where no TCP byte moves (NCCL over RDMA), NCCL's RAS counts of
    /// completed collectives are the progress.
    #[test]
    fn the_ras_collective_counts_are_progress_where_traffic_is_unreadable() {
        let mut l = Local::default();
        let s = |n: Option<u64>| Sample {
            workers: Some(1),
            started: Some(t(0)),
            collectives: n,
            ..Sample::default()
        };
        assert!(l.observe(&s(None), t(1)).unknown.is_some());
        assert_eq!(l.observe(&s(Some(10)), t(2)).moved_at, Some(t(0)));
        assert_eq!(l.observe(&s(Some(12)), t(3)).moved_at, Some(t(3)));
        let own = l.observe(&s(Some(12)), t(40));
        assert_eq!(own.moved_at, Some(t(3)));
        assert_eq!(own.unknown, None);
    }

    /// A worker stopped for the timeout stalls this pod whatever its
    /// traffic; an uninterruptible or zombie one does not count here.
    #[test]
    fn a_stopped_worker_is_timed_from_when_it_was_seen_stopped() {
        let now = SystemTime::now();
        let worker = |state: &str, ago: u64| StuckWorker {
            pid: 7,
            state: state.into(),
            since: rfc3339(now - Duration::from_secs(ago)),
        };
        assert_eq!(stopped_for(&[], now), None);
        assert_eq!(stopped_for(&[worker("uninterruptible", 60)], now), None);
        let d = stopped_for(
            &[
                worker("stopped", 5),
                worker("stopped", 25),
                worker("zombie", 90),
            ],
            now,
        )
        .expect("stopped");
        assert!((24..=25).contains(&d.as_secs()), "{d:?}");
    }

    #[test]
    fn uninterruptible_sleep_counts_only_when_long() {
        let mut l = Local::default();
        let s = Sample {
            workers: Some(1),
            traffic: Some(BTreeMap::new()),
            states: vec![(7, 'D'), (8, 'S'), (9, 'Z')],
            ..Sample::default()
        };
        let own = l.observe(&s, t(0));
        assert_eq!(own.stuck.iter().map(|w| w.pid).collect::<Vec<_>>(), vec![9]);
        let own = l.observe(&s, t(0) + STUCK_AFTER);
        assert_eq!(
            own.stuck
                .iter()
                .map(|w| (w.pid, w.state.as_str()))
                .collect::<Vec<_>>(),
            vec![(7, "uninterruptible"), (9, "zombie")]
        );
        // Back to running: no longer stuck, and its clock starts again.
        let mut s2 = s.clone();
        s2.states = vec![(7, 'R')];
        assert!(l.observe(&s2, t(20)).stuck.is_empty());
        assert!(l.observe(&s, t(21)).stuck.iter().all(|w| w.pid != 7));
    }

    #[test]
    fn the_ranks_shown_name_the_stuck_workers_and_count_the_rest() {
        let stuck = |pid| StuckWorker {
            pid,
            state: "stopped".into(),
            since: "x".into(),
        };
        let ranks = vec![
            RankProgress {
                rank: 1,
                idle_ms: Some(25_000),
                stuck: vec![stuck(42)],
                unknown: None,
            },
            RankProgress {
                rank: 0,
                idle_ms: Some(21_000),
                stuck: Vec::new(),
                unknown: None,
            },
            RankProgress {
                rank: 2,
                idle_ms: None,
                stuck: Vec::new(),
                unknown: Some("no answer".into()),
            },
        ];
        assert_eq!(
            ranks_shown(&ranks, Duration::from_secs(20)),
            "rank 1 worker 42 stopped; 2 ranks idle 20s or more; 1 unknown"
        );
        // Bounded, whatever the world's size.
        let many: Vec<RankProgress> = (0..1000)
            .map(|rank| RankProgress {
                rank,
                idle_ms: Some(30_000),
                stuck: vec![stuck(rank as i32)],
                unknown: None,
            })
            .collect();
        let text = ranks_shown(&many, Duration::from_secs(20));
        assert!(text.len() < 400, "{text}");
        assert!(text.contains("992 more stuck workers"), "{text}");
    }

    #[test]
    fn the_verdict_table() {
        let r = |rank, idle: Option<u64>| RankProgress {
            rank,
            idle_ms: idle.map(|s| s * 1000),
            stuck: Vec::new(),
            unknown: None,
        };
        let timeout = Duration::from_secs(20);
        assert_eq!(judge(timeout, &[]), Verdict::Unknown);
        assert_eq!(judge(timeout, &[r(0, None), r(1, None)]), Verdict::Unknown);
        assert_eq!(
            judge(timeout, &[r(0, Some(30)), r(1, Some(2))]),
            Verdict::Moving {
                rank: 1,
                idle: Duration::from_secs(2)
            }
        );
        assert!(matches!(
            judge(timeout, &[r(0, Some(30)), r(1, Some(25)), r(2, None)]),
            Verdict::Stalled { idle, .. } if idle == Duration::from_secs(25)
        ));
        // Exactly the timeout is past it.
        assert!(matches!(
            judge(timeout, &[r(0, Some(20))]),
            Verdict::Stalled { .. }
        ));
    }

    proptest! {
        /// Every rank's connections carry bytes (or not) at each scan; each
        /// rank's sidecar follows its own with [`Local`]; [`judge`] over
        /// their reports is stalled exactly when no rank's traffic moved
        /// within the timeout (its workers' start counting as a move), and
        /// a rank whose traffic cannot be read never makes it stalled nor
        /// keeps it from being.
        #[test]
        fn stalled_exactly_when_no_rank_moved_within_the_timeout(
            ranks in 1usize..6,
            unreadable in proptest::collection::vec(any::<bool>(), 6),
            scans in proptest::collection::vec(
                (proptest::collection::vec(0u64..3, 6), 1u64..8),
                1..60,
            ),
            timeout_s in 5u64..40,
        ) {
            let timeout = Duration::from_secs(timeout_s);
            let mut locals: Vec<Local> = (0..ranks).map(|_| Local::default()).collect();
            let mut bytes = vec![0u64; ranks];
            // When each rank last moved (its workers started at t(0)).
            let mut moved = vec![t(0); ranks];
            let mut now = t(0);
            for (scan, (grow, step)) in scans.into_iter().enumerate() {
                now += Duration::from_secs(step);
                let mut reports = Vec::new();
                for rank in 0..ranks {
                    // The first scan only learns the counters.
                    if grow[rank] > 0 && scan > 0 {
                        bytes[rank] += grow[rank];
                        moved[rank] = now;
                    }
                    let readable = !unreadable[rank] || rank == 0;
                    let own = locals[rank].observe(&Sample {
                        workers: Some(1),
                        started: Some(t(0)),
                        traffic: readable.then(|| BTreeMap::from([(9, crate::collective::Carried::each_way(bytes[rank]))])),
                        ..Sample::default()
                    }, now);
                    reports.push(RankProgress {
                        rank: rank as u32,
                        idle_ms: own.moved_at.map(|m| now.duration_since(m).unwrap_or_default().as_millis() as u64),
                        stuck: own.stuck,
                        unknown: None,
                    });
                }
                let readable: Vec<usize> = (0..ranks).filter(|r| !unreadable[*r] || *r == 0).collect();
                let any_moved = readable.iter().any(|r| {
                    now.duration_since(moved[*r]).unwrap_or_default() < timeout
                });
                let verdict = judge(timeout, &reports);
                if any_moved {
                    prop_assert!(!matches!(verdict, Verdict::Stalled { .. }), "{verdict:?}");
                } else {
                    prop_assert!(matches!(verdict, Verdict::Stalled { .. }), "{verdict:?}");
                }
            }
        }
    }
}
