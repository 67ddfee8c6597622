//! `helm install`, `helm upgrade` with changed values and `helm uninstall`
//! of `charts/trainwire` against a real kube-apiserver (v1.36.2, from
//! `../shared/k8s/bin`, with Debian's etcd): every object is created, an
//! upgrade keeps the chart's certificate and caBundle while the values take
//! effect (a feature's ClusterRole and flag come and go), and the uninstall
//! leaves nothing of the release.
//!
//! Only the control plane runs here (no kubelet, no controller-manager): no
//! pod starts, so this checks what Helm leaves in the API, not that the
//! webhook answers. [`install_upgrade_uninstall`] takes any kubeconfig, for
//! a harness with a whole node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;
use trainwire_test_support::net::free_port;
use trainwire_test_support::process::{Log, Proc, Tag};
use trainwire_test_support::require::require_all;
use trainwire_test_support::wait::wait_for;
use trainwire_tests::{Prerequisite, repo_root};

const NAMESPACE: &str = "trainwire-system";
const RELEASE: &str = "trainwire";

fn k8s_bin() -> PathBuf {
    repo_root().join("../shared/k8s/bin")
}

/// `kubectl ARGS` (or `helm ARGS`) against `kubeconfig`, its stdout.
fn run(program: &str, kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn get(kubeconfig: &Path, args: &[&str]) -> Result<Value> {
    let mut all = vec!["get", "-o", "json"];
    all.extend_from_slice(args);
    Ok(serde_json::from_str(&run("kubectl", kubeconfig, &all)?)?)
}

/// Whether `kubectl get KIND NAME` finds it.
fn exists(kubeconfig: &Path, kind: &str, name: &str, namespace: Option<&str>) -> Result<bool> {
    let mut command = Command::new("kubectl");
    command
        .env("KUBECONFIG", kubeconfig)
        .args(["get", kind, name, "-o", "name"]);
    if let Some(ns) = namespace {
        command.args(["-n", ns]);
    }
    let out = command.output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() || stderr.contains("NotFound"),
        "kubectl get {kind} {name}: {stderr}"
    );
    Ok(out.status.success())
}

/// The Secret's data and both caBundles.
fn certificate_state(kubeconfig: &Path) -> Result<(Value, Vec<Value>)> {
    let secret = get(
        kubeconfig,
        &["secret", "trainwire-webhook-tls", "-n", NAMESPACE],
    )?;
    let config = get(kubeconfig, &["mutatingwebhookconfiguration", "trainwire"])?;
    let bundles: Vec<Value> = config["webhooks"]
        .as_array()
        .context("webhooks")?
        .iter()
        .map(|w| w["clientConfig"]["caBundle"].clone())
        .collect();
    for b in &bundles {
        ensure!(
            *b == secret["data"]["ca.crt"],
            "a caBundle is not the Secret's ca.crt"
        );
    }
    Ok((secret["data"].clone(), bundles))
}

fn controllers_args(kubeconfig: &Path) -> Result<Vec<String>> {
    let d = get(
        kubeconfig,
        &["deployment", "trainwire-controllers", "-n", NAMESPACE],
    )?;
    Ok(d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("args")?
        .iter()
        .filter_map(|a| a.as_str().map(String::from))
        .collect())
}

/// Every object `helm template` renders with `set`: (kind, name, namespace).
fn rendered(set: &str) -> Result<Vec<(String, String, Option<String>)>> {
    let chart = repo_root().join("charts/trainwire");
    let out = Command::new("helm")
        .args(["template", RELEASE])
        .arg(&chart)
        .args(["--namespace", NAMESPACE, "--set", set])
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout)?)?;
    Ok(objects
        .iter()
        .filter(|o| !o.is_null())
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default().to_string(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                o["metadata"]["namespace"].as_str().map(String::from),
            )
        })
        .collect())
}

