//! Checkpoint freshness on a real directory: atomic rename, a checkpoint
//! still being written, a stale one, a `latest` pointer, and the sidecar's
//! polling and inotify watchers seen through `/status`.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use trainwire_sidecar::checkpoint::scan;
use trainwire_test_support::sidecar::{KillOnDrop, loopback_addr, loopback_sidecar};
use trainwire_test_support::wait::wait_value;
use trainwire_test_support::{free_port, http_get, status};

const SETTLE: Duration = Duration::from_millis(300);

fn age(path: &Path, secs: u64) -> anyhow::Result<()> {
    let t = SystemTime::now() - Duration::from_secs(secs);
    let f = fs::File::options()
        .write(true)
        .open(path)
        .or_else(|_| fs::File::open(path))?;
    f.set_modified(t)?;
    Ok(())
}

#[test]
fn atomic_rename_is_seen_once_settled_and_temporaries_never() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("ckpt-1.pt"), b"one")?;
    age(&dir.path().join("ckpt-1.pt"), 60)?;
    // A checkpoint being written under a temporary name, then renamed.
    fs::write(dir.path().join("ckpt-2.pt.tmp"), b"two")?;
    let s = scan(dir.path(), SystemTime::now(), SETTLE)?;
    assert_eq!(
        s.newest
            .as_ref()
            .map(|n| n.path.file_name().map(|f| f.to_owned())),
        Some(Some("ckpt-1.pt".into()))
    );
    fs::rename(
        dir.path().join("ckpt-2.pt.tmp"),
        dir.path().join("ckpt-2.pt"),
    )?;
    // Just renamed (its mtime is recent): still settling.
    let s = scan(dir.path(), SystemTime::now(), SETTLE)?;
    assert_eq!(s.settling, 1);
    assert!(
        s.newest
            .as_ref()
            .is_some_and(|n| n.path.ends_with("ckpt-1.pt"))
    );
    let later = SystemTime::now() + SETTLE + Duration::from_millis(10);
    let s = scan(dir.path(), later, SETTLE)?;
    assert!(
        s.newest
            .as_ref()
            .is_some_and(|n| n.path.ends_with("ckpt-2.pt")),
        "{s:?}"
    );
    Ok(())
}

#[test]
fn a_directory_checkpoint_still_being_written_is_not_complete() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let old = dir.path().join("step-100");
    fs::create_dir(&old)?;
    fs::write(old.join("__0_0.distcp"), b"x")?;
    fs::write(old.join(".metadata"), b"m")?;
    age(&old.join("__0_0.distcp"), 120)?;
    age(&old.join(".metadata"), 120)?;
    age(&old, 120)?;
    let new = dir.path().join("step-200");
    fs::create_dir(&new)?;
    fs::write(new.join("__0_0.distcp"), b"partial")?;
    age(&new, 120)?; // the directory itself is old, a file inside is fresh
    let s = scan(dir.path(), SystemTime::now(), Duration::from_secs(5))?;
    assert!(
        s.newest
            .as_ref()
            .is_some_and(|n| n.path.ends_with("step-100")),
        "{s:?}"
    );
    assert_eq!(s.settling, 1);
    Ok(())
}

#[test]
fn latest_pointer_wins_symlink_or_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for n in ["a.pt", "b.pt"] {
        fs::write(dir.path().join(n), n)?;
    }
    age(&dir.path().join("a.pt"), 100)?;
    age(&dir.path().join("b.pt"), 10)?;
    std::os::unix::fs::symlink("a.pt", dir.path().join("latest"))?;
    let s = scan(dir.path(), SystemTime::now(), SETTLE)?;
    let n = s.newest.expect("pointer target");
    assert!(n.by_pointer && n.path.ends_with("a.pt"));
    // DeepSpeed style: a `latest` file holding the tag.
    fs::remove_file(dir.path().join("latest"))?;
    fs::create_dir(dir.path().join("global_step7"))?;
    fs::write(dir.path().join("latest"), "global_step7\n")?;
    let s = scan(dir.path(), SystemTime::now(), SETTLE)?;
    assert!(
        s.newest
            .is_some_and(|n| n.by_pointer && n.path.ends_with("global_step7"))
    );
    // A dangling pointer is ignored.
    fs::write(dir.path().join("latest"), "global_step9\n")?;
    let s = scan(dir.path(), SystemTime::now(), SETTLE)?;
    assert!(s.newest.is_some_and(|n| !n.by_pointer));
    Ok(())
}

// The sidecar process itself, both watchers, seen through /status.

