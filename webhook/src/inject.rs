//! `trainwire-webhook inject`: the engine offline, like `istioctl kube-inject`.
//!
//! Reads multi-document YAML (and `v1 List` objects, whose items are injected
//! one by one), injects every StatefulSet/Job annotated
//! `trainwire.dev/inject: "true"`, and prints YAML. Documents it does not
//! change are printed exactly as they were written (comments included).
//! Warnings go to stderr, prefixed with the document's index and kind/name; a
//! refusal prints nothing on stdout and exits non-zero.
//!
//! It is also a KRM function (kustomize `exec` / kpt): when the input is a
//! `config.kubernetes.io/v1 ResourceList`, the answer is the same
//! ResourceList with its items injected and every warning and refusal in
//! `results` (`severity: warning` / `error`; an error exits non-zero).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde_json::{Value, json};
use thiserror::Error;

use crate::mutation::{self, Outcome};
use crate::policy::{self, Policy, PolicyArgs, PolicyError, Profile};

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// Manifest to read (multi-document YAML, a List, or a KRM ResourceList); `-` for stdin.
    #[arg(
        short = 'f',
        long = "filename",
        env = "TRAINWIRE_INJECT_FILE",
        default_value = "-"
    )]
    pub file: PathBuf,
    /// Namespace for documents without `metadata.namespace` (default: `default`, like kubectl).
    #[arg(short = 'n', long = "namespace", env = "TRAINWIRE_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[derive(Debug, Error)]
pub enum InjectError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("document {index}: not valid YAML: {message}")]
    Yaml { index: usize, message: String },
    #[error("{0}")]
    Policy(#[from] PolicyError),
}

/// Everything a rendering needs besides the input.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The policy, with `--sidecar-image` already applied ([`policy::load`]).
    pub policy: Policy,
    /// `--namespace`: for documents without `metadata.namespace`.
    pub namespace: Option<String>,
}

impl Options {
    /// Options from the command line: the policy file (validated) and flags.
    pub fn from_args(
        policy: &PolicyArgs,
        namespace: Option<String>,
    ) -> Result<Options, InjectError> {
        Ok(Options {
            policy: policy::load(policy)?,
            namespace,
        })
    }

    /// The profile that applies to a namespace.
    pub fn profile_for(&self, namespace: &str) -> Profile {
        self.policy.profile_for(namespace).into_owned()
    }
}

/// The result of rendering a manifest.
#[derive(Debug, Default)]
pub struct Rendered {
    /// The YAML to print (meaningless when there are refusals).
    pub output: String,
    /// `document N Kind/name: message` lines.
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
    /// The input was a KRM ResourceList and `output` is the answer to it.
    pub resource_list: bool,
    /// What was added besides the input's documents (the headless Service of
    /// a Job), printed on stderr.
    pub notes: Vec<String>,
}

/// The headless Services the injected Jobs among `objects` need and the
/// input does not have (`inputs`: every object of the input), with a note for
/// each. Offline there is no reconciler to create them, and without one a
/// Job's pods never resolve each other's names: the rendezvous never forms.
fn missing_job_services(
    objects: &[(String, &Value)],
    inputs: &[&Value],
    default_namespace: &str,
) -> Vec<(String, Value)> {
    let namespace_of = |v: &Value| {
        v.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace)
            .to_string()
    };
    let has_service = |name: &str, namespace: &str| {
        inputs.iter().any(|v| {
            v.get("kind").and_then(Value::as_str) == Some("Service")
                && v.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                && namespace_of(v) == namespace
        })
    };
    let mut out: Vec<(String, Value)> = Vec::new();
    for (who, obj) in objects {
        if obj.get("kind").and_then(Value::as_str) != Some("Job")
            || obj.get("apiVersion").and_then(Value::as_str) != Some("batch/v1")
        {
            continue;
        }
        let Ok(job) = serde_json::from_value::<k8s_openapi::api::batch::v1::Job>((*obj).clone())
        else {
            continue;
        };
        let Ok(Some(service)) = crate::reconciler::offline_job_service(&job) else {
            continue;
        };
        let name = service.metadata.name.clone().unwrap_or_default();
        let namespace = namespace_of(obj);
        let emitted = out.iter().any(|(_, s)| {
            s.pointer("/metadata/name").and_then(Value::as_str) == Some(name.as_str())
                && namespace_of(s) == namespace
        });
        if has_service(&name, &namespace) || emitted {
            continue;
        }
        let Ok(value) = serde_json::to_value(&service) else {
            continue;
        };
        out.push((
            format!(
                "{who}: note: added the headless Service {name} its pods' DNS names need (in the cluster the webhook's reconciler creates it, owned by the Job; this one has no owner: delete it with the Job)"
            ),
            value,
        ));
    }
    out
}

