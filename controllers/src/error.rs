//! The one error of the controllers' reconciles: every controller returns
//! [`Result`], and [`crate::reconcile::error_policy`] logs, counts and
//! retries any of them the same way.

use thiserror::Error;
use trainwire_engine::service::MissingField;

/// Why one reconcile failed. It is logged with the object, counted in
/// `trainwire_webhook_reconcile_errors_total` under its controller, and
/// the object is looked at again after a back-off.
#[derive(Debug, Error)]
pub enum Error {
    /// A call to the API server failed; `action` says which, on what.
    #[error("{action}: {source}{hint}", hint = forbidden_hint(source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// The workload lacks a field every stored object has.
    #[error(transparent)]
    MissingField(#[from] MissingField),
}

impl Error {
    /// A failed API call, described by what it was doing.
    pub fn api(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Api { action, source }
    }
}

/// A refused call names the RBAC objects to check.
fn forbidden_hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.is_forbidden() => {
            " (the ClusterRole trainwire-controllers in manifests/base/rbac.yaml, and the components' ClusterRoles for node-failure and crash-loop, grant what the controllers need; are they applied and bound to the ServiceAccount trainwire-controllers?)"
        }
        _ => "",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
