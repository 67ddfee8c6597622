//! `examples/train.py` under a real torchrun (CPU, gloo): it trains, saves
//! checkpoints atomically, and a run killed mid-way resumes from the newest
//! complete checkpoint, including when the newest file is torn.
//!
//! Skips with a message when PyTorch is not importable (fails under CI, where
//! `.ci/run` installs it).

use std::path::Path;
use std::time::Duration;

use trainwire_tests::process::{Log, Proc, Tag};
use trainwire_tests::torch::{self, TrainEvent};

const WAIT: Duration = Duration::from_secs(240);

fn events(log: &Log, event: &str) -> Vec<TrainEvent> {
    log.lines()
        .iter()
        .filter_map(|l| TrainEvent::parse(&l.text))
        .filter(|e| e.event == event)
        .collect()
}

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("latest"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn train_example_resumes_from_the_newest_complete_checkpoint() {
    if !torch::require_torch("train_example_resumes_from_the_newest_complete_checkpoint") {
        return;
    }
    let tag = Tag::new("twtrain");
    let ckpt = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let script = torch::train_script();

    // Run 1: torchrun with explicit flags, slow enough to be killed mid-way.
    let log1 = Log::new("run1");
    let mut cmd = torch::torchrun();
    cmd.args(["--standalone", "--nnodes", "1", "--nproc-per-node", "2"])
        .arg(&script)
        .args([
            "--steps",
            "100000",
            "--checkpoint-interval",
            "5",
            "--log-every",
            "1",
            "--sleep",
            "0.05",
        ])
        .env("CHECKPOINT_DIR", ckpt.path())
        .env("OMP_NUM_THREADS", "1")
        .env("PYTHONUNBUFFERED", "1");
    let mut run1 =
        Proc::spawn(&mut cmd, &tag, &log1).unwrap_or_else(|e| panic!("spawn torchrun: {e}"));
    let second = log1.wait_for(WAIT, |l| {
        TrainEvent::parse(l).is_some_and(|e| e.event == "checkpoint" && e.num("step") >= Some(10))
    });
    assert!(
        second.is_some(),
        "run 1 saved no second checkpoint within {WAIT:?}:\n{}",
        log1.tail(60)
    );
    // Let it go on past the checkpoint, so that run 2 repeats some steps.
    let second_step = second
        .as_ref()
        .and_then(|l| TrainEvent::parse(&l.text))
        .and_then(|e| e.num("step"))
        .unwrap_or(10);
    let past = log1.wait_for(WAIT, |l| {
        TrainEvent::parse(l)
            .is_some_and(|e| e.event == "step" && e.num("step") >= Some(second_step + 2))
    });
    assert!(
        past.is_some(),
        "run 1 stopped making progress:\n{}",
        log1.tail(60)
    );
    // Both ranks started from scratch.
    let starts = events(&log1, "start");
    assert_eq!(
        starts.len(),
        2,
        "one start line per rank:\n{}",
        log1.tail(60)
    );
    assert!(starts.iter().all(|e| e.get("resumed_from") == Some("none")));

    // Kill the whole tree at once, the way a lost node dies (workers run in
    // their own session, so this goes through /proc, not the process group).
    run1.kill_tree();
    tag.kill_all();
    let saved = latest(ckpt.path());
    let saved_step: u64 = saved
        .strip_prefix("ckpt-")
        .and_then(|s| s.strip_suffix(".pt"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("latest pointer names no checkpoint: {saved:?}"));
    assert!(
        saved_step >= 10 && saved_step.is_multiple_of(5),
        "latest={saved}"
    );
    assert!(
        ckpt.path().join(&saved).is_file(),
        "latest names a missing file {saved}"
    );
    // Older checkpoints are pruned to --keep (3).
    let kept: Vec<_> = std::fs::read_dir(ckpt.path())
        .unwrap_or_else(|e| panic!("read_dir: {e}"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-") && n.ends_with(".pt"))
        .collect();
    assert!(!kept.is_empty() && kept.len() <= 3, "kept {kept:?}");

    // Damage the directory the way a crash or a lossy disk could: a leftover
    // temporary file, and a newer checkpoint that is torn, named by `latest`.
    let torn_step = saved_step + 1000;
    let torn = format!("ckpt-{torn_step:08}.pt");
    std::fs::write(ckpt.path().join(format!(".{torn}.tmp-4242")), b"partial")
        .unwrap_or_else(|e| panic!("write temp: {e}"));
    std::fs::write(ckpt.path().join(&torn), b"PK\x03\x04 torn in the middle")
        .unwrap_or_else(|e| panic!("write torn: {e}"));
    std::fs::write(ckpt.path().join("latest"), format!("{torn}\n"))
        .unwrap_or_else(|e| panic!("write latest: {e}"));

    // Run 2: no torchrun flags at all, only the PET_* env the webhook injects,
    // and the script's own settings from env too.
    let log2 = Log::new("run2");
    let port = trainwire_tests::process::free_port();
    let target = saved_step + 10;
    let mut cmd = torch::torchrun();
    cmd.arg(&script)
        .envs(torch::webhook_env(
            "1",
            2,
            &format!("127.0.0.1:{port}"),
            "train-example",
            0,
        ))
        .env("CHECKPOINT_DIR", ckpt.path())
        .env("TRAIN_STEPS", target.to_string())
        .env("TRAIN_CHECKPOINT_INTERVAL", "5")
        .env("TRAIN_LOG_EVERY", "1");
    let mut run2 =
        Proc::spawn(&mut cmd, &tag, &log2).unwrap_or_else(|e| panic!("spawn torchrun: {e}"));
    let status = run2.wait_timeout(WAIT);
    // The reader threads may still be draining the pipes.
    log2.wait_for(Duration::from_secs(5), |l| l.contains("] done "));
    assert!(
        status.is_some_and(|s| s.success()),
        "run 2 did not finish cleanly ({status:?}):\n{}",
        log2.tail(80)
    );
    assert!(
        log2.lines()
            .iter()
            .any(|l| l.text.contains("skipping unreadable checkpoint") && l.text.contains(&torn)),
        "the torn checkpoint was not reported:\n{}",
        log2.tail(80)
    );
    let starts = events(&log2, "start");
    assert_eq!(
        starts.len(),
        2,
        "one start line per rank:\n{}",
        log2.tail(80)
    );
    for s in &starts {
        assert_eq!(
            s.num("resumed_from"),
            Some(saved_step),
            "every rank resumes from {saved}: {s:?}"
        );
        assert_eq!(s.num("world_size"), Some(2));
    }
    let steps = events(&log2, "step");
    let first = steps.first().and_then(|e| e.num("step"));
    assert_eq!(
        first,
        Some(saved_step + 1),
        "training continues right after the checkpoint:\n{}",
        log2.tail(80)
    );
    assert!(
        steps
            .iter()
            .all(|e| e.num("resumed_from") == Some(saved_step))
    );
    // Same data, model and optimizer state: the repeated steps give exactly
    // the losses the interrupted run logged (DDP on gloo is deterministic).
    let losses = |log: &Log| -> Vec<(u64, String)> {
        events(log, "step")
            .iter()
            .filter_map(|e| Some((e.num("step")?, e.get("loss")?.to_string())))
            .collect()
    };
    let before = losses(&log1);
    let after = losses(&log2);
    let repeated: Vec<_> = after
        .iter()
        .filter(|(s, _)| before.iter().any(|(b, _)| b == s))
        .collect();
    assert!(!repeated.is_empty(), "no step ran in both runs");
    for (step, loss) in repeated {
        let old = before.iter().find(|(s, _)| s == step).map(|(_, l)| l);
        assert_eq!(
            Some(loss),
            old,
            "step {step}: the resumed run's loss differs from the original's"
        );
    }
    let done = events(&log2, "done");
    assert_eq!(
        done.first().and_then(|e| e.num("step")),
        Some(target),
        "{}",
        log2.tail(80)
    );
    assert_eq!(latest(ckpt.path()), format!("ckpt-{target:08}.pt"));
    drop(tag);
}