/// The dedicated rendezvous stores (Deployment and Service `<name>-rdzv`)
/// the injected workloads among `objects` need and the input does not have,
/// with a note for each: offline there is no reconciler to create them.
fn missing_stores(
    objects: &[(String, &Value)],
    inputs: &[&Value],
    default_namespace: &str,
    opts: &Options,
) -> Vec<(String, Value)> {
    let namespace_of = |v: &Value| {
        v.pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(default_namespace)
            .to_string()
    };
    let present = |kind: &str, name: &str, namespace: &str, out: &[(String, Value)]| {
        inputs
            .iter()
            .copied()
            .chain(out.iter().map(|(_, v)| v))
            .any(|v| {
                v.get("kind").and_then(Value::as_str) == Some(kind)
                    && v.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                    && namespace_of(v) == namespace
            })
    };
    let mut out: Vec<(String, Value)> = Vec::new();
    for (who, obj) in objects {
        let str_at = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind, name) = (
            str_at("/apiVersion"),
            str_at("/kind"),
            str_at("/metadata/name"),
        );
        if !crate::mutation::workload::is_managed_kind(api_version, kind) {
            continue;
        }
        let Some(template) = obj.pointer("/spec/template").and_then(|t| {
            serde_json::from_value::<k8s_openapi::api::core::v1::PodTemplateSpec>(t.clone()).ok()
        }) else {
            continue;
        };
        let Some(status) = crate::mutation::status::read(&template) else {
            continue;
        };
        let namespace = namespace_of(obj);
        let written = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let owner = crate::rdzv_store::Owner {
            api_version,
            kind,
            name,
            namespace: written,
            uid: None,
        };
        let profile = opts.profile_for(&namespace);
        let Some(store) = crate::rdzv_store::desired(&owner, &template, &status, &profile) else {
            continue;
        };
        let store_name = status.rdzv_store.clone();
        let mut added = Vec::new();
        for (object_kind, value) in [
            ("Deployment", serde_json::to_value(&store.deployment)),
            ("Service", serde_json::to_value(&store.service)),
        ] {
            let Ok(mut value) = value else { continue };
            if present(object_kind, &store_name, &namespace, &out) {
                continue;
            }
            if let Some(map) = value.as_object_mut() {
                let api = if object_kind == "Deployment" {
                    "apps/v1"
                } else {
                    "v1"
                };
                map.insert("apiVersion".to_string(), Value::String(api.to_string()));
                map.insert("kind".to_string(), Value::String(object_kind.to_string()));
            }
            added.push(object_kind);
            out.push((String::new(), value));
        }
        if !added.is_empty() {
            let note = format!(
                "{who}: note: added the dedicated rendezvous store {store_name} ({}; in the cluster the webhook's reconciler creates it, owned by the {kind}; these have no owner: delete them with it)",
                added.join(" and ")
            );
            // The note goes with the first object added for this workload.
            let first = out.len() - added.len();
            out[first].0 = note;
        }
    }
    out
}

/// One object's outcome.
enum Injected {
    Unchanged,
    Changed(Value),
}

