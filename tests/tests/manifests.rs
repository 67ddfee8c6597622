//! The kustomize manifests under `manifests/`, rendered by the real
//! `kubectl kustomize` and checked object by object: the webhook
//! configuration (rules, matchConditions evaluated with a CEL interpreter,
//! namespaceSelector, failure policies), the Deployment's security settings,
//! the wiring between Service, Deployment, Secret and webhook, and RBAC
//! compared exactly with what the code calls.
//!
//! kubectl is required in CI (`CI` set): a missing kubectl fails there. On a
//! developer machine without it the tests say so and pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Container, PodSecurityContext, PodSpec, SecurityContext, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, Subject,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NAMESPACE: &str = "trainwire-system";
const SERVICE: &str = "trainwire-webhook";
/// The controllers' Deployment and ServiceAccount.
const CONTROLLERS: &str = "trainwire-controllers";
const TLS_SECRET: &str = "trainwire-webhook-tls";
const INJECT: &str = "inject.trainwire.dev";
const SCALE: &str = "scale.trainwire.dev";

fn manifests_dir() -> PathBuf {
    trainwire_tests::repo_root().join("manifests")
}

/// `kubectl`, or `None` when it is missing: under `CI=true` that fails the
/// test, elsewhere it prints `SKIPPED: ...` (`trainwire_test_support::require`).
#[track_caller]
fn kubectl(test: &str) -> Option<PathBuf> {
    let found = trainwire_tests::Prerequisite::command("kubectl", &["version", "--client"]);
    trainwire_tests::require(
        test,
        match found {
            trainwire_tests::Prerequisite::Missing(why) => trainwire_tests::Prerequisite::Missing(
                format!("kubectl (>= 1.27) renders manifests/ (kubectl kustomize): {why}"),
            ),
            met => met,
        },
    )
    .then(|| PathBuf::from("kubectl"))
}

/// The objects of one rendered kustomization.
struct Rendered {
    overlay: String,
    objects: Vec<Value>,
}

