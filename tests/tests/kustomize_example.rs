//! `examples/kustomize/`: the converted PyTorchJob as a kustomize base, an
//! overlay that patches the torchrun command (as the notes' overlays do),
//! rendered by the real `kubectl kustomize` and injected by the real
//! `trainwire-webhook inject`, on a pipe and as a KRM exec function (kpt).

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;
use trainwire_test_support::{Prerequisite, repo_root, require};

fn overlay() -> std::path::PathBuf {
    repo_root().join("examples/kustomize/overlays/ddp")
}

fn kustomize() -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(overlay())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run kubectl kustomize: {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn env_value<'a>(job: &'a Value, name: &str) -> Option<&'a str> {
    job.pointer("/spec/template/spec/containers/0/env")?
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// The overlay's command with trainwire's env, in namespace ml-train.
fn check_job(job: &Value) {
    assert_eq!(job["kind"], "Job");
    let script = job
        .pointer("/spec/template/spec/containers/0/args/0")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        script.contains("torchrun mnist-ddp.py") && !script.contains("--nnodes"),
        "{script}"
    );
    assert_eq!(
        env_value(job, "PET_RDZV_ENDPOINT"),
        Some("pytorch-dist-job-0.pytorch-dist-job.ml-train.svc.cluster.local:29500")
    );
    assert_eq!(env_value(job, "PET_NNODES"), Some("2"));
    assert_eq!(env_value(job, "PET_NPROC_PER_NODE"), Some("1"));
    let tolerations = job
        .pointer("/spec/template/spec/tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t["key"] == "nvidia.com/gpu"),
        "{tolerations:?}"
    );
}

#[test]
fn the_kustomize_overlay_renders_and_injects() {
    let test = "the_kustomize_overlay_renders_and_injects";
    if !require(
        test,
        Prerequisite::command("kubectl", &["version", "--client"]),
    ) {
        return;
    }
    let rendered = kustomize();
    let bin = trainwire_tests::webhook_binary().unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(&bin)
        .args(["inject", "-f", "-"])
        .env_remove("TRAINWIRE_POLICY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run inject: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rendered.as_bytes())
            .unwrap_or_else(|e| panic!("write: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = stdout
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("yaml: {e}\n{d}")))
        .collect();
    let job = docs
        .iter()
        .find(|d| d["kind"] == "Job")
        .unwrap_or_else(|| panic!("no Job in {stdout}"));
    check_job(job);
    // Its headless Service comes along.
    assert!(
        docs.iter()
            .any(|d| d["kind"] == "Service" && d["metadata"]["name"] == "pytorch-dist-job"),
        "{stdout}"
    );
}

#[test]
fn kpt_runs_inject_on_the_kustomize_output() {
    let test = "kpt_runs_inject_on_the_kustomize_output";
    if !require(
        test,
        Prerequisite::command("kubectl", &["version", "--client"]),
    ) || !require(test, Prerequisite::command("kpt", &["version"]))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, kustomize()).unwrap_or_else(|e| panic!("write: {e}"));
    let bin = trainwire_tests::webhook_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new("kpt")
        .args(["fn", "eval", "--exec"])
        .arg(&bin)
        .arg(dir.path())
        .env_remove("TRAINWIRE_POLICY")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run kpt: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read: {e}"));
    let job: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("yaml: {e}\n{text}"));
    check_job(&job);
}
