//! `trainwire-webhook inject`: the engine offline, like `istioctl kube-inject`.
//!
//! Reads multi-document YAML (and `v1 List` objects, whose items are injected
//! one by one), injects every StatefulSet/Job annotated
//! `trainwire.dev/inject: "true"`, and prints YAML. Documents it does not
//! change are printed exactly as they were written (comments included).
//! Diagnostics go to stderr, one line each, `FILE:LINE: Kind/name: warning:
//! ...` (the line of the document, or of the annotation a message is about);
//! with `-o json`, one JSON document instead ([`Report`]). A refusal prints
//! nothing on stdout and exits non-zero.
//!
//! It is also a KRM function (kustomize `exec` / kpt): when the input is a
//! `config.kubernetes.io/v1 ResourceList`, the answer is the same
//! ResourceList with its items injected and every warning and refusal in
//! `results` (`severity: warning` / `error`; an error exits non-zero).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use serde_json::{Value, json};
use thiserror::Error;

use crate::output::{Exit, Format};

mod command;
mod companions;
pub use command::{run, run_function};
use companions::{missing_job_services, missing_stores};
use trainwire_engine::mutation::{self, Outcome, Refusal};
use trainwire_engine::policy::{Policy, PolicyError, Profile};
use trainwire_policyfile::PolicyArgs;

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
    /// Diagnostics as `text` (one line each on stderr) or `json` (one JSON
    /// document on stderr); the rendered YAML stays on stdout.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub output: Format,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// The largest manifest `inject` reads.
pub const MAX_INPUT_BYTES: u64 = 64 * 1024 * 1024;

/// Why nothing could be rendered. Each message is complete: it names the
/// file (and line and column) itself and carries no `source` that a
/// printer of causes would repeat.
#[derive(Debug, Error)]
pub enum InjectError {
    #[error("{path}: cannot read it: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: larger than {MAX_INPUT_BYTES} bytes; split the manifest")]
    TooLarge { path: String },
    #[error("{}: not valid YAML: {message}", location(file, *line, *column))]
    Yaml {
        file: String,
        line: Option<u64>,
        column: Option<u64>,
        message: String,
    },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("inject: reading the manifest from a terminal; give -f FILE or pipe the manifest in")]
    Terminal,
}

fn location(file: &str, line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{file}:{l}:{c}"),
        (Some(l), None) => format!("{file}:{l}"),
        _ => file.to_string(),
    }
}

impl InjectError {
    /// The error as diagnostics (a policy file may have several errors).
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        let error = |file: Option<String>, line, column, message: String| Diagnostic {
            severity: Severity::Error,
            file,
            line,
            column,
            object: None,
            who: String::new(),
            message,
        };
        match self {
            InjectError::Read { path, error: e } => vec![error(
                Some(path.clone()),
                None,
                None,
                format!("cannot read it: {e}"),
            )],
            InjectError::TooLarge { path } => {
                let text = self.to_string();
                let message = text
                    .strip_prefix(&format!("{path}: "))
                    .unwrap_or(&text)
                    .to_string();
                vec![error(Some(path.clone()), None, None, message)]
            }
            InjectError::Yaml {
                file,
                line,
                column,
                message,
            } => vec![error(
                Some(file.clone()),
                *line,
                *column,
                format!("not valid YAML: {message}"),
            )],
            InjectError::Policy(PolicyError::Invalid(diagnostics)) => diagnostics
                .iter()
                .map(|d| {
                    error(
                        Some(d.file.clone()),
                        d.line,
                        d.column,
                        format!("{}: {}", d.path, d.message),
                    )
                })
                .collect(),
            InjectError::Policy(PolicyError::Read { path, error: e }) => vec![error(
                Some(path.clone()),
                None,
                None,
                format!("cannot read the policy file: {e}"),
            )],
            InjectError::Policy(other) => vec![error(None, None, None, other.to_string())],
            InjectError::Terminal => vec![error(None, None, None, self.to_string())],
        }
    }
}

/// How bad a diagnostic is (the KRM `results` severities).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A refusal, or what kept the manifest from being read.
    Error,
    Warning,
    /// Something added (a Job's headless Service).
    Info,
}

/// One message about the input.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    pub severity: Severity,
    /// The manifest (`<stdin>` for `-`); absent in a KRM function's answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// 1-based: the line of the document, or of the annotation the message
    /// is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u64>,
    /// The object: `apiVersion`, `kind`, `name`, `namespace` as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// `Kind/name`, `item 2 Kind/name` in a List.
    #[serde(skip)]
    pub who: String,
    pub message: String,
}

