//! The monitoring pieces against the real binaries and the real promtool:
//! both `/metrics` endpoints pass `promtool check metrics` and show every
//! family from the start; the alerts in
//! `manifests/components/monitoring/prometheusrule.yaml` pass `promtool check
//! rules` and their unit tests (`promtool test rules`); every metric the
//! alerts and the dashboard query is one the binaries serve; the component
//! builds on top of an overlay and scrapes the port the webhook injects.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use trainwire_test_support::net::free_port;
use trainwire_test_support::process::{Log, Proc, Tag};
use trainwire_test_support::sidecar::{loopback_addr, loopback_sidecar};
use trainwire_test_support::wait::wait_for;
use trainwire_tests::{Prerequisite, repo_root, require};

fn monitoring_dir() -> PathBuf {
    repo_root().join("manifests/components/monitoring")
}

fn promtool(test: &str) -> bool {
    require(
        test,
        // Debian's package `prometheus` has it (.ci/run installs it).
        Prerequisite::command("promtool", &["--version"]),
    )
}

/// The body of `GET /metrics` on `addr` with the `Accept` header `accept`.
fn get_metrics(addr: &str, accept: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// What Prometheus sends when it scrapes.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// The sample lines of an exposition.
fn samples(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect()
}

/// What each program serves on `/metrics`, right after start.
struct Served {
    webhook: String,
    controllers: String,
    sidecar: String,
}

/// The `/metrics` text (classic format, `Accept: text/plain`) of a real
/// `trainwire-webhook serve` (certificate loaded), of a real
/// `trainwire-controllers` (against a generated cluster), and of a real
/// sidecar (rank 0 of 2 on loopback), right after start. Each is also
/// fetched as Prometheus scrapes it (OpenMetrics), with the same samples.
fn real_metrics() -> Result<Served> {
    let webhook = trainwire_tests::webhook_binary().map_err(anyhow::Error::msg)?;
    let sidecar = trainwire_tests::sidecar_binary().map_err(anyhow::Error::msg)?;
    let dir = tempfile::tempdir()?;
    let certs = trainwire_webhook::certs::generate("trainwire-webhook", "trainwire-system", 30)?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, &certs.tls_cert_pem)?;
    std::fs::write(&key, &certs.tls_key_pem)?;

    let tag = Tag::new("monitoring");
    let (listen, probe) = (free_port(), free_port());
    let log = Log::new("webhook");
    let _webhook = Proc::spawn(
        Command::new(&webhook)
            .arg("serve")
            .arg(format!("--listen=127.0.0.1:{listen}"))
            .arg(format!("--probe-listen=127.0.0.1:{probe}"))
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT"),
        &tag,
        &log,
    )?;
    let probe_addr = format!("127.0.0.1:{probe}");
    let mut webhook_text = String::new();
    // Served once the certificate is loaded (its notAfter is then non-zero).
    let loaded = wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        webhook_text = get_metrics(&probe_addr, "text/plain").unwrap_or_default();
        webhook_text.lines().any(|l| {
            l.starts_with("trainwire_webhook_certificate_expiry_timestamp_seconds ")
                && !l.ends_with(" 0")
        })
    });
    if !loaded {
        bail!(
            "the webhook did not serve /metrics with a certificate loaded:\n{webhook_text}\n{}",
            log.tail(40)
        );
    }

    let controllers_bin = trainwire_tests::controllers_binary().map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let (cluster, _) = trainwire_tests::cluster_api::generate(100, false)?;
    let cluster = std::sync::Arc::new(cluster);
    let _controllers =
        runtime.block_on(cluster.start_controllers(&controllers_bin, &[], "monitoring"))?;
    let controllers_addr = format!("127.0.0.1:{}", _controllers.probe);
    let mut controllers_text = String::new();
    let up = wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        controllers_text = get_metrics(&controllers_addr, "text/plain").unwrap_or_default();
        controllers_text.contains("trainwire_webhook_failure_actions_total")
    });
    if !up {
        bail!("the controllers did not serve /metrics:\n{controllers_text}");
    }

    let port = free_port();
    let sidecar_log = Log::new("sidecar");
    let _sidecar = Proc::spawn(
        &mut loopback_sidecar(&sidecar, 0, 2, port),
        &tag,
        &sidecar_log,
    )?;
    let addr = loopback_addr(0, port);
    let mut sidecar_text = String::new();
    let up = wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        sidecar_text = get_metrics(&addr, "text/plain").unwrap_or_default();
        sidecar_text.contains("trainwire_sidecar_peers")
    });
    if !up {
        bail!(
            "the sidecar did not serve /metrics:\n{}",
            sidecar_log.tail(40)
        );
    }
    for (who, at, classic) in [
        ("webhook", &probe_addr, &webhook_text),
        ("controllers", &controllers_addr, &controllers_text),
        ("sidecar", &addr, &sidecar_text),
    ] {
        assert!(!classic.contains("# EOF"), "{who}: {classic}");
        let scraped = get_metrics(at, PROMETHEUS_ACCEPT).unwrap_or_default();
        assert!(scraped.ends_with("# EOF\n"), "{who}: {scraped}");
        // The same series in both formats.
        assert_eq!(sample_names(&scraped), sample_names(classic), "{who}");
        assert_eq!(samples(&scraped).len(), samples(classic).len(), "{who}");
    }
    Ok(Served {
        webhook: webhook_text,
        controllers: controllers_text,
        sidecar: sidecar_text,
    })
}

