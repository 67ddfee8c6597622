//! trainwire's rendezvous handler for torchrun (`trainwire-c10d`): torch's
//! c10d rendezvous that the pod's sidecar tells of a confirmed loss, so the
//! survivors restart their workers at once instead of waiting out torch's
//! keep-alive (docs/recovery.md).
//!
//! It applies to a PyTorch world on the c10d backend with the sidecar,
//! unless `trainwire.dev/rdzv-handler: torch` (or the policy's
//! `rdzvHandler`) says otherwise: with a dedicated store or the store in
//! pod 0 (there a lost pod 0 takes the store with it: the sidecar restarts
//! the survivors' agents against the replacement's store, and the handler
//! gives the restarted agent warm workers and a fast join); `static` and
//! `etcd-v2` are other handlers; TensorFlow has no torchrun.
//!
//! The pod gets an emptyDir at [`SHARED_DIR`] in the trainer, the sidecar
//! and an init container (the sidecar's image) that installs the handler's
//! Python files into it; the trainer gets them on `PYTHONPATH` (prepended to
//! the manifest's value), `PET_RDZV_BACKEND=trainwire-c10d`, and the channel
//! directory. For a plain `torchrun script.py` command, when
//! [`WARM_WORKERS_BY_DEFAULT`], also `PET_START_METHOD=forkserver` and
//! `PET_RUN_PATH=1`: the handler then starts a forkserver with torch
//! loaded, and new workers start in milliseconds instead of seconds.

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec, Volume, VolumeMount};

use super::annotations::{self, Annotations};
use super::fingerprint::fingerprint;
use super::injection::{Ctx, Refusal};
use super::rendezvous::World;
use super::trainer::{self, Conflict, Desired};
use crate::policy::{self, Framework, RdzvBackend, RdzvHandler};
use trainwire_contract::rendezvous::{CHANNEL_DIR, HANDLER_BACKEND, HANDLER_DIR, SHARED_DIR};
use trainwire_contract::{env, stall};

/// The init container that installs the handler.
pub const INIT_NAME: &str = "trainwire-rendezvous-handler";
/// The emptyDir shared by the init container, the sidecar and the trainer.
pub const VOLUME: &str = "trainwire-run";

/// Whether a plain `torchrun script.py` gets forkserver workers by default.
/// A forked worker's `/proc/<pid>/environ` is the forkserver's, so the
/// sidecar reads the torch rank torchrun gave it (the world status'
/// `torchRank`) from the handler's `node.json` instead, and follows workers
/// whose parent is the forkserver.
pub const WARM_WORKERS_BY_DEFAULT: bool = true;

const PYTHONPATH: &str = "PYTHONPATH";
const START_METHOD: &str = "PET_START_METHOD";
const RUN_PATH: &str = "PET_RUN_PATH";

/// What the handler gets in this pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handler {
    /// Forkserver workers with torch preloaded (a plain `torchrun x.py`).
    pub warm_workers: bool,
}

/// Whether the handler applies (see the module's text); `sidecar`: whether
/// the sidecar is injected.
pub fn resolve(
    ctx: &mut Ctx<'_>,
    ann: &Annotations,
    world: &World,
    sidecar: bool,
    c: &Container,
) -> Result<Option<Handler>, Refusal> {
    let profile = ctx.profile;
    let source = format!("annotation {}", annotations::RDZV_HANDLER);
    let resolved = policy::resolve(
        profile,
        "rdzvHandler",
        &profile.rdzv_handler,
        ann.rdzv_handler.map(|h| (h, source.as_str())),
    )?;
    if let Some(w) = resolved.warning {
        ctx.warn(w);
    }
    let fits =
        world.framework == Framework::PyTorch && world.backend == RdzvBackend::C10d && sidecar;
    if resolved.value != RdzvHandler::Trainwire || !fits {
        return Ok(None);
    }
    // The manifest's own backend wins: then torch's handler, as asked.
    if trainer::sets(c, "PET_RDZV_BACKEND") {
        return Ok(None);
    }
    if trainer::sets(c, PYTHONPATH) && trainer::literal(c, PYTHONPATH).is_none() {
        ctx.warn(format!(
            "env {PYTHONPATH} of container {:?} is a reference trainwire cannot merge: torch's own c10d rendezvous, a lost node is dropped by its keep-alive (seconds later); give it a literal value, or annotate {}: torch",
            c.name,
            annotations::RDZV_HANDLER
        ));
        return Ok(None);
    }
    Ok(Some(Handler {
        warm_workers: WARM_WORKERS_BY_DEFAULT && warm_workers(c),
    }))
}

