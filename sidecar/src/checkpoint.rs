//! Checkpoint freshness: the newest complete checkpoint in the checkpoint
//! directory, its age, and whether it is stale.
//!
//! A checkpoint is an entry of the directory (a file, or a directory such
//! as a `torch.distributed.checkpoint` folder) that has stopped changing for
//! the settle time and is not named like a temporary (`*.tmp`, `.*`,
//! `*.partial`). A `latest` pointer (a symlink, or a file holding the name of
//! the checkpoint, as DeepSpeed writes it) wins when it points at something
//! that exists.
//!
//! The directory is watched with inotify (through `notify`), or polled when
//! asked to or when it sits on a network or FUSE filesystem, where inotify
//! does not see other nodes' writes. A directory that does not exist yet is
//! waited for.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::RecursiveMode;
use tokio::sync::mpsc;

use crate::config::{CheckpointConfig, PollMode, format_duration};
use crate::events::EventSink;
use crate::status::{CheckpointStatus, Shared, rfc3339};

/// Names of pointer files or symlinks that name the newest checkpoint.
pub const POINTER_NAMES: &[&str] = &["latest", "LATEST", "latest.txt", "latest_checkpoint"];

/// Whether `name` looks like a checkpoint still being written.
pub fn is_temporary(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with('.')
        || lower.ends_with(".tmp")
        || lower.ends_with(".partial")
        || lower.ends_with(".part")
        || lower.ends_with(".incomplete")
        || lower.ends_with('~')
        || lower.contains(".tmp.")
        || lower.starts_with("tmp")
}

/// The newest complete checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Newest {
    pub path: PathBuf,
    pub modified: SystemTime,
    /// Found through a `latest` pointer.
    pub by_pointer: bool,
}

/// One look at the directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scan {
    pub newest: Option<Newest>,
    /// Entries that are still changing (not settled yet).
    pub settling: usize,
    /// When the earliest settling entry will have settled.
    pub next_settle: Option<SystemTime>,
}

/// The latest modification time of `path` and, for a directory, of
/// everything in it (bounded).
fn last_write(path: &Path, budget: &mut usize) -> Option<SystemTime> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let mut newest = meta.modified().ok()?;
    if meta.is_dir() {
        let entries = std::fs::read_dir(path).ok()?;
        for e in entries.flatten() {
            if *budget == 0 {
                break;
            }
            *budget -= 1;
            if let Some(t) = last_write(&e.path(), budget) {
                newest = newest.max(t);
            }
        }
    }
    Some(newest)
}

fn pointer_target(dir: &Path) -> Option<PathBuf> {
    for name in POINTER_NAMES {
        let p = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let target = if meta.file_type().is_symlink() {
            let t = std::fs::read_link(&p).ok()?;
            if t.is_absolute() { t } else { dir.join(t) }
        } else if meta.is_file() && meta.len() < 4096 {
            let text = std::fs::read_to_string(&p).ok()?;
            let line = text.lines().next()?.trim();
            if line.is_empty() {
                continue;
            }
            let t = PathBuf::from(line);
            if t.is_absolute() { t } else { dir.join(t) }
        } else {
            continue;
        };
        if target.exists() {
            return Some(target);
        }
    }
    None
}

