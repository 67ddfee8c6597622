//! `trainwire.dev/framework: tensorflow` end to end: two TensorFlow workers
//! (`examples/train_tf.py`, `MultiWorkerMirroredStrategy` on CPU), each in
//! its own network namespace on a bridge, with the trainer and sidecar env
//! exactly as the real `trainwire-webhook inject` renders it for a
//! StatefulSet. The workers must form their cluster from the injected
//! `TF_CONFIG` alone. Then one worker is cut off silently (its switch port
//! goes down and its processes freeze), a replacement with the same name and
//! a new address starts 5 s later, and training must resume from the
//! checkpoint of the cut with both workers.
//!
//! Each run prints one `RECOVERY-TF ...` line with the measured times
//! (docs/benchmarks.md, "TensorFlow recovery end to end"). Skips with a clear
//! message when TensorFlow is missing, when not root, or when `ip netns` does
//! not work.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;
use trainwire_sidecar::env as tw;
use trainwire_tests::kubelet::Kubelet;
use trainwire_tests::netns::{self, Network, Node};
use trainwire_tests::process::{Log, Proc, Tag, unique_name};
use trainwire_tests::rendered::{self, Entry, resolve};
use trainwire_tests::tensorflow;
use trainwire_tests::torch::{TrainEvent, python};

/// Bound of every wait (TensorFlow's import takes seconds on a busy machine).
const WAIT: Duration = Duration::from_secs(180);
const REPLACEMENT_AFTER: Duration = Duration::from_secs(5);
const CHECKPOINT_INTERVAL: u64 = 10;
const TF_PORT: u16 = 12345;
/// The pods are `node-<i>` of a StatefulSet `node` under the headless
/// Service `train` in namespace `e2e`.
const SERVICE: &str = "train";
const NAMESPACE: &str = "e2e";

/// The StatefulSet the env is rendered from.
fn manifest(script: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: node
  namespace: {NAMESPACE}
  annotations:
    trainwire.dev/inject: "true"
    trainwire.dev/framework: tensorflow
    trainwire.dev/rdzv-port: "{TF_PORT}"
    trainwire.dev/checkpoint-pvc: ckpt
spec:
  serviceName: {SERVICE}
  replicas: 2
  selector:
    matchLabels: {{app: tf}}
  template:
    metadata:
      labels: {{app: tf}}
    spec:
      containers:
      - name: trainer
        image: tensorflow
        command: ["python3", "{script}"]
"#
    )
}

/// The env of the trainer and of the sidecar, from the real CLI.
struct Rendered {
    trainer: Vec<(String, Entry)>,
    sidecar: Vec<(String, Entry)>,
}

fn render(script: &str) -> Result<Rendered, String> {
    let objects = rendered::inject(&manifest(script))?;
    let sts = rendered::find(&objects, "StatefulSet", "node")?;
    let spec = &sts["spec"]["template"]["spec"];
    Ok(Rendered {
        trainer: rendered::entries(&spec["containers"][0]),
        sidecar: rendered::entries(&spec["initContainers"][0]),
    })
}

fn pod_host(i: &str) -> String {
    trainwire_engine::mutation::workload::pod_host(
        "node",
        i,
        SERVICE,
        NAMESPACE,
        trainwire_engine::policy::DEFAULT_CLUSTER_DOMAIN,
    )
}

struct Worker {
    node: Node,
    kubelet: Kubelet,
    _sidecar: Proc,
}

struct Cluster {
    workers: Vec<Worker>,
    _tag: Tag,
    net: Network,
    ckpt: TempDir,
    /// One copy of the script per node: on a real node the sidecar sees only
    /// its own pod's processes; here every "pod" shares the host's PID
    /// namespace, so each sidecar looks for its own node's copy.
    scripts: TempDir,
    log: Log,
    run: String,
    rendered: Rendered,
    sidecar_bin: PathBuf,
    tag: String,
    /// The sidecar's `TRAINWIRE_ON_PEER_LOSS` as rendered, or
    /// `$TRAINWIRE_E2E_TF_ACTION` (`none` measures what TensorFlow does alone).
    action: String,
}

