//! No node is special: a world of 2 with one hot spare and a dedicated
//! rendezvous store, end to end with a real torchrun. Everything the pods
//! run comes from the real `trainwire-webhook inject` output for a
//! StatefulSet annotated `trainwire.dev/nnodes: "2"`, `trainwire.dev/spares:
//! "1"`, `trainwire.dev/rdzv-store: dedicated`: the trainers' and sidecars'
//! env, and the store's command (torch's own `TCPStore`) from the rendered
//! Deployment. Each pod and the store are network namespaces on a bridge;
//! the store's Service name resolves to the store's namespace.
//!
//! - Pods 0 and 1 form the world; pod 2 starts after them and waits as a
//!   spare (torchrun's redundancy list) without interrupting a step.
//! - A training pod is cut off silently (switch port down, processes
//!   frozen: a node that lost power), pod 1 in one test and pod 0 in the
//!   other: training resumes from the checkpoint of the cut with world 2
//!   (the survivor and the spare), with no replacement started, no container
//!   exit on any survivor and no `max_restarts` spent.
//! - The replacement of the lost pod (same name, new address) then joins as
//!   the next spare, without interrupting training.
//! - The store is killed and started again (a Deployment's new pod): the
//!   agents fail, their containers restart, and the world resumes by itself.
//!
//! - The world controller's view, computed by the engine's `observe` from
//!   the pods as a fake apiserver (reached from the pods' network) holds
//!   them with the sidecars' real records patched in: the loss is recorded
//!   from the survivors' reports, and `resumedAt` lies within 2 s of the
//!   first training step after the cut, never before the loss.
//!
//! Each run prints one `SPARES ...` line with the measured times
//! (docs/benchmarks.md, "Hot spares and a dedicated store end to end").
//! Skips with a clear message when PyTorch is missing, when not root, or
//! when `ip netns` does not work (fails under `CI=true`).

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::Signal;
use serde_json::Value;
use tempfile::TempDir;
use trainwire_sidecar::env as tw;
use trainwire_tests::apiserver::{self, FakeApiServer};
use trainwire_tests::kubelet::Kubelet;
use trainwire_tests::netns::{self, Network, Node};
use trainwire_tests::process::{Log, Proc, Tag, descendants, signal_all, unique_name};
use trainwire_tests::rendered::{self, Entry, resolve};
use trainwire_tests::torch::{self, TrainEvent};
use trainwire_tests::world_status::{WorldController, api_in, check_resumed, wall};

/// Bound of every wait (imports and rendezvous are slow on a busy 2-core machine).
const WAIT: Duration = Duration::from_secs(180);
const CHECKPOINT_INTERVAL: u64 = 5;
/// How long a joining spare is watched for a training interruption.
const JOIN_WINDOW: Duration = Duration::from_secs(20);
/// The pods are `node-<i>` of a StatefulSet `node` under the headless
/// Service `train` in namespace `e2e`.
const SET: &str = "node";
const SERVICE: &str = "train";
const NAMESPACE: &str = "e2e";

fn manifest() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {SET}
  namespace: {NAMESPACE}
  annotations:
    trainwire.dev/inject: "true"
    trainwire.dev/nnodes: "2"
    trainwire.dev/spares: "1"
    trainwire.dev/rdzv-store: dedicated
    trainwire.dev/checkpoint-pvc: ckpt
spec:
  serviceName: {SERVICE}
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: llm}}
  template:
    metadata:
      labels: {{app: llm}}
    spec:
      containers:
      - name: trainer
        image: pytorch
        command: ["torchrun", "/app/train.py"]
"#
    )
}

/// What the real CLI rendered: the pods' env, the store's command and env,
/// and the store's name and port from the trainers' endpoint.
struct Rendered {
    /// The injected StatefulSet.
    sts: Value,
    trainer: Vec<(String, Entry)>,
    sidecar: Vec<(String, Entry)>,
    store_command: Vec<String>,
    store_env: Vec<(String, String)>,
    store_host: String,
}