/// Looks at `dir` at `now`: the newest entry that has not changed for
/// `settle`, or the `latest` pointer's target.
pub fn scan(dir: &Path, now: SystemTime, settle: Duration) -> std::io::Result<Scan> {
    let mut out = Scan::default();
    if let Some(target) = pointer_target(dir) {
        let mut budget = 10_000;
        if let Some(modified) = last_write(&target, &mut budget) {
            out.newest = Some(Newest {
                path: target,
                modified,
                by_pointer: true,
            });
            return Ok(out);
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if is_temporary(&name) || POINTER_NAMES.contains(&name.as_ref()) {
            continue;
        }
        let mut budget = 10_000;
        let Some(modified) = last_write(&entry.path(), &mut budget) else {
            continue;
        };
        let quiet = now.duration_since(modified).unwrap_or(Duration::ZERO);
        if quiet < settle {
            out.settling += 1;
            let at = modified + settle;
            out.next_settle = Some(out.next_settle.map_or(at, |n| n.min(at)));
            continue;
        }
        if out.newest.as_ref().is_none_or(|n| modified > n.modified) {
            out.newest = Some(Newest {
                path: entry.path(),
                modified,
                by_pointer: false,
            });
        }
    }
    Ok(out)
}

/// Filesystem types on which inotify does not see writes made elsewhere.
pub fn is_remote_fs(fstype: &str) -> bool {
    let t = fstype.to_ascii_lowercase();
    t.starts_with("nfs")
        || t.starts_with("fuse")
        || t.starts_with("smb")
        || matches!(
            t.as_str(),
            "cifs"
                | "9p"
                | "ceph"
                | "lustre"
                | "glusterfs"
                | "gpfs"
                | "beegfs"
                | "afs"
                | "virtiofs"
                | "panfs"
                | "wekafs"
                | "orangefs"
        )
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The filesystem type holding `path`, from a `/proc/self/mountinfo` text.
pub fn fs_type_of(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        let Some(fstype) = right.split(' ').next() else {
            continue;
        };
        let mp = PathBuf::from(unescape_mount(mount_point));
        if path.starts_with(&mp) {
            let len = mp.as_os_str().len();
            if best.as_ref().is_none_or(|(l, _)| len >= *l) {
                best = Some((len, fstype.to_string()));
            }
        }
    }
    best.map(|(_, t)| t)
}

/// Whether to poll `dir`, and why.
pub fn should_poll(mode: PollMode, dir: &Path) -> (bool, String) {
    match mode {
        PollMode::Always => (true, "TRAINWIRE_CHECKPOINT_POLL=true".into()),
        PollMode::Never => (false, "TRAINWIRE_CHECKPOINT_POLL=false".into()),
        PollMode::Auto => {
            let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
            let fstype = std::fs::read_to_string("/proc/self/mountinfo")
                .ok()
                .and_then(|m| fs_type_of(&m, &real));
            match fstype {
                Some(t) if is_remote_fs(&t) => (
                    true,
                    format!(
                        "{} is on {t}, where inotify misses other nodes' writes",
                        real.display()
                    ),
                ),
                Some(t) => (false, format!("{} is on {t}", real.display())),
                None => (false, "filesystem type unknown".into()),
            }
        }
    }
}

/// Tracks stale episodes so each is reported once.
struct Freshness {
    stale: bool,
    /// The newest checkpoint as last recorded on the pod, and when.
    recorded: Option<(
        trainwire_contract::world::CheckpointRecord,
        std::time::Instant,
    )>,
}

/// The shortest time between two records of the newest checkpoint on the
/// pod (one merge patch each): a job that checkpoints every few seconds
/// still costs the API server at most one write per pod per this.
pub const RECORD_EVERY: Duration = Duration::from_secs(30);

/// The record of `newest` to write now, if it differs from the one last
/// recorded and that one is at least [`RECORD_EVERY`] old.
fn record_due(
    recorded: Option<&(
        trainwire_contract::world::CheckpointRecord,
        std::time::Instant,
    )>,
    newest: &trainwire_contract::world::CheckpointRecord,
    now: std::time::Instant,
) -> bool {
    match recorded {
        None => true,
        Some((last, at)) => last != newest && now.saturating_duration_since(*at) >= RECORD_EVERY,
    }
}

/// Time after which a file-system call of the checkpoint thread that has
/// not returned makes the checkpoint state *unknown* (a hung volume).
pub const SCAN_TIMEOUT: Duration = Duration::from_secs(10);

/// What the checkpoint thread tells the async side.
#[derive(Debug)]
enum Msg {
    /// A blocking file-system call starts (`what`).
    Busy(String),
    /// The directory does not exist (yet).
    Missing,
    /// Watching with `watcher`, because `why`.
    Watching { watcher: &'static str, why: String },
    /// A scan finished.
    Scanned {
        watcher: &'static str,
        result: Result<Scan, String>,
    },
}

/// The blocking half: every file-system call on the checkpoint volume runs
/// on this dedicated thread, never on the runtime that answers heartbeats
/// and probes. A volume that stops answering blocks only this thread; the
/// async half notices (`Busy` with no result) and reports the checkpoint
/// state as unknown. Ends when the async half is gone.
fn blocking_loop(config: CheckpointConfig, tx: mpsc::UnboundedSender<Msg>) {
    let dir = config.dir.clone();
    let send = |m: Msg| tx.send(m).is_ok();
    loop {
        if !send(Msg::Busy(format!("checking that {} exists", dir.display()))) {
            return;
        }
        if !dir.is_dir() {
            if !send(Msg::Missing) {
                return;
            }
            std::thread::sleep(config.poll_interval.min(Duration::from_secs(5)));
            continue;
        }
        if !send(Msg::Busy(format!(
            "reading the mounts of {}",
            dir.display()
        ))) {
            return;
        }
        let (poll, why) = should_poll(config.poll, &dir);
        let (ntx, nrx) = std::sync::mpsc::channel::<()>();
        let mut debouncer = None;
        if !poll {
            let made = notify_debouncer_full::new_debouncer(
                Duration::from_millis(200),
                None,
                move |_res: notify_debouncer_full::DebounceEventResult| {
                    let _ = ntx.send(());
                },
            );
            match made {
                Ok(mut d) => match d.watch(&dir, RecursiveMode::Recursive) {
                    Ok(()) => debouncer = Some(d),
                    Err(e) => tracing::warn!(error = %e, "inotify watch failed; polling instead"),
                },
                Err(e) => tracing::warn!(error = %e, "inotify unavailable; polling instead"),
            }
        }
        let watcher = if debouncer.is_some() {
            "inotify"
        } else {
            "poll"
        };
        if !send(Msg::Watching { watcher, why }) {
            return;
        }
        loop {
            if !send(Msg::Busy(format!("scanning {}", dir.display()))) {
                return;
            }
            let now = SystemTime::now();
            let result = scan(&dir, now, config.settle);
            let mut wait = Duration::from_secs(30);
            if let Ok(s) = &result
                && let Some(at) = s.next_settle
            {
                wait = wait.min(
                    at.duration_since(now).unwrap_or(Duration::ZERO) + Duration::from_millis(50),
                );
            }
            if debouncer.is_none() || result.is_err() {
                wait = wait.min(config.poll_interval);
            }
            let gone = result.is_err() && !dir.is_dir();
            if !send(Msg::Scanned {
                watcher,
                result: result.map_err(|e| format!("cannot read {}: {e}", dir.display())),
            }) {
                return;
            }
            if gone {
                break;
            }
            let wait = wait.max(Duration::from_millis(50));
            match nrx.recv_timeout(wait) {
                // Drain a burst of notifications.
                Ok(()) => while nrx.try_recv().is_ok() {},
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(wait);
                }
            }
            if !send(Msg::Busy(format!("checking that {} exists", dir.display()))) {
                return;
            }
            if !dir.is_dir() {
                break;
            }
        }
        drop(debouncer);
    }
}

/// Watches the checkpoint directory until the task is dropped. The file
/// system is only touched by a dedicated thread ([`blocking_loop`]); this
/// task turns its results into status, metrics and Events, and reports the
/// checkpoint state as unknown when the thread is stuck in a call to a
/// volume that does not answer.
pub async fn run(shared: Arc<Shared>, config: CheckpointConfig, events: EventSink) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    {
        let config = config.clone();
        let spawned = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || blocking_loop(config, tx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the checkpoint thread; no checkpoint watch");
            return;
        }
    }
    let dir = config.dir.clone();
    let mut fresh = Freshness {
        stale: false,
        recorded: None,
    };
    let mut said_missing = false;
    let mut watcher: &'static str = "waiting";
    let mut last: Option<Scan> = None;
    let mut problem: Option<String> = None;
    let mut busy: Option<(String, std::time::Instant)> = None;
    let mut hung_reported = false;
    let mut recheck = Duration::from_secs(1);
    loop {
        let msg = tokio::select! {
            m = rx.recv() => match m {
                Some(m) => Some(m),
                None => {
                    tracing::error!("the checkpoint thread stopped");
                    return;
                }
            },
            _ = tokio::time::sleep(recheck.min(Duration::from_secs(1))) => None,
        };
        match msg {
            Some(Msg::Busy(what)) => {
                busy = Some((what, std::time::Instant::now()));
                continue;
            }
            Some(Msg::Missing) => {
                busy = None;
                if !said_missing {
                    tracing::warn!(dir = %dir.display(), "checkpoint directory does not exist yet; waiting for it");
                    said_missing = true;
                }
                watcher = "waiting";
                last = None;
                problem = Some(format!("{} does not exist yet", dir.display()));
            }
            Some(Msg::Watching { watcher: w, why }) => {
                busy = None;
                said_missing = false;
                watcher = w;
                tracing::info!(dir = %dir.display(), watcher, "watching checkpoints: {why}");
                continue;
            }
            Some(Msg::Scanned { watcher: w, result }) => {
                busy = None;
                watcher = w;
                match result {
                    Ok(s) => {
                        last = Some(s);
                        problem = None;
                    }
                    Err(e) => {
                        last = None;
                        problem = Some(e);
                    }
                }
            }
            None => {}
        }
        if hung_reported && busy.is_none() {
            tracing::info!(dir = %dir.display(), "the checkpoint volume answers again");
            hung_reported = false;
        }
        if let Some((what, since)) = &busy {
            let for_ = since.elapsed();
            if for_ < SCAN_TIMEOUT {
                continue;
            }
            let text = format!(
                "unknown: {what} has not returned for {}s (the volume does not answer)",
                for_.as_secs()
            );
            if !hung_reported {
                tracing::warn!(dir = %dir.display(), "checkpoint state {text}");
                events.publish(true, "CheckpointUnknown", "report", text.clone());
                hung_reported = true;
            }
            let mut s = shared.status();
            match s.checkpoint.as_mut() {
                Some(c) => c.problem = Some(text),
                None => {
                    s.checkpoint = Some(CheckpointStatus {
                        dir: dir.display().to_string(),
                        watcher,
                        max_age_seconds: config.max_age.as_secs_f64(),
                        problem: Some(text),
                        ..CheckpointStatus::default()
                    })
                }
            }
            continue;
        }
        recheck = update(
            &shared,
            &config,
            &mut fresh,
            &events,
            last.as_ref(),
            watcher,
            problem.clone(),
        );
    }
}