/// `promtool check metrics` on `text` (its stdin); the output when it fails.
fn check_metrics(text: &str) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running promtool check metrics")?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "promtool check metrics failed:\n{}{}\non:\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The families (`# TYPE` lines) of an exposition, each with whether a
/// sample of it is present.
fn families(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(|family| {
            let has_sample = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(family));
            (family.to_string(), has_sample)
        })
        .collect()
}

/// The metric names of the samples of an exposition.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn both_metrics_endpoints_pass_promtool_and_show_every_family_from_the_start() -> Result<()> {
    if !promtool("both_metrics_endpoints_pass_promtool_and_show_every_family_from_the_start") {
        return Ok(());
    }
    let Served {
        webhook,
        controllers,
        sidecar,
    } = real_metrics()?;
    for (who, text, expected) in [
        (
            "webhook",
            &webhook,
            &[
                r#"trainwire_webhook_admissions_total{kind="StatefulSet",operation="CREATE",outcome="denied"} 0"#,
                r#"trainwire_webhook_certificate_reloads_total{result="success"} 1"#,
                "# TYPE trainwire_build_info gauge",
            ][..],
        ),
        (
            "controllers",
            &controllers,
            &[
                r#"trainwire_webhook_failure_actions_total{action="stop_fail_fast"} 0"#,
                r#"trainwire_webhook_policy_reloads_total{result="failure"} 0"#,
                r#"trainwire_webhook_reconcile_errors_total{controller="world"} 0"#,
                "# TYPE trainwire_build_info gauge",
            ][..],
        ),
        (
            "sidecar",
            &sidecar,
            &[
                r#"trainwire_sidecar_actions_total{action="restart-agent",result="failed"} 0"#,
                r#"trainwire_sidecar_signal_failures_total{role="worker",error="EPERM"} 0"#,
                r#"trainwire_sidecar_signal_permission{state="denied"} 0"#,
                r#"trainwire_sidecar_checkpoint_stale 0"#,
                "# TYPE trainwire_build_info gauge",
            ][..],
        ),
    ] {
        check_metrics(text).with_context(|| format!("the {who}'s /metrics"))?;
        let families = families(text);
        assert!(families.len() > 3, "{who}: {text}");
        let empty: Vec<_> = families.iter().filter(|(_, has)| !*has).collect();
        assert!(
            empty.is_empty(),
            "{who}: families without a series at start: {empty:?}\n{text}"
        );
        for series in expected {
            assert!(
                text.lines().any(|l| l == *series),
                "{who}: {series} missing:\n{text}"
            );
        }
    }
    Ok(())
}

/// The PrometheusRule's `spec` (a Prometheus rule file: `groups`).
fn rule_groups() -> Result<Value> {
    let path = monitoring_dir().join("prometheusrule.yaml");
    let rule: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("parsing {}", path.display()))?;
    assert_eq!(rule["kind"], "PrometheusRule");
    let spec = rule["spec"].clone();
    assert!(spec["groups"].is_array(), "{spec:#}");
    Ok(spec)
}

