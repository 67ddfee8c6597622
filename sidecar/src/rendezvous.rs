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

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

pub use trainwire_contract::rendezvous::{HANDLER_BACKEND, LOSS_FILE, NODE_FILE};

/// The handler's files, relative to the directory put on `PYTHONPATH`.
pub const HANDLER_FILES: [(&str, &str); 5] = [
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
    // The workers' Python stacks on the sidecar's signal (a stall).
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
