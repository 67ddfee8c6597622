//! Real processes for end-to-end tests: spawn with captured, timestamped
//! output; wait (always bounded) for a log line; and kill every process a
//! test started, including the ones that left their parent's session.
//!
//! torchrun starts its workers in a new session, and when an agent is
//! SIGKILLed its workers are reparented, so neither a process group nor the
//! parent/child tree is enough to find them all again. Every process a test
//! starts therefore carries a unique [`Tag`] in its environment, which every
//! descendant inherits; cleanup scans `/proc/*/environ` for it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Environment variable that marks every process a test started.
pub const TAG_VAR: &str = "TRAINWIRE_TEST_TAG";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this test process and call: `<prefix><pid><n>` in hex.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}{n:x}", std::process::id())
}

/// A unique marker put in the environment of every process a test starts.
/// Dropping it SIGKILLs every process that still carries it.
#[derive(Debug)]
pub struct Tag(String);

impl Tag {
    pub fn new(prefix: &str) -> Self {
        Tag(unique_name(prefix))
    }

    pub fn value(&self) -> &str {
        &self.0
    }

    /// Mark `cmd` (and so all its descendants) with this tag.
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env(TAG_VAR, &self.0)
    }

    /// Live processes that carry this tag (zombies excluded).
    pub fn pids(&self) -> Vec<i32> {
        let needle = format!("{TAG_VAR}={}", self.0);
        pids_with_env(&needle)
    }

    /// SIGKILL every tagged process until none is left (bounded).
    pub fn kill_all(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Live processes whose environment holds exactly `needle` (`KEY=value`).
pub fn pids_with_env(needle: &str) -> Vec<i32> {
    live_pids_where(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
    })
}

/// Live processes whose program (`argv[0]`) contains `program` and whose
/// command line contains `needle`.
pub fn pids_with_cmdline(program: &str, needle: &str) -> Vec<i32> {
    live_pids_where(|pid| {
        let line = cmdline(pid);
        line.split(' ').next().is_some_and(|p| p.contains(program)) && line.contains(needle)
    })
}

fn live_pids_where(mut pred: impl FnMut(i32) -> bool) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|pid| !is_zombie(*pid) && pred(*pid))
        .collect()
}

/// `(state, ppid)` of a process from `/proc/<pid>/stat`.
pub fn stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: split after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

fn is_zombie(pid: i32) -> bool {
    matches!(stat(pid), Some(('Z', _)) | Some(('X', _)) | None)
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    !is_zombie(pid)
}

/// The command line of a process, arguments joined by spaces.
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// Live descendants of `pid` (children, grandchildren, ...), found through `/proc`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            if let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
                && let Some((state, ppid)) = stat(p)
                && state != 'Z'
            {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut found = BTreeSet::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, ppid) in &parent_of {
            if ppid == p && found.insert(child) {
                frontier.push(child);
            }
        }
    }
    found.into_iter().collect()
}

