//! The trainwire sidecar as a native sidecar: an init container with
//! `restartPolicy: Always`, configured only by `TRAINWIRE_*` env (names from
//! the sidecar crate, so the two programs cannot drift apart).
//!
//! Every field the apiserver would default is written explicitly, so the
//! stored template equals what trainwire wrote and a re-injection recognises
//! its own sidecar.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, HTTPGetAction, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use trainwire_contract::env;

use super::annotations::{self, Annotations};
use super::fingerprint::fingerprint;
use super::injection::{Ctx, Refusal};
use super::rendezvous::World;
use super::trainer::field_env;
use super::volumes::Checkpoint;
use super::workload::Shape;
use crate::policy::{self, Framework, PeerLossAction, RdzvBackend};

pub const NAME: &str = "trainwire-sidecar";

/// Whether the sidecar is injected: the annotation against the policy.
pub fn enabled(ctx: &mut Ctx<'_>, ann: &Annotations) -> Result<bool, Refusal> {
    let source = format!("annotation {}", annotations::SIDECAR);
    let r = policy::resolve(
        ctx.profile,
        "sidecar.enabled",
        &ctx.profile.sidecar.enabled,
        ann.sidecar.map(|b| (b, source.as_str())),
    )?;
    if let Some(w) = r.warning {
        ctx.warn(w);
    }
    Ok(r.value)
}

fn default_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q("10m")),
            ("memory".to_string(), q("16Mi")),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), q("64Mi"))])),
        ..Default::default()
    }
}

fn plain(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        value_from: None,
    }
}

/// Who the sidecar runs as, so that it can signal the trainer the way a
/// container runtime really runs it.
///
/// Kubernetes sets no ambient capabilities: a non-root process loses every
/// added capability at exec, so a sidecar running as some UID with `add:
/// [KILL]` cannot signal a trainer of another UID (EPERM). Signalling a
/// process of the same UID needs no capability at all. Hence:
///
/// - the trainer's UID is known (its container's `runAsUser`, else the pod's):
///   the sidecar runs as that UID and group with every capability dropped;
///   under a non-root UID also `runAsNonRoot` and the `RuntimeDefault`
///   seccomp profile, which Pod Security `restricted` asks for;
/// - it is not known (the image's user: root in most PyTorch images): the
///   sidecar runs as UID 0 with every capability dropped but `KILL`, which
///   reaches a trainer of any UID (Pod Security `baseline`);
/// - the policy pins `sidecar.runAsUser`: that UID, with `KILL` only as root;
///   a warning when it cannot signal the trainer.
///
/// Always `allowPrivilegeEscalation: false` and a read-only root filesystem.
pub fn identity(ctx: &mut Ctx<'_>, spec: &PodSpec, trainer: usize) -> SecurityContext {
    let container = spec.containers[trainer].security_context.as_ref();
    let pod = spec.security_context.as_ref();
    let trainer_uid = container
        .and_then(|s| s.run_as_user)
        .or_else(|| pod.and_then(|p| p.run_as_user));
    let trainer_gid = container
        .and_then(|s| s.run_as_group)
        .or_else(|| pod.and_then(|p| p.run_as_group));
    // `runAsNonRoot` resolves like the UID: the container's, else the pod's.
    let non_root = match container.and_then(|s| s.run_as_non_root) {
        Some(v) => Some((v, "the trainer container")),
        None => pod.and_then(|p| p.run_as_non_root).map(|v| (v, "the pod")),
    };
    let pinned = ctx.profile.sidecar.run_as_user;
    let (uid, gid) = match pinned {
        Some(uid) => {
            let can_signal = uid == 0 || trainer_uid == Some(uid);
            if !can_signal {
                ctx.warn(format!(
                    "policy profile {:?} runs the sidecar as UID {uid}, the trainer as {}: it can report a lost peer, not restart",
                    ctx.profile.name,
                    trainer_uid.map_or("the image's user".to_string(), |u| format!("UID {u}"))
                ));
            }
            (uid, ctx.profile.sidecar.run_as_group.or(trainer_gid))
        }
        None => match trainer_uid {
            Some(uid) => (uid, trainer_gid),
            None => (0, None),
        },
    };
    // Root needs KILL for a trainer of another (or an unknown) UID; the
    // same UID needs no capability.
    let kill = uid == 0 && trainer_uid != Some(0);
    if uid == 0
        && let Some((true, whose)) = non_root
    {
        ctx.warn(format!(
            "{whose} sets runAsNonRoot but no runAsUser: the sidecar is root, refused by restricted Pod Security"
        ));
    }
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: kill.then(|| vec!["KILL".to_string()]),
        }),
        run_as_user: Some(uid),
        run_as_group: gid,
        run_as_non_root: Some(uid != 0),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The sidecar's startupProbe: every second, for up to a minute.