fn label(obj: &Value) -> String {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    format!("{}/{}", s("/kind"), s("/metadata/name"))
}

fn inject_object(
    obj: &Value,
    opts: &Options,
    prefix: &str,
    warnings: &mut Vec<(String, Value)>,
    refusals: &mut Vec<(String, Value)>,
) -> Injected {
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| opts.namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let profile = opts.profile_for(&namespace);
    let who = format!("{prefix} {}", label(obj));
    match mutation::mutate(obj, Some(&namespace), &profile) {
        Ok(Outcome::NotManaged) => Injected::Unchanged,
        Ok(Outcome::Mutated(m)) => {
            // Each result names its object by reference, not by a copy.
            let reference = resource_ref(obj);
            for w in m.warnings {
                warnings.push((format!("{who}: warning: {w}"), reference.clone()));
            }
            if m.patch.0.is_empty() {
                Injected::Unchanged
            } else {
                Injected::Changed(m.object)
            }
        }
        Err(refusal) => {
            refusals.push((format!("{who}: refused: {refusal}"), resource_ref(obj)));
            Injected::Unchanged
        }
    }
}

/// Inject a List's items; `Some` with the new List when any item changed.
fn inject_list(
    list: &Value,
    opts: &Options,
    prefix: &str,
    warnings: &mut Vec<(String, Value)>,
    refusals: &mut Vec<(String, Value)>,
) -> Option<Value> {
    let items = list.get("items")?.as_array()?;
    let mut changed = false;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = format!("{prefix} item {}", i + 1);
        match inject_object(item, opts, &p, warnings, refusals) {
            Injected::Unchanged => out.push(item.clone()),
            Injected::Changed(v) => {
                changed = true;
                out.push(v);
            }
        }
    }
    changed.then(|| {
        let mut list = list.clone();
        list["items"] = Value::Array(out);
        list
    })
}

fn is_list(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some("List")
        && v.get("items").is_some_and(Value::is_array)
}

/// Whether `v` is a KRM function's input.
pub fn is_resource_list(v: &Value) -> bool {
    v.get("kind").and_then(Value::as_str) == Some("ResourceList")
        && v.get("apiVersion")
            .and_then(Value::as_str)
            .is_some_and(|a| a.starts_with("config.kubernetes.io/"))
}

/// Split multi-document YAML on `---` lines (a `---` at column 0 is always a
/// document marker), keeping each document's text.
fn split_documents(input: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in input.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t") || bare == "..." {
            docs.push(std::mem::take(&mut current));
            if let Some(rest) = bare.strip_prefix("---") {
                let rest = rest.trim_start();
                if !rest.is_empty() {
                    current.push_str(rest);
                    current.push('\n');
                }
            }
            continue;
        }
        current.push_str(line);
    }
    docs.push(current);
    docs
}

