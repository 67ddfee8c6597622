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
use thiserror::Error;

mod kube;
pub mod parse;
pub mod syntax;
mod validate;

pub use parse::{API_VERSION, Diagnostic, FieldPath, KIND};
pub use validate::SIDECAR_TUNABLE_ENV;

/// The taint a node gets when the node controller loses contact with it.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// The taint a node gets when its kubelet reports it not ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// Default sidecar image, overridden by `--sidecar-image` or the policy: the
/// image `images/build` makes from this version (docs/deploy.md says how to
/// point it at one's own registry).
pub const DEFAULT_SIDECAR_IMAGE: &str = concat!(
    "ghcr.io/trainwire/trainwire-sidecar:",
    env!("CARGO_PKG_VERSION")
);

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

impl<T: Default> Default for Setting<T> {
    fn default() -> Self {
        Setting::default_value(T::default())
    }
}

impl<T> Setting<T> {
    pub fn default_value(value: T) -> Self {
        Setting {
            value,
            enforce: Enforce::Default,
        }
    }
}

pub use trainwire_contract::{
    ExitCodes, FailureLimit, Framework, MountPath, NodeFailureAction, PeerLossAction,
    PositiveDuration, RdzvBackend, RdzvHandler, RdzvStore, ShmSize, SpareCount,
};

/// The dedicated rendezvous store's pod (`storePod`): where it is placed
/// (no GPU: a CPU pool), its priority and its resources. Only read when a
/// workload's store is `dedicated`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorePod {
    /// The store pod's `nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The store pod's tolerations.
    #[serde(
        default,
        deserialize_with = "kube::tolerations",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tolerations: Vec<Toleration>,
    /// The store pod's `priorityClassName`: losing the store stops every
    /// node of the world, so it should not be the first pod preempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The store container's resources (default: see
    /// [`crate::rdzv_store::default_resources`]).
    #[serde(
        default,
        deserialize_with = "kube::resources",
        skip_serializing_if = "Option::is_none"
    )]
    pub resources: Option<ResourceRequirements>,
}

impl StorePod {
    pub fn is_default(&self) -> bool {
        self == &StorePod::default()
    }
}

/// Dead-node reclaim (`nodeFailure`): off unless a profile sets it.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeFailurePolicy {
    /// How long a node's `Ready` condition must have been `Unknown` or
    /// `False` before its trainwire pods are reclaimed. Also the
    /// `tolerationSeconds` of the unreachable / not-ready tolerations, so the
    /// control plane's eviction and the reclaim agree.
    pub reclaim_after: PositiveDuration,
    /// `force-delete` (the default) or `out-of-service` (a node-level action:
    /// needed for ReadWriteOnce volumes).
    #[serde(default)]
    pub action: NodeFailureAction,
    /// Most pods reclaimed per minute, across the cluster.
    #[serde(default = "default_max_pods_per_minute")]
    pub max_pods_per_minute: u32,
}

/// Default of `nodeFailure.maxPodsPerMinute`.
pub const DEFAULT_MAX_PODS_PER_MINUTE: u32 = 10;

fn default_max_pods_per_minute() -> u32 {
    DEFAULT_MAX_PODS_PER_MINUTE
}

impl NodeFailurePolicy {
    /// The grace in whole seconds, as a `tolerationSeconds` (rounded up).
    pub fn toleration_seconds(&self) -> i64 {
        let d = self.reclaim_after.get();
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i64::try_from(secs).unwrap_or(i64::MAX)
    }
}

/// Crash-loop stop defaults (`crashLoop`); the workload's
/// `trainwire.dev/fail-fast-exit-codes` and `trainwire.dev/max-failures`
/// annotations override them. Both off by default.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrashLoopPolicy {
    /// Trainer exit codes that stop the world at once.
    #[serde(default)]
    pub fail_fast_exit_codes: ExitCodes,
    /// Trainer failures (not explained by a peer or node loss) within a
    /// window that stop the world; `0` never.
    #[serde(default = "default_max_failures")]
    pub max_failures: FailureLimit,
}

