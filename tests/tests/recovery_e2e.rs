//! The sidecar's headline claim, end to end with a real torchrun: two
//! "nodes", each its own network namespace on a bridge, each running a
//! torchrun agent (c10d rendezvous on node 0, the env the webhook injects)
//! with one worker training `examples/train.py` into a shared checkpoint
//! directory, and each with a `trainwire-sidecar` on heartbeats. One node is
//! cut off silently (its switch port goes down and its processes freeze, like
//! a node that lost power), a replacement node with the same host name and a
//! new address starts 5 s later, and training must resume from the last
//! checkpoint with both nodes.
//!
//! - Scenario A: the lost node is not the rendezvous host. torchrun recovers
//!   on its own once the replacement joins; the sidecar (`auto`) only reports.
//! - Scenario B: the lost node is the rendezvous host. The survivor's agent
//!   never recovers on its own; its sidecar must SIGKILL the agent and its
//!   workers, the "kubelet" (this harness) restarts the trainer container, and
//!   training resumes once the replacement host is up.
//!
//! With the real sidecar, the pods also stand in a fake apiserver on the
//! bridge that the sidecars write their records to; the world controller's
//! view computed from them ([`trainwire_tests::world_status`]) must record
//! the loss and put `resumedAt` within 2 s of the first training step after
//! the replacement joins.
//!
//! Each run prints one `RECOVERY ...` line with the measured times
//! (`docs/benchmarks.md`, "Recovery end to end"). Skips with a clear message
//! when PyTorch is missing, when not root, or when `ip netns` does not work.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;
use trainwire_engine::mutation::rendezvous;
use trainwire_sidecar::env as tw;
use trainwire_tests::apiserver::{self, FakeApiServer};
use trainwire_tests::kubelet::Kubelet;
use trainwire_tests::netns::{self, Network, Node};
use trainwire_tests::process::{Line, Log, Proc, Tag, descendants, signal_all, unique_name};
use trainwire_tests::torch::{self, TrainEvent};
use trainwire_tests::world_status::{WorldController, api_in, check_resumed, wall};

/// Bound of every wait for the trainers (imports and rendezvous are slow on a busy 2-core machine).
const WAIT: Duration = Duration::from_secs(180);
/// When the replacement node starts after the cut (as in DESIGN.md's measured facts).
const REPLACEMENT_AFTER: Duration = Duration::from_secs(5);
const CHECKPOINT_INTERVAL: u64 = 5;
/// When the lost node's name is re-pointed to the replacement, after it starts.
const REPOINT_AFTER: Duration = Duration::from_secs(2);
const RDZV_PORT: u16 = 29400;
/// The pods are `node-<i>` of a StatefulSet `node` under the headless
/// Service `train` in namespace `e2e`.
const SERVICE: &str = "train";
const NAMESPACE: &str = "e2e";

/// Pod `i`'s DNS name exactly as the webhook injects it (`{i}`: the pattern).
fn pod_host(i: &str) -> String {
    trainwire_engine::mutation::workload::pod_host(
        "node",
        i,
        SERVICE,
        NAMESPACE,
        trainwire_engine::policy::DEFAULT_CLUSTER_DOMAIN,
    )
}

/// Who sends the signals: the real sidecar; or, to reproduce DESIGN.md's
/// measured facts without it, the harness itself (`harness`), or nobody
/// (`none`: the baseline, where losing the rendezvous host must leave the
/// survivor stuck). Chosen by `TRAINWIRE_E2E_RESPONDER`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Responder {
    Sidecar,
    Harness,
    Nobody,
}

fn responder() -> Responder {
    match std::env::var("TRAINWIRE_E2E_RESPONDER").as_deref() {
        Ok("harness") => Responder::Harness,
        Ok("none") => Responder::Nobody,
        _ => Responder::Sidecar,
    }
}

struct Trainer {
    node: Node,
    kubelet: Kubelet,
    sidecar: Option<Proc>,
}

/// Fields drop in order: trainers and sidecars first, then every tagged
/// process, then the namespaces, then the checkpoint directory.
struct Cluster {
    trainers: Vec<Trainer>,
    tag: Tag,
    net: Network,
    ckpt: TempDir,
    log: Log,
    run: String,
    responder: Responder,
    sidecar_bin: Option<PathBuf>,
    /// `PET_NNODES` and the sidecars' `TRAINWIRE_NNODES`: `2`, or `2:3`.
    nnodes: String,
    /// Where sidecars and trainers see the checkpoints: `ckpt`, or a mount of it.
    ckpt_dir: Option<PathBuf>,
    /// More env for every sidecar.
    sidecar_env: Vec<(String, String)>,
    /// More env for every trainer.
    trainer_env: Vec<(String, String)>,
    /// Warm workers: trainwire's rendezvous handler installed here (as the
    /// init container does), each node with a channel directory of its
    /// own, the trainer with `--start-method forkserver --run-path` as the
    /// webhook injects them for a plain `torchrun script.py`.
    warm: Option<TempDir>,
    /// With the real sidecar: the apiserver holding the pods and the
    /// sidecars' records, the injected StatefulSet (its template's
    /// annotations go on every pod), and the kubeconfig.
    api: Option<Api>,
}

struct Api {
    server: FakeApiServer,
    sts: serde_json::Value,
    kubeconfig: PathBuf,
    _dir: TempDir,
    /// Serves `server`; dropped after the sidecars (declared after them).
    _runtime: tokio::runtime::Runtime,
}

/// The StatefulSet the pods of these tests would come from, injected by the
/// real CLI: its template's annotations are what the world controller reads
/// on each pod.
fn injected_statefulset() -> Result<serde_json::Value, String> {
    let manifest = format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: node\n  namespace: {NAMESPACE}\n  annotations:\n    trainwire.dev/inject: \"true\"\n    trainwire.dev/nnodes: \"2\"\nspec:\n  serviceName: {SERVICE}\n  replicas: 2\n  selector:\n    matchLabels: {{app: llm}}\n  template:\n    metadata:\n      labels: {{app: llm}}\n    spec:\n      containers:\n      - name: trainer\n        image: pytorch\n        command: [\"torchrun\", \"/app/train.py\"]\n"
    );
    let objects = trainwire_tests::rendered::inject(&manifest)?;
    trainwire_tests::rendered::find(&objects, "StatefulSet", "node").cloned()
}

impl Cluster {
    fn new(responder: Responder) -> Result<Cluster, String> {
        let sidecar_bin = match responder {
            Responder::Sidecar => Some(trainwire_tests::sidecar_binary()?),
            Responder::Harness | Responder::Nobody => None,
        };
        let mut net = Network::create("twe")?;
        let domain = pod_host("0");
        let domain = domain
            .strip_prefix("node-0.")
            .ok_or_else(|| format!("pod 0's name {domain} is not node-0.<domain>"))?;
        net.set_domain(domain);
        let api = match responder {
            Responder::Sidecar => {
                let (server, runtime) = api_in(&mut net, 60)?;
                let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
                let kubeconfig = server
                    .kubeconfig(dir.path(), NAMESPACE)
                    .map_err(|e| format!("kubeconfig: {e}"))?;
                Some(Api {
                    server,
                    sts: injected_statefulset()?,
                    kubeconfig,
                    _dir: dir,
                    _runtime: runtime,
                })
            }
            Responder::Harness | Responder::Nobody => None,
        };
        Ok(Cluster {
            trainers: Vec::new(),
            tag: Tag::new("twe2e"),
            net,
            ckpt: tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?,
            log: Log::new("e2e"),
            run: unique_name("run"),
            responder,
            sidecar_bin,
            nnodes: "2".to_string(),
            ckpt_dir: None,
            sidecar_env: Vec::new(),
            trainer_env: Vec::new(),
            warm: None,
            api,
        })
    }

