//! The trainer's rendezvous handler (`trainwire-c10d`, Python, in
//! `sidecar/rendezvous/`): its files, which this binary carries and
//! installs into the pod's shared emptyDir (`trainwire-sidecar
//! install-rendezvous-handler DIR`, an init container), and the channel that
//! tells it of a confirmed loss.
//!
//! The channel is one file in [`trainwire_contract::env::RENDEZVOUS_DIR`]:
//! [`LOSS_FILE`], replaced atomically (write then rename) with the most
//! recent confirmed losses, each named by the lost pod's rank (its index),
//! the episode's generation and the wall-clock time of the confirmation.
//! The handler `stat`s it at each of its agent's `num_nodes_waiting()` calls
//! (every 0.1 s), evicts from torch's rendezvous the agents that ran in that
//! pod and have not beaten since the confirmation, and restarts its workers.
//!
//! The other way, the handler writes [`NODE_FILE`] ([`agent_node`]): its
//! agent's pid and start time and what the agent got from its last completed
//! rendezvous (torch's node rank, the nodes in the round). It tells the
//! sidecar torch's node rank when the workers' `/proc/<pid>/environ` does
//! not: a worker forked by the agent's forkserver (warm workers) carries
//! the forkserver's environment, and another user's is not readable.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub use trainwire_contract::rendezvous::{HANDLER_BACKEND, LOSS_FILE, NODE_FILE};

/// The handler's files, relative to the directory put on `PYTHONPATH`.
pub const HANDLER_FILES: [(&str, &str); 6] = [
    (
        "trainwire_rendezvous/__init__.py",
        include_str!("../rendezvous/trainwire_rendezvous/__init__.py"),
    ),
    (
        "trainwire_rendezvous-1.0.dist-info/METADATA",
        include_str!("../rendezvous/trainwire_rendezvous-1.0.dist-info/METADATA"),
    ),
    (
        "trainwire_rendezvous-1.0.dist-info/entry_points.txt",
        include_str!("../rendezvous/trainwire_rendezvous-1.0.dist-info/entry_points.txt"),
    ),
    (
        "trainwire_rendezvous-1.0.dist-info/RECORD",
        include_str!("../rendezvous/trainwire_rendezvous-1.0.dist-info/RECORD"),
    ),
    // How workers start: the forkserver at the agent's start, the script
    // as `python -u` runs it.
    (
        "trainwire_workers.py",
        include_str!("../rendezvous/trainwire_workers.py"),
    ),
    // The workers' Python stacks on the sidecar's signal (a stall), and the
    // forkserver started early (trainwire_workers).
    (
        "sitecustomize.py",
        include_str!("../rendezvous/sitecustomize.py"),
    ),
];

/// Most losses kept in the loss file.
pub const MAX_LOSSES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}

/// Installs the handler below `python_dir` (files readable by every user)
/// and creates `channel_dir` writable by every user, sticky like `/tmp`:
/// the trainer and the sidecar may run as different users, each replaces
/// only its own file.
pub fn install(python_dir: &Path, channel_dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let mkdir = |dir: &Path, mode: u32| {
        let err = |source| Error::Write {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(err)
    };
    for (rel, text) in HANDLER_FILES {
        let path = python_dir.join(rel);
        if let Some(parent) = path.parent() {
            mkdir(parent, 0o755)?;
        }
        write_atomic(&path, text.as_bytes(), 0o644)?;
    }
    mkdir(python_dir, 0o755)?;
    mkdir(channel_dir, 0o1777)
}

/// Most bytes of [`NODE_FILE`] read: the handler writes a few hundred.
pub const MAX_NODE_BYTES: u64 = 16 * 1024;

/// Why the agent's [`NODE_FILE`] tells nothing.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "{path} does not exist: the trainer's rendezvous handler has not written it (no trainwire-c10d agent started yet)"
    )]
    Missing { path: PathBuf },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is over {MAX_NODE_BYTES} bytes: not the handler's file")]
    TooLarge { path: PathBuf },
    #[error("{path} is not the handler's node file: {source}")]
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} names agent pid {pid}, which {why}: a file left by an agent that is gone")]
    Stale {
        path: PathBuf,
        pid: i32,
        why: &'static str,
    },
}

