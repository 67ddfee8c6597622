//! The Kubernetes watch's fan-out: N real `trainwire-sidecar`s with the env
//! the real `inject` renders for an N-pod StatefulSet
//! (`TRAINWIRE_DETECTION=kubernetes`), against the fake API server
//! (tests/src/apiserver.rs), which narrows each watch by its selectors as a
//! kube-apiserver does and counts every watch event it sends, by the client
//! that receives it.
//!
//! Each sidecar watches only the pods of its ring neighbours and the
//! rendezvous host (`trainwire_sidecar::ring::watched`), so a change of a
//! pod that is not the host reaches exactly the sidecars that watch it
//! (`ring::watchers`: 2 × `NEIGHBOURS`), whatever N; the host's changes reach
//! every sidecar. A deleted pod and a trainer container that exits are still
//! seen by every watcher within 0.5 s.
//!
//! Prints one `FANOUT` line per changed pod (docs/benchmarks.md).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainwire_contract::env as tw;
use trainwire_sidecar::ring;
use trainwire_test_support::sidecar::{KillOnDrop, loopback_addr};
use trainwire_test_support::wait::wait_until_or;
use trainwire_test_support::{free_port, status};
use trainwire_tests::apiserver::{FakeApiServer, pod};
use trainwire_tests::rendered::{self, resolve};

/// Sidecars (pods) in the world.
const N: u32 = 16;
const SET: &str = "train";
const NAMESPACE: &str = "e2e";
/// The rendezvous host (c10d in pod 0, as rendered).
const HOST: u32 = 0;
/// Bound of every wait.
const BOUND: Duration = Duration::from_secs(60);
/// How soon a watcher must see a deleted pod or an exited trainer.
const DETECTION: Duration = Duration::from_millis(500);

fn manifest() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {SET}
  namespace: {NAMESPACE}
  annotations:
    trainwire.dev/inject: "true"
spec:
  serviceName: {SET}
  replicas: {N}
  selector:
    matchLabels: {{app: train}}
  template:
    metadata:
      labels: {{app: train}}
    spec:
      containers:
      - name: trainer
        image: pytorch
        command: ["torchrun", "/app/train.py"]
"#
    )
}

fn uid(index: u32) -> String {
    format!("uid-{index}")
}

fn ip(index: u32) -> String {
    format!("127.0.0.1{index}")
}

/// Pod `index`, Ready, as the fake API server holds it.
fn ready_pod(index: u32) -> Value {
    pod(
        &format!("{SET}-{index}"),
        index,
        &uid(index),
        &ip(index),
        true,
        0,
    )
}

/// The StatefulSet with the world controller's `trainwire.dev/world`: pod 3
/// lost, the others training.
fn statefulset() -> Value {
    let ranks: Vec<Value> = (0..N)
        .map(|i| {
            json!({"index": i, "pod": format!("{SET}-{i}"),
                "role": if i == 3 { "lost" } else { "training" }, "from": "pod"})
        })
        .collect();
    let world = json!({"version": 1, "phase": "Recovering",
        "nodes": {"ready": N - 1, "expected": N}, "generation": 1,
        "ranks": ranks, "updatedAt": "2026-11-28T10:00:00Z"});
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": SET, "namespace": NAMESPACE, "uid": format!("uid-{SET}"),
            "annotations": {"trainwire.dev/world": world.to_string()}},
        "spec": {"replicas": N, "serviceName": SET, "selector": {"matchLabels": {"app": "train"}},
            "template": {"metadata": {"labels": {"app": "train"}}, "spec": {"containers": []}}}})
}

struct World {
    api: FakeApiServer,
    /// When the sidecars were started.
    since: Instant,
    dir: tempfile::TempDir,
    port: u16,
    _sidecars: Vec<KillOnDrop>,
    // Last: the fake API server stops with it, after the sidecars.
    _runtime: tokio::runtime::Runtime,
}