impl Cluster {
    fn new() -> Result<Cluster, String> {
        let tag = Tag::new("twtf");
        let mut net = Network::create("twtf")?;
        let domain = pod_host("0");
        let domain = domain
            .strip_prefix("node-0.")
            .ok_or_else(|| format!("pod 0's name {domain} is not node-0.<domain>"))?;
        net.set_domain(domain);
        let rendered = render("/app/train_tf.py")?;
        Ok(Cluster {
            workers: Vec::new(),
            tag: tag.value().to_string(),
            _tag: tag,
            net,
            ckpt: tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?,
            scripts: tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?,
            log: Log::new("tf-e2e"),
            run: unique_name("run"),
            rendered,
            sidecar_bin: trainwire_tests::sidecar_binary()?,
            action: String::new(),
        })
    }

    fn note(&self, text: String) {
        self.log.push(format!("harness| {text}"));
    }

    /// A node: namespace, sidecar, and the trainer container under a kubelet.
    fn start_node(&mut self, label: &str, rank: u32, addr: Ipv4Addr) -> Result<(), String> {
        let hostname = format!("node-{rank}");
        let node = self.net.add_node_named(label, &hostname, addr, true)?;
        let dir = self.scripts.path().join(label);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir: {e}"))?;
        let script = dir.join("train_tf.py");
        std::fs::copy(tensorflow::train_script(), &script)
            .map_err(|e| format!("copy train_tf.py: {e}"))?;
        let fields =
            rendered::pod_fields("node", rank, NAMESPACE, &format!("{label}-{}", self.run));
        let ckpt = self.ckpt.path().to_string_lossy().into_owned();
        let at_ckpt = |(k, v): (String, String)| {
            if k == "CHECKPOINT_DIR" || k == tw::CHECKPOINT_DIR {
                (k, ckpt.clone())
            } else {
                (k, v)
            }
        };

        let mut sidecar_env: Vec<(String, String)> = resolve(&self.rendered.sidecar, &fields)?
            .into_iter()
            .map(at_ckpt)
            .collect();
        // The rendered pattern, narrowed to this node's copy of the script.
        let pattern = sidecar_env
            .iter()
            .find(|(k, _)| k == tw::AGENT_MATCH)
            .map(|(_, v)| v.clone())
            .ok_or("the rendered sidecar has no TRAINWIRE_AGENT_MATCH")?;
        sidecar_env.retain(|(k, _)| k != tw::AGENT_MATCH);
        if let Ok(action) = std::env::var("TRAINWIRE_E2E_TF_ACTION") {
            sidecar_env.retain(|(k, _)| k != tw::ON_PEER_LOSS);
            sidecar_env.push((tw::ON_PEER_LOSS.to_string(), action));
        }
        self.action = sidecar_env
            .iter()
            .find(|(k, _)| k == tw::ON_PEER_LOSS)
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        sidecar_env.push((
            tw::AGENT_MATCH.to_string(),
            format!("{}/{pattern}", dir.display()),
        ));
        sidecar_env.extend(
            [
                (tw::DETECTION, "heartbeat"),
                (tw::BIND_ADDRESS, "0.0.0.0"),
                (tw::HEARTBEAT_INTERVAL, "1s"),
                (tw::HEARTBEAT_MISSES, "3"),
                ("RUST_LOG", "info"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let mut cmd = self.net.command(&node, &self.sidecar_bin.to_string_lossy());
        cmd.envs(sidecar_env);
        let sidecar = Proc::spawn_as(
            &mut cmd,
            &self.tag,
            &self.log,
            &format!("{label}/sidecar| "),
        )
        .map_err(|e| format!("start the sidecar: {e}"))?;

        let mut env: Vec<(String, String)> = resolve(&self.rendered.trainer, &fields)?
            .into_iter()
            .map(at_ckpt)
            .collect();
        env.extend(
            [
                ("TRAIN_STEPS", "100000"),
                ("TRAIN_LOG_EVERY", "2"),
                ("TRAIN_SLEEP", "0.2"),
                ("TF_CPP_MIN_LOG_LEVEL", "2"),
                ("PYTHONUNBUFFERED", "1"),
                ("OMP_NUM_THREADS", "1"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        env.push((
            "TRAIN_CHECKPOINT_INTERVAL".into(),
            CHECKPOINT_INTERVAL.to_string(),
        ));
        let program = self.net.command_args(&node, &python());
        let make = move || {
            let mut cmd = Command::new("ip");
            cmd.args(&program)
                .arg(&script)
                // Only what the webhook rendered (plus the harness's knobs):
                // the cluster comes from TF_CONFIG alone.
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", std::env::var("HOME").unwrap_or_default())
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            cmd
        };
        let kubelet = Kubelet::run_backoff(
            &format!("{label}/trainer"),
            &self.tag,
            &self.log,
            Duration::from_secs(1),
            make,
        );
        self.workers.push(Worker {
            node,
            kubelet,
            _sidecar: sidecar,
        });
        Ok(())
    }

    fn worker(&self, label: &str) -> Option<&Worker> {
        self.workers
            .iter()
            .find(|w| w.node.ns.ends_with(&format!("-{label}")))
    }

    fn wait(
        &self,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> Result<trainwire_tests::process::Line, String> {
        self.log.wait_for(WAIT, pred).ok_or_else(|| {
            format!(
                "timed out after {WAIT:?} waiting for {what}\n{}",
                self.log.tail(200)
            )
        })
    }

    /// The step of the newest checkpoint (TensorFlow's `checkpoint` index file).
    fn latest_step(&self) -> Option<u64> {
        latest_step(self.ckpt.path())
    }

    fn exits(&self, label: &str) -> usize {
        self.worker(label).map(|w| w.kubelet.exits()).unwrap_or(0)
    }

    /// The `/status` of the sidecar on node `label`.
    fn status(&self, label: &str) -> Option<Value> {
        let w = self.worker(label)?;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], tw::DEFAULT_HEALTH_PORT));
        let body = netns::http_get(&w.node.ns, addr, "/status").ok()?;
        serde_json::from_str(&body).ok()
    }
}

fn latest_step(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("checkpoint")).ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with("model_checkpoint_path:"))?;
    line.rsplit('-').next()?.trim_end_matches('"').parse().ok()
}

fn is_event(line: &str, event: &str) -> Option<TrainEvent> {
    TrainEvent::parse(line).filter(|e| e.event == event)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// One run: lose worker `lost_rank` (0 is TensorFlow's chief, which also
/// runs its coordination service).
fn scenario(lost_rank: u32) -> Result<(), String> {
    let mut c = Cluster::new()?;
    // The rendered env is what the test runs with: check its shape first.
    let names: Vec<&str> = c.rendered.trainer.iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"TF_CONFIG"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("PET_")),
        "no torchrun env: {names:?}"
    );
    let cold = Instant::now();
    c.start_node("n0", 0, Network::addr(10))?;
    c.start_node("n1", 1, Network::addr(11))?;
    c.wait("a 2-worker world", |l| {
        is_event(l, "start").is_some_and(|e| e.num("world_size") == Some(2))
    })?;
    let first = c.wait("the first step", |l| is_event(l, "step").is_some())?;
    let cold_start = first.at.duration_since(cold);
    c.wait("the second checkpoint", |l| {
        is_event(l, "checkpoint").is_some_and(|e| e.num("step") >= Some(2 * CHECKPOINT_INTERVAL))
    })?;

    let (lost, survivor) = if lost_rank == 0 {
        ("n0", "n1")
    } else {
        ("n1", "n0")
    };
    let exits_before = c.exits(survivor);
    let w = c.worker(lost).ok_or("no lost node")?;
    c.net.cut(&w.node)?;
    let cut = Instant::now();
    c.net.freeze(&w.node);
    let at_cut = c.latest_step().ok_or("no checkpoint at the cut")?;
    c.note(format!(
        "cut off and froze {lost} (rank {lost_rank}); latest checkpoint: step {at_cut}"
    ));

    // What TensorFlow does by itself: the survivor's trainer exits (its
    // collective fails once the lost task's heartbeats stop).
    let mut survivor_exit = None;
    let deadline = cut + REPLACEMENT_AFTER;
    while Instant::now() < deadline {
        if survivor_exit.is_none() && c.exits(survivor) > exits_before {
            survivor_exit = Some(cut.elapsed());
            c.note("the survivor's trainer exited".to_string());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let label = if lost_rank == 0 { "n0b" } else { "n1b" };
    let mark = c.log.mark();
    let replaced = Instant::now();
    c.start_node(label, lost_rank, Network::addr(20 + lost_rank as u8))?;
    c.note(format!(
        "started the replacement {label} as node-{lost_rank}"
    ));

    // Until training resumes: when the survivor's trainer exits, and when
    // its sidecar acts (its /status).
    let mut signalled = None;
    let resumed =
        loop {
            if let Some(l) = c.log.lines().into_iter().skip(mark).find(|l| {
                is_event(&l.text, "step").is_some_and(|e| e.num("resumed_from").is_some())
            }) {
                break l;
            }
            if survivor_exit.is_none() && c.exits(survivor) > exits_before {
                survivor_exit = Some(cut.elapsed());
            }
            if signalled.is_none()
                && c.status(survivor)
                    .is_some_and(|s| s["last_action"]["result"] == "signalled")
            {
                signalled = Some(cut.elapsed());
            }
            if cut.elapsed() > WAIT {
                return Err(format!(
                    "training did not resume within {WAIT:?}\n{}",
                    c.log.tail(250)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
    let ev = TrainEvent::parse(&resumed.text).ok_or("unparsable step line")?;
    let from = ev.num("resumed_from").ok_or("no resumed_from")?;
    if from < at_cut {
        return Err(format!(
            "resumed from step {from}, the checkpoint at the cut was {at_cut}\n{}",
            c.log.tail(250)
        ));
    }
    if ev.num("world_size") != Some(2) {
        return Err(format!(
            "resumed with world size {:?}: {}",
            ev.num("world_size"),
            resumed.text
        ));
    }
    let survivor_exit = survivor_exit.ok_or_else(|| {
        format!(
            "training resumed but the survivor's trainer never exited: it cannot have rejoined\n{}",
            c.log.tail(250)
        )
    })?;
    // Both the survivor and the replacement resumed from the checkpoint.
    for who in [survivor, label] {
        let prefix = format!("{who}/trainer| ");
        c.log
            .wait_for_after(mark, Duration::from_secs(10), |l| {
                l.starts_with(&prefix)
                    && is_event(l, "start").is_some_and(|e| e.num("resumed_from") == Some(from))
            })
            .ok_or_else(|| format!("{who} did not resume from step {from}\n{}", c.log.tail(250)))?;
    }
    let status = c.status(survivor).unwrap_or(Value::Null);
    let action = &status["last_action"];
    if c.action != "none" && action["lost_rank"].as_u64() != Some(u64::from(lost_rank)) {
        return Err(format!(
            "the survivor's sidecar reports no action on rank {lost_rank}: {status}\n{}",
            c.log.tail(250)
        ));
    }
    c.log
        .wait_for_after(mark, WAIT, |l| {
            is_event(l, "checkpoint")
                .is_some_and(|e| e.num("step") >= Some(from + CHECKPOINT_INTERVAL))
        })
        .ok_or_else(|| format!("training did not go on after resuming\n{}", c.log.tail(250)))?;
    println!(
        "RECOVERY-TF lost_rank={lost_rank} on_peer_loss={} tensorflow={} cold_start={}s cut_to_sidecar_signal={} cut_to_survivor_exit={}s replacement_to_resume={}s cut_to_resume={}s resumed_from={from} checkpoint_at_cut={at_cut} survivor_exits={} sidecar={}:{}:{}",
        c.action,
        tensorflow::tensorflow_version().unwrap_or_default(),
        secs(cold_start),
        signalled.map_or("none".to_string(), |d| format!("{}s", secs(d))),
        secs(survivor_exit),
        secs(resumed.at.duration_since(replaced)),
        secs(resumed.at.duration_since(cut)),
        c.exits(survivor) - exits_before,
        action["action"].as_str().unwrap_or("none"),
        action["result"].as_str().unwrap_or("none"),
        action["confirmed_by"]["by"].as_str().unwrap_or("none"),
    );
    Ok(())
}

fn run(test: &str, lost_rank: u32) {
    if !tensorflow::require_tensorflow(test) || !netns::require_netns(test) {
        return;
    }
    if let Err(e) = scenario(lost_rank) {
        panic!("{test}: {e}");
    }
}

#[test]
fn tensorflow_world_resumes_after_losing_a_worker() {
    run("tensorflow_world_resumes_after_losing_a_worker", 1);
}

#[test]
fn tensorflow_world_resumes_after_losing_the_chief() {
    run("tensorflow_world_resumes_after_losing_the_chief", 0);
}
