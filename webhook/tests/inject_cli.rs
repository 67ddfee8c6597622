//! `trainwire-webhook inject`: golden renderings of `examples/`, and the real
//! binary on multi-document YAML, Lists, refusals and KRM ResourceLists (and
//! through kpt when it is installed).
//!
//! `TRAINWIRE_BLESS=1 cargo nextest run -p trainwire-webhook --test inject_cli`
//! rewrites the golden files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use trainwire_policyfile::PolicyArgs;
use trainwire_test_support::repo_root as repo;
use trainwire_webhook::inject::{Options, render};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_trainwire-webhook")
}

fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("TRAINWIRE_POLICY")
        .env_remove("TRAINWIRE_SIDECAR_IMAGE")
        .env_remove("TRAINWIRE_NAMESPACE")
        .env_remove("TRAINWIRE_INJECT_FILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainwire-webhook");
    if let Some(mut s) = child.stdin.take() {
        s.write_all(stdin.as_bytes()).expect("write stdin");
    }
    child
        .wait_with_output()
        .expect("wait for trainwire-webhook")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `trainwire-webhook ARGS` run in `dir`: stdout, stderr and exit status.
fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env_remove("TRAINWIRE_POLICY")
        .env_remove("TRAINWIRE_SIDECAR_IMAGE")
        .env_remove("TRAINWIRE_NAMESPACE")
        .env_remove("TRAINWIRE_INJECT_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run trainwire-webhook")
}

/// Compare `actual` with the golden file (or write it under
/// `TRAINWIRE_BLESS=1`); a difference is added to `mismatches`.
fn compare(file: &Path, actual: &str, bless: bool, mismatches: &mut Vec<String>) {
    if bless {
        std::fs::write(file, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(file).unwrap_or_default();
    if expected != actual {
        mismatches.push(format!(
            "{} differs (TRAINWIRE_BLESS=1 to rewrite)\n--- expected\n{expected}\n--- actual\n{actual}",
            file.display()
        ));
    }
}

/// Run the real binary on every `examples/*.yaml` (but the policy file),
/// from the repository's root (`inject -f examples/NAME.yaml`), with
/// `policy`, and compare to `<out_dir>/<name>.yaml` (stdout: nothing when
/// refused) and `<out_dir>/<name>.stderr` (the whole of stderr).
/// `TRAINWIRE_BLESS=1` rewrites them.
fn golden(policy: Option<&str>, out_dir: &str) {
    let root = repo();
    let examples = root.join("examples");
    let out = examples.join(out_dir);
    let bless = std::env::var_os("TRAINWIRE_BLESS").is_some();
    if bless {
        std::fs::create_dir_all(&out).expect("create the rendered dir");
    }
    let opts = Options::from_args(
        &PolicyArgs {
            policy: policy.map(|p| root.join(p)),
            sidecar_image: None,
            cluster_domain: None,
        },
        None,
    )
    .expect("policy loads");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&examples)
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "policy.yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 3, "examples: {names:?}");
    let mut mismatches = Vec::new();
    for path in names {
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let relative = format!("examples/{stem}.yaml");
        let mut args = vec!["inject", "-f", relative.as_str()];
        if let Some(policy) = policy {
            args.extend(["--policy", policy]);
        }
        let output = run_in(&root, &args);
        let stdout = text(&output.stdout);
        let stderr = text(&output.stderr);
        let refused = !output.status.success();
        if refused {
            assert_eq!(output.status.code(), Some(1), "{stem}: {stderr}");
            assert!(stdout.is_empty(), "{stem}: refused but rendered");
        }
        if policy.is_none() {
            assert!(!refused, "{stem}: {stderr}");
        }
        compare(
            &out.join(format!("{stem}.yaml")),
            &stdout,
            bless,
            &mut mismatches,
        );
        compare(
            &out.join(format!("{stem}.stderr")),
            &stderr,
            bless,
            &mut mismatches,
        );
        if refused {
            continue;
        }
        // The rendered example is a fixed point.
        let again = render(&stdout, &opts).expect("rendered example renders");
        assert_eq!(again.output, stdout, "{stem}: injecting twice changes it");
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}

#[test]
fn examples_render_as_checked_in() {
    golden(None, "rendered");
}

#[test]
fn examples_render_under_the_example_policy_as_checked_in() {
    golden(Some("examples/policy.yaml"), "rendered-policy");
}

const MANIFEST: &str = "\
# a ConfigMap passes through untouched, comments and all
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings   # inline comment
data:
  mode: '010'
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: llama
  annotations:
    trainwire.dev/inject: \"true\"
    trainwire.dev/nnode: \"2\"
spec:
  replicas: 2
  serviceName: llama
  podManagementPolicy: Parallel
  selector:
    matchLabels: {app: llama}
  template:
    metadata:
      labels: {app: llama}
    spec:
      containers:
      - name: trainer
        image: x
        resources:
          limits:
            nvidia.com/gpu: 2
";

#[test]
fn inject_multi_document_file_with_warnings_on_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("m.yaml");
    std::fs::write(&file, MANIFEST).expect("write manifest");
    let out = run(
        &[
            "inject",
            "-f",
            file.to_str().unwrap_or_default(),
            "-n",
            "team-a",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let first = stdout.split("---\n").next().unwrap_or_default();
    assert_eq!(first, MANIFEST.split("---\n").next().unwrap_or_default());
    assert!(
        stdout.contains("value: llama-0.llama.team-a.svc.cluster.local:29500"),
        "{stdout}"
    );
    assert!(
        stdout.contains("name: PET_NPROC_PER_NODE\n          value: \"2\""),
        "{stdout}"
    );
    // The file and the line of the annotation.
    assert_eq!(
        text(&out.stderr),
        format!(
            "{}:15: StatefulSet/llama: warning: unknown annotation trainwire.dev/nnode is ignored; did you mean trainwire.dev/nnodes?\n",
            file.display()
        )
    );
    // stdin, and the output is a fixed point.
    let again = run(&["inject", "-f", "-", "-n", "team-a"], &stdout);
    assert!(again.status.success());
    assert_eq!(text(&again.stdout), stdout);
}

#[test]
fn a_refusal_exits_non_zero_naming_the_document() {
    let bad = MANIFEST.replace(
        "trainwire.dev/nnode: \"2\"",
        "trainwire.dev/nnodes: \"many\"",
    );
    let out = run(&["inject", "-f", "-"], &bad);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "nothing rendered: {}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    assert!(
        // The line of the annotation.
        stderr.starts_with("<stdin>:15: StatefulSet/llama: refused: annotation trainwire.dev/nnodes: \"many\" is not valid: N is not a whole number from 1; accepted: "),
        "{stderr}"
    );
}

#[test]
fn list_items_are_injected() {
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "llama"}, "spec": {"clusterIP": "None"}},
            serde_saphyr::from_str::<Value>(MANIFEST.split("---\n").nth(1).unwrap_or_default()).expect("yaml"),
        ]
    });
    let out = run(&["inject", "-f", "-"], &list.to_string());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("YAML out");
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"][0], list["items"][0]);
    assert_eq!(
        v["items"][1]["spec"]["template"]["spec"]["shareProcessNamespace"],
        true
    );
    assert!(
        text(&out.stderr).starts_with("<stdin>:1: item 2 StatefulSet/llama: warning: "),
        "{}",
        text(&out.stderr)
    );
}