/// What the handler wrote of its agent ([`NODE_FILE`]), accepted only while
/// that agent runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct AgentNode {
    /// The agent's pid (the pod shares one PID namespace).
    pub pid: i32,
    /// The agent's start in clock ticks since boot (`/proc/<pid>/stat`
    /// field 22): the fence against a pid reused by another process.
    pub pid_start_ticks: u64,
    /// The rendezvous round of the last completed rendezvous.
    #[serde(default)]
    pub round: Option<u64>,
    /// torch's node rank (`GROUP_RANK` of the round's workers).
    #[serde(default)]
    pub group_rank: Option<u32>,
    /// The nodes in the round.
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Whether the handler hears the sidecar's losses.
    #[serde(default)]
    pub fast: bool,
    /// The port of the store the round's workers meet at (torch's
    /// `bootstrap_store_info.master_port`, their `MASTER_PORT`).
    #[serde(default)]
    pub workers_store_port: Option<u16>,
}

/// Parses [`NODE_FILE`]'s bytes (no fence).
pub fn parse_agent_node(path: &Path, bytes: &[u8]) -> Result<AgentNode, NodeError> {
    serde_json::from_slice(bytes).map_err(|source| NodeError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// The agent's node file in the channel directory `dir`, read (at most
/// [`MAX_NODE_BYTES`]) and fenced: accepted only when its pid runs under
/// `proc_root` (normally `/proc`) with the start time the file names, so a
/// file left by a dead agent, or by one whose pid another process now has,
/// is refused. Blocking: call off the runtime thread.
pub fn agent_node(dir: &Path, proc_root: &Path) -> Result<AgentNode, NodeError> {
    use std::io::Read;
    let path = dir.join(NODE_FILE);
    let file = std::fs::File::open(&path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            NodeError::Missing { path: path.clone() }
        } else {
            NodeError::Read {
                path: path.clone(),
                source,
            }
        }
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_NODE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| NodeError::Read {
            path: path.clone(),
            source,
        })?;
    if bytes.len() as u64 > MAX_NODE_BYTES {
        return Err(NodeError::TooLarge { path });
    }
    let node = parse_agent_node(&path, &bytes)?;
    let stale = |why| NodeError::Stale {
        path: path.clone(),
        pid: node.pid,
        why,
    };
    if node.pid <= 0 {
        return Err(stale("is no process"));
    }
    let stat = std::fs::read_to_string(proc_root.join(node.pid.to_string()).join("stat"))
        .map_err(|_| stale("is not running"))?;
    let (_, start) = crate::signal::parse_stat(&stat).ok_or_else(|| stale("is not running"))?;
    if start != node.pid_start_ticks {
        return Err(stale("is another process now (another start time)"));
    }
    if crate::signal::parse_state(&stat).is_some_and(|s| s == 'Z' || s == 'X') {
        return Err(stale("has exited"));
    }
    Ok(node)
}

/// [`agent_node`] of one of `agents` (pids of the trainer's agents found in
/// `proc_root`); `None` (logged at debug) when there is none.
pub fn agent_node_of(dir: &Path, proc_root: &Path, agents: &[i32]) -> Option<AgentNode> {
    match agent_node(dir, proc_root) {
        Ok(node) if agents.contains(&node.pid) => Some(node),
        Ok(node) => {
            tracing::debug!(
                pid = node.pid,
                "{}: its agent is not the trainer's agent",
                dir.join(NODE_FILE).display()
            );
            None
        }
        Err(e) => {
            tracing::debug!("{e}");
            None
        }
    }
}

/// One confirmed loss as the handler reads it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LossEntry {
    pub id: String,
    pub rank: u32,
    pub confirmed_unix_ms: u64,
}

impl LossEntry {
    pub fn new(rank: u32, generation: u64, confirmed: SystemTime) -> Self {
        let ms = confirmed
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        LossEntry {
            id: format!("{rank}-{generation}"),
            rank,
            confirmed_unix_ms: ms,
        }
    }
}

#[derive(serde::Serialize)]
struct LossDoc<'a> {
    losses: &'a VecDeque<LossEntry>,
}

/// The sidecar's end of the channel.
#[derive(Debug, Clone)]
pub struct Channel {
    path: PathBuf,
    recent: Arc<Mutex<VecDeque<LossEntry>>>,
}

impl Channel {
    pub fn new(dir: &Path) -> Self {
        Channel {
            path: dir.join(LOSS_FILE),
            recent: Arc::default(),
        }
    }