fn default_max_failures() -> FailureLimit {
    FailureLimit {
        failures: 0,
        window: PositiveDuration::new(FailureLimit::DEFAULT_WINDOW)
            .expect("the built-in failure window is positive"),
    }
}

impl CrashLoopPolicy {
    pub fn is_default(&self) -> bool {
        *self == CrashLoopPolicy::default()
    }
}

impl Default for CrashLoopPolicy {
    fn default() -> Self {
        CrashLoopPolicy {
            fail_fast_exit_codes: ExitCodes::default(),
            max_failures: default_max_failures(),
        }
    }
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
    pub mount_path: Option<MountPath>,
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
    #[serde(default, deserialize_with = "kube::resources")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default = "default_on_peer_loss")]
    pub on_peer_loss: Setting<PeerLossAction>,
    /// A hung world (`trainwire.dev/stall-timeout`): `off` or a duration.
    #[serde(default = "default_stall_timeout")]
    pub stall_timeout: Setting<trainwire_contract::StallTimeout>,
    /// What the sidecars do on a stall (`trainwire.dev/on-stall`).
    #[serde(default = "default_on_stall")]
    pub on_stall: Setting<trainwire_contract::StallAction>,
    /// How long a peer may be silent before its loss is confirmed
    /// (`trainwire.dev/loss-window`): a duration from 200ms to 10m.
    #[serde(default = "default_loss_window")]
    pub loss_window: Setting<trainwire_contract::LossWindow>,
    /// Whether the sidecar is injected at all (`trainwire.dev/sidecar`).
    #[serde(default = "default_sidecar_enabled")]
    pub enabled: Setting<bool>,
    /// Extra `TRAINWIRE_*` env for the sidecar (heartbeat interval, ...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Pin the sidecar's user (and group) instead of following the trainer's
    /// (see `mutation::sidecar_container::identity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
}

fn default_sidecar_image() -> Setting<String> {
    Setting::default_value(DEFAULT_SIDECAR_IMAGE.to_string())
}
fn default_on_peer_loss() -> Setting<PeerLossAction> {
    Setting::default_value(PeerLossAction::Auto)
}
fn default_stall_timeout() -> Setting<trainwire_contract::StallTimeout> {
    Setting::default_value(trainwire_contract::StallTimeout::default())
}
fn default_on_stall() -> Setting<trainwire_contract::StallAction> {
    Setting::default_value(trainwire_contract::StallAction::RestartWorkers)
}
fn default_loss_window() -> Setting<trainwire_contract::LossWindow> {
    Setting::default_value(trainwire_contract::LossWindow::default())
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
            stall_timeout: default_stall_timeout(),
            on_stall: default_on_stall(),
            loss_window: default_loss_window(),
            enabled: default_sidecar_enabled(),
            env: BTreeMap::new(),
            run_as_user: None,
            run_as_group: None,
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
    #[serde(default, deserialize_with = "kube::tolerations")]
    pub tolerations: Vec<Toleration>,
    /// `tolerationSeconds` for the `node.kubernetes.io/unreachable` and
    /// `node.kubernetes.io/not-ready` NoExecute taints.
    #[serde(default)]
    pub node_failure_toleration_seconds: Option<Setting<i64>>,
    /// Dead-node reclaim by the controllers' failure controller (off when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_failure: Option<NodeFailurePolicy>,
    /// Crash-loop stop defaults. Not read by the injection: left out of
    /// the injected status hash while it is the default.
    #[serde(default, skip_serializing_if = "CrashLoopPolicy::is_default")]
    pub crash_loop: CrashLoopPolicy,
    /// A shared checkpoint volume every run must mount.
    #[serde(default)]
    pub checkpoint: Option<CheckpointRule>,
    /// Default checkpoint mount path (`/checkpoints`).
    #[serde(default = "default_checkpoint_path")]
    pub checkpoint_path: Setting<MountPath>,
    /// Default sidecar staleness threshold (`30m`).
    #[serde(default = "default_checkpoint_max_age")]
    pub checkpoint_max_age: Setting<PositiveDuration>,
    /// Claim names or globs allowed in `trainwire.dev/volumes` (and
    /// `checkpoint-pvc`); `None` allows any.
    #[serde(default)]
    pub allowed_claims: Option<Vec<String>>,
    /// `/dev/shm` size (`8Gi`), or `off`.
    #[serde(default = "default_shm_size")]
    pub shm_size: Setting<ShmSize>,
    /// Most nodes a workload may ask for (the upper bound of an elastic range).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Most GPUs per node.
    #[serde(default)]
    pub max_gpus_per_node: Option<u32>,
    #[serde(default = "default_rdzv_backend")]
    pub rdzv_backend: Setting<RdzvBackend>,
    /// Where the c10d store runs (`trainwire.dev/rdzv-store`): `pod0`.
    #[serde(default)]
    pub rdzv_store: Setting<RdzvStore>,
    /// The rendezvous handler over a dedicated store
    /// (`trainwire.dev/rdzv-handler`): `trainwire`.
    #[serde(default)]
    pub rdzv_handler: Setting<RdzvHandler>,
    /// Hot spares per world (`trainwire.dev/spares`): 0.
    #[serde(default)]
    pub spares: Setting<SpareCount>,
    /// The dedicated store's pod: where it runs and what it gets.
    #[serde(default, skip_serializing_if = "StorePod::is_default")]
    pub store_pod: StorePod,
    /// The training framework (`pytorch`), which `trainwire.dev/framework`
    /// overrides unless enforced.
    #[serde(default)]
    pub framework: Setting<Framework>,
    /// `host:port` of an external etcd, for `etcd-v2`.
    #[serde(default)]
    pub etcd_endpoint: Option<String>,
    /// The cluster's DNS domain (the kubelet's `--cluster-domain`), the last
    /// part of every pod name trainwire injects:
    /// `<name>-0.<service>.<namespace>.svc.<clusterDomain>`. Unset: the
    /// `--cluster-domain` flag, else `cluster.local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
    #[serde(default)]
    pub sidecar: SidecarPolicy,
    /// What the engine derives from the profile once, not per request.
    #[serde(skip)]
    pub prepared: Prepared,
}

