//! `trainwire-controllers`: the command line and start-up of the
//! controllers, in a Deployment of their own with a ServiceAccount of their
//! own (`manifests/base/controllers.yaml`).
//!
//! On the replica that holds the Lease ([`crate::lease`]) it runs:
//!
//! - the reconciler ([`crate::reconciler`]): headless Services and dedicated
//!   rendezvous stores of injected workloads;
//! - the world controller ([`crate::world`]): the `trainwire.dev/world`
//!   annotation;
//! - the failure controller ([`crate::failures`]): peer-loss Events, plus
//!   dead-node reclaim with `--node-failure` and crash-loop stop with
//!   `--crash-loop`, each of which needs rights the base install does not
//!   grant (`manifests/components/node-failure`, `.../crash-loop`). A
//!   feature left off starts no watch and makes no call.
//!
//! `--probe-listen` (plain HTTP) serves `/healthz`, `/readyz` and
//! `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use clap::Parser;

use k8s_openapi::jiff::Timestamp;

use crate::failures::Features;
use crate::metrics::Metrics;
use crate::reconcile::Shared;
use crate::watches::Watches;
use trainwire_policyfile::{PolicyArgs, SharedPolicy};
use trainwire_runtime::telemetry::TelemetryArgs;

/// Runs the controllers (headless Services and dedicated stores, the world
/// status, peer-loss Events, dead-node reclaim and crash-loop stop) on the
/// replica that holds the Lease.
#[derive(Debug, Parser)]
#[command(
    name = "trainwire-controllers",
    version,
    about = "trainwire's controllers: Services and stores, world status, failures"
)]
pub struct ControllersArgs {
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Namespace of the Lease that lets one replica at a time run the
    /// controllers (normally the controllers' own, from the downward API).
    #[arg(
        long,
        env = "TRAINWIRE_LEASE_NAMESPACE",
        value_name = "NAMESPACE",
        default_value = "trainwire-system"
    )]
    pub lease_namespace: String,
    /// Dead-node reclaim (the policy's `nodeFailure`): watches Nodes,
    /// force-deletes pods, taints nodes. Needs the rights of
    /// manifests/components/node-failure. Off: `nodeFailure` in the policy
    /// only sets the pods' tolerations.
    #[arg(
        long,
        env = "TRAINWIRE_NODE_FAILURE",
        value_name = "BOOL",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub node_failure: bool,
    /// Crash-loop stop (`crashLoop`, `trainwire.dev/max-failures`,
    /// `trainwire.dev/fail-fast-exit-codes`) and `trainwire.dev/resume`:
    /// watches StatefulSets and Jobs, scales to 0 or suspends. Needs the
    /// rights of manifests/components/crash-loop.
    #[arg(
        long,
        env = "TRAINWIRE_CRASH_LOOP",
        value_name = "BOOL",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub crash_loop: bool,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

impl ControllersArgs {
    /// The failure controller's features these flags turn on.
    pub fn features(&self) -> Features {
        Features {
            node_failure: self.node_failure,
            crash_loop: self.crash_loop,
        }
    }
}

/// What the probe endpoint shares.
#[derive(Clone)]
struct ProbeState {
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
}

fn probe_router(state: ProbeState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<ProbeState>) -> Response {
    if state.stopping.load(Ordering::SeqCst) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down\n",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

async fn metrics(State(state): State<ProbeState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) =
        trainwire_runtime::exposition::negotiate(accept, state.metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// A policy that asks for a feature this process runs without: said once
/// at start, since the policy's `nodeFailure` or `crashLoop` then does
/// nothing (but the tolerations).
fn warn_disabled(policy: &SharedPolicy, features: Features) {
    let current = policy.current();
    for profile in &current.profiles {
        if profile.node_failure.is_some() && !features.node_failure {
            tracing::warn!(
                profile = %profile.name,
                "the profile sets nodeFailure but dead-node reclaim is off (--node-failure=false, manifests/components/node-failure turns it on): no pod is reclaimed"
            );
        }
        if !profile.crash_loop.is_default() && !features.crash_loop {
            tracing::warn!(
                profile = %profile.name,
                "the profile sets crashLoop but crash-loop stop is off (--crash-loop=false, manifests/components/crash-loop turns it on): no world is stopped"
            );
        }
    }
}

/// The controllers, on the replica that holds the Lease only.
async fn supervise(
    client: kube::Client,
    namespace: String,
    policy: SharedPolicy,
    metrics: Arc<Metrics>,
    features: Features,
) {
    let identity = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("trainwire-controllers-{}", std::process::id()));
    let config = crate::lease::LeaseConfig::new(namespace, identity);
    crate::lease::supervise(client.clone(), config, move || {
        // One context and one watch per kind for every controller, made
        // anew each time this replica takes the Lease.
        let shared = Shared::new(
            client.clone(),
            policy.clone(),
            metrics.clone(),
            Box::new(Timestamp::now),
        );
        let watches = Watches::new();
        let reconciler = crate::reconciler::run(shared.clone(), &watches);
        let failures = crate::failures::run(shared.clone(), &watches, features);
        let world = crate::world::run(shared, &watches);
        let watching = watches.run(client.clone());
        async move {
            futures::join!(watching, reconciler, failures, world);
        }
    })
    .await;
}

pub async fn run(args: ControllersArgs) -> anyhow::Result<()> {
    trainwire_runtime::telemetry::init(args.telemetry.log_format);
    let metrics = Arc::new(Metrics::new());
    let features = args.features();
    let loaded = trainwire_policyfile::load_at_start(&args.policy)?;
    let policy = SharedPolicy::new(loaded);
    warn_disabled(&policy, features);
    let client = kube::Client::try_default()
        .await
        .context("the controllers need the Kubernetes API (in-cluster config or KUBECONFIG)")?;

    let policy_watch =
        trainwire_policyfile::keep_in_force(&args.policy, &policy, metrics.policy_reloads.clone());
    let controllers = tokio::spawn(supervise(
        client,
        args.lease_namespace.clone(),
        policy,
        metrics.clone(),
        features,
    ));

    let stopping = Arc::new(AtomicBool::new(false));
    let probe_listener = args.telemetry.bind_probes().await?;
    let probe_addr = probe_listener.local_addr()?;
    tracing::info!(probe_listen = %probe_addr, node_failure = features.node_failure, crash_loop = features.crash_loop, "running the controllers");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let probe = tokio::spawn({
        let router = probe_router(ProbeState {
            metrics,
            stopping: stopping.clone(),
        });
        async move {
            let stop = async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            };
            if let Err(e) = axum::serve(probe_listener, router)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!(error = %e, "the probe server stopped");
            }
        }
    });

    let signal = trainwire_runtime::shutdown::signal().await;
    tracing::info!(signal, "shutting down: stopping the controllers");
    stopping.store(true, Ordering::SeqCst);
    // Aborting drops the Lease manager and the watches; another replica
    // takes the Lease once it expires.
    controllers.abort();
    policy_watch.abort();
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), probe).await;
    tracing::info!("stopped");
    Ok(())
}