impl Rendered {
    fn render(kubectl: &Path, dir: &Path) -> Result<Self> {
        let out = Command::new(kubectl)
            .arg("kustomize")
            .arg(dir)
            .output()
            .with_context(|| format!("running kubectl kustomize {}", dir.display()))?;
        ensure!(
            out.status.success(),
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let objects: Vec<Value> = serde_saphyr::from_multiple(&text).with_context(|| {
            format!("parsing the output of kubectl kustomize {}", dir.display())
        })?;
        Ok(Rendered {
            overlay: dir.display().to_string(),
            objects: objects.into_iter().filter(|o| !o.is_null()).collect(),
        })
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn raw(&self, kind: &str, name: &str) -> Result<&Value> {
        let found: Vec<&Value> = self
            .all(kind)
            .into_iter()
            .filter(|o| o["metadata"]["name"] == name)
            .collect();
        match found.as_slice() {
            [one] => Ok(one),
            [] => bail!("{}: no {kind} named {name}", self.overlay),
            _ => bail!("{}: {} objects {kind}/{name}", self.overlay, found.len()),
        }
    }

    fn typed<T: DeserializeOwned>(&self, kind: &str, name: &str) -> Result<T> {
        let mut raw = self.raw(kind, name)?.clone();
        // kustomize folds long base64 values over several lines; the
        // apiserver's base64 decoder skips the newlines, k8s-openapi's does
        // not.
        strip_base64_whitespace(&mut raw);
        serde_json::from_value(raw).with_context(|| format!("{kind}/{name} does not parse"))
    }

    fn webhook_configuration(&self) -> Result<MutatingWebhookConfiguration> {
        let all = self.all("MutatingWebhookConfiguration");
        ensure!(
            all.len() == 1,
            "{}: expected one MutatingWebhookConfiguration, found {}",
            self.overlay,
            all.len()
        );
        self.typed("MutatingWebhookConfiguration", "trainwire")
    }
}

fn strip_base64_whitespace(v: &mut Value) {
    if let Some(webhooks) = v.get_mut("webhooks").and_then(Value::as_array_mut) {
        for w in webhooks {
            if let Some(Value::String(ca)) = w.pointer_mut("/clientConfig/caBundle") {
                ca.retain(|c| !c.is_whitespace());
            }
        }
    }
    if let Some(Value::Object(data)) = v.get_mut("data") {
        for value in data.values_mut() {
            if let Value::String(s) = value {
                s.retain(|c| !c.is_whitespace());
            }
        }
    }
}

fn webhook<'a>(
    config: &'a MutatingWebhookConfiguration,
    name: &str,
) -> Result<&'a MutatingWebhook> {
    config
        .webhooks
        .iter()
        .flatten()
        .find(|w| w.name == name)
        .with_context(|| format!("no webhook entry {name}"))
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// A copy of `manifests/` with the self-managed overlay's `certs/` written,
/// as the install instructions have the user do.
struct SelfManagedCopy {
    _dir: tempfile::TempDir,
    overlay: PathBuf,
    ca_pem: String,
}

fn self_managed_copy() -> Result<SelfManagedCopy> {
    let dir = tempfile::tempdir()?;
    let manifests = dir.path().join("manifests");
    copy_tree(&manifests_dir(), &manifests)?;
    let overlay = manifests.join("overlays/self-managed");
    let certs = overlay.join("certs");
    let ca_pem = write_certs(&certs)?;
    Ok(SelfManagedCopy {
        _dir: dir,
        overlay,
        ca_pem,
    })
}

/// Write ca.crt, ca.key, tls.crt, tls.key with `trainwire-webhook certs`'s
/// own code, for the Service the manifests define; returns the CA's PEM and
/// checks that the caBundle the command prints is what the overlay computes.
fn write_certs(out: &Path) -> Result<String> {
    let generated = trainwire_webhook::certs::generate(SERVICE, NAMESPACE, 1)?;
    trainwire_webhook::certs::write(&generated, out)?;
    let printed = base64::engine::general_purpose::STANDARD.decode(generated.ca_bundle())?;
    assert_eq!(String::from_utf8(printed)?, generated.ca_cert_pem);
    Ok(generated.ca_cert_pem)
}

/// Every overlay, rendered. The self-managed one from a copy with certs.
fn render_overlays(kubectl: &Path) -> Result<Vec<(Rendered, Option<SelfManagedCopy>)>> {
    let cert_manager = Rendered::render(kubectl, &manifests_dir().join("overlays/cert-manager"))?;
    let copy = self_managed_copy()?;
    let self_managed = Rendered::render(kubectl, &copy.overlay)?;
    Ok(vec![(cert_manager, None), (self_managed, Some(copy))])
}

#[test]
fn every_overlay_directory_is_tested() -> Result<()> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(manifests_dir().join("overlays"))? {
        let entry = entry?;
        if entry.path().join("kustomization.yaml").is_file() {
            found.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    let tested: BTreeSet<String> = ["cert-manager", "self-managed"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, tested, "an overlay was added without a test here");
    Ok(())
}

#[test]
fn the_self_managed_overlay_refuses_to_render_without_certificates() -> Result<()> {
    let Some(kubectl) = kubectl("the_self_managed_overlay_refuses_to_render_without_certificates")
    else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    copy_tree(&manifests_dir(), &dir.path().join("manifests"))?;
    let overlay = dir.path().join("manifests/overlays/self-managed");
    let _ = std::fs::remove_dir_all(overlay.join("certs"));
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(&overlay)
        .output()?;
    assert!(!out.status.success(), "rendered without certs/");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tls.crt") || stderr.contains("certs"),
        "{stderr}"
    );
    Ok(())
}

/// A webhook rule as (apiGroups, apiVersions, resources, operations, scope).
type Rule = (
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Option<String>,
);

fn rule(groups: &[&str], resources: &[&str], ops: &[&str]) -> Rule {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    (
        s(groups),
        s(&["v1"]),
        s(resources),
        s(ops),
        Some("Namespaced".into()),
    )
}

fn rules_of(w: &MutatingWebhook) -> Vec<Rule> {
    w.rules
        .iter()
        .flatten()
        .map(|r: &RuleWithOperations| {
            (
                r.api_groups.clone().unwrap_or_default(),
                r.api_versions.clone().unwrap_or_default(),
                r.resources.clone().unwrap_or_default(),
                r.operations.clone().unwrap_or_default(),
                r.scope.clone(),
            )
        })
        .collect()
}

fn excluded_namespaces(w: &MutatingWebhook) -> Result<BTreeSet<String>> {
    let selector = w
        .namespace_selector
        .as_ref()
        .context("no namespaceSelector")?;
    ensure!(
        selector.match_labels.is_none(),
        "matchLabels would limit it to labelled namespaces"
    );
    let exprs = selector
        .match_expressions
        .as_ref()
        .context("no matchExpressions")?;
    ensure!(exprs.len() == 1, "expected one expression, got {exprs:?}");
    let e = &exprs[0];
    ensure!(e.key == "kubernetes.io/metadata.name", "key {}", e.key);
    ensure!(e.operator == "NotIn", "operator {}", e.operator);
    Ok(e.values.clone().unwrap_or_default().into_iter().collect())
}

fn common_entry_checks(w: &MutatingWebhook) -> Result<()> {
    ensure!(
        w.admission_review_versions == ["v1"],
        "{}: admissionReviewVersions",
        w.name
    );
    ensure!(
        w.side_effects == "None",
        "{}: sideEffects {}",
        w.name,
        w.side_effects
    );
    let timeout = w
        .timeout_seconds
        .context("timeoutSeconds must be set (default is 10)")?;
    ensure!(
        (1..=5).contains(&timeout),
        "{}: timeoutSeconds {timeout}",
        w.name
    );
    let policy = w
        .failure_policy
        .as_deref()
        .context("failurePolicy must be explicit")?;
    ensure!(
        policy == "Fail" || policy == "Ignore",
        "{}: failurePolicy {policy}",
        w.name
    );
    ensure!(
        w.match_policy.as_deref() == Some("Equivalent"),
        "{}: matchPolicy",
        w.name
    );
    let svc = w
        .client_config
        .service
        .as_ref()
        .context("clientConfig.service")?;
    ensure!(w.client_config.url.is_none(), "{}: url and service", w.name);
    ensure!(
        svc.name == SERVICE && svc.namespace == NAMESPACE,
        "{}: service {svc:?}",
        w.name
    );
    ensure!(
        svc.path.as_deref() == Some("/mutate"),
        "{}: path {:?}",
        w.name,
        svc.path
    );
    ensure!(svc.port == Some(443), "{}: port {:?}", w.name, svc.port);
    let excluded = excluded_namespaces(w)?;
    let want: BTreeSet<String> = ["kube-system", NAMESPACE]
        .into_iter()
        .map(String::from)
        .collect();
    ensure!(
        excluded == want,
        "{}: excluded namespaces {excluded:?}",
        w.name
    );
    ensure!(
        w.object_selector.is_none(),
        "{}: objectSelector is not used",
        w.name
    );
    Ok(())
}

#[test]
fn webhook_entries_are_what_design_md_asks() -> Result<()> {
    let Some(kubectl) = kubectl("webhook_entries_are_what_design_md_asks") else {
        return Ok(());
    };
    for (rendered, _) in render_overlays(&kubectl)? {
        let config = rendered.webhook_configuration()?;
        let names: Vec<&str> = config
            .webhooks
            .iter()
            .flatten()
            .map(|w| w.name.as_str())
            .collect();
        assert_eq!(names, [INJECT, SCALE], "{}", rendered.overlay);

        let inject = webhook(&config, INJECT)?;
        common_entry_checks(inject).with_context(|| rendered.overlay.clone())?;
        assert_eq!(
            rules_of(inject),
            vec![
                rule(&["apps"], &["statefulsets"], &["CREATE", "UPDATE"]),
                rule(&["batch"], &["jobs"], &["CREATE"]),
            ]
        );
        assert_eq!(inject.reinvocation_policy.as_deref(), Some("IfNeeded"));
        assert_eq!(inject.failure_policy.as_deref(), Some("Fail"));
        let conditions = inject.match_conditions.as_deref().unwrap_or_default();
        assert_eq!(conditions.len(), 1, "one opt-in condition");

        let scale = webhook(&config, SCALE)?;
        common_entry_checks(scale).with_context(|| rendered.overlay.clone())?;
        assert_eq!(
            rules_of(scale),
            vec![rule(&["apps"], &["statefulsets/scale"], &["UPDATE"])]
        );
        // A Scale carries no annotations: a condition on them would never
        // let `kubectl scale` through to the guard.
        for c in scale.match_conditions.iter().flatten() {
            assert!(
                !c.expression.contains("annotations"),
                "scale entry filters on annotations: {}",
                c.expression
            );
        }
        assert_eq!(scale.reinvocation_policy.as_deref(), Some("Never"));
        // The guard answers from its cache, without I/O: a short timeout.
        let timeout = u64::try_from(scale.timeout_seconds.unwrap_or(10))?;
        assert!(timeout <= 5, "scale timeoutSeconds {timeout}");
        assert_eq!(scale.failure_policy.as_deref(), Some("Ignore"));
    }
    Ok(())
}

/// Evaluates a matchCondition the way the apiserver does: `object` bound to
/// the request's object, the result must be a bool.
fn condition_admits(expression: &str, object: &Value) -> Result<bool> {
    let program = cel_interpreter::Program::compile(expression)
        .map_err(|e| anyhow::anyhow!("CEL does not compile: {e:?}"))?;
    let mut ctx = cel_interpreter::Context::default();
    ctx.add_variable("object", object.clone())
        .map_err(|e| anyhow::anyhow!("binding object: {e:?}"))?;
    match program.execute(&ctx) {
        Ok(cel_interpreter::Value::Bool(b)) => Ok(b),
        Ok(other) => bail!("{expression} gave {other:?}, not a bool"),
        Err(e) => bail!("{expression} failed on {object}: {e:?}"),
    }
}

#[test]
fn the_opt_in_condition_admits_exactly_annotated_objects() -> Result<()> {
    let Some(kubectl) = kubectl("the_opt_in_condition_admits_exactly_annotated_objects") else {
        return Ok(());
    };
    let rendered = Rendered::render(&kubectl, &manifests_dir().join("overlays/cert-manager"))?;
    let config = rendered.webhook_configuration()?;
    let inject = webhook(&config, INJECT)?;
    let expression = &inject.match_conditions.as_deref().unwrap_or_default()[0].expression;

    let sts = |metadata: Value| json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata});
    let cases = [
        (
            sts(json!({"name": "a", "annotations": {"trainwire.dev/inject": "true"}})),
            true,
        ),
        (
            sts(json!({"name": "a", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "trainwire.dev/inject": "true"}})),
            true,
        ),
        // `kubectl create` of an object without annotations, and what a
        // controller creates: no annotations map at all.
        (sts(json!({"name": "a"})), false),
        (sts(json!({"name": "a", "annotations": {}})), false),
        (
            sts(json!({"name": "a", "annotations": {"other": "true"}})),
            false,
        ),
        // Every value of the annotation reaches the engine, which answers
        // as offline `inject` does (see below).
        (
            sts(json!({"name": "a", "annotations": {"trainwire.dev/inject": "false"}})),
            true,
        ),
        (
            sts(json!({"name": "a", "annotations": {"trainwire.dev/inject": "True"}})),
            true,
        ),
        (
            sts(json!({"name": "a", "annotations": {"trainwire.dev/inject": ""}})),
            true,
        ),
        // A label is not the opt-in.
        (
            sts(json!({"name": "a", "labels": {"trainwire.dev/inject": "true"}})),
            false,
        ),
    ];
    for (object, want) in cases {
        assert_eq!(condition_admits(expression, &object)?, want, "{object}");
    }

    // What the engine then answers for each value, on the captured
    // StatefulSet: the same verdict in the cluster as offline.
    let path = trainwire_tests::admission_fixtures_dir().join("statefulset-create.json");
    let review: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let profile = trainwire_engine::policy::Profile::default();
    for (value, verdict) in [
        (json!("true"), "injected"),
        (json!("false"), "untouched"),
        (json!("True"), "refused"),
        (json!("yes"), "refused"),
        (json!(""), "refused"),
        (json!(true), "refused"),
    ] {
        let mut object = review["request"]["object"].clone();
        object["metadata"]["annotations"]["trainwire.dev/inject"] = value.clone();
        assert!(condition_admits(expression, &object)?, "{value} is sent");
        let got =
            match trainwire_engine::mutation::mutate(&object, Some("trainwire-test"), &profile) {
                Ok(trainwire_engine::mutation::Outcome::Mutated(_)) => "injected".to_string(),
                Ok(trainwire_engine::mutation::Outcome::NotManaged) => "untouched".to_string(),
                Err(refusal) => {
                    let message = refusal.to_string();
                    // A wrong string names the accepted forms; a YAML
                    // boolean says how to write it as a string.
                    assert!(
                        message.contains("trainwire.dev/inject")
                            && (message.contains("\"true\" or \"false\"")
                                || message.contains("write \"true\" in quotes")),
                        "{message}"
                    );
                    "refused".to_string()
                }
            };
        assert_eq!(got, verdict, "trainwire.dev/inject: {value}");
    }

    // The captured requests from a real apiserver: their objects as sent.
    for (fixture, want) in [
        ("statefulset-create.json", true),
        ("statefulset-create-kubectl-create.json", true),
        ("job-indexed-create.json", true),
        ("pod-create-from-statefulset.json", false),
        ("pod-create-from-deployment.json", false),
    ] {
        let path = trainwire_tests::admission_fixtures_dir().join(fixture);
        let review: Value = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| path.display().to_string())?,
        )?;
        assert_eq!(
            condition_admits(expression, &review["request"]["object"])?,
            want,
            "{fixture}"
        );
    }
    Ok(())
}

fn container<'a>(d: &'a Deployment, name: &str) -> Result<&'a Container> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == name))
        .with_context(|| format!("no container {name}"))
}

