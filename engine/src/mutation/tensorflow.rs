//! The TensorFlow world (`trainwire.dev/framework: tensorflow`): `TF_CONFIG`
//! for `MultiWorkerMirroredStrategy` instead of torchrun's `PET_*` env.
//!
//! A StatefulSet's pods share one template, and `TF_CONFIG` differs per pod
//! only in the task index. Kubernetes expands `$(VAR)` in a value from an
//! *earlier* entry of the same container's env, so `NODE_RANK` (the pod
//! index, from the downward API) goes first and `TF_CONFIG` refers to it:
//!
//! ```text
//! NODE_RANK  <- metadata.labels['apps.kubernetes.io/pod-index']
//! TF_CONFIG  =  {"cluster":{"worker":["<name>-0.<svc>.<ns>.svc.<domain>:<port>",...]},
//!               "task":{"type":"worker","index":$(NODE_RANK)}}
//! ```
//!
//! The port is `trainwire.dev/rdzv-port` (default 29500): each worker's
//! TensorFlow server listens there. MultiWorkerMirroredStrategy has no
//! elastic agent and no spare workers: an elastic `nnodes` is refused.
//! Measured with TensorFlow 2.21 (docs/recovery.md): when a worker is lost,
//! the survivors' collectives fail within seconds (its coordination service
//! stops hearing the lost task's heartbeats) and their trainer exits; a
//! restarted worker waits for the whole cluster, so the world restarts
//! together from the last checkpoint once the replacement is up.

use k8s_openapi::api::core::v1::Container;

use super::annotations::{self, Annotations, Nnodes};
use super::injection::{Ctx, Refusal};
use super::rendezvous::World;
use super::trainer::{self, Conflict, Desired};
use super::workload::Shape;
use crate::policy::{self, Framework, PeerLossAction};

/// The env TensorFlow's distribution strategies read.
pub const TF_CONFIG: &str = "TF_CONFIG";
/// The pod index the task index is expanded from.
pub const NODE_RANK: &str = "NODE_RANK";
/// The most workers a `TF_CONFIG` lists: every worker's address is in every
/// pod's env (about 80 bytes each), and a pod template has a size limit.
pub const MAX_WORKERS: u32 = 1024;

/// The framework: the annotation against the policy's `framework`.
pub fn framework(ctx: &mut Ctx<'_>, ann: &Annotations) -> Result<Framework, Refusal> {
    let source = format!("annotation {}", annotations::FRAMEWORK);
    let r = policy::resolve(
        ctx.profile,
        "framework",
        &ctx.profile.framework,
        ann.framework.map(|f| (f, source.as_str())),
    )?;
    if let Some(w) = r.warning {
        ctx.warn(w);
    }
    Ok(r.value)
}

/// What a TensorFlow world cannot have: an elastic range is refused; the
/// torchrun-only annotations are ignored with a warning.
pub fn check(ctx: &mut Ctx<'_>, ann: &Annotations, world: &World) -> Result<(), Refusal> {
    if let Some(n @ Nnodes::Elastic { .. }) = world.nnodes {
        return Err(Refusal::Annotation {
            annotation: annotations::NNODES.to_string(),
            value: n.to_string(),
            reason: format!(
                "an elastic world needs torchrun's rendezvous, and {} is tensorflow: MultiWorkerMirroredStrategy runs a fixed set of workers",
                annotations::FRAMEWORK
            ),
            accepted: format!(
                "a fixed node count such as \"{}\" with framework tensorflow, or framework pytorch (torchrun) for MIN:MAX",
                n.max()
            ),
        });
    }
    if let Some(n) = world.nnodes
        && n.max() > MAX_WORKERS
    {
        return Err(Refusal::Annotation {
            annotation: annotations::NNODES.to_string(),
            value: n.to_string(),
            reason: format!(
                "TF_CONFIG lists every worker in every pod's env; more than {MAX_WORKERS} workers do not fit a pod template"
            ),
            accepted: format!("a fixed node count from 1 to {MAX_WORKERS}"),
        });
    }
    if ann.on_peer_loss == Some(PeerLossAction::RestartWorkers) {
        return Err(Refusal::Annotation {
            annotation: annotations::ON_PEER_LOSS.to_string(),
            value: "restart-workers".to_string(),
            reason: "a TensorFlow trainer has no torchrun agent whose workers could be restarted on their own".to_string(),
            accepted: "auto or restart-agent (the trainer process is killed and its container restarts), or none".to_string(),
        });
    }
    let torchrun_only = [
        (annotations::RDZV_BACKEND, ann.rdzv_backend.is_some()),
        (annotations::NPROC_PER_NODE, ann.nproc_per_node.is_some()),
        (
            annotations::MAX_RESTARTS,
            ann.max_restarts != annotations::DEFAULT_MAX_RESTARTS,
        ),
    ];
    for (name, set) in torchrun_only {
        if set {
            ctx.warn(format!(
                "annotation {name} is for torchrun and is ignored with {}: tensorflow",
                annotations::FRAMEWORK
            ));
        }
    }
    Ok(())
}

