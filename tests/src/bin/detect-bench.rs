//! Sidecar detection benchmark (not a test).
//!
//! ```text
//! cargo build --release -p trainwire-sidecar
//! cargo run --release -p trainwire-tests --bin detect-bench [-- TRIALS_WINDOW TRIALS_KUBE IDLE_SECS]
//! ```
//!
//! 1. Heartbeat path: two real sidecar processes on 127.0.0.10/.11 of a
//!    world of 2 with a hot spare (which never comes) and the store outside
//!    the world, every detection setting at its default (the 1 s loss
//!    window: a probe every 200 ms, suspect after 4 misses, a non-host loss
//!    confirmed after 1 s), and again with a 2 s window; the survivor
//!    watches a fake torchrun agent (`sidecar/tests/fake_torchrun.py`) with
//!    `restart-workers`, which acts on the confirmed loss. Each trial
//!    freezes the peer's sidecar with SIGSTOP at a random phase of the probe
//!    interval and measures the time until the worker's SIGTERM handler
//!    runs (its own timestamp), then thaws it. Reported as p50/p90/p99/max
//!    against the window.
//! 2. Kubernetes-watch path: the recorded pod events (deleted, failed,
//!    restart, ...) go through the same tracker, state machine and responder
//!    the sidecar runs, which SIGTERMs a real worker; measured from the
//!    event to the signal being sent (the API server's own watch latency is
//!    not included).
//! 3. Idle RSS and CPU of a sidecar heartbeating with one peer at the
//!    defaults (200 ms) and at 1 s x 3 (the defaults before the loss
//!    window), against a `sleep` process as the floor.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use trainwire_tests::net::{free_port, http_get};
use trainwire_tests::sidecar::{KillOnDrop, loopback_sidecar};
use trainwire_tests::wait::wait_for;

/// How often the bench polls: fine enough for the latencies it measures.
const POLL: Duration = Duration::from_millis(10);

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn sidecar_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("bench binary has no directory")?;
    let bin = dir.join("trainwire-sidecar");
    if !bin.exists() {
        bail!(
            "{} not found: run `cargo build --release -p trainwire-sidecar` first",
            bin.display()
        );
    }
    Ok(bin)
}

/// One sidecar of the bench's world (2 nodes, a spare that never comes,
/// the store outside the world), every detection setting at its default
/// but for `settings`.
fn start_sidecar(
    bin: &Path,
    rank: u32,
    port: u16,
    settings: &[(&str, &str)],
    tag: &str,
    log: &Path,
) -> Result<KillOnDrop> {
    let out = std::fs::File::create(log)?;
    let mut cmd = loopback_sidecar(bin, rank, 2, port);
    cmd.env("RUST_LOG", "warn")
        .env("TRAINWIRE_POD_NAME", format!("bench-{rank}"))
        .env_remove("TRAINWIRE_HEARTBEAT_INTERVAL")
        .env_remove("TRAINWIRE_HEARTBEAT_MISSES")
        .env_remove("TRAINWIRE_HEARTBEAT_TIMEOUT")
        .env("TRAINWIRE_SPARES", "1")
        .env("TRAINWIRE_RDZV_HOST_RANK", "none");
    for (k, v) in settings {
        cmd.env(k, v);
    }
    let child = cmd
        .env("TRAINWIRE_ON_PEER_LOSS", "restart-workers")
        .env("TRAINWIRE_ACTION_COOLDOWN", "0s")
        .env("TRAINWIRE_MAX_ACTIONS", "100000")
        .env("TRAINWIRE_AGENT_MATCH", tag)
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    Ok(KillOnDrop(child))
}

fn peer_healthy(addr: &str) -> bool {
    http_get(addr, "/status")
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v["peers"][0]["state"] == "healthy")
}

fn log_lines(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn summary(name: &str, mut v: Vec<f64>, unit: &str) {
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {unit}",
        v.len(),
        percentile(&v, 0.0),
        percentile(&v, 50.0),
        percentile(&v, 90.0),
        percentile(&v, 99.0),
        percentile(&v, 100.0),
    );
}