    /// Warm workers from here on (see [`Cluster::warm`]).
    fn warm_workers(&mut self) -> Result<(), String> {
        let bin = self
            .sidecar_bin
            .clone()
            .ok_or("warm workers need the sidecar binary")?;
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let installed = std::process::Command::new(bin)
            .arg("install-rendezvous-handler")
            .arg(dir.path().join("python"))
            .arg("--channel")
            .arg(dir.path().join("channel"))
            .status()
            .map_err(|e| format!("install-rendezvous-handler: {e}"))?;
        if !installed.success() {
            return Err(format!("install-rendezvous-handler: {installed}"));
        }
        self.warm = Some(dir);
        Ok(())
    }

    /// Node `label`'s channel directory, with warm workers.
    fn channel(&self, label: &str) -> Result<Option<PathBuf>, String> {
        use std::os::unix::fs::PermissionsExt;
        let Some(dir) = &self.warm else {
            return Ok(None);
        };
        let channel = dir.path().join(format!("channel-{label}"));
        std::fs::create_dir_all(&channel).map_err(|e| format!("mkdir: {e}"))?;
        std::fs::set_permissions(&channel, std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| format!("chmod: {e}"))?;
        Ok(Some(channel))
    }

    fn checkpoint_dir(&self) -> PathBuf {
        self.ckpt_dir
            .clone()
            .unwrap_or_else(|| self.ckpt.path().to_path_buf())
    }

    /// The `/status` document of the sidecar on node `label`.
    fn status(&self, label: &str) -> Option<serde_json::Value> {
        let t = self.trainer(label)?;
        t.sidecar.as_ref()?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], tw::DEFAULT_HEALTH_PORT));
        let body = netns::http_get(&t.node.ns, addr, "/status").ok()?;
        serde_json::from_str(&body).ok()
    }

    fn note(&self, text: String) {
        self.log.push(format!("harness| {text}"));
    }

    /// A node: namespace, sidecar, and the trainer container under a kubelet.
    fn start_node(
        &mut self,
        label: &str,
        rank: u32,
        addr: Ipv4Addr,
        point_name: bool,
    ) -> Result<Node, String> {
        let hostname = format!("node-{rank}");
        let node = self
            .net
            .add_node_named(label, &hostname, addr, point_name)?;
        let agent_token = format!("trainwire_agent={label}.{}", self.run);
        let uid = format!("{label}-{}", self.run);
        let channel = self.channel(label)?;
        if let Some(api) = &self.api {
            // The pod object, Ready, replacing the one of its name.
            let mut pod = apiserver::pod(&hostname, rank, &uid, &addr.to_string(), true, 0);
            pod["metadata"]["annotations"] =
                api.sts["spec"]["template"]["metadata"]["annotations"].clone();
            api.server.set_pod(pod);
        }
        let sidecar = match &self.sidecar_bin {
            Some(bin) => {
                let mut cmd = self.net.command(&node, &bin.to_string_lossy());
                if let Some(api) = &self.api {
                    cmd.env("KUBECONFIG", &api.kubeconfig);
                }
                cmd.envs([
                    (tw::POD_NAME, hostname.clone()),
                    (tw::POD_NAMESPACE, NAMESPACE.to_string()),
                    (tw::POD_UID, uid.clone()),
                    (tw::NODE_RANK, rank.to_string()),
                    (tw::NNODES, self.nnodes.clone()),
                    (tw::PEER_HOSTS, pod_host("{i}")),
                    (tw::RDZV_HOST_RANK, "0".to_string()),
                    (tw::RDZV_PORT, RDZV_PORT.to_string()),
                    (tw::HEALTH_PORT, tw::DEFAULT_HEALTH_PORT.to_string()),
                    (tw::BIND_ADDRESS, "0.0.0.0".to_string()),
                    (
                        tw::CHECKPOINT_DIR,
                        self.checkpoint_dir().to_string_lossy().into_owned(),
                    ),
                    (tw::ON_PEER_LOSS, "auto".to_string()),
                    (tw::DETECTION, "heartbeat".to_string()),
                    (tw::HEARTBEAT_INTERVAL, "1s".to_string()),
                    (tw::HEARTBEAT_MISSES, "3".to_string()),
                    (tw::AGENT_MATCH, agent_token.clone()),
                    ("RUST_LOG", "info".to_string()),
                ]);
                // A benchmark knob: another confirmation limit than the default.
                if let Ok(v) = std::env::var("TRAINWIRE_E2E_CONFIRM_AFTER") {
                    cmd.env(tw::CONFIRM_AFTER, v);
                }
                cmd.envs(self.sidecar_env.iter().map(|(k, v)| (k, v)));
                if let Some(channel) = &channel {
                    cmd.env(tw::RENDEZVOUS_DIR, channel);
                }
                let proc = Proc::spawn_as(
                    &mut cmd,
                    self.tag.value(),
                    &self.log,
                    &format!("{label}/sidecar| "),
                )
                .map_err(|e| format!("start the sidecar: {e}"))?;
                Some(proc)
            }
            None => None,
        };
        let program = self.net.command_args(&node, &torch::python());
        let mut env = torch::webhook_env(
            &self.nnodes,
            1,
            &format!("{}:{RDZV_PORT}", pod_host("0")),
            &self.run,
            rank,
        );
        // PET_RDZV_CONF exactly as the webhook injects it for this world.
        let nnodes: trainwire_engine::mutation::annotations::Nnodes = self
            .nnodes
            .parse()
            .map_err(|e| format!("nnodes {}: {e:?}", self.nnodes))?;
        let conf = rendezvous::rdzv_conf_pairs(Some(nnodes), trainwire_contract::RdzvStore::Pod0)
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        env.retain(|(k, _)| k != rendezvous::RDZV_CONF);
        env.push((rendezvous::RDZV_CONF.to_string(), conf));
        env.push((
            "CHECKPOINT_DIR".into(),
            self.checkpoint_dir().to_string_lossy().into_owned(),
        ));
        env.push(("GLOO_SOCKET_IFNAME".into(), "eth0".into()));
        env.extend(self.trainer_env.iter().cloned());
        if let (Some(channel), Some(warm)) = (&channel, &self.warm) {
            env.retain(|(k, _)| k != "PET_RDZV_BACKEND");
            env.extend([
                (
                    "PET_RDZV_BACKEND".to_string(),
                    trainwire_sidecar::rendezvous::HANDLER_BACKEND.to_string(),
                ),
                (
                    "PYTHONPATH".to_string(),
                    warm.path().join("python").to_string_lossy().into_owned(),
                ),
                (
                    tw::RENDEZVOUS_DIR.to_string(),
                    channel.to_string_lossy().into_owned(),
                ),
                ("PET_START_METHOD".to_string(), "forkserver".to_string()),
                ("PET_RUN_PATH".to_string(), "1".to_string()),
            ]);
        }
        let make = move || torch::agent_command(&program, &agent_token, CHECKPOINT_INTERVAL, &env);
        // A kubelet's restart policy: 1 s, then CrashLoopBackOff 10 s, 20 s, ...
        let kubelet = Kubelet::run_backoff(
            &format!("{label}/trainer"),
            self.tag.value(),
            &self.log,
            Duration::from_secs(1),
            make,
        );
        self.trainers.push(Trainer {
            node: node.clone(),
            kubelet,
            sidecar,
        });
        Ok(node)
    }

    fn trainer(&self, label: &str) -> Option<&Trainer> {
        self.trainers
            .iter()
            .find(|t| t.node.ns.ends_with(&format!("-{label}")))
    }

    fn wait(&self, what: &str, pred: impl Fn(&str) -> bool) -> Result<Line, String> {
        self.log.wait_for(WAIT, pred).ok_or_else(|| {
            format!(
                "timed out after {WAIT:?} waiting for {what}\n{}",
                self.log.tail(200)
            )
        })
    }

    /// The `latest` checkpoint's step.
    fn latest_step(&self) -> Option<u64> {
        std::fs::read_to_string(self.ckpt.path().join("latest"))
            .ok()?
            .trim()
            .strip_prefix("ckpt-")?
            .strip_suffix(".pt")?
            .parse()
            .ok()
    }

    /// The state (`healthy`, `lost`, ...) of peer `rank` in the `/status` of
    /// the sidecar on node `label`.
    fn peer_state(&self, label: &str, rank: u64) -> Option<String> {
        let t = self.trainer(label)?;
        t.sidecar.as_ref()?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], tw::DEFAULT_HEALTH_PORT));
        let body = netns::http_get(&t.node.ns, addr, "/status").ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        status["peers"]
            .as_array()?
            .iter()
            .find(|p| p["rank"].as_u64() == Some(rank))
            .and_then(|p| p["state"].as_str())
            .map(str::to_string)
    }

    /// Cut a node off and freeze all its processes (a node that lost power).
    fn lose(&self, label: &str) -> Result<Instant, String> {
        let t = self
            .trainer(label)
            .ok_or_else(|| format!("no node {label}"))?;
        self.net.cut(&t.node)?;
        let at = Instant::now();
        self.net.freeze(&t.node);
        self.note(format!("cut off and froze {label} ({})", t.node.hostname));
        Ok(at)
    }
}