/// `FILE:LINE: Kind/name: warning: message` about an object;
/// `error: FILE:LINE:COLUMN: message` about the input as a whole.
impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match (self.severity, self.who.is_empty()) {
            (Severity::Error, false) => "refused",
            (Severity::Error, true) => "error",
            (Severity::Warning, _) => "warning",
            (Severity::Info, _) => "note",
        };
        let at = self
            .file
            .as_deref()
            .map(|file| location(file, self.line, self.column));
        if self.who.is_empty() {
            f.write_str(word)?;
            f.write_str(": ")?;
            if let Some(at) = at {
                write!(f, "{at}: ")?;
            }
            return f.write_str(&self.message);
        }
        if let Some(at) = at {
            write!(f, "{at}: ")?;
        }
        write!(f, "{}: {word}: {}", self.who, self.message)
    }
}

/// The `-o json` document on stderr.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    /// Whether the rendered YAML was printed on stdout.
    pub rendered: bool,
    pub diagnostics: &'a [Diagnostic],
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
            policy: trainwire_policyfile::load(policy)?,
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
    /// Every message, in order: warnings, notes, refusals.
    pub diagnostics: Vec<Diagnostic>,
    /// The same as text lines, by severity.
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
    /// The input was a KRM ResourceList and `output` is the answer to it.
    pub resource_list: bool,
    /// What was added besides the input's documents (the headless Service of
    /// a Job), printed on stderr.
    pub notes: Vec<String>,
}

impl Rendered {
    fn new(output: String, resource_list: bool, diagnostics: Vec<Diagnostic>) -> Rendered {
        let text = |s: Severity| {
            diagnostics
                .iter()
                .filter(|d| d.severity == s)
                .map(ToString::to_string)
                .collect()
        };
        Rendered {
            output,
            warnings: text(Severity::Warning),
            refusals: text(Severity::Error),
            notes: text(Severity::Info),
            resource_list,
            diagnostics,
        }
    }
}

/// Where an object is: the file and the line of its document (none in a
/// KRM function's answer), and `item N ` when it is in a List.
#[derive(Clone, Debug, Default)]
struct Place {
    file: Option<String>,
    line: Option<u64>,
    /// The document's text (not for a List's items): where an annotation a
    /// message names is looked up.
    text: Option<std::sync::Arc<str>>,
    /// `item 2 `, `item 1 item 3 `.
    prefix: String,
}

impl Place {
    fn within(&self, item: usize) -> Place {
        Place {
            file: self.file.clone(),
            line: self.line,
            text: None,
            prefix: format!("{}item {item} ", self.prefix),
        }
    }

    fn diagnostic(&self, severity: Severity, obj: &Value, message: String) -> Diagnostic {
        Diagnostic {
            severity,
            file: self.file.clone(),
            line: self.line,
            column: None,
            object: Some(resource_ref(obj)),
            who: format!("{}{}", self.prefix, label(obj)),
            message,
        }
    }

    /// A diagnostic about annotation `key`: on the annotation's own line
    /// when it is found in the document's text.
    fn about_annotation(
        &self,
        severity: Severity,
        obj: &Value,
        key: &str,
        message: String,
    ) -> Diagnostic {
        let mut d = self.diagnostic(severity, obj, message);
        if let (Some(text), Some(line)) = (&self.text, self.line)
            && let Some((offset, _)) = annotation_line(text, key)
        {
            d.line = Some(line + offset);
        }
        d
    }
}

/// The 0-based line of `key:` in `text` (a document), and the value as
/// written after it (comment dropped).
fn annotation_line(text: &str, key: &str) -> Option<(u64, String)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let t = line.trim_start();
        let rest = [key.to_string(), format!("\"{key}\""), format!("'{key}'")]
            .iter()
            .find_map(|k| t.strip_prefix(k.as_str()))?
            .trim_start()
            .strip_prefix(':')?;
        let value = match rest.find(" #") {
            Some(i) => &rest[..i],
            None => rest,
        };
        Some((i as u64, value.trim().to_string()))
    })
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
    place: &Place,
    diagnostics: &mut Vec<Diagnostic>,
) -> Injected {
    let namespace = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or_else(|| opts.namespace.clone())
        .unwrap_or_else(|| "default".to_string());
    let profile = opts.profile_for(&namespace);
    match mutation::mutate(obj, Some(&namespace), &profile) {
        Ok(Outcome::NotManaged) => {
            for w in mutation::not_managed_warnings(obj) {
                let key = w
                    .strip_prefix("unknown annotation ")
                    .and_then(|rest| rest.split(':').next())
                    .map(str::to_string);
                diagnostics.push(match key {
                    Some(key) => place.about_annotation(Severity::Warning, obj, &key, w),
                    None => place.diagnostic(Severity::Warning, obj, w),
                });
            }
            Injected::Unchanged
        }
        Ok(Outcome::Mutated(m)) => {
            for w in m.warnings {
                // `unknown annotation trainwire.dev/nnode is ignored; ...`:
                // on the annotation's line.
                let key = w
                    .strip_prefix("unknown annotation ")
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(str::to_string);
                diagnostics.push(match key {
                    Some(key) => place.about_annotation(Severity::Warning, obj, &key, w),
                    None => place.diagnostic(Severity::Warning, obj, w),
                });
            }
            if m.patch.0.is_empty() {
                Injected::Unchanged
            } else {
                Injected::Changed(m.object)
            }
        }
        Err(refusal) => {
            diagnostics.push(refused(obj, place, refusal));
            Injected::Unchanged
        }
    }
}

