//! Re-injection made exact with the recorded [`Status`]: before injecting
//! again, the engine strips what an earlier injection added ([`strip`]), so a
//! changed input (say `replicas` 2 → 3 through `kubectl apply`) recomputes
//! trainwire's entries, while an entry whose fingerprint no longer matches
//! was edited by the user and is kept; the input hash ([`input_hash`]) and
//! [`same_but_hash`] tell an unchanged input, which changes nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use serde::Serialize;
use serde_json::Value;

use super::fingerprint::{fingerprint, quantity_value, sha256_of};
use super::status::{Status, read};
use super::workload::Workload;
use trainwire_contract::annotations::STATUS;

/// Whether two workloads differ at most in the status annotation's `hash`
/// and `version`.
pub fn same_but_hash(a: &Workload, b: &Workload) -> bool {
    let raw = |w: &Workload| {
        w.template()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(STATUS))
            .cloned()
    };
    let (Some(raw_a), Some(raw_b)) = (raw(a), raw(b)) else {
        return false;
    };
    let cleared = |raw: &str| {
        serde_json::from_str::<Status>(raw).ok().map(|mut st| {
            st.hash.clear();
            st.version.clear();
            st
        })
    };
    match (cleared(&raw_a), cleared(&raw_b)) {
        (Some(sa), Some(sb)) if sa == sb => {}
        _ => return false,
    }
    // Everything else equal: compare with `a`'s status text put on `b`.
    let mut b = b.clone();
    if let Some(ann) = b
        .template_mut()
        .and_then(|t| t.metadata.as_mut())
        .and_then(|m| m.annotations.as_mut())
    {
        ann.insert(STATUS.to_string(), raw_a);
    }
    *a == b
}

/// What [`strip`] found.
#[derive(Debug, Default)]
pub struct Stripped {
    /// Workload-level fields (`completionMode`, `completions`) the earlier
    /// injection set, for the workload to unset.
    pub workload_fields: Vec<String>,
    /// Every entry the status records was still there (as written or edited
    /// by the user). When one was deleted, the injection is redone even if
    /// the input hash is unchanged.
    pub complete: bool,
}

/// Whether every entry the status records is present in the template.
fn complete(template: &PodTemplateSpec, status: &Status) -> bool {
    let Some(spec) = template.spec.as_ref() else {
        return false;
    };
    let Some(c) = spec.containers.iter().find(|c| c.name == status.container) else {
        return false;
    };
    let env_ok = all_present(
        status.env.keys(),
        c.env.iter().flatten().map(|e| e.name.as_str()),
    );
    let mounts_ok = all_present(
        status.volume_mounts.keys(),
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str()),
    );
    let volumes_ok = all_present(
        status.volumes.keys(),
        spec.volumes.iter().flatten().map(|v| v.name.as_str()),
    );
    let inits_ok = all_present(
        status.init_containers.keys(),
        spec.init_containers
            .iter()
            .flatten()
            .map(|i| i.name.as_str()),
    );
    env_ok && mounts_ok && volumes_ok && inits_ok
}

/// Whether every one of `wanted` is among `present`: a set lookup, linear
/// in both, whatever sizes a status and a template bring.
fn all_present<'w, 'p>(
    wanted: impl IntoIterator<Item = &'w String>,
    present: impl Iterator<Item = &'p str>,
) -> bool {
    let present: std::collections::HashSet<&str> = present.collect();
    wanted.into_iter().all(|w| present.contains(w.as_str()))
}

/// Undo an earlier injection recorded in `status`: remove the entries trainwire
/// added and still match what it wrote, restore the user values it replaced,
/// and drop the status annotation.
pub fn strip(template: &mut PodTemplateSpec, status: &Status) -> Stripped {
    let complete = complete(template, status);
    let workload_fields = strip_entries(template, status);
    Stripped {
        workload_fields,
        complete,
    }
}