    /// Adds `loss` and writes the file (blocking: call off the runtime
    /// thread). Writes run one at a time, each with every loss added so far,
    /// so the last write holds them all whatever order they ran in.
    pub fn tell(&self, loss: LossEntry) -> Result<(), Error> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if !recent.contains(&loss) {
            recent.push_back(loss);
        }
        while recent.len() > MAX_LOSSES {
            recent.pop_front();
        }
        let doc = serde_json::to_vec(&LossDoc { losses: &recent }).unwrap_or_default();
        write_atomic(&self.path, &doc, 0o644)
    }

    /// [`Channel::tell`] on the blocking pool; a failure is logged (torch's
    /// own keep-alive still drops the node, later).
    pub fn tell_in_background(&self, loss: LossEntry) {
        let channel = self.clone();
        tokio::task::spawn_blocking(move || {
            let rank = loss.rank;
            match channel.tell(loss) {
                Ok(()) => tracing::info!(rank, "loss handed to the trainer's rendezvous handler"),
                Err(e) => tracing::warn!(
                    rank,
                    "{e}: the trainer's rendezvous handler does not hear of the loss; torch's keep-alive drops the node later"
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_writes_the_package_and_a_shared_channel_dir() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let python = tmp.path().join("python");
        let channel = tmp.path().join("rendezvous");
        install(&python, &channel).expect("install");
        // Twice is fine (an init container that runs again).
        install(&python, &channel).expect("install again");
        let eps = std::fs::read_to_string(
            python.join("trainwire_rendezvous-1.0.dist-info/entry_points.txt"),
        )
        .expect("entry points");
        assert!(eps.contains(&format!(
            "[torchrun.handlers]\n{HANDLER_BACKEND} = trainwire_rendezvous:creator"
        )));
        let init = python.join("trainwire_rendezvous/__init__.py");
        let src = std::fs::read_to_string(&init).expect("module");
        assert!(src.contains(&format!("BACKEND = \"{HANDLER_BACKEND}\"")));
        assert!(src.contains(&format!("LOSS_FILE = \"{LOSS_FILE}\"")));
        assert!(src.contains(&format!("NODE_FILE = \"{NODE_FILE}\"")));
        assert!(src.contains(&format!(
            "DEFAULT_DIR = \"{}\"",
            trainwire_contract::rendezvous::CHANNEL_DIR
        )));
        assert!(src.contains(&format!(
            "DIR_ENV = \"{}\"",
            trainwire_contract::env::RENDEZVOUS_DIR
        )));
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o7777;
        assert_eq!(mode(&init), 0o644);
        assert_eq!(mode(&channel), 0o1777);
    }

    fn own_start_ticks() -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        crate::signal::parse_stat(&stat).expect("parse").1
    }

    fn write_node(dir: &Path, text: &str) {
        std::fs::write(dir.join(NODE_FILE), text).expect("write");
    }

    #[test]
    fn the_agents_node_file_is_read_while_its_agent_runs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let proc_root = Path::new("/proc");
        let pid = std::process::id() as i32;
        let start = own_start_ticks();
        assert!(matches!(
            agent_node(tmp.path(), proc_root),
            Err(NodeError::Missing { .. })
        ));
        // As the handler writes it (extra fields are ignored).
        write_node(
            tmp.path(),
            &format!(
                r#"{{"addr": "node-1", "pid": {pid}, "pid_start_ticks": {start}, "local_id": 0,
                "run_id": "job", "fast": true, "why_not": null, "round": 3, "group_rank": 1,
                "world_size": 2}}"#
            ),
        );
        let node = agent_node(tmp.path(), proc_root).expect("node");
        assert_eq!(node.pid, pid);
        assert_eq!(node.group_rank, Some(1));
        assert_eq!(node.world_size, Some(2));
        assert_eq!(node.round, Some(3));
        assert!(node.fast);
        assert_eq!(agent_node_of(tmp.path(), proc_root, &[pid]), Some(node));
        assert_eq!(agent_node_of(tmp.path(), proc_root, &[pid + 1]), None);
        // Before the first rendezvous completes: no rank yet.
        write_node(
            tmp.path(),
            &format!(r#"{{"pid": {pid}, "pid_start_ticks": {start}, "group_rank": null}}"#),
        );
        assert_eq!(
            agent_node(tmp.path(), proc_root).expect("node").group_rank,
            None
        );
    }

    #[test]
    fn a_node_file_of_a_dead_or_replaced_agent_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let proc_root = Path::new("/proc");
        let pid = std::process::id() as i32;
        let start = own_start_ticks();
        // The pid now runs another process (another start time).
        write_node(
            tmp.path(),
            &format!(
                r#"{{"pid": {pid}, "pid_start_ticks": {}, "group_rank": 1}}"#,
                start + 1
            ),
        );
        assert!(matches!(
            agent_node(tmp.path(), proc_root),
            Err(NodeError::Stale { .. })
        ));
        // An agent that exited (a reaped child's pid).
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let gone = child.id() as i32;
        child.wait().expect("wait");
        write_node(
            tmp.path(),
            &format!(r#"{{"pid": {gone}, "pid_start_ticks": {start}, "group_rank": 1}}"#),
        );
        let err = agent_node(tmp.path(), proc_root).expect_err("stale");
        assert!(matches!(err, NodeError::Stale { .. }), "{err}");
        for pid in [0, -1] {
            write_node(
                tmp.path(),
                &format!(r#"{{"pid": {pid}, "pid_start_ticks": {start}}}"#),
            );
            assert!(matches!(
                agent_node(tmp.path(), proc_root),
                Err(NodeError::Stale { .. })
            ));
        }
    }

    #[test]
    fn a_node_file_is_read_within_its_bound() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pid = std::process::id() as i32;
        let start = own_start_ticks();
        let doc = format!(r#"{{"pid": {pid}, "pid_start_ticks": {start}, "group_rank": 0}}"#);
        // Padded with whitespace to exactly the bound: read.
        let pad = MAX_NODE_BYTES as usize - doc.len();
        write_node(tmp.path(), &format!("{doc}{}", " ".repeat(pad)));
        assert!(agent_node(tmp.path(), Path::new("/proc")).is_ok());
        // One byte over: refused, whatever it holds.
        write_node(tmp.path(), &format!("{doc}{}", " ".repeat(pad + 1)));
        assert!(matches!(
            agent_node(tmp.path(), Path::new("/proc")),
            Err(NodeError::TooLarge { .. })
        ));
        for bad in [
            "",
            "null",
            "[]",
            r#"{"pid": "1", "pid_start_ticks": 1}"#,
            r#"{"pid": 1}"#,
            r#"{"pid": 1, "pid_start_ticks": -1}"#,
            r#"{"pid": 99999999999, "pid_start_ticks": 1}"#,
            r#"{"pid": 1, "pid_start_ticks": 1, "group_rank": -1}"#,
            r#"{"pid": 1, "pid_start_ticks": 1, "group_rank": 1.5}"#,
        ] {
            write_node(tmp.path(), bad);
            assert!(
                matches!(
                    agent_node(tmp.path(), Path::new("/proc")),
                    Err(NodeError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any bytes in the node file: an answer or a typed error, never a
        /// panic; and a pid under the fake `/proc` with another start time
        /// is never accepted.
        #[test]
        fn a_node_file_of_any_bytes_never_panics(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            pid in 1i32..100,
            start in 0u64..4,
            stat in ".{0,80}",
        ) {
            let tmp = tempfile::tempdir().expect("tempdir");
            let _ = parse_agent_node(tmp.path(), &bytes);
            std::fs::write(tmp.path().join(NODE_FILE), &bytes).expect("write");
            let proc_root = tmp.path().join("proc");
            std::fs::create_dir_all(proc_root.join(pid.to_string())).expect("mkdir");
            std::fs::write(proc_root.join(pid.to_string()).join("stat"), &stat).expect("stat");
            let _ = agent_node(tmp.path(), &proc_root);
            let doc = format!(r#"{{"pid": {pid}, "pid_start_ticks": {start}, "group_rank": 1}}"#);
            std::fs::write(tmp.path().join(NODE_FILE), &doc).expect("write");
            let fake = format!("{pid} (python) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0", start + 1);
            std::fs::write(proc_root.join(pid.to_string()).join("stat"), fake).expect("stat");
            proptest::prop_assert!(agent_node(tmp.path(), &proc_root).is_err());
        }
    }

    #[test]
    fn the_loss_file_keeps_the_recent_losses() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let channel = Channel::new(tmp.path());
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_764_860_000_123);
        for generation in 1..=(MAX_LOSSES as u64 + 2) {
            channel
                .tell(LossEntry::new(3, generation, at))
                .expect("tell");
        }
        channel.tell(LossEntry::new(3, 18, at)).expect("again");
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join(LOSS_FILE)).expect("read"))
                .expect("json");
        let losses = doc["losses"].as_array().expect("losses");
        assert_eq!(losses.len(), MAX_LOSSES);
        assert_eq!(losses[0]["id"], "3-3");
        assert_eq!(losses[MAX_LOSSES - 1]["id"], "3-18");
        assert_eq!(losses[0]["rank"], 3);
        assert_eq!(losses[0]["confirmed_unix_ms"], 1_764_860_000_123u64);
    }
}
