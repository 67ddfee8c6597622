//! Finding the torchrun agent and its workers in `/proc`, and signalling them.
//!
//! torchrun starts each worker in a new session, so the workers are found as
//! the agent's children by the parent pid in `/proc/<pid>/stat`, never by
//! process group. Only processes that started before the loss was seen are
//! signalled (a restarted trainer is left alone).

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;

use crate::config::ActionLimits;

/// Time limit of one `/proc` scan plus the signals.
pub const EXECUTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Linux reports process start times in `USER_HZ` ticks, which is 100 on
/// every architecture the sidecar is built for (it is a fixed ABI value).
pub const TICKS_PER_SECOND: u64 = 100;

/// One process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    pub pid: i32,
    pub ppid: i32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
    pub argv: Vec<String>,
}

/// Parses `/proc/<pid>/stat`: returns (ppid, starttime). The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after the
/// last `)`.
pub fn parse_stat(stat: &str) -> Option<(i32, u64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ')' : state(3) ppid(4) ... starttime(22) => indexes 0, 1, 19
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// The state letter of a `/proc/<pid>/stat` text (field 3, after the last
/// `)`: the command name may hold both).
pub fn parse_state(stat: &str) -> Option<char> {
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Reads every process under `proc_root` (normally `/proc`). Processes that
/// vanish while being read are skipped; kernel threads (empty cmdline) too.
pub fn scan(proc_root: &Path) -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let path = entry.path();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        let Some((ppid, start_ticks)) = parse_stat(&stat) else {
            continue;
        };
        let Ok(raw) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        if raw.is_empty() {
            continue;
        }
        let argv = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        out.push(Process {
            pid,
            ppid,
            start_ticks,
            argv,
        });
    }
    out.sort_by_key(|p| p.pid);
    out
}

/// Seconds since boot, in ticks (`/proc/uptime`, the same clock as process start times).
pub fn uptime_ticks(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("uptime")).ok()?;
    let secs: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some((secs * TICKS_PER_SECOND as f64) as u64)
}

/// Recognises the agent's command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentMatcher {
    /// Substrings of the whole command line; empty means the torchrun matcher.
    patterns: Vec<String>,
}

impl AgentMatcher {
    pub fn new(patterns: Vec<String>) -> Self {
        AgentMatcher { patterns }
    }

    /// Whether `argv` is a torchrun agent: with custom patterns, the command
    /// line contains one of them; by default, one argument is the `torchrun`
    /// executable (as a path or the script a Python interpreter runs) or the
    /// module `torch.distributed.run` / `torch.distributed.launch`. A shell
    /// running `sh -c "torchrun ..."` is not the agent: its child is.
    pub fn matches(&self, argv: &[String]) -> bool {
        if !self.patterns.is_empty() {
            let line = argv.join(" ");
            return self.patterns.iter().any(|p| line.contains(p.as_str()));
        }
        argv.iter().take(4).any(|a| {
            let base = a.rsplit('/').next().unwrap_or(a);
            base == "torchrun" || a == "torch.distributed.run" || a == "torch.distributed.launch"
        })
    }
}

/// An agent and the processes under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Trainer {
    pub agent: Process,
    /// The agent's direct children: torchrun's workers.
    pub workers: Vec<Process>,
    /// Everything below the workers (data-loader processes and such).
    pub below_workers: Vec<Process>,
}

/// Whether `p` is Python's multiprocessing forkserver (started by the agent
/// as `python -c 'from multiprocessing.forkserver import main; ...'`).
fn is_forkserver(p: &Process) -> bool {
    p.argv
        .iter()
        .any(|a| a.contains("from multiprocessing.forkserver import main"))
}

/// Whether `p` is Python's multiprocessing resource tracker, which a
/// forkserver agent also starts: not a worker.
fn is_resource_tracker(p: &Process) -> bool {
    p.argv
        .iter()
        .any(|a| a.contains("from multiprocessing.resource_tracker import main"))
}