fn render() -> Result<Rendered, String> {
    let objects = rendered::inject(&manifest())?;
    let sts = rendered::find(&objects, "StatefulSet", SET)?;
    let spec = &sts["spec"]["template"]["spec"];
    let trainer = rendered::entries(&spec["containers"][0]);
    let store = rendered::find(&objects, "Deployment", &format!("{SET}-rdzv"))?;
    rendered::find(&objects, "Service", &format!("{SET}-rdzv"))?;
    let container = &store["spec"]["template"]["spec"]["containers"][0];
    let store_command: Vec<String> = container["command"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let store_env = resolve(&rendered::entries(container), &Default::default())?;
    let endpoint = trainer
        .iter()
        .find_map(|(k, e)| match e {
            Entry::Value(v) if k == "PET_RDZV_ENDPOINT" => Some(v.clone()),
            _ => None,
        })
        .ok_or("the rendered trainer has no PET_RDZV_ENDPOINT")?;
    let (store_host, _) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| format!("PET_RDZV_ENDPOINT {endpoint} has no port"))?;
    Ok(Rendered {
        sts: sts.clone(),
        // By name: the rendezvous handler's installer runs before it.
        sidecar: rendered::entries(
            spec["initContainers"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["name"] == "trainwire-sidecar"))
                .ok_or("no trainwire-sidecar init container")?,
        ),
        trainer,
        store_command,
        store_env,
        store_host: store_host.to_string(),
    })
}

struct Pod {
    label: String,
    node: Node,
    kubelet: Kubelet,
    _sidecar: Proc,
}

/// Fields drop in order: pods and the store first, then every tagged
/// process, then the namespaces, then the checkpoint directory.
struct World {
    pods: Vec<Pod>,
    store: Option<Kubelet>,
    tag: Tag,
    net: Network,
    ckpt: TempDir,
    log: Log,
    run: String,
    rendered: Rendered,
    sidecar_bin: std::path::PathBuf,
    /// A `sitecustomize.py` for the trainers: the rendezvous' own debug
    /// lines about membership (who joins the participants, the wait list,
    /// the redundancy list) on stderr, which torch sends nowhere.
    site: TempDir,
    /// trainwire's rendezvous handler as the sidecar installs it
    /// (`python/`), and each pod's channel directory (`<label>/`): the
    /// rendered trainer runs on it (`PET_RDZV_BACKEND=trainwire-c10d`).
    handler: TempDir,
    /// The pods as an apiserver holds them, with the sidecars' records
    /// patched in (it listens in its own namespace on the bridge).
    api: FakeApiServer,
    kubeconfig: std::path::PathBuf,
    /// Serves `api`; last, so that it stops after the sidecars.
    _runtime: tokio::runtime::Runtime,
}

const SITECUSTOMIZE: &str = r#"import logging, sys
class _Membership(logging.Filter):
    def filter(self, record):
        m = record.getMessage()
        return "redundancy list" in m or "participants" in m or "wait list" in m
_h = logging.StreamHandler(sys.stderr)
_h.setFormatter(logging.Formatter("[rdzv] %(message)s"))
_h.addFilter(_Membership())
_l = logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous")
_l.setLevel(logging.DEBUG)
_l.addHandler(_h)
"#;

impl World {
    fn new() -> Result<World, String> {
        let mut net = Network::create("tws")?;
        let host0 = pod_host(0);
        let domain = host0
            .strip_prefix(&format!("{SET}-0."))
            .ok_or_else(|| format!("pod 0's name {host0} is not {SET}-0.<domain>"))?;
        net.set_domain(domain);
        let (api, runtime) = api_in(&mut net, 60)?;
        let site = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        std::fs::write(site.path().join("sitecustomize.py"), SITECUSTOMIZE)
            .map_err(|e| format!("write sitecustomize.py: {e}"))?;
        let kubeconfig = api
            .kubeconfig(site.path(), NAMESPACE)
            .map_err(|e| format!("kubeconfig: {e}"))?;
        let sidecar_bin = trainwire_tests::sidecar_binary()?;
        let handler = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let installed = Command::new(&sidecar_bin)
            .arg("install-rendezvous-handler")
            .arg(handler.path().join("python"))
            .arg("--channel")
            .arg(handler.path().join("channel"))
            .status()
            .map_err(|e| format!("install-rendezvous-handler: {e}"))?;
        if !installed.success() {
            return Err(format!("install-rendezvous-handler: {installed}"));
        }
        Ok(World {
            pods: Vec::new(),
            store: None,
            tag: Tag::new("twsp"),
            net,
            ckpt: tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?,
            log: Log::new("spares-e2e"),
            run: unique_name("run"),
            rendered: render()?,
            sidecar_bin,
            site,
            handler,
            api,
            kubeconfig,
            _runtime: runtime,
        })
    }

