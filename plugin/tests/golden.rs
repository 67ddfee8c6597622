//! The real `kubectl-trainwire` binary against a fake API server that
//! answers from recorded responses (`tests/api/`, see its README), through a
//! temporary kubeconfig: each case's exit code, stdout and stderr must match
//! `tests/golden/<case>.txt`. `TRAINWIRE_BLESS=1` rewrites the goldens from
//! the binary's output (review the diff).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, ensure};

mod recorded_api;
use recorded_api::{RecordedApiServer, write_kubeconfig};

/// The clock of every case (`--now`): ages are stable.
const NOW: &str = "2026-11-25T10:00:00Z";

const CASES: &[(&str, &[&str])] = &[
    ("status-list", &["status"]),
    ("status-list-json", &["status", "-o", "json"]),
    ("status-statefulset", &["status", "llama-ft"]),
    (
        "status-statefulset-yaml",
        &["status", "statefulset/llama-ft", "-o", "yaml"],
    ),
    ("status-job-no-world-yet", &["status", "job/bert-pretrain"]),
    ("status-stopped", &["status", "gpt-small"]),
    ("status-empty-namespace", &["-n", "empty", "status"]),
    (
        "status-named-context",
        &["--context", "fake", "status", "job/bert-pretrain"],
    ),
    ("status-unknown-context", &["--context", "nope", "status"]),
    ("status-not-found", &["status", "nope"]),
    ("status-bad-kind", &["status", "deployment/web"]),
    ("worlds-list", &["-n", "worlds", "status"]),
    (
        "worlds-list-json",
        &["-n", "worlds", "status", "-o", "json"],
    ),
    ("worlds-forming", &["-n", "worlds", "status", "forming"]),
    ("worlds-running", &["-n", "worlds", "status", "running"]),
    ("worlds-lost-pod", &["-n", "worlds", "status", "lost-pod"]),
    (
        "worlds-lost-store",
        &["-n", "worlds", "status", "lost-store"],
    ),
    ("worlds-not-seen", &["-n", "worlds", "status", "not-seen"]),
    (
        "worlds-resumed-workers",
        &["-n", "worlds", "status", "resumed-workers"],
    ),
    (
        "worlds-resumed-spare",
        &["-n", "worlds", "status", "resumed-spare"],
    ),
    (
        "worlds-resumed-checkpoint",
        &["-n", "worlds", "status", "resumed-checkpoint"],
    ),
    (
        "worlds-resumed-restart",
        &["-n", "worlds", "status", "resumed-restart"],
    ),
    ("worlds-paused", &["-n", "worlds", "status", "paused"]),
    ("worlds-stopped", &["-n", "worlds", "status", "stopped"]),
    (
        "worlds-running-json",
        &["-n", "worlds", "status", "running", "-o", "json"],
    ),
    (
        "worlds-lost-store-json",
        &["-n", "worlds", "status", "lost-store", "-o", "json"],
    ),
    (
        "worlds-resumed-spare-json",
        &["-n", "worlds", "status", "resumed-spare", "-o", "json"],
    ),
    ("check-inject-injected", &["check-inject", "llama-ft"]),
    (
        "check-inject-injected-json",
        &["check-inject", "llama-ft", "-o", "json"],
    ),
    ("check-inject-not-opted-in", &["check-inject", "web"]),
    ("check-inject-refused", &["check-inject", "typo"]),
    (
        "check-inject-misspelt-opt-in",
        &["check-inject", "misspelt"],
    ),
    (
        "check-inject-no-policy-configmap",
        &[
            "check-inject",
            "job/bert-pretrain",
            "--policy-namespace",
            "elsewhere",
        ],
    ),
];

fn here() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests")
}

fn run(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-trainwire"))
        .args(args)
        .args(["--kubeconfig"])
        .arg(kubeconfig)
        .args(["--now", NOW])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .context("running kubectl-trainwire")?;
    let text = format!(
        "$ kubectl trainwire {}\nexit: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The temporary directory's name changes from run to run.
    Ok(text.replace(&kubeconfig.display().to_string(), "KUBECONFIG"))
}

#[tokio::test(flavor = "multi_thread")]
async fn output_matches_the_goldens() -> Result<()> {
    let server = RecordedApiServer::start(&here().join("api"))?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = write_kubeconfig(dir.path(), server.addr, "trainwire-test")?;
    let bless = std::env::var_os("TRAINWIRE_BLESS").is_some();
    let mut mismatched = Vec::new();
    for (case, args) in CASES {
        let kubeconfig = kubeconfig.clone();
        let args: Vec<&'static str> = args.to_vec();
        let got = tokio::task::spawn_blocking(move || run(&kubeconfig, &args)).await??;
        let golden = here().join("golden").join(format!("{case}.txt"));
        if bless {
            std::fs::create_dir_all(golden.parent().context("golden dir")?)?;
            std::fs::write(&golden, &got)?;
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .with_context(|| format!("{}: run with TRAINWIRE_BLESS=1", golden.display()))?;
        if want != got {
            eprintln!("--- {case}: expected\n{want}\n--- got\n{got}");
            mismatched.push(*case);
        }
    }
    ensure!(mismatched.is_empty(), "output differs: {mismatched:?}");
    // Read-only: the plugin never wrote anything.
    let writes: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET "))
        .collect();
    ensure!(writes.is_empty(), "the plugin wrote: {writes:?}");
    Ok(())
}