/// Finds the agents among `procs` and their workers. When an agent's child
/// also matches (a wrapper around the real agent), the innermost one is the
/// agent. `self_pid` (the sidecar) is never an agent.
pub fn find_trainers(procs: &[Process], matcher: &AgentMatcher, self_pid: i32) -> Vec<Trainer> {
    let mut children: BTreeMap<i32, Vec<&Process>> = BTreeMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    // A forkserver (and the workers it forks, which keep its command line)
    // and the resource tracker carry the agent's interpreter flags (and the
    // forkserver its preload list): never an agent.
    let is_agent = |p: &Process| {
        p.pid != self_pid
            && !is_forkserver(p)
            && !is_resource_tracker(p)
            && matcher.matches(&p.argv)
    };
    let agents: Vec<&Process> = procs
        .iter()
        .filter(|p| is_agent(p))
        .filter(|p| {
            !children
                .get(&p.pid)
                .is_some_and(|kids| kids.iter().any(|k| is_agent(k)))
        })
        .collect();
    agents
        .into_iter()
        .map(|agent| {
            let mut workers = Vec::new();
            let mut below = Vec::new();
            for kid in children.get(&agent.pid).into_iter().flatten() {
                if is_forkserver(kid) {
                    // Workers forked by the agent's forkserver (torchrun
                    // `--start-method forkserver`) are its children.
                    workers.extend(
                        children
                            .get(&kid.pid)
                            .into_iter()
                            .flatten()
                            .map(|w| (*w).clone()),
                    );
                    below.push((*kid).clone());
                } else if is_resource_tracker(kid) {
                    below.push((*kid).clone());
                } else {
                    workers.push((*kid).clone());
                }
            }
            let mut stack: Vec<i32> = workers.iter().map(|w| w.pid).collect();
            let mut guard = 0;
            while let Some(pid) = stack.pop() {
                guard += 1;
                if guard > 100_000 {
                    break;
                }
                if let Some(kids) = children.get(&pid) {
                    for k in kids {
                        below.push((*k).clone());
                        stack.push(k.pid);
                    }
                }
            }
            Trainer {
                agent: agent.clone(),
                workers,
                below_workers: below,
            }
        })
        .collect()
}

/// What of the trainer from before a loss has been stopped in an episode,
/// in order: stopping the whole trainer (its agent killed, and everything
/// under it) stops its workers too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stopped {
    /// Nothing yet.
    #[default]
    None,
    /// The workers: signalled (every signal arrived) or no longer running;
    /// the agent restarts them.
    Workers,
    /// The agent and its workers: killed (the signal arrived) or no longer
    /// running; the kubelet restarts the container.
    Trainer,
}

/// Which process of a trainer a signal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// The torchrun agent.
    Agent,
    /// One of the agent's workers.
    Worker,
    /// A process under a worker.
    WorkerChild,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Agent, Role::Worker, Role::WorkerChild];

    /// The name in logs, `/status` and the `role` label of metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Worker => "worker",
            Role::WorkerChild => "worker-child",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do about one loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Plan {
    /// Log, count, record; touch no process.
    ReportOnly,
    /// SIGTERM the agent's workers; the agent restarts them.
    TermWorkers,
    /// SIGKILL the agent and everything under it; the container exits and
    /// the kubelet restarts it.
    KillAgent,
}

impl Plan {
    pub const ALL: [Plan; 3] = [Plan::ReportOnly, Plan::TermWorkers, Plan::KillAgent];

    /// Whether a signal to a process of `role` is one this plan needs to
    /// arrive to reach its goal: the workers' for `restart-workers`, the
    /// agent's for `restart-agent`, none for `report-only`.
    pub fn needs(self, role: Role) -> bool {
        match self {
            Plan::ReportOnly => false,
            Plan::TermWorkers => role != Role::Agent,
            Plan::KillAgent => role == Role::Agent,
        }
    }

    /// What of the trainer from before the loss is gone once the plan
    /// reached its goal.
    pub fn stops(self) -> Stopped {
        match self {
            Plan::ReportOnly => Stopped::None,
            Plan::TermWorkers => Stopped::Workers,
            Plan::KillAgent => Stopped::Trainer,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Plan::ReportOnly => "report-only",
            Plan::TermWorkers => "restart-workers",
            Plan::KillAgent => "restart-agent",
        }
    }
}

/// The outcome of one loss, as counted in metrics and shown in `/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Processes were signalled.
    Signalled,
    /// The plan was to report only.
    Reported,
    /// No trainer process (that started before the loss) was running.
    NoTrainer,
    /// Within the cooldown after the previous action.
    Cooldown,
    /// The cap of actions per window was reached.
    Capped,
    /// Some signals arrived, others failed (e.g. EPERM).
    Partial,
    /// Nothing arrived: every signal failed, or the `/proc` scan and the
    /// signals did not finish in time.
    Failed,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Signalled,
        Outcome::Reported,
        Outcome::NoTrainer,
        Outcome::Cooldown,
        Outcome::Capped,
        Outcome::Partial,
        Outcome::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Signalled => trainwire_contract::stall::SIGNALLED,
            Outcome::Reported => "reported",
            Outcome::NoTrainer => "no-trainer",
            Outcome::Cooldown => "cooldown",
            Outcome::Capped => "capped",
            Outcome::Partial => "partial",
            Outcome::Failed => "failed",
        }
    }
}

