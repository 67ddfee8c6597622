//! Shared helpers for the integration tests and benchmarks.

use std::path::PathBuf;

// The helpers every crate's tests share live in `trainwire-test-support`;
// the old paths (`trainwire_tests::process`, `repo_root`, ...) stay valid.
pub use trainwire_test_support::{
    Prerequisite, admission_fixtures_dir, fixtures, net, process, repo_root, require, sidecar, wait,
};

pub mod apiserver;
pub mod cluster_api;
pub mod fuzz;
pub mod kubelet;
pub mod mock_api;
pub mod netns;
pub mod real_node;
pub mod rendered;
pub mod scale;
pub mod tensorflow;
pub mod torch;
pub mod world_status;

/// The `trainwire-sidecar` binary of this build (`target/<profile>/`).
///
/// `cargo nextest run --workspace` builds it (the sidecar crate has
/// integration tests). When it is missing or older than its sources (the
/// sidecar, contract and runtime crates), it is built with `cargo build -p trainwire-sidecar` first.
/// `$TRAINWIRE_SIDECAR_BIN` overrides it (a release build, say).
pub fn sidecar_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("TRAINWIRE_SIDECAR_BIN") {
        return Ok(PathBuf::from(bin));
    }
    workspace_binary(
        "trainwire-sidecar",
        &["sidecar", "contract", "runtime", "Cargo.lock"],
    )
}

/// `target/<profile>/<package>` (the package's binary of the same name),
/// built with `cargo build -p <package>` when it is missing or older than
/// `sources` (paths under the repository).
fn workspace_binary(package: &str, sources: &[&str]) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test binary> -> target/<profile>/<package>
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(package))
        .ok_or_else(|| format!("cannot find the target directory from {}", exe.display()))?;
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let root = repo_root();
    // The package's own sources and the crates it is built from.
    let sources = sources
        .iter()
        .filter_map(|p| newest_mtime(&root.join(p)))
        .max();
    if built.is_some_and(|b| sources.is_none_or(|s| s <= b)) {
        return Ok(bin);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let out = std::process::Command::new(&cargo)
        .args(["build", "-p", package, "--bin", package])
        .current_dir(&root)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`cargo build -p {package}` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} does not exist after the build", bin.display()))
    }
}

/// The `trainwire-webhook` binary of this build (`target/<profile>/`), for
/// tests that run the real `inject` CLI; built with `cargo build -p
/// trainwire-webhook` when missing or older than its sources.
/// `$TRAINWIRE_WEBHOOK_BIN` overrides it.
pub fn webhook_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("TRAINWIRE_WEBHOOK_BIN") {
        return Ok(PathBuf::from(bin));
    }
    workspace_binary(
        "trainwire-webhook",
        &[
            "webhook",
            "engine",
            "policyfile",
            "contract",
            "runtime",
            "Cargo.lock",
        ],
    )
}

/// The `trainwire-controllers` binary of this build, built when missing or
/// older than its sources. `$TRAINWIRE_CONTROLLERS_BIN` overrides it.
pub fn controllers_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("TRAINWIRE_CONTROLLERS_BIN") {
        return Ok(PathBuf::from(bin));
    }
    workspace_binary(
        "trainwire-controllers",
        &[
            "controllers",
            "engine",
            "policyfile",
            "contract",
            "runtime",
            "Cargo.lock",
        ],
    )
}

/// The newest modification time of a file, or of the files under a directory.
fn newest_mtime(path: &std::path::Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_file() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|e| newest_mtime(&e.path()))
        .max()
}
