//! Shared helpers for the integration tests and benchmarks.

use std::path::PathBuf;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The project's `shared/` folder (DESIGN.md, fixtures): `$TRAINWIRE_SHARED`,
/// else `../shared` beside the checkout, else `/work/shared`.
pub fn shared_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TRAINWIRE_SHARED") {
        return PathBuf::from(dir);
    }
    let beside = repo_root().join("../shared");
    if beside.join("fixtures").is_dir() {
        return beside;
    }
    PathBuf::from("/work/shared")
}

/// The captured AdmissionReview fixtures.
pub fn admission_fixtures_dir() -> PathBuf {
    shared_dir().join("fixtures/admission")
}

pub mod process;
pub mod torch;