/// Whether the trainer's command is a plain `torchrun [flags] script.py`
/// that `--run-path` and `--start-method forkserver` leave as it is: not a
/// module (`-m`), not `--no-python`, no start method or run path of its
/// own, no shell in between.
fn warm_workers(c: &Container) -> bool {
    if [START_METHOD, RUN_PATH, "PET_MODULE", "PET_NO_PYTHON"]
        .iter()
        .any(|v| trainer::sets(c, v))
    {
        return false;
    }
    let argv: Vec<&str> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
        .collect();
    let start = argv.iter().enumerate().find_map(|(i, a)| {
        if a.rsplit('/').next() == Some("torchrun") {
            Some(i + 1)
        } else if *a == "-m" && argv.get(i + 1) == Some(&"torch.distributed.run") {
            Some(i + 2)
        } else {
            None
        }
    });
    let Some(start) = start else {
        return false;
    };
    let rest = &argv[start..];
    let own = |a: &&str| {
        let flag = a.split('=').next().unwrap_or_default();
        matches!(
            flag,
            "-m" | "--module"
                | "--no-python"
                | "--no_python"
                | "--run-path"
                | "--run_path"
                | "--start-method"
                | "--start_method"
        )
    };
    // Flags before the script only: the script's own arguments are its own.
    let script = rest.iter().position(|a| a.ends_with(".py"));
    match script {
        Some(i) => !rest[..i].iter().any(own),
        None => false,
    }
}

/// The trainer's env for the handler.
pub fn desired(c: &Container, handler: Handler) -> Vec<Desired> {
    let mut out = vec![
        Desired::value(
            "PET_RDZV_BACKEND",
            HANDLER_BACKEND,
            format!(
                "trainwire's rendezvous handler: a lost node restarts the workers at once (annotation {}: torch for torch's own)",
                annotations::RDZV_HANDLER
            ),
            Conflict::ManifestWins,
        ),
        Desired::value(
            env::RENDEZVOUS_DIR,
            CHANNEL_DIR,
            "where the sidecar tells the rendezvous handler of a loss",
            Conflict::ManifestWins,
        ),
        Desired::value(
            stall::STACKS_SIGNAL_ENV,
            stall::STACKS_SIGNAL,
            "the signal on which the workers write their Python stacks (trainwire's sitecustomize), sent by the sidecar before it restarts a stalled world",
            Conflict::ManifestWins,
        ),
    ];
    match trainer::literal(c, PYTHONPATH).filter(|v| !v.is_empty()) {
        None => out.push(Desired::value(
            PYTHONPATH,
            HANDLER_DIR,
            "the rendezvous handler's files",
            Conflict::ManifestWins,
        )),
        Some(user) if user.split(':').any(|p| p == HANDLER_DIR) => {}
        Some(user) => out.push(Desired::value(
            PYTHONPATH,
            format!("{HANDLER_DIR}:{user}"),
            "the rendezvous handler's files before the manifest's path",
            Conflict::Replace,
        )),
    }
    if handler.warm_workers {
        out.push(Desired::value(
            START_METHOD,
            "forkserver",
            "new workers forked from a server with torch loaded",
            Conflict::ManifestWins,
        ));
        out.push(Desired::value(
            RUN_PATH,
            "1",
            "torchrun applies the start method only to a script it runs itself",
            Conflict::ManifestWins,
        ));
    }
    out
}

fn mount() -> VolumeMount {
    VolumeMount {
        name: VOLUME.to_string(),
        mount_path: SHARED_DIR.to_string(),
        ..Default::default()
    }
}

