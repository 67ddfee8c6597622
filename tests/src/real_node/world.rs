//! A training world on the real node, as a user runs one: an injected
//! StatefulSet of real `torchrun` + `examples/train.py` (CPU/gloo) in a
//! namespace of its own, a shared checkpoint claim (hostPath PV + PVC), a
//! dedicated rendezvous store or the store in pod 0, the sidecar's ClusterRole bound as
//! docs/deploy.md says; what the pods, their trainers' logs, the sidecars'
//! `/status` and the workload's `trainwire.dev/world` show.
//!
//! **A test device, not how users ship images**: the trainer image is
//! busybox and mount points only; a MutatingAdmissionPolicy
//! ([`super::images::host_python_policy`]) adds the host's Python prefix
//! (with torch) to every container of that image in namespaces labelled
//! [`HOST_PYTHON_LABEL`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::{Install, RealNode, TRAINER_IMAGE, parse_rfc3339, poll};

/// The StatefulSet's name (and its headless Service's).
pub const STS: &str = "train";
/// The label of the namespaces the host-Python policy applies to.
pub const HOST_PYTHON_LABEL: &str = "trainwire.test/host-python";

/// Whether `test` can run: a real node and PyTorch (a failure under
/// `CI=true`, skipped otherwise).
pub fn require_node_and_torch(test: &str) -> bool {
    let torch = crate::Prerequisite::from_result(
        crate::torch::torch_version()
            .map_err(|why| format!("PyTorch is not importable ({why}); pip install torch")),
    );
    crate::require::require_all(test, [super::prerequisites(), torch])
}

/// Imports the trainer image and applies the host-Python policy: once per
/// node, before [`World::create`].
pub fn prepare_trainer(node: &RealNode) -> Result<(), String> {
    let prefix = super::images::python_prefix()?;
    let archive = super::images::trainer_image(&node.dir().join("images"), &prefix)
        .map_err(|e| format!("trainer image: {e}"))?;
    node.import_image(&archive, TRAINER_IMAGE)?;
    node.apply(&super::images::host_python_policy(
        &prefix,
        HOST_PYTHON_LABEL,
    ))
    .map_err(|e| format!("host Python policy: {e}"))
}

/// What kind of world: who the trainer runs as, how many hot spares, where
/// the rendezvous store runs, and the StatefulSet's own trainwire
/// annotations beside the defaults (`inject`, `nnodes: 2`, `checkpoint-pvc`).
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// `None`: root (the image's default); else `runAsUser`/`runAsGroup`
    /// and the pod's `fsGroup`.
    pub user: Option<u32>,
    pub spares: u32,
    /// The store in pod 0 (torchrun's default, trainwire's `rdzv-store`
    /// default) instead of `rdzv-store: dedicated`.
    pub store_in_pod0: bool,
    /// `(annotation, value)` pairs.
    pub annotations: Vec<(&'static str, String)>,
}

/// One training world of 2 nodes (and its spares) in its own namespace.
pub struct World<'a> {
    pub node: &'a RealNode,
    pub ns: String,
    /// `root` or `uid<N>`: the label of its figures.
    pub user: String,
    pub shape: Shape,
}

