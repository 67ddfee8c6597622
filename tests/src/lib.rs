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

pub mod kubelet;
pub mod netns;
pub mod process;
pub mod torch;

/// The `trainwire-sidecar` binary of this build (`target/<profile>/`),
/// built first with `cargo build -p trainwire-sidecar` so it is current;
/// `$TRAINWIRE_SIDECAR_BIN` overrides it (a release build, say).
pub fn sidecar_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("TRAINWIRE_SIDECAR_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test binary> -> target/<profile>/trainwire-sidecar
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("trainwire-sidecar"))
        .ok_or_else(|| format!("cannot find the target directory from {}", exe.display()))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let built = std::process::Command::new(&cargo)
        .args([
            "build",
            "-p",
            "trainwire-sidecar",
            "--bin",
            "trainwire-sidecar",
        ])
        .current_dir(repo_root())
        .stdin(std::process::Stdio::null())
        .output();
    match built {
        Ok(out) if out.status.success() => {}
        Ok(out) if !bin.is_file() => {
            return Err(format!(
                "`cargo build -p trainwire-sidecar` failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Err(e) if !bin.is_file() => return Err(format!("cannot run {cargo}: {e}")),
        _ => {}
    }
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} does not exist after the build", bin.display()))
    }
}
