//! Reloading the policy when its file changes, without a restart.
//!
//! A ConfigMap volume does not rewrite the file in place: the kubelet writes
//! a new timestamped directory and atomically renames a `..data` symlink onto
//! it; `policy.yaml` is a symlink through `..data`. So the file's directory
//! is watched ([`DirWatch`], shared with the certificate reload), and any
//! event there makes the file be read again. A reload happens only when the
//! bytes differ from the last ones seen, so unrelated events in the
//! directory cost one read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use trainwire_runtime::watch::{DirWatch, Timing};

use trainwire_engine::policy::Policy;

use crate::{PolicyArgs, SharedPolicy};

/// Events closer together than this are one change (the kubelet's swap is
/// several renames and a removal).
const DEBOUNCE: Duration = Duration::from_millis(200);
/// A slow re-read that catches what the watch misses (an inotify watch
/// that could not be set up, a filesystem without events).
const POLL: Duration = Duration::from_secs(30);
/// Re-read interval when the directory watch cannot be set up at all.
const POLL_WITHOUT_WATCH: Duration = Duration::from_secs(5);

/// What the watcher last saw in the file.
#[derive(PartialEq)]
enum Seen {
    Bytes(Vec<u8>),
    Unreadable(String),
}

/// Watch the policy file's directory and put each new valid policy in force.
///
/// Runs until the future is dropped (abort the task). With no policy file
/// (`--policy` not given) there is nothing to watch and it waits forever.
/// On a change: the new file is loaded and validated like at start
/// (including `--sidecar-image`); on success it replaces the policy in
/// `shared` and `on_reload(Ok(()))` is called; on failure the error is
/// logged, `on_reload(Err(message))` is called, and the old policy stays in
/// force. The same broken content is reported once, not at every event.
pub async fn watch(
    args: PolicyArgs,
    shared: SharedPolicy,
    on_reload: Box<dyn Fn(Result<(), String>) + Send + Sync>,
) {
    let Some(path) = args.policy.clone() else {
        std::future::pending::<()>().await;
        return;
    };
    let dir = watched_dir(&path);
    let mut seen = read(&path).await;
    let mut changes = DirWatch::new(
        "policy",
        std::slice::from_ref(&dir),
        Timing {
            debounce: DEBOUNCE,
            poll: POLL,
            poll_without_watch: POLL_WITHOUT_WATCH,
        },
    );
    if changes.is_watching() {
        tracing::info!(file = %path.display(), dir = %dir.display(), "watching the policy for changes");
    }
    loop {
        changes.changed().await;
        let now = read(&path).await;
        if now == seen {
            continue;
        }
        let outcome = match &now {
            Seen::Unreadable(message) => Err(message.clone()),
            Seen::Bytes(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => Policy::from_yaml(text, &path.display().to_string())
                    .and_then(|p| {
                        p.with_overrides(
                            args.sidecar_image.as_deref(),
                            args.cluster_domain.as_deref(),
                        )
                    })
                    .map_err(|e| e.to_string()),
                Err(e) => Err(format!(
                    "{}: the policy file is not UTF-8: {e}",
                    path.display()
                )),
            },
        };
        seen = now;
        match outcome {
            Ok(policy) => {
                let names = policy.profile_names().join(", ");
                shared.replace(policy);
                tracing::info!(file = %path.display(), profiles = %names, "policy reloaded");
                on_reload(Ok(()));
            }
            Err(message) => {
                tracing::error!(
                    file = %path.display(),
                    error = %message,
                    "new policy rejected; the previous policy stays in force"
                );
                on_reload(Err(message));
            }
        }
    }
}

fn watched_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

async fn read(path: &Path) -> Seen {
    match tokio::fs::read(path).await {
        Ok(bytes) => Seen::Bytes(bytes),
        Err(e) => Seen::Unreadable(format!(
            "{}: cannot read the policy file: {e}",
            path.display()
        )),
    }
}