struct Lcg(u64);
impl Lcg {
    fn next_f64(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Freeze the peer, time the survivor's SIGTERM of its worker; `phase_ms`
/// is the probe interval the freeze is spread over.
fn heartbeat_trials(
    bin: &Path,
    settings: &[(&str, &str)],
    phase_ms: u64,
    trials: usize,
) -> Result<Vec<f64>> {
    let interval_ms = phase_ms;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let tag = format!("detect-bench-agent-{port}");
    let agent_log = dir.path().join("agent.log");
    let script = trainwire_tests::repo_root().join("sidecar/tests/fake_torchrun.py");
    let _agent = KillOnDrop(
        Command::new("python3")
            .arg(&script)
            .args([
                "--log",
                &agent_log.display().to_string(),
                "--workers",
                "1",
                "--tag",
                &tag,
            ])
            .stdout(Stdio::null())
            .spawn()
            .context("python3 fake_torchrun.py")?,
    );
    let peer = start_sidecar(
        bin,
        0,
        port,
        settings,
        &format!("{tag}-none"),
        &dir.path().join("s0.log"),
    )?;
    let survivor = start_sidecar(bin, 1, port, settings, &tag, &dir.path().join("s1.log"))?;
    let addr = format!("127.0.0.11:{port}");
    let mut rng = Lcg(0x5eed ^ interval_ms);
    let mut out = Vec::new();
    for trial in 0..trials {
        if !wait_for(Duration::from_secs(30), POLL, || peer_healthy(&addr)) {
            bail!("trial {trial}: the peer never became healthy");
        }
        let terms_before = log_lines(&agent_log)
            .iter()
            .filter(|l| l[1] == "worker-sigterm")
            .count();
        let spawns = log_lines(&agent_log)
            .iter()
            .filter(|l| l[1] == "spawn")
            .count();
        if spawns == 0
            && !wait_for(Duration::from_secs(10), POLL, || {
                log_lines(&agent_log).iter().any(|l| l[1] == "spawn")
            })
        {
            bail!("the fake agent spawned no worker");
        }
        // Let the newest worker be older than the coming loss, then freeze
        // at a random phase of the probe interval.
        std::thread::sleep(
            Duration::from_millis(50)
                + Duration::from_secs_f64(rng.next_f64() * interval_ms as f64 / 1000.0),
        );
        let t0 = now_unix();
        kill(peer.pid(), Signal::SIGSTOP)?;
        let mut at = None;
        let ok = wait_for(Duration::from_secs(60), POLL, || {
            let lines = log_lines(&agent_log);
            let terms: Vec<&Vec<String>> =
                lines.iter().filter(|l| l[1] == "worker-sigterm").collect();
            if terms.len() > terms_before {
                at = terms[terms_before][0].parse::<f64>().ok();
                true
            } else {
                false
            }
        });
        kill(peer.pid(), Signal::SIGCONT)?;
        match (ok, at) {
            (true, Some(t1)) => out.push(t1 - t0),
            _ => bail!("trial {trial}: no worker was signalled within 60s"),
        }
    }
    drop(survivor);
    Ok(out)
}

fn kube_trials(trials: usize) -> Result<Vec<f64>> {
    use k8s_openapi::api::core::v1::Pod;
    use trainwire_sidecar::config::{Config, NodeCount};
    use trainwire_sidecar::events::EventSink;
    use trainwire_sidecar::kubewatch::{PodView, Tracker};
    use trainwire_sidecar::peers::{Observation, Peers, Source};
    use trainwire_sidecar::respond::Responder;
    use trainwire_sidecar::status::Shared;

    let data = trainwire_tests::repo_root().join("sidecar/tests/data/kubewatch");
    let seq: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("deleted.json"))?)?;
    let healthy: Pod = serde_json::from_value(seq["steps"][0]["object"].clone())?;
    let deleted: Pod = serde_json::from_value(seq["steps"][2]["object"].clone())?;

