//! The Helm chart `charts/trainwire` against the kustomize manifests, with
//! the real `helm` (v4; `charts/install-helm` installs it) and the real
//! `kubectl kustomize`: one source of truth.
//!
//! - `helm template` with default values renders, object by object (kind,
//!   namespace, name), what `kubectl kustomize manifests/overlays/self-managed`
//!   renders; with the optional parts on, what that overlay renders with the
//!   components node-failure, crash-loop and monitoring; with
//!   `certificates.source=cert-manager`, what `overlays/cert-manager`
//!   renders. Every way they differ is an entry of [`DIFFERENCES`], which
//!   says why; an entry that no longer applies fails the test as much as a
//!   difference that is not listed.
//! - The certificate the chart makes is served by the real
//!   `trainwire-webhook serve` and trusted through the caBundle alone, for
//!   the name the apiserver dials.
//! - `helm lint --strict` is clean, and `values.schema.json` refuses bad
//!   values with a message that names them.
//!
//! helm and kubectl are required in CI (`CI` set): a missing one fails
//! there; elsewhere the tests say `SKIPPED` and pass.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use trainwire_test_support::net::free_port;
use trainwire_test_support::process::{Log, Proc, Tag};
use trainwire_test_support::require::require_all;
use trainwire_tests::{Prerequisite, repo_root};

const NAMESPACE: &str = "trainwire-system";
const RELEASE: &str = "trainwire";
const TLS_SECRET: &str = "trainwire-webhook-tls";
/// The name the apiserver dials (the Service's).
const SERVICE_HOST: &str = "trainwire-webhook.trainwire-system.svc";

/// The labels Helm's convention adds to every object of the chart
/// (`trainwire.labels` in templates/_helpers.tpl), beside kustomize's
/// `app.kubernetes.io/part-of`.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Every documented difference between the chart's render and kustomize's:
/// (name, why). Each comparison says which of them it expects; each must
/// be met at least once there, and nothing else may differ.
const DIFFERENCES: &[(&str, &str)] = &[
    (
        HELM_LABELS_DIFF,
        "every object of the chart carries Helm's labels helm.sh/chart, \
         app.kubernetes.io/managed-by, app.kubernetes.io/instance and \
         app.kubernetes.io/version (metadata only, never in a selector)",
    ),
    (
        OVERLAY_LABELS,
        "the objects kustomize's overlays add (the Secret trainwire-webhook-tls, \
         cert-manager's Issuers and Certificates) carry app.kubernetes.io/part-of \
         in the chart; kustomize's `labels` in the base reach only the base's objects \
         (a component's `labels`, monitoring's, reach them all)",
    ),
    (
        NO_NAMESPACE,
        "the chart renders no Namespace by default (namespace.create=false): \
         Helm stores its release in the namespace, which must exist before \
         the install; docs/deploy.md creates it with the same Pod Security labels",
    ),
    (
        POLICY_TEXT,
        "the ConfigMap trainwire-policy's policy.yaml is written from the values \
         (policy:), without the comments of manifests/base/policy.yaml: \
         compared as YAML",
    ),
    (
        CERTIFICATE_MATERIAL,
        "the Secret trainwire-webhook-tls and the caBundle are generated at each \
         render (by trainwire-webhook certs for kustomize, by the chart for helm): \
         each side's caBundle must be its own Secret's ca.crt \
         (the_chart_certificate_is_served_and_trusted_through_the_ca_bundle checks \
         the chart's chain), then both are compared without the material",
    ),
    (
        CEL_WHITESPACE,
        "the ValidatingAdmissionPolicy's CEL expressions: kustomize re-emits a \
         folded (>-) block whose lines are more indented with an extra blank \
         line, Helm passes the text through; compared with each run of \
         whitespace as one space (whitespace means nothing to CEL)",
    ),
    (
        CONTROLLERS_PDB,
        "with controllers.podDisruptionBudget.enabled the chart adds a \
         PodDisruptionBudget trainwire-controllers, which the kustomize base \
         does not have",
    ),
];
const HELM_LABELS_DIFF: &str = "helm-labels";
const OVERLAY_LABELS: &str = "overlay-labels";
const NO_NAMESPACE: &str = "no-namespace";
const POLICY_TEXT: &str = "policy-text";
const CERTIFICATE_MATERIAL: &str = "certificate-material";
const CEL_WHITESPACE: &str = "cel-whitespace";
const CONTROLLERS_PDB: &str = "controllers-pdb";