fn resource_list(items: &[&str]) -> String {
    let items: Vec<Value> = items
        .iter()
        .map(|i| serde_saphyr::from_str::<Value>(i).expect("item yaml"))
        .collect();
    serde_json::json!({
        "apiVersion": "config.kubernetes.io/v1",
        "kind": "ResourceList",
        "items": items,
        "functionConfig": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "trainwire"}},
    })
    .to_string()
}

/// Whether a workload's pod template has the sidecar (an init container,
/// after the rendezvous handler's installer).
fn has_sidecar(workload: &Value) -> bool {
    workload["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["name"] == "trainwire-sidecar"))
}

#[test]
fn krm_function_without_a_subcommand() {
    let docs: Vec<&str> = MANIFEST.split("---\n").collect();
    let input = resource_list(&docs);
    let out = run(&[], &input);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("ResourceList out");
    assert_eq!(v["kind"], "ResourceList");
    assert_eq!(v["items"][0]["kind"], "ConfigMap");
    assert!(has_sidecar(&v["items"][1]), "{v}");
    assert_eq!(v["results"][0]["severity"], "warning");
    assert_eq!(
        v["results"][0]["resourceRef"],
        serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llama"})
    );
    assert_eq!(v["functionConfig"]["metadata"]["name"], "trainwire");

    // The same through `inject -f -`.
    let out = run(&["inject"], &input);
    assert!(out.status.success());
    assert_eq!(
        serde_saphyr::from_str::<Value>(&text(&out.stdout)).ok(),
        Some(v)
    );
}

#[test]
fn krm_refusal_is_an_error_result_and_a_failure() {
    let bad = MANIFEST.replace(
        "trainwire.dev/nnode: \"2\"",
        "trainwire.dev/rdzv-backend: etcd",
    );
    let docs: Vec<&str> = bad.split("---\n").collect();
    let out = run(&[], &resource_list(&docs));
    assert!(!out.status.success());
    let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("ResourceList out");
    assert_eq!(v["results"][0]["severity"], "error");
    assert_eq!(
        v["results"][0]["message"],
        "item 2 StatefulSet/llama: refused: annotation trainwire.dev/rdzv-backend: \"etcd\" is not valid: not one of the accepted names; accepted: c10d, static, etcd-v2"
    );
}

/// Found by fuzzing: a ResourceList that arrives with `results` of an
/// earlier function (`severity: error` among them) hit an assertion, and a
/// release build said "1 workload(s) refused" and failed though nothing was
/// refused. Those results are passed on as they came; only this run's own
/// refusals count, in the exit status and on stderr.
#[test]
fn krm_results_from_earlier_functions_are_passed_on_not_counted() {
    let earlier = serde_json::json!([
        {"message": "an earlier function refused something", "severity": "error"},
        {"message": "an earlier warning", "severity": "warning"},
        {"message": "no severity at all"},
        {"message": "an earlier note", "severity": "info"},
    ]);
    let docs: Vec<&str> = MANIFEST.split("---\n").collect();
    let mut input: Value = serde_json::from_str(&resource_list(&docs)).expect("json");
    input["results"] = earlier.clone();
    for args in [&[][..], &["inject"][..]] {
        let out = run(args, &input.to_string());
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("refused"), "{stderr}");
        assert!(!stderr.contains("earlier"), "{stderr}");
        let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("ResourceList out");
        let results = v["results"].as_array().expect("results");
        assert_eq!(results[..4], earlier.as_array().expect("array")[..]);
        // This run's own warning follows them.
        assert_eq!(results[4]["severity"], "warning");
        assert!(has_sidecar(&v["items"][1]), "{v}");
    }

    // With a refusal of its own: exactly one counted.
    let bad = MANIFEST.replace(
        "trainwire.dev/nnode: \"2\"",
        "trainwire.dev/rdzv-backend: etcd",
    );
    let docs: Vec<&str> = bad.split("---\n").collect();
    let mut input: Value = serde_json::from_str(&resource_list(&docs)).expect("json");
    input["results"] = earlier;
    let out = run(&[], &input.to_string());
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("1 workload(s) refused"), "{stderr}");
    let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("ResourceList out");
    assert_eq!(v["results"][4]["severity"], "error");
}