/// Per-profile work done once (when the policy is put in force, or on first
/// use): the compiled namespace and claim globs.
///
/// A clone starts empty (a cloned profile may be edited) and it compares
/// equal to any other: it is derived, never configuration.
#[derive(Default)]
pub struct Prepared {
    namespaces: std::sync::OnceLock<Vec<Option<globset::GlobMatcher>>>,
    allowed_claims: std::sync::OnceLock<Vec<ClaimPattern>>,
}

/// An `allowedClaims` entry: compiled once unless it names `{namespace}` or
/// `{name}`, which are substituted per workload.
pub enum ClaimPattern {
    Compiled(globset::GlobMatcher),
    Literal(String),
    PerWorkload(String),
}

impl Clone for Prepared {
    fn clone(&self) -> Self {
        Prepared::default()
    }
}
impl PartialEq for Prepared {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prepared")
    }
}

impl Profile {
    fn namespace_globs(&self) -> &[Option<globset::GlobMatcher>] {
        self.prepared.namespaces.get_or_init(|| {
            self.namespaces
                .iter()
                .map(|n| globset::Glob::new(n).ok().map(|g| g.compile_matcher()))
                .collect()
        })
    }

    /// `allowedClaims`, compiled; `None` allows any claim.
    pub fn allowed_claim_patterns(&self) -> Option<&[ClaimPattern]> {
        let allowed = self.allowed_claims.as_ref()?;
        Some(self.prepared.allowed_claims.get_or_init(|| {
            allowed
                .iter()
                .map(|p| {
                    if p.contains("{namespace}") || p.contains("{name}") {
                        ClaimPattern::PerWorkload(p.clone())
                    } else {
                        match globset::Glob::new(p) {
                            Ok(g) => ClaimPattern::Compiled(g.compile_matcher()),
                            Err(_) => ClaimPattern::Literal(p.clone()),
                        }
                    }
                })
                .collect()
        }))
    }