fn chart_dir() -> PathBuf {
    repo_root().join("charts/trainwire")
}

/// helm and kubectl, or `false` (a skip outside CI, a failure under it).
#[track_caller]
fn tools(test: &str) -> bool {
    let helm = match Prerequisite::command("helm", &["version"]) {
        Prerequisite::Missing(why) => Prerequisite::Missing(format!(
            "helm (v3.8 or newer; charts/install-helm installs v4.3.1) renders charts/trainwire: {why}"
        )),
        met => met,
    };
    let kubectl = match Prerequisite::command("kubectl", &["version", "--client"]) {
        Prerequisite::Missing(why) => Prerequisite::Missing(format!(
            "kubectl (>= 1.27) renders manifests/ (kubectl kustomize): {why}"
        )),
        met => met,
    };
    require_all(test, [helm, kubectl])
}

/// The objects of a multi-document YAML stream.
fn objects(text: &str, what: &str) -> Result<Vec<Value>> {
    let all: Vec<Value> =
        serde_saphyr::from_multiple(text).with_context(|| format!("parsing {what}"))?;
    Ok(all.into_iter().filter(|o| !o.is_null()).collect())
}

fn run(command: &mut Command, what: &str) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm template trainwire charts/trainwire --namespace trainwire-system`
/// with `--set` values.
fn helm_template(set: &[&str]) -> Result<Vec<Value>> {
    let mut command = Command::new("helm");
    command
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE]);
    for value in set {
        command.args(["--set", value]);
    }
    let text = run(&mut command, &format!("helm template {}", set.join(" ")))?;
    objects(&text, "helm template")
}

/// A copy of `manifests/` with the self-managed overlay's certificates
/// written (as docs/deploy.md has the user do) and a kustomization `combo/`
/// of that overlay plus `components`.
struct Manifests {
    dir: tempfile::TempDir,
}

impl Manifests {
    fn new(components: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let manifests = dir.path().join("manifests");
        copy_tree(&repo_root().join("manifests"), &manifests)?;
        let generated = trainwire_webhook::certs::generate("trainwire-webhook", NAMESPACE, 1)?;
        trainwire_webhook::certs::write(
            &generated,
            &manifests.join("overlays/self-managed/certs"),
        )?;
        let mut kustomization = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - ../overlays/self-managed\ncomponents:\n",
        );
        for c in components {
            kustomization.push_str(&format!("  - ../components/{c}\n"));
        }
        std::fs::create_dir_all(manifests.join("combo"))?;
        std::fs::write(manifests.join("combo/kustomization.yaml"), kustomization)?;
        Ok(Manifests { dir })
    }

    /// `kubectl kustomize manifests/<dir>`.
    fn render(&self, dir: &str) -> Result<Vec<Value>> {
        let path = self.dir.path().join("manifests").join(dir);
        let text = run(
            Command::new("kubectl").arg("kustomize").arg(&path),
            &format!("kubectl kustomize manifests/{dir}"),
        )?;
        objects(&text, &format!("kubectl kustomize manifests/{dir}"))
    }
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

/// (kind, namespace, name)
type Key = (String, String, String);

fn key(o: &Value) -> Key {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&o["kind"]),
        text(&o["metadata"]["namespace"]),
        text(&o["metadata"]["name"]),
    )
}

fn by_key(objects: Vec<Value>, what: &str) -> Result<BTreeMap<Key, Value>> {
    let mut map = BTreeMap::new();
    for o in objects {
        let k = key(&o);
        if map.insert(k.clone(), o).is_some() {
            bail!("{what}: two objects {k:?}");
        }
    }
    Ok(map)
}

fn is_overlay_object(k: &Key) -> bool {
    matches!(k.0.as_str(), "Issuer" | "Certificate") || (k.0 == "Secret" && k.2 == TLS_SECRET)
}

fn labels_mut(o: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    o.pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
}

/// Collapse every run of whitespace to one space.
fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The base64 of a Secret's entry, without the line folds kustomize puts in.
fn b64(v: &Value) -> Option<String> {
    v.as_str()
        .map(|s| s.chars().filter(|c| !c.is_whitespace()).collect())
}

/// Apply the documented differences to both renders; returns the ones met.
fn normalize(
    helm: &mut BTreeMap<Key, Value>,
    kustomize: &mut BTreeMap<Key, Value>,
) -> Result<BTreeSet<&'static str>> {
    let mut met = BTreeSet::new();

    for (k, o) in helm.iter_mut() {
        // Unless a component's `labels` reached it (monitoring's do).
        let overlay = is_overlay_object(k)
            && kustomize
                .get(k)
                .is_some_and(|o| o["metadata"]["labels"]["app.kubernetes.io/part-of"].is_null());
        let labels = labels_mut(o).with_context(|| format!("{k:?} has no labels"))?;
        for l in HELM_LABELS {
            ensure!(labels.remove(l).is_some(), "{k:?} lacks Helm's label {l}");
            met.insert(HELM_LABELS_DIFF);
        }
        if overlay {
            ensure!(
                labels.remove("app.kubernetes.io/part-of") == Some(Value::from("trainwire")),
                "{k:?} lacks app.kubernetes.io/part-of: trainwire"
            );
            met.insert(OVERLAY_LABELS);
        }
        if labels.is_empty() {
            o["metadata"]
                .as_object_mut()
                .context("metadata")?
                .remove("labels");
        }
    }

    let namespace: Key = ("Namespace".into(), String::new(), NAMESPACE.into());
    if kustomize.contains_key(&namespace) && !helm.contains_key(&namespace) {
        kustomize.remove(&namespace);
        met.insert(NO_NAMESPACE);
    }
    let pdb: Key = (
        "PodDisruptionBudget".into(),
        NAMESPACE.into(),
        "trainwire-controllers".into(),
    );
    if helm.contains_key(&pdb) && !kustomize.contains_key(&pdb) {
        helm.remove(&pdb);
        met.insert(CONTROLLERS_PDB);
    }

    let policy: Key = (
        "ConfigMap".into(),
        NAMESPACE.into(),
        "trainwire-policy".into(),
    );
    for side in [&mut *helm, &mut *kustomize] {
        let data = side
            .get_mut(&policy)
            .and_then(|o| o.pointer_mut("/data/policy.yaml"))
            .context("the ConfigMap trainwire-policy has no policy.yaml")?;
        let text = data.as_str().context("policy.yaml is no string")?;
        let parsed: Value = serde_saphyr::from_str(text).context("policy.yaml")?;
        *data = parsed;
    }
    if helm[&policy]["data"] != kustomize[&policy]["data"] {
        bail!(
            "the policy differs:\nhelm: {}\nkustomize: {}",
            helm[&policy]["data"],
            kustomize[&policy]["data"]
        );
    }
    met.insert(POLICY_TEXT);

    let secret: Key = ("Secret".into(), NAMESPACE.into(), TLS_SECRET.into());
    for (what, side) in [("helm", &mut *helm), ("kustomize", &mut *kustomize)] {
        let ca = match side.get_mut(&secret) {
            Some(s) => {
                let ca = b64(&s["data"]["ca.crt"]).context("the Secret has no ca.crt")?;
                for entry in ["ca.crt", "tls.crt", "tls.key"] {
                    let v = s
                        .pointer_mut(&format!("/data/{entry}"))
                        .with_context(|| format!("{what}: the Secret has no {entry}"))?;
                    *v = Value::from("<generated>");
                }
                Some(ca)
            }
            None => None,
        };
        let config: Key = (
            "MutatingWebhookConfiguration".into(),
            String::new(),
            "trainwire".into(),
        );
        let webhooks = side
            .get_mut(&config)
            .and_then(|c| c["webhooks"].as_array_mut())
            .with_context(|| format!("{what}: no webhook configuration trainwire"))?;
        for w in webhooks {
            let name = w["name"].clone();
            let bundle = w.pointer_mut("/clientConfig/caBundle");
            match (&ca, bundle) {
                (Some(ca), Some(bundle)) => {
                    ensure!(
                        b64(bundle).as_ref() == Some(ca),
                        "{what}: the caBundle of {name} is not the Secret's ca.crt"
                    );
                    *bundle = Value::from("<generated>");
                    met.insert(CERTIFICATE_MATERIAL);
                }
                (None, None) => {}
                (ca, bundle) => bail!(
                    "{what}: {name}: a Secret {} but a caBundle {}",
                    ca.is_some(),
                    bundle.is_some()
                ),
            }
        }
    }

    let policy_key: Key = (
        "ValidatingAdmissionPolicy".into(),
        String::new(),
        "trainwire-sidecar-own-pod".into(),
    );
    for side in [&mut *helm, &mut *kustomize] {
        let vap = side
            .get_mut(&policy_key)
            .context("no ValidatingAdmissionPolicy trainwire-sidecar-own-pod")?;
        for list in ["matchConditions", "validations"] {
            for item in vap["spec"][list].as_array_mut().into_iter().flatten() {
                if let Some(Value::String(e)) = item.get_mut("expression") {
                    *e = collapse(e);
                }
            }
        }
    }
    if helm.get(&policy_key).is_some() {
        met.insert(CEL_WHITESPACE);
    }
    Ok(met)
}

/// Hold one helm render to one kustomize render, with `expected` the
/// documented differences that must apply.
fn compare(
    helm: Vec<Value>,
    kustomize: Vec<Value>,
    expected: &[&'static str],
    what: &str,
) -> Result<()> {
    for e in expected {
        ensure!(
            DIFFERENCES.iter().any(|(name, _)| name == e),
            "{e} is not in DIFFERENCES"
        );
    }
    let mut helm = by_key(helm, "helm template")?;
    let mut kustomize = by_key(kustomize, "kubectl kustomize")?;
    let met = normalize(&mut helm, &mut kustomize)?;
    let expected: BTreeSet<&str> = expected.iter().copied().collect();
    assert_eq!(
        met, expected,
        "{what}: the documented differences met (left) are not the ones expected (right)"
    );
    let only_helm: Vec<&Key> = helm
        .keys()
        .filter(|k| !kustomize.contains_key(*k))
        .collect();
    let only_kustomize: Vec<&Key> = kustomize
        .keys()
        .filter(|k| !helm.contains_key(*k))
        .collect();
    assert!(
        only_helm.is_empty() && only_kustomize.is_empty(),
        "{what}: objects only in helm's render {only_helm:?}, only in kustomize's {only_kustomize:?}"
    );
    let mut differ = Vec::new();
    for (k, h) in &helm {
        if kustomize[k] != *h {
            differ.push(format!(
                "{k:?}\nhelm:      {}\nkustomize: {}",
                serde_json::to_string(h)?,
                serde_json::to_string(&kustomize[k])?
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "{what}: objects that differ beyond DIFFERENCES:\n{}",
        differ.join("\n\n")
    );
    Ok(())
}

#[test]
fn the_default_values_render_the_self_managed_overlay() -> Result<()> {
    if !tools("the_default_values_render_the_self_managed_overlay") {
        return Ok(());
    }
    let manifests = Manifests::new(&[])?;
    compare(
        helm_template(&[])?,
        manifests.render("overlays/self-managed")?,
        &[
            HELM_LABELS_DIFF,
            OVERLAY_LABELS,
            NO_NAMESPACE,
            POLICY_TEXT,
            CERTIFICATE_MATERIAL,
            CEL_WHITESPACE,
        ],
        "default values vs overlays/self-managed",
    )
}

#[test]
fn the_optional_parts_render_the_components() -> Result<()> {
    if !tools("the_optional_parts_render_the_components") {
        return Ok(());
    }
    let manifests = Manifests::new(&["node-failure", "crash-loop", "monitoring"])?;
    compare(
        helm_template(&[
            "namespace.create=true",
            "controllers.nodeFailure.enabled=true",
            "controllers.crashLoop.enabled=true",
            "controllers.podDisruptionBudget.enabled=true",
            "monitoring.enabled=true",
        ])?,
        manifests.render("combo")?,
        // The monitoring component's `labels` reach the overlay's Secret
        // too: no OVERLAY_LABELS here.
        &[
            HELM_LABELS_DIFF,
            POLICY_TEXT,
            CERTIFICATE_MATERIAL,
            CEL_WHITESPACE,
            CONTROLLERS_PDB,
        ],
        "every optional part vs overlays/self-managed + node-failure, crash-loop, monitoring",
    )
}

#[test]
fn cert_manager_certificates_render_the_cert_manager_overlay() -> Result<()> {
    if !tools("cert_manager_certificates_render_the_cert_manager_overlay") {
        return Ok(());
    }
    let manifests = Manifests::new(&[])?;
    compare(
        helm_template(&["certificates.source=cert-manager"])?,
        manifests.render("overlays/cert-manager")?,
        &[
            HELM_LABELS_DIFF,
            OVERLAY_LABELS,
            NO_NAMESPACE,
            POLICY_TEXT,
            CEL_WHITESPACE,
        ],
        "certificates.source=cert-manager vs overlays/cert-manager",
    )
}

#[test]
fn helm_lint_strict_is_clean() -> Result<()> {
    if !tools("helm_lint_strict_is_clean") {
        return Ok(());
    }
    for set in [
        &[][..],
        &[
            "certificates.source=cert-manager",
            "monitoring.enabled=true",
            "controllers.nodeFailure.enabled=true",
            "controllers.crashLoop.enabled=true",
            "namespace.create=true",
        ][..],
    ] {
        let mut command = Command::new("helm");
        command.args(["lint", "--strict"]).arg(chart_dir());
        for value in set {
            command.args(["--set", value]);
        }
        let out = command.output().context("running helm lint")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(out.status.success(), "helm lint --strict {set:?}:\n{text}");
        // --strict fails on warnings; errors would fail it too. What is
        // left is advice ([INFO]), never a [WARNING] or [ERROR].
        ensure!(
            !text.contains("[WARNING]") && !text.contains("[ERROR]"),
            "helm lint --strict {set:?}:\n{text}"
        );
    }
    Ok(())
}

#[test]
fn a_bad_value_is_refused_with_a_message_that_names_it() -> Result<()> {
    if !tools("a_bad_value_is_refused_with_a_message_that_names_it") {
        return Ok(());
    }
    // (--set value, what helm's message must contain)
    let cases = [
        ("webook.replicas=2", "'webook' not allowed"),
        ("webhook.replicas=-1", "/webhook/replicas"),
        ("image.digest=sha256:abc", "/image/digest"),
        (
            "image.repository=Registry.example.com/x:1",
            "/image/repository",
        ),
        ("certificates.source=vault", "/certificates/source"),
        (
            "controllers.crashLoop.enabled=yes",
            "/controllers/crashLoop/enabled",
        ),
        (
            "webhook.resources.limits.memory=lots",
            "/webhook/resources/limits/memory",
        ),
        (
            "webhook.podDisruptionBudget.minAvailable=half",
            "/webhook/podDisruptionBudget/minAvailable",
        ),
        ("logFormat=xml", "/logFormat"),
        ("clusterDomain=Cluster.Local", "/clusterDomain"),
        (
            "controllers.extraArgs[0]=node-failure",
            "/controllers/extraArgs/0",
        ),
        ("policy.kind=Other", "/policy"),
        (
            "certificates.certManager.issuerRef.kind=Vault",
            "/certificates/certManager/issuerRef/kind",
        ),
    ];
    for (value, expected) in cases {
        for action in ["template", "install"] {
            let mut command = Command::new("helm");
            command.args([action, RELEASE]).arg(chart_dir());
            command.args(["--namespace", NAMESPACE, "--set", value]);
            if action == "install" {
                // The schema is checked before any cluster is contacted.
                command.args(["--dry-run=client"]);
            }
            let out = command.output().context("running helm")?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "helm {action} --set {value} was accepted"
            );
            assert!(
                stderr.contains("values don't meet the specifications of the schema")
                    && stderr.contains(expected),
                "helm {action} --set {value}: the message does not name {expected}:\n{stderr}"
            );
        }
    }
    Ok(())
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name}"))
}

fn container<'a>(objects: &'a [Value], deployment: &str) -> Result<&'a Value> {
    find(objects, "Deployment", deployment)?
        .pointer("/spec/template/spec/containers/0")
        .with_context(|| format!("Deployment {deployment} has no container"))
}

fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[test]
fn images_resources_placement_and_flags_come_from_the_values() -> Result<()> {
    if !tools("images_resources_placement_and_flags_come_from_the_values") {
        return Ok(());
    }
    let digest = format!("sha256:{}", "ab".repeat(32));
    let objects = helm_template(&[
        "image.repository=registry.example.com/ml/trainwire-webhook",
        "image.tag=0.2.1",
        "sidecarImage.repository=registry.example.com/ml/trainwire-sidecar",
        &format!("sidecarImage.digest={digest}"),
        "clusterDomain=corp.internal",
        "webhook.replicas=3",
        "webhook.resources.limits.memory=512Mi",
        "webhook.nodeSelector.pool=system",
        "webhook.tolerations[0].key=dedicated",
        "webhook.tolerations[0].operator=Exists",
        "webhook.priorityClassName=",
        "controllers.extraArgs[0]=--log-format=text",
        "controllers.affinity=null",
        "imagePullSecrets[0].name=pull",
        "logLevel=debug",
        "networkPolicies.enabled=false",
        "webhook.podDisruptionBudget.minAvailable=50%",
    ])?;
    let webhook = container(&objects, "trainwire-webhook")?;
    assert_eq!(
        webhook["image"],
        "registry.example.com/ml/trainwire-webhook:0.2.1"
    );
    let flags = args(webhook);
    assert!(
        flags.contains(
            &format!("--sidecar-image=registry.example.com/ml/trainwire-sidecar@{digest}").as_str()
        ),
        "{flags:?}"
    );
    assert!(
        flags.contains(&"--cluster-domain=corp.internal"),
        "{flags:?}"
    );
    assert_eq!(webhook["resources"]["limits"]["memory"], "512Mi");
    assert_eq!(
        webhook["resources"]["requests"]["memory"], "64Mi",
        "the rest of the defaults stay"
    );
    assert_eq!(webhook["env"][0]["value"], "debug");
    let spec = &find(&objects, "Deployment", "trainwire-webhook")?["spec"];
    assert_eq!(spec["replicas"], 3);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["pool"], "system");
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "pull");
    assert!(pod.get("priorityClassName").is_none(), "{pod}");
    assert!(
        pod["affinity"]["podAntiAffinity"].is_object(),
        "the default anti-affinity stays"
    );
    // No priority class: no quota for it.
    assert!(objects.iter().all(|o| o["kind"] != "ResourceQuota"));
    assert!(objects.iter().all(|o| o["kind"] != "NetworkPolicy"));
    assert_eq!(
        find(&objects, "PodDisruptionBudget", "trainwire-webhook")?["spec"]["minAvailable"],
        "50%"
    );

    let controllers = container(&objects, "trainwire-controllers")?;
    assert_eq!(
        controllers["image"],
        "registry.example.com/ml/trainwire-webhook:0.2.1"
    );
    assert_eq!(args(controllers).last(), Some(&"--log-format=text"));
    let pod = find(&objects, "Deployment", "trainwire-controllers")?;
    assert!(
        pod.pointer("/spec/template/spec/affinity").is_none(),
        "{pod}"
    );

    // The serving certificate names the cluster's domain.
    let secret = find(&objects, "Secret", TLS_SECRET)?;
    let crt = base64::engine::general_purpose::STANDARD
        .decode(b64(&secret["data"]["tls.crt"]).context("tls.crt")?)?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&crt)?;
    let cert = pem.parse_x509()?;
    let names: Vec<String> = cert
        .subject_alternative_name()?
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(name) => Some(name.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        names.contains(&"trainwire-webhook.trainwire-system.svc.corp.internal".to_string()),
        "{names:?}"
    );

    // A digest pins the image; the tag is not used.
    let pinned = helm_template(&[&format!("image.digest={digest}")])?;
    assert_eq!(
        container(&pinned, "trainwire-webhook")?["image"],
        format!("ghcr.io/trainwire/trainwire-webhook@{digest}")
    );
    Ok(())
}

#[test]
fn another_namespace_and_an_issuer_of_ones_own() -> Result<()> {
    if !tools("another_namespace_and_an_issuer_of_ones_own") {
        return Ok(());
    }
    let out = run(
        Command::new("helm")
            .args(["template", RELEASE])
            .arg(chart_dir())
            .args(["--namespace", "ml-platform"])
            .args(["--set", "certificates.source=cert-manager"])
            .args([
                "--set",
                "certificates.certManager.issuerRef.kind=ClusterIssuer",
            ])
            .args(["--set", "certificates.certManager.issuerRef.name=corp-ca"]),
        "helm template --namespace ml-platform",
    )?;
    assert!(
        !out.contains("trainwire-system"),
        "the release namespace is used everywhere:\n{out}"
    );
    let objects = objects(&out, "helm template")?;
    let config = find(&objects, "MutatingWebhookConfiguration", "trainwire")?;
    for w in config["webhooks"].as_array().context("webhooks")? {
        assert_eq!(w["clientConfig"]["service"]["namespace"], "ml-platform");
        let excluded = &w["namespaceSelector"]["matchExpressions"][0]["values"];
        assert_eq!(*excluded, serde_json::json!(["kube-system", "ml-platform"]));
    }
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "ml-platform/trainwire-webhook"
    );
    // One's own issuer: only the leaf, no private CA chain.
    let certificates: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Certificate")
        .collect();
    let [leaf] = certificates.as_slice() else {
        bail!("expected only the leaf Certificate, got {certificates:?}");
    };
    assert_eq!(leaf["spec"]["issuerRef"]["kind"], "ClusterIssuer");
    assert_eq!(leaf["spec"]["issuerRef"]["name"], "corp-ca");
    assert!(objects.iter().all(|o| o["kind"] != "Issuer"));
    assert!(
        objects.iter().all(|o| o["kind"] != "Secret"),
        "cert-manager writes the Secret"
    );
    Ok(())
}

#[test]
fn the_chart_certificate_is_served_and_trusted_through_the_ca_bundle() -> Result<()> {
    let webhook = trainwire_tests::webhook_binary();
    let webhook_found = Prerequisite::from_result(webhook.clone());
    if !require_all(
        "the_chart_certificate_is_served_and_trusted_through_the_ca_bundle",
        [Prerequisite::command("helm", &["version"]), webhook_found],
    ) {
        return Ok(());
    }
    let webhook = webhook.map_err(anyhow::Error::msg)?;
    let objects = helm_template(&[])?;
    let secret = find(&objects, "Secret", TLS_SECRET)?;
    let decode = |entry: &str| -> Result<Vec<u8>> {
        let text = b64(&secret["data"][entry]).with_context(|| format!("no {entry}"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(text)?)
    };
    let config = find(&objects, "MutatingWebhookConfiguration", "trainwire")?;
    let bundle = b64(&config["webhooks"][0]["clientConfig"]["caBundle"]).context("caBundle")?;
    let ca = base64::engine::general_purpose::STANDARD.decode(bundle)?;

    let dir = tempfile::tempdir()?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, decode("tls.crt")?)?;
    std::fs::write(&key, decode("tls.key")?)?;
    let (listen, probe) = (free_port(), free_port());
    let tag = Tag::new("helm-chart");
    let log = Log::new("webhook");
    let _server = Proc::spawn(
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
    let serving = log.wait_for(Duration::from_secs(30), |l| {
        l.contains("serving admission reviews")
    });
    ensure!(
        serving.is_some(),
        "the webhook did not start:\n{}",
        log.tail(40)
    );

    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(c?)?;
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let runtime = tokio::runtime::Runtime::new()?;
    let status = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .resolve(SERVICE_HOST, ([127, 0, 0, 1], listen).into())
            .timeout(Duration::from_secs(5))
            .build()?;
        let response = client
            .get(format!("https://{SERVICE_HOST}:{listen}/healthz"))
            .send()
            .await?;
        anyhow::Ok(response.status())
    });
    assert_eq!(
        status.with_context(|| log.tail(40))?,
        200,
        "{}",
        log.tail(40)
    );
    Ok(())
}