fn is_event(line: &str, event: &str) -> Option<TrainEvent> {
    TrainEvent::parse(line).filter(|e| e.event == event)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

struct Measured {
    /// The world status' `resumedAt` minus the first training step after
    /// the loss (with the real sidecar).
    resumed_gap: Option<f64>,
    resumed_from: u64,
    cold_start: Duration,
    cut_to_detect: Option<Duration>,
    cut_to_signal: Option<Duration>,
    /// `None`: no resume (the `none` baseline).
    replacement_to_resume: Option<Duration>,
    cut_to_resume: Option<Duration>,
    /// Container exits of the survivor's trainer during the recovery.
    survivor_exits: usize,
}

/// Runs one scenario; `lose_host` picks B (node 0, the rendezvous host) over A.
/// `old_published`: when the name follows the replacement, it also keeps
/// leading to the lost pod for that long (an Indexed Job's old pod stays in
/// its headless Service's DNS while it is Terminating, beside its
/// replacement), then to the replacement alone.
fn scenario(
    lose_host: bool,
    responder: Responder,
    old_published: Option<Duration>,
) -> Result<Measured, String> {
    let mut c = Cluster::new(responder)?;
    if warm_by_env(responder) {
        c.warm_workers()?;
    }
    let cold = Instant::now();
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;

    // Both nodes train together and a few checkpoints exist.
    c.wait("a 2-node world", |l| {
        is_event(l, "start").is_some_and(|e| e.num("world_size") == Some(2))
    })?;
    // The baseline, measured in the same run on the same machine: a cold
    // start of both nodes to the first training step.
    let first = c.wait("the first step", |l| is_event(l, "step").is_some())?;
    let cold_start = first.at.duration_since(cold);
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    // The world controller has seen the world whole before the loss.
    let controller = match &c.api {
        Some(api) => Some(WorldController::new(&api.sts, NAMESPACE)?.watch(&api.server)?),
        None => None,
    };

    let (lost, survivor, rank) = if lose_host {
        ("n0", "n1", 0)
    } else {
        ("n1", "n0", 1)
    };
    let survivor_exits = c.trainer(survivor).map(|t| t.kubelet.exits()).unwrap_or(0);
    let cut = c.lose(lost)?;
    let at_cut = c.latest_step().ok_or("no checkpoint at the cut")?;
    c.note(format!("latest checkpoint at the cut: step {at_cut}"));

    // Scenario B: the survivor's agent is stuck on the dead store; it must be
    // killed. The sidecar does it; in harness mode the harness stands in,
    // after the same 3 missed 1 s heartbeats.
    // Scenario B: the survivor's agent is stuck on the dead store; it must be
    // killed. The sidecar does it; in harness mode the harness stands in,
    // after the same 3 missed 1 s heartbeats.
    if lose_host && c.responder == Responder::Harness {
        std::thread::sleep(Duration::from_secs(3));
        if let Some(pid) = c.trainer(survivor).and_then(|t| t.kubelet.pid()) {
            let mut pids = descendants(pid);
            pids.push(pid);
            signal_all(&pids, Signal::SIGKILL);
            c.note(format!(
                "SIGKILLed the survivor's agent {pid} and {} descendants",
                pids.len() - 1
            ));
        }
    }
    // When the survivor's sidecar reports the loss, and (B) when the
    // survivor's trainer container exits.
    let with_sidecar = c.responder == Responder::Sidecar;
    let lost_rank = if lose_host { 0 } else { 1 };
    let (mut detected, mut signalled) = (None, None);
    let deadline = cut + Duration::from_secs(30);
    // The sidecar restarts the survivor's agent only once the replacement
    // answers: its signal is awaited after the replacement starts.
    let expect_signal = lose_host && c.responder == Responder::Harness;
    while Instant::now() < deadline
        && ((with_sidecar && detected.is_none()) || (expect_signal && signalled.is_none()))
    {
        if with_sidecar
            && detected.is_none()
            && c.peer_state(survivor, lost_rank).as_deref() == Some("lost")
        {
            detected = Some(cut.elapsed());
            c.note(format!(
                "the survivor's sidecar reports rank {lost_rank} lost"
            ));
        }
        if lose_host
            && signalled.is_none()
            && c.trainer(survivor)
                .is_some_and(|t| t.kubelet.exits() > survivor_exits)
        {
            signalled = Some(cut.elapsed());
            c.note("the survivor's trainer container exited".to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if with_sidecar && detected.is_none() {
        return Err(format!(
            "the survivor's sidecar did not report rank {lost_rank} lost within 30 s\n{}",
            c.log.tail(200)
        ));
    }
    if lose_host && signalled.is_none() && c.responder == Responder::Harness {
        return Err(format!(
            "the survivor's trainer was not killed within 30 s of losing the rendezvous host\n{}",
            c.log.tail(200)
        ));
    }

    let wait_more = REPLACEMENT_AFTER.saturating_sub(cut.elapsed());
    std::thread::sleep(wait_more);
    // The replacement takes over the lost node's name with a new address.
    let label = if lose_host { "n0b" } else { "n1b" };
    let mark = c.log.mark();
    let replaced = Instant::now();
    let new_addr = Network::addr(if lose_host { 20 } else { 21 });
    // As DNS does, the name follows the replacement a moment after it
    // starts: until then it resolves to the dead pod's address.
    c.start_node(label, rank, new_addr, false)?;
    c.note(format!("started the replacement {label} as node-{rank}"));
    std::thread::sleep(REPOINT_AFTER);
    let name = pod_host(&rank.to_string());
    if let Some(both_for) = old_published {
        c.net.add_host(&name, new_addr)?;
        c.note(format!(
            "node-{rank} now resolves to the dead address and to {new_addr}, for {both_for:?}"
        ));
        let exits = c.trainer(survivor).map(|t| t.kubelet.exits()).unwrap_or(0);
        std::thread::sleep(both_for);
        // Restarting torchrun now would send it to the dead address, first
        // in the answer, for its whole read_timeout.
        if c.trainer(survivor).map(|t| t.kubelet.exits()).unwrap_or(0) != exits {
            return Err(format!(
                "the survivor's trainer was restarted while node-{rank}'s name still led to the dead pod\n{}",
                c.log.tail(250)
            ));
        }
    }
    c.net.set_host(&name, new_addr)?;
    c.note(format!("node-{rank} now resolves to {new_addr}"));

    if c.responder == Responder::Nobody && lose_host {
        // The baseline: nobody kills the survivor's agent, which stays blocked
        // on the dead store; the world never forms again.
        let window = Duration::from_secs(90);
        let resumed = c.log.wait_for_after(mark, window, |l| {
            is_event(l, "step").is_some_and(|e| e.num("resumed_from").is_some())
        });
        if let Some(l) = resumed {
            return Err(format!(
                "without a helper, training resumed anyway: {}\n{}",
                l.text,
                c.log.tail(250)
            ));
        }
        c.note(format!(
            "no resume within {window:?} of the replacement, as DESIGN.md measured"
        ));
        return Ok(Measured {
            resumed_gap: None,
            resumed_from: at_cut,
            cold_start,
            cut_to_detect: None,
            cut_to_signal: None,
            replacement_to_resume: None,
            cut_to_resume: None,
            survivor_exits: 0,
        });
    }
    // Training resumes from the checkpoint of the cut, with both nodes.
    let resumed = c
        .log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "step").is_some_and(|e| e.num("resumed_from").is_some())
        })
        .ok_or_else(|| {
            format!(
                "training did not resume within {WAIT:?}\n{}",
                c.log.tail(250)
            )
        })?;
    let took = resumed.at.duration_since(replaced);
    let cut_to_resume = resumed.at.duration_since(cut);
    let ev = TrainEvent::parse(&resumed.text).ok_or("unparsable step line")?;
    let from = ev.num("resumed_from").ok_or("no resumed_from")?;
    if from != at_cut {
        return Err(format!(
            "resumed from step {from}, the checkpoint at the cut was {at_cut}\n{}",
            c.log.tail(250)
        ));
    }
    if ev.num("world_size") != Some(2) {
        return Err(format!(
            "resumed with world size {:?}, not 2: {}",
            ev.num("world_size"),
            resumed.text
        ));
    }
    // Both the survivor and the replacement run a worker that resumed.
    for who in [survivor, label] {
        let prefix = format!("{who}/trainer| ");
        c.log
            .wait_for_after(mark, Duration::from_secs(10), |l| {
                l.starts_with(&prefix)
                    && is_event(l, "start").is_some_and(|e| e.num("resumed_from") == Some(at_cut))
            })
            .ok_or_else(|| {
                format!(
                    "{who} did not resume from step {at_cut}\n{}",
                    c.log.tail(250)
                )
            })?;
    }
    // And it goes on: a new checkpoint past the resume point.
    c.log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "checkpoint")
                .is_some_and(|e| e.num("step") >= Some(at_cut + 2 * CHECKPOINT_INTERVAL))
        })
        .ok_or_else(|| format!("training did not go on after resuming\n{}", c.log.tail(250)))?;

    // Scenario A in `auto`: torchrun recovered by itself; the sidecar must
    // not have killed the survivor's trainer.
    if !lose_host && responder == Responder::Sidecar {
        let exits = c.trainer(survivor).map(|t| t.kubelet.exits()).unwrap_or(0);
        if exits != survivor_exits {
            return Err(format!(
                "the survivor's trainer exited although its lost peer was not the rendezvous host\n{}",
                c.log.tail(250)
            ));
        }
    }
    let survivor_exits = c
        .trainer(survivor)
        .map(|t| t.kubelet.exits())
        .unwrap_or(0)
        .saturating_sub(survivor_exits);
    if lose_host && responder == Responder::Sidecar && survivor_exits != 1 {
        return Err(format!(
            "the survivor's trainer container exited {survivor_exits} times, not once\n{}",
            c.log.tail(250)
        ));
    }
    // The world status: the loss recorded, resumed when training ran again.
    let resumed_gap = match &controller {
        Some(controller) => {
            let fail = |e: String| format!("{e}\n{}", c.log.tail(250));
            let status = controller.until_resumed().map_err(fail)?;
            c.note(format!("world status: {}", status.to_annotation()));
            Some(check_resumed(&status, wall(cut)?, wall(resumed.at)?).map_err(fail)?)
        }
        None => None,
    };
    if std::env::var_os("TRAINWIRE_E2E_DUMP").is_some() {
        eprintln!("{}", c.log.tail(100_000));
    }
    Ok(Measured {
        resumed_gap,
        resumed_from: from,
        cold_start,
        cut_to_detect: detected,
        cut_to_signal: signalled,
        replacement_to_resume: Some(took),
        cut_to_resume: Some(cut_to_resume),
        survivor_exits,
    })
}