/// Drop a status annotation that cannot be read (hand-edited, or from an
/// engine that wrote another shape). Nothing is stripped by it, but it is
/// never part of the input either: the first pass and every later one see
/// the same workload, so injecting twice changes nothing.
pub fn drop_unreadable(template: &mut PodTemplateSpec) {
    if read(template).is_none() {
        remove_annotation(template);
    }
}

fn remove_annotation(template: &mut PodTemplateSpec) {
    if let Some(annotations) = template
        .metadata
        .as_mut()
        .and_then(|m| m.annotations.as_mut())
    {
        annotations.remove(STATUS);
        if annotations.is_empty()
            && let Some(m) = template.metadata.as_mut()
        {
            m.annotations = None;
        }
    }
}

fn strip_entries(template: &mut PodTemplateSpec, status: &Status) -> Vec<String> {
    remove_annotation(template);
    let Some(spec) = template.spec.as_mut() else {
        return Vec::new();
    };
    if let Some(c) = spec
        .containers
        .iter_mut()
        .find(|c| c.name == status.container)
    {
        strip_container(c, status);
    }
    let had = Lengths {
        init_containers: len(&spec.init_containers),
        volumes: len(&spec.volumes),
        node_selector: spec.node_selector.as_ref().map_or(0, BTreeMap::len),
    };
    if let Some(inits) = spec.init_containers.as_mut() {
        inits.retain(|c| status.init_containers.get(&c.name) != Some(&fingerprint(c)));
    }
    unset_if_emptied(&mut spec.init_containers, had.init_containers);
    if let Some(volumes) = spec.volumes.as_mut() {
        let mut kept = Vec::with_capacity(volumes.len());
        for v in volumes.drain(..) {
            if status.volumes.get(&v.name) != Some(&fingerprint(&v)) {
                kept.push(v);
            } else if let Some(orig) = status.replaced_volumes.get(&v.name) {
                kept.push(orig.clone());
            }
        }
        *volumes = kept;
    }
    unset_if_emptied(&mut spec.volumes, had.volumes);
    strip_tolerations(spec, status);
    if let Some(sel) = spec.node_selector.as_mut() {
        for (key, value) in &status.node_selector {
            if sel.get(key) == Some(value) {
                match status.replaced_node_selector.get(key) {
                    Some(orig) => sel.insert(key.clone(), orig.clone()),
                    None => sel.remove(key),
                };
            }
        }
    }
    unset_if_emptied(&mut spec.node_selector, had.node_selector);
    let mut workload_fields = Vec::new();
    for field in &status.fields {
        match field.as_str() {
            "shareProcessNamespace" => spec.share_process_namespace = None,
            "subdomain" => spec.subdomain = None,
            other if other.split('=').next() == Some(super::rendezvous::FIELD_DNS_POLICY) => {
                if spec.dns_policy.as_deref() == Some(super::rendezvous::HOST_NETWORK_DNS_POLICY) {
                    spec.dns_policy = other.split_once('=').map(|(_, was)| was.to_string());
                }
            }
            other => workload_fields.push(other.to_string()),
        }
    }
    workload_fields
}

/// How many entries the pod's lists held before [`strip_entries`].
struct Lengths {
    init_containers: usize,
    volumes: usize,
    node_selector: usize,
}

fn len<T>(list: &Option<Vec<T>>) -> usize {
    list.as_ref().map_or(0, Vec::len)
}

/// A list or map that held entries and that stripping emptied goes back to
/// absent (the injection created it, or filled it); one the user wrote empty
/// (`volumes: []`, `requests: {}`) and that held nothing of trainwire's is
/// the user's and stays, so re-injecting it writes the same object.
fn unset_if_emptied<C: Emptiable>(field: &mut Option<C>, had: usize) {
    if had > 0 && field.as_ref().is_some_and(Emptiable::is_empty) {
        *field = None;
    }
}

trait Emptiable {
    fn is_empty(&self) -> bool;
}
impl<T> Emptiable for Vec<T> {
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}
impl<K, V> Emptiable for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

