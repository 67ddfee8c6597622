//! NCCL env: the policy's values first, then the `trainwire.dev/nccl`
//! annotation, and `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` unless something sets it.

use super::annotations::{Annotations, NCCL};
use super::injection::{Ctx, Refusal};
use super::trainer::{Conflict, Desired};
use crate::policy::{self, Enforce};

pub const ASYNC_ERROR_HANDLING: &str = "TORCH_NCCL_ASYNC_ERROR_HANDLING";

pub fn desired(ctx: &mut Ctx<'_>, ann: &Annotations) -> Result<Vec<Desired>, Refusal> {
    let profile = ctx.profile;
    let mut out = Vec::new();
    let source = format!("annotation {NCCL}");
    for (key, setting) in &profile.nccl {
        let from_annotation = ann
            .nccl
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone());
        let rule = format!("nccl.{key}");
        let resolved = policy::resolve(
            profile,
            &rule,
            setting,
            from_annotation.clone().map(|v| (v, source.as_str())),
        )?;
        if let Some(w) = resolved.warning {
            ctx.warn(w);
        }
        let (why, conflict) = match (setting.enforce, &from_annotation) {
            (Enforce::Default, Some(_)) => (source.clone(), Conflict::ManifestWins),
            (Enforce::Default, None) => (
                format!("policy profile {:?}", profile.name),
                Conflict::Quiet,
            ),
            _ => (
                format!("policy profile {:?}", profile.name),
                Conflict::Policy {
                    rule,
                    setting: setting.clone(),
                },
            ),
        };
        out.push(Desired::value(key, resolved.value, why, conflict));
    }
    for (key, value) in &ann.nccl {
        if !profile.nccl.contains_key(key) {
            out.push(Desired::value(
                key,
                value.clone(),
                source.clone(),
                Conflict::ManifestWins,
            ));
        }
    }
    if !out.iter().any(|d| d.var.name == ASYNC_ERROR_HANDLING) {
        out.push(Desired::value(
            ASYNC_ERROR_HANDLING,
            "1",
            "a failed NCCL collective then raises instead of hanging",
            Conflict::Quiet,
        ));
    }
    Ok(out)
}
