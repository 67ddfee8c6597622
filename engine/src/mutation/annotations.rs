//! The `trainwire.dev/*` annotations on the workload: parsing and validation.
//!
//! Every bad value is a [`Refusal::Annotation`] naming the annotation, the
//! value and the accepted forms. An unknown `trainwire.dev/*` name is a
//! warning suggesting the nearest known one.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use super::injection::Refusal;
use trainwire_contract::{
    Framework, Grammar, Invalid, MountPath, NodeCount, PeerLossAction, Port, PositiveCount,
    PositiveDuration, RdzvBackend, RdzvHandler, RdzvStore, ShmSize, SpareCount,
};

pub use trainwire_contract::annotations::*;

pub const DEFAULT_RDZV_PORT: u16 = 29500;
pub const DEFAULT_MAX_RESTARTS: u32 = 3;

/// The world size: fixed, or an elastic range (the contract's grammar).
pub type Nnodes = NodeCount;

/// torchrun's `--nproc-per-node`: a count or one of its keywords.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nproc {
    Count(u32),
    Keyword(String),
}

impl fmt::Display for Nproc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Nproc::Count(n) => write!(f, "{n}"),
            Nproc::Keyword(k) => f.write_str(k),
        }
    }
}

/// One entry of `trainwire.dev/volumes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedVolume {
    pub claim: String,
    pub path: String,
    pub read_only: bool,
}

/// The parsed annotations. `None` means "not annotated": the policy or the
/// built-in default applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Annotations {
    pub container: Option<String>,
    pub nnodes: Option<Nnodes>,
    pub nproc_per_node: Option<Nproc>,
    pub gpus_per_node: Option<u32>,
    pub rdzv_backend: Option<RdzvBackend>,
    pub rdzv_port: u16,
    pub rdzv_store: Option<RdzvStore>,
    pub rdzv_handler: Option<RdzvHandler>,
    pub spares: Option<SpareCount>,
    pub max_restarts: u32,
    pub checkpoint_pvc: Option<String>,
    pub checkpoint_path: Option<MountPath>,
    pub checkpoint_max_age: Option<PositiveDuration>,
    pub volumes: Vec<SharedVolume>,
    pub nccl: Vec<(String, String)>,
    pub shm_size: Option<ShmSize>,
    pub sidecar: Option<bool>,
    pub on_peer_loss: Option<PeerLossAction>,
    pub stall_timeout: Option<trainwire_contract::StallTimeout>,
    pub on_stall: Option<trainwire_contract::StallAction>,
    pub loss_window: Option<trainwire_contract::LossWindow>,
    pub framework: Option<Framework>,
    /// Read by the controller, checked here so a bad value is refused.
    pub fail_fast_exit_codes: Option<trainwire_contract::ExitCodes>,
    pub max_failures: Option<trainwire_contract::FailureLimit>,
    /// Unknown `trainwire.dev/*` names, with a suggestion.
    pub warnings: Vec<String>,
}

/// Whether the workload opted in: `Ok(true)` for `"true"`, `Ok(false)` when
/// absent or `"false"`, a refusal for anything else.
pub fn opted_in(annotations: Option<&serde_json::Map<String, Value>>) -> Result<bool, Refusal> {
    match annotations.and_then(|a| a.get(INJECT)) {
        None => Ok(false),
        Some(Value::String(s)) if s == "true" => Ok(true),
        Some(Value::String(s)) if s == "false" => Ok(false),
        Some(Value::String(s)) => Err(bad(
            INJECT,
            s,
            "not a boolean string",
            "\"true\" or \"false\" (quoted in YAML)",
        )),
        Some(other) => Err(not_a_string(INJECT, other, &yaml_text(other))),
    }
}

/// A non-string value as YAML shows it (`true`, `2`, `null`).
pub fn yaml_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(_) | Value::Object(_) => serde_saphyr::to_string(v)
            .map(|t| t.trim_end().replace('\n', " "))
            .unwrap_or_else(|_| v.to_string()),
        other => other.to_string(),
    }
}