fn strip_container(c: &mut Container, status: &Status) {
    let had_env = len(&c.env);
    let had_mounts = len(&c.volume_mounts);
    if let Some(env) = c.env.as_mut() {
        let mut kept = Vec::with_capacity(env.len());
        // trainwire writes or replaces only the first entry of a name (a
        // manifest may repeat one: the last wins in the container); a later
        // entry with the same value is the manifest's own.
        let mut seen = std::collections::BTreeSet::new();
        for var in env.drain(..) {
            let first = seen.insert(var.name.clone());
            match status.env.get(&var.name) {
                Some(fp) if first && *fp == fingerprint(&var) => {
                    if let Some(orig) = status.replaced_env.get(&var.name) {
                        kept.push(orig.clone());
                    }
                }
                _ => kept.push(var),
            }
        }
        *env = kept;
    }
    unset_if_emptied(&mut c.env, had_env);
    if let Some(mounts) = c.volume_mounts.as_mut() {
        mounts.retain(|m| status.volume_mounts.get(&m.mount_path) != Some(&fingerprint(m)));
    }
    unset_if_emptied(&mut c.volume_mounts, had_mounts);
    if let Some(res) = c.resources.as_mut() {
        let had_limits = res.limits.as_ref().map_or(0, BTreeMap::len);
        let had_requests = res.requests.as_ref().map_or(0, BTreeMap::len);
        for (key, value) in &status.resources {
            let Some((kind, name)) = key.split_once('/') else {
                continue;
            };
            let map = match kind {
                "limits" => res.limits.as_mut(),
                "requests" => res.requests.as_mut(),
                _ => None,
            };
            if let Some(map) = map
                && map.get(name).and_then(|q| quantity_value(&q.0)) == quantity_value(value)
            {
                map.remove(name);
            }
        }
        unset_if_emptied(&mut res.limits, had_limits);
        unset_if_emptied(&mut res.requests, had_requests);
    }
}

fn strip_tolerations(spec: &mut PodSpec, status: &Status) {
    let Some(tols) = spec.tolerations.as_mut() else {
        return;
    };
    let had = tols.len();
    let mut kept = Vec::with_capacity(tols.len());
    for t in tols.drain(..) {
        let fp = fingerprint(&t);
        if let Some(orig) = status.replaced_tolerations.get(&fp) {
            kept.push(orig.clone());
        } else if !status.tolerations.contains(&fp) {
            kept.push(t);
        }
    }
    *tols = kept;
    unset_if_emptied(&mut spec.tolerations, had);
}