/// Restart-storm guard: one action per generation, a cooldown, a cap per window.
#[derive(Debug, Clone)]
pub struct Limiter {
    limits: ActionLimits,
    taken: VecDeque<Instant>,
    last_generation: u64,
}

impl Limiter {
    pub fn new(limits: ActionLimits) -> Self {
        Limiter {
            limits,
            taken: VecDeque::new(),
            last_generation: 0,
        }
    }

    /// Whether an action for `generation` may run at `now`. `Ok` reserves it:
    /// call [`Limiter::record`] once processes were actually signalled.
    pub fn check(&mut self, generation: u64, now: Instant) -> Result<(), Outcome> {
        if generation <= self.last_generation {
            return Err(Outcome::Reported);
        }
        while let Some(first) = self.taken.front() {
            if now.saturating_duration_since(*first) >= self.limits.window {
                self.taken.pop_front();
            } else {
                break;
            }
        }
        if let Some(last) = self.taken.back()
            && now.saturating_duration_since(*last) < self.limits.cooldown
        {
            return Err(Outcome::Cooldown);
        }
        if self.taken.len() as u64 >= u64::from(self.limits.max_actions) {
            return Err(Outcome::Capped);
        }
        Ok(())
    }

    /// Records that the action for `generation` ran at `now`.
    pub fn record(&mut self, generation: u64, now: Instant) {
        self.last_generation = self.last_generation.max(generation);
        self.taken.push_back(now);
    }

    /// Time until the cooldown ends, for `/status`.
    pub fn cooldown_left(&self, now: Instant) -> Duration {
        self.taken
            .back()
            .map(|last| {
                self.limits
                    .cooldown
                    .saturating_sub(now.saturating_duration_since(*last))
            })
            .unwrap_or_default()
    }
}

/// One signal sent (or tried).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sent {
    pub pid: i32,
    pub role: Role,
    pub signal: &'static str,
    /// `None` on success, else the error.
    pub error: Option<String>,
}

/// Carries out `plan` on `trainers`, touching only processes that started at
/// or before `loss_ticks` (ticks since boot). Returns what was sent.
pub fn execute(plan: Plan, trainers: &[Trainer], loss_ticks: u64) -> Vec<Sent> {
    let mut sent = Vec::new();
    let old = |p: &Process| p.start_ticks <= loss_ticks;
    let mut send = |p: &Process, role: Role, sig: Signal| {
        let error = match kill(Pid::from_raw(p.pid), sig) {
            Ok(()) => None,
            // Already gone: nothing left to stop.
            Err(nix::errno::Errno::ESRCH) => None,
            Err(e) => Some(e.to_string()),
        };
        sent.push(Sent {
            pid: p.pid,
            role,
            signal: sig.as_str(),
            error,
        });
    };
    for t in trainers.iter().filter(|t| old(&t.agent)) {
        match plan {
            Plan::ReportOnly => {}
            Plan::TermWorkers => {
                for w in t.workers.iter().filter(|w| old(w)) {
                    send(w, Role::Worker, Signal::SIGTERM);
                }
            }
            Plan::KillAgent => {
                // The agent first, so it cannot restart workers in between.
                send(&t.agent, Role::Agent, Signal::SIGKILL);
                for w in t.workers.iter().filter(|w| old(w)) {
                    send(w, Role::Worker, Signal::SIGKILL);
                }
                for w in t.below_workers.iter().filter(|w| old(w)) {
                    send(w, Role::WorkerChild, Signal::SIGKILL);
                }
            }
        }
    }
    sent
}

/// What [`check_permission`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// No trainer agent is running: nothing to check.
    NoTrainer,
    /// Every agent and worker may be signalled.
    Permitted { processes: usize },
    /// A signal to this process would fail.
    Denied { pid: i32, role: Role, error: String },
}

/// What the signal-permission check found: one state each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionState {
    Permitted,
    Denied,
    NoTrainer,
    /// The check itself did not finish (its `/proc` scan hung or failed):
    /// nothing is known, which is not "no trainer".
    Unknown,
}

impl PermissionState {
    pub const ALL: [PermissionState; 4] = [
        PermissionState::Permitted,
        PermissionState::Denied,
        PermissionState::NoTrainer,
        PermissionState::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PermissionState::Permitted => "permitted",
            PermissionState::Denied => "denied",
            PermissionState::NoTrainer => "no-trainer",
            PermissionState::Unknown => "unknown",
        }
    }
}

