//! Volumes: the shared checkpoint PVC (trainer read-write, sidecar read-only,
//! `CHECKPOINT_DIR`), the extra shared PVCs of `trainwire.dev/volumes`, and a
//! memory-backed `/dev/shm` (PyTorch's DataLoader workers and NCCL use shared
//! memory; the container runtime's default is 64 MiB).

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, PersistentVolumeClaimVolumeSource, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::annotations::{self, Annotations};
use super::fingerprint::fingerprint;
use super::injection::{Ctx, Refusal};
use super::workload::Shape;
use crate::policy::{self, Enforce, PositiveDuration, Setting, ShmSize};

pub const CHECKPOINT_VOLUME: &str = "trainwire-checkpoint";
pub const SHM_VOLUME: &str = "trainwire-shm";
pub const SHM_PATH: &str = "/dev/shm";

/// The checkpoint directory as mounted in the trainer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub volume: String,
    pub path: String,
    pub max_age: PositiveDuration,
}

fn glob_match(pattern: &str, value: &str) -> bool {
    match globset::Glob::new(pattern) {
        Ok(g) => g.compile_matcher().is_match(value),
        Err(_) => pattern == value,
    }
}

fn is_plain(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', ']', '{', '}'])
}

fn substitute(pattern: &str, shape: &Shape) -> String {
    pattern
        .replace("{namespace}", &shape.namespace)
        .replace("{name}", &shape.name)
}

/// Refuse a claim the policy does not allow.
fn check_allowed(
    ctx: &Ctx<'_>,
    shape: &Shape,
    claim: &str,
    annotation: &str,
) -> Result<(), Refusal> {
    let Some(allowed) = ctx.profile.allowed_claim_patterns() else {
        return Ok(());
    };
    let matches = |p: &policy::ClaimPattern| match p {
        policy::ClaimPattern::Compiled(g) => g.is_match(claim),
        policy::ClaimPattern::Literal(l) => l == claim,
        policy::ClaimPattern::PerWorkload(p) => glob_match(&substitute(p, shape), claim),
    };
    if allowed.iter().any(matches) {
        return Ok(());
    }
    Err(Refusal::Policy {
        profile: ctx.profile.name.clone(),
        rule: "allowedClaims".to_string(),
        detail: format!(
            "annotation {annotation} names claim {claim:?}, which is not among the allowed claims {}",
            ctx.profile
                .allowed_claims
                .iter()
                .flatten()
                .map(|p| format!("{:?}", substitute(p, shape)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// A volume name derived from a claim name (a DNS-1123 label), unique in the pod.
fn volume_name(spec: &PodSpec, base: &str) -> String {
    let mut name: String = base
        .chars()
        .map(|ch| if ch == '.' { '-' } else { ch })
        .take(57)
        .collect();
    name = name.trim_end_matches('-').to_string();
    // Only a volume takes a name: a mount of a name the pod has no volume
    // for binds to trainwire's (another container mounting the checkpoint
    // claim by the name of the injected volume keeps it on re-injection).
    let taken = |n: &str| spec.volumes.iter().flatten().any(|v| v.name == n);
    if !taken(&name) {
        return name;
    }
    (2..)
        .map(|i| format!("{name}-{i}"))
        .find(|n| !taken(n))
        .unwrap_or(name)
}

/// Every mount and device of `volume` in the pod's containers and init
/// containers: (container name, path).
fn mounts_of<'a>(spec: &'a PodSpec, volume: &str) -> Vec<(&'a str, &'a str)> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| {
            let mounts = c
                .volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name == volume)
                .map(|m| m.mount_path.as_str());
            let devices = c
                .volume_devices
                .iter()
                .flatten()
                .filter(|d| d.name == volume)
                .map(|d| d.device_path.as_str());
            mounts.chain(devices).map(|p| (c.name.as_str(), p))
        })
        .collect()
}

fn claim_of(spec: &PodSpec, volume: &str) -> Option<String> {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.name == volume)
        .and_then(|v| v.persistent_volume_claim.as_ref())
        .map(|p| p.claim_name.clone())
}

fn mount_at<'a>(spec: &'a PodSpec, trainer: usize, path: &str) -> Option<&'a VolumeMount> {
    spec.containers[trainer]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path.trim_end_matches('/') == path)
}

