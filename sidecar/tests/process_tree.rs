//! The sidecar against a process tree shaped like torchrun's: real sidecar
//! processes heartbeating on distinct loopback addresses, a fake agent
//! (`fake_torchrun.py`) whose workers run in their own sessions, and a peer
//! frozen with SIGSTOP (it stops answering without closing its sockets).
//!
//! Bounded waits only; no timing assertions beyond generous windows.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use trainwire_test_support::sidecar::{
    FakeAgent as Agent, KillOnDrop, loopback_addr, loopback_sidecar,
};
use trainwire_test_support::{
    Prerequisite, alive, free_port, http_get, require, status, wait_until,
};

/// `python3` for the fake torchrun, or `None` (skipped outside CI, a failure
/// under `CI=true`).
#[track_caller]
fn python(test: &str) -> Option<&'static str> {
    require(test, Prerequisite::command("python3", &["--version"])).then_some("python3")
}

struct Sidecar {
    child: KillOnDrop,
    addr: String,
}

impl Sidecar {
    fn pid(&self) -> Pid {
        self.child.pid()
    }
}

/// Starts the sidecar of `rank` of `nnodes` on 127.0.0.1<rank>.
fn sidecar(
    rank: u32,
    nnodes: u32,
    port: u16,
    action: &str,
    agent_tag: &str,
    log: &Path,
) -> Sidecar {
    let out = std::fs::File::create(log).expect("sidecar log");
    let err = out.try_clone().expect("sidecar log");
    let child = loopback_sidecar(env!("CARGO_BIN_EXE_trainwire-sidecar"), rank, nnodes, port)
        .env(
            "TRAINWIRE_POD_UID",
            format!("uid-{rank}-{port}-{agent_tag}"),
        )
        // A frozen peer is confirmed lost by an outage of 2 s (the default
        // is 30 s in a fixed world).
        .env("TRAINWIRE_CONFIRM_AFTER", "2s")
        .env("TRAINWIRE_ON_PEER_LOSS", action)
        .env("TRAINWIRE_AGENT_MATCH", agent_tag)
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start trainwire-sidecar");
    Sidecar {
        child: KillOnDrop(child),
        addr: loopback_addr(rank, port),
    }
}

fn all_peers_healthy(addr: &str, n: usize) -> bool {
    let s = status(addr);
    s["peers"]
        .as_array()
        .is_some_and(|p| p.len() == n && p.iter().all(|x| x["state"] == "healthy"))
}