/// The shared emptyDir and its mount in the trainer.
pub fn volume(ctx: &mut Ctx<'_>, spec: &mut PodSpec, trainer: usize) {
    let v = Volume {
        name: VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    ctx.status
        .volumes
        .insert(VOLUME.to_string(), fingerprint(&v));
    spec.volumes.get_or_insert_with(Vec::new).push(v);
    let m = mount();
    ctx.status
        .volume_mounts
        .insert(SHARED_DIR.to_string(), fingerprint(&m));
    spec.containers[trainer]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(m);
}

/// The sidecar's side: its mount and the channel's variable; and the init
/// container that installs the handler, with the sidecar's image and
/// identity, before the sidecar.
pub fn sidecar(ctx: &mut Ctx<'_>, spec: &mut PodSpec, sidecar_name: &str) {
    let Some(inits) = spec.init_containers.as_mut() else {
        return;
    };
    let Some(at) = inits.iter().position(|c| c.name == sidecar_name) else {
        return;
    };
    let side = &mut inits[at];
    side.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount());
    side.env
        .get_or_insert_with(Vec::new)
        .push(k8s_openapi::api::core::v1::EnvVar {
            name: env::RENDEZVOUS_DIR.to_string(),
            value: Some(CHANNEL_DIR.to_string()),
            ..Default::default()
        });
    let install = Container {
        name: INIT_NAME.to_string(),
        image: side.image.clone(),
        image_pull_policy: side.image_pull_policy.clone(),
        command: Some(vec![
            "trainwire-sidecar".to_string(),
            "install-rendezvous-handler".to_string(),
            HANDLER_DIR.to_string(),
            "--channel".to_string(),
            CHANNEL_DIR.to_string(),
        ]),
        resources: side.resources.clone(),
        security_context: side.security_context.clone(),
        volume_mounts: Some(vec![mount()]),
        termination_message_path: Some("/dev/termination-log".to_string()),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Default::default()
    };
    // The sidecar's fingerprint covers its new mount and variable.
    let side_print = fingerprint(&*side);
    ctx.status
        .init_containers
        .insert(sidecar_name.to_string(), side_print);
    if inits.iter().any(|c| c.name == INIT_NAME) {
        ctx.warn(format!(
            "init container {INIT_NAME:?} was not written by trainwire: kept as is; remove it to get trainwire's rendezvous handler"
        ));
        return;
    }
    ctx.status
        .init_containers
        .insert(INIT_NAME.to_string(), fingerprint(&install));
    inits.insert(at, install);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(command: &[&str], args: &[&str]) -> Container {
        Container {
            name: "trainer".into(),
            command: (!command.is_empty()).then(|| command.iter().map(|s| s.to_string()).collect()),
            args: (!args.is_empty()).then(|| args.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_plain_torchrun_script_gets_warm_workers() {
        let yes: &[(&[&str], &[&str])] = &[
            (&["torchrun", "/app/train.py"], &[]),
            (
                &["torchrun"],
                &["--nproc-per-node", "2", "train.py", "-m", "x"],
            ),
            (&["python3", "-m", "torch.distributed.run", "train.py"], &[]),
            (&["/usr/local/bin/torchrun", "train.py"], &[]),
        ];
        for (cmd, args) in yes {
            assert!(warm_workers(&container(cmd, args)), "{cmd:?} {args:?}");
        }
        let no: &[(&[&str], &[&str])] = &[
            (&["torchrun", "-m", "pkg.train"], &[]),
            (&["torchrun", "--no-python", "train.py"], &[]),
            (&["torchrun", "--start-method=spawn", "train.py"], &[]),
            (&["sh", "-c", "torchrun train.py"], &[]),
            (&["python", "train.py"], &[]),
            (&[], &[]),
        ];
        for (cmd, args) in no {
            assert!(!warm_workers(&container(cmd, args)), "{cmd:?} {args:?}");
        }
        let mut c = container(&["torchrun", "train.py"], &[]);
        c.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: START_METHOD.into(),
            value: Some("spawn".into()),
            ..Default::default()
        }]);
        assert!(!warm_workers(&c));
    }

    #[test]
    fn pythonpath_is_prepended_to_the_manifests() {
        let value = |c: &Container| {
            desired(
                c,
                Handler {
                    warm_workers: false,
                },
            )
            .into_iter()
            .find(|d| d.var.name == PYTHONPATH)
            .and_then(|d| d.var.value)
        };
        let mut c = container(&["torchrun", "x.py"], &[]);
        assert_eq!(value(&c).as_deref(), Some(HANDLER_DIR));
        c.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: PYTHONPATH.into(),
            value: Some("/app/lib".into()),
            ..Default::default()
        }]);
        assert_eq!(value(&c), Some(format!("{HANDLER_DIR}:/app/lib")));
        c.env.as_mut().expect("env")[0].value = Some(format!("{HANDLER_DIR}:/app/lib"));
        assert_eq!(value(&c), None, "already there: left alone");
    }
}