/// The input hash: what the user controls, and nothing else. That is the
/// stripped workload (the pod template without trainwire's entries, the size,
/// the rest of the spec) with its metadata reduced to the name and the
/// `trainwire.dev/*` annotations, and the namespace. Neither the policy, the
/// sidecar image nor the engine version is in it: when the recorded hash
/// matches, the injection already on the object stays exactly as it is, so
/// upgrading trainwire or editing its policy never rolls running training;
/// the new settings reach the pods at the user's next real change (or
/// `kubectl rollout restart`). Empty maps and lists are dropped first so that
/// "absent" and "empty" hash the same.
///
/// The hashed text is the compact JSON object `{"namespace":..,"workload":..}`
/// (keys sorted, empty parts left out), streamed into the hasher rather than
/// built: `spec` is the workload's spec as JSON.
pub fn input_hash(workload: &Workload, namespace: &str) -> String {
    // The spec as compact JSON, typed (k8s-openapi writes keys in sorted
    // order), then pruned as text: no `Value` tree, which for a review at
    // the body limit would be tens of MB.
    let spec = match workload {
        Workload::StatefulSet(s) => serde_json::to_vec(&s.spec),
        Workload::Job(j) => serde_json::to_vec(&j.spec),
    }
    .unwrap_or_default();
    let mut pruned = Vec::with_capacity(spec.len());
    let spec_written = prune_json(&spec, &mut pruned).is_some();
    if !spec_written {
        // Deeper than the pruner goes (no k8s-openapi spec is): the slow path.
        pruned.clear();
        if let Ok(v) = serde_json::from_slice::<Value>(&spec)
            && !prunable(&v)
        {
            let _ = serde_json::to_writer(&mut pruned, &Pruned(&v));
        }
    }
    drop(spec);
    let meta = workload.metadata();
    let own: Vec<(&String, &String)> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            k.starts_with(super::annotations::PREFIX) && k.as_str() != super::annotations::WORLD
        })
        .collect();
    let digest = sha256_of(|out| {
        use serde_json::to_writer as json;
        out.extend_from_slice(b"{\"namespace\":");
        json(&mut *out, namespace)?;
        out.extend_from_slice(b",\"workload\":{\"apiVersion\":");
        let (api_version, kind) = match workload {
            Workload::StatefulSet(_) => ("apps/v1", "StatefulSet"),
            Workload::Job(_) => ("batch/v1", "Job"),
        };
        json(&mut *out, api_version)?;
        out.extend_from_slice(b",\"kind\":");
        json(&mut *out, kind)?;
        // Keys in sorted order, empty maps left out, as the pruned JSON
        // object of the workload would print.
        if !own.is_empty() || meta.name.is_some() {
            out.extend_from_slice(b",\"metadata\":{");
            if !own.is_empty() {
                out.extend_from_slice(b"\"annotations\":");
                json(&mut *out, &own.iter().copied().collect::<BTreeMap<_, _>>())?;
            }
            if let Some(name) = &meta.name {
                out.extend_from_slice(if own.is_empty() {
                    b"\"name\":"
                } else {
                    b",\"name\":"
                });
                json(&mut *out, name)?;
            }
            out.push(b'}');
        }
        if !pruned.is_empty() {
            out.extend_from_slice(b",\"spec\":");
            out.extend_from_slice(&pruned);
        }
        out.extend_from_slice(b"}}");
        Ok(())
    });
    format!("sha256:{}", hex::encode(digest))
}

/// Writes compact JSON text (as serde_json writes it) to `out` without its
/// empty parts, exactly as [`Pruned`] prints the same value; writes nothing
/// when the whole value is prunable. `None` (and `out` unspecified) when
/// the text is not compact JSON or nests deeper than [`PRUNE_DEPTH`].
fn prune_json(json: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut p = TextPruner { s: json, i: 0, out };
    let prunable = p.value(0)?;
    if p.i != json.len() {
        return None;
    }
    if prunable {
        p.out.clear();
    }
    Some(())
}

/// How deep [`prune_json`] follows objects and arrays.
const PRUNE_DEPTH: usize = 128;

struct TextPruner<'a> {
    s: &'a [u8],
    i: usize,
    out: &'a mut Vec<u8>,
}