/// A claim trainwire wants mounted in the trainer.
struct ClaimMount<'a> {
    claim: &'a str,
    path: &'a str,
    read_only: bool,
    /// Volume name to use when a new volume is needed.
    base_name: &'a str,
    /// Which annotation asked for it, for warnings.
    why: String,
}

/// Mount `claim` at `path` in the trainer, reusing the manifest's volume or
/// mount when it already has them. Returns the volume name mounted there.
fn mount_claim(
    ctx: &mut Ctx<'_>,
    spec: &mut PodSpec,
    trainer: usize,
    want: ClaimMount<'_>,
) -> String {
    let ClaimMount {
        claim,
        path,
        read_only,
        base_name,
        why,
    } = want;
    if let Some(m) = mount_at(spec, trainer, path) {
        let name = m.name.clone();
        let has = claim_of(spec, &name);
        if has.as_deref() != Some(claim) {
            ctx.warn(format!(
                "container {:?} mounts {} at {path} (kept), not claim {claim:?} ({why})",
                spec.containers[trainer].name,
                match has {
                    Some(c) => format!("claim {c:?}"),
                    None if !spec.volumes.iter().flatten().any(|v| v.name == name) =>
                        format!("per-pod {name:?}"),
                    None => format!("volume {name:?}"),
                },
            ));
        }
        return name;
    }
    let existing = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|p| p.claim_name == claim)
        })
        .map(|v| v.name.clone());
    let name = match existing {
        Some(n) => n,
        None => {
            let name = volume_name(spec, base_name);
            let v = Volume {
                name: name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    read_only: None,
                }),
                ..Default::default()
            };
            ctx.status.volumes.insert(name.clone(), fingerprint(&v));
            spec.volumes.get_or_insert_with(Vec::new).push(v);
            name
        }
    };
    let m = VolumeMount {
        name: name.clone(),
        mount_path: path.to_string(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    ctx.status
        .volume_mounts
        .insert(path.to_string(), fingerprint(&m));
    spec.containers[trainer]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(m);
    name
}

/// The checkpoint claim: the annotation against the policy's checkpoint rule.
fn checkpoint_claim(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
) -> Result<Option<String>, Refusal> {
    let profile = ctx.profile;
    let user = ann.checkpoint_pvc.clone();
    let Some(rule) = &profile.checkpoint else {
        if let Some(c) = &user {
            check_allowed(ctx, shape, c, annotations::CHECKPOINT_PVC)?;
        }
        return Ok(user);
    };
    let pattern = substitute(&rule.claim, shape);
    let refuse = |detail: String| Refusal::Policy {
        profile: profile.name.clone(),
        rule: "checkpoint".to_string(),
        detail,
    };
    match (user, rule.enforce) {
        (Some(c), _) if glob_match(&pattern, &c) => Ok(Some(c)),
        (Some(c), Enforce::Default) => {
            check_allowed(ctx, shape, &c, annotations::CHECKPOINT_PVC)?;
            Ok(Some(c))
        }
        (Some(c), Enforce::Overwrite) if is_plain(&pattern) => {
            ctx.warn(format!(
                "policy profile {:?} rule checkpoint: annotation {} {c:?} overwritten with the required {pattern:?}",
                profile.name,
                annotations::CHECKPOINT_PVC
            ));
            Ok(Some(pattern))
        }
        (Some(c), _) => Err(refuse(format!(
            "annotation {} is {c:?}, but checkpoints must go to a claim matching {pattern:?}",
            annotations::CHECKPOINT_PVC
        ))),
        // No claim named: a plain required claim is simply mounted (a
        // missing value is no conflict, whatever the enforcement); a pattern
        // cannot be picked for the workload.
        (None, _) if is_plain(&pattern) => Ok(Some(pattern)),
        (None, Enforce::Refuse) => Err(refuse(format!(
            "every training workload must keep its checkpoints on a shared claim: annotate {} with a claim matching {pattern:?}",
            annotations::CHECKPOINT_PVC
        ))),
        (None, Enforce::Overwrite) => Err(refuse(format!(
            "annotate {} with a claim matching {pattern:?}",
            annotations::CHECKPOINT_PVC
        ))),
        (None, _) => Ok(None),
    }
}

/// Mount the checkpoint claim (or find the manifest's own mount at the
/// checkpoint path). `None` when there is no checkpoint directory.
pub fn checkpoint(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    spec: &mut PodSpec,
    trainer: usize,
) -> Result<Option<Checkpoint>, Refusal> {
    let profile = ctx.profile;
    let claim = checkpoint_claim(ctx, shape, ann)?;
    let (rule, setting) = match profile
        .checkpoint
        .as_ref()
        .and_then(|r| r.mount_path.clone().map(|p| (r, p)))
    {
        Some((r, p)) => (
            "checkpoint.mountPath",
            Setting {
                value: p,
                enforce: r.enforce,
            },
        ),
        None => ("checkpointPath", profile.checkpoint_path.clone()),
    };
    let source = format!("annotation {}", annotations::CHECKPOINT_PATH);
    let path = policy::resolve(
        profile,
        rule,
        &setting,
        ann.checkpoint_path.clone().map(|p| (p, source.as_str())),
    )?;
    if let Some(w) = path.warning {
        ctx.warn(w);
    }
    let path = path.value.to_string();
    let source = format!("annotation {}", annotations::CHECKPOINT_MAX_AGE);
    let max_age = policy::resolve(
        profile,
        "checkpointMaxAge",
        &profile.checkpoint_max_age,
        ann.checkpoint_max_age.map(|a| (a, source.as_str())),
    )?;
    if let Some(w) = max_age.warning {
        ctx.warn(w);
    }
    let volume = match claim {
        Some(claim) => mount_claim(
            ctx,
            spec,
            trainer,
            ClaimMount {
                claim: &claim,
                path: &path,
                read_only: false,
                base_name: CHECKPOINT_VOLUME,
                why: annotations::CHECKPOINT_PVC.to_string(),
            },
        ),
        None => match mount_at(spec, trainer, &path) {
            Some(m) => m.name.clone(),
            None => {
                if ann.checkpoint_path.is_some() {
                    ctx.warn(format!(
                        "{} set but no checkpoint volume: set {} or mount one at {path}",
                        annotations::CHECKPOINT_PATH,
                        annotations::CHECKPOINT_PVC
                    ));
                }
                return Ok(None);
            }
        },
    };
    Ok(Some(Checkpoint {
        volume,
        path,
        max_age: max_age.value,
    }))
}

/// The extra shared claims of `trainwire.dev/volumes`.
pub fn shared(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    spec: &mut PodSpec,
    trainer: usize,
) -> Result<(), Refusal> {
    for v in &ann.volumes {
        check_allowed(ctx, shape, &v.claim, annotations::VOLUMES)?;
    }
    for v in &ann.volumes {
        mount_claim(
            ctx,
            spec,
            trainer,
            ClaimMount {
                claim: &v.claim,
                path: &v.path,
                read_only: v.read_only,
                base_name: &v.claim,
                why: annotations::VOLUMES.to_string(),
            },
        );
    }
    Ok(())
}

fn shm_volume(name: &str, size: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".to_string()),
            size_limit: Some(Quantity(size.to_string())),
        }),
        ..Default::default()
    }
}