/// kpt runs the binary as an exec function. (`kubectl kustomize` cannot: it
/// has no `--enable-exec`; the standalone `kustomize` can, the same way.)
#[test]
fn kpt_exec_function() {
    if !trainwire_test_support::require(
        "kpt_exec_function",
        trainwire_test_support::Prerequisite::command("kpt", &["version"]),
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(
        repo().join("examples/statefulset-retrofit.yaml"),
        dir.path().join("retrofit.yaml"),
    )
    .expect("copy example");
    let out = Command::new("kpt")
        .args(["fn", "eval", "--exec", bin()])
        .arg(dir.path())
        .env_remove("TRAINWIRE_POLICY")
        .output()
        .expect("run kpt");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("MASTER_ADDR"),
        "kpt shows the warning result: {stderr}"
    );
    let rendered = std::fs::read_to_string(dir.path().join("retrofit.yaml")).expect("read back");
    assert!(rendered.contains("PET_RDZV_ENDPOINT"), "{rendered}");
    assert!(rendered.contains("train-llm-0.train-rdzv.ml-train.svc.cluster.local:29500"));
}

/// A Job rendered offline gets the headless Service its pods' DNS names
/// need, exactly the one the reconciler would create (but with no owner: a
/// manifest has no UID), and says so on stderr; not when the input has it.
#[test]
fn an_injected_job_gets_its_headless_service_offline() {
    let job =
        std::fs::read_to_string(repo().join("examples/job-indexed-gpu.yaml")).expect("example");
    let out = run(&["inject", "-f", "-"], &job);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Job/bert-pretrain: note: added the headless Service bert-pretrain"),
        "{stderr}"
    );
    let docs: Vec<Value> = text(&out.stdout)
        .split("---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).expect("yaml"))
        .collect();
    assert_eq!(docs.len(), 2, "the Job and its Service");
    let service = &docs[1];
    assert_eq!(service["apiVersion"], "v1");
    assert_eq!(service["kind"], "Service");
    assert!(
        service["metadata"].get("ownerReferences").is_none(),
        "{service}"
    );

    // The reconciler's Service for the same Job, stored (with a UID).
    let mut stored = docs[0].clone();
    stored["metadata"]["uid"] = serde_json::json!("0f6b2a4e");
    let stored: k8s_openapi::api::batch::v1::Job = serde_json::from_value(stored).expect("Job");
    let reconciled = trainwire_engine::service::Workload::from_job(&stored)
        .expect("readable")
        .expect("injected")
        .desired_service();
    let mut reconciled = serde_json::to_value(reconciled).expect("json");
    reconciled["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("ownerReferences");
    assert_eq!(service, &reconciled);
    assert_eq!(service["spec"]["clusterIP"], "None");
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        service["spec"]["selector"],
        serde_json::json!({"batch.kubernetes.io/job-name": "bert-pretrain"})
    );

    // Rendering the output again: the Service is there, nothing is added.
    let again = run(&["inject", "-f", "-"], &text(&out.stdout));
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        !text(&again.stderr).contains("note:"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(text(&again.stdout).matches("kind: Service").count(), 1);

    // As a KRM function: the Service is an item, the note an info result.
    let out = run(&[], &resource_list(&[&job]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_saphyr::from_str(&text(&out.stdout)).expect("ResourceList out");
    assert_eq!(v["items"][1]["kind"], "Service");
    let results = v["results"].as_array().cloned().unwrap_or_default();
    assert!(
        results.iter().any(|r| r["severity"] == "info"
            && r["message"]
                .as_str()
                .is_some_and(|m| m.contains("note: added the headless Service"))),
        "{results:?}"
    );
}

/// A refusal is a message and exit code 1, never an anyhow stack backtrace,
/// even with RUST_BACKTRACE=1.
#[test]
fn a_refusal_prints_no_backtrace() {
    let manifest = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: x\n  annotations:\n    trainwire.dev/inject: \"True\"\n";
    let out = Command::new(bin())
        .args(["inject", "-f", "-"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env_remove("TRAINWIRE_POLICY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .expect("stdin")
                .write_all(manifest.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("refused: annotation trainwire.dev/inject"),
        "{stderr}"
    );
    assert!(stderr.contains("error: 1 workload(s) refused"), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(
        !stderr.contains("Caused by") && !stderr.contains(" at "),
        "{stderr}"
    );
}

/// The first mistakes a user makes, each with its whole stderr and exit
/// status (`tests/data/inject/NAME.stderr`, `NAME.status`; `NAME.stdout`
/// for `policy check` and `--help`): the command is
/// `NAME.args` (one argument a line) or `inject -f tests/data/inject/NAME.yaml`,
/// run in `webhook/`. `TRAINWIRE_BLESS=1` rewrites the expected files.
#[test]
fn first_mistakes_get_one_message_each() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = dir.join("tests/data/inject");
    let bless = std::env::var_os("TRAINWIRE_BLESS").is_some();
    let mut cases: Vec<String> = std::fs::read_dir(&data)
        .expect("tests/data/inject")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "args"))
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_string))
        .collect();
    cases.sort();
    cases.dedup();
    assert!(cases.len() >= 10, "{cases:?}");
    let mut mismatches = Vec::new();
    for case in &cases {
        let args_file = data.join(format!("{case}.args"));
        let args: Vec<String> = match std::fs::read_to_string(&args_file) {
            Ok(t) => t.lines().map(str::to_string).collect(),
            Err(_) => vec![
                "inject".into(),
                "-f".into(),
                format!("tests/data/inject/{case}.yaml"),
            ],
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_in(dir, &args);
        let stderr = text(&out.stderr);
        let status = format!("{}\n", out.status.code().unwrap_or(-1));
        compare(
            &data.join(format!("{case}.stderr")),
            &stderr,
            bless,
            &mut mismatches,
        );
        compare(
            &data.join(format!("{case}.status")),
            &status,
            bless,
            &mut mismatches,
        );
        // `policy check` and `--help` answer on stdout.
        if args[0] == "policy" || args.contains(&"--help") {
            let stdout = text(&out.stdout);
            compare(
                &data.join(format!("{case}.stdout")),
                &stdout,
                bless,
                &mut mismatches,
            );
        }
        // One message per mistake: no line is printed twice, none says
        // `error:` twice, and none names `<input>`.
        let json = args.contains(&"json");
        let lines: Vec<&str> = if json {
            assert!(
                serde_json::from_slice::<Value>(if args[0] == "policy" {
                    &out.stdout
                } else {
                    &out.stderr
                })
                .is_ok(),
                "{case}: not one JSON document"
            );
            Vec::new()
        } else {
            stderr.lines().collect()
        };
        for (i, line) in lines.iter().enumerate() {
            assert!(!lines[..i].contains(line), "{case}: repeated: {line}");
            assert!(line.matches("error:").count() <= 1, "{case}: {line}");
            assert!(!line.contains("<input>"), "{case}: {line}");
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n\n"));
}