impl TextPruner<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Copies one value; returns whether [`Pruned`] would leave it out of
    /// a map (null, `[]`, an object with nothing left).
    fn value(&mut self, depth: usize) -> Option<bool> {
        if depth > PRUNE_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(|()| false),
            b'n' => {
                self.s.get(self.i..self.i + 4).filter(|t| *t == b"null")?;
                self.i += 4;
                self.out.extend_from_slice(b"null");
                Some(true)
            }
            _ => {
                let start = self.i;
                while let Some(c) = self.peek() {
                    if matches!(c, b',' | b'}' | b']') {
                        break;
                    }
                    if c.is_ascii_whitespace() {
                        return None;
                    }
                    self.i += 1;
                }
                (self.i > start).then_some(())?;
                self.out.extend_from_slice(&self.s[start..self.i]);
                Some(false)
            }
        }
    }

    fn string(&mut self) -> Option<()> {
        let start = self.i;
        self.i += 1;
        loop {
            match self.peek()? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    break;
                }
                _ => self.i += 1,
            }
        }
        self.out.extend_from_slice(self.s.get(start..self.i)?);
        Some(())
    }

    fn object(&mut self, depth: usize) -> Option<bool> {
        self.i += 1;
        self.out.push(b'{');
        let mut members = 0usize;
        if self.peek()? == b'}' {
            self.i += 1;
            self.out.push(b'}');
            return Some(true);
        }
        loop {
            let mark = self.out.len();
            if members > 0 {
                self.out.push(b',');
            }
            if self.peek()? != b'"' {
                return None;
            }
            self.string()?;
            if self.peek()? != b':' {
                return None;
            }
            self.i += 1;
            self.out.push(b':');
            if self.value(depth + 1)? {
                self.out.truncate(mark);
            } else {
                members += 1;
            }
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    break;
                }
                _ => return None,
            }
        }
        self.out.push(b'}');
        Some(members == 0)
    }

    fn array(&mut self, depth: usize) -> Option<bool> {
        self.i += 1;
        self.out.push(b'[');
        if self.peek()? == b']' {
            self.i += 1;
            self.out.push(b']');
            return Some(true);
        }
        loop {
            self.value(depth + 1)?;
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.out.push(b',');
                }
                b']' => {
                    self.i += 1;
                    break;
                }
                _ => return None,
            }
        }
        self.out.push(b']');
        Some(false)
    }
}

/// A JSON value printed without its empty parts: nulls, and maps that are
/// empty once pruned, are left out of maps; empty lists are left out of maps.
struct Pruned<'a>(&'a Value);

fn prunable(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(prunable),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

impl Serialize for Pruned<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Object(m) => {
                let mut map = serializer.serialize_map(None)?;
                for (k, v) in m {
                    if !prunable(v) {
                        map.serialize_entry(k, &Pruned(v))?;
                    }
                }
                map.end()
            }
            Value::Array(a) => {
                let mut seq = serializer.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Pruned(v))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod prune_tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// What the `Value` path printed: `Pruned`, or nothing when prunable.
    fn by_value(v: &Value) -> Vec<u8> {
        if prunable(v) {
            Vec::new()
        } else {
            serde_json::to_vec(&Pruned(v)).expect("json")
        }
    }

    fn by_text(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        prune_json(&serde_json::to_vec(v).expect("json"), &mut out).expect("compact json");
        out
    }

    #[test]
    fn text_pruning_prints_what_the_value_path_printed() {
        for v in [
            json!(null),
            json!({}),
            json!([]),
            json!({"a": [], "b": {}, "c": {"d": null, "e": []}}),
            json!({"a": [], "f": [{}, [], null, {"g": []}], "h": "x\"y\\z}]", "i": -1.5e-7, "j": true}),
            json!({"template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "t", "env": [], "resources": {}}]}}}),
            json!([[[]]]),
            json!("only a string"),
        ] {
            assert_eq!(
                String::from_utf8_lossy(&by_text(&v)),
                String::from_utf8_lossy(&by_value(&v)),
                "{v}"
            );
        }
    }

    #[test]
    fn text_pruning_refuses_what_is_not_compact_json_and_deep_nesting() {
        let mut out = Vec::new();
        assert!(prune_json(b"{\"a\": 1}", &mut out).is_none());
        assert!(prune_json(b"{\"a\":1", &mut out).is_none());
        assert!(prune_json(b"{\"a\":1}x", &mut out).is_none());
        let deep = format!(
            "{}{}",
            "[".repeat(PRUNE_DEPTH + 2),
            "]".repeat(PRUNE_DEPTH + 2)
        );
        assert!(prune_json(deep.as_bytes(), &mut out).is_none());
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[a-z\"\\\\{}\\[\\],: ]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[a-e]{1,2}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn text_pruning_equals_the_value_path_on_any_json(v in json_value()) {
            prop_assert_eq!(by_text(&v), by_value(&v));
        }
    }
}
