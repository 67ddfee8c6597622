//! The kubelet's part in a test: run a container's command and start it
//! again whenever it exits (`restartPolicy: Always`), until stopped.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::{Log, Proc, pids_with_env, signal_all, unique_name};

/// Marks every process of one container run, so that all of them die when
/// the container does (as its cgroup would).
pub const CONTAINER_VAR: &str = "TRAINWIRE_TEST_CONTAINER";

/// Restarts a command whenever it exits. Dropping it kills the running
/// process tree and stops restarting.
pub struct Kubelet {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicI32>,
    starts: Arc<Mutex<Vec<Instant>>>,
    exits: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Kubelet {
    /// Start `make()` now, and again `restart_delay` after each exit. Its
    /// output goes to `log` as `<name>| line`; the kubelet's own notes as
    /// `<name>| [kubelet] ...`.
    pub fn run(
        name: &str,
        tag: &str,
        log: &Log,
        restart_delay: Duration,
        make: impl Fn() -> Command + Send + 'static,
    ) -> Kubelet {
        Self::run_with(name, tag, log, move |_| restart_delay, make)
    }

    /// Like a real kubelet's CrashLoopBackOff: the first restart after
    /// `first`, then 10 s, 20 s, 40 s, ... (at most 5 min).
    pub fn run_backoff(
        name: &str,
        tag: &str,
        log: &Log,
        first: Duration,
        make: impl Fn() -> Command + Send + 'static,
    ) -> Kubelet {
        Self::run_with(
            name,
            tag,
            log,
            move |exits| match exits {
                0 | 1 => first,
                n => Duration::from_secs(10u64.saturating_mul(1 << (n - 2).min(5)).min(300)),
            },
            make,
        )
    }

    /// Restart after `delay(exits so far)`.
    pub fn run_with(
        name: &str,
        tag: &str,
        log: &Log,
        delay: impl Fn(usize) -> Duration + Send + 'static,
        make: impl Fn() -> Command + Send + 'static,
    ) -> Kubelet {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(AtomicI32::new(0));
        let starts = Arc::new(Mutex::new(Vec::new()));
        let exits = Arc::new(AtomicUsize::new(0));
        let (name, tag, log) = (name.to_string(), tag.to_string(), log.clone());
        let thread = {
            let (stop, pid, starts, exits) =
                (stop.clone(), pid.clone(), starts.clone(), exits.clone());
            std::thread::spawn(move || {
                let prefix = format!("{name}| ");
                while !stop.load(Ordering::SeqCst) {
                    let mut cmd = make();
                    let container = unique_name("c");
                    cmd.env(CONTAINER_VAR, &container);
                    let kill_container = || {
                        for _ in 0..50 {
                            let left = pids_with_env(&format!("{CONTAINER_VAR}={container}"));
                            if left.is_empty() {
                                break;
                            }
                            signal_all(&left, Signal::SIGKILL);
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    };
                    let mut proc = match Proc::spawn_as(&mut cmd, &tag, &log, &prefix) {
                        Ok(p) => p,
                        Err(e) => {
                            log.push(format!("{prefix}[kubelet] cannot start: {e}"));
                            std::thread::sleep(delay(0).max(Duration::from_secs(1)));
                            continue;
                        }
                    };
                    pid.store(proc.pid(), Ordering::SeqCst);
                    if let Ok(mut s) = starts.lock() {
                        s.push(Instant::now());
                    }
                    log.push(format!("{prefix}[kubelet] started pid={}", proc.pid()));
                    let status = loop {
                        if stop.load(Ordering::SeqCst) {
                            proc.kill_tree();
                            kill_container();
                            return;
                        }
                        if let Ok(Some(status)) = proc.child.try_wait() {
                            break status;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    };
                    pid.store(0, Ordering::SeqCst);
                    let restart_delay = delay(exits.fetch_add(1, Ordering::SeqCst) + 1);
                    log.push(format!(
                        "{prefix}[kubelet] exited {status}; restarting in {restart_delay:?}"
                    ));
                    // Whatever the container left behind dies with it.
                    proc.kill_tree();
                    kill_container();
                    let until = Instant::now() + restart_delay;
                    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        };
        Kubelet {
            stop,
            pid,
            starts,
            exits,
            thread: Some(thread),
        }
    }

    /// The running process's pid, if one is running.
    pub fn pid(&self) -> Option<i32> {
        Some(self.pid.load(Ordering::SeqCst)).filter(|p| *p > 0)
    }

    /// When each run started.
    pub fn starts(&self) -> Vec<Instant> {
        self.starts.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// How many times the command exited.
    pub fn exits(&self) -> usize {
        self.exits.load(Ordering::SeqCst)
    }

    /// Stop restarting and kill the running process tree.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}