#[test]
fn restart_workers_terms_each_worker_once_and_spares_the_agent() {
    let Some(py) = python("restart_workers_terms_each_worker_once_and_spares_the_agent") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let tag = format!("fake-torchrun-rw-{port}");
    let agent = Agent::start(py, &tag, 2, dir.path().join("agent.log"));
    wait_until("two workers spawned", Duration::from_secs(20), || {
        agent.count("spawn") == 2
    });
    let first_workers = agent.pids("spawn");

    // Ranks 0 and 2 have no trainer here; rank 1's is `agent`.
    let s0 = sidecar(
        0,
        3,
        port,
        "restart-workers",
        &format!("{tag}-none"),
        &dir.path().join("s0.log"),
    );
    let s1 = sidecar(
        1,
        3,
        port,
        "restart-workers",
        &tag,
        &dir.path().join("s1.log"),
    );
    let s2 = sidecar(
        2,
        3,
        port,
        "restart-workers",
        &format!("{tag}-none"),
        &dir.path().join("s2.log"),
    );
    wait_until(
        "every rank sees both peers healthy",
        Duration::from_secs(30),
        || {
            [&s0, &s1, &s2]
                .iter()
                .all(|s| all_peers_healthy(&s.addr, 2))
        },
    );

    kill(s2.pid(), Signal::SIGSTOP).expect("freeze rank 2");
    // 200ms x 5 misses: well within 15s even on a loaded machine.
    wait_until(
        "both original workers got SIGTERM",
        Duration::from_secs(15),
        || agent.count("worker-sigterm") >= 2,
    );
    let termed = agent.pids("worker-sigterm");
    let mut sorted = termed.clone();
    sorted.sort();
    let mut expected = first_workers.clone();
    expected.sort();
    assert_eq!(sorted, expected, "the original workers, each once");
    // The agent restarts them and is itself left alone.
    wait_until(
        "agent restarted its workers",
        Duration::from_secs(15),
        || agent.count("spawn") >= 4,
    );
    assert!(alive(agent.pid()), "the agent is left alone");
    assert_eq!(agent.count("agent-sigterm"), 0);

    // Exactly once: give the sidecar time to act again if it wrongly would.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        agent.count("worker-sigterm"),
        2,
        "no second action for the same loss"
    );
    let st = status(&s1.addr);
    assert_eq!(st["generation"], 1, "{st}");
    assert_eq!(st["actions_total"], 1, "{st}");
    let last = &st["last_action"];
    assert_eq!(last["lost_rank"], 2, "{st}");
    assert_eq!(last["action"], "restart-workers", "{st}");
    assert_eq!(last["result"], "signalled", "{st}");
    assert_eq!(last["signals"].as_array().map(Vec::len), Some(2), "{st}");
    let peer2 = st["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|x| x["rank"] == 2).cloned());
    assert_eq!(
        peer2.map(|p| p["state"].clone()),
        Some(serde_json::json!("lost"))
    );
    let metrics = http_get(&s1.addr, "/metrics").unwrap_or_default();
    assert!(
        metrics.contains(
            r#"trainwire_sidecar_actions_total{action="restart-workers",result="signalled"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("trainwire_sidecar_detection_latency_seconds_count{source=\"heartbeat\"} 1"),
        "{metrics}"
    );
    // Rank 0 also saw the loss but runs no trainer: nothing to signal.
    wait_until("rank 0 reports no trainer", Duration::from_secs(10), || {
        status(&s0.addr)["last_action"]["result"] == "no-trainer"
    });

    // The frozen peer thaws: healthy again, no new loss.
    kill(s2.pid(), Signal::SIGCONT).expect("thaw rank 2");
    wait_until("rank 2 healthy again", Duration::from_secs(10), || {
        all_peers_healthy(&s1.addr, 2)
    });
    assert_eq!(status(&s1.addr)["generation"], 1);
}

#[test]
fn auto_kills_agent_and_workers_when_the_rendezvous_host_is_lost() {
    let Some(py) = python("auto_kills_agent_and_workers_when_the_rendezvous_host_is_lost") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let tag = format!("fake-torchrun-auto-{port}");
    let mut agent = Agent::start(py, &tag, 2, dir.path().join("agent.log"));
    wait_until("two workers spawned", Duration::from_secs(20), || {
        agent.count("spawn") == 2
    });
    let workers = agent.pids("spawn");

    let s0 = sidecar(
        0,
        2,
        port,
        "auto",
        &format!("{tag}-none"),
        &dir.path().join("s0.log"),
    );
    let s1 = sidecar(1, 2, port, "auto", &tag, &dir.path().join("s1.log"));
    wait_until("rank 1 sees rank 0", Duration::from_secs(30), || {
        all_peers_healthy(&s1.addr, 1)
    });

    kill(s0.pid(), Signal::SIGSTOP).expect("freeze rank 0");
    // Confirmed by the outage: the workers are stopped (the GPUs freed), the
    // agent is left until the replacement host answers at rank 0's name.
    wait_until("the workers are stopped", Duration::from_secs(15), || {
        agent.count("worker-sigterm") >= 2
            && status(&s1.addr)["last_loss"]["workers_stopped"] == true
    });
    let st = status(&s1.addr);
    assert_eq!(st["last_loss"]["confirmed_by"]["by"], "outage", "{st}");
    assert!(
        st["last_loss"]["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("replacement")),
        "{st}"
    );
    assert!(!agent.exited(), "{st}");
    let termed = agent.pids("worker-sigterm");
    assert!(workers.iter().all(|w| termed.contains(w)), "{st}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(!agent.exited(), "the agent waits for the replacement");
    // The replacement: a new pod (new UID) answers at rank 0's address.
    drop(s0);
    let _s0b = sidecar(
        0,
        2,
        port,
        "auto",
        &format!("{tag}-none-b"),
        &dir.path().join("s0b.log"),
    );
    let mut status_code = None;
    wait_until("the agent is killed", Duration::from_secs(15), || {
        status_code = agent.exit_status();
        status_code.is_some()
    });
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status_code.and_then(|s| s.signal()),
        Some(9),
        "SIGKILL, not SIGTERM"
    );
    assert_eq!(agent.count("agent-sigterm"), 0);
    let st = status(&s1.addr);
    assert_eq!(st["last_action"]["action"], "restart-agent", "{st}");
    assert_eq!(st["last_action"]["result"], "signalled", "{st}");
    assert_eq!(st["last_action"]["lost_rank"], 0, "{st}");
    assert_eq!(st["last_loss"]["confirmed_by"]["by"], "outage", "{st}");
    assert_eq!(st["last_loss"]["agent_killed"], true, "{st}");
    let sigs = st["last_action"]["signals"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        sigs.iter()
            .any(|s| s["role"] == "agent" && s["signal"] == "SIGKILL"),
        "{st}"
    );
}

#[test]
fn none_only_reports() {
    let Some(py) = python("none_only_reports") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let tag = format!("fake-torchrun-none-{port}");
    let agent = Agent::start(py, &tag, 1, dir.path().join("agent.log"));
    wait_until("worker spawned", Duration::from_secs(20), || {
        agent.count("spawn") == 1
    });
    let worker = agent.pids("spawn")[0];

    let s0 = sidecar(
        0,
        2,
        port,
        "none",
        &format!("{tag}-none"),
        &dir.path().join("s0.log"),
    );
    let s1 = sidecar(1, 2, port, "none", &tag, &dir.path().join("s1.log"));
    wait_until("rank 1 sees rank 0", Duration::from_secs(30), || {
        all_peers_healthy(&s1.addr, 1)
    });
    kill(s0.pid(), Signal::SIGSTOP).expect("freeze rank 0");
    wait_until("the loss is reported", Duration::from_secs(15), || {
        status(&s1.addr)["last_action"]["result"] == "reported"
    });
    let st = status(&s1.addr);
    assert_eq!(st["last_action"]["action"], "report-only", "{st}");
    assert_eq!(st["last_action"]["signals"], serde_json::json!([]), "{st}");
    assert_eq!(st["actions_total"], 0, "{st}");
    let metrics = http_get(&s1.addr, "/metrics").unwrap_or_default();
    assert!(
        metrics.contains(
            r#"trainwire_sidecar_peers_lost_total{source="heartbeat",reason="missed-heartbeats"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"trainwire_sidecar_actions_total{action="report-only",result="reported"} 1"#
        ),
        "{metrics}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(worker) && alive(agent.pid()));
    assert_eq!(agent.count("worker-sigterm"), 0);
}