/// A refusal as a diagnostic: one about an annotation on the annotation's
/// line, with a non-string value shown as it is written in the file.
fn refused(obj: &Value, place: &Place, refusal: Refusal) -> Diagnostic {
    let refusal = match refusal {
        Refusal::NotAString { annotation, .. } => {
            let value = obj
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(&annotation))
                .cloned()
                .unwrap_or(Value::Null);
            let written = place
                .text
                .as_deref()
                .and_then(|t| annotation_line(t, &annotation))
                .map(|(_, w)| w)
                .unwrap_or_else(|| mutation::annotations::yaml_text(&value));
            mutation::annotations::not_a_string(&annotation, &value, &written)
        }
        other => other,
    };
    match &refusal {
        Refusal::NotAString { annotation, .. } | Refusal::Annotation { annotation, .. } => {
            let key = annotation.clone();
            place.about_annotation(Severity::Error, obj, &key, refusal.to_string())
        }
        _ => place.diagnostic(Severity::Error, obj, refusal.to_string()),
    }
}

/// Inject a List's items; `Some` with the new List when any item changed.
fn inject_list(
    list: &Value,
    opts: &Options,
    place: &Place,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Value> {
    let items = list.get("items")?.as_array()?;
    let mut changed = false;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match inject_object(item, opts, &place.within(i + 1), diagnostics) {
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
/// document marker), keeping each document's text and the 1-based line of
/// the file it starts on.
fn split_documents(input: &str) -> Vec<(u64, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1u64;
    for (i, line) in input.split_inclusive('\n').enumerate() {
        let n = i as u64 + 1;
        let bare = line.trim_end_matches(['\n', '\r']);
        if bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t") || bare == "..." {
            docs.push((start, std::mem::take(&mut current)));
            start = n + 1;
            if let Some(rest) = bare.strip_prefix("---") {
                let rest = rest.trim_start();
                if !rest.is_empty() {
                    current.push_str(rest);
                    current.push('\n');
                    start = n;
                }
            }
            continue;
        }
        current.push_str(line);
    }
    docs.push((start, current));
    docs
}

fn to_yaml(v: &Value) -> String {
    let mut s = serde_saphyr::to_string(v).unwrap_or_default();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// Render a multi-document manifest (or a ResourceList, see
/// [`render_resource_list`]); messages name it `<input>`.
pub fn render(input: &str, opts: &Options) -> Result<Rendered, InjectError> {
    render_file(input, "<input>", opts)
}

/// Render the manifest `input` read from `file` (the name messages give).
pub fn render_file(input: &str, file: &str, opts: &Options) -> Result<Rendered, InjectError> {
    let mut parsed: Vec<(u64, String, Value)> = Vec::new();
    for (start, text) in split_documents(input) {
        let value: Value = serde_saphyr::from_str(&text).map_err(|e| {
            let at = trainwire_engine::yaml_error::describe(&e, &text);
            InjectError::Yaml {
                file: file.to_string(),
                line: at.line.map(|l| l + start - 1).or(Some(start)),
                column: at.column,
                message: at.message,
            }
        })?;
        if !value.is_null() {
            parsed.push((start, text, value));
        }
    }
    if let [(_, _, single)] = parsed.as_slice()
        && is_resource_list(single)
    {
        // Only this run's own messages count: `results` that came with
        // the input (an earlier function's) are passed on, not re-judged.
        let answer = render_resource_list(single, opts);
        return Ok(Rendered::new(
            to_yaml(&answer.list),
            true,
            answer.diagnostics,
        ));
    }
    let mut diagnostics = Vec::new();
    let mut out: Vec<String> = Vec::new();
    let mut results: Vec<(Place, Value)> = Vec::new();
    for (start, text, value) in &parsed {
        let place = Place {
            file: Some(file.to_string()),
            line: Some(*start),
            text: Some(text.as_str().into()),
            prefix: String::new(),
        };
        let changed = if is_list(value) {
            inject_list(value, opts, &place, &mut diagnostics)
        } else {
            match inject_object(value, opts, &place, &mut diagnostics) {
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
        results.push((place, changed.unwrap_or_else(|| value.clone())));
    }
    let objects = flatten(&results);
    let inputs: Vec<&Value> = parsed.iter().flat_map(|(_, _, v)| items_of(v)).collect();
    let default_namespace = opts.namespace.as_deref().unwrap_or("default");
    let mut notes = Vec::new();
    for (note, added) in missing_job_services(&objects, &inputs, default_namespace)
        .into_iter()
        .chain(missing_stores(&objects, &inputs, default_namespace, opts))
    {
        out.push(to_yaml(&added));
        notes.extend(note);
    }
    // Warnings, then notes, then refusals (the last lines are the reason
    // nothing was rendered).
    let (refusals, warnings): (Vec<_>, Vec<_>) = diagnostics
        .into_iter()
        .partition(|d| d.severity == Severity::Error);
    let diagnostics = warnings.into_iter().chain(notes).chain(refusals).collect();
    Ok(Rendered::new(out.join("---\n"), false, diagnostics))
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

/// Every object of the rendered documents, with its place.
fn flatten(results: &[(Place, Value)]) -> Vec<(Place, &Value)> {
    results
        .iter()
        .flat_map(|(place, v)| {
            let list = is_list(v);
            items_of(v).into_iter().enumerate().map(move |(i, o)| {
                let place = if list {
                    place.within(i + 1)
                } else {
                    place.clone()
                };
                (place, o)
            })
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
    /// This run's refusals (`severity: error`), warnings and notes, in
    /// that order; the input's own `results` are not among them.
    pub diagnostics: Vec<Diagnostic>,
}

/// Answer a KRM ResourceList: its items injected, warnings and refusals
/// appended to `results`.
pub fn render_resource_list(list: &Value, opts: &Options) -> ListAnswer {
    let mut diagnostics = Vec::new();
    let items = list
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let place = Place::default().within(i + 1);
        let changed = if is_list(item) {
            inject_list(item, opts, &place, &mut diagnostics)
        } else {
            match inject_object(item, opts, &place, &mut diagnostics) {
                Injected::Unchanged => None,
                Injected::Changed(v) => Some(v),
            }
        };
        out.push(changed.unwrap_or_else(|| item.clone()));
    }
    let rendered: Vec<(Place, Value)> = out
        .iter()
        .enumerate()
        .map(|(i, v)| (Place::default().within(i + 1), v.clone()))
        .collect();
    let objects = flatten(&rendered);
    let inputs: Vec<&Value> = items.iter().flat_map(items_of).collect();
    let default_namespace = opts.namespace.as_deref().unwrap_or("default");
    let mut added = missing_job_services(&objects, &inputs, default_namespace);
    added.extend(missing_stores(&objects, &inputs, default_namespace, opts));
    let mut notes = Vec::new();
    for (note, object) in added {
        notes.extend(note);
        out.push(object);
    }
    let mut results: Vec<Value> = list
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (refusals, warnings): (Vec<_>, Vec<_>) = diagnostics
        .into_iter()
        .partition(|d| d.severity == Severity::Error);
    let diagnostics: Vec<Diagnostic> = refusals.into_iter().chain(warnings).chain(notes).collect();
    for d in &diagnostics {
        results.push(json!({
            "message": d.to_string(),
            "severity": d.severity,
            "resourceRef": d.object,
        }));
    }
    let mut answer = list.clone();
    answer["items"] = Value::Array(out);
    if !results.is_empty() {
        answer["results"] = Value::Array(results);
    }
    ListAnswer {
        list: answer,
        diagnostics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_text_lines_and_handles_markers() {
        let docs = split_documents("a: 1\n---\n# c\nb: 2\n--- {c: 3}\n...\n");
        assert_eq!(
            docs,
            vec![
                (1, "a: 1\n".to_string()),
                (3, "# c\nb: 2\n".to_string()),
                (5, "{c: 3}\n".to_string()),
                (7, String::new())
            ]
        );
    }

    #[test]
    fn annotation_lines_are_found_with_the_value_as_written() {
        let text = "metadata:\n  annotations:\n    trainwire.dev/inject: true  # opt in\n    \"trainwire.dev/nnodes\": 2.50\n";
        assert_eq!(
            annotation_line(text, "trainwire.dev/inject"),
            Some((2, "true".to_string()))
        );
        assert_eq!(
            annotation_line(text, "trainwire.dev/nnodes"),
            Some((3, "2.50".to_string()))
        );
        assert_eq!(annotation_line(text, "trainwire.dev/container"), None);
    }
}
