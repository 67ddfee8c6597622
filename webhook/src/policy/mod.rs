//! Platform policy: the defaults the engine starts from and the settings
//! users may not annotate away.
//!
//! [`Profile`] is what the mutation engine reads. [`Profile::default()`] is
//! the embedded default (DESIGN.md's annotation table), used when no policy
//! file is given. A policy file holds several named profiles, each chosen by
//! namespace; see [`Policy::profile_for`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use serde::{Deserialize, Serialize};

/// Default sidecar image, overridden by `--sidecar-image` or the policy.
pub const DEFAULT_SIDECAR_IMAGE: &str = "ghcr.io/trainwire/trainwire-sidecar:0.1.0";

/// What happens when the user's annotation or manifest conflicts with a
/// policy value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforce {
    /// A default: the user's value wins, silently.
    #[default]
    Default,
    /// Enforced: a conflicting value is refused, naming the policy rule.
    Refuse,
    /// Enforced: a conflicting value is replaced, with an admission warning.
    Overwrite,
}

/// One policy value and how it is enforced.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Setting<T> {
    pub value: T,
    #[serde(default)]
    pub enforce: Enforce,
}

impl<T> Setting<T> {
    pub fn default_value(value: T) -> Self {
        Setting {
            value,
            enforce: Enforce::Default,
        }
    }
}

/// Rendezvous backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum RdzvBackend {
    #[default]
    #[serde(rename = "c10d")]
    C10d,
    #[serde(rename = "static")]
    Static,
    #[serde(rename = "etcd-v2")]
    EtcdV2,
}

/// The sidecar's action on peer loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeerLossAction {
    #[default]
    Auto,
    RestartWorkers,
    RestartAgent,
    None,
}

/// Shared checkpoint volume that every run must mount.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointRule {
    /// A claim name, or a glob such as `ckpt-*`; `{namespace}` and `{name}`
    /// (the workload's) are substituted before matching.
    pub claim: String,
    /// Mount path; the workload's `checkpoint-path` must equal it when enforced.
    #[serde(default)]
    pub mount_path: Option<String>,
    /// `refuse` (the default for a required volume): a workload without a
    /// matching `checkpoint-pvc` is refused. `overwrite`: the claim is set
    /// (only possible when `claim` is a plain name after substitution).
    #[serde(default = "refuse")]
    pub enforce: Enforce,
}

fn refuse() -> Enforce {
    Enforce::Refuse
}

/// Settings of the injected sidecar.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarPolicy {
    #[serde(default = "default_sidecar_image")]
    pub image: Setting<String>,
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    #[serde(default = "default_on_peer_loss")]
    pub on_peer_loss: Setting<PeerLossAction>,
    /// Whether the sidecar is injected at all (`trainwire.dev/sidecar`).
    #[serde(default = "default_sidecar_enabled")]
    pub enabled: Setting<bool>,
    /// Extra `TRAINWIRE_*` env for the sidecar (heartbeat interval, ...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_sidecar_image() -> Setting<String> {
    Setting::default_value(DEFAULT_SIDECAR_IMAGE.to_string())
}
fn default_on_peer_loss() -> Setting<PeerLossAction> {
    Setting::default_value(PeerLossAction::Auto)
}
fn default_sidecar_enabled() -> Setting<bool> {
    Setting::default_value(true)
}

impl Default for SidecarPolicy {
    fn default() -> Self {
        SidecarPolicy {
            image: default_sidecar_image(),
            resources: None,
            on_peer_loss: default_on_peer_loss(),
            enabled: default_sidecar_enabled(),
            env: BTreeMap::new(),
        }
    }
}

/// One profile: everything the engine needs to know about a namespace's rules.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    /// Namespace names or globs (`ml-*`) this profile applies to.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// `NCCL_*` / `TORCH_NCCL_*` env, per key.
    #[serde(default)]
    pub nccl: BTreeMap<String, Setting<String>>,
    /// Node selector entries, per key.
    #[serde(default)]
    pub node_selector: BTreeMap<String, Setting<String>>,
    /// Tolerations added to every training pod (kept if already present).
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// `tolerationSeconds` for the `node.kubernetes.io/unreachable` and
    /// `node.kubernetes.io/not-ready` NoExecute taints.
    #[serde(default)]
    pub node_failure_toleration_seconds: Option<Setting<i64>>,
    /// A shared checkpoint volume every run must mount.
    #[serde(default)]
    pub checkpoint: Option<CheckpointRule>,
    /// Default checkpoint mount path (`/checkpoints`).
    #[serde(default = "default_checkpoint_path")]
    pub checkpoint_path: Setting<String>,
    /// Default sidecar staleness threshold (`30m`).
    #[serde(default = "default_checkpoint_max_age")]
    pub checkpoint_max_age: Setting<String>,
    /// Claim names or globs allowed in `trainwire.dev/volumes` (and
    /// `checkpoint-pvc`); `None` allows any.
    #[serde(default)]
    pub allowed_claims: Option<Vec<String>>,
    /// `/dev/shm` size (`8Gi`), or `off`.
    #[serde(default = "default_shm_size")]
    pub shm_size: Setting<String>,
    /// Most nodes a workload may ask for (the upper bound of an elastic range).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Most GPUs per node.
    #[serde(default)]
    pub max_gpus_per_node: Option<u32>,
    #[serde(default = "default_rdzv_backend")]
    pub rdzv_backend: Setting<RdzvBackend>,
    /// `host:port` of an external etcd, for `etcd-v2`.
    #[serde(default)]
    pub etcd_endpoint: Option<String>,
    #[serde(default)]
    pub sidecar: SidecarPolicy,
}

