//! `kubectl trainwire`: a kubectl plugin that shows trainwire's training
//! worlds and tells whether a workload would be injected.
//!
//! - `kubectl trainwire status [NAME]`: the worlds of a namespace (a table),
//!   or one world and its ranks.
//! - `kubectl trainwire check-inject NAME`: whether the webhook would inject
//!   the workload as it is stored now, with which policy profile, and the
//!   warnings it would give (the webhook's own engine, run here).
//!
//! It reads only what the API server holds: the workloads (StatefulSets,
//! Jobs) and their pods, the `trainwire.dev/world` annotation the
//! controller keeps ([`trainwire_contract::world`]) and the records the
//! sidecars keep on their pods; `check-inject` also tries the policy
//! ConfigMap. No port-forward, no exec. Cluster access as kubectl:
//! `--kubeconfig`, `--context`, `-n/--namespace`, `$KUBECONFIG`, in-cluster.
//!
//! It may import the engine (the webhook's own decisions, the pod and world
//! views), the contract, kube's client, k8s-openapi, clap and tokio. It must
//! not import either server (`trainwire-webhook`, `trainwire-controllers`),
//! the sidecar, axum, rcgen or the Lease manager: it is a client, and
//! `tests/tests/layering.rs` holds it to that.

pub mod check_inject;
pub mod cluster;
pub mod render;
pub mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;
use thiserror::Error;

/// What went wrong, with what to do about it.
#[derive(Debug, Error)]
pub enum Error {
    #[error("cluster access: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "no StatefulSet or Job named {name:?} in namespace {namespace:?} (name it as NAME, statefulset/NAME or job/NAME; -n sets the namespace)"
    )]
    NotFound { name: String, namespace: String },
    #[error(
        "{0:?} is not a workload trainwire manages: accepted: NAME, statefulset/NAME, job/NAME"
    )]
    Kind(String),
    #[error("policy {file}: {message}")]
    Policy { file: String, message: String },
    #[error("writing the output: {0}")]
    Output(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Output formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tables and lines for a terminal.
    #[default]
    Text,
    Json,
    Yaml,
}

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-trainwire",
    bin_name = "kubectl trainwire",
    version,
    about = "The state of trainwire's training worlds, and whether a workload would be injected"
)]
pub struct Cli {
    /// The namespace (default: the context's, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Compute ages as of this time (RFC 3339) instead of now: reproducible
    /// output.
    #[arg(long, global = true, hide = true, value_name = "TIME")]
    pub now: Option<Timestamp>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The worlds of the namespace, or one world's ranks.
    Status {
        /// A StatefulSet or Job: NAME, statefulset/NAME or job/NAME.
        name: Option<String>,
    },
    /// Whether a workload would be injected, with which policy profile, and
    /// the warnings it would get.
    CheckInject {
        /// A StatefulSet or Job: NAME, statefulset/NAME or job/NAME.
        name: String,
        /// A policy file to judge with, instead of the cluster's policy
        /// ConfigMap.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Where the webhook's policy ConfigMap (`trainwire-policy`) lives.
        #[arg(long, value_name = "NAMESPACE", default_value = "trainwire-system")]
        policy_namespace: String,
    },
}

impl Cli {
    /// Run the command; the text to print on stdout.
    pub async fn run(self) -> Result<String> {
        let (client, namespace) = cluster::connect(
            self.kubeconfig.as_deref(),
            self.context.as_deref(),
            self.namespace,
        )
        .await?;
        let now = self.now.unwrap_or_else(Timestamp::now);
        match self.command {
            Command::Status { name: None } => {
                let worlds = status::list(&client, &namespace, now).await?;
                render::output(self.output, &worlds, || render::worlds(&worlds, now))
            }
            Command::Status { name: Some(name) } => {
                let world = status::one(&client, &namespace, &name, now).await?;
                render::output(self.output, &world, || render::world(&world, now))
            }
            Command::CheckInject {
                name,
                policy,
                policy_namespace,
            } => {
                let report = check_inject::check(
                    &client,
                    &namespace,
                    &name,
                    policy.as_deref(),
                    &policy_namespace,
                )
                .await?;
                render::output(self.output, &report, || render::check(&report))
            }
        }
    }
}