/// A numeric non-root user, a read-only root, no privilege escalation and
/// every capability dropped; the security contexts, for more checks.
fn assert_unprivileged<'a>(
    pod: &'a PodSpec,
    c: &'a Container,
) -> Result<(&'a PodSecurityContext, &'a SecurityContext)> {
    let psc = pod
        .security_context
        .as_ref()
        .context("pod securityContext")?;
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(
        psc.run_as_user.is_some_and(|u| u != 0),
        "numeric non-root user"
    );
    let csc = c
        .security_context
        .as_ref()
        .context("container securityContext")?;
    assert_eq!(csc.read_only_root_filesystem, Some(true));
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(
        csc.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_string()])
    );
    Ok((psc, csc))
}

#[test]
fn the_deployment_is_hardened_and_wired_to_the_service_and_certificate() -> Result<()> {
    let Some(kubectl) =
        kubectl("the_deployment_is_hardened_and_wired_to_the_service_and_certificate")
    else {
        return Ok(());
    };
    for (rendered, _) in render_overlays(&kubectl)? {
        let d: Deployment = rendered.typed("Deployment", SERVICE)?;
        assert_eq!(d.metadata.namespace.as_deref(), Some(NAMESPACE));
        let spec = d.spec.as_ref().context("spec")?;
        assert_eq!(spec.replicas, Some(2), "two replicas");
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let pod = spec.template.spec.as_ref().context("pod spec")?;
        assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE));

        // Anti-affinity on the node, selecting its own pods.
        let anti = pod
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .context("podAntiAffinity")?;
        let term = &anti
            .preferred_during_scheduling_ignored_during_execution
            .as_deref()
            .unwrap_or_default()
            .first()
            .context("a preferred anti-affinity term")?
            .pod_affinity_term;
        assert_eq!(term.topology_key, "kubernetes.io/hostname");
        let sel = term
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        assert!(
            !sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
            "{sel:?}"
        );

        // Pod and container security.
        let c = container(&d, "webhook")?;
        let (psc, csc) = assert_unprivileged(pod, c)?;
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        assert_eq!(csc.privileged, None);
        assert!(
            csc.capabilities
                .as_ref()
                .and_then(|c| c.add.as_ref())
                .is_none()
        );

        // Requests and limits.
        let res = c.resources.as_ref().context("resources")?;
        for (what, map) in [("requests", &res.requests), ("limits", &res.limits)] {
            let map = map.as_ref().with_context(|| format!("no {what}"))?;
            assert!(
                map.contains_key("cpu") && map.contains_key("memory"),
                "{what}: {map:?}"
            );
        }

        // Ports: https for the apiserver, plain HTTP for probes.
        let ports: BTreeMap<String, i32> = c
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
            .collect();
        assert_eq!(ports.get("https"), Some(&8443));
        let probe_port = *ports.get("http-probes").context("http-probes port")?;
        for (what, probe, path) in [
            ("readiness", &c.readiness_probe, "/readyz"),
            ("liveness", &c.liveness_probe, "/healthz"),
        ] {
            let get = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref())
                .with_context(|| format!("{what} probe is an httpGet"))?;
            assert_eq!(get.path.as_deref(), Some(path), "{what}");
            assert_eq!(
                get.scheme.as_deref().unwrap_or("HTTP"),
                "HTTP",
                "{what} on plain HTTP"
            );
            let port_ok = match &get.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(n) => {
                    n == "http-probes"
                }
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => {
                    *p == probe_port
                }
            };
            assert!(port_ok, "{what} probe on {:?}", get.port);
        }

        // Flags: the listeners on the declared ports, cert and policy files
        // inside the mounted volumes.
        let args = c.args.clone().unwrap_or_default();
        assert_eq!(args.first().map(String::as_str), Some("serve"));
        // The real command line accepts them.
        let argv = std::iter::once("trainwire-webhook".to_string()).chain(args.iter().cloned());
        let cli = <trainwire_webhook::cli::Cli as clap::Parser>::try_parse_from(argv)
            .map_err(|e| anyhow::anyhow!("the Deployment's args do not parse: {e}"))?;
        let Some(trainwire_webhook::cli::Command::Serve(serve)) = cli.command else {
            bail!("not the serve command")
        };
        let _ = serve;
        let flag = |name: &str| -> Option<String> {
            args.iter()
                .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(String::from))
        };
        assert_eq!(flag("listen").as_deref(), Some("0.0.0.0:8443"));
        assert_eq!(flag("probe-listen"), Some(format!("0.0.0.0:{probe_port}")));
        let mounts: BTreeMap<String, (String, bool, Option<String>)> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.name.clone(),
                    (
                        m.mount_path.clone(),
                        m.read_only == Some(true),
                        m.sub_path.clone(),
                    ),
                )
            })
            .collect();
        let (tls_path, tls_ro, _) = mounts.get("tls").context("tls mount")?;
        let (policy_path, policy_ro, policy_sub) = mounts.get("policy").context("policy mount")?;
        assert!(*tls_ro && *policy_ro, "mounts read-only");
        assert!(
            policy_sub.is_none(),
            "a subPath mount never sees ConfigMap updates"
        );
        assert_eq!(flag("tls-cert"), Some(format!("{tls_path}/tls.crt")));
        assert_eq!(flag("tls-key"), Some(format!("{tls_path}/tls.key")));
        assert!(flag("policy").is_some_and(|p| p.starts_with(&format!("{policy_path}/"))));
        let volumes: BTreeMap<String, Value> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| (v.name.clone(), serde_json::to_value(v).unwrap_or_default()))
            .collect();
        assert_eq!(volumes["tls"]["secret"]["secretName"], TLS_SECRET);
        assert_eq!(volumes["policy"]["configMap"]["name"], "trainwire-policy");
        rendered.raw("ConfigMap", "trainwire-policy")?;

        // The Service sends 443 to the https port, and selects these pods.
        let svc: Service = rendered.typed("Service", SERVICE)?;
        let svc_spec = svc.spec.as_ref().context("service spec")?;
        let selector = svc_spec.selector.clone().unwrap_or_default();
        assert!(!selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        let https = svc_spec
            .ports
            .iter()
            .flatten()
            .find(|p| p.port == 443)
            .context("port 443")?;
        assert_eq!(
            https.target_port,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("https".into()))
        );

        // The PodDisruptionBudget keeps one of these pods.
        let pdb: PodDisruptionBudget = rendered.typed("PodDisruptionBudget", SERVICE)?;
        let pdb_spec = pdb.spec.as_ref().context("pdb spec")?;
        assert_eq!(
            pdb_spec.min_available,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
        );
        let pdb_sel = pdb_spec
            .selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        assert!(!pdb_sel.is_empty() && pdb_sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));

        // Restricted Pod Security on the namespace.
        let ns = rendered.raw("Namespace", NAMESPACE)?;
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
    }
    Ok(())
}

#[test]
fn the_certificate_reaches_the_pods_and_the_ca_reaches_the_webhook() -> Result<()> {
    let Some(kubectl) = kubectl("the_certificate_reaches_the_pods_and_the_ca_reaches_the_webhook")
    else {
        return Ok(());
    };
    for (rendered, copy) in render_overlays(&kubectl)? {
        let config = rendered.webhook_configuration()?;
        match copy {
            // cert-manager: a Certificate writing the Secret the pods mount,
            // for the Service's DNS name, and its CA injected by annotation.
            None => {
                let cert = rendered.raw("Certificate", SERVICE)?;
                assert_eq!(cert["metadata"]["namespace"], NAMESPACE);
                assert_eq!(cert["spec"]["secretName"], TLS_SECRET);
                let dns: Vec<&str> = cert["spec"]["dnsNames"]
                    .as_array()
                    .context("dnsNames")?
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                assert!(
                    dns.contains(&"trainwire-webhook.trainwire-system.svc"),
                    "{dns:?}"
                );
                // Self-signed CA -> CA Issuer -> this leaf: renewing the
                // leaf leaves the CA (so the injected caBundle) as it is.
                let issuer = cert["spec"]["issuerRef"]["name"]
                    .as_str()
                    .context("issuerRef")?;
                assert_eq!(cert["spec"]["issuerRef"]["kind"], "Issuer");
                assert_ne!(cert["spec"]["isCA"], true, "the leaf is no CA");
                let ca_issuer = rendered.raw("Issuer", issuer)?;
                let ca_secret = ca_issuer["spec"]["ca"]["secretName"]
                    .as_str()
                    .context("the leaf's Issuer is a CA Issuer")?;
                let ca: Vec<&Value> = rendered
                    .all("Certificate")
                    .into_iter()
                    .filter(|c| c["spec"]["secretName"] == ca_secret)
                    .collect();
                let [ca] = ca.as_slice() else {
                    bail!("no single Certificate writes the CA Secret {ca_secret}");
                };
                assert_eq!(ca["spec"]["isCA"], true);
                let root = ca["spec"]["issuerRef"]["name"]
                    .as_str()
                    .context("the CA's issuerRef")?;
                assert!(
                    rendered.raw("Issuer", root)?["spec"]
                        .get("selfSigned")
                        .is_some(),
                    "the CA is self-signed"
                );
                let annotations = config.metadata.annotations.clone().unwrap_or_default();
                assert_eq!(
                    annotations
                        .get("cert-manager.io/inject-ca-from")
                        .map(String::as_str),
                    Some("trainwire-system/trainwire-webhook")
                );
                assert!(
                    rendered.all("Secret").is_empty(),
                    "cert-manager writes the Secret"
                );
            }
            // self-managed: the Secret from the files, and the CA copied
            // into every entry's caBundle.
            Some(copy) => {
                let secret = rendered.raw("Secret", TLS_SECRET)?;
                assert_eq!(secret["metadata"]["namespace"], NAMESPACE);
                assert_eq!(secret["type"], "kubernetes.io/tls");
                let keys: BTreeSet<&str> = secret["data"]
                    .as_object()
                    .context("data")?
                    .keys()
                    .map(String::as_str)
                    .collect();
                assert_eq!(
                    keys,
                    BTreeSet::from(["ca.crt", "tls.crt", "tls.key"]),
                    "ca.key stays out"
                );
                for w in config.webhooks.iter().flatten() {
                    let ca = w
                        .client_config
                        .ca_bundle
                        .as_ref()
                        .with_context(|| format!("{}: caBundle", w.name))?;
                    assert_eq!(String::from_utf8_lossy(&ca.0), copy.ca_pem, "{}", w.name);
                }
                let raw_ca = secret["data"]["ca.crt"].as_str().context("ca.crt")?;
                let decoded = base64::engine::general_purpose::STANDARD.decode(
                    raw_ca
                        .chars()
                        .filter(|c| !c.is_whitespace())
                        .collect::<String>(),
                )?;
                assert_eq!(String::from_utf8(decoded)?, copy.ca_pem);
            }
        }
    }
    Ok(())
}

