//! trainwire-policyfile: the platform policy as the cluster programs hold
//! it. The flags that say where it comes from ([`PolicyArgs`]), reading and
//! validating the mounted file ([`load`], [`check`], [`CheckReport`]), the
//! policy in force shared between request handlers and the file watch
//! ([`SharedPolicy`]), and the watch that reloads it when the ConfigMap
//! changes ([`watch`]).
//!
//! The admission server and offline CLI (`trainwire-webhook`) and the
//! controllers (`trainwire-controllers`) both start from here, so they read
//! the same file the same way. It may import the engine (for the policy's
//! grammar), the shared runtime (the directory watch), tokio and clap; it
//! must not import a kube client, a server or either program's crate.

use std::path::Path;

use trainwire_engine::policy::{Policy, PolicyError};

mod watch;

pub use watch::watch;

use prometheus_client::metrics::{counter::Counter, family::Family};
use trainwire_runtime::exposition::{ReloadLabels, ReloadResult, count_reload};

/// Keep the policy of `--policy` in force as its file changes ([`watch`],
/// on a task of its own), counting each reload by result in `reloads`
/// (`trainwire_webhook_policy_reloads_total` of `serve` and of the
/// controllers).
pub fn keep_in_force(
    args: &PolicyArgs,
    policy: &SharedPolicy,
    reloads: Family<ReloadLabels, Counter>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(watch(
        args.clone(),
        policy.clone(),
        Box::new(move |result| {
            let outcome = match result {
                Ok(()) => ReloadResult::success,
                Err(_) => ReloadResult::failure,
            };
            count_reload(&reloads, outcome);
        }),
    ))
}

/// Read and validate the policy file at `path`.
pub fn load_file(path: &Path) -> Result<Policy, PolicyError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| PolicyError::Read {
        path: file.clone(),
        error,
    })?;
    Policy::from_yaml(&text, &file)
}

/// The policy `serve`, `inject` and the controllers run with: the file
/// given by `--policy`, else the embedded defaults; then `--sidecar-image`
/// and `--cluster-domain` applied to every profile that does not enforce
/// its own.
pub fn load(args: &PolicyArgs) -> Result<Policy, PolicyError> {
    let policy = match &args.policy {
        Some(path) => load_file(path)?,
        None => Policy::default(),
    };
    policy.with_overrides(
        args.sidecar_image.as_deref(),
        args.cluster_domain.as_deref(),
    )
}

/// [`load`] at a program's start: the error names the file.
pub fn load_at_start(args: &PolicyArgs) -> Result<Policy, StartError> {
    load(args).map_err(|source| StartError {
        file: args
            .policy
            .as_ref()
            .map(|p| format!(" {}", p.display()))
            .unwrap_or_default(),
        source,
    })
}

/// The policy could not be loaded when the program started.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the platform policy{file}: {source}")]
pub struct StartError {
    file: String,
    #[source]
    source: PolicyError,
}

/// `trainwire-webhook policy check FILE`: the summary line on success
/// (`ok: 2 profiles (gpu-a100, cpu)`), the errors otherwise.
pub fn check(path: &Path) -> Result<String, PolicyError> {
    let policy = load_file(path)?;
    let n = policy.profiles.len();
    Ok(format!(
        "ok: {n} profile{} ({})",
        if n == 1 { "" } else { "s" },
        policy.profile_names().join(", ")
    ))
}

/// `policy check -o json`: the file, whether it is valid, its profiles
/// (when valid) or its errors.
#[derive(Debug, serde::Serialize)]
pub struct CheckReport {
    pub file: String,
    pub valid: bool,
    pub profiles: Vec<String>,
    pub diagnostics: Vec<CheckDiagnostic>,
}

/// One error of a policy file; `line`, `column` and `path` are absent
/// when the file could not be read.
#[derive(Debug, serde::Serialize)]
pub struct CheckDiagnostic {
    pub file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

impl CheckReport {
    /// Check the policy file at `path`.
    pub fn of(path: &Path) -> CheckReport {
        let file = path.display().to_string();
        match load_file(path) {
            Ok(policy) => CheckReport {
                valid: true,
                profiles: policy
                    .profile_names()
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
                diagnostics: Vec::new(),
                file,
            },
            Err(e) => {
                let diagnostics = match &e {
                    PolicyError::Invalid(d) => d
                        .iter()
                        .map(|d| CheckDiagnostic {
                            file: d.file.clone(),
                            line: d.line,
                            column: d.column,
                            path: Some(d.path.to_string()),
                            message: d.message.clone(),
                        })
                        .collect(),
                    PolicyError::Read { error, .. } => vec![CheckDiagnostic {
                        file: file.clone(),
                        line: None,
                        column: None,
                        path: None,
                        message: format!("cannot read the policy file: {error}"),
                    }],
                    other => vec![CheckDiagnostic {
                        file: file.clone(),
                        line: None,
                        column: None,
                        path: None,
                        message: other.to_string(),
                    }],
                };
                CheckReport {
                    file,
                    valid: false,
                    profiles: Vec::new(),
                    diagnostics,
                }
            }
        }
    }
}

/// The policy in force, shared between the server's request handlers and the
/// file watcher that swaps in a new one.
#[derive(Clone, Debug)]
pub struct SharedPolicy(std::sync::Arc<arc_swap::ArcSwap<Policy>>);

impl SharedPolicy {
    pub fn new(policy: Policy) -> Self {
        policy.prepare();
        SharedPolicy(std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(policy)))
    }
    /// The policy in force now.
    pub fn current(&self) -> std::sync::Arc<Policy> {
        self.0.load_full()
    }
    /// Put a new, already validated policy in force.
    pub fn replace(&self, policy: Policy) {
        policy.prepare();
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
    /// The cluster's DNS domain (the kubelet's `--cluster-domain`), unless
    /// the policy names one: the suffix of the pod names injected for the
    /// rendezvous and the sidecar's peers. Default `cluster.local`.
    #[arg(
        long = "cluster-domain",
        env = "TRAINWIRE_CLUSTER_DOMAIN",
        value_name = "DOMAIN"
    )]
    pub cluster_domain: Option<String>,
}