pub const STARTUP_PERIOD_SECONDS: i32 = 1;
pub const STARTUP_FAILURE_THRESHOLD: i32 = 60;

/// Add the sidecar (first among the init containers, so it runs while the
/// others do) and `shareProcessNamespace: true` so it can signal the trainer.
pub fn inject(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    world: &World,
    checkpoint: Option<&Checkpoint>,
    spec: &mut PodSpec,
    trainer: usize,
) -> Result<(), Refusal> {
    let profile = ctx.profile;
    let source = format!("annotation {}", annotations::ON_PEER_LOSS);
    let action = policy::resolve(
        profile,
        "sidecar.onPeerLoss",
        &profile.sidecar.on_peer_loss,
        ann.on_peer_loss.map(|a| (a, source.as_str())),
    )?;
    if let Some(w) = action.warning {
        ctx.warn(w);
    }
    let tensorflow = world.framework == Framework::TensorFlow;
    let image = policy::resolve(profile, "sidecar.image", &profile.sidecar.image, None)?.value;

    let mut vars = vec![
        field_env(env::POD_NAME, "metadata.name"),
        field_env(env::POD_NAMESPACE, "metadata.namespace"),
        field_env(env::POD_UID, "metadata.uid"),
        field_env(env::NODE_RANK, shape.rank_field),
        plain(env::SELECTOR, shape.selector.clone()),
        plain(
            env::PEER_HOSTS,
            shape.host("{i}", ctx.profile.cluster_domain()),
        ),
    ];
    if let Some(nnodes) = world.nnodes {
        vars.insert(4, plain(env::NNODES, nnodes.to_string()));
    }
    // c10d and static run the store in pod 0; etcd-v2's store and a
    // dedicated one are outside the training pods, so no peer's loss
    // strands the local agent. TensorFlow has no rendezvous store: no
    // peer's loss is special.
    let external_store = world.backend == RdzvBackend::EtcdV2 || world.store_service.is_some();
    vars.push(plain(
        env::RDZV_HOST_RANK,
        if external_store || tensorflow {
            "none"
        } else {
            "0"
        },
    ));
    if world.spares > 0 {
        vars.push(plain(env::SPARES, world.spares.to_string()));
    }
    // The rendezvous store's port, pod 0's or the dedicated store's: its
    // connections are not the collective's (an agent's keep-alive every
    // second would look like training steps), and a replacement of pod 0
    // is there for the survivors' restarted torchrun only once its store
    // accepts connections.
    if let Some(port) = ctx.status.rdzv_port.filter(|_| !tensorflow) {
        vars.push(plain(env::RDZV_PORT, port.to_string()));
    }
    vars.push(plain(
        env::HEALTH_PORT,
        env::DEFAULT_HEALTH_PORT.to_string(),
    ));
    if let Some(cp) = checkpoint {
        vars.push(plain(env::CHECKPOINT_DIR, cp.path.clone()));
        vars.push(plain(env::CHECKPOINT_MAX_AGE, cp.max_age.to_string()));
    }
    let sidecar_action = if tensorflow {
        super::tensorflow::sidecar_action(action.value)
    } else {
        action.value
    };
    vars.push(plain(env::ON_PEER_LOSS, sidecar_action.as_str()));
    // A hung world: set only when it differs from the sidecar's own
    // default (the contract's), so workloads that leave it are unchanged.
    let stall_source = format!("annotation {}", annotations::STALL_TIMEOUT);
    let stall_timeout = policy::resolve(
        profile,
        "sidecar.stallTimeout",
        &profile.sidecar.stall_timeout,
        ann.stall_timeout.map(|t| (t, stall_source.as_str())),
    )?;
    let on_stall_source = format!("annotation {}", annotations::ON_STALL);
    let on_stall = policy::resolve(
        profile,
        "sidecar.onStall",
        &profile.sidecar.on_stall,
        ann.on_stall.map(|a| (a, on_stall_source.as_str())),
    )?;
    let window_source = format!("annotation {}", annotations::LOSS_WINDOW);
    let loss_window = policy::resolve(
        profile,
        "sidecar.lossWindow",
        &profile.sidecar.loss_window,
        ann.loss_window.map(|w| (w, window_source.as_str())),
    )?;
    for w in [stall_timeout.warning, on_stall.warning, loss_window.warning]
        .into_iter()
        .flatten()
    {
        ctx.warn(w);
    }
    if stall_timeout.value != trainwire_contract::StallTimeout::default() {
        vars.push(plain(env::STALL_TIMEOUT, stall_timeout.value.to_string()));
    }
    if on_stall.value != trainwire_contract::StallAction::RestartWorkers {
        vars.push(plain(env::ON_STALL, on_stall.value.as_str()));
    }
    // Likewise the loss window: the heartbeats and the confirmation of a
    // silent loss derive from it in the sidecar.
    if loss_window.value != trainwire_contract::LossWindow::default() {
        vars.push(plain(env::LOSS_WINDOW, loss_window.value.to_string()));
    }
    if tensorflow && !profile.sidecar.env.contains_key(env::AGENT_MATCH) {
        match super::tensorflow::agent_match(&spec.containers[trainer]) {
            Some(pattern) => vars.push(plain(env::AGENT_MATCH, pattern)),
            None if action.value != PeerLossAction::None => ctx.warn(format!(
                "tensorflow: no Python script in the trainer's command, the sidecar cannot restart it; set {}",
                env::AGENT_MATCH
            )),
            None => {}
        }
    }
    for (k, v) in &profile.sidecar.env {
        if vars.iter().any(|e| &e.name == k) {
            ctx.warn(format!(
                "policy profile {:?} sidecar.env {k} is ignored: trainwire sets it per workload",
                profile.name
            ));
        } else {
            vars.push(plain(k, v.clone()));
        }
    }

    let security = identity(ctx, spec, trainer);
    let mounts = checkpoint.map(|cp| {
        vec![VolumeMount {
            name: cp.volume.clone(),
            mount_path: cp.path.clone(),
            read_only: Some(true),
            ..Default::default()
        }]
    });
    let port = i32::from(env::DEFAULT_HEALTH_PORT);
    let http_get = |path: &str| HTTPGetAction {
        path: Some(path.to_string()),
        port: IntOrString::Int(port),
        scheme: Some("HTTP".to_string()),
        ..Default::default()
    };
    let sidecar = Container {
        name: NAME.to_string(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".to_string()),
        restart_policy: Some("Always".to_string()),
        env: Some(vars),
        ports: Some(vec![ContainerPort {
            name: Some("trainwire".to_string()),
            container_port: port,
            protocol: Some("TCP".to_string()),
            ..Default::default()
        }]),
        // The kubelet starts the trainer as soon as a native sidecar without
        // a startupProbe has started (a liveness probe does not hold it
        // back): this one holds it until the sidecar serves `/readyz`, which
        // it does once its detection has started. Probed every second so
        // the trainer waits no longer than it must; a minute of failures
        // (the sidecar's own API access check takes at most 10 s) before the
        // kubelet restarts the sidecar.
        startup_probe: Some(Probe {
            http_get: Some(http_get("/readyz")),
            period_seconds: Some(STARTUP_PERIOD_SECONDS),
            timeout_seconds: Some(1),
            success_threshold: Some(1),
            failure_threshold: Some(STARTUP_FAILURE_THRESHOLD),
            ..Default::default()
        }),
        liveness_probe: Some(Probe {
            http_get: Some(http_get("/healthz")),
            initial_delay_seconds: Some(10),
            period_seconds: Some(10),
            timeout_seconds: Some(2),
            success_threshold: Some(1),
            failure_threshold: Some(6),
            ..Default::default()
        }),
        resources: Some(
            profile
                .sidecar
                .resources
                .clone()
                .unwrap_or_else(default_resources),
        ),
        security_context: Some(security),
        volume_mounts: mounts,
        termination_message_path: Some("/dev/termination-log".to_string()),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Default::default()
    };

    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    if inits.iter().any(|c| c.name == NAME) {
        ctx.warn(format!(
            "init container {NAME:?} was not written by trainwire: kept as is; remove it to get trainwire's sidecar"
        ));
    } else {
        ctx.status
            .init_containers
            .insert(NAME.to_string(), fingerprint(&sidecar));
        ctx.status.sidecar_port = Some(env::DEFAULT_HEALTH_PORT);
        inits.insert(0, sidecar);
    }

    // With the store off the training pods there is no host to lose: in
    // `auto`, the sidecar restarts no trainer container.
    let restarts_trainers = !(external_store && action.value == PeerLossAction::Auto);
    if shape.kind == "Job"
        && spec.restart_policy.as_deref() == Some("Never")
        && action.value != PeerLossAction::None
        && restarts_trainers
    {
        ctx.warn(
            "restartPolicy Never: each trainer restart fails the pod and counts against backoffLimit; OnFailure restarts in place"
                .to_string(),
        );
    }

    if spec.host_pid == Some(true) {
        // The host PID namespace is already shared; Kubernetes refuses both.
    } else {
        match spec.share_process_namespace {
            None => {
                spec.share_process_namespace = Some(true);
                ctx.status.fields.push("shareProcessNamespace".to_string());
            }
            Some(true) => {}
            Some(false) => ctx.warn(
                "shareProcessNamespace: false (kept): the sidecar cannot see or restart the trainer, only report".to_string(),
            ),
        }
    }
    Ok(())
}