/// The losses of [`run`] run as the webhook injects a plain `torchrun
/// script.py` with the sidecar: trainwire's rendezvous handler and warm
/// workers (forkserver, `--run-path`). `TRAINWIRE_E2E_WARM=0`, or no
/// sidecar, runs torch's own c10d handler (the baseline).
fn warm_by_env(responder: Responder) -> bool {
    responder == Responder::Sidecar && std::env::var("TRAINWIRE_E2E_WARM").as_deref() != Ok("0")
}

fn run(test: &str, lose_host: bool, old_published: Option<Duration>) {
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    let responder = responder();
    let started = Instant::now();
    match scenario(lose_host, responder, old_published) {
        Ok(m) => println!(
            "RECOVERY scenario={} responder={responder:?} handler={} resumed_from={} resumed_at_minus_first_step_s={} cut_to_detect_s={} cut_to_signal_s={} replacement_to_resume_s={} cut_to_resume_s={} survivor_exits={} cold_start_s={} total_s={}",
            match (lose_host, old_published) {
                (false, _) => "A-lose-other-node".to_string(),
                (true, None) => "B-lose-rendezvous-host".to_string(),
                (true, Some(d)) => format!("B-lose-rendezvous-host-old-published-{}s", d.as_secs()),
            },
            if warm_by_env(responder) {
                "trainwire-c10d"
            } else {
                "c10d"
            },
            m.resumed_from,
            m.resumed_gap
                .map(|g| format!("{g:.2}"))
                .unwrap_or_else(|| "-".into()),
            m.cut_to_detect
                .map(|d| secs(d).to_string())
                .unwrap_or_else(|| "-".into()),
            m.cut_to_signal
                .map(|d| secs(d).to_string())
                .unwrap_or_else(|| "-".into()),
            m.replacement_to_resume
                .map(|d| secs(d).to_string())
                .unwrap_or_else(|| "never".into()),
            m.cut_to_resume
                .map(|d| secs(d).to_string())
                .unwrap_or_else(|| "never".into()),
            m.survivor_exits,
            secs(m.cold_start),
            secs(started.elapsed()),
        ),
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn torchrun_resumes_after_losing_a_node_that_is_not_the_rendezvous_host() {
    run(
        "torchrun_resumes_after_losing_a_node_that_is_not_the_rendezvous_host",
        false,
        None,
    );
}

#[test]
fn torchrun_resumes_after_losing_the_rendezvous_host() {
    run(
        "torchrun_resumes_after_losing_the_rendezvous_host",
        true,
        None,
    );
}

/// The rendezvous host is lost and, for 10 s after its name follows the
/// replacement, the name still also leads to the dead pod (first in the
/// answer), as an Indexed Job's Terminating pod stays published beside its
/// replacement: the survivor is restarted only once the dead address is
/// gone, exactly once, and training resumes.
#[test]
fn the_survivor_waits_while_the_hosts_name_still_leads_to_the_dead_pod() {
    run(
        "the_survivor_waits_while_the_hosts_name_still_leads_to_the_dead_pod",
        true,
        Some(Duration::from_secs(10)),
    );
}

/// A 5 s network blip of the rendezvous host (no freeze: its processes keep
/// running): training rides it out without any helper, so with the sidecar
/// too: no container exit, no worker restart, steps go on after the heal.
fn blip(cut_for: Duration) -> Result<(), String> {
    let mut c = Cluster::new(responder())?;
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    let exits: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    let node = c.trainer("n0").map(|t| t.node.clone()).ok_or("no n0")?;
    let mark = c.log.mark();
    c.net.cut(&node)?;
    let cut = Instant::now();
    c.note(format!("cut n0 off for {cut_for:?} (no freeze)"));
    std::thread::sleep(cut_for);
    c.net.heal(&node)?;
    c.note("healed n0".to_string());
    let healed = Instant::now();
    let last = c
        .log
        .wait_for_after(c.log.mark(), Duration::from_secs(60), |l| {
            is_event(l, "step").is_some()
        })
        .ok_or_else(|| format!("no step after the heal\n{}", c.log.tail(200)))?;
    // Some more steps, to give a wrong restart time to show.
    std::thread::sleep(Duration::from_secs(8));
    let now: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    if now != exits {
        return Err(format!(
            "container exits during a {cut_for:?} blip: {exits:?} -> {now:?}\n{}",
            c.log.tail(200)
        ));
    }
    if let Some(l) = c.log.wait_for_after(mark, Duration::from_millis(10), |l| {
        is_event(l, "start").is_some()
    }) {
        return Err(format!(
            "a worker restarted during a blip: {}\n{}",
            l.text,
            c.log.tail(200)
        ));
    }
    println!(
        "BLIP responder={:?} cut_s={} heal_to_step_s={} cut_to_step_s={} container_exits=0 worker_restarts=0 survivor_view={:?}",
        c.responder,
        secs(cut_for),
        secs(last.at.saturating_duration_since(healed)),
        secs(last.at.saturating_duration_since(cut)),
        c.peer_state("n1", 0)
    );
    Ok(())
}

#[test]
fn a_five_second_blip_of_the_rendezvous_host_restarts_nothing() {
    let test = "a_five_second_blip_of_the_rendezvous_host_restarts_nothing";
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    if let Err(e) = blip(Duration::from_secs(5)) {
        panic!("{test}: {e}");
    }
}

/// The longest blip issue 13 names: 10 s of the rendezvous host, still no
/// container exit and no worker restart (a fixed world confirms a loss by
/// outage only after 30 s).
#[test]
fn a_ten_second_blip_of_the_rendezvous_host_restarts_nothing() {
    let test = "a_ten_second_blip_of_the_rendezvous_host_restarts_nothing";
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    if let Err(e) = blip(Duration::from_secs(10)) {
        panic!("{test}: {e}");
    }
}

/// Issue 13's goal for an elastic world: training goes on with the survivors
/// within 10 s of the cut. The test's bound is wider (a loaded 2-core CI
/// machine starts Python processes slowly); the figure is printed.
const ELASTIC_GOAL: Duration = Duration::from_secs(10);
const ELASTIC_BOUND: Duration = Duration::from_secs(30);

/// An elastic world (`2:3`, three nodes) loses node 2 (not the rendezvous
/// host) for good: the survivors' sidecars confirm the loss after
/// `TRAINWIRE_CONFIRM_AFTER` (3 s for an elastic non-host peer: the
/// rendezvous keep-alive window) and restart
/// their workers; torchrun re-rendezvous with two nodes (`last_call_timeout`
/// as the webhook injects it) and training goes on from the checkpoint of the
/// cut without any container exit. Then a replacement node 2 joins and the
/// world grows back to three.
fn elastic(responder: Responder) -> Result<String, String> {
    let mut c = Cluster::new(responder)?;
    c.nnodes = "2:3".to_string();
    let cold = Instant::now();
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.start_node("n2", 2, Network::addr(12), true)?;
    let world3 = c.wait("a step of the 3-node world", |l| {
        is_event(l, "step").is_some_and(|e| e.num("world_size") == Some(3))
    })?;
    let cold_start = world3.at.duration_since(cold);
    let mark = c.log.mark();
    c.log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "checkpoint").is_some_and(|e| e.num("step").is_some())
        })
        .ok_or_else(|| format!("no checkpoint in the 3-node world\n{}", c.log.tail(200)))?;
    let exits: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    let mark = c.log.mark();
    let cut = c.lose("n2")?;
    let at_cut = c.latest_step().ok_or("no checkpoint at the cut")?;
    c.note(format!("latest checkpoint at the cut: step {at_cut}"));
    let window = if responder == Responder::Nobody {
        Duration::from_secs(60)
    } else {
        WAIT
    };
    let shrunk = c.log.wait_for_after(mark, window, |l| {
        is_event(l, "step").is_some_and(|e| e.num("world_size") == Some(2))
    });
    let Some(shrunk) = shrunk else {
        if responder == Responder::Nobody {
            return Ok(format!(
                "ELASTIC responder={responder:?} cut_to_world2_step_s=never(>{}s) cold_start_s={}",
                window.as_secs(),
                secs(cold_start)
            ));
        }
        return Err(format!(
            "the survivors did not go on with 2 nodes within {window:?}\n{}",
            c.log.tail(250)
        ));
    };
    let cut_to_shrunk = shrunk.at.duration_since(cut);
    let ev = TrainEvent::parse(&shrunk.text).ok_or("unparsable step line")?;
    if ev.num("resumed_from") != Some(at_cut) {
        return Err(format!(
            "the 2-node world resumed from {:?}, the checkpoint at the cut was {at_cut}\n{}",
            ev.num("resumed_from"),
            c.log.tail(250)
        ));
    }
    let survivors_exits: Vec<usize> = c.trainers[..2].iter().map(|t| t.kubelet.exits()).collect();
    if survivors_exits != exits[..2] {
        return Err(format!(
            "a survivor's trainer container exited during the shrink: {:?} -> {survivors_exits:?}\n{}",
            &exits[..2],
            c.log.tail(250)
        ));
    }
    if responder == Responder::Sidecar && cut_to_shrunk > ELASTIC_BOUND {
        return Err(format!(
            "the 2-node world stepped {cut_to_shrunk:?} after the cut (bound {ELASTIC_BOUND:?})\n{}",
            c.log.tail(250)
        ));
    }
    // Grow back: a replacement node 2 with a new address.
    let mark = c.log.mark();
    let replaced = Instant::now();
    c.start_node("n2b", 2, Network::addr(22), true)?;
    c.note("started the replacement n2b as node-2".to_string());
    let grown = c
        .log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "step").is_some_and(|e| e.num("world_size") == Some(3))
        })
        .ok_or_else(|| {
            format!(
                "the world did not grow back to 3 nodes within {WAIT:?}\n{}",
                c.log.tail(250)
            )
        })?;
    let survivors_exits: Vec<usize> = c.trainers[..2].iter().map(|t| t.kubelet.exits()).collect();
    if std::env::var_os("TRAINWIRE_E2E_DUMP").is_some() {
        eprintln!("{}", c.log.tail(100_000));
    }
    Ok(format!(
        "ELASTIC responder={responder:?} resumed_from={at_cut} cut_to_world2_step_s={} goal_s={} replacement_to_world3_step_s={} survivor_container_exits={} cold_start_s={}",
        secs(cut_to_shrunk),
        ELASTIC_GOAL.as_secs(),
        secs(grown.at.duration_since(replaced)),
        survivors_exits
            .iter()
            .zip(&exits)
            .map(|(now, before)| now - before)
            .sum::<usize>(),
        secs(cold_start),
    ))
}