/// The scenario, against any cluster `kubeconfig` reaches (the namespace
/// must not exist yet).
fn install_upgrade_uninstall(kubeconfig: &Path) -> Result<()> {
    let chart = repo_root().join("charts/trainwire");
    let chart = chart.to_str().context("the chart's path is not UTF-8")?;
    run("kubectl", kubeconfig, &["create", "namespace", NAMESPACE])?;
    run(
        "kubectl",
        kubeconfig,
        &[
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
    )?;

    run(
        "helm",
        kubeconfig,
        &["install", RELEASE, chart, "--namespace", NAMESPACE],
    )?;
    for (kind, name, namespace) in rendered("monitoring.enabled=false")? {
        ensure!(
            exists(kubeconfig, &kind, &name, namespace.as_deref())?,
            "helm install did not create {kind} {name}"
        );
    }
    let installed = certificate_state(kubeconfig)?;
    ensure!(
        !controllers_args(kubeconfig)?
            .iter()
            .any(|a| a == "--node-failure"),
        "dead-node reclaim is off by default"
    );

    run(
        "helm",
        kubeconfig,
        &[
            "upgrade",
            RELEASE,
            chart,
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "controllers.nodeFailure.enabled=true,controllers.crashLoop.enabled=true,image.tag=0.2.1,webhook.replicas=3",
        ],
    )?;
    ensure!(
        certificate_state(kubeconfig)? == installed,
        "helm upgrade changed the certificate or the caBundle"
    );
    let args = controllers_args(kubeconfig)?;
    ensure!(
        args.iter().any(|a| a == "--node-failure") && args.iter().any(|a| a == "--crash-loop"),
        "{args:?}"
    );
    for role in ["trainwire-node-failure", "trainwire-crash-loop"] {
        ensure!(
            exists(kubeconfig, "clusterrole", role, None)?,
            "no ClusterRole {role}"
        );
    }
    let webhook = get(
        kubeconfig,
        &["deployment", "trainwire-webhook", "-n", NAMESPACE],
    )?;
    ensure!(
        webhook["spec"]["replicas"] == 3,
        "{}",
        webhook["spec"]["replicas"]
    );
    ensure!(
        webhook["spec"]["template"]["spec"]["containers"][0]["image"]
            == "ghcr.io/trainwire/trainwire-webhook:0.2.1"
    );

    run(
        "helm",
        kubeconfig,
        &[
            "upgrade",
            RELEASE,
            chart,
            "--namespace",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "controllers.crashLoop.enabled=false",
        ],
    )?;
    ensure!(
        !exists(kubeconfig, "clusterrole", "trainwire-crash-loop", None)?,
        "a feature turned off keeps its ClusterRole"
    );
    ensure!(certificate_state(kubeconfig)? == installed);

    run(
        "helm",
        kubeconfig,
        &["uninstall", RELEASE, "--namespace", NAMESPACE],
    )?;
    let everything = rendered(
        "controllers.nodeFailure.enabled=true,controllers.crashLoop.enabled=true,controllers.podDisruptionBudget.enabled=true",
    )?;
    for (kind, name, namespace) in everything {
        ensure!(
            !exists(kubeconfig, &kind, &name, namespace.as_deref())?,
            "helm uninstall left {kind} {name}"
        );
    }
    let secrets = get(kubeconfig, &["secrets", "-n", NAMESPACE])?;
    ensure!(
        secrets["items"].as_array().is_some_and(Vec::is_empty),
        "secrets left in {NAMESPACE}: {secrets}"
    );
    Ok(())
}

/// etcd and a kube-apiserver on loopback, stopped when dropped.
struct ControlPlane {
    // Dropped in this order: the processes, then the directory they use.
    _processes: Vec<Proc>,
    _tag: Tag,
    kubeconfig: PathBuf,
    log: Log,
    _dir: tempfile::TempDir,
}

fn control_plane() -> Result<ControlPlane> {
    let dir = tempfile::tempdir()?;
    let apiserver = dir.path().join("kube-apiserver");
    let status = Command::new("zstd")
        .args(["-q", "-d", "-o"])
        .arg(&apiserver)
        .arg(k8s_bin().join("kube-apiserver.zst"))
        .status()?;
    ensure!(status.success(), "zstd -d kube-apiserver.zst: {status}");

    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let (signing, public) = (dir.path().join("sa.key"), dir.path().join("sa.pub"));
    std::fs::write(&signing, key.serialize_pem())?;
    std::fs::write(&public, key.public_key_pem())?;
    let token = format!("helm-lifecycle-{}", std::process::id());
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{token},admin,admin,system:masters\n"))?;

    let (client, peer, secure) = (free_port(), free_port(), free_port());
    let tag = Tag::new("helm-lifecycle");
    let log = Log::new("control-plane");
    let etcd = Proc::spawn_as(
        Command::new("etcd")
            .arg("--name=helm-lifecycle")
            .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!(
                "--initial-cluster=helm-lifecycle=http://127.0.0.1:{peer}"
            )),
        tag.value(),
        &log,
        "etcd: ",
    )?;
    let server = Proc::spawn_as(
        Command::new(&apiserver)
            .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={secure}"))
            .arg(format!("--cert-dir={}", dir.path().join("certs").display()))
            .arg(format!("--token-auth-file={}", tokens.display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", public.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                signing.display()
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg("--endpoint-reconciler-type=none"),
        tag.value(),
        &log,
        "apiserver: ",
    )?;
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{secure}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: admin}}\ncurrent-context: c\n"
        ),
    )?;
    let ready = wait_for(Duration::from_secs(60), Duration::from_millis(200), || {
        run("kubectl", &kubeconfig, &["get", "--raw", "/readyz"]).is_ok()
    });
    ensure!(ready, "the apiserver is not ready:\n{}", log.tail(40));
    Ok(ControlPlane {
        _processes: vec![server, etcd],
        _tag: tag,
        kubeconfig,
        log,
        _dir: dir,
    })
}

#[test]
fn helm_install_upgrade_and_uninstall_on_a_real_apiserver() -> Result<()> {
    let apiserver = k8s_bin().join("kube-apiserver.zst");
    if !require_all(
        "helm_install_upgrade_and_uninstall_on_a_real_apiserver",
        [
            Prerequisite::command("helm", &["version"]),
            Prerequisite::command("kubectl", &["version", "--client"]),
            Prerequisite::command("etcd", &["--version"]),
            Prerequisite::command("zstd", &["--version"]),
            Prerequisite::from_missing((!apiserver.is_file()).then(|| {
                format!(
                    "{} (the kube-apiserver of ../shared/k8s, see its README)",
                    apiserver.display()
                )
            })),
        ],
    ) {
        return Ok(());
    }
    let plane = control_plane()?;
    install_upgrade_uninstall(&plane.kubeconfig)
        .with_context(|| format!("control plane log:\n{}", plane.log.tail(30)))
}
