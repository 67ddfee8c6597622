//! trainwire on a real node: the recovery and status claims of the README
//! and docs/status.md, measured (docs/real-node.md).
//!
//! One real single-node cluster for the whole binary
//! (`trainwire_tests::real_node`: etcd, kube-apiserver, controller-manager,
//! scheduler and kubelet v1.36.2 from `../shared/k8s/`, containerd + runc, a
//! bridge CNI), trainwire installed from its own `images/build` archives as
//! docs/deploy.md says (self-managed overlay, the sidecar's ClusterRole
//! bound in each training namespace), default settings. In each scenario's
//! namespace an injected StatefulSet runs real `torchrun` +
//! `examples/train.py` (CPU/gloo): a world of 2 with 1 hot spare, a
//! dedicated rendezvous store, a shared checkpoint claim (hostPath PV + PVC),
//! the trainer as root, then as UID 1000. Each world loses, in turn: a
//! training pod cut silently (its network namespace's `eth0` down, the pod
//! object unchanged), the same pod deleted (already out of the world), the
//! pod of torch's rank 0 deleted, and the trainer of torch's rank 0 killed
//! (agent and workers, SIGKILL: the container exits).
//!
//! **A test device, not how users ship images**: the trainer image is
//! busybox and mount points only; a MutatingAdmissionPolicy of the test adds
//! the host's Python prefix (with torch) and its library directories to
//! every container of that image, read-only, at the same paths (the store
//! pod runs `python3` from the trainer's image too). Real images carry
//! their Python.
//!
//! For every loss it prints one line: the first training step after it
//! (from the pods' log files, whose lines the kubelet timestamps), what the
//! sidecars' `/status` showed (`detection.active`, the loss, `training.
//! seen_by`) and the workload's `trainwire.dev/world` (lastLoss.at,
//! detectedBy, resumedAt, phase, roles); then it asserts issue 39's goals,
//! all of them, after every figure is printed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use trainwire_tests::real_node::{self, Install, RealNode, TRAINER_IMAGE, parse_rfc3339, poll};

const TEST: &str = "real_node_recovery";
const STS: &str = "train";
/// The label of the namespaces the host-Python policy applies to.
const HOST_PYTHON_LABEL: &str = "trainwire.test/host-python";

#[test]
fn real_node_recovery() {
    let torch = trainwire_tests::Prerequisite::from_result(
        trainwire_tests::torch::torch_version()
            .map_err(|why| format!("PyTorch is not importable ({why}); pip install torch")),
    );
    if !trainwire_tests::require::require_all(TEST, [real_node::prerequisites(), torch]) {
        return;
    }
    let started = Instant::now();
    let node = RealNode::start("recovery").unwrap_or_else(|e| panic!("real node: {e}"));
    let node_ready = started.elapsed();
    let install = node
        .install_trainwire()
        .unwrap_or_else(|e| panic!("install: {e}\n{}", node.component_log("kubelet", 20)));
    eprintln!(
        "real node Ready after {:.1} s, trainwire answering {:.1} s later",
        node_ready.as_secs_f64(),
        install.took.as_secs_f64()
    );
    let prefix = real_node::images::python_prefix().unwrap_or_else(|e| panic!("{e}"));
    let archive = real_node::images::trainer_image(&node.dir().join("images"), &prefix)
        .unwrap_or_else(|e| panic!("trainer image: {e}"));
    node.import_image(&archive, TRAINER_IMAGE)
        .unwrap_or_else(|e| panic!("{e}"));
    node.apply(&real_node::images::host_python_policy(
        &prefix,
        HOST_PYTHON_LABEL,
    ))
    .unwrap_or_else(|e| panic!("host Python policy: {e}"));

    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for (ns, user) in [("rn-root", None), ("rn-uid1000", Some(1000))] {
        let world = match World::create(&node, &install, ns, user) {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{ns}: {e}"));
                continue;
            }
        };
        world.run_scenarios(&mut lines, &mut failures);
        world.remove();
    }
    eprintln!(
        "\nreal node figures (whole suite {:.0} s):",
        started.elapsed().as_secs_f64()
    );
    for line in &lines {
        eprintln!("{line}");
    }
    drop(node);
    assert!(
        failures.is_empty(),
        "{} of issue 39's goals failed on the real node:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// One training world in its own namespace.
struct World<'a> {
    node: &'a RealNode,
    ns: String,
    user: &'static str,
}