/// The refusal of a YAML value that is not a string: it shows `written`
/// (the value as the user wrote it, when known; else [`yaml_text`]) and
/// the quoting that makes it one. Only YAML can say this: the apiserver
/// rejects such an object before admission.
pub fn not_a_string(annotation: &str, value: &Value, written: &str) -> Refusal {
    let shown = shown(written);
    let (what, fix) = match value {
        Value::Bool(_) => ("a YAML boolean", format!("write \"{shown}\" in quotes")),
        Value::Number(_) => ("a YAML number", format!("write \"{shown}\" in quotes")),
        Value::Null => ("empty (YAML null)", "write the value in quotes".to_string()),
        Value::Array(_) => (
            "a YAML list",
            "write one quoted string (lists are comma-separated)".to_string(),
        ),
        Value::Object(_) | Value::String(_) => {
            ("a YAML mapping", "write one quoted string".to_string())
        }
    };
    Refusal::NotAString {
        annotation: annotation.to_string(),
        written: if written.is_empty() {
            "(nothing)".to_string()
        } else {
            shown
        },
        what: what.to_string(),
        fix,
    }
}

fn bad(annotation: &str, value: &str, reason: &str, accepted: &str) -> Refusal {
    Refusal::Annotation {
        annotation: annotation.to_string(),
        value: shown(value),
        reason: reason.to_string(),
        accepted: accepted.to_string(),
    }
}

/// The longest annotation value quoted whole in a refusal.
const MAX_SHOWN: usize = 200;

/// A value as a refusal quotes it: whole when short, else its beginning and
/// its size (a refusal is shown by kubectl and kept in the apiserver's audit
/// log; a 200 KB value does not belong there).
fn shown(value: &str) -> String {
    if value.len() <= MAX_SHOWN {
        return value.to_string();
    }
    let mut end = MAX_SHOWN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &value[..end], value.len())
}

/// The most entries a list annotation (`volumes`, `nccl`) may have: far
/// more than any job needs, and a bound on what one annotation makes the
/// webhook inject.
pub const MAX_LIST_ENTRIES: usize = 64;

/// The non-empty entries of a comma-separated list annotation, refused past
/// [`MAX_LIST_ENTRIES`].
fn list_entries<'a>(key: &str, raw: &'a str, accepted: &str) -> Result<Vec<&'a str>, Refusal> {
    let entries: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .take(MAX_LIST_ENTRIES + 1)
        .collect();
    if entries.len() > MAX_LIST_ENTRIES {
        let total = raw.split(',').filter(|e| !e.trim().is_empty()).count();
        return Err(bad(
            key,
            raw,
            &format!("{total} entries; at most {MAX_LIST_ENTRIES} are accepted"),
            accepted,
        ));
    }
    Ok(entries)
}

/// Parse one annotation with its contract type; a refusal names the
/// annotation, the value and the accepted forms.
fn typed<T: Grammar>(key: &str, raw: &str) -> Result<T, Refusal> {
    T::read(raw).map_err(|e: Invalid| bad(key, raw, &e.reason, e.accepted))
}

/// A DNS-1123 label (container names): lowercase alphanumerics and `-`, at
/// most 63 characters, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (PVC names): dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

const NPROC_FORMS: &str =
    "a positive integer such as \"8\", or one of torchrun's \"auto\", \"gpu\", \"cpu\"";
const VOLUME_FORMS: &str = "comma-separated \"claim:/path\" or \"claim:/path:ro\", e.g. \"datasets:/data:ro,outputs:/out\"";
const NCCL_FORMS: &str = "comma-separated KEY=VALUE with keys starting NCCL_ or TORCH_NCCL_, e.g. \"NCCL_DEBUG=INFO,NCCL_SOCKET_IFNAME=eth0\"";