/// The `TF_CONFIG` value: every worker's address, and the task index as a
/// `$(NODE_RANK)` reference that Kubernetes expands per pod.
pub fn tf_config(shape: &Shape, workers: u32, port: u16, cluster_domain: &str) -> String {
    let hosts = (0..workers)
        .map(|i| format!("\"{}:{port}\"", shape.host(&i.to_string(), cluster_domain)))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "{{\"cluster\":{{\"worker\":[{hosts}]}},\"task\":{{\"type\":\"worker\",\"index\":$({NODE_RANK})}}}}"
    )
}

/// The trainer's env for a TensorFlow world: `NODE_RANK` first, then
/// `TF_CONFIG` (none while a StatefulSet is paused at 0 replicas: its size
/// is unknown).
pub fn desired(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    world: &World,
    c: &Container,
) -> Result<Vec<Desired>, Refusal> {
    let rank_why = format!("the pod's index, {}", shape.rank_field);
    let mut out = vec![Desired::field(NODE_RANK, shape.rank_field, rank_why)];
    let Some(nnodes) = world.nnodes else {
        return Ok(out);
    };
    // The reference expands only from an earlier entry: trainwire's entries
    // go first, the manifest's after them.
    if trainer::sets(c, NODE_RANK) && !trainer::sets(c, TF_CONFIG) {
        return Err(Refusal::Workload(format!(
            "env {NODE_RANK} of container {:?} is set in the manifest, but with {}: tensorflow trainwire sets it from the pod index and {TF_CONFIG} refers to it as $({NODE_RANK}), which Kubernetes expands only from an earlier entry; remove {NODE_RANK} from the manifest, or set {TF_CONFIG} yourself",
            c.name,
            annotations::FRAMEWORK
        )));
    }
    let size_why = match ann.nnodes {
        Some(_) => format!("annotation {}", annotations::NNODES),
        None => shape.size_field.to_string(),
    };
    out.push(Desired::value(
        TF_CONFIG,
        tf_config(
            shape,
            nnodes.max(),
            ann.rdzv_port,
            ctx.profile.cluster_domain(),
        ),
        format!(
            "every worker's own DNS name ({size_why}) at port {} (annotation {}), the task index from $({NODE_RANK})",
            ann.rdzv_port,
            annotations::RDZV_PORT
        ),
        Conflict::ManifestWins,
    ));
    Ok(out)
}

/// The sidecar's action for a TensorFlow world. `auto` is `restart-agent`:
/// on a confirmed loss, the trainer process (found by
/// `TRAINWIRE_AGENT_MATCH`, see [`agent_match`]) is SIGKILLed once if it
/// still runs from before the loss, so its container exits and the world
/// restarts from the checkpoint with the replacement (TensorFlow has no
/// agent that could re-form the world in place).
pub fn sidecar_action(action: PeerLossAction) -> PeerLossAction {
    match action {
        PeerLossAction::Auto => PeerLossAction::RestartAgent,
        other => other,
    }
}