/// What the world annotation and the sidecars showed after one loss.
#[derive(Default)]
struct Measured {
    first_step: Option<SystemTime>,
    /// When the world first showed the new loss (polled).
    world_saw: Option<SystemTime>,
    /// When the phase was first seen `Running` after the first step.
    running_seen: Option<SystemTime>,
    last_loss: Value,
    world: Value,
    /// pod -> its `/status` (the last read).
    sidecars: BTreeMap<String, Value>,
}

fn secs(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

fn fmt_rel(t: Option<SystemTime>, base: SystemTime) -> String {
    t.map_or("never".to_string(), |t| format!("{:+.1} s", secs(t, base)))
}

fn time_of(v: &Value) -> Option<SystemTime> {
    v.as_str().and_then(parse_rfc3339)
}

impl<'a> World<'a> {
    fn create(
        node: &'a RealNode,
        install: &Install,
        ns: &str,
        user: Option<u32>,
    ) -> Result<World<'a>, String> {
        let start = Instant::now();
        node.create_namespace(ns, &[(HOST_PYTHON_LABEL, "true")])?;
        install.bind_sidecar(node, ns)?;
        // The policy selects the namespace by its label, from the
        // apiserver's cache of namespaces: wait until it applies here.
        let probe = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, namespace: {ns}}}\nspec:\n  containers: [{{name: c, image: \"{TRAINER_IMAGE}\"}}]\n"
        );
        poll(
            &format!("{ns}: the host-Python policy applying"),
            Duration::from_secs(30),
            || {
                node.kubectl_stdin(
                    &[
                        "create",
                        "--dry-run=server",
                        "--validate=false",
                        "-o",
                        "json",
                        "-f",
                        "-",
                    ],
                    Some(&probe),
                )
                .ok()?
                .contains("host-python")
                .then_some(())
            },
        )?;
        let script = trainwire_tests::torch::train_script();
        node.kubectl(&[
            "create",
            "configmap",
            "train",
            "-n",
            ns,
            &format!("--from-file=train.py={}", script.display()),
        ])?;
        let ckpt = node.dir().join(format!("ckpt-{ns}"));
        std::fs::create_dir_all(&ckpt).map_err(|e| format!("{e}"))?;
        std::fs::set_permissions(&ckpt, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .map_err(|e| format!("{e}"))?;
        let security = user.map_or(String::new(), |uid| {
            format!("\n          securityContext:\n            runAsUser: {uid}\n            runAsGroup: {uid}")
        });
        let fs_group = user.map_or(String::new(), |uid| {
            format!("\n      securityContext:\n        fsGroup: {uid}")
        });
        node.apply(&format!(
            r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: {id}-{ns}-ckpt
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {{path: "{ckpt}", type: Directory}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: ckpt
  namespace: {ns}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: {id}-{ns}-ckpt
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Service
metadata:
  name: {STS}
  namespace: {ns}
spec:
  clusterIP: None
  selector: {{app: {STS}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {STS}
  namespace: {ns}
  annotations:
    trainwire.dev/inject: "true"
    trainwire.dev/nnodes: "2"
    trainwire.dev/spares: "1"
    trainwire.dev/rdzv-store: dedicated
    trainwire.dev/checkpoint-pvc: ckpt
spec:
  serviceName: {STS}
  replicas: 3
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: {STS}}}
  template:
    metadata:
      labels: {{app: {STS}}}
    spec:{fs_group}
      containers:
        - name: trainer
          image: {TRAINER_IMAGE}
          imagePullPolicy: Never
          command: [torchrun, /train/train.py]{security}
          env:
            - {{name: TRAIN_STEPS, value: "1000000"}}
            - {{name: TRAIN_SLEEP, value: "0.2"}}
            - {{name: TRAIN_LOG_EVERY, value: "1"}}
            - {{name: TRAIN_CHECKPOINT_INTERVAL, value: "25"}}
          volumeMounts: [{{name: train, mountPath: /train}}]
      volumes:
        - {{name: train, configMap: {{name: train}}}}
"#,
            id = node.id,
            ckpt = ckpt.display(),
        ))?;
        let world = World {
            node,
            ns: ns.to_string(),
            user: if user.is_some() { "uid1000" } else { "root" },
        };
        world.wait_steady(Duration::from_secs(150))?;
        eprintln!(
            "{ns}: world training in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        Ok(world)
    }

    fn remove(&self) {
        let _ = self.node.kubectl(&[
            "delete",
            "statefulset,deployment,pods",
            "--all",
            "-n",
            &self.ns,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]);
        let _ = self
            .node
            .kubectl(&["delete", "namespace", &self.ns, "--wait=false"]);
    }

    /// The StatefulSet's pods (name -> object).
    fn pods(&self) -> BTreeMap<String, Value> {
        self.node
            .get_json(&["pods", "-n", &self.ns, "-l", &format!("app={STS}")])
            .ok()
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p["metadata"]["name"].as_str()?.to_string(), p)))
            .collect()
    }

    fn world(&self) -> Value {
        self.node
            .get_json(&["statefulset", "-n", &self.ns, STS])
            .ok()
            .and_then(|s| {
                serde_json::from_str(s["metadata"]["annotations"]["trainwire.dev/world"].as_str()?)
                    .ok()
            })
            .unwrap_or(Value::Null)
    }

    /// pod -> (agent pid, its workers' `RANK`s), for pods whose trainer runs.
    fn agents(&self) -> BTreeMap<String, (i32, Vec<u32>)> {
        let mut out = BTreeMap::new();
        for pod in self.pods().keys() {
            let Ok(pid) = self.node.container_pid(&self.ns, pod, "trainer") else {
                continue;
            };
            let ranks = children(pid)
                .into_iter()
                .filter_map(|w| {
                    let env = std::fs::read(format!("/proc/{w}/environ")).ok()?;
                    env.split(|b| *b == 0)
                        .find_map(|kv| kv.strip_prefix(b"RANK="))
                        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                })
                .collect();
            out.insert(pod.clone(), (pid, ranks));
        }
        out
    }

    /// The pod whose worker is torch's rank 0.
    fn rank0_pod(&self) -> Result<String, String> {
        self.agents()
            .into_iter()
            .find(|(_, (_, ranks))| ranks.contains(&0))
            .map(|(pod, _)| pod)
            .ok_or_else(|| format!("{}: no pod runs torch's rank 0", self.ns))
    }

    /// Three pods Ready, two of them training (workers), a step in the last 2 s.
    fn wait_steady(&self, limit: Duration) -> Result<(), String> {
        poll(
            &format!("{}: world of 2 + 1 spare training", self.ns),
            limit,
            || {
                let pods = self.pods();
                let ready = pods
                    .values()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .filter(|p| {
                        p["status"]["conditions"].as_array().is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                    })
                    .count();
                if ready < 3 {
                    return None;
                }
                let training = self
                    .agents()
                    .values()
                    .filter(|(_, r)| !r.is_empty())
                    .count();
                let last = self.steps().last().map(|(t, _)| *t)?;
                (training == 2 && secs(SystemTime::now(), last) < 2.0).then_some(())
            },
        )
        .map_err(|e| {
            format!(
                "{e}\n{}",
                self.node
                    .kubectl(&["get", "pods,events", "-n", &self.ns, "-o", "wide"])
                    .unwrap_or_default()
            )
        })
    }

    /// The pods, and the trainer's and the sidecar's last lines since `at`
    /// (for a failure's message).
    fn since(&self, at: SystemTime) -> String {
        let mut out = self
            .node
            .kubectl(&["get", "pods", "-n", &self.ns, "-o", "wide"])
            .unwrap_or_default();
        for container in ["trainer", "trainwire-sidecar"] {
            let lines: Vec<_> = self
                .node
                .log_lines(&self.ns, STS, container)
                .into_iter()
                .filter(|(t, _, _)| *t >= at)
                .collect();
            for (t, pod, line) in lines.iter().skip(lines.len().saturating_sub(40)) {
                out.push_str(&format!(
                    "{} {pod}/{container}: {line}\n",
                    fmt_rel(Some(*t), at)
                ));
            }
        }
        out
    }

    /// (time, pod) of every training step line.
    fn steps(&self) -> Vec<(SystemTime, String)> {
        self.node
            .log_lines(&self.ns, STS, "trainer")
            .into_iter()
            .filter(|(_, _, l)| l.starts_with("[trainwire-train] step="))
            .map(|(t, pod, _)| (t, pod))
            .collect()
    }

    /// The first step of workers started after `after`.
    fn first_step_after(&self, after: SystemTime) -> Option<SystemTime> {
        let lines = self.node.log_lines(&self.ns, STS, "trainer");
        let start = lines
            .iter()
            .find(|(t, _, l)| *t > after && l.starts_with("[trainwire-train] start "))?
            .0;
        lines
            .iter()
            .find(|(t, _, l)| *t >= start && l.starts_with("[trainwire-train] step="))
            .map(|(t, _, _)| *t)
    }

    fn sidecar_status(&self, pod: &Value) -> Option<Value> {
        let ip = pod["status"]["podIP"].as_str()?;
        let port = pod["spec"]["initContainers"]
            .as_array()?
            .iter()
            .chain(pod["spec"]["containers"].as_array()?.iter())
            .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
            .find(|e| e["name"] == "TRAINWIRE_HEALTH_PORT")
            .and_then(|e| e["value"].as_str().map(str::to_string))
            .unwrap_or_else(|| "29600".to_string());
        let status = trainwire_tests::net::status(&format!("{ip}:{port}"));
        (!status.is_null()).then_some(status)
    }

    /// Polls the world and the sidecars after a loss at `at`, until every
    /// figure is in or `first step + 20 s` (at most `at + 90 s`).
    fn measure(&self, at: SystemTime, lost: &str, generation_before: u64) -> Measured {
        let mut m = Measured::default();
        let hard = at + Duration::from_secs(90);
        loop {
            let now = SystemTime::now();
            if m.first_step.is_none() {
                m.first_step = self.first_step_after(at);
            }
            let world = self.world();
            let generation = world["generation"].as_u64().unwrap_or(0);
            if generation > generation_before {
                m.world_saw.get_or_insert(now);
                m.last_loss = world["lastLoss"].clone();
            }
            if let Some(first) = m.first_step
                && m.running_seen.is_none()
                && generation > generation_before
                && world["phase"] == "Running"
                && now >= first
            {
                m.running_seen = Some(now);
            }
            m.world = world;
            let mut sidecars_done = m.first_step.is_some();
            if m.first_step.is_some() {
                for (name, pod) in self.pods() {
                    if name == lost || !pod["metadata"]["deletionTimestamp"].is_null() {
                        continue;
                    }
                    let Some(status) = self.sidecar_status(&pod) else {
                        continue;
                    };
                    let trains_since = time_of(&status["training"]["since"]);
                    if status["training"].is_object() && trains_since.is_none_or(|s| s < at) {
                        sidecars_done = false;
                    }
                    m.sidecars.insert(name, status);
                }
            }
            let complete =
                sidecars_done && m.running_seen.is_some() && !m.last_loss["resumedAt"].is_null();
            let deadline = m
                .first_step
                .map_or(hard, |f| f + Duration::from_secs(20))
                .min(hard);
            if complete || now > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Every loss of the scenario list, one line each, and the goals.
    fn run_scenarios(&self, lines: &mut Vec<String>, failures: &mut Vec<String>) {
        let result = (|| -> Result<(), String> {
            // 1. A silent cut of torch's rank 0's pod.
            let cut = self.rank0_pod()?;
            let before = self.world()["generation"].as_u64().unwrap_or(0);
            let netns = self.node.pod_netns(&self.ns, &cut)?;
            let at = SystemTime::now();
            real_node_run(
                "nsenter",
                &[
                    &format!("--net={netns}"),
                    "ip",
                    "link",
                    "set",
                    "eth0",
                    "down",
                ],
            )?;
            let m = self.measure(at, &cut, before);
            self.report("silent cut", &cut, at, &m, lines, failures, true);

            // 2. The cut pod deleted: it was out of the world already.
            let before = self.world();
            let at = SystemTime::now();
            self.node
                .kubectl(&["delete", "pod", "-n", &self.ns, &cut, "--wait=false"])?;
            let (opened, phases, gap) = self.watch_quiet(at, &cut, &before)?;
            lines.push(format!(
                "{} deleted already-lost pod {cut}: world generation {} -> {}, phases seen {phases:?}, longest step gap {gap:.2} s",
                self.user,
                before["generation"],
                opened.as_ref().map_or(before["generation"].clone(), |w| w["generation"].clone()),
            ));
            if let Some(w) = opened {
                failures.push(format!(
                    "{} deleted already-lost pod: opened a new interruption (lastLoss {})",
                    self.user, w["lastLoss"]
                ));
            }
            self.wait_steady(Duration::from_secs(90))?;

            // 3. The pod of torch's rank 0 deleted.
            let victim = self.rank0_pod()?;
            let before = self.world()["generation"].as_u64().unwrap_or(0);
            let at = SystemTime::now();
            self.node
                .kubectl(&["delete", "pod", "-n", &self.ns, &victim, "--wait=false"])?;
            let m = self.measure(at, &victim, before);
            self.report("pod deleted", &victim, at, &m, lines, failures, false);
            self.wait_steady(Duration::from_secs(90))?;

            // 4. The trainer of torch's rank 0 killed: agent and workers.
            let victim = self.rank0_pod()?;
            let agents = self.agents();
            let (agent, _) = agents.get(&victim).ok_or("no agent")?;
            let before = self.world()["generation"].as_u64().unwrap_or(0);
            let mut tree = children(*agent);
            tree.push(*agent);
            let at = SystemTime::now();
            for pid in tree {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let m = self.measure(at, "", before);
            self.report("trainer exit", &victim, at, &m, lines, failures, false);
            Ok(())
        })();
        if let Err(e) = result {
            failures.push(format!("{}: the scenarios stopped: {e}", self.user));
        }
    }

    /// After deleting an already-lost pod: whether the world opened a new
    /// loss before the replacement is Ready (+3 s), the phases seen, and the
    /// longest gap between training steps meanwhile.
    fn watch_quiet(
        &self,
        at: SystemTime,
        deleted: &str,
        before: &Value,
    ) -> Result<(Option<Value>, Vec<String>, f64), String> {
        let gen_before = before["generation"].as_u64().unwrap_or(0);
        let mut phases: Vec<String> = Vec::new();
        let mut opened = None;
        let mut ready_at: Option<Instant> = None;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            let w = self.world();
            let phase = w["phase"].as_str().unwrap_or("?").to_string();
            if phases.last() != Some(&phase) {
                phases.push(phase);
            }
            if w["generation"].as_u64().unwrap_or(0) > gen_before && opened.is_none() {
                opened = Some(w.clone());
            }
            let pods = self.pods();
            let replaced = pods.get(deleted).is_some_and(|p| {
                time_of(&p["metadata"]["creationTimestamp"]).is_some_and(|c| secs(c, at) > -1.0)
                    && p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            });
            if replaced {
                ready_at.get_or_insert_with(Instant::now);
            }
            if ready_at.is_some_and(|r| r.elapsed() > Duration::from_secs(3)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let steps: Vec<SystemTime> = self
            .steps()
            .into_iter()
            .map(|(t, _)| t)
            .filter(|t| *t >= at)
            .collect();
        let gap = steps
            .windows(2)
            .map(|w| secs(w[1], w[0]))
            .fold(0.0f64, f64::max);
        Ok((opened, phases, gap))
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &self,
        kind: &str,
        pod: &str,
        at: SystemTime,
        m: &Measured,
        lines: &mut Vec<String>,
        failures: &mut Vec<String>,
        silent: bool,
    ) {
        let label = format!("{} {kind} ({pod})", self.user);
        let loss = &m.last_loss;
        let loss_at = time_of(&loss["at"]);
        let resumed = time_of(&loss["resumedAt"]);
        let mut active = Vec::new();
        let mut seen_by = Vec::new();
        let mut saw = Vec::new();
        for (name, s) in &m.sidecars {
            active.push(format!("{name}:{}", s["detection"]["active"]));
            seen_by.push(format!(
                "{name}:{}",
                s["training"]["seen_by"].as_str().unwrap_or("-")
            ));
            if let Some(t) =
                time_of(&s["last_loss"]["suspected_at"]).filter(|t| secs(*t, at) > -1.0)
            {
                saw.push(format!(
                    "{name} {} rank {} {}",
                    fmt_rel(Some(t), at),
                    s["last_loss"]["rank"],
                    s["last_loss"]["lost_by"].as_str().unwrap_or("?")
                ));
            }
        }
        let roles: Vec<String> = m.world["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{}={}", r["index"], r["role"].as_str().unwrap_or("?")))
            .collect();
        let first = m.first_step;
        lines.push(format!(
            "{label}: first step {}; sidecars saw [{}]; world: loss {} at {} (shown {}), detectedBy {}, resumedAt {} vs first step (resumedBy {}), Running {} vs first step, phase now {}, roles [{}]; training.seen_by [{}]; detection.active [{}]",
            fmt_rel(first, at),
            saw.join(", "),
            if loss.is_null() { "none".to_string() } else { format!("rank {}", loss["rank"]) },
            fmt_rel(loss_at, at),
            fmt_rel(m.world_saw, at),
            loss["detectedBy"].as_str().unwrap_or("-"),
            first.map_or("-".to_string(), |f| fmt_rel(resumed, f)),
            loss["resumedBy"].as_str().unwrap_or("-"),
            first.map_or("-".to_string(), |f| fmt_rel(m.running_seen, f)),
            m.world["phase"].as_str().unwrap_or("-"),
            roles.join(" "),
            seen_by.join(" "),
            active.join(" "),
        ));
        let mut fail = |what: String| failures.push(format!("{label}: {what}"));
        let Some(first) = first else {
            fail(format!(
                "no training step after the loss within 90 s; what the pods said since:\n{}",
                self.since(at)
            ));
            return;
        };
        if silent {
            match loss_at {
                Some(t)
                    if secs(t, at) <= 5.0 && m.world_saw.is_some_and(|s| secs(s, at) <= 6.0) => {}
                _ => fail(format!(
                    "the silent cut is not recorded as a loss within 5 s (world loss at {}, shown {})",
                    fmt_rel(loss_at, at),
                    fmt_rel(m.world_saw, at)
                )),
            }
        }
        let trainers: Vec<&str> = m
            .sidecars
            .values()
            .filter(|s| time_of(&s["training"]["since"]).is_some_and(|t| t >= at))
            .map(|s| s["training"]["seen_by"].as_str().unwrap_or("-"))
            .collect();
        if trainers.is_empty() || trainers.iter().any(|s| *s != "collective-traffic") {
            fail(format!(
                "the resumption is not seen by collective-traffic on every training pod (seen_by {trainers:?})"
            ));
        }
        match resumed {
            Some(r) if (-0.1..=2.0).contains(&secs(r, first)) => {}
            _ => fail(format!(
                "resumedAt {} vs the first step, not within [-0.1 s, +2 s]",
                fmt_rel(resumed, first)
            )),
        }
        match m.running_seen {
            Some(r) if secs(r, first) <= 5.0 => {}
            _ => fail(format!(
                "phase Running {} after the first step, not within 5 s",
                fmt_rel(m.running_seen, first)
            )),
        }
    }
}

fn real_node_run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The direct children of `pid` (every thread's).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out
}
