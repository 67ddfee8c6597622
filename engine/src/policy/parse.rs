//! Reading a policy file: YAML into the model, every error with the file,
//! line, column and the field path (`profiles[1].nccl.NCCL_SOCKET_IFNAME.enforce`).
//!
//! serde-saphyr knows where an error is; `serde_path_to_error` knows in which
//! field. Semantic checks run on the parsed model and know only the field
//! path, so [`Locations`] walks the YAML events once and maps every path to
//! the line and column of its key and value.

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;
use serde_saphyr::granit_parser::{Event, Parser};

use super::{Policy, PolicyError, Profile};

/// The `apiVersion` of a policy file.
pub const API_VERSION: &str = "trainwire.dev/v1alpha1";
/// The `kind` of a policy file.
pub const KIND: &str = "Policy";

#[derive(Debug, Deserialize)]
enum ApiVersion {
    #[serde(rename = "trainwire.dev/v1alpha1")]
    V1alpha1,
}

#[derive(Debug, Deserialize)]
enum Kind {
    Policy,
}

/// The file as written: a versioned envelope around the profiles.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyFile {
    #[allow(dead_code)]
    api_version: ApiVersion,
    #[allow(dead_code)]
    kind: Kind,
    profiles: Vec<Profile>,
}

impl From<PolicyFile> for Policy {
    fn from(file: PolicyFile) -> Self {
        Policy {
            profiles: file.profiles,
            ..Policy::default()
        }
    }
}

/// One segment of a field path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// Where a value sits in the policy file, in the file's own field names:
/// `profiles[0].nodeSelector["karpenter.sh/nodepool"].value`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(pub Vec<Segment>);

impl FieldPath {
    pub fn root() -> Self {
        FieldPath(Vec::new())
    }
    pub fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Key(key.to_string()));
        p
    }
    pub fn index(&self, index: usize) -> Self {
        let mut p = self.clone();
        p.0.push(Segment::Index(index));
        p
    }
    fn parent(&self) -> Option<Self> {
        if self.0.is_empty() {
            None
        } else {
            Some(FieldPath(self.0[..self.0.len() - 1].to_vec()))
        }
    }
}

fn plain_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(document)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Segment::Index(n) => write!(f, "[{n}]")?,
                Segment::Key(k) if plain_key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Segment::Key(k) => write!(f, "[{k:?}]")?,
            }
        }
        Ok(())
    }
}

/// One error in a policy file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user named it (`policy.yaml`), or `<policy>`.
    pub file: String,
    /// 1-based line and column, when known.
    pub line: Option<u64>,
    pub column: Option<u64>,
    pub path: FieldPath,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        write!(f, ": {}: {}", self.path, self.message)
    }
}

/// Line and column of every key and value in a YAML document, by field path.
#[derive(Debug, Default)]
pub struct Locations {
    keys: HashMap<FieldPath, (u64, u64)>,
    values: HashMap<FieldPath, (u64, u64)>,
}

enum Frame {
    Mapping {
        key: Option<String>,
    },
    Sequence {
        next: usize,
    },
    /// A complex (non-scalar) mapping key: its contents have no path.
    Ignored,
}

impl Locations {
    /// Walk the events of `text`. Stops quietly at a syntax error: the
    /// deserializer reports that one itself, with its own location.
    pub fn scan(text: &str) -> Self {
        let mut out = Locations::default();
        let mut parser = Parser::new_from_str(text);
        let mut stack: Vec<Frame> = Vec::new();
        let mut path = FieldPath::root();
        // Pending path segment pushed for the current container value.
        let mut pushed: Vec<bool> = Vec::new();
        while let Some(Ok((event, span))) = parser.next_event() {
            let pos = (span.start.line() as u64, span.start.col() as u64 + 1);
            let starts = matches!(event, Event::MappingStart(..) | Event::SequenceStart(..));
            let is_node = matches!(
                event,
                Event::Scalar(..)
                    | Event::Alias(..)
                    | Event::MappingStart(..)
                    | Event::SequenceStart(..)
            );
            if is_node {
                // Where does this node sit?
                let mut segment: Option<Segment> = None;
                let mut ignored = false;
                match stack.last_mut() {
                    Some(Frame::Mapping { key }) if key.is_none() => {
                        // This node is a key.
                        match &event {
                            Event::Scalar(text, ..) => {
                                let k = text.to_string();
                                out.keys.insert(path.key(&k), pos);
                                *key = Some(k);
                            }
                            _ => {
                                *key = Some(String::new());
                                ignored = true;
                            }
                        }
                        if !starts {
                            continue;
                        }
                    }
                    Some(Frame::Mapping { key }) => {
                        segment = key.take().map(Segment::Key);
                    }
                    Some(Frame::Sequence { next }) => {
                        segment = Some(Segment::Index(*next));
                        *next += 1;
                    }
                    Some(Frame::Ignored) => ignored = true,
                    None => {}
                }
                let here = match &segment {
                    Some(Segment::Key(k)) => path.key(k),
                    Some(Segment::Index(i)) => path.index(*i),
                    None => path.clone(),
                };
                if !ignored {
                    out.values.entry(here.clone()).or_insert(pos);
                }
                if starts {
                    if ignored {
                        stack.push(Frame::Ignored);
                        pushed.push(false);
                    } else {
                        stack.push(match event {
                            Event::MappingStart(..) => Frame::Mapping { key: None },
                            _ => Frame::Sequence { next: 0 },
                        });
                        let did_push = segment.is_some();
                        if did_push {
                            path = here;
                        }
                        pushed.push(did_push);
                    }
                }
            } else if matches!(event, Event::MappingEnd | Event::SequenceEnd) {
                stack.pop();
                if pushed.pop() == Some(true) {
                    path.0.pop();
                }
            }
        }
        out
    }