/// Parse every `trainwire.dev/*` annotation of the workload.
pub fn parse(annotations: Option<&serde_json::Map<String, Value>>) -> Result<Annotations, Refusal> {
    let mut out = Annotations {
        rdzv_port: DEFAULT_RDZV_PORT,
        max_restarts: DEFAULT_MAX_RESTARTS,
        ..Annotations::default()
    };
    let Some(map) = annotations else {
        return Ok(out);
    };
    let mut own: BTreeMap<&str, &str> = BTreeMap::new();
    let mut unknown = 0usize;
    for (key, value) in map {
        if !key.starts_with(PREFIX) {
            // `trainwire/nnodes`, `Trainwire.dev/nnodes`: meant for
            // trainwire, ignored by it.
            if looks_like_ours(key) && nearest_known(key).is_some() {
                unknown += 1;
                if unknown <= MAX_UNKNOWN_NAMED {
                    out.warnings.push(unknown_warning(key));
                }
            }
            continue;
        }
        let Value::String(value) = value else {
            return Err(not_a_string(key, value, &yaml_text(value)));
        };
        if KNOWN.contains(&key.as_str()) {
            own.insert(key.as_str(), value.as_str());
        } else if key != STATUS && key != WORLD && !CONTROLLER_OWNED.contains(&key.as_str()) {
            unknown += 1;
            if unknown <= MAX_UNKNOWN_NAMED {
                out.warnings.push(unknown_warning(key));
            }
        }
    }
    if unknown > MAX_UNKNOWN_NAMED {
        out.warnings.push(format!(
            "{} more unknown {PREFIX}* annotations are ignored (see docs/annotations.md)",
            unknown - MAX_UNKNOWN_NAMED
        ));
    }
    for (&key, &raw) in &own {
        let v = raw.trim();
        match key {
            INJECT => {}
            CONTAINER => {
                if !is_dns_label(v) {
                    return Err(bad(
                        key,
                        raw,
                        "not a container name",
                        "the name of a container of the pod template (a DNS-1123 label)",
                    ));
                }
                out.container = Some(v.to_string());
            }
            NNODES => out.nnodes = Some(typed(key, raw)?),
            NPROC_PER_NODE => {
                out.nproc_per_node = Some(match v {
                    "auto" | "gpu" | "cpu" => Nproc::Keyword(v.to_string()),
                    _ => Nproc::Count(
                        v.parse::<PositiveCount>()
                            .map_err(|_| bad(key, raw, "not a process count", NPROC_FORMS))?
                            .get(),
                    ),
                });
            }
            GPUS_PER_NODE => {
                out.gpus_per_node = Some(typed::<PositiveCount>(key, raw)?.get());
            }
            RDZV_BACKEND => {
                out.rdzv_backend = Some(typed(key, raw)?);
            }
            RDZV_PORT => out.rdzv_port = typed::<Port>(key, raw)?.get(),
            RDZV_STORE => out.rdzv_store = Some(typed(key, raw)?),
            RDZV_HANDLER => out.rdzv_handler = Some(typed(key, raw)?),
            SPARES => out.spares = Some(typed(key, raw)?),
            MAX_RESTARTS => {
                out.max_restarts = typed::<trainwire_contract::Count>(key, raw)?.0;
            }
            CHECKPOINT_PVC => {
                if !is_dns_subdomain(v) {
                    return Err(bad(
                        key,
                        raw,
                        "not a PersistentVolumeClaim name",
                        "the name of a PersistentVolumeClaim in the namespace (a DNS-1123 subdomain)",
                    ));
                }
                out.checkpoint_pvc = Some(v.to_string());
            }
            CHECKPOINT_PATH => {
                out.checkpoint_path = Some(typed(key, raw)?);
            }
            CHECKPOINT_MAX_AGE => {
                out.checkpoint_max_age = Some(typed(key, raw)?);
            }
            VOLUMES => out.volumes = parse_volumes(raw)?,
            NCCL => out.nccl = parse_nccl(raw)?,
            SHM_SIZE => out.shm_size = Some(typed(key, raw)?),
            SIDECAR => {
                out.sidecar = Some(match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(key, raw, "not a boolean", "\"true\" or \"false\"")),
                });
            }
            ON_PEER_LOSS => out.on_peer_loss = Some(typed(key, raw)?),
            STALL_TIMEOUT => out.stall_timeout = Some(typed(key, raw)?),
            ON_STALL => out.on_stall = Some(typed(key, raw)?),
            LOSS_WINDOW => out.loss_window = Some(typed(key, raw)?),
            FRAMEWORK => out.framework = Some(typed(key, raw)?),
            FAIL_FAST_EXIT_CODES => out.fail_fast_exit_codes = Some(typed(key, raw)?),
            MAX_FAILURES => out.max_failures = Some(typed(key, raw)?),
            _ => {}
        }
    }
    Ok(out)
}