fn promtool_in(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running promtool {}", args.join(" ")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("promtool {} failed:\n{text}", args.join(" "));
    }
    Ok(text)
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() -> Result<()> {
    if !promtool("the_alert_rules_pass_promtool_check_and_their_unit_tests") {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(
        dir.path().join("trainwire.rules.yaml"),
        serde_json::to_string_pretty(&rule_groups()?)?,
    )?;
    std::fs::copy(
        monitoring_dir().join("tests/alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )?;
    let checked = promtool_in(dir.path(), &["check", "rules", "trainwire.rules.yaml"])?;
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool_in(dir.path(), &["test", "rules", "alerts.test.yaml"])?;
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a unit test that expects it to fire.
    let alerts: BTreeSet<String> = rule_groups()?["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    let tests: Value = serde_saphyr::from_str(&std::fs::read_to_string(
        monitoring_dir().join("tests/alerts.test.yaml"),
    )?)?;
    let fired: BTreeSet<String> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|c| c["alertname"].as_str().map(str::to_string))
        .collect();
    let untested: Vec<_> = alerts.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "alerts never expected to fire in a test: {untested:?}"
    );
    Ok(())
}

/// The `trainwire_*` metric names a PromQL expression reads; a histogram's
/// `_bucket`/`_count`/`_sum` series are names of the exposition too.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("trainwire_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn alerts_and_dashboard_query_only_metrics_the_binaries_serve() -> Result<()> {
    if !promtool("alerts_and_dashboard_query_only_metrics_the_binaries_serve") {
        return Ok(());
    }
    let mut exprs: Vec<(String, String)> = Vec::new();
    for group in rule_groups()?["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            let name = rule["alert"].as_str().unwrap_or("record").to_string();
            exprs.push((name, rule["expr"].as_str().unwrap_or_default().to_string()));
        }
    }
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        monitoring_dir().join("dashboards/trainwire.json"),
    )?)?;
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    assert!(exprs.len() > 20, "{exprs:?}");
    let metrics = real_metrics()?;
    let served: BTreeSet<String> = sample_names(&metrics.webhook)
        .into_iter()
        .chain(sample_names(&metrics.controllers))
        .chain(sample_names(&metrics.sidecar))
        .collect();
    let mut unknown = Vec::new();
    let mut used = BTreeSet::new();
    for (who, expr) in &exprs {
        let names = metric_names(expr);
        assert!(
            !names.is_empty() || expr.contains("up{"),
            "{who}: no metric in {expr}"
        );
        for name in names {
            if !served.contains(&name) {
                unknown.push(format!("{who}: {name}"));
            }
            used.insert(name);
        }
    }
    assert!(
        unknown.is_empty(),
        "not served by any program: {unknown:#?}\nserved: {served:#?}"
    );
    // The names the brief of each alert is about are among them.
    for name in [
        "trainwire_webhook_certificate_expiry_timestamp_seconds",
        "trainwire_sidecar_checkpoint_stale",
        "trainwire_sidecar_signal_failures_total",
        "trainwire_sidecar_signal_permission",
        "trainwire_sidecar_peers",
    ] {
        assert!(
            used.contains(name),
            "{name} is queried by no alert or panel"
        );
    }
    Ok(())
}

