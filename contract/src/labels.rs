//! The labels trainwire sets. The label every pod of an injected workload carries, so that the
//! controllers watch only those pods (a label selector on the watch: the
//! apiserver filters, the controllers never receive the cluster's other
//! pods) and a ValidatingAdmissionPolicy can tell a trainwire pod apart.
//!
//! The engine sets it on the pod template of every workload it injects and
//! never counts it as the user's input (re-injection strips it first).

/// The label key.
pub const INJECTED: &str = "trainwire.dev/injected";

/// Its only value.
pub const INJECTED_VALUE: &str = "true";

/// The label selector of the watches, `trainwire.dev/injected=true`.
pub fn injected_selector() -> String {
    format!("{INJECTED}={INJECTED_VALUE}")
}

/// The label on every object the controllers create (a Job's headless
/// Service, a dedicated store's Deployment and Service), with the value
/// [`MANAGED_BY`]: what they may change or delete.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// The managed-by marker's value.
pub const MANAGED_BY: &str = "trainwire";

/// The label of a dedicated rendezvous store's pods (its value: the
/// workload's name).
pub const RDZV_STORE: &str = "trainwire.dev/rdzv-store";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_is_key_equals_value() {
        assert_eq!(injected_selector(), "trainwire.dev/injected=true");
    }
}