fn parse_volumes(raw: &str) -> Result<Vec<SharedVolume>, Refusal> {
    let mut out: Vec<SharedVolume> = Vec::new();
    for entry in list_entries(VOLUMES, raw, VOLUME_FORMS)? {
        let mut parts = entry.split(':');
        let claim = parts.next().unwrap_or_default().trim();
        // The path as written between the separators: the path grammar
        // says what blanks in it mean.
        let path = parts.next();
        let mode = parts.next().map(str::trim);
        let extra = parts.next();
        let read_only = match mode {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => {
                return Err(bad(
                    VOLUMES,
                    raw,
                    &format!("entry {entry:?} has a mode that is neither ro nor rw"),
                    VOLUME_FORMS,
                ));
            }
        };
        let Some(path) = path else {
            return Err(bad(
                VOLUMES,
                raw,
                &format!("entry {entry:?} has no mount path"),
                VOLUME_FORMS,
            ));
        };
        if extra.is_some() {
            return Err(bad(
                VOLUMES,
                raw,
                &format!("entry {entry:?} has too many \":\""),
                VOLUME_FORMS,
            ));
        }
        if !is_dns_subdomain(claim) {
            return Err(bad(
                VOLUMES,
                raw,
                &format!("{claim:?} is not a PersistentVolumeClaim name"),
                VOLUME_FORMS,
            ));
        }
        let path = match MountPath::read(path) {
            Ok(p) => p.to_string(),
            Err(e) => {
                return Err(bad(
                    VOLUMES,
                    raw,
                    &format!("{path:?} is not a mount path: {}", e.reason),
                    VOLUME_FORMS,
                ));
            }
        };
        if out.iter().any(|v| v.path == path) {
            return Err(bad(
                VOLUMES,
                raw,
                &format!("{path:?} is mounted twice"),
                VOLUME_FORMS,
            ));
        }
        out.push(SharedVolume {
            claim: claim.to_string(),
            path,
            read_only,
        });
    }
    Ok(out)
}