    /// Where the value at `path` starts; for a missing value, where its
    /// nearest present parent starts.
    pub fn value(&self, path: &FieldPath) -> Option<(u64, u64)> {
        let mut p = Some(path.clone());
        while let Some(cur) = p {
            if let Some(pos) = self.values.get(&cur) {
                return Some(*pos);
            }
            p = cur.parent();
        }
        None
    }

    /// Where the key of the mapping entry at `path` starts.
    pub fn key(&self, path: &FieldPath) -> Option<(u64, u64)> {
        self.keys.get(path).copied().or_else(|| self.value(path))
    }
}

/// Rewrite serde's backtick quoting into the style of our messages:
/// ``unknown variant `warn`, expected one of `a`, `b` `` becomes
/// `unknown variant "warn", expected one of a, b`.
fn restyle(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut parts = message.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for (i, part) in parts.enumerate() {
        match i {
            0 | 1 => out.push('"'),
            _ => {}
        }
        out.push_str(part);
    }
    out
}

/// The name of the unknown field in a serde "unknown field" message.
fn unknown_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split_once('`').map(|(name, _)| name)
}

/// The fields serde says it expected, from its "expected one of" list.
fn expected_names(message: &str) -> Vec<&str> {
    message
        .split_once("expected one of ")
        .map(|(_, list)| {
            list.split(", ")
                .map(|s| s.trim_matches('`'))
                .collect::<Vec<_>>()
        })
        .or_else(|| {
            message
                .split_once("expected `")
                .map(|(_, rest)| vec![rest.trim_end_matches('`')])
        })
        .unwrap_or_default()
}

/// Drop the ` at line N, column M` that serde-saphyr appends: the
/// diagnostic carries the location itself.
fn strip_location(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i)
            if message[i + 9..]
                .split_once(", column ")
                .is_some_and(|(l, c)| {
                    l.chars().all(|ch| ch.is_ascii_digit())
                        && c.chars().all(|ch| ch.is_ascii_digit())
                }) =>
        {
            &message[..i]
        }
        _ => message,
    }
}

/// Fields whose value is a `{value, enforce}` setting.
const SETTING_FIELDS: &[&str] = &[
    "nodeFailureTolerationSeconds",
    "checkpointPath",
    "checkpointMaxAge",
    "shmSize",
    "rdzvBackend",
    "rdzvStore",
    "rdzvHandler",
    "spares",
    "framework",
    "image",
    "onPeerLoss",
    "stallTimeout",
    "onStall",
    "lossWindow",
    "enabled",
];

fn is_setting(path: &FieldPath) -> bool {
    let n = path.0.len();
    match (n.checked_sub(2).map(|i| &path.0[i]), path.0.last()) {
        (Some(Segment::Key(parent)), Some(Segment::Key(_)))
            if parent == "nccl" || parent == "nodeSelector" =>
        {
            true
        }
        (_, Some(Segment::Key(last))) => SETTING_FIELDS.contains(&last.as_str()),
        _ => false,
    }
}

const ENVELOPE: &str =
    "a policy file is a mapping: apiVersion: trainwire.dev/v1alpha1, kind: Policy, profiles: [...]";

/// Turn a deserializer message into ours, moving the path onto the
/// offending key where the message names one.
fn humanize(raw: &str, path: &mut FieldPath) -> String {
    if let Some(name) = unknown_field(raw) {
        if path.0.last() != Some(&Segment::Key(name.to_string())) {
            *path = path.key(name);
        }
        let mut message = restyle(raw);
        let best = expected_names(raw)
            .into_iter()
            .map(|cand| (strsim::jaro_winkler(name, cand), cand))
            .filter(|(score, _)| *score > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, cand)) = best {
            message.push_str(&format!(" (did you mean {cand:?}?)"));
        }
        return message;
    }
    if let Some(rest) = raw.strip_prefix("duplicate mapping key: ") {
        let key = rest.split_once(", set ").map_or(rest, |(k, _)| k);
        *path = path.key(key);
        return format!("{key:?} is given twice; keep one");
    }
    if raw == "expected mapping start" {
        if path.0.is_empty() {
            return format!("expected a mapping; {ENVELOPE}");
        }
        if is_setting(path) {
            return "expected a setting {value: ..., enforce: default|refuse|overwrite}; a plain value must be written {value: ...}".to_string();
        }
        return "expected a mapping (key: value pairs) here".to_string();
    }
    if raw == "expected sequence start" {
        return "expected a list here".to_string();
    }
    if let Some(ty) = raw.strip_prefix("invalid ") {
        match ty {
            "u8" | "u16" | "u32" | "u64" | "usize" => {
                return "expected a whole number (0 or more)".to_string();
            }
            "i8" | "i16" | "i32" | "i64" | "isize" => {
                return "expected a whole number".to_string();
            }
            "bool" => return "expected true or false".to_string(),
            _ => {}
        }
    }
    let mut message = restyle(raw);
    if raw == "missing field `apiVersion`" || raw == "missing field `kind`" {
        message = format!("{message}; {ENVELOPE}");
    }
    message
}