    fn note(&self, text: String) {
        self.log.push(format!("harness| {text}"));
    }

    fn fail(&self, what: String) -> String {
        // The sidecars' last lines too: torch's debug lines fill the tail.
        let lines = self.log.lines();
        let sidecars: Vec<&str> = lines
            .iter()
            .map(|l| l.text.as_str())
            .filter(|l| l.contains("/sidecar| "))
            .collect();
        format!(
            "{what}\n{}\n--- the sidecars' last lines\n{}",
            self.log.tail(250),
            sidecars[sidecars.len().saturating_sub(40)..].join("\n")
        )
    }

    /// The store: its own namespace, the Service's name pointing at it, the
    /// rendered command under a "kubelet" (a Deployment's pod coming back).
    fn start_store(&mut self) -> Result<(), String> {
        let addr = Network::addr(50);
        let node = self.net.add_node_named("store", "store", addr, false)?;
        self.net.set_host(&self.rendered.store_host, addr)?;
        let program = self.net.command_args(&node, &torch::python());
        // The rendered command is `python3 -c SCRIPT`: the same script under
        // the interpreter that has torch.
        let args: Vec<String> = self
            .rendered
            .store_command
            .iter()
            .skip(1)
            .cloned()
            .collect();
        if args.first().map(String::as_str) != Some("-c") {
            return Err(format!(
                "the rendered store command is not `python3 -c SCRIPT`: {:?}",
                self.rendered.store_command
            ));
        }
        let env = self.rendered.store_env.clone();
        let make = move || {
            let mut cmd = Command::new("ip");
            cmd.args(&program)
                .args(&args)
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            cmd
        };
        self.store = Some(Kubelet::run(
            "store",
            self.tag.value(),
            &self.log,
            Duration::from_secs(1),
            make,
        ));
        self.wait("the store listening", |l| {
            l.starts_with("store| ") && l.contains("TCPStore listening")
        })?;
        Ok(())
    }