#[test]
fn an_elastic_world_shrinks_after_losing_a_node_and_grows_back() {
    let test = "an_elastic_world_shrinks_after_losing_a_node_and_grows_back";
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    match elastic(responder()) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// A FUSE passthrough mount served by `tests/scripts/fuse_passthrough.py`
/// (Debian's python3-fusepy). Dropping it lets the daemon go on (SIGCONT),
/// unmounts (lazily) and stops the daemon.
struct FuseMount {
    daemon: Proc,
    mountpoint: TempDir,
}

impl FuseMount {
    fn serve(root: &std::path::Path, tag: &Tag, log: &Log) -> Result<FuseMount, String> {
        let mountpoint = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let script = trainwire_tests::repo_root().join("tests/scripts/fuse_passthrough.py");
        // The system interpreter: python3-fusepy is a Debian package.
        let python = if std::path::Path::new("/usr/bin/python3").exists() {
            "/usr/bin/python3".to_string()
        } else {
            torch::python()
        };
        let mut cmd = Command::new(python);
        cmd.arg(&script).arg(root).arg(mountpoint.path());
        let daemon = Proc::spawn_as(&mut cmd, tag.value(), log, "fuse| ")
            .map_err(|e| format!("start {}: {e}", script.display()))?;
        let m = FuseMount { daemon, mountpoint };
        let path = m.mountpoint.path().to_string_lossy().into_owned();
        for _ in 0..100 {
            let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
            if mounts
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(path.as_str()))
            {
                return Ok(m);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the FUSE mount at {path} did not appear within 10 s\n{}",
            log.tail(50)
        ))
    }

    fn path(&self) -> PathBuf {
        self.mountpoint.path().to_path_buf()
    }

    fn signal(&self, sig: Signal) {
        signal_all(&[self.daemon.pid()], sig);
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = Command::new("fusermount")
            .args(["-u", "-z"])
            .arg(self.mountpoint.path())
            .status();
        self.daemon.kill_tree();
    }
}

