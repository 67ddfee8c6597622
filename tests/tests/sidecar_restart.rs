//! A trainer container restarted in place (same pod, same UID, same
//! address, `restartCount` + 1), as a real kubelet does when the main
//! container exits, seen by the real `trainwire-sidecar` through its
//! Kubernetes watch (a fake API server that streams the pod updates the test
//! makes), beside a process tree shaped like torchrun's:
//!
//! - the rendezvous host's container restarts: the survivor stops its
//!   workers at once, but restarts its agent only once the host's new store
//!   accepts connections, never at the restart itself; the host is healthy
//!   again afterwards, and its later deletion is a new loss (generation 2);
//! - another rank's container restarts (in `restart-workers` mode): acted on,
//!   the rank is healthy again once Ready, and its later deletion is acted on
//!   again.

use std::time::Duration;

use serde_json::Value;
use trainwire_test_support::sidecar::{FakeAgent, KillOnDrop, loopback_addr, loopback_sidecar};
use trainwire_test_support::wait::wait_until_or;
use trainwire_test_support::{Prerequisite, free_port, require, status, wait_for};
use trainwire_tests::apiserver::{FakeApiServer, pod};

/// `python3` for the fake torchrun.
#[track_caller]
fn python(test: &str) -> Option<&'static str> {
    require(test, Prerequisite::command("python3", &["--version"])).then_some("python3")
}

struct World {
    api: FakeApiServer,
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    port: u16,
}

impl World {
    /// A fake API server holding pods `job-0` and `job-1`, Ready.
    fn new() -> World {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let api = runtime
            .block_on(FakeApiServer::start())
            .expect("fake API server");
        for rank in 0..2 {
            api.set_pod(pod(
                &format!("job-{rank}"),
                rank,
                &format!("uid-{rank}"),
                &format!("127.0.0.1{rank}"),
                true,
                0,
            ));
        }
        World {
            api,
            runtime,
            dir: tempfile::tempdir().expect("tempdir"),
            port: free_port(),
        }
    }

    /// The sidecar of `rank`, on Kubernetes detection against the fake API
    /// server, acting on `tag`'s agent as `action` says.
    fn sidecar(&self, rank: u32, action: &str, tag: &str, store_port: u16) -> KillOnDrop {
        let kubeconfig = self
            .api
            .kubeconfig(self.dir.path(), "e2e")
            .expect("kubeconfig");
        let bin = trainwire_tests::sidecar_binary().expect("the sidecar binary");
        let log = std::fs::File::create(self.dir.path().join(format!("sidecar-{rank}.log")))
            .expect("sidecar log");
        let child = loopback_sidecar(bin, rank, 2, self.port)
            .env("KUBECONFIG", kubeconfig)
            .env("TRAINWIRE_POD_NAMESPACE", "e2e")
            .env("TRAINWIRE_POD_UID", format!("uid-{rank}"))
            .env("TRAINWIRE_DETECTION", "kubernetes")
            .env("TRAINWIRE_SELECTOR", "app=train")
            .env("TRAINWIRE_RDZV_HOST_RANK", "0")
            .env("TRAINWIRE_RDZV_PORT", store_port.to_string())
            .env("TRAINWIRE_ON_PEER_LOSS", action)
            .env("TRAINWIRE_ACTION_COOLDOWN", "0s")
            .env("TRAINWIRE_AGENT_MATCH", tag)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start trainwire-sidecar");
        KillOnDrop(child)
    }

    /// [`wait_until_or`] with both sidecars' logs on a timeout.
    #[track_caller]
    fn until(&self, what: &str, limit: Duration, pred: impl FnMut() -> bool) {
        wait_until_or(
            what,
            limit,
            || {
                format!(
                    "rank 0:\n{}\nrank 1:\n{}\nagent:\n{}",
                    self.log(0),
                    self.log(1),
                    std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
                )
            },
            pred,
        );
    }