fn to_yaml(v: &Value) -> String {
    let mut s = serde_saphyr::to_string(v).unwrap_or_default();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// Render a multi-document manifest (or a ResourceList, see [`render_resource_list`]).
pub fn render(input: &str, opts: &Options) -> Result<Rendered, InjectError> {
    let mut parsed: Vec<(String, Value)> = Vec::new();
    for (i, text) in split_documents(input).into_iter().enumerate() {
        let value: Value = serde_saphyr::from_str(&text).map_err(|e| InjectError::Yaml {
            index: i + 1,
            message: e.to_string(),
        })?;
        if !value.is_null() {
            parsed.push((text, value));
        }
    }
    if let [(_, single)] = parsed.as_slice()
        && is_resource_list(single)
    {
        // Only this run's own messages count: `results` that came with
        // the input (an earlier function's) are passed on, not re-judged.
        let answer = render_resource_list(single, opts);
        return Ok(Rendered {
            output: to_yaml(&answer.list),
            resource_list: true,
            warnings: answer.warnings,
            refusals: answer.refusals,
            notes: answer.notes,
        });
    }
    let mut warnings = Vec::new();
    let mut refusals = Vec::new();
    let mut out: Vec<String> = Vec::new();
    let mut results: Vec<(String, Value)> = Vec::new();
    for (i, (text, value)) in parsed.iter().enumerate() {
        let prefix = format!("document {}", i + 1);
        let changed = if is_list(value) {
            inject_list(value, opts, &prefix, &mut warnings, &mut refusals)
        } else {
            match inject_object(value, opts, &prefix, &mut warnings, &mut refusals) {
                Injected::Unchanged => None,
                Injected::Changed(v) => Some(v),
            }
        };
        out.push(match &changed {
            Some(v) => to_yaml(v),
            None => {
                let mut t = text.trim_end().to_string();
                t.push('\n');
                t
            }
        });
        results.push((prefix, changed.unwrap_or_else(|| value.clone())));
    }
    let objects = flatten(&results);
    let inputs: Vec<&Value> = parsed.iter().flat_map(|(_, v)| items_of(v)).collect();
    let default_namespace = opts.namespace.as_deref().unwrap_or("default");
    let mut notes = Vec::new();
    for (note, service) in missing_job_services(&objects, &inputs, default_namespace)
        .into_iter()
        .chain(missing_stores(&objects, &inputs, default_namespace, opts))
    {
        out.push(to_yaml(&service));
        if !note.is_empty() {
            notes.push(note);
        }
    }
    Ok(Rendered {
        output: out.join("---\n"),
        warnings: warnings.into_iter().map(|(m, _)| m).collect(),
        refusals: refusals.into_iter().map(|(m, _)| m).collect(),
        resource_list: false,
        notes,
    })
}

/// A document's objects: itself, or a List's items.
fn items_of(v: &Value) -> Vec<&Value> {
    if is_list(v) {
        v.get("items")
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    } else {
        vec![v]
    }
}

/// Every object of the rendered documents, with its `document N Kind/name`.
fn flatten(results: &[(String, Value)]) -> Vec<(String, &Value)> {
    results
        .iter()
        .flat_map(|(prefix, v)| {
            items_of(v)
                .into_iter()
                .map(move |o| (format!("{prefix} {}", label(o)), o))
        })
        .collect()
}

fn resource_ref(obj: &Value) -> Value {
    let mut r = serde_json::Map::new();
    for (key, pointer) in [
        ("apiVersion", "/apiVersion"),
        ("kind", "/kind"),
        ("name", "/metadata/name"),
        ("namespace", "/metadata/namespace"),
    ] {
        if let Some(v) = obj.pointer(pointer).and_then(Value::as_str) {
            r.insert(key.to_string(), Value::String(v.to_string()));
        }
    }
    Value::Object(r)
}

/// The answer to a KRM ResourceList, and what this run said about it.
#[derive(Debug)]
pub struct ListAnswer {
    /// The ResourceList to print: items injected, the input's `results`
    /// followed by this run's.
    pub list: Value,
    /// This run's refusals (`severity: error`), warnings and notes; the
    /// input's own `results` are not among them.
    pub refusals: Vec<String>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

/// Answer a KRM ResourceList: its items injected, warnings and refusals
/// appended to `results`.
pub fn render_resource_list(list: &Value, opts: &Options) -> ListAnswer {
    let mut warnings = Vec::new();
    let mut refusals = Vec::new();
    let items = list
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let prefix = format!("item {}", i + 1);
        let changed = if is_list(item) {
            inject_list(item, opts, &prefix, &mut warnings, &mut refusals)
        } else {
            match inject_object(item, opts, &prefix, &mut warnings, &mut refusals) {
                Injected::Unchanged => None,
                Injected::Changed(v) => Some(v),
            }
        };
        out.push(changed.unwrap_or_else(|| item.clone()));
    }
    let notes = {
        let rendered: Vec<(String, Value)> = out
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("item {}", i + 1), v.clone()))
            .collect();
        let objects = flatten(&rendered);
        let inputs: Vec<&Value> = items.iter().flat_map(items_of).collect();
        let default_namespace = opts.namespace.as_deref().unwrap_or("default");
        let mut notes = missing_job_services(&objects, &inputs, default_namespace);
        notes.extend(missing_stores(&objects, &inputs, default_namespace, opts));
        notes
    };
    let mut infos = Vec::new();
    for (note, service) in notes {
        if !note.is_empty() {
            infos.push((note, resource_ref(&service)));
        }
        out.push(service);
    }
    let mut results: Vec<Value> = list
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut said = [Vec::new(), Vec::new(), Vec::new()];
    for ((severity, entries), texts) in
        [("error", refusals), ("warning", warnings), ("info", infos)]
            .into_iter()
            .zip(said.iter_mut())
    {
        for (message, reference) in entries {
            results.push(json!({
                "message": message,
                "severity": severity,
                "resourceRef": reference,
            }));
            texts.push(message);
        }
    }
    let mut answer = list.clone();
    answer["items"] = Value::Array(out);
    if !results.is_empty() {
        answer["results"] = Value::Array(results);
    }
    let [refusals, warnings, notes] = said;
    ListAnswer {
        list: answer,
        refusals,
        warnings,
        notes,
    }
}