/// Why a FUSE mount cannot be made here, if it cannot.
fn fuse_unavailable() -> Option<String> {
    if !std::path::Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".to_string());
    }
    if Command::new("fusermount")
        .arg("-V")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return Some("fusermount is missing (apt-get install fuse3)".to_string());
    }
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import fusepy"])
        .output()
        .is_ok_and(|o| o.status.success())
        || Command::new(torch::python())
            .args(["-c", "import fuse"])
            .output()
            .is_ok_and(|o| o.status.success());
    (!ok).then(|| "fusepy is not importable (apt-get install python3-fusepy)".to_string())
}

/// Skip (or, under `CI=true`, fail) when FUSE is missing.
fn require_fuse(test: &str) -> bool {
    trainwire_tests::require(
        test,
        trainwire_tests::Prerequisite::from_missing(fuse_unavailable()),
    )
}

/// How long the checkpoint volume hangs.
const HUNG_FOR: Duration = Duration::from_secs(20);

/// The checkpoint directory is a FUSE mount whose daemon is SIGSTOPped while
/// training runs (a volume that stops answering, as an NFS server can): the
/// sidecars' heartbeats keep flowing (no peer is ever suspect or lost), the
/// checkpoint state turns unknown, and after SIGCONT everything is back to
/// normal, with no container exit and no worker restart.
fn hung_volume() -> Result<String, String> {
    let mut c = Cluster::new(Responder::Sidecar)?;
    let fuse = FuseMount::serve(c.ckpt.path(), &c.tag, &c.log)?;
    c.ckpt_dir = Some(fuse.path());
    // Poll every 2 s (10 s by default), so the hang is met within the window:
    // unknown after at most poll interval + SCAN_TIMEOUT (10 s).
    c.sidecar_env
        .push((tw::CHECKPOINT_POLL_INTERVAL.to_string(), "2s".to_string()));
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    let exits: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    let mark = c.log.mark();
    fuse.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    c.note("SIGSTOPped the checkpoint volume's FUSE daemon".to_string());
    let problem = |s: &serde_json::Value| s["checkpoint"]["problem"].as_str().map(str::to_string);
    let mut unknown_after = None;
    let mut polls = 0u32;
    while stopped.elapsed() < HUNG_FOR {
        for (label, peer) in [("n0", 1), ("n1", 0)] {
            let s = c.status(label).ok_or_else(|| {
                format!(
                    "the sidecar on {label} did not answer /status while the volume hangs\n{}",
                    c.log.tail(200)
                )
            })?;
            let state = s["peers"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["rank"].as_u64() == Some(peer)))
                .and_then(|p| p["state"].as_str())
                .unwrap_or("?")
                .to_string();
            if state != "healthy" {
                return Err(format!(
                    "the sidecar on {label} sees rank {peer} {state} while only the volume hangs\n{}",
                    c.log.tail(200)
                ));
            }
            if label == "n0"
                && unknown_after.is_none()
                && problem(&s).is_some_and(|p| p.starts_with("unknown"))
            {
                unknown_after = Some(stopped.elapsed());
            }
        }
        polls += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let unknown_after = unknown_after.ok_or_else(|| {
        format!(
            "the checkpoint state did not turn unknown within {HUNG_FOR:?} of the hang\n{}",
            c.log.tail(200)
        )
    })?;
    fuse.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    c.note("SIGCONTed the FUSE daemon".to_string());
    let mut normal_after = None;
    for _ in 0..150 {
        if c.status("n0").is_some_and(|s| problem(&s).is_none()) {
            normal_after = Some(resumed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let normal_after = normal_after.ok_or_else(|| {
        format!(
            "the checkpoint state stayed unknown 30 s after the volume came back\n{}",
            c.log.tail(200)
        )
    })?;
    let after = c.log.mark();
    c.log
        .wait_for_after(after, Duration::from_secs(60), |l| {
            is_event(l, "checkpoint").is_some()
        })
        .ok_or_else(|| {
            format!(
                "no checkpoint after the volume came back\n{}",
                c.log.tail(200)
            )
        })?;
    let now: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    if now != exits {
        return Err(format!(
            "container exits while the volume hung: {exits:?} -> {now:?}\n{}",
            c.log.tail(200)
        ));
    }
    if let Some(l) = c.log.wait_for_after(mark, Duration::from_millis(10), |l| {
        is_event(l, "start").is_some()
            || l.contains("peer loss confirmed")
            || l.contains("peer lost")
    }) {
        return Err(format!(
            "a worker restart or a peer loss while only the volume hung: {}\n{}",
            l.text,
            c.log.tail(200)
        ));
    }
    Ok(format!(
        "HUNG_VOLUME hung_s={} unknown_after_s={} back_to_normal_after_s={} status_polls={polls} peer_losses=0 container_exits=0 worker_restarts=0",
        secs(HUNG_FOR),
        secs(unknown_after),
        secs(normal_after)
    ))
}

#[test]
fn a_hung_checkpoint_volume_loses_no_peer() {
    let test = "a_hung_checkpoint_volume_loses_no_peer";
    if !torch::require_torch(test) || !netns::require_netns(test) || !require_fuse(test) {
        return;
    }
    match hung_volume() {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// How long the latency lasts.
const SLOW_FOR: Duration = Duration::from_secs(30);

/// `one_way` of added latency on every frame to and from the rendezvous
/// host for 30 s (a userspace delaying forwarder): training slows down and
/// goes on; nothing restarts, no container exits, no peer loss is confirmed.
fn latency(one_way: Duration) -> Result<String, String> {
    let mut c = Cluster::new(responder())?;
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    let exits: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    let node = c.trainer("n0").map(|t| t.node.clone()).ok_or("no n0")?;
    let mark = c.log.mark();
    let slow = c.net.delay(&node, one_way)?;
    let started = Instant::now();
    c.note(format!("{one_way:?} one way on n0's link for {SLOW_FOR:?}"));
    let mut worst = "healthy".to_string();
    while started.elapsed() < SLOW_FOR {
        if c.responder == Responder::Sidecar
            && let Some(s) = c.peer_state("n1", 0)
            && s != "healthy"
        {
            worst = s;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let steps_slow = c
        .log
        .lines()
        .iter()
        .skip(mark)
        .filter(|l| is_event(&l.text, "step").is_some())
        .count();
    drop(slow);
    c.note("n0's link is fast again".to_string());
    let healed = Instant::now();
    let after = c.log.mark();
    let next = c
        .log
        .wait_for_after(after, Duration::from_secs(60), |l| {
            is_event(l, "step").is_some()
        })
        .ok_or_else(|| format!("no step after the latency\n{}", c.log.tail(200)))?;
    std::thread::sleep(Duration::from_secs(8));
    let now: Vec<usize> = c.trainers.iter().map(|t| t.kubelet.exits()).collect();
    if now != exits {
        return Err(format!(
            "container exits under {one_way:?} of latency: {exits:?} -> {now:?}\n{}",
            c.log.tail(200)
        ));
    }
    if let Some(l) = c.log.wait_for_after(mark, Duration::from_millis(10), |l| {
        is_event(l, "start").is_some() || l.contains("peer loss confirmed")
    }) {
        return Err(format!(
            "a worker restart or a confirmed peer loss under latency: {}\n{}",
            l.text,
            c.log.tail(200)
        ));
    }
    Ok(format!(
        "LATENCY responder={:?} one_way_ms={} for_s={} steps_during={steps_slow} heal_to_step_s={} container_exits=0 worker_restarts=0 survivor_worst_view={worst}",
        c.responder,
        one_way.as_millis(),
        SLOW_FOR.as_secs(),
        secs(next.at.saturating_duration_since(healed)),
    ))
}

#[test]
fn latency_on_the_rendezvous_host_restarts_nothing() {
    let test = "latency_on_the_rendezvous_host_restarts_nothing";
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    let ms = std::env::var("TRAINWIRE_E2E_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(800);
    match latency(Duration::from_millis(ms)) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// The stall timeout of the hung-world test: short, so the test is; the
/// goals are this plus 5 s to find the stall and plus 15 s to train again.
const STALL_TIMEOUT: Duration = Duration::from_secs(20);

/// A hung world: one worker of node `label` is stopped (SIGSTOP) while the
/// world trains; every process stays alive, every heartbeat answers. The
/// sidecars must find the stall (no collective traffic on any rank for
/// the stall timeout) within the timeout plus 5 s, restart the workers,
/// and training must step again from the newest checkpoint within the
/// timeout plus 15 s, with the stall shown in `/status`.
fn stalled(label: &str, warm: bool) -> Result<String, String> {
    let mut c = Cluster::new(Responder::Sidecar)?;
    if warm {
        c.warm_workers()?;
    }
    c.sidecar_env = vec![
        (
            tw::STALL_TIMEOUT.to_string(),
            format!("{}s", STALL_TIMEOUT.as_secs()),
        ),
        (tw::ON_STALL.to_string(), "restart-workers".to_string()),
    ];
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    let agent = c
        .trainer(label)
        .and_then(|t| t.kubelet.pid())
        .ok_or_else(|| format!("no agent on {label}"))?;
    let parent = |p: i32| trainwire_tests::process::stat(p).map(|(_, ppid)| ppid);
    let forkserver = |p: i32| {
        parent(p) == Some(agent)
            && std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("multiprocessing.forkserver"))
    };
    // A worker: the agent's child, or with warm workers the child of the
    // agent's forkserver (their parent is not the agent).
    let worker = descendants(agent)
        .into_iter()
        .find(|&p| match parent(p) {
            Some(pp) if warm => pp != agent && forkserver(pp),
            Some(pp) => pp == agent,
            None => false,
        })
        .ok_or_else(|| format!("no worker under the agent {agent} on {label}"))?;
    let mark = c.log.mark();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(worker), Signal::SIGSTOP)
        .map_err(|e| format!("SIGSTOP {worker}: {e}"))?;
    let stopped = Instant::now();
    let at_stop = c.latest_step().ok_or("no checkpoint at the stop")?;
    c.note(format!(
        "stopped worker {worker} of {label} (latest checkpoint: step {at_stop})"
    ));

    // Found: a sidecar's /status shows the stall.
    let find_by = STALL_TIMEOUT + Duration::from_secs(5);
    let mut found = None;
    while stopped.elapsed() < find_by + Duration::from_secs(30) && found.is_none() {
        for node in ["n0", "n1"] {
            if let Some(status) = c.status(node)
                && status["progress"]["last_stall"].is_object()
            {
                found = Some((stopped.elapsed(), node, status["progress"].clone()));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (found_after, by, progress) = found.ok_or_else(|| {
        format!(
            "no sidecar found the stall within {:?}\n{}",
            find_by + Duration::from_secs(30),
            c.log.tail(200)
        )
    })?;
    c.note(format!(
        "{by}'s sidecar found the stall after {found_after:?}: {progress}"
    ));
    let stall = &progress["last_stall"];
    if stall["action"] != "restart-workers" || stall["result"] != "signalled" {
        return Err(format!(
            "the stall was not acted on: {stall}\n{}",
            c.log.tail(200)
        ));
    }
    if by == label && progress["stuck"].as_array().is_none_or(|s| s.is_empty()) {
        // Shown in the record as well once it was judged.
        let stuck_shown = stall["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["stuck"].as_array().is_some_and(|s| !s.is_empty()));
        if !stuck_shown {
            return Err(format!("the stopped worker is not shown: {progress}"));
        }
    }
    // Training again, from the newest checkpoint.
    let resumed = c
        .log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "step").is_some_and(|e| e.num("resumed_from").is_some())
        })
        .ok_or_else(|| format!("training did not resume\n{}", c.log.tail(250)))?;
    let resumed_after = resumed.at.duration_since(stopped);
    let ev = TrainEvent::parse(&resumed.text).ok_or("unparsable step line")?;
    let from = ev.num("resumed_from").ok_or("no resumed_from")?;
    if from < at_stop {
        return Err(format!(
            "resumed from step {from}, the newest checkpoint at the stop was {at_stop}"
        ));
    }
    let line = format!(
        "STALL stopped={label} warm={warm} stall_timeout_s={} found_s={} by={by} resumed_s={} resumed_from={from} checkpoint_at_stop={at_stop}",
        STALL_TIMEOUT.as_secs(),
        secs(found_after),
        secs(resumed_after)
    );
    // The world status: the stall, with the rank whose worker was stopped,
    // from the sidecars' records on their pods.
    let api = c.api.as_ref().ok_or("no apiserver")?;
    let mut controller = WorldController::new(&api.sts, NAMESPACE)?;
    let rank = if label == "n0" { 0 } else { 1 };
    let named = format!("rank {rank} worker {worker} stopped");
    let deadline = Instant::now() + Duration::from_secs(10);
    let world = loop {
        let status = controller.observe(&api.server)?;
        if status
            .last_stall
            .as_ref()
            .is_some_and(|s| s.ranks.contains(&named))
            || Instant::now() > deadline
        {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    match &world.last_stall {
        Some(s) if s.ranks.contains(&named) && s.action == "restart-workers" => {
            c.note(format!("world status lastStall: {s:?}"));
        }
        other => {
            return Err(format!(
                "the world status' lastStall does not name {named}: {other:?}\n{}",
                c.log.tail(100)
            ));
        }
    }
    if found_after > find_by {
        return Err(format!(
            "{line}: found later than {find_by:?}\n{}",
            c.log.tail(200)
        ));
    }
    let resume_by = STALL_TIMEOUT + Duration::from_secs(15);
    if resumed_after > resume_by {
        return Err(format!(
            "{line}: resumed later than {resume_by:?}\n{}",
            c.log.tail(250)
        ));
    }
    Ok(line)
}

fn run_stalled(test: &str, label: &str, warm: bool) {
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    match stalled(label, warm) {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn a_stopped_worker_on_the_rendezvous_host_is_found_and_the_world_resumes() {
    run_stalled(
        "a_stopped_worker_on_the_rendezvous_host_is_found_and_the_world_resumes",
        "n0",
        false,
    );
}

#[test]
fn a_stopped_worker_on_another_node_is_found_and_the_world_resumes() {
    run_stalled(
        "a_stopped_worker_on_another_node_is_found_and_the_world_resumes",
        "n1",
        false,
    );
}

/// The same with warm workers: the stopped worker is a child of the
/// agent's forkserver, which the sidecars' progress scan follows.
#[test]
fn a_stopped_forkserver_worker_is_found_and_the_world_resumes() {
    run_stalled(
        "a_stopped_forkserver_worker_is_found_and_the_world_resumes",
        "n1",
        true,
    );
}

/// How long the quiet phases of the no-false-stall test last: most of the
/// stall timeout (the scans see a phase up to one scan interval longer).
const QUIET_FOR: Duration = Duration::from_secs(15);

/// The quiet phases and the stall timeout of the no-false-stall test:
/// 15 s and 20 s; with `TRAINWIRE_LONG_QUIET_SECONDS=90`, phases of 90 s
/// and a timeout 30 s longer (issue 40's long-save run: 90 s of quiet,
/// 120 s of timeout; about 4 minutes, not in `.ci/run`).
fn quiet_and_timeout() -> (Duration, Duration) {
    match std::env::var("TRAINWIRE_LONG_QUIET_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| (1..=600).contains(s))
    {
        Some(quiet) => (Duration::from_secs(quiet), Duration::from_secs(quiet + 30)),
        None => (QUIET_FOR, STALL_TIMEOUT),
    }
}

/// No false stall: rank 0 spends most of the stall timeout without any
/// collective (an evaluation on one rank, a long save) every 40 steps while
/// the other rank waits in its all-reduce; over two such phases no sidecar
/// declares a stall, and training goes on.
fn quiet_phases() -> Result<String, String> {
    let (quiet_for, stall_timeout) = quiet_and_timeout();
    let mut c = Cluster::new(Responder::Sidecar)?;
    c.sidecar_env = vec![(
        tw::STALL_TIMEOUT.to_string(),
        format!("{}s", stall_timeout.as_secs()),
    )];
    c.trainer_env = vec![
        ("TRAIN_QUIET_EVERY".to_string(), "40".to_string()),
        (
            "TRAIN_QUIET_FOR".to_string(),
            quiet_for.as_secs().to_string(),
        ),
    ];
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    let mut phases = 0;
    let mut longest = Duration::ZERO;
    for at in [40u64, 80] {
        let quiet = c.wait(&format!("the quiet phase at step {at}"), |l| {
            is_event(l, "quiet").is_some_and(|e| e.num("step") == Some(at))
        })?;
        let after = c.wait(&format!("the step after the quiet phase at {at}"), |l| {
            is_event(l, "step").is_some_and(|e| e.num("step") > Some(at))
        })?;
        longest = longest.max(after.at.duration_since(quiet.at));
        phases += 1;
    }
    for node in ["n0", "n1"] {
        let status = c
            .status(node)
            .ok_or_else(|| format!("no /status from {node}"))?;
        let progress = &status["progress"];
        if progress["stalls_total"] != 0 || !progress["last_stall"].is_null() {
            return Err(format!(
                "{node} declared a stall in a world that trains: {progress}\n{}",
                c.log.tail(200)
            ));
        }
    }
    if c.trainers.iter().any(|t| t.kubelet.exits() > 0) {
        return Err(format!("a trainer exited\n{}", c.log.tail(200)));
    }
    Ok(format!(
        "NO-FALSE-STALL stall_timeout_s={} quiet_for_s={} quiet_phases={phases} longest_gap_s={} stalls=0",
        stall_timeout.as_secs(),
        quiet_for.as_secs(),
        secs(longest)
    ))
}

#[test]
fn quiet_phases_shorter_than_the_stall_timeout_are_no_stall() {
    let test = "quiet_phases_shorter_than_the_stall_timeout_are_no_stall";
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    match quiet_phases() {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// How long the checkpoint volume hangs in the hung-volume stall test:
/// past the stall timeout, so that the stall is found while it hangs.
const VOLUME_HUNG_FOR: Duration = Duration::from_secs(30);

/// A hung world from a hung volume: the checkpoint directory is a FUSE
/// mount whose daemon stops answering (as an NFS server can) for longer
/// than the stall timeout. Rank 0's worker blocks in its next checkpoint
/// write, the other rank waits in its all-reduce: the stall is found within
/// the timeout plus 5 s (with the blocked worker killed after its SIGTERM),
/// and once the volume answers again training steps from the newest
/// checkpoint within 15 s.
fn hung_volume_stall() -> Result<String, String> {
    let mut c = Cluster::new(Responder::Sidecar)?;
    let fuse = FuseMount::serve(c.ckpt.path(), &c.tag, &c.log)?;
    c.ckpt_dir = Some(fuse.path());
    c.sidecar_env = vec![(
        tw::STALL_TIMEOUT.to_string(),
        format!("{}s", STALL_TIMEOUT.as_secs()),
    )];
    c.start_node("n0", 0, Network::addr(10), true)?;
    c.start_node("n1", 1, Network::addr(11), true)?;
    c.wait("the third checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(3 * CHECKPOINT_INTERVAL))
    })?;
    let mark = c.log.mark();
    fuse.signal(Signal::SIGSTOP);
    let hung = Instant::now();
    let at_hang = c.latest_step().ok_or("no checkpoint at the hang")?;
    c.note(format!(
        "SIGSTOPped the checkpoint volume's FUSE daemon (latest checkpoint: step {at_hang})"
    ));
    let mut found = None;
    while hung.elapsed() < VOLUME_HUNG_FOR && found.is_none() {
        for node in ["n0", "n1"] {
            if let Some(status) = c.status(node)
                && status["progress"]["last_stall"].is_object()
            {
                found = Some((hung.elapsed(), node, status["progress"].clone()));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (found_after, by, progress) = found.ok_or_else(|| {
        format!(
            "no sidecar found the stall while the volume hung {VOLUME_HUNG_FOR:?}\n{}",
            c.log.tail(200)
        )
    })?;
    c.note(format!(
        "{by}'s sidecar found the stall after {found_after:?}: {progress}"
    ));
    std::thread::sleep(VOLUME_HUNG_FOR.saturating_sub(hung.elapsed()));
    fuse.signal(Signal::SIGCONT);
    let back = Instant::now();
    c.note("SIGCONTed the FUSE daemon".to_string());
    let resumed = c
        .log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "step").is_some_and(|e| e.num("resumed_from").is_some())
        })
        .ok_or_else(|| format!("training did not resume\n{}", c.log.tail(250)))?;
    let ev = TrainEvent::parse(&resumed.text).ok_or("unparsable step line")?;
    let from = ev.num("resumed_from").ok_or("no resumed_from")?;
    let resumed_after = resumed.at.saturating_duration_since(back);
    let line = format!(
        "STALL-HUNG-VOLUME stall_timeout_s={} hung_s={} found_s={} by={by} resumed_after_volume_back_s={} resumed_from={from} checkpoint_at_hang={at_hang}",
        STALL_TIMEOUT.as_secs(),
        VOLUME_HUNG_FOR.as_secs(),
        secs(found_after),
        secs(resumed_after)
    );
    if found_after > STALL_TIMEOUT + Duration::from_secs(5) {
        return Err(format!("{line}: found late\n{}", c.log.tail(200)));
    }
    if resumed_after > Duration::from_secs(15) || from < at_hang {
        return Err(format!("{line}\n{}", c.log.tail(250)));
    }
    Ok(line)
}

#[test]
fn a_world_hung_on_its_checkpoint_volume_is_found_and_resumes_once_it_answers() {
    let test = "a_world_hung_on_its_checkpoint_volume_is_found_and_resumes_once_it_answers";
    if !torch::require_torch(test) || !netns::require_netns(test) || !require_fuse(test) {
        return;
    }
    match hung_volume_stall() {
        Ok(line) => println!("{line}"),
        Err(e) => panic!("{test}: {e}"),
    }
}