    /// Pod `index` (`label` names this incarnation): namespace, sidecar and
    /// trainer container under a kubelet, all from the rendered env.
    fn start_pod(&mut self, label: &str, index: u32, addr: Ipv4Addr) -> Result<(), String> {
        let hostname = format!("{SET}-{index}");
        let node = self.net.add_node_named(label, &hostname, addr, true)?;
        let uid = format!("{label}-{}", self.run);
        let fields = rendered::pod_fields(SET, index, NAMESPACE, &uid);
        // The pod object: Ready, with the template's annotations (the
        // injected `trainwire.dev/status`), replacing the one of its name.
        let mut object = apiserver::pod(&hostname, index, &uid, &addr.to_string(), true, 0);
        object["metadata"]["annotations"] =
            self.rendered.sts["spec"]["template"]["metadata"]["annotations"].clone();
        self.api.set_pod(object);
        let ckpt = self.ckpt.path().to_string_lossy().into_owned();
        // The pod's own emptyDir: the channel between its sidecar and its
        // trainer's rendezvous handler.
        let channel = self.handler.path().join(label);
        std::fs::create_dir_all(&channel).map_err(|e| format!("channel dir: {e}"))?;
        let channel = channel.to_string_lossy().into_owned();
        let at_ckpt = |(k, v): (String, String)| {
            if k == "CHECKPOINT_DIR" || k == tw::CHECKPOINT_DIR {
                (k, ckpt.clone())
            } else if k == tw::RENDEZVOUS_DIR {
                (k, channel.clone())
            } else {
                (k, v)
            }
        };
        // Every "pod" shares the host's PID namespace here: each sidecar
        // matches its own pod's agent by a token on its command line.
        let agent_token = format!("trainwire_agent={label}.{}", self.run);
        let mut sidecar_env: Vec<(String, String)> = resolve(&self.rendered.sidecar, &fields)?
            .into_iter()
            .map(at_ckpt)
            .filter(|(k, _)| k != tw::AGENT_MATCH)
            .collect();
        sidecar_env.extend(
            [
                (tw::AGENT_MATCH, agent_token.as_str()),
                (tw::DETECTION, "heartbeat"),
                (tw::BIND_ADDRESS, "0.0.0.0"),
                ("RUST_LOG", "info"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        // The heartbeats and the confirmation derive from the loss window
        // (1 s by default: a probe every 200 ms, suspect after 4 misses,
        // confirmed after 1 s), as injected. Other detection settings, to
        // measure what the handler does with them:
        // TRAINWIRE_E2E_LOSS_WINDOW, _HEARTBEAT_INTERVAL, _CONFIRM_AFTER.
        for (from, to) in [
            ("TRAINWIRE_E2E_LOSS_WINDOW", tw::LOSS_WINDOW),
            ("TRAINWIRE_E2E_HEARTBEAT_INTERVAL", tw::HEARTBEAT_INTERVAL),
            ("TRAINWIRE_E2E_CONFIRM_AFTER", tw::CONFIRM_AFTER),
        ] {
            if let Ok(v) = std::env::var(from) {
                sidecar_env.push((to.to_string(), v));
            }
        }
        // Its records go to the fake apiserver, as to a real one.
        sidecar_env.push((
            "KUBECONFIG".into(),
            self.kubeconfig.to_string_lossy().into_owned(),
        ));
        let mut cmd = self.net.command(&node, &self.sidecar_bin.to_string_lossy());
        cmd.envs(sidecar_env);
        let sidecar = Proc::spawn_as(
            &mut cmd,
            self.tag.value(),
            &self.log,
            &format!("{label}/sidecar| "),
        )
        .map_err(|e| format!("start the sidecar: {e}"))?;

        let mut env: Vec<(String, String)> = resolve(&self.rendered.trainer, &fields)?
            .into_iter()
            .map(at_ckpt)
            .filter(|(k, _)| k != "PYTHONPATH")
            .collect();
        env.extend(
            [
                ("GLOO_SOCKET_IFNAME", "eth0"),
                ("OMP_NUM_THREADS", "1"),
                ("PYTHONUNBUFFERED", "1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        env.push((
            "PYTHONPATH".into(),
            format!(
                "{}:{}",
                self.handler.path().join("python").display(),
                self.site.path().display()
            ),
        ));
        let program = self.net.command_args(&node, &torch::python());
        let make = move || torch::agent_command(&program, &agent_token, CHECKPOINT_INTERVAL, &env);
        let kubelet = Kubelet::run_backoff(
            &format!("{label}/trainer"),
            self.tag.value(),
            &self.log,
            Duration::from_secs(1),
            make,
        );
        self.pods.push(Pod {
            label: label.to_string(),
            node,
            kubelet,
            _sidecar: sidecar,
        });
        Ok(())
    }

    fn pod(&self, label: &str) -> Result<&Pod, String> {
        self.pods
            .iter()
            .find(|p| p.label == label)
            .ok_or_else(|| format!("no pod {label}"))
    }

    fn exits(&self, label: &str) -> usize {
        self.pod(label).map(|p| p.kubelet.exits()).unwrap_or(0)
    }

    fn wait(&self, what: &str, pred: impl Fn(&str) -> bool) -> Result<(), String> {
        self.log
            .wait_for(WAIT, pred)
            .map(|_| ())
            .ok_or_else(|| self.fail(format!("timed out after {WAIT:?} waiting for {what}")))
    }

    /// The sidecar `/status` of pod `label`.
    fn status(&self, label: &str) -> Option<Value> {
        let p = self.pod(label).ok()?;
        let port = self
            .rendered
            .sidecar
            .iter()
            .find_map(|(k, e)| match e {
                Entry::Value(v) if k == tw::HEALTH_PORT => v.parse().ok(),
                _ => None,
            })
            .unwrap_or(tw::DEFAULT_HEALTH_PORT);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let body = netns::http_get(&p.node.ns, addr, "/status").ok()?;
        serde_json::from_str(&body).ok()
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

    /// Cut pod `label` off and freeze all its processes (a node that lost power).
    fn lose(&self, label: &str) -> Result<Instant, String> {
        let p = self.pod(label)?;
        self.net.cut(&p.node)?;
        let at = Instant::now();
        self.net.freeze(&p.node);
        self.note(format!("cut off and froze {label} ({})", p.node.hostname));
        Ok(at)
    }

    /// Pod `label` joins as a spare: its agent enters the redundancy list
    /// and its sidecar says it waits, while no training pod restarts its
    /// workers and steps go on for [`JOIN_WINDOW`].
    fn joins_as_spare(&self, label: &str, training: &[&str]) -> Result<Duration, String> {
        let mark = self.log.mark();
        let started = Instant::now();
        let prefix = format!("{label}/trainer| ");
        self.log
            .wait_for_after(mark, WAIT, |l| {
                l.starts_with(&prefix) && l.contains("added itself to the redundancy list")
            })
            .ok_or_else(|| self.fail(format!("{label} did not join the redundancy list")))?;
        let joined = started.elapsed();
        self.note(format!("{label} is in the redundancy list"));
        let step_before = self.last_step(mark);
        let deadline = Instant::now() + JOIN_WINDOW;
        let waiting = || {
            self.status(label)
                .and_then(|s| s["trainer"].as_str().map(str::to_string))
                .is_some_and(|t| t.starts_with("waiting"))
        };
        let mut said_waiting = false;
        while Instant::now() < deadline {
            said_waiting |= waiting();
            std::thread::sleep(Duration::from_millis(200));
        }
        if !said_waiting {
            return Err(self.fail(format!(
                "{label}'s sidecar never said it waits as a spare: {:?}",
                self.status(label).map(|s| s["trainer"].clone())
            )));
        }
        let restarted: Vec<String> = self.log.lines()[mark..]
            .iter()
            .filter(|l| {
                training
                    .iter()
                    .any(|t| l.text.starts_with(&format!("{t}/trainer| ")))
                    && is_event(&l.text, "start").is_some()
            })
            .map(|l| l.text.clone())
            .collect();
        if !restarted.is_empty() {
            return Err(self.fail(format!(
                "a spare joining restarted training workers: {restarted:?}"
            )));
        }
        let step_after = self.last_step(mark);
        if step_after <= step_before {
            return Err(self.fail(format!(
                "no step while {label} joined (step {step_before:?} -> {step_after:?})"
            )));
        }
        Ok(joined)
    }

    /// The last training step logged since `mark`.
    fn last_step(&self, mark: usize) -> Option<u64> {
        self.log.lines()[mark.min(self.log.mark())..]
            .iter()
            .filter_map(|l| is_event(&l.text, "step"))
            .filter_map(|e| e.num("step"))
            .max()
    }

    /// The first step of workers started after `mark` that resumed from a
    /// checkpoint with world 2: its time and the step it resumed from. (A
    /// running worker's step lines say `resumed_from` too once it has
    /// resumed: only a new worker's `start` line marks a new resume.)
    fn resumed(&self, mark: usize) -> Result<(Instant, u64), String> {
        let start = self
            .log
            .wait_for_after(mark, WAIT, |l| {
                is_event(l, "start").is_some_and(|e| {
                    e.num("resumed_from").is_some() && e.num("world_size") == Some(2)
                })
            })
            .ok_or_else(|| self.fail(format!("no worker resumed within {WAIT:?}")))?;
        let from = is_event(&start.text, "start")
            .and_then(|e| e.num("resumed_from"))
            .ok_or("no resumed_from")?;
        let after = self
            .log
            .lines()
            .iter()
            .position(|l| l.at == start.at && l.text == start.text)
            .unwrap_or(mark);
        let step = self
            .log
            .wait_for_after(after, WAIT, |l| {
                is_event(l, "step").is_some_and(|e| e.num("resumed_from") == Some(from))
            })
            .ok_or_else(|| self.fail(format!("training did not resume within {WAIT:?}")))?;
        Ok((step.at, from))
    }
}

fn pod_host(index: u32) -> String {
    trainwire_engine::mutation::workload::pod_host(
        SET,
        &index.to_string(),
        SERVICE,
        NAMESPACE,
        trainwire_engine::policy::DEFAULT_CLUSTER_DOMAIN,
    )
}

fn is_event(line: &str, event: &str) -> Option<TrainEvent> {
    TrainEvent::parse(line).filter(|e| e.event == event)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// Pods 0 and 1 train, pod 2 joins as a spare.
fn form(w: &mut World) -> Result<Duration, String> {
    w.start_store()?;
    w.start_pod("p0", 0, Network::addr(10))?;
    w.start_pod("p1", 1, Network::addr(11))?;
    w.wait("a 2-node world", |l| {
        is_event(l, "start").is_some_and(|e| e.num("world_size") == Some(2))
    })?;
    w.wait("the second checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(2 * CHECKPOINT_INTERVAL))
    })?;
    w.start_pod("p2", 2, Network::addr(12))?;
    w.note("started pod 2, the spare".into());
    w.joins_as_spare("p2", &["p0", "p1"])
}

struct Measured {
    /// `resumedAt` minus the first training step, for the cut and the store loss.
    resumed_gap: f64,
    store_resumed_gap: Option<f64>,
    cut_to_resume: Duration,
    resumed_from: u64,
    replacement_joined: Duration,
    store_back_to_resume: Option<Duration>,
}

/// Lose training pod `lost` (index `index`): the survivor and the spare
/// resume; then its replacement joins as a spare; then, with `kill_store`,
/// the store is lost and comes back.
fn scenario(index: u32, kill_store: bool) -> Result<Measured, String> {
    let mut w = World::new()?;
    form(&mut w)?;
    // The controller has seen the world whole before the loss.
    let controller = WorldController::new(&w.rendered.sts, NAMESPACE)?.watch(&w.api)?;
    let (lost, survivor) = if index == 0 {
        ("p0", "p1")
    } else {
        ("p1", "p0")
    };
    let before: Vec<(&str, usize)> = [survivor, "p2"].map(|p| (p, w.exits(p))).to_vec();
    // A checkpoint more, so the cut falls between two.
    let mark = w.log.mark();
    w.log
        .wait_for_after(mark, WAIT, |l| is_event(l, "checkpoint").is_some())
        .ok_or_else(|| w.fail("no checkpoint after the spare joined".into()))?;
    let mark = w.log.mark();
    let cut = w.lose(lost)?;
    let at_cut = w.latest_step().ok_or("no checkpoint at the cut")?;
    w.note(format!("latest checkpoint at the cut: step {at_cut}"));

    let (resumed_at, from) = w.resumed(mark)?;
    let cut_to_resume = resumed_at.duration_since(cut);
    if from != at_cut {
        return Err(w.fail(format!(
            "resumed from step {from}, the checkpoint at the cut was {at_cut}"
        )));
    }
    // The survivor and the spare both run a worker that resumed, on
    // torchrun's first attempt (a membership change is not a failure).
    for who in [survivor, "p2"] {
        let prefix = format!("{who}/trainer| ");
        let line = w
            .log
            .wait_for_after(mark, Duration::from_secs(30), |l| {
                l.starts_with(&prefix)
                    && is_event(l, "start").is_some_and(|e| e.num("resumed_from") == Some(at_cut))
            })
            .ok_or_else(|| w.fail(format!("{who} did not resume from step {at_cut}")))?;
        let restarts = is_event(&line.text, "start").and_then(|e| e.num("restart_count"));
        if restarts != Some(0) {
            return Err(w.fail(format!(
                "{who} resumed with restart_count {restarts:?}: a max_restarts attempt was spent"
            )));
        }
    }
    for (who, exits) in &before {
        if w.exits(who) != *exits {
            return Err(w.fail(format!(
                "{who}'s trainer container exited during the recovery"
            )));
        }
    }
    w.note(format!(
        "resumed from step {from} {:.1}s after the cut, no replacement",
        cut_to_resume.as_secs_f64()
    ));
    let status = controller.until_resumed().map_err(|e| w.fail(e))?;
    let resumed_gap =
        check_resumed(&status, wall(cut)?, wall(resumed_at)?).map_err(|e| w.fail(e))?;
    // The spare trains now, with torch's node rank its workers were given.
    let spare_rank = |s: &trainwire_contract::world::WorldStatus| {
        s.ranks
            .iter()
            .find(|r| r.index == 2)
            .and_then(|r| r.torch_rank)
    };
    let ranked = controller
        .until("the spare's torch rank", |s| spare_rank(s).is_some())
        .map_err(|e| w.fail(e))?;
    if spare_rank(&ranked).is_none_or(|t| t >= 2) {
        return Err(w.fail(format!(
            "the spare's torch rank is not below 2: {}",
            ranked.to_annotation()
        )));
    }
    w.note(format!(
        "world status after the cut: {}",
        status.to_annotation()
    ));

    // The replacement of the lost pod, a new address under its name.
    let replacement = format!("{lost}b");
    w.start_pod(&replacement, index, Network::addr(20 + index as u8))?;
    w.note(format!("started the replacement {replacement}"));
    let training = [survivor, "p2"];
    let replacement_joined = w.joins_as_spare(&replacement, &training)?;

    let mut store_back_to_resume = None;
    let mut store_resumed_gap = None;
    if kill_store {
        let store = w.store.as_ref().ok_or("no store")?;
        let pid = store.pid().ok_or("the store is not running")?;
        let starts = store.starts().len();
        let mark = w.log.mark();
        let mut pids = descendants(pid);
        pids.push(pid);
        signal_all(&pids, Signal::SIGKILL);
        let killed = Timestamp::now();
        controller.with(WorldController::store_exits)?;
        w.note("killed the store".into());
        let deadline = Instant::now() + WAIT;
        let back = loop {
            if let Some(t) = store.starts().get(starts) {
                break *t;
            }
            if Instant::now() > deadline {
                return Err(w.fail("the store was not started again".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let back_at = wall(back)?;
        controller.with(|c| c.store_back(back_at))?;
        let (resumed_at, _) = w.resumed(mark)?;
        store_back_to_resume = Some(resumed_at.saturating_duration_since(back));
        w.note("the world resumed after the store came back".into());
        let status = controller.until_resumed().map_err(|e| w.fail(e))?;
        if status
            .last_loss
            .as_ref()
            .and_then(|l| l.store.as_ref())
            .is_none()
        {
            return Err(w.fail(format!(
                "the store's loss is not the last loss: {}",
                status.to_annotation()
            )));
        }
        store_resumed_gap =
            Some(check_resumed(&status, killed, wall(resumed_at)?).map_err(|e| w.fail(e))?);
        w.note(format!(
            "world status after the store: {}",
            status.to_annotation()
        ));
    }
    if std::env::var_os("TRAINWIRE_E2E_DUMP").is_some() {
        eprintln!("{}", w.log.tail(100_000));
    }
    Ok(Measured {
        resumed_gap,
        store_resumed_gap,
        cut_to_resume,
        resumed_from: from,
        replacement_joined,
        store_back_to_resume,
    })
}

fn run(test: &str, index: u32, kill_store: bool) {
    if !torch::require_torch(test) || !netns::require_netns(test) {
        return;
    }
    let started = Instant::now();
    match scenario(index, kill_store) {
        Ok(m) => println!(
            "SPARES lost_index={index} resumed_from={} resumed_at_minus_first_step_s={:.2} store_resumed_at_minus_first_step_s={} cut_to_resume_s={} replacement_joined_s={} store_back_to_resume_s={} total_s={}",
            m.resumed_from,
            m.resumed_gap,
            m.store_resumed_gap
                .map(|g| format!("{g:.2}"))
                .unwrap_or_else(|| "-".into()),
            secs(m.cut_to_resume),
            secs(m.replacement_joined),
            m.store_back_to_resume
                .map(|d| secs(d).to_string())
                .unwrap_or_else(|| "-".into()),
            secs(started.elapsed()),
        ),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// Pod 1 lost: the spare takes its place; its replacement becomes the next
/// spare; then the store is lost and the world comes back by itself.
#[test]
fn a_spare_replaces_a_lost_pod_and_the_world_survives_its_store() {
    run(
        "a_spare_replaces_a_lost_pod_and_the_world_survives_its_store",
        1,
        true,
    );
}

/// Pod 0 lost: with the store off the training pods, index 0 is a pod like
/// any other.
#[test]
fn a_spare_replaces_pod_0() {
    run("a_spare_replaces_pod_0", 0, false);
}
