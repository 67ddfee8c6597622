//! TensorFlow for the end-to-end tests: whether it is importable, and the
//! example training script.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::torch::python;

/// `Ok(version)` when `import tensorflow` works, else why not.
pub fn tensorflow_version() -> Result<String, String> {
    static VERSION: OnceLock<Result<String, String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let out = Command::new(python())
                .args(["-c", "import tensorflow as tf; print(tf.__version__)"])
                .env("TF_CPP_MIN_LOG_LEVEL", "3")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", python()))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                let err = String::from_utf8_lossy(&out.stderr);
                Err(format!(
                    "`{} -c 'import tensorflow'` failed: {}",
                    python(),
                    err.lines().last().unwrap_or_default().trim()
                ))
            }
        })
        .clone()
}

/// Whether the test may run: under `CI=true` (where `.ci/run` installs
/// `tensorflow-cpu`) a missing TensorFlow fails the test, elsewhere it
/// prints `SKIPPED: ...`.
pub fn require_tensorflow(test: &str) -> bool {
    crate::require(
        test,
        crate::Prerequisite::from_result(tensorflow_version().map_err(|why| {
            format!("TensorFlow is not importable ({why}); pip install tensorflow-cpu to run it")
        })),
    )
}

/// `examples/train_tf.py` in this checkout.
pub fn train_script() -> PathBuf {
    crate::repo_root().join("examples/train_tf.py")
}
