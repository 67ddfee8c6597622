//! Helpers shared by the webhook's integration tests.
#![allow(dead_code)]

/// The repository's copy of the captured AdmissionReview requests
/// (`tests/fixtures/admission/`), loaded by the shared test support.
pub use trainwire_test_support::fixtures::{fixture, fixture_bytes, fixture_names};

/// The container named `trainer`, else the first, of a workload's pod template.
pub fn trainer(object: &serde_json::Value) -> &serde_json::Value {
    let containers = object["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    containers
        .iter()
        .find(|c| c["name"] == "trainer")
        .unwrap_or(&containers[0])
}

pub fn env_value<'a>(
    container: &'a serde_json::Value,
    name: &str,
) -> Option<&'a serde_json::Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// Apply an AdmissionResponse's base64 patch (as serialized by kube) to `object`.
pub fn apply_response_patch(
    response: &serde_json::Value,
    object: &serde_json::Value,
) -> serde_json::Value {
    let mut patched = object.clone();
    if let Some(patch_b64) = response["patch"].as_str() {
        assert_eq!(response["patchType"], "JSONPatch");
        let bytes = base64_decode(patch_b64);
        let patch: json_patch::Patch =
            serde_json::from_slice(&bytes).expect("patch is a JSON Patch");
        json_patch::patch(&mut patched, &patch).expect("the patch applies to request.object");
    }
    patched
}

pub fn base64_decode(input: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(input)
        .expect("patch is base64")
}

/// The server's state with the default policy, `statefulsets` for the scale
/// guard and no certificate, for driving the router in process.
pub fn app_state(
    statefulsets: std::sync::Arc<dyn trainwire_webhook::scale::StatefulSetSource>,
) -> trainwire_webhook::serve::AppState {
    use std::sync::Arc;
    use trainwire_webhook::admission::Admitter;
    use trainwire_webhook::metrics::Metrics;
    use trainwire_webhook::serve::{AppState, Readiness};
    use trainwire_webhook::tls::CertStore;
    use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

    let metrics = Arc::new(Metrics::new());
    AppState {
        admitter: Admitter {
            policy: SharedPolicy::new(Policy::default()),
            statefulsets,
            metrics: metrics.clone(),
        },
        certs: Arc::new(CertStore::new(
            "/nonexistent/tls.crt".into(),
            "/nonexistent/tls.key".into(),
            metrics.clone(),
        )),
        metrics,
        readiness: Arc::new(Readiness::default()),
    }
}
