//! The trainer container: which one it is, and how trainwire's env meets the
//! env the manifest already has.
//!
//! trainwire's variables go first, in a fixed order (the downward-API ones
//! first), so that the manifest's own variables can refer to them with
//! `$(PET_NODE_RANK)`. A variable the manifest already sets wins, and a
//! different value is an admission warning, unless the policy enforces the
//! value ([`crate::policy::resolve`]).

use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec};

use super::annotations::{self, Annotations};
use super::fingerprint::fingerprint;
use super::injection::{Ctx, Refusal};
use crate::policy::{self, Setting};

/// The name looked for when `trainwire.dev/container` is not given.
pub const DEFAULT_TRAINER: &str = "trainer";

/// Index of the trainer container: the annotated name, else `trainer`, else the first.
pub fn find(spec: &PodSpec, ann: &Annotations) -> Result<usize, Refusal> {
    if spec.containers.is_empty() {
        return Err(Refusal::Workload(
            "the pod template has no containers; add the trainer container".to_string(),
        ));
    }
    match &ann.container {
        Some(name) => spec
            .containers
            .iter()
            .position(|c| &c.name == name)
            .ok_or_else(|| Refusal::Annotation {
                annotation: annotations::CONTAINER.to_string(),
                value: name.clone(),
                reason: "no container of the pod template has this name".to_string(),
                accepted: format!(
                    "one of {}",
                    spec.containers
                        .iter()
                        .map(|c| format!("{:?}", c.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        None => Ok(spec
            .containers
            .iter()
            .position(|c| c.name == DEFAULT_TRAINER)
            .unwrap_or(0)),
    }
}

/// How a conflict between trainwire's value and the manifest's is settled.
#[derive(Clone, Debug)]
pub enum Conflict {
    /// The manifest wins, with a warning saying what trainwire would have set and why.
    ManifestWins,
    /// The manifest wins without a warning (a non-enforced policy default).
    Quiet,
    /// A policy setting: [`policy::resolve`] decides (refuse, overwrite with a warning, or keep).
    Policy {
        rule: String,
        setting: Setting<String>,
    },
    /// trainwire's value replaces the manifest's (it already merges the
    /// manifest's value, e.g. `PET_RDZV_CONF`); the original is kept in the status.
    Replace,
}

/// One variable trainwire wants in the trainer.
#[derive(Clone, Debug)]
pub struct Desired {
    pub var: EnvVar,
    /// Why this value, for warnings: `spec.replicas`, `annotation trainwire.dev/nccl`, ...
    pub why: String,
    pub conflict: Conflict,
}

impl Desired {
    pub fn value(
        name: &str,
        value: impl Into<String>,
        why: impl Into<String>,
        conflict: Conflict,
    ) -> Self {
        Desired {
            var: EnvVar {
                name: name.to_string(),
                value: Some(value.into()),
                value_from: None,
            },
            why: why.into(),
            conflict,
        }
    }

    /// A variable from the downward API (`metadata.labels['...']`).
    pub fn field(name: &str, field_path: &str, why: impl Into<String>) -> Self {
        Desired {
            var: field_env(name, field_path),
            why: why.into(),
            conflict: Conflict::ManifestWins,
        }
    }
}

/// An env var from the downward API, with the `apiVersion` the apiserver would
/// default (so the stored object equals what trainwire wrote).
pub fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".to_string()),
                field_path: field_path.to_string(),
            }),
            ..Default::default()
        }),
    }
}

/// How a variable reads in a message.
pub fn describe(var: &EnvVar) -> String {
    if let Some(v) = &var.value {
        return format!("{v:?}");
    }
    match &var.value_from {
        Some(src) => {
            if let Some(f) = &src.field_ref {
                format!("fieldRef {}", f.field_path)
            } else if let Some(s) = &src.secret_key_ref {
                format!("secret {}/{}", s.name, s.key)
            } else if let Some(c) = &src.config_map_key_ref {
                format!("configMap {}/{}", c.name, c.key)
            } else {
                "a valueFrom reference".to_string()
            }
        }
        None => "\"\"".to_string(),
    }
}

fn same(a: &EnvVar, b: &EnvVar) -> bool {
    a.value.as_deref().unwrap_or_default() == b.value.as_deref().unwrap_or_default()
        && a.value_from == b.value_from
}

/// Merge `desired` into the container's env. See the module docs.
pub fn apply_env(
    ctx: &mut Ctx<'_>,
    c: &mut Container,
    desired: Vec<Desired>,
) -> Result<(), Refusal> {
    let mut env = c.env.take().unwrap_or_default();
    let mut added: Vec<EnvVar> = Vec::new();
    for d in desired {
        let name = d.var.name.clone();
        if added.iter().any(|v| v.name == name) {
            continue;
        }
        let Some(pos) = env.iter().position(|v| v.name == name) else {
            ctx.status.env.insert(name, fingerprint(&d.var));
            added.push(d.var);
            continue;
        };
        if same(&env[pos], &d.var) {
            continue;
        }
        let source = format!("env {name} of container {:?}", c.name);
        match d.conflict {
            Conflict::Quiet => {}
            Conflict::ManifestWins => ctx.warn(super::injection::with_detail(
                format!(
                    "{source}: the manifest's {} is kept; trainwire would set {}",
                    describe(&env[pos]),
                    describe(&d.var),
                ),
                &d.why,
            )),
            Conflict::Replace => replace(ctx, &mut env[pos], d.var),
            Conflict::Policy { rule, setting } => {
                let Some(user) = env[pos]
                    .value
                    .clone()
                    .filter(|_| env[pos].value_from.is_none())
                else {
                    if setting.enforce != policy::Enforce::Default {
                        return Err(Refusal::Policy {
                            profile: ctx.profile.name.clone(),
                            rule,
                            detail: format!(
                                "{source} comes from {}, but the policy enforces {:?}; remove it",
                                describe(&env[pos]),
                                setting.value
                            ),
                        });
                    }
                    continue;
                };
                let resolved = policy::resolve(
                    ctx.profile,
                    &rule,
                    &setting,
                    Some((user.clone(), source.as_str())),
                )?;
                if let Some(w) = resolved.warning {
                    ctx.warn(w);
                }
                if resolved.value != user {
                    let var = EnvVar {
                        name: name.clone(),
                        value: Some(resolved.value),
                        value_from: None,
                    };
                    replace(ctx, &mut env[pos], var);
                }
            }
        }
    }
    added.extend(env);
    c.env = (!added.is_empty()).then_some(added);
    Ok(())
}

fn replace(ctx: &mut Ctx<'_>, slot: &mut EnvVar, var: EnvVar) {
    ctx.status.env.insert(var.name.clone(), fingerprint(&var));
    ctx.status
        .replaced_env
        .insert(var.name.clone(), std::mem::replace(slot, var));
}

/// The manifest's literal value of `name` in the container, if it sets one.
pub fn literal<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .as_ref()?
        .iter()
        .find(|v| v.name == name && v.value_from.is_none())
        .map(|v| v.value.as_deref().unwrap_or_default())
}

/// Whether the manifest sets `name` at all (literal or reference).
pub fn sets(c: &Container, name: &str) -> bool {
    c.env
        .as_ref()
        .is_some_and(|e| e.iter().any(|v| v.name == name))
}
