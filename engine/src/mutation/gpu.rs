//! GPUs: the `trainwire.dev/gpus-per-node` annotation sets the trainer's
//! `nvidia.com/gpu` limit and request; whenever the trainer asks for GPUs the
//! pod tolerates the `nvidia.com/gpu` NoSchedule taint; the policy caps GPUs
//! per node.

use k8s_openapi::api::core::v1::{Container, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::annotations::{Annotations, GPUS_PER_NODE};
use super::injection::{Ctx, Refusal};
use super::placement;

pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// GPUs the container asks for (limit, else request), when a whole number.
pub fn requested(c: &Container) -> Option<u32> {
    let res = c.resources.as_ref()?;
    let q = res
        .limits
        .as_ref()
        .and_then(|l| l.get(GPU_RESOURCE))
        .or_else(|| res.requests.as_ref().and_then(|r| r.get(GPU_RESOURCE)))?;
    q.0.trim().parse::<u32>().ok()
}

/// Set the GPU resources asked for by the annotation, check the policy cap,
/// add the toleration. Returns the GPUs the trainer gets (0 when none).
pub fn apply(
    ctx: &mut Ctx<'_>,
    spec: &mut PodSpec,
    trainer: usize,
    ann: &Annotations,
) -> Result<u32, Refusal> {
    let c = &mut spec.containers[trainer];
    let mut gpus = requested(c).unwrap_or(0);
    if let Some(want) = ann.gpus_per_node {
        if gpus == 0 {
            let res = c.resources.get_or_insert_with(Default::default);
            for kind in ["limits", "requests"] {
                let map = match kind {
                    "limits" => res.limits.get_or_insert_with(Default::default),
                    _ => res.requests.get_or_insert_with(Default::default),
                };
                if !map.contains_key(GPU_RESOURCE) {
                    map.insert(GPU_RESOURCE.to_string(), Quantity(want.to_string()));
                    ctx.status
                        .resources
                        .insert(format!("{kind}/{GPU_RESOURCE}"), want.to_string());
                }
            }
            gpus = want;
        } else if gpus != want {
            ctx.warn(format!(
                "container {:?} asks for {GPU_RESOURCE} {gpus} (kept), but {GPUS_PER_NODE} says {want}: remove one",
                c.name
            ));
        }
    }
    if let Some(max) = ctx.profile.max_gpus_per_node
        && gpus > max
    {
        return Err(Refusal::Policy {
            profile: ctx.profile.name.clone(),
            rule: "maxGpusPerNode".to_string(),
            detail: if max == 0 {
                format!(
                    "the trainer asks for {gpus} GPU{} per node (annotation {GPUS_PER_NODE} or its {GPU_RESOURCE} resources), but this profile allows no GPUs; remove them, or run in a namespace of a GPU profile",
                    if gpus == 1 { "" } else { "s" }
                )
            } else {
                format!(
                    "the trainer asks for {gpus} GPUs per node (annotation {GPUS_PER_NODE} or its {GPU_RESOURCE} resources), more than the {max} allowed; ask for at most {max}"
                )
            },
        });
    }
    if gpus > 0 {
        placement::ensure_toleration(
            ctx,
            spec,
            Toleration {
                key: Some(GPU_RESOURCE.to_string()),
                operator: Some("Exists".to_string()),
                effect: Some("NoSchedule".to_string()),
                ..Default::default()
            },
        );
    }
    Ok(gpus)
}
