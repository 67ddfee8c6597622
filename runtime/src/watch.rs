//! Watching directories for "something may have changed", for files that
//! are swapped rather than rewritten.
//!
//! Kubernetes volumes (ConfigMap, Secret) do not rewrite a file in place:
//! the kubelet writes a new timestamped directory and renames a `..data`
//! symlink onto it. A watch on the file follows the old inode and misses
//! the swap, so the watch is on the file's directory, and any event there
//! means "read the file again". Events are debounced (a swap is several
//! renames and a removal), and a slow poll catches what the watch misses (a
//! filesystem without events). Used by the webhook for its policy file and
//! its serving certificate; what to do on a change stays with the caller.

use std::path::PathBuf;
use std::time::Duration;

use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, new_debouncer};
use tokio::sync::mpsc;

type Debouncer = notify_debouncer_full::Debouncer<
    notify::RecommendedWatcher,
    notify_debouncer_full::RecommendedCache,
>;

/// How a [`DirWatch`] waits.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Events closer together than this are one change.
    pub debounce: Duration,
    /// Poll interval while the directories are watched.
    pub poll: Duration,
    /// Poll interval when no directory could be watched.
    pub poll_without_watch: Duration,
}

/// A watch on some directories (non-recursive) plus a fallback poll.
pub struct DirWatch {
    events: mpsc::UnboundedReceiver<()>,
    watching: bool,
    poll: Duration,
    ticker: tokio::time::Interval,
    // Dropping the debouncer stops the watch.
    _debouncer: Option<Debouncer>,
}

impl DirWatch {
    /// Watch `dirs`. `what` names the watched thing in the log ("policy",
    /// "certificate"). A directory that cannot be watched is logged, and when
    /// none can be, the poll every `timing.poll_without_watch` is all.
    pub fn new(what: &str, dirs: &[PathBuf], timing: Timing) -> DirWatch {
        let (tx, events) = mpsc::unbounded_channel::<()>();
        let name = what.to_string();
        let debouncer = new_debouncer(timing.debounce, None, move |result: DebounceEventResult| {
            if let Err(errors) = &result {
                for e in errors {
                    tracing::warn!(error = %e, "{name} watch error");
                }
            }
            let _ = tx.send(());
        });
        let debouncer = match debouncer {
            Ok(mut d) => {
                let mut watched = 0;
                for dir in dirs {
                    match d.watch(dir, RecursiveMode::NonRecursive) {
                        Ok(()) => watched += 1,
                        Err(e) => tracing::warn!(
                            dir = %dir.display(),
                            error = %e,
                            "cannot watch the {what} directory"
                        ),
                    }
                }
                (watched > 0).then_some(d)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a file watcher for the {what}");
                None
            }
        };
        let watching = debouncer.is_some();
        let poll = if watching {
            timing.poll
        } else {
            tracing::warn!(
                "not watching the {what}'s directory; re-reading it every {}s instead",
                timing.poll_without_watch.as_secs()
            );
            timing.poll_without_watch
        };
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        DirWatch {
            events,
            watching,
            poll,
            ticker,
            _debouncer: debouncer,
        }
    }

    /// Whether file events arrive (else only the poll runs).
    pub fn is_watching(&self) -> bool {
        self.watching
    }

    /// The poll interval in use.
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// Waits until the directories changed (a debounced batch of events,
    /// several batches coalesced) or the poll interval passed.
    pub async fn changed(&mut self) {
        loop {
            tokio::select! {
                got = self.events.recv(), if self.watching => {
                    if got.is_none() {
                        // The watcher is gone; keep polling.
                        self.watching = false;
                        continue;
                    }
                    while self.events.try_recv().is_ok() {}
                    return;
                }
                _ = self.ticker.tick() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_symlink_swap_in_the_directory_is_a_change() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("v1")).expect("mkdir");
        std::fs::create_dir_all(dir.join("v2")).expect("mkdir");
        std::os::unix::fs::symlink("v1", dir.join("..data")).expect("symlink");
        let mut watch = DirWatch::new(
            "test",
            std::slice::from_ref(&dir),
            Timing {
                debounce: Duration::from_millis(50),
                poll: Duration::from_secs(3600),
                poll_without_watch: Duration::from_secs(3600),
            },
        );
        assert!(watch.is_watching());
        // The kubelet's swap: a new link renamed over `..data`.
        std::os::unix::fs::symlink("v2", dir.join("..data_tmp")).expect("symlink");
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("rename");
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("the swap is seen");
    }

    #[tokio::test]
    async fn without_a_directory_to_watch_it_polls() {
        let mut watch = DirWatch::new(
            "test",
            &[PathBuf::from("/nonexistent/trainwire-dirwatch")],
            Timing {
                debounce: Duration::from_millis(50),
                poll: Duration::from_secs(3600),
                poll_without_watch: Duration::from_millis(100),
            },
        );
        assert!(!watch.is_watching());
        assert_eq!(watch.poll(), Duration::from_millis(100));
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("the poll fires");
    }
}