impl World {
    fn start() -> World {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let api = runtime
            .block_on(FakeApiServer::start())
            .expect("fake API server");
        for index in 0..N {
            api.set_pod(ready_pod(index));
        }
        api.set_workload("statefulsets", statefulset());
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let objects = rendered::inject(&manifest()).expect("inject");
        let sts = rendered::find(&objects, "StatefulSet", SET).expect("the StatefulSet");
        let init = &sts["spec"]["template"]["spec"]["initContainers"];
        let sidecar = init
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == "trainwire-sidecar"))
            .expect("the rendered sidecar");
        let entries = rendered::entries(sidecar);
        let bin = trainwire_tests::sidecar_binary().expect("the sidecar binary");
        let mut sidecars = Vec::new();
        let since = Instant::now();
        for index in 0..N {
            let fields = rendered::pod_fields(SET, index, NAMESPACE, &uid(index));
            let env = resolve(&entries, &fields).expect("the rendered env");
            let kubeconfig = api
                .kubeconfig_as(dir.path(), NAMESPACE, &format!("rank-{index}"))
                .expect("kubeconfig");
            let log = std::fs::File::create(dir.path().join(format!("sidecar-{index}.log")))
                .expect("log");
            let child = std::process::Command::new(&bin)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .envs(env)
                .env(tw::DETECTION, "kubernetes")
                .env(tw::BIND_ADDRESS, ip(index))
                .env(tw::HEALTH_PORT, port.to_string())
                .env("KUBECONFIG", kubeconfig)
                .env("RUST_LOG", "info")
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start trainwire-sidecar");
            sidecars.push(KillOnDrop(child));
        }
        World {
            api,
            since,
            dir,
            port,
            _sidecars: sidecars,
            _runtime: runtime,
        }
    }

    fn log(&self, index: u32) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("sidecar-{index}.log")))
            .unwrap_or_default()
    }

    /// `me`'s view of peer `rank`: (state, reason).
    fn peer(&self, me: u32, rank: u32) -> (Option<String>, Option<String>) {
        let s = status(&loopback_addr(me, self.port));
        let p = s["peers"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["rank"] == rank).cloned())
            .unwrap_or(Value::Null);
        (
            p["state"].as_str().map(str::to_string),
            p["reason"].as_str().map(str::to_string),
        )
    }

    /// The clients that were sent the change `version`.
    fn receivers(&self, version: u64) -> BTreeSet<String> {
        wait_until_or(
            &format!("every watch past change {version}"),
            BOUND,
            String::new,
            || self.api.settled(version),
        );
        self.api
            .deliveries()
            .into_iter()
            .filter(|d| d.version == version)
            .map(|d| d.token)
            .collect()
    }

    /// Waits until each of `watchers` sees `rank` lost for `reason`; how
    /// long each took from `since`.
    fn lost_seen(
        &self,
        rank: u32,
        reason: &str,
        watchers: &BTreeSet<u32>,
        since: Instant,
    ) -> Vec<Duration> {
        let mut seen: Vec<Option<Duration>> = vec![None; watchers.len()];
        wait_until_or(
            &format!("rank {rank} lost ({reason}) by {watchers:?}"),
            BOUND,
            || {
                watchers
                    .iter()
                    .map(|&w| format!("sidecar {w}:\n{}", self.log(w)))
                    .collect::<Vec<_>>()
                    .join("\n")
            },
            || {
                for (slot, &w) in seen.iter_mut().zip(watchers) {
                    if slot.is_none()
                        && self.peer(w, rank)
                            == (Some("lost".to_string()), Some(reason.to_string()))
                    {
                        *slot = Some(since.elapsed());
                    }
                }
                seen.iter().all(Option::is_some)
            },
        );
        seen.into_iter().flatten().collect()
    }
}

fn tokens(indices: &BTreeSet<u32>) -> BTreeSet<String> {
    indices.iter().map(|i| format!("rank-{i}")).collect()
}