fn parse_nccl(raw: &str) -> Result<Vec<(String, String)>, Refusal> {
    let mut out: Vec<(String, String)> = Vec::new();
    for entry in list_entries(NCCL, raw, NCCL_FORMS)? {
        let Some((k, v)) = entry.split_once('=') else {
            return Err(bad(
                NCCL,
                raw,
                &format!("entry {entry:?} has no \"=\""),
                NCCL_FORMS,
            ));
        };
        let k = k.trim();
        let key_ok = (k.starts_with("NCCL_") || k.starts_with("TORCH_NCCL_"))
            && k.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !key_ok {
            return Err(bad(
                NCCL,
                raw,
                &format!("{k:?} is not an NCCL_* or TORCH_NCCL_* variable"),
                NCCL_FORMS,
            ));
        }
        if out.iter().any(|(ek, _)| ek == k) {
            return Err(bad(NCCL, raw, &format!("{k} is given twice"), NCCL_FORMS));
        }
        out.push((k.to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// Unknown `trainwire.dev/*` annotations named one by one in warnings; the
/// rest are counted in one.
const MAX_UNKNOWN_NAMED: usize = 5;

/// The longest unknown name a nearest known name is looked for (the edit
/// distance costs its length times each known name's).
const MAX_SUGGESTED_LEN: usize = 64;

/// Whether an annotation name outside `trainwire.dev/` may still be meant
/// for trainwire (`trainwire/inject`, `Trainwire.dev/inject`,
/// `trainwire.io/nnodes`): its prefix starts with `trainwire`, any case.
pub fn looks_like_ours(key: &str) -> bool {
    key.len() <= PREFIX.len() + MAX_SUGGESTED_LEN
        && key
            .get(..9)
            .is_some_and(|p| p.eq_ignore_ascii_case("trainwire"))
}

/// The known annotation a name that is not one was probably meant to be:
/// the same name in another case or under a misspelt prefix, a prefix of
/// it, or one within a small edit distance (`trainwire.dev/injct`,
/// `trainwire.dev/Inject`, `trainwire/inject`). `None` for a known name or
/// one that looks like none.
pub fn nearest_known(key: &str) -> Option<&'static str> {
    if KNOWN.contains(&key) || key == STATUS || key == WORLD || CONTROLLER_OWNED.contains(&key) {
        return None;
    }
    let suffix = match key.strip_prefix(PREFIX) {
        Some(s) => s,
        // `trainwire/inject`, or `trainwire.dev-inject` with no `/`.
        None if looks_like_ours(key) => key.rsplit_once('/').map_or_else(
            || {
                let rest = &key[9..];
                let rest = rest.strip_prefix(".dev").unwrap_or(rest);
                rest.trim_start_matches(['.', '-', '_', ':'])
            },
            |(_, s)| s,
        ),
        None => return None,
    };
    if suffix.len() > MAX_SUGGESTED_LEN {
        return None;
    }
    let suffix = suffix.to_ascii_lowercase();
    let known = KNOWN
        .iter()
        .map(|k| (*k, k.strip_prefix(PREFIX).unwrap_or(k)));
    if let Some((k, _)) = known.clone().find(|(_, s)| *s == suffix) {
        return Some(k);
    }
    let by_prefix = known
        .clone()
        .find(|(_, s)| suffix.len() >= 3 && (s.starts_with(&suffix) || suffix.starts_with(s)));
    by_prefix.map(|(k, _)| k).or_else(|| {
        known
            .map(|(k, s)| (strsim::damerau_levenshtein(&suffix, s), k))
            .filter(|(d, _)| *d <= 2.max(suffix.len() / 3))
            .min()
            .map(|(_, k)| k)
    })
}

/// Warnings for a workload that is not opted in but has an annotation
/// that was probably meant as the opt-in (`trainwire.dev/injct: "true"`,
/// `trainwire/inject: "true"`): offline `inject` says so instead of
/// passing it through silently.
pub fn misspelt_opt_in(annotations: Option<&serde_json::Map<String, Value>>) -> Vec<String> {
    let Some(map) = annotations else {
        return Vec::new();
    };
    if map.contains_key(INJECT) {
        return Vec::new();
    }
    map.keys()
        .filter(|k| k.starts_with(PREFIX) || looks_like_ours(k))
        .filter(|k| nearest_known(k) == Some(INJECT))
        .take(MAX_UNKNOWN_NAMED)
        .map(|k| format!("unknown annotation {k}: not injected; did you mean {INJECT}?"))
        .collect()
}

fn unknown_warning(key: &str) -> String {
    let suffix = key.strip_prefix(PREFIX).unwrap_or(key);
    if suffix.len() > MAX_SUGGESTED_LEN {
        let shown: String = key.chars().take(MAX_SUGGESTED_LEN).collect();
        return format!("unknown annotation {shown}... is ignored (see docs/annotations.md)");
    }
    match nearest_known(key) {
        Some(k) => format!("unknown annotation {key} is ignored; did you mean {k}?"),
        None => format!("unknown annotation {key} is ignored (see docs/annotations.md)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> serde_json::Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }

    #[test]
    fn defaults_when_absent() {
        let a = parse(None).unwrap_or_default();
        assert_eq!(a.rdzv_port, 29500);
        assert_eq!(a.max_restarts, 3);
        assert_eq!(a.nnodes, None);
    }

    #[test]
    fn parses_every_form() {
        let m = map(json!({
            "trainwire.dev/nnodes": "2:8",
            "trainwire.dev/nproc-per-node": "gpu",
            "trainwire.dev/volumes": "datasets-pvc:/data:ro, outputs-pvc:/out/",
            "trainwire.dev/nccl": "NCCL_DEBUG=INFO,NCCL_IB_HCA==mlx5",
            "trainwire.dev/shm-size": "off",
            "trainwire.dev/checkpoint-max-age": "1h30m",
        }));
        let a = parse(Some(&m)).unwrap_or_default();
        assert_eq!(a.nnodes, Some(Nnodes::Elastic { min: 2, max: 8 }));
        assert_eq!(a.nproc_per_node, Some(Nproc::Keyword("gpu".into())));
        assert_eq!(a.volumes[1].path, "/out");
        assert!(a.volumes[0].read_only);
        assert_eq!(a.nccl[1], ("NCCL_IB_HCA".into(), "=mlx5".into()));
        assert_eq!(a.shm_size, Some(ShmSize::Off));
    }

    #[test]
    fn unknown_annotation_suggests_nearest() {
        let m = map(json!({
            "trainwire.dev/nnode": "2",
            "trainwire.dev/gpus": "1",
            "trainwire.dev/chekpoint-pvc": "x",
            "trainwire.dev/zzzzzzzz": "x",
        }));
        let a = parse(Some(&m)).unwrap_or_default();
        assert_eq!(
            a.warnings,
            vec![
                "unknown annotation trainwire.dev/chekpoint-pvc is ignored; did you mean trainwire.dev/checkpoint-pvc?".to_string(),
                "unknown annotation trainwire.dev/gpus is ignored; did you mean trainwire.dev/gpus-per-node?".to_string(),
                "unknown annotation trainwire.dev/nnode is ignored; did you mean trainwire.dev/nnodes?".to_string(),
                "unknown annotation trainwire.dev/zzzzzzzz is ignored (see docs/annotations.md)".to_string(),
            ]
        );
    }

    #[test]
    fn near_misses_of_known_names_are_found() {
        for (key, want) in [
            ("trainwire.dev/injct", Some(INJECT)),
            ("trainwire.dev/Inject", Some(INJECT)),
            ("trainwire/inject", Some(INJECT)),
            ("Trainwire.dev/inject", Some(INJECT)),
            ("trainwire.io/nnodes", Some(NNODES)),
            ("trainwire.dev-inject", Some(INJECT)),
            ("trainwire.dev/nnode", Some(NNODES)),
            ("trainwire.dev/inject", None),
            ("trainwire.dev/status", None),
            ("example.com/inject", None),
            ("trainwire.dev/zzzzzzzz", None),
        ] {
            assert_eq!(nearest_known(key), want, "{key}");
        }
    }

    #[test]
    fn a_misspelt_opt_in_is_named() {
        let m = map(json!({"trainwire.dev/injct": "true", "app": "x"}));
        assert_eq!(
            misspelt_opt_in(Some(&m)),
            vec!["unknown annotation trainwire.dev/injct: not injected; did you mean trainwire.dev/inject?".to_string()]
        );
        // Opted in as well: the engine's own warning says it.
        let m = map(json!({"trainwire.dev/injct": "true", INJECT: "true"}));
        assert!(misspelt_opt_in(Some(&m)).is_empty());
        // Outside trainwire.dev/ but meant for it, when opted in.
        let m = map(json!({INJECT: "true", "trainwire/nnodes": "2"}));
        let a = parse(Some(&m)).unwrap_or_default();
        assert_eq!(
            a.warnings,
            vec!["unknown annotation trainwire/nnodes is ignored; did you mean trainwire.dev/nnodes?".to_string()]
        );
    }

    /// A YAML boolean or number is shown as written, with the quoting that
    /// fixes it; never inside the quotes as if it were already a string.
    #[test]
    fn non_string_values_show_the_yaml_and_the_fix() {
        let refused = |v: Value| {
            parse(Some(&map(json!({ NNODES: v }))))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            refused(json!(2)),
            "trainwire.dev/nnodes: 2 is a YAML number, annotation values are strings: write \"2\" in quotes"
        );
        assert_eq!(
            refused(json!(null)),
            "trainwire.dev/nnodes: null is empty (YAML null), annotation values are strings: write the value in quotes"
        );
        assert!(refused(json!([1, 2])).contains("is a YAML list"));
        let e = opted_in(Some(&map(json!({ INJECT: true }))))
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "trainwire.dev/inject: true is a YAML boolean, annotation values are strings: write \"true\" in quotes"
            )
        );
    }

    /// A list annotation of thousands of entries is refused with a short
    /// message: the count, the limit, the value's beginning and size.
    #[test]
    fn list_annotations_are_bounded() {
        let nccl: Vec<String> = (0..32_000).map(|i| format!("NCCL_X{i}=1")).collect();
        let volumes: Vec<String> = (0..32_000).map(|i| format!("c{i}:/p{i}")).collect();
        for (key, value) in [(NCCL, nccl.join(",")), (VOLUMES, volumes.join(","))] {
            let err = parse(Some(&map(json!({ key: value })))).err();
            let Some(Refusal::Annotation {
                reason,
                value: quoted,
                ..
            }) = &err
            else {
                panic!("{key}: {err:?}");
            };
            assert_eq!(reason, "32000 entries; at most 64 are accepted");
            assert!(
                quoted.len() < 300 && quoted.ends_with(" bytes)"),
                "{quoted}"
            );
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(text.len() < 1000, "{} characters", text.len());
        }
        let nccl: Vec<String> = (0..64).map(|i| format!("NCCL_X{i}=1")).collect();
        assert!(parse(Some(&map(json!({ NCCL: nccl.join(",") })))).is_ok());
    }

    /// A workload with thousands of unknown `trainwire.dev/*` names (or
    /// one very long one) gets a handful of warnings, quickly: five named,
    /// the rest counted.
    #[test]
    fn many_unknown_annotations_are_counted_not_listed() {
        let mut m = serde_json::Map::new();
        for i in 0..20_000 {
            m.insert(format!("trainwire.dev/x{i:05}"), json!("1"));
        }
        m.insert(format!("trainwire.dev/{}", "y".repeat(100_000)), json!("1"));
        let started = std::time::Instant::now();
        let a = parse(Some(&m)).unwrap_or_default();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert_eq!(a.warnings.len(), MAX_UNKNOWN_NAMED + 1, "{:?}", a.warnings);
        assert_eq!(
            a.warnings.last().map(String::as_str),
            Some(
                "19996 more unknown trainwire.dev/* annotations are ignored (see docs/annotations.md)"
            )
        );
        let long = unknown_warning(&format!("trainwire.dev/{}", "y".repeat(100_000)));
        assert!(long.len() < 200, "{long}");
    }

    #[test]
    fn durations_and_sizes_use_the_contract_grammar() {
        let one = |k: &str, v: &str| parse(Some(&map(json!({ k: v }))));
        for ok in ["30m", "90s", "2h", "500ms", "1h30m", "1.5s", "1800s"] {
            assert!(one(CHECKPOINT_MAX_AGE, ok).is_ok(), "{ok}");
        }
        for bad in ["", "0s", "30", "m", "1d", "-1s", "18446744073709551615s"] {
            assert!(one(CHECKPOINT_MAX_AGE, bad).is_err(), "{bad}");
        }
        for ok in [
            "8Gi",
            "512Mi",
            "1G",
            "1.5Gi",
            "1000000000",
            "+1Gi",
            "1e9",
            "off",
        ] {
            assert!(one(SHM_SIZE, ok).is_ok(), "{ok}");
        }
        for bad in ["", "0", "Gi", "8GB", "-1Gi", "1..5Gi", "512m", "512Ki"] {
            assert!(one(SHM_SIZE, bad).is_err(), "{bad}");
        }
        let e = one(SHM_SIZE, "512m").expect_err("half a byte").to_string();
        assert!(
            e.contains("trainwire.dev/shm-size") && e.contains("fraction of a byte"),
            "{e}"
        );
        let e = one(CHECKPOINT_PATH, "//").expect_err("root").to_string();
        assert!(
            e.contains("trainwire.dev/checkpoint-path") && e.contains("/checkpoints"),
            "{e}"
        );
        let a = one(CHECKPOINT_PATH, "//ckpt//").expect("normalised");
        assert_eq!(
            a.checkpoint_path.map(|p| p.to_string()).as_deref(),
            Some("/ckpt")
        );
        let e = one(CHECKPOINT_MAX_AGE, "1d").expect_err("days").to_string();
        assert!(e.contains("24h"), "{e}");
        assert!(one(VOLUMES, "data:/").is_err());
    }
}
