//! One replica at a time: the controllers (`trainwire-controllers`: the
//! reconciler, the world and failure controllers) run only on the replica that holds
//! the `coordination.k8s.io` Lease [`LEASE_NAME`] in their own
//! namespace, so two replicas never act twice (two force-deletes of one pod,
//! two stops of one world).
//!
//! The Lease is kept by `kube-lease-manager` (server-side apply of
//! `holderIdentity`, a conflict for the loser). The holder renews it
//! [`LEASE_GRACE_SECONDS`] before it expires; a replica that dies is replaced
//! as holder at most [`LEASE_DURATION_SECONDS`] later. When this replica
//! loses the Lease its controllers are stopped (their tasks aborted) before
//! anything else is done; when it gets it, they start afresh from a new list
//! and watch (their in-memory state, e.g. the crash-loop counters, starts
//! empty).

use std::future::Future;
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use thiserror::Error;
use tracing::{info, warn};

/// The Lease the controllers share.
pub const LEASE_NAME: &str = "trainwire-webhook-controllers";
/// How long a holder's claim is valid after its last renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before expiry the holder renews.
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// Every Kubernetes API call the Lease takes, as `(API group, resource,
/// verb)`, granted by the Role in `manifests/base/rbac.yaml` in the webhook's
/// namespace only.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("coordination.k8s.io", "leases", "get"),
    ("coordination.k8s.io", "leases", "create"),
    ("coordination.k8s.io", "leases", "patch"),
];

#[derive(Debug, Error)]
pub enum Error {
    #[error("the Lease {namespace}/{LEASE_NAME}: {source}")]
    Lease {
        namespace: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
}

/// Where the Lease lives and who this replica is.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    /// Unique among replicas: the pod name.
    pub identity: String,
    pub duration_seconds: u64,
    pub grace_seconds: u64,
}

impl LeaseConfig {
    pub fn new(namespace: String, identity: String) -> Self {
        LeaseConfig {
            namespace,
            identity,
            duration_seconds: LEASE_DURATION_SECONDS,
            grace_seconds: LEASE_GRACE_SECONDS,
        }
    }
}

/// Run `work()` while this replica holds the Lease: started when it is
/// acquired, aborted when it is lost, started again when it comes back.
/// Returns only on an error of the Lease itself (the caller retries).
pub async fn run_while_leader<F, Fut>(
    client: kube::Client,
    config: LeaseConfig,
    work: F,
) -> Result<(), Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let lease_err = |source| Error::Lease {
        namespace: config.namespace.clone(),
        source,
    };
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(config.namespace.clone())
        .with_identity(config.identity.clone())
        .with_field_manager(format!("trainwire-lease-{}", config.identity))
        .with_duration(config.duration_seconds)
        .with_grace(config.grace_seconds)
        .build()
        .await
        .map_err(lease_err)?;
    // `changed()` rather than `watch()`: `watch()` only logs a failed
    // renewal and keeps its last answer (still the holder), so a replica cut
    // off from the API server would go on acting after its Lease expired and
    // another replica took it. Here any Lease error stops the controllers
    // first; the caller then starts over with a fresh manager, which is the
    // holder again only if the Lease is still this replica's.
    let mut running: Option<tokio::task::JoinHandle<()>> = None;
    let stop = |running: &mut Option<tokio::task::JoinHandle<()>>, why: &str| {
        if let Some(task) = running.take() {
            warn!(identity = %config.identity, lease = LEASE_NAME, why, "stopping the controllers");
            task.abort();
        }
    };
    loop {
        match manager.changed().await {
            Ok(true) => {
                if running.is_none() {
                    info!(identity = %config.identity, lease = LEASE_NAME, "holding the controllers' Lease: starting the controllers");
                    running = Some(tokio::spawn(work()));
                }
            }
            Ok(false) => stop(&mut running, "lost the controllers' Lease"),
            Err(source) => {
                stop(&mut running, "could not keep the controllers' Lease");
                return Err(lease_err(source));
            }
        }
    }
}

/// [`run_while_leader`] forever: a Lease error is logged and retried.
pub async fn supervise<F, Fut>(client: kube::Client, config: LeaseConfig, work: F)
where
    F: Fn() -> Fut + Clone,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        if let Err(e) = run_while_leader(client.clone(), config.clone(), work.clone()).await {
            warn!(error = %e, "the controllers' Lease failed; retrying in 5 s");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