    /// The values of annotation `key` patched onto pod `name`.
    fn annotated(&self, name: &str, key: &str) -> Vec<String> {
        self.api
            .patches()
            .into_iter()
            .filter(|(pod, _)| pod == name)
            .filter_map(|(_, p)| {
                p["metadata"]["annotations"][key]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    }

    fn status(&self, rank: u32) -> Value {
        status(&loopback_addr(rank, self.port))
    }

    fn log(&self, rank: u32) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("sidecar-{rank}.log")))
            .unwrap_or_default()
    }

    fn peer_state(&self, me: u32, rank: u32) -> Option<String> {
        self.status(me)["peers"]
            .as_array()?
            .iter()
            .find(|p| p["rank"] == rank)
            .and_then(|p| p["state"].as_str())
            .map(str::to_string)
    }

    /// `rank`'s trainer container restarts: `restartCount` + 1, Ready as
    /// given, same UID and address.
    fn restart_container(&self, rank: u32, restarts: i32, ready: bool) {
        self.api.set_pod(pod(
            &format!("job-{rank}"),
            rank,
            &format!("uid-{rank}"),
            &format!("127.0.0.1{rank}"),
            ready,
            restarts,
        ));
    }
}

#[test]
fn a_restarted_host_container_restarts_the_agent_only_once_its_store_listens() {
    let Some(py) =
        python("a_restarted_host_container_restarts_the_agent_only_once_its_store_listens")
    else {
        return;
    };
    let w = World::new();
    let store_port = free_port();
    let tag = format!("fake-torchrun-restart-host-{}", w.port);
    let mut agent = FakeAgent::start(py, &tag, 2, w.dir.path().join("agent.log"));
    let _sidecar = w.sidecar(1, "auto", &tag, store_port);
    w.until(
        "rank 0 healthy in rank 1's watch",
        Duration::from_secs(30),
        || w.peer_state(1, 0).as_deref() == Some("healthy") && agent.count("spawn") == 2,
    );

    // Pod 0's trainer restarts, Ready again in the same status update; its
    // new torchrun (the store) is not up yet.
    w.restart_container(0, 1, true);
    w.until("rank 1's workers stopped", Duration::from_secs(15), || {
        agent.count("exit") >= 2
    });
    let killed_early = wait_for(Duration::from_secs(4), Duration::from_millis(100), || {
        agent.exited()
    });
    let s = w.status(1);
    assert!(
        !killed_early,
        "the agent was killed before the host's store listened: {s:#}\n{}",
        w.log(1)
    );
    assert_eq!(s["last_loss"]["reason"], "container-restarted", "{s:#}");
    assert_eq!(s["last_loss"]["agent_killed"], false, "{s:#}");
    assert!(
        s["last_loss"]["waiting_for"]
            .as_str()
            .is_some_and(|w| w.contains("to accept connections")),
        "{s:#}"
    );
    // The restarted peer is up again (not lost for good).
    assert_eq!(w.peer_state(1, 0).as_deref(), Some("healthy"), "{s:#}");

    // The new torchrun's store listens at pod 0's address: now the agent goes.
    let _store = std::net::TcpListener::bind(("127.0.0.10", store_port)).expect("the store");
    w.until("rank 1's agent killed", Duration::from_secs(10), || {
        agent.exited()
    });
    let s = w.status(1);
    assert_eq!(s["last_loss"]["agent_killed"], true, "{s:#}");
    assert_eq!(s["last_action"]["action"], "restart-agent", "{s:#}");
    assert_eq!(s["last_action"]["result"], "signalled", "{s:#}");
    assert_eq!(s["generation"], 1, "{s:#}");

    // Later, pod 0 is deleted: a loss of its own, generation 2.
    w.api.delete_pod("job-0");
    w.until("a second loss", Duration::from_secs(15), || {
        let s = w.status(1);
        s["generation"] == 2 && s["last_loss"]["reason"] == "deleted"
    });
    drop(w.runtime);
}