/// Parse the text of a policy file. `file` names it in messages.
pub fn parse(text: &str, file: &str) -> Result<Policy, PolicyError> {
    let mut tracked_path = None;
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        let mut track = serde_path_to_error::Track::new();
        let out = PolicyFile::deserialize(serde_path_to_error::Deserializer::new(de, &mut track));
        if out.is_err() {
            tracked_path = Some(track.path());
        }
        out
    });
    match result {
        Ok(file_model) => Ok(Policy::from(file_model)),
        Err(err) => {
            let err = err.without_snippet();
            let raw = match err {
                serde_saphyr::Error::Message { msg, .. } => msg.clone(),
                other => other.to_string(),
            };
            // Drop a location suffix or snippet the renderer may append.
            let raw = raw.lines().next().unwrap_or_default().to_string();
            let mut path = FieldPath::root();
            if let Some(tracked) = &tracked_path {
                for seg in tracked.iter() {
                    match seg {
                        serde_path_to_error::Segment::Seq { index } => {
                            path.0.push(Segment::Index(*index))
                        }
                        serde_path_to_error::Segment::Map { key } => {
                            path.0.push(Segment::Key(key.clone()))
                        }
                        serde_path_to_error::Segment::Enum { variant } => {
                            path.0.push(Segment::Key(variant.clone()))
                        }
                        serde_path_to_error::Segment::Unknown => {}
                    }
                }
            }
            let raw = strip_location(&raw);
            let message = humanize(raw, &mut path);
            let (line, column) = match err.location() {
                Some(loc) if loc.line() > 0 => (Some(loc.line()), Some(loc.column())),
                _ => {
                    let locs = Locations::scan(text);
                    match locs.key(&path) {
                        Some((l, c)) => (Some(l), Some(c)),
                        None => (None, None),
                    }
                }
            };
            // The parser places a tab where the scalar before it ended.
            let (line, column, message) = if crate::yaml_error::is_about_a_tab(raw) {
                let at = crate::yaml_error::describe(err, text);
                (at.line.or(line), at.column.or(column), at.message)
            } else {
                (line, column, message)
            };
            Err(PolicyError::Invalid(vec![Diagnostic {
                file: file.to_string(),
                line,
                column,
                path,
                message,
            }]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_display_in_file_terms() {
        let p = FieldPath::root()
            .key("profiles")
            .index(1)
            .key("nodeSelector")
            .key("karpenter.sh/nodepool")
            .key("value");
        assert_eq!(
            p.to_string(),
            r#"profiles[1].nodeSelector["karpenter.sh/nodepool"].value"#
        );
        assert_eq!(FieldPath::root().to_string(), "(document)");
    }

    #[test]
    fn locations_of_keys_and_values() {
        let text = "a: 1\nprofiles:\n  - name: x\n    nccl:\n      NCCL_DEBUG: {value: INFO}\n  - name: y\n    tolerations: [{key: k}]\n";
        let locs = Locations::scan(text);
        let p1 = FieldPath::root().key("profiles").index(1);
        assert_eq!(locs.value(&p1.key("name")), Some((6, 11)));
        assert_eq!(locs.key(&p1.key("name")), Some((6, 5)));
        let v = FieldPath::root()
            .key("profiles")
            .index(0)
            .key("nccl")
            .key("NCCL_DEBUG")
            .key("value");
        assert_eq!(locs.value(&v), Some((5, 27)));
        let t = p1.key("tolerations").index(0).key("key");
        assert_eq!(locs.value(&t), Some((7, 25)));
        // Missing: falls back to the nearest parent.
        assert_eq!(locs.value(&p1.key("shmSize")), Some((6, 5)));
    }

    #[test]
    fn restyles_serde_quoting() {
        assert_eq!(
            restyle("unknown variant `warn`, expected one of `default`, `refuse`, `overwrite`"),
            r#"unknown variant "warn", expected one of default, refuse, overwrite"#
        );
        assert_eq!(restyle("missing field `value`"), r#"missing field "value""#);
    }
}