#[test]
fn a_pod_change_reaches_only_the_sidecars_that_watch_it() {
    let w = World::start();
    let pods = N;
    // Every sidecar's watch open, and its watched peers healthy.
    wait_until_or(
        "every sidecar watching its peers",
        BOUND,
        || (0..N).map(|i| w.log(i)).collect::<Vec<_>>().join("\n"),
        || {
            w.api.open_watches() == N as usize
                && (0..N).all(|me| {
                    ring::watched(me, pods, Some(HOST))
                        .iter()
                        .all(|&p| w.peer(me, p).0.as_deref() == Some("healthy"))
                })
        },
    );
    for me in 0..N {
        let s = status(&loopback_addr(me, w.port));
        // The controllers' view, read from the StatefulSet: every pod's role.
        let view = &s["world"]["controllers"];
        assert_eq!(
            view["workload"], "statefulset/train",
            "sidecar {me}: {view:#}"
        );
        assert_eq!(view["error"], Value::Null, "sidecar {me}: {view:#}");
        let roles: Vec<&str> = view["status"]["ranks"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x["role"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(roles.len(), N as usize, "sidecar {me}: {view:#}");
        assert_eq!(roles[3], "lost", "sidecar {me}");
        // The unwatched peers are not-watched (not unknown) in this mode too.
        let watched = ring::watched(me, pods, Some(HOST));
        let not_watched = s["peers"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter(|p| p["state"] == "not-watched")
                    .filter_map(|p| p["rank"].as_u64())
                    .collect::<BTreeSet<u64>>()
            })
            .unwrap_or_default();
        let expected: BTreeSet<u64> = (0..u64::from(N))
            .filter(|r| *r != u64::from(me) && !watched.contains(&(*r as u32)))
            .collect();
        assert_eq!(not_watched, expected, "sidecar {me}");
        let list: Vec<String> = ring::watched(me, pods, Some(HOST))
            .iter()
            .map(u32::to_string)
            .collect();
        assert_eq!(
            s["detection"]["pod_watch"],
            format!(
                "app=train,apps.kubernetes.io/pod-index in ({})",
                list.join(",")
            ),
            "sidecar {me}"
        );
    }

    // Annotation changes, as the issue measured: each non-host pod's reach
    // its watchers only; the host's reach every other sidecar.
    const CHANGES: u32 = 5;
    let mut non_host_events = 0usize;
    let mut non_host_changes = 0usize;
    for index in [HOST, 1, 5, 8, 15] {
        let watchers = ring::watchers(index, pods, Some(HOST));
        let mut events = 0usize;
        for k in 0..CHANGES {
            let mut p = ready_pod(index);
            p["metadata"]["annotations"] = json!({"example.com/change": k.to_string()});
            w.api.set_pod(p);
            let got = w.receivers(w.api.version());
            assert_eq!(got, tokens(&watchers), "change {k} of pod {index}");
            events += got.len();
        }
        let per_change = events as f64 / f64::from(CHANGES);
        println!(
            "FANOUT n={N} pod={index}{} watch_events_per_change={per_change:.1} watchers={watchers:?}",
            if index == HOST {
                " (rendezvous host)"
            } else {
                ""
            }
        );
        if index == HOST {
            assert_eq!(watchers.len(), (N - 1) as usize);
        } else {
            non_host_events += events;
            non_host_changes += CHANGES as usize;
        }
    }
    let average = non_host_events as f64 / non_host_changes as f64;
    println!("FANOUT n={N} non-host average watch_events_per_change={average:.2}");
    // The view is read on demand: each sidecar read its own pod's owner
    // once, and its StatefulSet at start and when /status was asked more
    // than 10 s after the last read; nothing watches it.
    let requests = w.api.requests();
    // Requests for `path`, with or without a query.
    let count = |path: &str| {
        requests
            .iter()
            .filter(|r| r.split('?').next() == Some(path))
            .count()
    };
    let owner_reads = (0..N)
        .map(|i| count(&format!("GET /api/v1/namespaces/e2e/pods/{SET}-{i}")))
        .collect::<Vec<_>>();
    assert!(owner_reads.iter().all(|&n| n == 1), "{owner_reads:?}");
    let view_reads = count("GET /apis/apps/v1/namespaces/e2e/statefulsets/train");
    let bound = N as usize * (2 + w.since.elapsed().as_secs() as usize / 10);
    println!("FANOUT n={N} world_view_reads={view_reads} (bound {bound})");
    assert!(
        (N as usize..=bound).contains(&view_reads),
        "{view_reads} reads of the StatefulSet, expected {N}..={bound}"
    );
    assert_eq!(count("GET /apis/apps/v1/namespaces/e2e/statefulsets"), 0);
    assert!(
        average <= f64::from(2 * ring::NEIGHBOURS),
        "{average} events per change of a pod that is not the host"
    );

    // A deleted pod: its watchers see it within the detection bound, and
    // no one else is sent the deletion.
    let gone = 9;
    let watchers = ring::watchers(gone, pods, Some(HOST));
    let since = Instant::now();
    w.api.delete_pod(&format!("{SET}-{gone}"));
    let version = w.api.version();
    let took = w.lost_seen(gone, "deleted", &watchers, since);
    assert_eq!(w.receivers(version), tokens(&watchers));
    println!("FANOUT deleted pod {gone}: seen by {watchers:?} after {took:?}");
    assert!(took.iter().all(|t| *t <= DETECTION), "{took:?}");

    // A trainer that exits (the terminated state, Ready false, the restart
    // count not moved yet): a loss at once for its watchers.
    let exited = 12;
    let watchers = ring::watchers(exited, pods, Some(HOST));
    let mut p = pod(
        &format!("{SET}-{exited}"),
        exited,
        &uid(exited),
        &ip(exited),
        false,
        0,
    );
    p["status"]["containerStatuses"][0]["state"] = json!({"terminated": {
        "exitCode": 137, "reason": "Error", "containerID": "containerd://12",
        "finishedAt": "2026-11-25T08:30:00Z"}});
    p["status"]["conditions"][0]["lastTransitionTime"] = json!("2026-11-25T08:30:00Z");
    let since = Instant::now();
    w.api.set_pod(p);
    let took = w.lost_seen(exited, "container-restarted", &watchers, since);
    println!("FANOUT exited trainer of pod {exited}: seen by {watchers:?} after {took:?}");
    assert!(took.iter().all(|t| *t <= DETECTION), "{took:?}");
    // Its return (restarted, Ready) closes the loss.
    w.api.set_pod(pod(
        &format!("{SET}-{exited}"),
        exited,
        &uid(exited),
        &ip(exited),
        true,
        1,
    ));
    wait_until_or(
        "the restarted trainer healthy again",
        BOUND,
        String::new,
        || {
            watchers
                .iter()
                .all(|&me| w.peer(me, exited).0.as_deref() == Some("healthy"))
        },
    );
}

/// The size of one watch event: a whole Pod of an injected StatefulSet, as
/// measured on a real kube-apiserver v1.36.2 (issue #32: 251 KiB for 18
/// events, 936 KiB for 66).
const POD_EVENT_KIB: f64 = 14.5;

/// Watch events one change of each pod sends to sidecars, from the watched
/// sets alone (`ring::watched` of every sidecar): `pods` entries.
fn events_per_change(pods: u32, host: Option<u32>) -> Vec<usize> {
    let mut reach = vec![0usize; pods as usize];
    for me in 0..pods {
        for p in ring::watched(me, pods, host) {
            if let Some(r) = reach.get_mut(p as usize) {
                *r += 1;
            }
        }
    }
    reach
}

/// The model for large worlds (one line per N and topology, for
/// docs/benchmarks.md): watch events and bytes per pod change, before
/// (every sidecar watched every pod) and now.
#[test]
fn model_of_the_watch_fan_out() {
    for pods in [16u32, 64, 128, 1024] {
        for (topology, host) in [("host in pod 0", Some(0)), ("store outside", None)] {
            let reach = events_per_change(pods, host);
            let non_host: Vec<usize> = reach
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i as u32) != host)
                .map(|(_, r)| *r)
                .collect();
            let max_non_host = non_host.iter().copied().max().unwrap_or_default();
            let average = reach.iter().sum::<usize>() as f64 / f64::from(pods);
            let host_reach = host.and_then(|h| reach.get(h as usize).copied());
            println!(
                "MODEL n={pods} {topology}: non-host change {max_non_host} events {:.0} KiB; host change {}; average over pods {average:.2} events {:.0} KiB; before {pods} events {:.1} MiB",
                max_non_host as f64 * POD_EVENT_KIB,
                host_reach
                    .map(|h| format!("{h} events {:.1} MiB", h as f64 * POD_EVENT_KIB / 1024.0))
                    .unwrap_or_else(|| "-".into()),
                average * POD_EVENT_KIB,
                f64::from(pods) * POD_EVENT_KIB / 1024.0,
            );
            // A pod that is not the host reaches its ring watchers only,
            // whatever the world's size; the host reaches every sidecar.
            assert!(non_host.iter().all(|&r| r == 2 * ring::NEIGHBOURS as usize));
            if let Some(h) = host_reach {
                assert_eq!(h, (pods - 1) as usize);
            }
        }
    }
}