struct Sidecar {
    _child: KillOnDrop,
    addr: String,
}

fn start(dir: &Path, poll: &str, max_age: &str) -> anyhow::Result<Sidecar> {
    let port = free_port();
    let child = loopback_sidecar(env!("CARGO_BIN_EXE_trainwire-sidecar"), 0, 1, port)
        .env("TRAINWIRE_CHECKPOINT_DIR", dir)
        .env("TRAINWIRE_CHECKPOINT_POLL", poll)
        .env("TRAINWIRE_CHECKPOINT_POLL_INTERVAL", "200ms")
        .env("TRAINWIRE_CHECKPOINT_SETTLE", "300ms")
        .env("TRAINWIRE_CHECKPOINT_MAX_AGE", max_age)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    Ok(Sidecar {
        _child: KillOnDrop(child),
        addr: loopback_addr(0, port),
    })
}

/// Polls `/status` (15 s at most) until `pred` holds on it.
fn wait_status(
    addr: &str,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<serde_json::Value> {
    wait_value(
        Duration::from_secs(15),
        Duration::from_millis(100),
        || Some(status(addr)).filter(|v| !v.is_null()),
        pred,
    )
    .map_err(|last| {
        anyhow::anyhow!(
            "timed out waiting for {what}; last status: {}",
            last.unwrap_or_default()
        )
    })
}

fn checkpoint_path(v: &serde_json::Value) -> Option<String> {
    v["checkpoint"]["newest"].as_str().map(str::to_owned)
}

#[test]
fn polling_watcher_follows_a_directory_created_late_and_new_checkpoints() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let dir = root.path().join("ckpt");
    let sc = start(&dir, "true", "1h")?;
    let v = wait_status(&sc.addr, "missing directory reported", |v| {
        v["checkpoint"]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("does not exist"))
    })?;
    assert_eq!(v["checkpoint"]["stale"], false);
    fs::create_dir(&dir)?;
    fs::write(dir.join("ckpt-1.pt.tmp"), b"x")?;
    fs::rename(dir.join("ckpt-1.pt.tmp"), dir.join("ckpt-1.pt"))?;
    let v = wait_status(&sc.addr, "ckpt-1 via polling", |v| {
        checkpoint_path(v).is_some_and(|p| p.ends_with("ckpt-1.pt"))
    })?;
    assert_eq!(v["checkpoint"]["watcher"], "poll");
    fs::write(dir.join("ckpt-2.pt"), b"y")?;
    wait_status(&sc.addr, "ckpt-2 via polling", |v| {
        checkpoint_path(v).is_some_and(|p| p.ends_with("ckpt-2.pt"))
    })?;
    Ok(())
}

#[test]
fn inotify_watcher_sees_a_new_checkpoint() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sc = start(dir.path(), "false", "1h")?;
    wait_status(&sc.addr, "watcher up", |v| {
        v["checkpoint"]["watcher"] == "inotify"
    })?;
    fs::write(dir.path().join("model.pt.partial"), b"x")?;
    fs::rename(
        dir.path().join("model.pt.partial"),
        dir.path().join("model.pt"),
    )?;
    let v = wait_status(&sc.addr, "model.pt via inotify", |v| {
        checkpoint_path(v).is_some_and(|p| p.ends_with("model.pt"))
    })?;
    assert_eq!(v["checkpoint"]["stale"], false);
    Ok(())
}

#[test]
fn a_stale_checkpoint_is_reported_in_status_and_metrics() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    fs::write(dir.path().join("old.pt"), b"x")?;
    age(&dir.path().join("old.pt"), 3600)?;
    let sc = start(dir.path(), "auto", "30m")?;
    let v = wait_status(&sc.addr, "stale", |v| v["checkpoint"]["stale"] == true)?;
    assert!(checkpoint_path(&v).is_some_and(|p| p.ends_with("old.pt")));
    assert!(
        v["checkpoint"]["age_seconds"]
            .as_f64()
            .is_some_and(|a| a >= 3600.0)
    );
    let metrics = http_get(&sc.addr, "/metrics").unwrap_or_default();
    assert!(
        metrics.contains("trainwire_sidecar_checkpoint_stale 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("trainwire_sidecar_checkpoint_stale_episodes_total 1"),
        "{metrics}"
    );
    // A fresh checkpoint ends the stale episode.
    fs::write(dir.path().join("new.pt"), b"y")?;
    wait_status(&sc.addr, "fresh again", |v| {
        v["checkpoint"]["stale"] == false
    })?;
    Ok(())
}