/// Whether this process may signal the trainers' processes: `kill(pid, 0)`
/// checks the permission (same UID, or `CAP_KILL`) without sending anything.
/// Run before any loss, so a sidecar that could not act says so at once.
pub fn check_permission(trainers: &[Trainer]) -> Permission {
    let mut processes = 0;
    for t in trainers {
        let roles = std::iter::once((&t.agent, Role::Agent))
            .chain(t.workers.iter().map(|w| (w, Role::Worker)));
        for (p, role) in roles {
            match kill(Pid::from_raw(p.pid), None) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => processes += 1,
                Err(e) => {
                    return Permission::Denied {
                        pid: p.pid,
                        role,
                        error: e.to_string(),
                    };
                }
            }
        }
    }
    if trainers.is_empty() {
        Permission::NoTrainer
    } else {
        Permission::Permitted { processes }
    }
}

/// `EPERM` of `EPERM: Operation not permitted`: the bounded label a metric
/// may carry.
pub fn errno_label(error: &str) -> &str {
    error.split(':').next().unwrap_or(error).trim()
}

/// Trainers whose agent started at or before `loss_ticks`.
pub fn trainers_before(trainers: Vec<Trainer>, loss_ticks: u64) -> Vec<Trainer> {
    trainers
        .into_iter()
        .filter(|t| t.agent.start_ticks <= loss_ticks)
        .collect()
}

/// What the local trainer does, as `/proc` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// An agent with workers: this pod trains.
    Training { workers: usize },
    /// An agent with no workers: it waits in the rendezvous (starting, or a
    /// hot spare on torchrun's redundancy list while the world is complete).
    Waiting,
    /// No agent.
    NoTrainer,
}

/// The activity of the trainers found in `/proc`.
pub fn activity(trainers: &[Trainer]) -> Activity {
    let workers: usize = trainers.iter().map(|t| t.workers.len()).sum();
    match (trainers.is_empty(), workers) {
        (true, _) => Activity::NoTrainer,
        (false, 0) => Activity::Waiting,
        (false, workers) => Activity::Training { workers },
    }
}

/// The start time (ticks since boot) of the newest of the trainers'
/// workers: when the current set of workers was up.
pub fn newest_worker_start(trainers: &[Trainer]) -> Option<u64> {
    trainers
        .iter()
        .flat_map(|t| t.workers.iter())
        .map(|w| w.start_ticks)
        .max()
}