    /// Do the per-profile work now rather than on the first request.
    pub fn prepare(&self) {
        self.namespace_globs();
        self.allowed_claim_patterns();
    }
}

/// Built-in defaults (DESIGN.md's annotation table).
pub mod defaults {
    /// `checkpointPath`.
    pub const CHECKPOINT_PATH: &str = "/checkpoints";
    /// `checkpointMaxAge`.
    pub const CHECKPOINT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 60);
    /// `shmSize`, in bytes (8Gi).
    pub const SHM_BYTES: u64 = 8 << 30;
}

fn default_checkpoint_path() -> Setting<MountPath> {
    Setting::default_value(
        defaults::CHECKPOINT_PATH
            .parse()
            .expect("the built-in checkpoint path is a mount path"),
    )
}
fn default_checkpoint_max_age() -> Setting<PositiveDuration> {
    Setting::default_value(
        PositiveDuration::new(defaults::CHECKPOINT_MAX_AGE)
            .expect("the built-in checkpoint max age is positive"),
    )
}
fn default_shm_size() -> Setting<ShmSize> {
    Setting::default_value(
        trainwire_contract::ByteSize::new(defaults::SHM_BYTES).map_or(ShmSize::Off, ShmSize::Size),
    )
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
            node_failure: None,
            crash_loop: CrashLoopPolicy::default(),
            checkpoint: None,
            checkpoint_path: default_checkpoint_path(),
            checkpoint_max_age: default_checkpoint_max_age(),
            allowed_claims: None,
            shm_size: default_shm_size(),
            max_nodes: None,
            max_gpus_per_node: None,
            rdzv_backend: default_rdzv_backend(),
            rdzv_store: Setting::default(),
            rdzv_handler: Setting::default(),
            spares: Setting::default(),
            store_pod: StorePod::default(),
            framework: Setting::default(),
            etcd_endpoint: None,
            cluster_domain: None,
            sidecar: SidecarPolicy::default(),
            prepared: Prepared::default(),
        }
    }
}

/// The cluster DNS domain when neither the profile nor `--cluster-domain`
/// names one: the kubelet's and kubeadm's default.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

impl Profile {
    /// The cluster DNS domain pod names end with.
    pub fn cluster_domain(&self) -> &str {
        self.cluster_domain
            .as_deref()
            .unwrap_or(DEFAULT_CLUSTER_DOMAIN)
    }

    /// The `tolerationSeconds` of the unreachable / not-ready tolerations:
    /// `nodeFailureTolerationSeconds` when set (validation makes it equal to
    /// the reclaim grace when both are set), else the `nodeFailure` grace as
    /// a default the user may override, else none (Kubernetes' 300 s).
    pub fn node_failure_tolerations(&self) -> Option<Setting<i64>> {
        self.node_failure_toleration_seconds.clone().or_else(|| {
            self.node_failure
                .as_ref()
                .map(|n| Setting::default_value(n.toleration_seconds()))
        })
    }
}