fn permissions(
    rules: &[k8s_openapi::api::rbac::v1::PolicyRule],
) -> Result<BTreeSet<(String, String, String)>> {
    let mut out = BTreeSet::new();
    for r in rules {
        ensure!(
            r.non_resource_urls.is_none(),
            "non-resource URLs granted: {r:?}"
        );
        ensure!(
            r.resource_names.is_none(),
            "unexpected resourceNames: {r:?}"
        );
        for g in r.api_groups.iter().flatten() {
            for res in r.resources.iter().flatten() {
                for v in &r.verbs {
                    ensure!(g != "*" && res != "*" && v != "*", "wildcard in {r:?}");
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    Ok(out)
}

fn owned(list: &[&[(&str, &str, &str)]]) -> BTreeSet<(String, String, String)> {
    list.iter()
        .flat_map(|l| l.iter())
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect()
}

/// One right of one ServiceAccount: (ServiceAccount, API group, resource,
/// verb, where), `where` being `cluster` or the Role's namespace.
type Right = (String, String, String, String, String);

/// The rights each ServiceAccount gets from the rendered bindings.
fn rights_by_account(rendered: &Rendered) -> Result<BTreeSet<Right>> {
    let mut out = BTreeSet::new();
    let mut grant = |subjects: Option<Vec<k8s_openapi::api::rbac::v1::Subject>>,
                     rules: &[k8s_openapi::api::rbac::v1::PolicyRule],
                     scope: &str|
     -> Result<()> {
        for subject in subjects.unwrap_or_default() {
            ensure!(
                subject.kind == "ServiceAccount" && subject.namespace.as_deref() == Some(NAMESPACE),
                "{}: a binding to {subject:?}",
                rendered.overlay
            );
            for (g, r, v) in permissions(rules)? {
                out.insert((subject.name.clone(), g, r, v, scope.to_string()));
            }
        }
        Ok(())
    };
    for raw in rendered.all("ClusterRoleBinding") {
        let binding: ClusterRoleBinding = serde_json::from_value(raw.clone())?;
        ensure!(binding.role_ref.kind == "ClusterRole", "{binding:?}");
        let role: ClusterRole = rendered.typed("ClusterRole", &binding.role_ref.name)?;
        ensure!(
            role.aggregation_rule.is_none(),
            "aggregated {}",
            binding.role_ref.name
        );
        grant(
            binding.subjects,
            role.rules.as_deref().unwrap_or_default(),
            "cluster",
        )?;
    }
    for raw in rendered.all("RoleBinding") {
        let binding: RoleBinding = serde_json::from_value(raw.clone())?;
        let namespace = binding.metadata.namespace.clone().unwrap_or_default();
        let rules = match binding.role_ref.kind.as_str() {
            "Role" => {
                let role: k8s_openapi::api::rbac::v1::Role =
                    rendered.typed("Role", &binding.role_ref.name)?;
                ensure!(role.metadata.namespace.as_deref() == Some(namespace.as_str()));
                role.rules.unwrap_or_default()
            }
            _ => {
                let role: ClusterRole = rendered.typed("ClusterRole", &binding.role_ref.name)?;
                role.rules.unwrap_or_default()
            }
        };
        grant(binding.subjects, &rules, &namespace)?;
    }
    Ok(out)
}

/// A row of the rights table in docs/deploy.md ("Rights").
#[derive(Debug)]
struct TableRow {
    account: String,
    with: String,
    group: String,
    resource: String,
    verbs: Vec<String>,
    scope: String,
}

/// The table of docs/deploy.md whose header starts `| ServiceAccount | with |`.
fn rights_table() -> Result<Vec<TableRow>> {
    let path = trainwire_tests::repo_root().join("docs/deploy.md");
    let text = std::fs::read_to_string(&path)?;
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("| ServiceAccount | with |"));
    let header = lines.next().context("docs/deploy.md has no rights table")?;
    ensure!(
        header == "| ServiceAccount | with | API group | resource | verbs | where | why |",
        "the rights table's columns changed: {header}"
    );
    let mut rows = Vec::new();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_string())
            .collect();
        ensure!(
            cells.len() == 7,
            "a rights row of {} cells: {line}",
            cells.len()
        );
        ensure!(!cells[6].is_empty(), "a right without a why: {line}");
        rows.push(TableRow {
            account: cells[0].clone(),
            with: cells[1].clone(),
            group: if cells[2] == "\"\"" {
                String::new()
            } else {
                cells[2].clone()
            },
            resource: cells[3].clone(),
            verbs: cells[4].split(',').map(|v| v.trim().to_string()).collect(),
            scope: cells[5].clone(),
        });
    }
    ensure!(!rows.is_empty(), "the rights table is empty");
    Ok(rows)
}

/// The rows the table grants with `components` on, as rights.
fn table_rights(rows: &[TableRow], components: &[String]) -> BTreeSet<Right> {
    rows.iter()
        .filter(|r| r.with == "base" || components.contains(&r.with))
        .flat_map(|r| {
            r.verbs.iter().map(|v| {
                (
                    r.account.clone(),
                    r.group.clone(),
                    r.resource.clone(),
                    v.clone(),
                    r.scope.clone(),
                )
            })
        })
        .collect()
}

/// The components under manifests/components/.
fn components() -> Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(manifests_dir().join("components"))? {
        let entry = entry?;
        if entry.path().join("kustomization.yaml").is_file() {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found.sort();
    Ok(found)
}

/// `overlay` with `components`, rendered from the manifests tree at `root`
/// (a copy: the kustomization that combines them is written into it).
fn render_combination(
    kubectl: &Path,
    root: &Path,
    overlay: &str,
    components: &[String],
) -> Result<Rendered> {
    let dir = root.join(format!("combination-{overlay}-{}", components.join("-")));
    std::fs::create_dir_all(&dir)?;
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../overlays/{overlay}\n"
    );
    if !components.is_empty() {
        text.push_str("components:\n");
        for c in components {
            text.push_str(&format!("  - ../components/{c}\n"));
        }
    }
    std::fs::write(dir.join("kustomization.yaml"), text)?;
    let mut rendered = Rendered::render(kubectl, &dir)?;
    rendered.overlay = format!("{overlay} + [{}]", components.join(", "));
    Ok(rendered)
}

/// The controllers Deployment's features, from its args parsed by the real
/// command line.
fn controllers_features(rendered: &Rendered) -> Result<trainwire_controllers::failures::Features> {
    let d: Deployment = rendered.typed("Deployment", CONTROLLERS)?;
    let container = container(&d, "controllers")?;
    let command = container.command.clone().unwrap_or_default();
    ensure!(
        command == ["/usr/local/bin/trainwire-controllers"],
        "{}: the controllers Deployment does not run trainwire-controllers: {command:?}",
        rendered.overlay
    );
    let args = container.args.clone().unwrap_or_default();
    let argv = std::iter::once("trainwire-controllers".to_string()).chain(args);
    let c = <trainwire_controllers::cli::ControllersArgs as clap::Parser>::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("the controllers' args do not parse: {e}"))?;
    Ok(c.features())
}