pub fn secs(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

pub fn fmt_rel(t: Option<SystemTime>, base: SystemTime) -> String {
    t.map_or("never".to_string(), |t| format!("{:+.1} s", secs(t, base)))
}

pub fn time_of(v: &Value) -> Option<SystemTime> {
    v.as_str().and_then(parse_rfc3339)
}

impl<'a> World<'a> {
    /// Creates the namespace and the world, and waits until it trains
    /// (every pod Ready, 2 training, a step in the last 2 s).
    pub fn create(
        node: &'a RealNode,
        install: &Install,
        ns: &str,
        shape: Shape,
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
                node.dry_run_create(&probe)
                    .ok()?
                    .contains("host-python")
                    .then_some(())
            },
        )?;
        let script = crate::torch::train_script();
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
        let security = shape.user.map_or(String::new(), |uid| {
            format!("\n          securityContext:\n            runAsUser: {uid}\n            runAsGroup: {uid}")
        });
        let fs_group = shape.user.map_or(String::new(), |uid| {
            format!("\n      securityContext:\n        fsGroup: {uid}")
        });
        let mut annotations = String::new();
        if shape.spares > 0 {
            annotations.push_str(&format!("\n    trainwire.dev/spares: \"{}\"", shape.spares));
        }
        for (k, v) in &shape.annotations {
            annotations.push_str(&format!("\n    {k}: \"{v}\""));
        }
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
    trainwire.dev/nnodes: "2"{store}
    trainwire.dev/checkpoint-pvc: ckpt{annotations}
spec:
  serviceName: {STS}
  replicas: {replicas}
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
            store = if shape.store_in_pod0 {
                ""
            } else {
                "\n    trainwire.dev/rdzv-store: dedicated"
            },
            replicas = 2 + shape.spares,
        ))?;
        let world = World {
            node,
            ns: ns.to_string(),
            user: shape
                .user
                .map_or("root".to_string(), |uid| format!("uid{uid}")),
            shape,
        };
        world.wait_steady(Duration::from_secs(150))?;
        eprintln!(
            "{ns}: world training in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        Ok(world)
    }

    pub fn remove(&self) {
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
    pub fn pods(&self) -> BTreeMap<String, Value> {
        self.node
            .get_json(&["pods", "-n", &self.ns, "-l", &format!("app={STS}")])
            .ok()
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| Some((p["metadata"]["name"].as_str()?.to_string(), p)))
            .collect()
    }

    /// The workload's `trainwire.dev/world`.
    pub fn world(&self) -> Value {
        self.node
            .get_json(&["statefulset", "-n", &self.ns, STS])
            .ok()
            .and_then(|s| {
                serde_json::from_str(s["metadata"]["annotations"]["trainwire.dev/world"].as_str()?)
                    .ok()
            })
            .unwrap_or(Value::Null)
    }

    /// pod -> (agent pid, its workers), for pods whose trainer runs.
    pub fn agents(&self) -> BTreeMap<String, (i32, Vec<i32>)> {
        let mut out = BTreeMap::new();
        for pod in self.pods().keys() {
            let Ok(pid) = self.node.container_pid(&self.ns, pod, "trainer") else {
                continue;
            };
            out.insert(pod.clone(), (pid, workers(pid)));
        }
        out
    }

    /// The pod whose worker is torch's rank 0: the pod of the newest
    /// `start rank=0` line among the pods whose workers run (the trainer's
    /// own word, whether torchrun started its workers as processes of
    /// their own or from a forkserver, whose environment they show).
    pub fn rank0_pod(&self) -> Result<String, String> {
        let training: Vec<String> = self
            .agents()
            .into_iter()
            .filter(|(_, (_, w))| !w.is_empty())
            .map(|(pod, _)| pod)
            .collect();
        self.node
            .log_lines(&self.ns, STS, "trainer")
            .into_iter()
            .rev()
            .find(|(_, pod, l)| {
                training.contains(pod) && l.starts_with("[trainwire-train] start rank=0 ")
            })
            .map(|(_, pod, _)| pod)
            .ok_or_else(|| format!("{}: no pod runs torch's rank 0", self.ns))
    }

    /// Every pod Ready with its trainer's agent up for [`AGENT_SETTLED`]
    /// (a spare whose agent has just started still loads torch into its
    /// forkserver: a loss then costs that start-up, not the recovery's),
    /// two of them training (workers), a step in the last 2 s.
    pub fn wait_steady(&self, limit: Duration) -> Result<(), String> {
        let replicas = 2 + self.shape.spares as usize;
        poll(
            &format!(
                "{}: world of 2 + {} spare training",
                self.ns, self.shape.spares
            ),
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
                if ready < replicas {
                    return None;
                }
                let agents = self.agents();
                if agents.len() < replicas
                    || agents
                        .values()
                        .any(|(a, _)| process_age(*a).is_none_or(|age| age < AGENT_SETTLED))
                {
                    return None;
                }
                let training = agents.values().filter(|(_, w)| !w.is_empty()).count();
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
    pub fn since(&self, at: SystemTime) -> String {
        let mut out = self
            .node
            .kubectl(&["get", "pods", "-n", &self.ns, "-o", "wide"])
            .unwrap_or_default();
        for container in ["trainer", "trainwire-sidecar"] {
            let lines: Vec<_> = self
                .node
                .log_lines(&self.ns, STS, container)
                .into_iter()
                .filter(|(t, _, l)| *t >= at && !l.starts_with("[trainwire-train] step="))
                .collect();
            for (t, pod, line) in lines.iter().skip(lines.len().saturating_sub(60)) {
                out.push_str(&format!(
                    "{} {pod}/{container}: {line}\n",
                    fmt_rel(Some(*t), at)
                ));
            }
        }
        out
    }

    /// Every line of the trainers and the sidecars from `at` to `until`,
    /// steps aside, in time order: where the seconds after a loss went.
    pub fn timeline(&self, at: SystemTime, until: SystemTime) -> String {
        let mut lines: Vec<_> = ["trainer", "trainwire-sidecar"]
            .into_iter()
            .flat_map(|container| {
                self.node
                    .log_lines(&self.ns, STS, container)
                    .into_iter()
                    .filter(|(t, _, l)| {
                        *t >= at && *t <= until && !l.starts_with("[trainwire-train] step=")
                    })
                    .map(move |(t, pod, line)| (t, format!("{pod}/{container}: {line}")))
            })
            .collect();
        lines.sort_by_key(|(t, _)| *t);
        lines
            .iter()
            .map(|(t, line)| format!("{} {line}\n", fmt_rel(Some(*t), at)))
            .collect()
    }

    /// What a sidecar of `pod` has to go by, seen from the host (for a
    /// failure's message): its `/status` `trainer`, `training` and
    /// `progress`; the trainer's processes (pid, parent, UID, state,
    /// command); the handler's `node.json`; the pod's TCP sockets.
    pub fn inside(&self, name: &str) -> String {
        let mut out = format!("--- {name}\n");
        let pods = self.pods();
        if let Some(status) = pods.get(name).and_then(|p| self.sidecar_status(p)) {
            out.push_str(&format!(
                "sidecar: trainer {} training {} progress {}\n",
                status["trainer"], status["training"], status["progress"]
            ));
        }
        let Ok(agent) = self.node.container_pid(&self.ns, name, "trainer") else {
            out.push_str("no trainer process\n");
            return out;
        };
        let mut tree = vec![agent];
        tree.extend(descendants(agent));
        for pid in tree {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let after = stat.rsplit_once(") ").map_or("", |(_, a)| a);
            let fields: Vec<&str> = after.split_whitespace().collect();
            let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Uid:")
                        .map(|u| u.split_whitespace().next().unwrap_or("?").to_string())
                })
                .unwrap_or_default();
            let mut cmd = cmdline(pid);
            cmd.truncate(100);
            out.push_str(&format!(
                "pid {pid} ppid {} uid {uid} state {} start {} {cmd}\n",
                fields.get(1).unwrap_or(&"?"),
                fields.first().unwrap_or(&"?"),
                fields.get(19).unwrap_or(&"?"),
            ));
        }
        let env = std::fs::read(format!("/proc/{agent}/environ")).unwrap_or_default();
        let dir = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"TRAINWIRE_RENDEZVOUS_DIR="))
            .map(|d| String::from_utf8_lossy(d).to_string());
        if let Some(dir) = dir {
            let node = std::fs::read_to_string(format!("/proc/{agent}/root{dir}/node.json"));
            out.push_str(&format!(
                "node.json: {}\n",
                node.unwrap_or_else(|e| e.to_string())
            ));
        }
        if let Ok(netns) = self.node.pod_netns(&self.ns, name) {
            let ss = std::process::Command::new("nsenter")
                .args([&format!("--net={netns}"), "ss", "-tanie"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default();
            for line in ss.lines().take(40) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// (time, pod) of every training step line.
    pub fn steps(&self) -> Vec<(SystemTime, String)> {
        self.node
            .log_lines(&self.ns, STS, "trainer")
            .into_iter()
            .filter(|(_, _, l)| l.starts_with("[trainwire-train] step="))
            .map(|(t, pod, _)| (t, pod))
            .collect()
    }

    /// The newest checkpoint's step the trainer logged.
    pub fn latest_checkpoint(&self) -> Option<u64> {
        self.node
            .log_lines(&self.ns, STS, "trainer")
            .into_iter()
            .filter_map(|(_, _, l)| {
                l.strip_prefix("[trainwire-train] checkpoint step=")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .max()
    }

    /// The first step of workers started after `after` (when the trainer
    /// wrote it, its `at=`: the runtime stamps a line when it reads it, up
    /// to a second later on these two busy cores), and the `start` line of
    /// those workers.
    pub fn first_start_after(&self, after: SystemTime) -> Option<(SystemTime, String)> {
        let lines = self.node.log_lines(&self.ns, STS, "trainer");
        let (start, _, start_line) = lines
            .iter()
            .find(|(t, _, l)| *t > after && l.starts_with("[trainwire-train] start "))?;
        lines
            .iter()
            .find(|(t, _, l)| t >= start && l.starts_with("[trainwire-train] step="))
            .map(|(t, _, l)| (written_at(l).unwrap_or(*t), start_line.clone()))
    }

    /// The first step of workers started after `after`.
    pub fn first_step_after(&self, after: SystemTime) -> Option<SystemTime> {
        self.first_start_after(after).map(|(t, _)| t)
    }

    /// The sidecar's address in `pod` (`ip:port`).
    pub fn sidecar_addr(&self, pod: &Value) -> Option<String> {
        let ip = pod["status"]["podIP"].as_str()?;
        let port = pod["spec"]["initContainers"]
            .as_array()?
            .iter()
            .chain(pod["spec"]["containers"].as_array()?.iter())
            .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
            .find(|e| e["name"] == "TRAINWIRE_HEALTH_PORT")
            .and_then(|e| e["value"].as_str().map(str::to_string))
            .unwrap_or_else(|| "29600".to_string());
        Some(format!("{ip}:{port}"))
    }

    /// The sidecar's `/status` in `pod`.
    pub fn sidecar_status(&self, pod: &Value) -> Option<Value> {
        let status = crate::net::status(&self.sidecar_addr(pod)?);
        (!status.is_null()).then_some(status)
    }

    /// The Events of the namespace with this reason.
    pub fn events(&self, reason: &str) -> Vec<Value> {
        self.node
            .get_json(&[
                "events",
                "-n",
                &self.ns,
                &format!("--field-selector=reason={reason}"),
            ])
            .ok()
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
    }
}

/// How long a world's trainer agents must have run before a loss: torch
/// imported and the forkserver's preload done, on this kind of machine.
pub const AGENT_SETTLED: Duration = Duration::from_secs(8);

/// How long ago `pid` started (`/proc/<pid>/stat` field 22 against
/// `/proc/uptime`).
pub fn process_age(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(") ")?.1;
    let start_ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some(Duration::from_secs_f64(
        (uptime - start_ticks / ticks).max(0.0),
    ))
}

/// The direct children of `pid` (every thread's).
pub fn children(pid: i32) -> Vec<i32> {
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

/// Every process below `pid`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut next = children(pid);
    while let Some(p) = next.pop() {
        if out.len() >= 4096 {
            break;
        }
        next.extend(children(p));
        out.push(p);
    }
    out
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// torchrun's workers under `agent`: its children that torchrun started as
/// processes of their own (their environment has `RANK`), or the children
/// of its forkserver (warm workers).
pub fn workers(agent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for child in children(agent) {
        if cmdline(child).contains("forkserver") {
            out.extend(children(child));
        } else if std::fs::read(format!("/proc/{child}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv.starts_with(b"RANK=")))
        {
            out.push(child);
        }
    }
    out
}

/// Runs a program, its stderr in the error.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
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

/// When `examples/train.py` wrote a line: its `at=` (seconds since the
/// epoch).
pub fn written_at(line: &str) -> Option<SystemTime> {
    let event = crate::torch::TrainEvent::parse(line)?;
    let secs: f64 = event.get("at")?.parse().ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainer_line_says_when_it_was_written() {
        let at = written_at("[trainwire-train] step=3 loss=0.5 world_size=2 at=1764910088.350")
            .expect("a time");
        let want = std::time::UNIX_EPOCH + Duration::from_millis(1_764_910_088_350);
        let off = at.duration_since(want).unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_micros(1), "{at:?}");
        for line in [
            "[trainwire-train] step=3 loss=0.5",
            "[trainwire-train] step=3 at=-1",
            "[trainwire-train] step=3 at=1e400",
            "[trainwire-train] step=3 at=NaN",
            "other at=5",
        ] {
            assert_eq!(written_at(line), None, "{line}");
        }
    }
}