/// A whole policy file: profiles chosen by namespace.
///
/// Deserializes from the file format (`apiVersion`, `kind`, `profiles`,
/// unknown fields refused) but checks nothing else: use
/// [`Policy::from_yaml`] or [`load`] for a validated policy with located
/// errors.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", from = "parse::PolicyFile")]
pub struct Policy {
    pub profiles: Vec<Profile>,
    /// The profile for a namespace no profile matches (and for every
    /// namespace without a policy file): the embedded defaults, with
    /// `--sidecar-image` applied. Not part of the file.
    #[serde(skip)]
    pub fallback: Profile,
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
            p.namespace_globs()
                .iter()
                .flatten()
                .any(|g| g.is_match(namespace))
        }) {
            return Cow::Borrowed(p);
        }
        if let Some(p) = self.profiles.iter().find(|p| p.namespaces.is_empty()) {
            return Cow::Borrowed(p);
        }
        Cow::Borrowed(&self.fallback)
    }

    /// Parse and fully validate the text of a policy file. `file` names it
    /// in error messages (`policy.yaml:12:7: profiles[1].shmSize.value: ...`).
    pub fn from_yaml(text: &str, file: &str) -> Result<Policy, PolicyError> {
        let policy = parse::parse(text, file)?;
        let locations = parse::Locations::scan(text);
        let errors = validate::validate(&policy, file, &locations);
        if errors.is_empty() {
            Ok(policy)
        } else {
            Err(PolicyError::Invalid(errors))
        }
    }

    /// Do every profile's per-policy work now (see [`Prepared`]).
    pub fn prepare(&self) {
        for p in self.profiles.iter().chain(std::iter::once(&self.fallback)) {
            p.prepare();
        }
    }

    /// The profile names, in file order.
    pub fn profile_names(&self) -> Vec<&str> {
        self.profiles.iter().map(|p| p.name.as_str()).collect()
    }

    /// Apply `--sidecar-image` to every profile (and the fallback) whose
    /// sidecar image is not enforced.
    pub fn apply_sidecar_image(&mut self, image: &str) {
        for p in self
            .profiles
            .iter_mut()
            .chain(std::iter::once(&mut self.fallback))
        {
            if p.sidecar.image.enforce == Enforce::Default {
                p.sidecar.image.value = image.to_string();
                p.prepared = Prepared::default();
            }
        }
    }

    /// Apply `--cluster-domain` to every profile (and the fallback) that
    /// does not name its own `clusterDomain`.
    pub fn apply_cluster_domain(&mut self, domain: &str) {
        for p in self
            .profiles
            .iter_mut()
            .chain(std::iter::once(&mut self.fallback))
        {
            if p.cluster_domain.is_none() {
                p.cluster_domain = Some(domain.to_string());
            }
        }
    }
}

/// Why a policy could not be loaded.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// The OS error is part of the message and not a `source`: printed
    /// with its causes, it would otherwise show twice.
    #[error("{path}: cannot read the policy file: {error}")]
    Read { path: String, error: std::io::Error },
    /// One line per error: `file:line:column: field.path: message`.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Diagnostic>),
    #[error(
        "--sidecar-image {image:?} is not an image reference (registry/repository:tag or @sha256:digest)"
    )]
    SidecarImage { image: String },
    #[error(
        "--cluster-domain: {reason}; give the kubelet's --cluster-domain, such as cluster.local"
    )]
    ClusterDomain { reason: String },
}

impl PolicyError {
    /// The diagnostics of an invalid policy (empty for other errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            PolicyError::Invalid(d) => d,
            _ => &[],
        }
    }
}

impl Policy {
    /// Apply the command line's settings (`--sidecar-image`,
    /// `--cluster-domain`) to a loaded policy: every profile whose sidecar
    /// image (cluster domain) the policy does not enforce gets it.
    pub fn with_overrides(
        mut self,
        sidecar_image: Option<&str>,
        cluster_domain: Option<&str>,
    ) -> Result<Policy, PolicyError> {
        if let Some(image) = sidecar_image {
            if image.is_empty() || image.chars().any(char::is_whitespace) {
                return Err(PolicyError::SidecarImage {
                    image: image.to_string(),
                });
            }
            self.apply_sidecar_image(image);
        }
        if let Some(domain) = cluster_domain {
            syntax::dns_subdomain(domain)
                .map_err(|reason| PolicyError::ClusterDomain { reason })?;
            self.apply_cluster_domain(domain);
        }
        Ok(self)
    }
}