#[test]
fn a_peer_restarted_in_place_is_healthy_again_and_its_next_loss_is_acted_on() {
    let Some(py) =
        python("a_peer_restarted_in_place_is_healthy_again_and_its_next_loss_is_acted_on")
    else {
        return;
    };
    let w = World::new();
    let tag = format!("fake-torchrun-restart-peer-{}", w.port);
    let agent = FakeAgent::start(py, &tag, 2, w.dir.path().join("agent.log"));
    let _sidecar = w.sidecar(0, "restart-workers", &tag, free_port());
    w.until(
        "rank 1 healthy in rank 0's watch",
        Duration::from_secs(30),
        || w.peer_state(0, 1).as_deref() == Some("healthy") && agent.count("spawn") == 2,
    );

    // Pod 1's trainer restarts, Ready again in the same status update (a
    // quick restart: the watch may never see it not Ready).
    w.restart_container(1, 1, true);
    w.until("the first action", Duration::from_secs(15), || {
        agent.count("exit") == 2 && agent.count("spawn") == 4
    });
    w.until("rank 1 healthy again", Duration::from_secs(15), || {
        w.peer_state(0, 1).as_deref() == Some("healthy")
    });
    // Its new workers run: the record says training runs again, from their
    // start, and by what: a stand-in trainer (no torchrun variables, no
    // collective) leaves nothing more to see, and must not leave the world
    // waiting for a collective that never forms.
    let resumed = || -> Option<Value> {
        w.annotated("job-0", "trainwire.dev/peer-loss")
            .iter()
            .filter_map(|r| serde_json::from_str::<Value>(r).ok())
            .find(|r| r["generation"] == 1 && r["trainingSince"].is_string())
    };
    w.until(
        "training seen again after the first loss",
        Duration::from_secs(15),
        || resumed().is_some(),
    );
    let record = resumed().unwrap_or_default();
    assert_eq!(record["trainingSeenBy"], "workers-started", "{record}");
    assert_eq!(record["action"], "restart-workers", "{record}");
    // A second restart that is not Ready at once: lost, then back.
    w.restart_container(1, 2, false);
    w.until("the second action", Duration::from_secs(15), || {
        agent.count("exit") == 4 && agent.count("spawn") == 6
    });
    w.restart_container(1, 2, true);
    w.until("rank 1 healthy again", Duration::from_secs(15), || {
        w.peer_state(0, 1).as_deref() == Some("healthy")
    });
    let s = w.status(0);
    assert_eq!(s["generation"], 2, "{s:#}");
    assert_eq!(s["world"]["down"], serde_json::json!([]), "{s:#}");

    // Pod 1 is deleted: a new loss, acted on again.
    w.api.delete_pod("job-1");
    w.until("the third action", Duration::from_secs(15), || {
        agent.count("exit") == 6
    });
    let s = w.status(0);
    assert_eq!(s["generation"], 3, "{s:#}");
    assert_eq!(s["last_loss"]["reason"], "deleted", "{s:#}");
    assert_eq!(s["last_action"]["result"], "signalled", "{s:#}");
    assert_eq!(s["actions_total"], 3, "{s:#}");
    drop(w.runtime);
}

/// The sidecar keeps the newest complete checkpoint on its own pod
/// (`trainwire.dev/checkpoint`), for the world controller, and its peer-loss
/// record (`trainwire.dev/peer-loss`) when it acts.
#[test]
fn the_sidecar_records_its_checkpoint_and_peer_losses_on_its_own_pod() {
    let w = World::new();
    let ckpt = w.dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).expect("checkpoint dir");
    std::fs::write(ckpt.join("ckpt-00000040.pt"), b"weights").expect("a checkpoint");
    let kubeconfig = w.api.kubeconfig(w.dir.path(), "e2e").expect("kubeconfig");
    let bin = trainwire_tests::sidecar_binary().expect("the sidecar binary");
    let log = std::fs::File::create(w.dir.path().join("sidecar-1.log")).expect("log");
    let _sidecar = KillOnDrop(
        loopback_sidecar(bin, 1, 2, w.port)
            .env("KUBECONFIG", kubeconfig)
            .env("TRAINWIRE_POD_NAMESPACE", "e2e")
            .env("TRAINWIRE_DETECTION", "kubernetes")
            .env("TRAINWIRE_SELECTOR", "app=train")
            .env("TRAINWIRE_CHECKPOINT_DIR", &ckpt)
            .env("TRAINWIRE_CHECKPOINT_SETTLE", "100ms")
            .env("TRAINWIRE_AGENT_MATCH", "no-such-agent-5d1e")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start trainwire-sidecar"),
    );
    w.until("the checkpoint record", Duration::from_secs(30), || {
        !w.annotated("job-1", "trainwire.dev/checkpoint").is_empty()
    });
    let record: Value =
        serde_json::from_str(&w.annotated("job-1", "trainwire.dev/checkpoint")[0]).expect("JSON");
    assert_eq!(record["name"], "ckpt-00000040.pt", "{record}");
    assert!(
        record["at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{record}"
    );
    w.until("rank 0 healthy", Duration::from_secs(30), || {
        w.peer_state(1, 0).as_deref() == Some("healthy")
    });
    w.api.delete_pod("job-0");
    w.until("the peer-loss record", Duration::from_secs(30), || {
        !w.annotated("job-1", "trainwire.dev/peer-loss").is_empty()
    });
    drop(w.runtime);
}
