//! NCCL env: the policy's values first, then the `trainwire.dev/nccl`
//! annotation, and `TORCH_NCCL_ASYNC_ERROR_HANDLING=1` unless something sets it.

use super::annotations::{Annotations, NCCL};
use super::injection::{Ctx, Refusal};
use super::trainer::{Conflict, Desired};
use crate::policy::{self, Enforce};

pub const ASYNC_ERROR_HANDLING: &str = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
/// torch's flight recorder: the last collectives of each rank, kept in
/// memory (entries).
pub const TRACE_BUFFER_SIZE: &str = "TORCH_NCCL_TRACE_BUFFER_SIZE";
/// Write the flight recorder out when a collective times out.
pub const DUMP_ON_TIMEOUT: &str = "TORCH_NCCL_DUMP_ON_TIMEOUT";
/// Where it is written: a prefix, torch appends the rank.
pub const DEBUG_INFO_TEMP_FILE: &str = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
/// The flight recorder's size: torch's documentation's example value,
/// a few MB per rank.
pub const TRACE_ENTRIES: &str = "2000";
/// The name prefix of the flight recorder's files in the checkpoint
/// directory (torch appends the rank; torch does not create folders, and
/// the checkpoint watcher ignores dot files): they survive the restart of
/// the workers.
pub const TRACE_FILE_PREFIX: &str = ".trainwire-nccl-trace-rank-";

/// The evidence a hung or timed-out NCCL world leaves (torch's flight
/// recorder, harmless for gloo): on, and written under the checkpoint
/// mount (`checkpoint`), when there is one. A value the manifest sets wins
/// without a warning.
pub fn flight_recorder(checkpoint: Option<&str>) -> Vec<Desired> {
    let Some(dir) = checkpoint else {
        return Vec::new();
    };
    let why = "torch's flight recorder, kept on the checkpoint volume for a stall's diagnosis";
    vec![
        Desired::value(TRACE_BUFFER_SIZE, TRACE_ENTRIES, why, Conflict::Quiet),
        Desired::value(DUMP_ON_TIMEOUT, "1", why, Conflict::Quiet),
        Desired::value(
            DEBUG_INFO_TEMP_FILE,
            format!("{}/{TRACE_FILE_PREFIX}", dir.trim_end_matches('/')),
            why,
            Conflict::Quiet,
        ),
    ]
}

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