#[test]
fn the_monitoring_component_builds_on_an_overlay_and_scrapes_the_injected_port() -> Result<()> {
    let test = "the_monitoring_component_builds_on_an_overlay_and_scrapes_the_injected_port";
    if !require(
        test,
        Prerequisite::command("kubectl", &["version", "--client"]),
    ) {
        return Ok(());
    }
    // A user's kustomization: the cert-manager overlay plus the component.
    let dir = tempfile::tempdir()?;
    let root = repo_root();
    let link = dir.path().join("trainwire");
    std::os::unix::fs::symlink(&root, &link)?;
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine)?;
    std::fs::write(
        mine.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources: [../trainwire/manifests/overlays/cert-manager]\n\
         components: [../trainwire/manifests/components/monitoring]\n",
    )?;
    let out = Command::new("kubectl")
        .args(["kustomize", "--load-restrictor", "LoadRestrictionsNone"])
        .arg(&mine)
        .stdin(Stdio::null())
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objects: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout)?)?;
    let find_named = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .cloned()
            .with_context(|| format!("no {kind} {name} in the build"))
    };
    let find = |kind: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind)
            .cloned()
            .with_context(|| format!("no {kind} in the build"))
    };
    // The webhook's Service port the ServiceMonitor names exists.
    let monitor = find("ServiceMonitor")?;
    let service = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "trainwire-webhook")
        .context("the webhook Service")?;
    let port = &monitor["spec"]["endpoints"][0]["port"];
    assert!(
        service["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| &p["name"] == port),
        "{monitor:#}\n{service:#}"
    );
    // The PodMonitor scrapes the container port the webhook injects: the
    // real `inject` of an example names it.
    let podmonitor = find_named("PodMonitor", "trainwire-sidecar")?;
    let port_name = podmonitor["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .context("PodMonitor port")?
        .to_string();
    let webhook = trainwire_tests::webhook_binary().map_err(anyhow::Error::msg)?;
    let injected = Command::new(&webhook)
        .args(["inject", "-f"])
        .arg(root.join("examples/train-statefulset.yaml"))
        .stdin(Stdio::null())
        .output()?;
    assert!(
        injected.status.success(),
        "{}",
        String::from_utf8_lossy(&injected.stderr)
    );
    let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(injected.stdout)?)?;
    let sidecar_ports: Vec<Value> = docs
        .iter()
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["initContainers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| c["name"] == "trainwire-sidecar")
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(
        sidecar_ports
            .iter()
            .any(|p| p["name"] == port_name.as_str() && p["containerPort"] == 29600),
        "PodMonitor port {port_name}; sidecar ports {sidecar_ports:?}"
    );
    // The controllers' PodMonitor scrapes their probe port, on their pods.
    let controllers = find_named("Deployment", "trainwire-controllers")?;
    let controllers_monitor = find_named("PodMonitor", "trainwire-controllers")?;
    assert_eq!(
        controllers_monitor["spec"]["selector"]["matchLabels"],
        controllers["spec"]["selector"]["matchLabels"]
    );
    let controllers_port = &controllers_monitor["spec"]["podMetricsEndpoints"][0]["port"];
    assert!(
        controllers["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| &p["name"] == controllers_port),
        "{controllers_monitor:#}"
    );
    // Their NetworkPolicy admits exactly that port.
    let controllers_policy = find_named("NetworkPolicy", "trainwire-controllers")?;
    assert_eq!(
        controllers_policy["spec"]["podSelector"]["matchLabels"],
        controllers["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        controllers_policy["spec"]["ingress"][0]["ports"][0]["port"],
        *controllers_port
    );
    // The dashboard reaches Grafana's sidecar as a labelled ConfigMap.
    let dashboard = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "trainwire-dashboard")
        .context("the dashboard ConfigMap")?;
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(
        dashboard["data"]["trainwire.json"]
            .as_str()
            .context("trainwire.json")?,
    )?;
    assert_eq!(json["uid"], "trainwire");
    assert!(find("PrometheusRule").is_ok());

    // The webhook's NetworkPolicy admits exactly the webhook container's two
    // ports (the Service's targets), and the webhook runs at
    // system-cluster-critical with a quota that admits that class.
    let deployment = find_named("Deployment", "trainwire-webhook")?;
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    let quota = find("ResourceQuota")?;
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"][0],
        "system-cluster-critical"
    );
    let container_ports: BTreeSet<String> = pod["containers"][0]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    let policy = find_named("NetworkPolicy", "trainwire-webhook")?;
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let allowed: BTreeSet<String> = policy["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["port"].as_str().map(str::to_string))
        .collect();
    assert_eq!(allowed, container_ports, "{policy:#}");
    let targets: BTreeSet<String> = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["targetPort"].as_str().map(str::to_string))
        .collect();
    assert_eq!(targets, container_ports, "{service:#}");
    Ok(())
}