    let dir = tempfile::tempdir()?;
    let tag = format!("detect-bench-kube-{}", std::process::id());
    let agent_log = dir.path().join("agent.log");
    let script = trainwire_tests::repo_root().join("sidecar/tests/fake_torchrun.py");
    let _agent = KillOnDrop(
        Command::new("python3")
            .arg(&script)
            .args([
                "--log",
                &agent_log.display().to_string(),
                "--workers",
                "1",
                "--tag",
                &tag,
            ])
            .stdout(Stdio::null())
            .spawn()?,
    );
    let config = Config::from_source(
        [
            ("TRAINWIRE_NNODES", "2"),
            ("TRAINWIRE_NODE_RANK", "1"),
            ("TRAINWIRE_POD_NAME", "llama-ft-1"),
            ("TRAINWIRE_ON_PEER_LOSS", "restart-workers"),
            ("TRAINWIRE_ACTION_COOLDOWN", "0s"),
            ("TRAINWIRE_MAX_ACTIONS", "100000"),
            ("TRAINWIRE_AGENT_MATCH", tag.as_str()),
        ]
        .as_slice(),
    )?;
    let shared = Shared::new(config);
    let mut responder = Responder::new(
        shared.clone(),
        EventSink::disabled(),
        false,
        trainwire_sidecar::dns::Resolver::table(Default::default()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut tracker = Tracker::new("llama-ft-1", Duration::from_secs(10));
    let mut peers = Peers::new(NodeCount::Fixed(2), 1, 3, Instant::now());
    let mut out = Vec::new();
    for trial in 0..trials {
        // A fresh pod identity per trial, as after a replacement.
        let mut h = healthy.clone();
        let uid = format!("bench-uid-{trial}");
        h.metadata.uid = Some(uid.clone());
        let mut d = deleted.clone();
        d.metadata.uid = Some(uid);
        let now = k8s_openapi::jiff::Timestamp::now();
        for v in tracker.apply(PodView::of(&h), now) {
            peers.observe(Observation {
                rank: v.rank,
                source: Source::Kubernetes,
                evidence: v.evidence,
                at: Instant::now(),
            });
        }
        // Wait for a worker that is older than the coming loss.
        if !wait_for(Duration::from_secs(20), POLL, || {
            let lines = log_lines(&agent_log);
            let spawns = lines.iter().filter(|l| l[1] == "spawn").count();
            let exits = lines.iter().filter(|l| l[1] == "exit").count();
            spawns > exits
        }) {
            bail!("kube trial {trial}: no worker running");
        }
        std::thread::sleep(Duration::from_millis(30));
        let t0 = Instant::now();
        let view = PodView::of(&d);
        let mut signalled = false;
        for v in tracker.delete(&view) {
            if let Some(loss) = peers.observe(Observation {
                rank: v.rank,
                source: Source::Kubernetes,
                evidence: v.evidence,
                at: Instant::now(),
            }) {
                rt.block_on(responder.on_loss(&loss, &peers));
                signalled =
                    shared.status().last_action.as_ref().is_some_and(|a| {
                        a.generation == loss.generation && a.result == "signalled"
                    });
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        if !signalled {
            bail!("kube trial {trial}: the deletion did not lead to a signal");
        }
        out.push(dt);
        // Let the agent notice and restart its worker.
        let exits_needed = trial + 1;
        wait_for(Duration::from_secs(20), POLL, || {
            log_lines(&agent_log)
                .iter()
                .filter(|l| l[1] == "exit")
                .count()
                >= exits_needed
        });
    }
    Ok(out)
}

fn rss_kib(pid: u32) -> Option<u64> {
    trainwire_test_support::process::status_kib(pid, "VmRSS")
}

fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn idle(bin: &Path, secs: u64, name: &str, settings: &[(&str, &str)]) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let a = start_sidecar(
        bin,
        0,
        port,
        settings,
        "detect-bench-idle-none",
        &dir.path().join("a.log"),
    )?;
    let b = start_sidecar(
        bin,
        1,
        port,
        settings,
        "detect-bench-idle-none",
        &dir.path().join("b.log"),
    )?;
    let floor = KillOnDrop(Command::new("sleep").arg((secs + 30).to_string()).spawn()?);
    if !wait_for(Duration::from_secs(20), POLL, || {
        peer_healthy(&format!("127.0.0.11:{port}"))
    }) {
        bail!("idle sidecars never saw each other");
    }
    // Serve /status and /metrics a few times, as probes would.
    for _ in 0..5 {
        let _ = http_get(&format!("127.0.0.11:{port}"), "/metrics");
    }
    std::thread::sleep(Duration::from_secs(2));
    let pid = b.0.id();
    let c0 = cpu_ticks(pid).unwrap_or(0);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let c1 = cpu_ticks(pid).unwrap_or(0);
    let wall = t0.elapsed().as_secs_f64();
    let cpu_pct = (c1 - c0) as f64 / 100.0 / wall * 100.0;
    println!(
        "| trainwire-sidecar ({name}, 1 peer, serving its peer's probes) | {} | {:.3}% ({} ticks) |",
        rss_kib(pid).unwrap_or(0),
        cpu_pct,
        c1 - c0
    );
    println!(
        "| `sleep` (floor) | {} | - |",
        rss_kib(floor.0.id()).unwrap_or(0)
    );
    drop(a);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let trials_window = args.first().copied().unwrap_or(30);
    let trials_kube = args.get(1).copied().unwrap_or(30);
    let idle_secs = args.get(2).copied().unwrap_or(30) as u64;
    let bin = sidecar_binary()?;
    println!("sidecar: {}", bin.display());
    println!();
    println!("| path | trials | min s | p50 s | p90 s | p99 s | max s | baseline");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let v = heartbeat_trials(&bin, &[], 200, trials_window)?;
    summary(
        "heartbeat, defaults (1s window: 200ms x 4, confirmed after 1s), SIGSTOP -> worker SIGTERM",
        v,
        "the window, from the last answer: 1.0 s",
    );
    let v = heartbeat_trials(&bin, &[("TRAINWIRE_LOSS_WINDOW", "2s")], 400, trials_window)?;
    summary(
        "heartbeat, 2s window (400ms x 4, confirmed after 2s), SIGSTOP -> worker SIGTERM",
        v,
        "the window, from the last answer: 2.0 s",
    );
    let v = kube_trials(trials_kube)?;
    summary(
        "kube watch: recorded Deleted event -> SIGTERM sent",
        v,
        "(plus the API server's watch delivery)",
    );
    println!();
    println!("| process | RSS (KiB) | CPU over {idle_secs}s idle |");
    println!("| --- | --- | --- |");
    idle(&bin, idle_secs, "defaults: 200ms heartbeats", &[])?;
    idle(
        &bin,
        idle_secs,
        "1s x 3 heartbeats",
        &[
            ("TRAINWIRE_HEARTBEAT_INTERVAL", "1s"),
            ("TRAINWIRE_HEARTBEAT_MISSES", "3"),
        ],
    )?;
    Ok(())
}