/// What identifies the trainer process for the sidecar
/// (`TRAINWIRE_AGENT_MATCH`): the first Python script (`*.py`) or module
/// (`-m name`) of the container's command and arguments, also inside a
/// shell's `-c` string. `None` when the command names neither (the image's
/// entrypoint).
pub fn agent_match(c: &Container) -> Option<String> {
    let words: Vec<&str> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .flat_map(|a| a.split_whitespace())
        .take(256)
        .collect();
    for (i, w) in words.iter().enumerate() {
        let w = w.trim_matches(|ch| ch == '"' || ch == '\'' || ch == ';');
        if w.ends_with(".py") && w.len() > 3 {
            let base = w.rsplit('/').next().unwrap_or(w);
            return Some(base.to_string());
        }
        if w == "-m"
            && let Some(module) = words.get(i + 1)
        {
            return Some((*module).to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutation::{Mutation, Outcome, mutate, patch::apply_checked};
    use crate::policy::{Enforce, Profile, Setting};
    use serde_json::{Value, json};

    fn sts(annotations: Value, env: Value) -> Value {
        let mut ann = json!({
            "trainwire.dev/inject": "true",
            "trainwire.dev/framework": "tensorflow",
        });
        for (k, v) in annotations.as_object().into_iter().flatten() {
            ann[k] = v.clone();
        }
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "tf", "namespace": "ml", "annotations": ann},
            "spec": {
                "replicas": 3, "serviceName": "tf-svc",
                "selector": {"matchLabels": {"app": "tf"}},
                "template": {
                    "metadata": {"labels": {"app": "tf"}},
                    "spec": {"containers": [{
                        "name": "trainer", "image": "tf",
                        "command": ["python", "/app/train_tf.py"],
                        "env": env,
                    }]}
                }
            }
        })
    }

    fn mutated(obj: &Value, profile: &Profile) -> Mutation {
        match mutate(obj, None, profile) {
            Ok(Outcome::Mutated(m)) => m,
            other => panic!("expected a mutation, got {other:?}"),
        }
    }

    fn refused(obj: &Value, profile: &Profile) -> String {
        match mutate(obj, None, profile) {
            Err(r) => r.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn env<'a>(obj: &'a Value, list: &str) -> Vec<&'a Value> {
        obj.pointer(&format!("/spec/template/spec/{list}/0/env"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .collect()
    }

    fn names(obj: &Value, list: &str) -> Vec<String> {
        env(obj, list)
            .iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn value(obj: &Value, list: &str, name: &str) -> Option<String> {
        env(obj, list)
            .into_iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str().map(str::to_string))
    }

    /// What the kubelet does with `$(VAR)` in a value (enough for these
    /// tests: references to literal or already-expanded earlier entries).
    fn expand(value: &str, earlier: &[(String, String)]) -> String {
        let mut out = value.to_string();
        for (k, v) in earlier {
            out = out.replace(&format!("$({k})"), v);
        }
        out
    }

    #[test]
    fn tf_config_lists_every_worker_and_expands_to_each_pods_index() {
        let input = sts(json!({"trainwire.dev/rdzv-port": "12345"}), json!([]));
        let m = mutated(&input, &Profile::default());
        let names = names(&m.object, "containers");
        let rank = names
            .iter()
            .position(|n| n == NODE_RANK)
            .expect("NODE_RANK");
        let conf = names
            .iter()
            .position(|n| n == TF_CONFIG)
            .expect("TF_CONFIG");
        assert!(
            rank < conf,
            "NODE_RANK must come before TF_CONFIG: {names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("PET_") || n == "MASTER_ADDR" || n.starts_with("TORCH_")),
            "no torchrun env for tensorflow: {names:?}"
        );
        let raw = value(&m.object, "containers", TF_CONFIG).expect("TF_CONFIG value");
        for index in 0..3u32 {
            let expanded = expand(&raw, &[(NODE_RANK.to_string(), index.to_string())]);
            let conf: Value =
                serde_json::from_str(&expanded).expect("TF_CONFIG is JSON once expanded");
            assert_eq!(conf["task"], json!({"type": "worker", "index": index}));
            assert_eq!(
                conf["cluster"]["worker"],
                json!([
                    "tf-0.tf-svc.ml.svc.cluster.local:12345",
                    "tf-1.tf-svc.ml.svc.cluster.local:12345",
                    "tf-2.tf-svc.ml.svc.cluster.local:12345",
                ])
            );
        }
        // The sidecar: no rendezvous host, the trainer found by its script,
        // auto is restart-agent.
        assert_eq!(
            value(&m.object, "initContainers", "TRAINWIRE_RDZV_HOST_RANK").as_deref(),
            Some("none")
        );
        assert_eq!(
            value(&m.object, "initContainers", "TRAINWIRE_RDZV_PORT"),
            None
        );
        assert_eq!(
            value(&m.object, "initContainers", "TRAINWIRE_AGENT_MATCH").as_deref(),
            Some("train_tf.py")
        );
        assert_eq!(
            value(&m.object, "initContainers", "TRAINWIRE_ON_PEER_LOSS").as_deref(),
            Some("restart-agent")
        );
        assert_eq!(
            value(&m.object, "initContainers", "TRAINWIRE_NNODES").as_deref(),
            Some("3")
        );
    }

    #[test]
    fn reinjection_changes_nothing_and_the_patch_gives_the_output() {
        let input = sts(json!({}), json!([{"name": "EPOCHS", "value": "3"}]));
        let m = mutated(&input, &Profile::default());
        assert_eq!(
            apply_checked(&input, &m.patch).expect("patch applies"),
            m.object
        );
        let again = mutated(&m.object, &Profile::default());
        assert!(again.patch.0.is_empty(), "{:?}", again.patch);
        // A change of the world size re-injects TF_CONFIG.
        let mut bigger = m.object.clone();
        bigger["spec"]["replicas"] = json!(4);
        let resized = mutated(&bigger, &Profile::default());
        let raw = value(&resized.object, "containers", TF_CONFIG).expect("TF_CONFIG");
        assert!(raw.contains("tf-3.tf-svc"), "{raw}");
        assert_eq!(
            names(&resized.object, "containers")
                .iter()
                .filter(|n| *n == TF_CONFIG)
                .count(),
            1
        );
    }

    #[test]
    fn a_users_tf_config_wins_with_a_warning() {
        let input = sts(json!({}), json!([{"name": "TF_CONFIG", "value": "{}"}]));
        let m = mutated(&input, &Profile::default());
        assert_eq!(
            value(&m.object, "containers", TF_CONFIG).as_deref(),
            Some("{}")
        );
        assert!(
            m.warnings
                .iter()
                .any(|w| w.contains("TF_CONFIG") && w.contains("kept")),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn a_users_node_rank_without_tf_config_is_refused() {
        let input = sts(json!({}), json!([{"name": "NODE_RANK", "value": "0"}]));
        let e = refused(&input, &Profile::default());
        assert!(
            e.contains("NODE_RANK") && e.contains("$(NODE_RANK)") && e.contains("remove"),
            "{e}"
        );
    }

    #[test]
    fn elastic_ranges_and_restart_workers_are_refused_with_what_to_do() {
        let e = refused(
            &sts(json!({"trainwire.dev/nnodes": "2:4"}), json!([])),
            &Profile::default(),
        );
        assert!(
            e.contains("trainwire.dev/nnodes")
                && e.contains("\"2:4\"")
                && e.contains("fixed node count"),
            "{e}"
        );
        let e = refused(
            &sts(
                json!({"trainwire.dev/on-peer-loss": "restart-workers"}),
                json!([]),
            ),
            &Profile::default(),
        );
        assert!(
            e.contains("trainwire.dev/on-peer-loss") && e.contains("restart-agent"),
            "{e}"
        );
        let e = refused(
            &sts(json!({"trainwire.dev/framework": "tf"}), json!([])),
            &Profile::default(),
        );
        assert!(
            e.contains("trainwire.dev/framework") && e.contains("pytorch, tensorflow"),
            "{e}"
        );
    }

    #[test]
    fn the_policy_sets_the_framework_per_profile() {
        let mut input = sts(json!({}), json!([]));
        input["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove("trainwire.dev/framework");
        let profile = Profile {
            framework: Setting::default_value(Framework::TensorFlow),
            ..Profile::default()
        };
        let m = mutated(&input, &profile);
        assert!(value(&m.object, "containers", TF_CONFIG).is_some());
        // Enforced: a workload cannot annotate it away.
        let mut pytorch = input.clone();
        pytorch["metadata"]["annotations"]["trainwire.dev/framework"] = json!("pytorch");
        let enforced = Profile {
            framework: Setting {
                value: Framework::TensorFlow,
                enforce: Enforce::Refuse,
            },
            ..Profile::default()
        };
        let e = refused(&pytorch, &enforced);
        assert!(e.contains("framework"), "{e}");
        // The default is pytorch.
        let m = mutated(&pytorch, &Profile::default());
        assert!(value(&m.object, "containers", "PET_NNODES").is_some());
        assert!(value(&m.object, "containers", TF_CONFIG).is_none());
    }

    fn container(command: &[&str], args: &[&str]) -> Container {
        let v = |s: &[&str]| (!s.is_empty()).then(|| s.iter().map(|x| x.to_string()).collect());
        Container {
            name: "trainer".into(),
            command: v(command),
            args: v(args),
            ..Default::default()
        }
    }

    #[test]
    fn the_agent_is_the_script_or_module_the_command_runs() {
        let cases: &[(&[&str], &[&str], Option<&str>)] = &[
            (&["python3", "/app/train_tf.py"], &[], Some("train_tf.py")),
            (
                &["python"],
                &["-u", "train.py", "--epochs=3"],
                Some("train.py"),
            ),
            (
                &["/bin/bash", "-c"],
                &["cd /w && python mnist_tf.py --x"],
                Some("mnist_tf.py"),
            ),
            (&["python", "-m", "trainer.task"], &[], Some("trainer.task")),
            (&["/entrypoint"], &[], None),
            (&[], &[], None),
            (&["python", ".py"], &[], None),
        ];
        for (command, args, want) in cases {
            assert_eq!(
                agent_match(&container(command, args)).as_deref(),
                *want,
                "{command:?} {args:?}"
            );
        }
    }
}
