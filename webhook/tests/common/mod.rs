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