/// A memory-backed `/dev/shm` of the resolved size, unless `off`.
pub fn shm(
    ctx: &mut Ctx<'_>,
    ann: &Annotations,
    spec: &mut PodSpec,
    trainer: usize,
) -> Result<(), Refusal> {
    let profile = ctx.profile;
    let source = format!("annotation {}", annotations::SHM_SIZE);
    let size = policy::resolve(
        profile,
        "shmSize",
        &profile.shm_size,
        ann.shm_size.map(|s| (s, source.as_str())),
    )?;
    if let Some(w) = size.warning {
        ctx.warn(w);
    }
    let wanted = size.value;
    let size = match wanted {
        ShmSize::Off => return Ok(()),
        ShmSize::Size(bytes) => bytes.to_string(),
    };
    let Some(m) = mount_at(spec, trainer, SHM_PATH) else {
        let name = volume_name(spec, SHM_VOLUME);
        let v = shm_volume(&name, &size);
        ctx.status.volumes.insert(name.clone(), fingerprint(&v));
        spec.volumes.get_or_insert_with(Vec::new).push(v);
        let m = VolumeMount {
            name,
            mount_path: SHM_PATH.to_string(),
            ..Default::default()
        };
        ctx.status
            .volume_mounts
            .insert(SHM_PATH.to_string(), fingerprint(&m));
        spec.containers[trainer]
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(m);
        return Ok(());
    };
    let name = m.name.clone();
    let user = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .map(|v| match &v.empty_dir {
            Some(e) if e.medium.as_deref() == Some("Memory") => e
                .size_limit
                .as_ref()
                .map(|q| q.0.clone())
                .unwrap_or_else(|| "unlimited".to_string()),
            _ => "not a memory emptyDir".to_string(),
        });
    let user = user.unwrap_or_else(|| "not a memory emptyDir".to_string());
    // Compared by value: the manifest's `65536Mi` is `64Gi`.
    let user_size = user.parse::<ShmSize>().ok();
    if user_size == Some(wanted) {
        return Ok(());
    }
    let what = format!("the volume {name:?} mounted at {SHM_PATH}");
    let resolved = match user_size {
        Some(u) => {
            let r = policy::resolve(
                profile,
                "shmSize",
                &profile.shm_size,
                Some((u, what.as_str())),
            )?;
            policy::Resolved {
                value: r.value.to_string(),
                warning: r.warning,
            }
        }
        None => {
            let as_text = Setting {
                value: profile.shm_size.value.to_string(),
                enforce: profile.shm_size.enforce,
            };
            policy::resolve(
                profile,
                "shmSize",
                &as_text,
                Some((user.clone(), what.as_str())),
            )?
        }
    };
    if resolved.value != user {
        // The policy's size wins: the volume becomes a memory emptyDir, in
        // place, so every container that shares it at /dev/shm keeps it.
        // Only a volume that is nothing else can be replaced so: not a
        // per-pod claim, not data that another mount reads.
        let cannot = |why: String| Refusal::Policy {
            profile: profile.name.clone(),
            rule: "shmSize".to_string(),
            detail: format!(
                "the enforced memory {SHM_PATH} of {} cannot replace {what}: {why}; \
                 mount a volume of its own at {SHM_PATH} (or none: trainwire adds it)",
                resolved.value
            ),
        };
        let Some((slot, scratch)) = spec
            .volumes
            .iter()
            .flatten()
            .enumerate()
            .find(|(_, v)| v.name == name)
            .map(|(i, v)| (i, v.empty_dir.is_some()))
        else {
            return Err(cannot(format!(
                "the pod has no volume {name:?} (a per-pod claim cannot be replaced)"
            )));
        };
        if !scratch
            && let Some((container, path)) = mounts_of(spec, &name)
                .into_iter()
                .find(|(_, p)| p.trim_end_matches('/') != SHM_PATH)
        {
            return Err(cannot(format!(
                "container {container:?} also mounts it at {path}, which would become empty memory"
            )));
        }
        if let Some(w) = resolved.warning {
            ctx.warn(w);
        }
        let vols = spec.volumes.get_or_insert_with(Vec::new);
        let new = shm_volume(&name, &resolved.value);
        ctx.status.volumes.insert(name.clone(), fingerprint(&new));
        let orig = std::mem::replace(&mut vols[slot], new);
        ctx.status.replaced_volumes.insert(name.clone(), orig);
        return Ok(());
    }
    if let Some(w) = resolved.warning {
        ctx.warn(w);
    }
    if ann.shm_size.is_some() {
        ctx.warn(format!(
            "{what} ({user}) kept; {} asked for {size}",
            annotations::SHM_SIZE
        ));
    }
    Ok(())
}