/// Send `sig` to each pid, ignoring processes that are already gone.
pub fn signal_all(pids: &[i32], sig: Signal) {
    for &pid in pids {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// One captured output line and when it was read.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: Instant,
    pub text: String,
}

#[derive(Default)]
struct LogInner {
    lines: Vec<Line>,
    open_streams: usize,
}

/// The captured output (stdout and stderr, interleaved by arrival) of one or
/// more processes. Cheap to clone; clones share the lines.
#[derive(Clone)]
pub struct Log {
    name: String,
    created: Instant,
    inner: Arc<(Mutex<LogInner>, Condvar)>,
}

impl Log {
    pub fn new(name: &str) -> Self {
        Log {
            name: name.to_string(),
            created: Instant::now(),
            inner: Arc::default(),
        }
    }

    /// Read `stream` line by line on a thread, appending to this log.
    pub fn attach(&self, stream: impl Read + Send + 'static) {
        self.attach_as(stream, "");
    }

    /// Like [`Log::attach`], each line starting with `prefix` (which process
    /// wrote it, when several share one timeline).
    pub fn attach_as(&self, stream: impl Read + Send + 'static, prefix: &str) {
        let log = self.clone();
        let prefix = prefix.to_string();
        {
            let (m, _) = &*self.inner;
            if let Ok(mut g) = m.lock() {
                g.open_streams += 1;
            }
        }
        std::thread::spawn(move || {
            let reader = BufReader::new(stream);
            for line in reader.split(b'\n') {
                let Ok(line) = line else { break };
                log.push(format!(
                    "{prefix}{}",
                    String::from_utf8_lossy(&line).trim_end()
                ));
            }
            let (m, cv) = &*log.inner;
            if let Ok(mut g) = m.lock() {
                g.open_streams = g.open_streams.saturating_sub(1);
            }
            cv.notify_all();
        });
    }

    /// Append a line (the harness's own notes go in the same timeline).
    pub fn push(&self, text: String) {
        if std::env::var_os("TRAINWIRE_TEST_ECHO").is_some() {
            eprintln!(
                "[{} +{:.3}s] {text}",
                self.name,
                self.created.elapsed().as_secs_f64()
            );
        }
        let (m, cv) = &*self.inner;
        if let Ok(mut g) = m.lock() {
            g.lines.push(Line {
                at: Instant::now(),
                text,
            });
        }
        cv.notify_all();
    }

    pub fn lines(&self) -> Vec<Line> {
        let (m, _) = &*self.inner;
        m.lock().map(|g| g.lines.clone()).unwrap_or_default()
    }

    /// Number of lines so far; pass it to [`Log::wait_for_after`] to only
    /// look at lines that come later.
    pub fn mark(&self) -> usize {
        let (m, _) = &*self.inner;
        m.lock().map(|g| g.lines.len()).unwrap_or(0)
    }

    /// Wait at most `timeout` for a line matching `pred`.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<Line> {
        self.wait_for_after(0, timeout, pred)
    }

    /// Wait at most `timeout` for a line with index `>= from` matching `pred`.
    pub fn wait_for_after(
        &self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<Line> {
        let deadline = Instant::now() + timeout;
        let (m, cv) = &*self.inner;
        let mut g = m.lock().ok()?;
        let mut seen = from;
        loop {
            if let Some(l) = g.lines.iter().skip(seen).find(|l| pred(&l.text)) {
                return Some(l.clone());
            }
            seen = g.lines.len().max(from);
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = cv.wait_timeout(g, deadline - now).ok()?.0;
        }
    }

    /// The whole log as text, for failure messages (the last `max` lines).
    pub fn tail(&self, max: usize) -> String {
        let lines = self.lines();
        let skip = lines.len().saturating_sub(max);
        lines
            .iter()
            .skip(skip)
            .map(|l| {
                let at = l.at.duration_since(self.created).as_secs_f64();
                format!("[{} +{at:.3}s] {}", self.name, l.text)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A spawned process with its output captured into a [`Log`].
pub struct Proc {
    pub child: Child,
    pub log: Log,
}

impl Proc {
    /// Spawn `cmd` with stdout and stderr captured into `log`, tagged with `tag`.
    pub fn spawn(cmd: &mut Command, tag: &Tag, log: &Log) -> std::io::Result<Proc> {
        Proc::spawn_as(cmd, tag.value(), log, "")
    }

    /// Spawn `cmd` tagged with the tag value `tag`, its output lines going to
    /// `log`, each starting with `prefix`.
    pub fn spawn_as(
        cmd: &mut Command,
        tag: &str,
        log: &Log,
        prefix: &str,
    ) -> std::io::Result<Proc> {
        cmd.env(TAG_VAR, tag);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        if let Some(out) = child.stdout.take() {
            log.attach_as(out, prefix);
        }
        if let Some(err) = child.stderr.take() {
            log.attach_as(err, prefix);
        }
        Ok(Proc {
            child,
            log: log.clone(),
        })
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// Wait at most `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL the process and all its descendants found in `/proc`.
    pub fn kill_tree(&mut self) {
        let pid = self.pid();
        let mut pids = descendants(pid);
        pids.push(pid);
        signal_all(&pids, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_tree();
        }
    }
}

/// Whether the process running this test is root (namespaces need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub use crate::net::free_port;

/// Whether `path` is an existing executable file.
pub fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A memory figure of a process from `/proc/<pid>/status`, in KiB: `field`
/// is `VmHWM` (peak RSS), `VmRSS`, ...; `pid` is a number or `self`.
pub fn status_kib(pid: impl std::fmt::Display, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn status_kib_reads_this_process() {
        let peak = super::status_kib("self", "VmHWM").expect("VmHWM");
        let now = super::status_kib(std::process::id(), "VmRSS").expect("VmRSS");
        assert!(peak > 0 && now > 0, "VmHWM {peak}, VmRSS {now}");
        assert_eq!(super::status_kib("self", "NoSuchField"), None);
    }
}
