//! Prometheus metrics of the controllers, served as OpenMetrics text on the
//! probe port's `/metrics`. They keep the `trainwire_webhook_` prefix the
//! alert rules and dashboards (manifests/components/monitoring) query: the
//! names did not change when the controllers became a program of their own.
//! Every label is a small closed set: no names, namespaces or UIDs.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use trainwire_runtime::exposition::{self, ReloadLabels};

/// What the failure controller did.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum FailureAction {
    /// A pod on a dead node deleted with grace period 0.
    force_delete,
    /// A dead node tainted `node.kubernetes.io/out-of-service`.
    out_of_service,
    /// A reclaim held back by `maxPodsPerMinute`.
    rate_limited,
    /// A world stopped at a fail-fast exit code.
    stop_fail_fast,
    /// A world stopped after too many failures.
    stop_max_failures,
    /// A stopped world resumed.
    resume,
}

impl FailureAction {
    pub const ALL: [FailureAction; 6] = [
        FailureAction::force_delete,
        FailureAction::out_of_service,
        FailureAction::rate_limited,
        FailureAction::stop_fail_fast,
        FailureAction::stop_max_failures,
        FailureAction::resume,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub action: FailureAction,
}

/// The controller whose reconcile failed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Controller {
    /// Headless Services and dedicated stores ([`crate::reconciler`]).
    services,
    /// The `trainwire.dev/world` status ([`crate::world`]).
    world,
    /// Peer-loss Events, dead-node reclaim, crash-loop stop ([`crate::failures`]).
    failures,
}

impl Controller {
    pub const ALL: [Controller; 3] = [
        Controller::services,
        Controller::world,
        Controller::failures,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: Controller,
}

/// All metrics, registered under the `trainwire_webhook_` prefix, and
/// `trainwire_build_info`.
pub struct Metrics {
    registry: Registry,
    pub policy_reloads: Family<ReloadLabels, Counter>,
    pub failure_actions: Family<FailureLabels, Counter>,
    /// Reconciles that failed and were retried after a back-off.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        exposition::register_build_info(&mut root);
        let registry = root.sub_registry_with_prefix("trainwire_webhook");
        let policy_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "policy_reloads",
            "Platform policy file reloads, by result",
            policy_reloads.clone(),
        );
        let failure_actions = Family::<FailureLabels, Counter>::default();
        registry.register(
            "failure_actions",
            "What the failure controller did: dead-node reclaims, crash-loop stops, resumes",
            failure_actions.clone(),
        );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles that failed and were retried after a back-off, by controller",
            reconcile_errors.clone(),
        );
        exposition::initialise_reloads(&policy_reloads);
        for action in FailureAction::ALL {
            let _ = failure_actions.get_or_create(&FailureLabels { action });
        }
        for controller in Controller::ALL {
            let _ = reconcile_errors.get_or_create(&ControllerLabels { controller });
        }
        Metrics {
            registry: root,
            policy_reloads,
            failure_actions,
            reconcile_errors,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Count one failed reconcile of `controller`.
    pub fn reconcile_failed(&self, controller: Controller) {
        self.reconcile_errors
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_series_before_any_event() {
        let text = Metrics::new().encode();
        for line in [
            r#"trainwire_webhook_policy_reloads_total{result="failure"} 0"#,
            r#"trainwire_webhook_failure_actions_total{action="stop_fail_fast"} 0"#,
            r#"trainwire_webhook_reconcile_errors_total{controller="world"} 0"#,
            "trainwire_build_info{",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
