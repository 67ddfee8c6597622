//! The repository and its captured AdmissionReview requests.

use std::path::PathBuf;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The captured AdmissionReview requests, the repository's own copy of the
/// shared fixtures (`tests/fixtures/admission/`), so a clone tests alone.
pub fn admission_fixtures_dir() -> PathBuf {
    repo_root().join("tests/fixtures/admission")
}

/// The bytes of one capture.
pub fn fixture_bytes(name: &str) -> Vec<u8> {
    let path = admission_fixtures_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// One capture as JSON.
pub fn fixture(name: &str) -> serde_json::Value {
    serde_json::from_slice(&fixture_bytes(name))
        .unwrap_or_else(|e| panic!("fixture {name} is not JSON: {e}"))
}

/// Every capture's file name (`*.json` directly in the folder), sorted.
pub fn fixture_names() -> Vec<String> {
    let dir = admission_fixtures_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 17,
        "expected the captured fixtures, found {names:?}"
    );
    names
}

/// `(request.object, request.namespace)` of one capture.
pub fn request_object(name: &str) -> (serde_json::Value, String) {
    let review = fixture(name);
    let namespace = review["request"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (review["request"]["object"].clone(), namespace)
}