/// Runs `work` on a thread of its own and returns its result when done:
/// the `/proc` scans and the signals never wait for a shared pool (one that
/// name lookups or file-system scans could hold), and a scan that hangs (a
/// `/proc/<pid>/cmdline` read can block on a process's memory lock) holds
/// only its own thread. The caller bounds the wait.
pub fn on_own_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<tokio::sync::oneshot::Receiver<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tx.send(work());
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, start: u64, argv: &[&str]) -> Process {
        Process {
            pid,
            ppid,
            start_ticks: start,
            argv: argv.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn stat_with_spaces_and_parens_in_comm() {
        let stat = "4242 (pt (main) x) S 4200 4242 4242 0 -1 4194560 100 0 0 0 3 1 0 0 20 0 2 0 987654 1000 100 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((4200, 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn default_matcher() {
        let m = AgentMatcher::new(vec![]);
        let yes: &[&[&str]] = &[
            &[
                "/usr/bin/python3",
                "/usr/local/bin/torchrun",
                "--nnodes=2",
                "train.py",
            ],
            &["torchrun", "train.py"],
            &["python", "-m", "torch.distributed.run", "train.py"],
            &["python3", "-m", "torch.distributed.launch", "x.py"],
        ];
        for argv in yes {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            assert!(m.matches(&argv), "{argv:?}");
        }
        let no: &[&[&str]] = &[
            &["sh", "-c", "torchrun train.py"],
            &["python", "-u", "train.py", "--local-rank=0"],
            &["trainwire-sidecar"],
            &["python", "torchrun_helper.py"],
        ];
        for argv in no {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            assert!(!m.matches(&argv), "{argv:?}");
        }
        let custom = AgentMatcher::new(vec!["fake_torchrun".into()]);
        assert!(custom.matches(&["python3".into(), "/t/fake_torchrun.py".into()]));
    }

    #[test]
    fn workers_are_children_not_process_group() {
        let procs = vec![
            p(1, 0, 1, &["/pause"]),
            p(10, 1, 100, &["sh", "-c", "torchrun train.py"]),
            p(
                11,
                10,
                101,
                &["/usr/bin/python3", "/usr/bin/torchrun", "train.py"],
            ),
            p(12, 11, 150, &["/usr/bin/python3", "-u", "train.py"]),
            p(13, 11, 150, &["/usr/bin/python3", "-u", "train.py"]),
            p(
                14,
                12,
                160,
                &[
                    "/usr/bin/python3",
                    "-c",
                    "from multiprocessing.spawn import x",
                ],
            ),
            p(20, 1, 50, &["trainwire-sidecar"]),
            p(30, 1, 50, &["python3", "unrelated.py"]),
        ];
        let t = find_trainers(&procs, &AgentMatcher::new(vec![]), 20);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].agent.pid, 11);
        assert_eq!(
            t[0].workers.iter().map(|w| w.pid).collect::<Vec<_>>(),
            vec![12, 13]
        );
        assert_eq!(
            t[0].below_workers.iter().map(|w| w.pid).collect::<Vec<_>>(),
            vec![14]
        );
        assert!(find_trainers(&procs[..2], &AgentMatcher::new(vec![]), 20).is_empty());
    }

    #[test]
    fn forkserver_workers_are_the_forkservers_children() {
        let forkserver = "from multiprocessing.forkserver import main; main(5, 6, ['torch'], **{'sys_path': []})";
        let procs = vec![
            p(
                11,
                1,
                101,
                &["/usr/bin/python3", "/usr/bin/torchrun", "train.py"],
            ),
            p(12, 11, 120, &["/usr/bin/python3", "-c", forkserver]),
            p(
                13,
                11,
                121,
                &[
                    "/usr/bin/python3",
                    "-c",
                    "from multiprocessing.resource_tracker import main;main(9)",
                ],
            ),
            p(14, 12, 150, &["/usr/bin/python3", "-c", forkserver]),
            p(15, 12, 150, &["/usr/bin/python3", "-c", forkserver]),
            // A data-loader process forked by a worker: the same argv.
            p(16, 14, 160, &["/usr/bin/python3", "-c", forkserver]),
        ];
        let t = find_trainers(&procs, &AgentMatcher::new(vec![]), 20);
        assert_eq!(t.len(), 1);
        let pids = |v: &[Process]| v.iter().map(|w| w.pid).collect::<Vec<_>>();
        // The forked workers (whose argv is the forkserver's) are workers;
        // the forkserver and the resource tracker only die with the agent.
        assert_eq!(pids(&t[0].workers), vec![14, 15]);
        assert_eq!(pids(&t[0].below_workers), vec![12, 13, 16]);
        // A custom pattern the forkserver inherits (`python -X token`): the
        // agent is still the agent.
        let mut tagged = procs.clone();
        for p in &mut tagged {
            p.argv.insert(1, "-Xtoken".into());
        }
        let t = find_trainers(&tagged, &AgentMatcher::new(vec!["token".into()]), 20);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].agent.pid, 11);
        assert_eq!(pids(&t[0].workers), vec![14, 15]);
    }

    #[test]
    fn limiter_generation_cooldown_and_cap() {
        let limits = ActionLimits {
            cooldown: Duration::from_secs(30),
            max_actions: 2,
            window: Duration::from_secs(600),
        };
        let t = Instant::now();
        let mut l = Limiter::new(limits);
        assert_eq!(l.check(1, t), Ok(()));
        l.record(1, t);
        assert_eq!(l.check(1, t), Err(Outcome::Reported), "once per generation");
        assert_eq!(
            l.check(2, t + Duration::from_secs(10)),
            Err(Outcome::Cooldown)
        );
        assert_eq!(l.check(2, t + Duration::from_secs(31)), Ok(()));
        l.record(2, t + Duration::from_secs(31));
        assert_eq!(
            l.check(3, t + Duration::from_secs(100)),
            Err(Outcome::Capped)
        );
        assert_eq!(
            l.check(3, t + Duration::from_secs(601)),
            Ok(()),
            "window slides"
        );
    }

    #[test]
    fn execute_spares_processes_started_after_the_loss() {
        // Real processes: a `sleep` started "after" the loss is not touched.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id() as i32;
        let trainer = Trainer {
            agent: p(std::process::id() as i32, 1, 0, &["agent"]),
            workers: vec![p(pid, 0, 500, &["sleep"])],
            below_workers: vec![],
        };
        let sent = execute(Plan::TermWorkers, std::slice::from_ref(&trainer), 499);
        assert!(sent.is_empty());
        let sent = execute(Plan::TermWorkers, &[trainer], 500);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].signal, "SIGTERM");
        assert_eq!(sent[0].error, None);
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(15));
    }
}
