//! trainwire-controllers: the program that acts on stored objects, apart
//! from the admission server (its own Deployment, ServiceAccount and RBAC:
//! `manifests/base/controllers.yaml`), so the process the apiserver calls on
//! every admission holds no write right and the controllers' caches never
//! share a memory limit with the admission path. On the replica that holds
//! the Lease ([`lease`]) it runs the reconciler of headless Services and
//! dedicated stores ([`reconciler`]), the world status ([`world`]), and the
//! failure controller ([`failures`], with [`nodefailure`] and [`crashloop`]);
//! [`cli`] is its command line and start-up.
//!
//! It may import the engine (every decision that needs no API call is a
//! pure function there or in a module here, tested as a table), the
//! contract, the policy file (`trainwire-policyfile`), the shared runtime,
//! kube's client and runtime, tokio and axum (the probe endpoint). It must
//! not import the admission server's crate (`trainwire-webhook`) nor the
//! sidecar's; `tests/tests/layering.rs` holds it to that.
//!
//! The controllers share one frame: one [`Error`] and [`Result`], one
//! context built once per process ([`reconcile::Shared`]: client, policy,
//! metrics, clock, Event recorder), one [`reconcile::error_policy`], and
//! one watch per kind ([`watches`]) whose changes each controller filters
//! its own way.
//!
//! Adding a controller: a module here with its `run(shared, watches, ...)`
//! (its context holds the [`reconcile::Shared`] and implements
//! [`reconcile::Reconciler`] with a [`metrics::Controller`] label for its
//! failed reconciles), its `API_PERMISSIONS` (in [`API_PERMISSIONS`], which
//! the RBAC test holds `manifests/base/rbac.yaml` to), and one entry in
//! [`cli`]'s `supervise`.

pub mod cli;
pub mod crashloop;
pub mod error;
pub mod failures;
pub mod lease;
pub mod metrics;
pub mod nodefailure;
pub mod reconcile;
pub mod reconciler;
pub mod watches;
pub mod world;

pub use error::{Error, Result};

/// Where a right is granted: cluster-wide (a ClusterRole) or in the
/// controllers' own namespace (a Role).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Cluster,
    OwnNamespace,
}

/// Every Kubernetes API call of the controllers the base install runs, as
/// `(API group, resource, verb)` per controller and scope; the failure
/// controller's features add [`failures::Features::permissions`]. The RBAC
/// test holds `manifests/base/rbac.yaml` to exactly these.
/// Kubernetes API calls as `(API group, resource, verb)`.
pub type Calls = &'static [(&'static str, &'static str, &'static str)];

pub const API_PERMISSIONS: &[(&str, Scope, Calls)] = &[
    ("reconciler", Scope::Cluster, reconciler::API_PERMISSIONS),
    ("world", Scope::Cluster, world::API_PERMISSIONS),
    ("lease", Scope::OwnNamespace, lease::API_PERMISSIONS),
];
