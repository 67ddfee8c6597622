//! PyTorch for the end-to-end tests: whether it is importable, the example
//! training script, and the torchrun command line.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The Python interpreter the tests use (`$TRAINWIRE_PYTHON`, default `python3`).
pub fn python() -> String {
    std::env::var("TRAINWIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// `Ok(version)` when `import torch` works, else why not.
pub fn torch_version() -> Result<String, String> {
    static VERSION: OnceLock<Result<String, String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let out = Command::new(python())
                .args(["-c", "import torch; print(torch.__version__)"])
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run {}: {e}", python()))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                Err(format!(
                    "`{} -c 'import torch'` failed: {}",
                    python(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        })
        .clone()
}

/// Whether the test may run: under `CI=true` (where `.ci/run` installs
/// PyTorch) a missing one fails the test, elsewhere it prints `SKIPPED: ...`
/// (see `trainwire_test_support::require`).
pub fn require_torch(test: &str) -> bool {
    crate::require(
        test,
        crate::Prerequisite::from_result(torch_version().map_err(|why| {
            format!("PyTorch is not importable ({why}); pip install torch numpy to run it")
        })),
    )
}

/// `examples/train.py` in this checkout.
pub fn train_script() -> PathBuf {
    crate::repo_root().join("examples/train.py")
}

/// `python3 -m torch.distributed.run` (the `torchrun` entry point, without
/// depending on where pip put the script).
pub fn torchrun() -> Command {
    let mut cmd = Command::new(python());
    cmd.args(["-m", "torch.distributed.run"]);
    cmd
}

/// The trainer environment the webhook injects for a c10d world, plus what
/// makes torchrun's own restart work after a lost peer (DESIGN.md,
/// "Measured recovery facts").
pub fn webhook_env(
    nnodes: &str,
    nproc_per_node: u32,
    endpoint: &str,
    rdzv_id: &str,
    node_rank: u32,
) -> Vec<(String, String)> {
    [
        ("PET_NNODES", nnodes.to_string()),
        ("PET_NPROC_PER_NODE", nproc_per_node.to_string()),
        ("PET_RDZV_BACKEND", "c10d".to_string()),
        ("PET_RDZV_ENDPOINT", endpoint.to_string()),
        ("PET_RDZV_ID", rdzv_id.to_string()),
        ("PET_MAX_RESTARTS", "3".to_string()),
        ("PET_NODE_RANK", node_rank.to_string()),
        (
            "PET_RDZV_CONF",
            "keep_alive_interval=1,keep_alive_max_attempt=3".to_string(),
        ),
        ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1".to_string()),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_string()),
        ("OMP_NUM_THREADS", "1".to_string()),
        ("PYTHONUNBUFFERED", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A parsed `[trainwire-train] ...` line: its event word and `key=value` fields.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainEvent {
    pub event: String,
    pub fields: Vec<(String, String)>,
}

impl TrainEvent {
    /// Parse a log line from `examples/train.py`; `None` for any other line.
    pub fn parse(line: &str) -> Option<TrainEvent> {
        let rest = &line[line.find("[trainwire-train] ")? + "[trainwire-train] ".len()..];
        let mut words = rest.split_whitespace().peekable();
        let event = match words.peek() {
            Some(w) if !w.contains('=') => words.next().unwrap_or_default().to_string(),
            Some(w) => w.split('=').next().unwrap_or_default().to_string(),
            None => return None,
        };
        let fields = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(TrainEvent { event, fields })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A numeric field (`step`, `resumed_from`, ...); `None` for `none` or missing.
    pub fn num(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|v| v.parse().ok())
    }
}

/// The trainer container's command on a test node: torchrun running
/// `examples/train.py` (a checkpoint every `checkpoint_interval` steps, a
/// step every 0.2 s) through `program` (`ip netns exec NS python3`, as
/// [`crate::netns::Network::command`] gives it), with `agent_token` on the
/// agent's command line (`-X`) so that a sidecar finds its own node's agent
/// in the shared PID namespace, and `env`.
pub fn agent_command(
    program: &[String],
    agent_token: &str,
    checkpoint_interval: u64,
    env: &[(String, String)],
) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(program)
        .args(["-X", agent_token, "-m", "torch.distributed.run"])
        .arg(train_script())
        .args([
            "--steps",
            "100000",
            "--checkpoint-interval",
            &checkpoint_interval.to_string(),
        ])
        .args(["--log-every", "1", "--sleep", "0.2"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_training_log_lines() {
        let e = TrainEvent::parse(
            "[trainwire-train] step=130 loss=0.012345 resumed_from=120 world_size=2",
        )
        .unwrap_or_else(|| panic!("step line"));
        assert_eq!(e.event, "step");
        assert_eq!(e.num("step"), Some(130));
        assert_eq!(e.num("resumed_from"), Some(120));
        let e = TrainEvent::parse(
            "[default0]:[trainwire-train] start rank=1 world_size=2 backend=gloo resumed_from=none checkpoint=none",
        )
        .unwrap_or_else(|| panic!("start line"));
        assert_eq!(e.event, "start");
        assert_eq!(e.num("rank"), Some(1));
        assert_eq!(e.num("resumed_from"), None);
        assert_eq!(e.get("resumed_from"), Some("none"));
        assert!(TrainEvent::parse("W1121 torch warning").is_none());
    }
}