fn default_checkpoint_path() -> Setting<String> {
    Setting::default_value("/checkpoints".to_string())
}
fn default_checkpoint_max_age() -> Setting<String> {
    Setting::default_value("30m".to_string())
}
fn default_shm_size() -> Setting<String> {
    Setting::default_value("8Gi".to_string())
}
fn default_rdzv_backend() -> Setting<RdzvBackend> {
    Setting::default_value(RdzvBackend::C10d)
}

impl Default for Profile {
    /// The embedded defaults: DESIGN.md's annotation table, nothing enforced.
    fn default() -> Self {
        Profile {
            name: "default".to_string(),
            namespaces: Vec::new(),
            nccl: BTreeMap::new(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            node_failure_toleration_seconds: None,
            checkpoint: None,
            checkpoint_path: default_checkpoint_path(),
            checkpoint_max_age: default_checkpoint_max_age(),
            allowed_claims: None,
            shm_size: default_shm_size(),
            max_nodes: None,
            max_gpus_per_node: None,
            rdzv_backend: default_rdzv_backend(),
            etcd_endpoint: None,
            sidecar: SidecarPolicy::default(),
        }
    }
}

/// A whole policy file: profiles chosen by namespace.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    pub profiles: Vec<Profile>,
}

impl Policy {
    /// The profile that applies to `namespace`: the first profile (in file
    /// order) that lists the namespace by exact name; else the first whose
    /// glob matches; else the first profile with no `namespaces` (the
    /// fallback); else the embedded default.
    pub fn profile_for(&self, namespace: &str) -> std::borrow::Cow<'_, Profile> {
        use std::borrow::Cow;
        if let Some(p) = self
            .profiles
            .iter()
            .find(|p| p.namespaces.iter().any(|n| n == namespace))
        {
            return Cow::Borrowed(p);
        }
        if let Some(p) = self.profiles.iter().find(|p| {
            p.namespaces.iter().any(|n| {
                globset::Glob::new(n)
                    .map(|g| g.compile_matcher().is_match(namespace))
                    .unwrap_or(false)
            })
        }) {
            return Cow::Borrowed(p);
        }
        if let Some(p) = self.profiles.iter().find(|p| p.namespaces.is_empty()) {
            return Cow::Borrowed(p);
        }
        Cow::Owned(Profile::default())
    }
}

/// The policy in force, shared between the server's request handlers and the
/// file watcher that swaps in a new one.
#[derive(Clone, Debug)]
pub struct SharedPolicy(std::sync::Arc<arc_swap::ArcSwap<Policy>>);

impl SharedPolicy {
    pub fn new(policy: Policy) -> Self {
        SharedPolicy(std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(policy)))
    }
    /// The policy in force now.
    pub fn current(&self) -> std::sync::Arc<Policy> {
        self.0.load_full()
    }
    /// Put a new, already validated policy in force.
    pub fn replace(&self, policy: Policy) {
        self.0.store(std::sync::Arc::new(policy));
    }
}

/// Flags shared by `inject` and `serve`: where the policy comes from.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct PolicyArgs {
    /// Platform policy file (YAML). Without it the embedded defaults apply.
    #[arg(long = "policy", env = "TRAINWIRE_POLICY", value_name = "FILE")]
    pub policy: Option<std::path::PathBuf>,
    /// Sidecar image, unless the policy enforces one.
    #[arg(
        long = "sidecar-image",
        env = "TRAINWIRE_SIDECAR_IMAGE",
        value_name = "IMAGE"
    )]
    pub sidecar_image: Option<String>,
}

/// A conflict between what the user set and what the policy says, resolved.
#[derive(Debug, PartialEq)]
pub struct Resolved<T> {
    pub value: T,
    /// An admission warning, when an enforced value overwrote the user's.
    pub warning: Option<String>,
}

/// Resolve one setting: the user's value (if any, with a description of where
/// it came from, e.g. `annotation trainwire.dev/shm-size` or `env NCCL_DEBUG of
/// container "trainer"`) against the policy's.
///
/// - no user value: the policy value;
/// - `Default`: the user's value wins;
/// - `Refuse`: a different user value is refused, naming the profile and rule;
/// - `Overwrite`: a different user value is replaced, with a warning.
pub fn resolve<T>(
    profile: &Profile,
    rule: &str,
    setting: &Setting<T>,
    user: Option<(T, &str)>,
) -> Result<Resolved<T>, crate::mutation::Refusal>
where
    T: Clone + PartialEq + std::fmt::Debug,
{
    match user {
        None => Ok(Resolved {
            value: setting.value.clone(),
            warning: None,
        }),
        Some((value, _)) if value == setting.value => Ok(Resolved {
            value,
            warning: None,
        }),
        Some((value, source)) => match setting.enforce {
            Enforce::Default => Ok(Resolved {
                value,
                warning: None,
            }),
            Enforce::Refuse => Err(crate::mutation::Refusal::Policy {
                profile: profile.name.clone(),
                rule: rule.to_string(),
                detail: format!(
                    "{source} is {value:?}, but the policy enforces {:?}; remove it or set it to that value",
                    setting.value
                ),
            }),
            Enforce::Overwrite => Ok(Resolved {
                value: setting.value.clone(),
                warning: Some(format!(
                    "policy profile {:?} rule {rule}: {source} was {value:?}, overwritten with the enforced {:?}",
                    profile.name, setting.value
                )),
            }),
        },
    }
}