/// Every overlay alone and with every combination of the components: the
/// rights of each ServiceAccount are exactly the rows of the table in
/// docs/deploy.md that apply, and exactly what the code that runs under it
/// calls (`API_PERMISSIONS`), with the features its flags turn on.
#[test]
fn rbac_per_service_account_is_the_documented_table_and_what_the_code_calls() -> Result<()> {
    let Some(kubectl) =
        kubectl("rbac_per_service_account_is_the_documented_table_and_what_the_code_calls")
    else {
        return Ok(());
    };
    let rows = rights_table()?;
    let all = components()?;
    assert_eq!(
        all,
        ["crash-loop", "monitoring", "node-failure"],
        "a component was added: give its rights rows in docs/deploy.md"
    );
    for row in &rows {
        assert!(
            row.with == "base" || row.with == "sidecar RoleBinding" || all.contains(&row.with),
            "a row granted with {:?}, which is no component",
            row.with
        );
    }
    let copy = self_managed_copy()?;
    let root = copy
        .overlay
        .parent()
        .and_then(Path::parent)
        .context("the copy's manifests/")?
        .to_path_buf();
    let code = |list: &[(&str, &str, &str)], account: &str, scope: &str| -> BTreeSet<Right> {
        list.iter()
            .map(|(g, r, v)| {
                (
                    account.to_string(),
                    g.to_string(),
                    r.to_string(),
                    v.to_string(),
                    scope.to_string(),
                )
            })
            .collect()
    };
    let mut combinations = 0;
    for overlay in ["cert-manager", "self-managed"] {
        for mask in 0..(1u32 << all.len()) {
            let chosen: Vec<String> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| c.clone())
                .collect();
            let rendered = render_combination(&kubectl, &root, overlay, &chosen)?;
            let rights = rights_by_account(&rendered)?;
            assert_eq!(
                rights,
                table_rights(&rows, &chosen),
                "{}: the rendered RBAC differs from the table in docs/deploy.md",
                rendered.overlay
            );

            // The code under each ServiceAccount.
            let features = controllers_features(&rendered)?;
            assert_eq!(
                (features.node_failure, features.crash_loop),
                (
                    chosen.iter().any(|c| c == "node-failure"),
                    chosen.iter().any(|c| c == "crash-loop")
                ),
                "{}: a feature's flag without its component (or the reverse)",
                rendered.overlay
            );
            let mut controllers = code(&features.permissions(), CONTROLLERS, "cluster");
            for (_, scope, calls) in trainwire_controllers::API_PERMISSIONS {
                let scope = match scope {
                    trainwire_controllers::Scope::Cluster => "cluster",
                    trainwire_controllers::Scope::OwnNamespace => NAMESPACE,
                };
                controllers.extend(code(calls, CONTROLLERS, scope));
            }
            let mut expected = code(
                trainwire_webhook::scale::API_PERMISSIONS,
                SERVICE,
                "cluster",
            );
            expected.extend(controllers);
            assert_eq!(
                rights, expected,
                "{}: a right no code calls, or a call without a right",
                rendered.overlay
            );
            // The admission server's account writes nothing.
            assert!(
                rights
                    .iter()
                    .filter(|r| r.0 == SERVICE)
                    .all(|r| ["get", "list", "watch"].contains(&r.3.as_str())),
                "{}: the admission server may write",
                rendered.overlay
            );
            // Each Deployment runs under its own account.
            for (deployment, account) in [(SERVICE, SERVICE), (CONTROLLERS, CONTROLLERS)] {
                let d: Deployment = rendered.typed("Deployment", deployment)?;
                let pod = d.spec.and_then(|s| s.template.spec).context("pod spec")?;
                assert_eq!(pod.service_account_name.as_deref(), Some(account));
            }

            // The sidecar's ClusterRole: installed, bound to nobody, and its
            // rules are the table's rows for the training pods' account.
            let sidecar: ClusterRole = rendered.typed("ClusterRole", "trainwire-sidecar")?;
            let sidecar_rows: BTreeSet<(String, String, String)> = rows
                .iter()
                .filter(|r| r.with == "sidecar RoleBinding")
                .flat_map(|r| {
                    r.verbs
                        .iter()
                        .map(|v| (r.group.clone(), r.resource.clone(), v.clone()))
                })
                .collect();
            let sidecar_rules = permissions(sidecar.rules.as_deref().unwrap_or_default())?;
            assert_eq!(
                sidecar_rules, sidecar_rows,
                "sidecar ClusterRole vs the table"
            );
            assert_eq!(
                sidecar_rules,
                owned(&[trainwire_sidecar::API_PERMISSIONS]),
                "sidecar ClusterRole"
            );
            combinations += 1;
        }
    }
    assert_eq!(combinations, 2 << all.len());
    Ok(())
}

#[test]
fn the_sidecar_rolebinding_example_binds_the_sidecar_role_in_one_namespace() -> Result<()> {
    let text = std::fs::read_to_string(manifests_dir().join("sidecar/rolebinding-example.yaml"))?;
    let binding: RoleBinding = serde_saphyr::from_str(&text)?;
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "trainwire-sidecar");
    let ns = binding
        .metadata
        .namespace
        .clone()
        .context("a namespaced binding")?;
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(subjects[0].namespace.as_deref(), Some(ns.as_str()));
    Ok(())
}

// The shipped policy ConfigMap is loaded by webhook/tests/policy_check.rs.