/// A user value that an enforced policy setting refuses. The engine turns it
/// into its own refusal (`mutation::Refusal::Policy`).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("policy profile {profile:?} rule {rule}: {detail}")]
pub struct Conflict {
    pub profile: String,
    pub rule: String,
    pub detail: String,
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
/// Values compare by what they mean (`1800s` is `30m`, `65536Mi` is `64Gi`):
/// the contract types' equality.
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
) -> Result<Resolved<T>, Conflict>
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
            Enforce::Refuse => Err(Conflict {
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
                    "policy profile {:?} rule {rule}: {source} {value:?} overwritten with the enforced {:?}",
                    profile.name, setting.value
                )),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn policy(body: &str) -> Policy {
        let text = format!("apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n{body}");
        match Policy::from_yaml(&text, "test.yaml") {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    const SELECTION: &str = r#"
  - name: glob-first
    namespaces: ["ml-*"]
  - name: exact-later
    namespaces: [ml-prod, research]
  - name: glob-second
    namespaces: ["ml-*", "team-?"]
  - name: fallback
  - name: exact-last
    namespaces: [ops]
"#;

    #[rstest]
    #[case::exact_beats_an_earlier_glob("ml-prod", "exact-later")]
    #[case::exact_name("research", "exact-later")]
    #[case::exact_after_the_fallback("ops", "exact-last")]
    #[case::first_glob_in_file_order("ml-dev", "glob-first")]
    #[case::later_glob_when_the_first_does_not_match("team-a", "glob-second")]
    #[case::glob_is_whole_name("team-ab", "fallback")]
    #[case::no_match_takes_the_fallback("default", "fallback")]
    #[case::globs_do_not_match_a_prefix("xml-dev", "fallback")]
    fn profile_selection(#[case] namespace: &str, #[case] expected: &str) {
        let p = policy(SELECTION);
        assert_eq!(p.profile_for(namespace).name, expected);
    }

    #[test]
    fn without_a_fallback_profile_the_embedded_defaults_apply() {
        let p = policy("  - name: gpu\n    namespaces: [ml]\n    shmSize: {value: 64Gi}\n");
        assert_eq!(p.profile_for("ml").shm_size.value.to_string(), "64Gi");
        assert_eq!(*p.profile_for("other"), Profile::default());
    }

    #[test]
    fn an_omitted_field_means_the_embedded_default() {
        let p = policy("  - name: default\n");
        assert_eq!(p.profiles[0], Profile::default());
    }

    #[test]
    fn the_example_policy_is_valid() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policy.yaml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        let p = Policy::from_yaml(&text, "examples/policy.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.profile_names(), ["gpu-a100", "resilient", "cpu"]);
        // The failure features' example profile.
        let resilient = p.profile_for("ml-prod");
        assert_eq!(resilient.name, "resilient");
        let nf = resilient.node_failure.as_ref().expect("nodeFailure");
        assert_eq!(nf.reclaim_after.to_string(), "30s");
        assert_eq!(nf.action, NodeFailureAction::ForceDelete);
        assert_eq!(nf.toleration_seconds(), 30);
        let codes = &resilient.crash_loop.fail_fast_exit_codes;
        assert!(codes.contains(2) && codes.contains(126) && codes.contains(127));
        assert!(!codes.contains(1) && !codes.contains(137));
        assert_eq!(resilient.crash_loop.max_failures.failures, 5);
        assert_eq!(resilient.crash_loop.max_failures.window.to_string(), "30m");
        let gpu = p.profile_for("ml-vision");
        assert_eq!(gpu.name, "gpu-a100");
        assert_eq!(
            gpu.nccl["NCCL_SOCKET_IFNAME"],
            Setting {
                value: "net1".to_string(),
                enforce: Enforce::Overwrite
            }
        );
        assert_eq!(gpu.node_selector["karpenter.sh/nodepool"].value, "gpu-a100");
        assert_eq!(
            gpu.node_failure_toleration_seconds,
            Some(Setting {
                value: 30,
                enforce: Enforce::Overwrite
            })
        );
        assert_eq!(gpu.tolerations[0].key.as_deref(), Some("nvidia.com/gpu"));
        assert_eq!(gpu.tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(gpu.tolerations[0].effect.as_deref(), Some("NoSchedule"));
        assert_eq!(p.profile_for("web").name, "cpu");
    }

    #[test]
    fn load_without_a_file_uses_the_embedded_defaults() {
        let p = Policy::default()
            .with_overrides(None, None)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(p.profiles.is_empty());
        assert_eq!(*p.profile_for("any"), Profile::default());
    }

    #[test]
    fn sidecar_image_flag_applies_where_the_image_is_not_enforced() {
        let args = (Some("registry.example/sidecar:dev"), None);
        let p = Policy::default()
            .with_overrides(args.0, args.1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.profile_for("any").sidecar.image.value,
            "registry.example/sidecar:dev"
        );

        let mut p = policy(
            "  - name: free\n    namespaces: [a]\n  - name: pinned\n    namespaces: [b]\n    sidecar:\n      image: {value: registry.example/sidecar:1.0, enforce: overwrite}\n",
        );
        p.apply_sidecar_image("registry.example/sidecar:dev");
        assert_eq!(
            p.profile_for("a").sidecar.image.value,
            "registry.example/sidecar:dev"
        );
        assert_eq!(
            p.profile_for("b").sidecar.image.value,
            "registry.example/sidecar:1.0"
        );
        assert_eq!(
            p.profile_for("c").sidecar.image.value,
            "registry.example/sidecar:dev"
        );
    }

    #[test]
    fn cluster_domain_flag_applies_where_the_profile_names_none() {
        let args = (None, Some("corp.example"));
        let p = Policy::default()
            .with_overrides(args.0, args.1)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.profile_for("any").cluster_domain(), "corp.example");

        let mut p = policy(
            "  - name: free\n    namespaces: [a]\n  - name: own\n    namespaces: [b]\n    clusterDomain: lab.internal\n",
        );
        assert_eq!(p.profile_for("a").cluster_domain(), DEFAULT_CLUSTER_DOMAIN);
        p.apply_cluster_domain("corp.example");
        assert_eq!(p.profile_for("a").cluster_domain(), "corp.example");
        assert_eq!(p.profile_for("b").cluster_domain(), "lab.internal");
        assert_eq!(p.profile_for("c").cluster_domain(), "corp.example");

        let bad = (None, Some("Cluster.Local."));
        let err = Policy::default()
            .with_overrides(bad.0, bad.1)
            .expect_err("accepted");
        assert!(
            err.to_string()
                .starts_with("--cluster-domain: \"Cluster.Local.\" is not a DNS-1123 subdomain"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_sidecar_image_flag_is_refused() {
        let args = (Some("my image"), None);
        let err = Policy::default()
            .with_overrides(args.0, args.1)
            .expect_err("accepted");
        assert_eq!(
            err.to_string(),
            "--sidecar-image \"my image\" is not an image reference (registry/repository:tag or @sha256:digest)"
        );
    }

    #[rstest]
    #[case::no_user_value(None, Enforce::Refuse, Ok(("8Gi", None)))]
    #[case::same_value(Some("8Gi"), Enforce::Refuse, Ok(("8Gi", None)))]
    #[case::default_user_wins(Some("1Gi"), Enforce::Default, Ok(("1Gi", None)))]
    #[case::refused(
        Some("1Gi"),
        Enforce::Refuse,
        Err(
            "policy profile \"p\" rule shmSize: annotation trainwire.dev/shm-size is \"1Gi\", but the policy enforces \"8Gi\"; remove it or set it to that value"
        )
    )]
    #[case::overwritten(
        Some("1Gi"),
        Enforce::Overwrite,
        Ok(("8Gi", Some("policy profile \"p\" rule shmSize: annotation trainwire.dev/shm-size \"1Gi\" overwritten with the enforced \"8Gi\"")))
    )]
    fn resolve_semantics(
        #[case] user: Option<&str>,
        #[case] enforce: Enforce,
        #[case] expected: Result<(&str, Option<&str>), &str>,
    ) {
        let profile = Profile {
            name: "p".to_string(),
            ..Profile::default()
        };
        let setting = Setting {
            value: "8Gi".to_string(),
            enforce,
        };
        let got = resolve(
            &profile,
            "shmSize",
            &setting,
            user.map(|u| (u.to_string(), "annotation trainwire.dev/shm-size")),
        );
        match (got, expected) {
            (Ok(r), Ok((value, warning))) => {
                assert_eq!(r.value, value);
                assert_eq!(r.warning.as_deref(), warning);
            }
            (Err(e), Err(message)) => assert_eq!(e.to_string(), message),
            (got, expected) => panic!("got {got:?}, expected {expected:?}"),
        }
    }
}