fn read_input(file: &std::path::Path) -> Result<String, InjectError> {
    let name = file.display().to_string();
    let mut text = String::new();
    if name == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|source| InjectError::Read {
                path: "stdin".to_string(),
                source,
            })?;
    } else {
        text = std::fs::read_to_string(file)
            .map_err(|source| InjectError::Read { path: name, source })?;
    }
    Ok(text)
}

/// Print a rendering: YAML on stdout unless refused (a ResourceList answer
/// is printed even then, as KRM functions do), messages on stderr.
fn emit(rendered: &Rendered) -> anyhow::Result<()> {
    let mut err = std::io::stderr().lock();
    for w in rendered.warnings.iter().chain(&rendered.notes) {
        writeln!(err, "{w}")?;
    }
    for r in &rendered.refusals {
        writeln!(err, "{r}")?;
    }
    if rendered.refusals.is_empty() || rendered.resource_list {
        std::io::stdout()
            .lock()
            .write_all(rendered.output.as_bytes())?;
    }
    if !rendered.refusals.is_empty() {
        anyhow::bail!(
            "{} workload(s) refused; nothing was rendered",
            rendered.refusals.len()
        );
    }
    Ok(())
}

pub fn run(args: InjectArgs) -> anyhow::Result<()> {
    if args.file.as_os_str() == "-" && std::io::stdin().is_terminal() {
        anyhow::bail!(
            "inject: reading the manifest from a terminal; give -f FILE or pipe the manifest in"
        );
    }
    let opts = Options::from_args(&args.policy, args.namespace)?;
    let input = read_input(&args.file)?;
    let rendered = render(&input, &opts)?;
    emit(&rendered)
}

/// Run as a KRM function (no subcommand, stdin not a terminal): read a
/// ResourceList (or any manifest) from stdin with the env-configured policy.
pub fn run_function() -> anyhow::Result<()> {
    let policy = PolicyArgs {
        policy: std::env::var_os("TRAINWIRE_POLICY").map(PathBuf::from),
        sidecar_image: std::env::var("TRAINWIRE_SIDECAR_IMAGE").ok(),
        cluster_domain: std::env::var("TRAINWIRE_CLUSTER_DOMAIN").ok(),
    };
    run(InjectArgs {
        file: PathBuf::from("-"),
        namespace: std::env::var("TRAINWIRE_NAMESPACE").ok(),
        policy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_text_and_handles_markers() {
        let docs = split_documents("a: 1\n---\n# c\nb: 2\n--- {c: 3}\n...\n");
        assert_eq!(docs, vec!["a: 1\n", "# c\nb: 2\n", "{c: 3}\n", ""]);
    }
}