/// The overlays `manifests/render` writes to `manifests/install/`: every
/// overlay but the components and those that build a Secret from the
/// user's own files (a private key has no place in the repository).
fn installable_overlays() -> Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(manifests_dir().join("overlays"))? {
        let entry = entry?;
        let Ok(text) = std::fs::read_to_string(entry.path().join("kustomization.yaml")) else {
            continue;
        };
        let component = text.lines().any(|l| l == "kind: Component");
        let own_files = text.lines().any(|l| l == "secretGenerator:");
        if !component && !own_files {
            found.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(found)
}

#[test]
fn each_install_file_is_its_overlay_as_kustomize_renders_it() -> Result<()> {
    let Some(kubectl) = kubectl("each_install_file_is_its_overlay_as_kustomize_renders_it") else {
        return Ok(());
    };
    let overlays = installable_overlays()?;
    assert!(overlays.contains("cert-manager"), "{overlays:?}");
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(manifests_dir().join("install"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        files.insert(name.strip_suffix(".yaml").unwrap_or(&name).to_string());
    }
    assert_eq!(
        files, overlays,
        "manifests/install/ is not one file per installable overlay: run manifests/render"
    );
    for overlay in &overlays {
        let dir = manifests_dir().join("overlays").join(overlay);
        let out = Command::new(&kubectl).arg("kustomize").arg(&dir).output()?;
        ensure!(
            out.status.success(),
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let expected = format!(
            "# Generated by manifests/render from manifests/overlays/{overlay}; do not edit.\n{}",
            String::from_utf8(out.stdout)?
        );
        let path = manifests_dir().join(format!("install/{overlay}.yaml"));
        let checked_in = std::fs::read_to_string(&path)?;
        assert!(
            checked_in == expected,
            "{} differs from `kubectl kustomize {}`: run manifests/render",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// RBAC as the apiserver's authorizers answer a resource request: who is
/// bound to which rules, and where. The test double behind the CEL
/// `authorizer` of the sidecar's policy; in it, the training pods' rights
/// are the shipped ClusterRole, bound as
/// manifests/sidecar/rolebinding-example.yaml binds it.
#[derive(Clone, Debug, Default)]
struct Rbac {
    /// The rules of a Role or ClusterRole and the subjects they are bound
    /// to, in one namespace (a RoleBinding) or in all (`None`: a
    /// ClusterRoleBinding).
    bindings: Vec<(Option<String>, Vec<Subject>, Vec<PolicyRule>)>,
}

/// One resource request, as the authz library's ResourceCheck builds it.
#[derive(Clone, Debug, Default)]
struct Attributes {
    group: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
}

impl Attributes {
    fn new(group: &str, resource: &str, namespace: &str) -> Self {
        Attributes {
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.to_string(),
            ..Attributes::default()
        }
    }
}

impl Rbac {
    fn bind(&mut self, namespace: Option<&str>, subject: Subject, rules: &[PolicyRule]) {
        self.bindings
            .push((namespace.map(str::to_string), vec![subject], rules.to_vec()));
    }

    /// Whether `user` (a request's userInfo) may `verb` on `a`: anything for
    /// `system:masters` (the apiserver's privileged-group authorizer), else
    /// what a binding that names the user, one of its groups or its
    /// ServiceAccount allows in that namespace.
    fn allows(&self, user: &Value, a: &Attributes, verb: &str) -> bool {
        let username = user["username"].as_str().unwrap_or_default();
        let groups: Vec<&str> = user["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if groups.contains(&"system:masters") {
            return true;
        }
        self.bindings.iter().any(|(namespace, subjects, rules)| {
            let here = namespace.as_deref().is_none_or(|ns| ns == a.namespace);
            let named = subjects.iter().any(|s| match s.kind.as_str() {
                "ServiceAccount" => {
                    username
                        == format!(
                            "system:serviceaccount:{}:{}",
                            s.namespace.as_deref().unwrap_or_default(),
                            s.name
                        )
                }
                "User" => username == s.name,
                "Group" => groups.contains(&s.name.as_str()),
                _ => false,
            });
            here && named && rules.iter().any(|r| rule_allows(r, a, verb))
        })
    }
}

/// rbac/v1's `RuleAllows`: the verb, the API group, the resource (with its
/// subresource; `*` and `*/subresource` match too) and, when the rule names
/// some, the object's name.
fn rule_allows(rule: &PolicyRule, a: &Attributes, verb: &str) -> bool {
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    rule.verbs.iter().any(|v| v == "*" || v == verb)
        && rule
            .api_groups
            .iter()
            .flatten()
            .any(|g| g == "*" || *g == a.group)
        && rule.resources.iter().flatten().any(|r| {
            r == "*"
                || *r == resource
                || (!a.subresource.is_empty() && *r == format!("*/{}", a.subresource))
        })
        && rule
            .resource_names
            .as_ref()
            .is_none_or(|names| names.is_empty() || names.contains(&a.name))
}

/// Binds the CEL `authorizer` of the apiserver's authz library
/// (k8s.io/apiserver/pkg/cel/library/authz.go) for the requester `user`,
/// answered by `rbac`:
/// `authorizer.group(g).resource(r)[.subresource(s)][.namespace(ns)][.name(n)].check(verb).allowed()`.
/// Each step is a map that carries its type (Authorizer, GroupCheck,
/// ResourceCheck, Decision): a call on the wrong type fails, as a missing
/// overload does on the apiserver.
fn bind_authorizer(ctx: &mut cel_interpreter::Context, rbac: &Rbac, user: &Value) -> Result<()> {
    use cel_interpreter::ExecutionError;
    use cel_interpreter::Value as Cel;
    use cel_interpreter::extractors::This;

    type Step = Result<Cel, ExecutionError>;
    // The step's fields: its type and strings (a Decision's `allowed` too).
    fn typed(this: &Cel, from: &str, function: &str) -> Result<Value, ExecutionError> {
        let Cel::Map(map) = this else {
            return Err(ExecutionError::function_error(
                function,
                format!("no overload of {function} on {this:?}"),
            ));
        };
        let mut v = json!({});
        for (key, value) in map.map.iter() {
            if let cel_interpreter::objects::Key::String(key) = key {
                v[key.as_str()] = match value {
                    Cel::String(s) => json!(s.as_str()),
                    Cel::Bool(b) => json!(b),
                    _ => Value::Null,
                };
            }
        }
        if v["type"] != from {
            return Err(ExecutionError::function_error(
                function,
                format!("no overload of {function} on {}", v["type"]),
            ));
        }
        Ok(v)
    }
    fn string(arg: Cel, function: &str) -> Result<String, ExecutionError> {
        match arg {
            Cel::String(s) => Ok(s.to_string()),
            other => Err(ExecutionError::function_error(
                function,
                format!("{other:?} is not a string"),
            )),
        }
    }
    fn cel(v: Value) -> Step {
        cel_interpreter::to_value(v)
            .map_err(|e| ExecutionError::function_error("authorizer", e.to_string()))
    }

    ctx.add_variable("authorizer", json!({"type": "Authorizer"}))
        .map_err(|e| anyhow::anyhow!("binding authorizer: {e:?}"))?;
    ctx.add_function("group", |This(this): This<Cel>, group: Cel| -> Step {
        typed(&this, "Authorizer", "group")?;
        cel(json!({"type": "GroupCheck", "group": string(group, "group")?}))
    });
    ctx.add_function("resource", |This(this): This<Cel>, resource: Cel| -> Step {
        let mut v = typed(&this, "GroupCheck", "resource")?;
        let resource = string(resource, "resource")?;
        if resource.trim().is_empty() {
            return Err(ExecutionError::function_error(
                "resource",
                "resource must not be empty",
            ));
        }
        v["type"] = json!("ResourceCheck");
        v["resource"] = json!(resource);
        cel(v)
    });
    for field in ["subresource", "namespace", "name"] {
        ctx.add_function(field, move |This(this): This<Cel>, value: Cel| -> Step {
            let mut v = typed(&this, "ResourceCheck", field)?;
            v[field] = json!(string(value, field)?);
            cel(v)
        });
    }
    let (rbac, user) = (rbac.clone(), user.clone());
    ctx.add_function("check", move |This(this): This<Cel>, verb: Cel| -> Step {
        let v = typed(&this, "ResourceCheck", "check")?;
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        let a = Attributes {
            group: text("group"),
            resource: text("resource"),
            subresource: text("subresource"),
            namespace: text("namespace"),
            name: text("name"),
        };
        let allowed = rbac.allows(&user, &a, &string(verb, "check")?);
        cel(json!({"type": "Decision", "allowed": allowed}))
    });
    ctx.add_function("allowed", |This(this): This<Cel>| -> Step {
        let v = typed(&this, "Decision", "allowed")?;
        Ok(Cel::Bool(v["allowed"] == true))
    });
    Ok(())
}

/// Evaluates one CEL expression of the sidecar's ValidatingAdmissionPolicy
/// with the variables the apiserver binds: `object`, `oldObject`, `request`
/// (the AdmissionRequest, with its `userInfo`) and `authorizer` (for the
/// requester, answered by `rbac`).
fn policy_expression(expression: &str, request: &Value, rbac: &Rbac) -> Result<bool> {
    let program = cel_interpreter::Program::compile(expression)
        .map_err(|e| anyhow::anyhow!("CEL does not compile: {e:?}\n{expression}"))?;
    let mut ctx = cel_interpreter::Context::default();
    for (name, value) in [
        ("object", &request["object"]),
        ("oldObject", &request["oldObject"]),
        ("request", request),
    ] {
        ctx.add_variable(name, value.clone())
            .map_err(|e| anyhow::anyhow!("binding {name}: {e:?}"))?;
    }
    bind_authorizer(&mut ctx, rbac, &request["userInfo"])?;
    match program.execute(&ctx) {
        Ok(cel_interpreter::Value::Bool(b)) => Ok(b),
        Ok(other) => bail!("{expression} gave {other:?}, not a bool"),
        Err(e) => bail!("{expression} failed: {e:?}"),
    }
}

/// What the policy does with a request: not matched (`None`), or the
/// indices of the validations that fail (`Some`; empty: allowed).
fn policy_verdict(policy: &Value, request: &Value, rbac: &Rbac) -> Result<Option<Vec<usize>>> {
    for condition in policy["spec"]["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let expression = condition["expression"].as_str().context("expression")?;
        if !policy_expression(expression, request, rbac)? {
            return Ok(None);
        }
    }
    let mut failed = Vec::new();
    for (i, validation) in policy["spec"]["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let expression = validation["expression"].as_str().context("expression")?;
        if !policy_expression(expression, request, rbac)? {
            failed.push(i);
        }
    }
    Ok(Some(failed))
}

/// The userInfo the apiserver gives a request made with a pod's projected
/// ServiceAccount token (pkg/serviceaccount: `system:serviceaccount:NS:SA`,
/// its groups, and the pod (name, UID) and node the token is bound to in
/// `extra`).
fn pod_token_user(namespace: &str, account: &str, pod: Option<(&str, &str)>) -> Value {
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": ["JTI=0b0e7a1c-5a7e-4c47-9d7b-3c2d5f0e9a11"],
    });
    if let Some((name, uid)) = pod {
        extra["authentication.kubernetes.io/node-name"] = json!(["node-a"]);
        extra["authentication.kubernetes.io/node-uid"] =
            json!(["4f6c9d52-3f0e-4d7e-a0b5-3c1e2f9a8b70"]);
        extra["authentication.kubernetes.io/pod-name"] = json!([name]);
        extra["authentication.kubernetes.io/pod-uid"] = json!([uid]);
    }
    json!({
        "username": format!("system:serviceaccount:{namespace}:{account}"),
        "uid": "5c3f1a2b-7d8e-4f90-a1b2-c3d4e5f60718",
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
        "extra": extra,
    })
}

fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
    Subject {
        kind: kind.to_string(),
        name: name.to_string(),
        namespace: namespace.map(str::to_string),
        api_group: (kind != "ServiceAccount").then(|| "rbac.authorization.k8s.io".to_string()),
    }
}

fn policy_rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

/// The shipped ClusterRole `trainwire-sidecar` (as the cert-manager overlay
/// renders it), bound to `namespace:account` by the example RoleBinding
/// moved to that namespace and account.
fn sidecar_binding(rendered: &Rendered, namespace: &str, account: &str) -> Result<Rbac> {
    let text = std::fs::read_to_string(manifests_dir().join("sidecar/rolebinding-example.yaml"))?;
    let example: RoleBinding = serde_saphyr::from_str(&text)?;
    ensure!(example.role_ref.kind == "ClusterRole", "{example:?}");
    let role: ClusterRole = rendered.typed("ClusterRole", &example.role_ref.name)?;
    ensure!(
        role.aggregation_rule.is_none(),
        "an aggregated sidecar role"
    );
    let mut rbac = Rbac::default();
    rbac.bind(
        Some(namespace),
        subject("ServiceAccount", account, Some(namespace)),
        role.rules.as_deref().unwrap_or_default(),
    );
    Ok(rbac)
}

/// A training pod's token, through the shipped role: what it may do to pods
/// and what it may not, in its namespace and elsewhere.
#[test]
fn a_training_pods_token_holds_no_other_right_on_pods() -> Result<()> {
    let Some(kubectl) = kubectl("a_training_pods_token_holds_no_other_right_on_pods") else {
        return Ok(());
    };
    let rendered = Rendered::render(&kubectl, &manifests_dir().join("overlays/cert-manager"))?;
    let rbac = sidecar_binding(&rendered, "ml-team", "trainer")?;
    let token = pod_token_user("ml-team", "trainer", Some(("t-0", "uid-0")));
    let on = |group: &str, resource: &str, subresource: &str, namespace: &str| Attributes {
        subresource: subresource.to_string(),
        ..Attributes::new(group, resource, namespace)
    };
    let allowed = [
        (on("", "pods", "", "ml-team"), "get"),
        (on("", "pods", "", "ml-team"), "list"),
        (on("", "pods", "", "ml-team"), "watch"),
        (on("", "pods", "", "ml-team"), "patch"),
        (on("events.k8s.io", "events", "", "ml-team"), "create"),
        (on("events.k8s.io", "events", "", "ml-team"), "patch"),
        (
            on("trainwire.dev", "sidecar-records", "", "ml-team"),
            "write",
        ),
    ];
    for (a, verb) in &allowed {
        assert!(rbac.allows(&token, a, verb), "{verb} {a:?} refused");
    }
    let denied = [
        (on("", "pods", "", "ml-team"), "update"),
        (on("", "pods", "", "ml-team"), "create"),
        (on("", "pods", "", "ml-team"), "delete"),
        (on("", "pods", "", "ml-team"), "deletecollection"),
        (on("", "pods", "exec", "ml-team"), "create"),
        (on("", "pods", "exec", "ml-team"), "get"),
        (on("", "pods", "attach", "ml-team"), "create"),
        (on("", "pods", "portforward", "ml-team"), "create"),
        (on("", "pods", "proxy", "ml-team"), "get"),
        (on("", "pods", "ephemeralcontainers", "ml-team"), "patch"),
        (on("", "pods", "ephemeralcontainers", "ml-team"), "update"),
        (on("", "pods", "status", "ml-team"), "patch"),
        (on("", "pods", "status", "ml-team"), "update"),
        (on("", "pods", "eviction", "ml-team"), "create"),
        (on("", "pods", "binding", "ml-team"), "create"),
        (on("", "pods", "log", "ml-team"), "get"),
        (on("", "secrets", "", "ml-team"), "get"),
        (on("", "secrets", "", "ml-team"), "list"),
        (on("", "configmaps", "", "ml-team"), "get"),
        (on("", "serviceaccounts", "token", "ml-team"), "create"),
        (on("", "pods", "", "other-team"), "get"),
        (on("", "pods", "", "other-team"), "patch"),
        (on("", "pods", "", ""), "list"),
        // The policy leaves out holders of every verb on the marker.
        (on("trainwire.dev", "sidecar-records", "", "ml-team"), "*"),
        (
            on("trainwire.dev", "sidecar-records", "", "other-team"),
            "write",
        ),
    ];
    for (a, verb) in &denied {
        assert!(!rbac.allows(&token, a, verb), "{verb} {a:?} granted");
    }
    // The same ServiceAccount with a token bound to no pod: the same rights
    // (RBAC does not look at the pod); the policy tells them apart.
    let unbound = pod_token_user("ml-team", "trainer", None);
    for (a, verb) in &allowed {
        assert!(rbac.allows(&unbound, a, verb), "{verb} {a:?} refused");
    }
    Ok(())
}

/// Outcome of the sidecar policy for one write.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Not matched: RBAC alone decides.
    NotMatched,
    Allowed,
    /// Refused by these validations (0: the token is bound to the pod
    /// written; 1: spec, labels, finalizers and owners unchanged; 2: no
    /// annotation but the two records changed).
    Denied(&'static [usize]),
}

#[test]
fn the_sidecar_may_write_only_its_own_pods_records() -> Result<()> {
    let Some(kubectl) = kubectl("the_sidecar_may_write_only_its_own_pods_records") else {
        return Ok(());
    };
    let rendered = Rendered::render(&kubectl, &manifests_dir().join("overlays/cert-manager"))?;
    let policy = rendered.raw("ValidatingAdmissionPolicy", "trainwire-sidecar-own-pod")?;
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["UPDATE"]}])
    );
    let binding = rendered.raw(
        "ValidatingAdmissionPolicyBinding",
        "trainwire-sidecar-own-pod",
    )?;
    assert_eq!(binding["spec"]["policyName"], "trainwire-sidecar-own-pod");
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(
        binding["spec"]["matchResources"].is_null(),
        "every namespace"
    );
    // Matched by who writes, not by what is written: no condition reads
    // the pod.
    let conditions = serde_json::to_string(&policy["spec"]["matchConditions"])?;
    for target in ["object", "oldObject", "labels"] {
        assert!(
            !conditions.contains(target),
            "a matchCondition reads {target}: {conditions}"
        );
    }
    // The records the policy lets through are the sidecar's.
    let text = serde_json::to_string(&policy["spec"]["validations"])?;
    for key in [
        trainwire_contract::peer_loss::ANNOTATION,
        trainwire_contract::world::CHECKPOINT_ANNOTATION,
        trainwire_contract::stall::ANNOTATION,
    ] {
        assert!(
            text.contains(&format!("'{key}'")),
            "{key} not in the policy"
        );
    }

    // A captured Pod UPDATE from a real apiserver (the Job controller
    // removing its finalizer), as the base of every case.
    let path =
        trainwire_tests::admission_fixtures_dir().join("pod-update-job-finalizer-removal.json");
    let review: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let captured = review["request"].clone();
    let namespace = captured["namespace"]
        .as_str()
        .context("namespace")?
        .to_string();
    let label = trainwire_contract::labels::INJECTED;
    // The training pod whose token writes.
    let mut own = captured["oldObject"].clone();
    own["metadata"]["labels"][label] = json!(trainwire_contract::labels::INJECTED_VALUE);
    let name = own["metadata"]["name"]
        .as_str()
        .context("name")?
        .to_string();
    let uid = own["metadata"]["uid"].as_str().context("uid")?.to_string();
    let account = own["spec"]["serviceAccountName"]
        .as_str()
        .context("serviceAccountName")?
        .to_string();
    // Another pod of the same workload.
    let mut peer = own.clone();
    peer["metadata"]["name"] = json!("bert-pretrain-0-x7k2p");
    peer["metadata"]["uid"] = json!("0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f");
    // A pod of the same namespace and ServiceAccount that is not trainwire's
    // (issue #32: `kubectl label pod plain app=hijacked` went through).
    let mut plain = captured["oldObject"].clone();
    plain["metadata"]["name"] = json!("plain");
    plain["metadata"]["uid"] = json!("7e8f9a0b-1c2d-4e3f-a4b5-c6d7e8f90a1b");
    plain["metadata"]["labels"] = json!({"app": "plain"});
    plain["metadata"]
        .as_object_mut()
        .context("metadata")?
        .remove("annotations");
    // A pod of another namespace, where the ServiceAccount is bound to nothing.
    let mut elsewhere = plain.clone();
    elsewhere["metadata"]["namespace"] = json!("other-team");

    // Who is bound to what: the training pods' ServiceAccount to the
    // shipped role; the Job controller, a namespace editor and a cluster
    // admin (a wildcard ClusterRole) as Kubernetes' own roles grant them.
    let mut rbac = sidecar_binding(&rendered, &namespace, &account)?;
    rbac.bind(
        None,
        subject("ServiceAccount", "job-controller", Some("kube-system")),
        &[
            policy_rule(
                &["batch"],
                &["jobs"],
                &["get", "list", "watch", "update", "patch"],
            ),
            policy_rule(&["batch"], &["jobs/status", "jobs/finalizers"], &["update"]),
            policy_rule(
                &[""],
                &["pods"],
                &["list", "watch", "create", "delete", "patch"],
            ),
            policy_rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "patch", "update"],
            ),
        ],
    );
    let editor_rules = [
        policy_rule(
            &[""],
            &["pods", "pods/exec", "pods/attach", "pods/portforward"],
            &[
                "create",
                "delete",
                "deletecollection",
                "patch",
                "update",
                "get",
                "list",
                "watch",
            ],
        ),
        policy_rule(&["apps", "batch"], &["*"], &["*"]),
    ];
    rbac.bind(
        Some(&namespace),
        subject("User", "alice", None),
        &editor_rules,
    );
    rbac.bind(
        None,
        subject("Group", "platform-admins", None),
        &[policy_rule(&["*"], &["*"], &["*"])],
    );
    // Someone bound to the sidecar's role by mistake is confined as well.
    let sidecar_role: ClusterRole = rendered.typed("ClusterRole", "trainwire-sidecar")?;
    rbac.bind(
        Some(&namespace),
        subject("User", "bob", None),
        sidecar_role.rules.as_deref().unwrap_or_default(),
    );

    let token = pod_token_user(&namespace, &account, Some((&name, &uid)));
    let peer_token = pod_token_user(
        &namespace,
        &account,
        Some((
            "bert-pretrain-0-x7k2p",
            "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f",
        )),
    );
    let previous_incarnation = pod_token_user(
        &namespace,
        &account,
        Some((&name, "1b2c3d4e-5f60-4718-9a0b-c1d2e3f40516")),
    );
    let unbound = pod_token_user(&namespace, &account, None);
    let other_account = pod_token_user(&namespace, "someone-else", Some((&name, &uid)));
    let job_controller = captured["userInfo"].clone();
    let person = |username: &str, groups: &[&str]| json!({"username": username, "groups": groups});
    let alice = person("alice", &["system:authenticated"]);
    let bob = person("bob", &["system:authenticated"]);
    let admin = person("carol", &["platform-admins", "system:authenticated"]);
    let masters = person(
        "kubernetes-admin",
        &[
            "kubeadm:cluster-admins",
            "system:masters",
            "system:authenticated",
        ],
    );

    // A write by `user` that turns the stored `target` into `change(target)`.
    let request = |user: &Value, target: &Value, change: &dyn Fn(&mut Value)| {
        let mut r = captured.clone();
        let mut object = target.clone();
        change(&mut object);
        r["name"] = target["metadata"]["name"].clone();
        r["namespace"] = target["metadata"]["namespace"].clone();
        r["object"] = object;
        r["oldObject"] = target.clone();
        r["userInfo"] = user.clone();
        r
    };
    let peer_loss = |o: &mut Value| {
        o["metadata"]["annotations"][trainwire_contract::peer_loss::ANNOTATION] =
            json!("{\"generation\":1}");
    };
    let checkpoint = |o: &mut Value| {
        o["metadata"]["annotations"][trainwire_contract::world::CHECKPOINT_ANNOTATION] =
            json!("{\"path\":\"/checkpoints/step-10\"}");
    };
    let both_records = |o: &mut Value| {
        peer_loss(o);
        checkpoint(o);
    };
    let other_annotation = |o: &mut Value| {
        o["metadata"]["annotations"]["team"] = json!("b");
    };
    let status_annotation = |o: &mut Value| {
        o["metadata"]["annotations"]["trainwire.dev/status"] = json!("{}");
    };
    let drop_annotation = |o: &mut Value| {
        if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
            a.remove("batch.kubernetes.io/job-completion-index");
        }
    };
    let relabel = |o: &mut Value| {
        o["metadata"]["labels"]["app"] = json!("hijacked");
    };
    let unlabel = |o: &mut Value| {
        if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
            labels.remove(trainwire_contract::labels::INJECTED);
        }
    };
    let image = |o: &mut Value| {
        o["spec"]["containers"][0]["image"] = json!("evil:latest");
    };
    let finalizer = |o: &mut Value| {
        o["metadata"]["finalizers"] = json!([]);
    };

    use Outcome::*;
    type Case<'a> = (
        &'a str,
        &'a Value,
        &'a Value,
        &'a dyn Fn(&mut Value),
        Outcome,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // A training pod's token on its own pod.
        ("own pod, peer-loss record",                      &token,                &own,       &peer_loss,         Allowed),
        ("own pod, checkpoint record",                     &token,                &own,       &checkpoint,        Allowed),
        ("own pod, both records",                          &token,                &own,       &both_records,      Allowed),
        ("own pod, another annotation",                    &token,                &own,       &other_annotation,  Denied(&[2])),
        ("own pod, the injected status",                   &token,                &own,       &status_annotation, Denied(&[2])),
        ("own pod, an annotation removed",                 &token,                &own,       &drop_annotation,   Denied(&[2])),
        ("own pod, a label",                               &token,                &own,       &relabel,           Denied(&[1])),
        ("own pod, the injected label removed",            &token,                &own,       &unlabel,           Denied(&[1])),
        ("own pod, the spec",                              &token,                &own,       &image,             Denied(&[1])),
        ("own pod, the finalizers",                        &token,                &own,       &finalizer,         Denied(&[1])),
        // ... on any other pod.
        ("another trainwire pod, its record",              &token,                &peer,      &peer_loss,         Denied(&[0])),
        ("another trainwire pod, a label",                 &token,                &peer,      &relabel,           Denied(&[0, 1])),
        ("a pod not trainwire's, a label",                 &token,                &plain,     &relabel,           Denied(&[0, 1])),
        ("a pod not trainwire's, an annotation",           &token,                &plain,     &other_annotation,  Denied(&[0, 2])),
        ("a pod not trainwire's, a record",                &token,                &plain,     &peer_loss,         Denied(&[0])),
        ("a pod not trainwire's, its spec",                &token,                &plain,     &image,             Denied(&[0, 1])),
        // Tokens of the same ServiceAccount not bound to the pod written.
        ("a peer's token on this pod",                     &peer_token,           &own,       &peer_loss,         Denied(&[0])),
        ("a token bound to no pod",                        &unbound,              &own,       &peer_loss,         Denied(&[0])),
        ("a token bound to no pod, a pod not trainwire's", &unbound,              &plain,     &relabel,           Denied(&[0, 1])),
        ("the token of a same-named pod before it",        &previous_incarnation, &own,       &peer_loss,         Denied(&[0])),
        ("a person bound to the sidecar role",             &bob,                  &plain,     &relabel,           Denied(&[0, 1])),
        // Not matched: RBAC alone decides.
        ("another namespace (no binding there)",           &token,                &elsewhere, &relabel,           NotMatched),
        ("another ServiceAccount",                         &other_account,        &own,       &peer_loss,         NotMatched),
        ("the Job controller, a trainwire pod",            &job_controller,       &own,       &finalizer,         NotMatched),
        ("the Job controller, a pod not trainwire's",      &job_controller,       &plain,     &finalizer,         NotMatched),
        ("a namespace editor",                             &alice,                &plain,     &relabel,           NotMatched),
        ("a namespace editor, a trainwire pod",            &alice,                &own,       &image,             NotMatched),
        ("a cluster admin (wildcard role)",                &admin,                &own,       &relabel,           NotMatched),
        ("system:masters",                                 &masters,              &plain,     &relabel,           NotMatched),
    ];
    // Every case is run, and every wrong one reported.
    let mut wrong = Vec::new();
    for (what, user, target, change, want) in cases {
        let verdict = policy_verdict(policy, &request(user, target, change), &rbac)?;
        let right = match (&want, &verdict) {
            (NotMatched, None) => true,
            (Allowed, Some(failed)) => failed.is_empty(),
            (Denied(expected), Some(failed)) => !expected.is_empty() && failed == expected,
            _ => false,
        };
        if !right {
            wrong.push(format!(
                "{what}: expected {want:?}, got {verdict:?} (None: not matched, else the validations that fail)"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The captured request as it was: not matched.
    assert_eq!(policy_verdict(policy, &captured, &rbac)?, None);
    Ok(())
}

#[test]
fn the_controllers_deployment_is_hardened_and_runs_only_the_controllers() -> Result<()> {
    let Some(kubectl) =
        kubectl("the_controllers_deployment_is_hardened_and_runs_only_the_controllers")
    else {
        return Ok(());
    };
    for (rendered, _) in render_overlays(&kubectl)? {
        let d: Deployment = rendered.typed("Deployment", CONTROLLERS)?;
        assert_eq!(d.metadata.namespace.as_deref(), Some(NAMESPACE));
        let spec = d.spec.as_ref().context("spec")?;
        let pod = spec.template.spec.as_ref().context("pod spec")?;
        assert_eq!(pod.service_account_name.as_deref(), Some(CONTROLLERS));
        let c = container(&d, "controllers")?;
        assert_unprivileged(pod, c)?;
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .context("limits")?;
        assert!(limits.contains_key("memory") && limits.contains_key("cpu"));
        // No admission port, no certificate: the apiserver never calls it.
        let ports: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
        assert_eq!(ports, [8080]);
        assert!(
            !pod.volumes.iter().flatten().any(|v| v.name == "tls"),
            "the controllers mount no serving certificate"
        );
        // The base turns no optional feature on.
        let features = controllers_features(&rendered)?;
        assert_eq!(
            (features.node_failure, features.crash_loop),
            (false, false),
            "{}",
            rendered.overlay
        );
        // The admission Service selects the admission pods only.
        let svc: Service = rendered.typed("Service", SERVICE)?;
        let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
        let labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert!(
            !selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
            "the webhook Service would send admissions to the controllers"
        );
    }
    Ok(())
}