/// Records one scan in status and metrics; reports stale transitions.
/// Returns how long until the stale state could change.
fn update(
    shared: &Shared,
    config: &CheckpointConfig,
    fresh: &mut Freshness,
    events: &EventSink,
    scan: Option<&Scan>,
    watcher: &'static str,
    problem: Option<String>,
) -> Duration {
    let now = SystemTime::now();
    let newest = scan.and_then(|s| s.newest.clone());
    let age = match &newest {
        Some(n) => now.duration_since(n.modified).unwrap_or(Duration::ZERO),
        None => now.duration_since(shared.started).unwrap_or(Duration::ZERO),
    };
    let stale = age > config.max_age;
    shared.metrics.checkpoint_age.set(age.as_secs_f64());
    shared.metrics.checkpoint_stale.set(i64::from(stale));
    if stale && !fresh.stale {
        shared.metrics.checkpoint_stale_episodes.inc();
        let what = match &newest {
            Some(n) => format!(
                "newest checkpoint {} is {} old (max age {})",
                n.path.display(),
                format_duration(Duration::from_secs(age.as_secs())),
                format_duration(config.max_age)
            ),
            None => format!(
                "no complete checkpoint in {} within {} of start",
                config.dir.display(),
                format_duration(config.max_age)
            ),
        };
        tracing::warn!("checkpoint stale: {what}");
        events.publish(true, "CheckpointStale", "report", what);
    } else if !stale && fresh.stale {
        tracing::info!(
            path = newest.as_ref().map(|n| n.path.display().to_string()),
            "checkpoint fresh again"
        );
    }
    fresh.stale = stale;
    let mut next_record = None;
    if let Some(n) = &newest {
        let record = trainwire_contract::world::CheckpointRecord {
            name: n
                .path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            at: rfc3339(n.modified),
        };
        let mono = std::time::Instant::now();
        if record_due(fresh.recorded.as_ref(), &record, mono) {
            events.record_checkpoint(&record);
            fresh.recorded = Some((record, mono));
        } else if fresh
            .recorded
            .as_ref()
            .is_some_and(|(last, _)| *last != record)
        {
            // A newer one waits for its turn: look again then.
            next_record = fresh
                .recorded
                .as_ref()
                .map(|(_, at)| RECORD_EVERY.saturating_sub(mono.saturating_duration_since(*at)));
        }
    }
    let status = CheckpointStatus {
        dir: config.dir.display().to_string(),
        watcher,
        newest: newest.as_ref().map(|n| n.path.display().to_string()),
        modified: newest.as_ref().map(|n| rfc3339(n.modified)),
        age_seconds: newest.as_ref().map(|_| age.as_secs_f64()),
        max_age_seconds: config.max_age.as_secs_f64(),
        stale,
        problem,
    };
    shared.status().checkpoint = Some(status);
    let next = if stale {
        Duration::from_secs(60)
    } else {
        (config.max_age - age + Duration::from_millis(100)).min(Duration::from_secs(60))
    };
    next_record.map_or(next, |r| next.min(r + Duration::from_millis(100)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_checkpoint_is_recorded_at_most_every_30s() {
        use trainwire_contract::world::CheckpointRecord;
        let rec = |name: &str| CheckpointRecord {
            name: name.into(),
            at: "2026-11-25T10:00:00Z".into(),
        };
        let t = std::time::Instant::now();
        assert!(record_due(None, &rec("a"), t));
        let last = (rec("a"), t);
        assert!(!record_due(
            Some(&last),
            &rec("a"),
            t + Duration::from_secs(120)
        ));
        assert!(!record_due(
            Some(&last),
            &rec("b"),
            t + Duration::from_secs(29)
        ));
        assert!(record_due(Some(&last), &rec("b"), t + RECORD_EVERY));
    }

    #[test]
    fn temporary_names() {
        for n in [
            ".ckpt-3.pt.swp",
            "ckpt.pt.tmp",
            "step-100.partial",
            "tmpabc123",
            "x.tmp.1",
        ] {
            assert!(is_temporary(n), "{n}");
        }
        for n in ["ckpt-3.pt", "global_step100", "model.safetensors"] {
            assert!(!is_temporary(n), "{n}");
        }
    }

    #[test]
    fn remote_filesystems_from_mountinfo() {
        let mi = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:45 / /checkpoints rw,relatime shared:20 - nfs4 10.0.0.5:/export/ckpt rw,vers=4.1
41 22 0:46 / /data\\040set rw - fuse.gcsfuse bucket rw
42 40 0:47 / /checkpoints/local rw - tmpfs tmpfs rw
";
        assert_eq!(
            fs_type_of(mi, Path::new("/checkpoints/run1")).as_deref(),
            Some("nfs4")
        );
        assert_eq!(
            fs_type_of(mi, Path::new("/checkpoints/local/x")).as_deref(),
            Some("tmpfs")
        );
        assert_eq!(
            fs_type_of(mi, Path::new("/data set/x")).as_deref(),
            Some("fuse.gcsfuse")
        );
        assert_eq!(fs_type_of(mi, Path::new("/home")).as_deref(), Some("ext4"));
        assert!(is_remote_fs("nfs4") && is_remote_fs("fuse.gcsfuse") && is_remote_fs("cifs"));
        assert!(!is_remote_fs("ext4") && !is_remote_fs("tmpfs") && !is_remote_fs("overlay"));
    }
}
