//! From the typed mutation back to JSON, and from JSON to a minimal RFC 6902
//! patch that a kube-apiserver accepts.
//!
//! The engine mutates a typed (k8s-openapi) copy of the workload, and the
//! patch is the [`diff`] of the typed before and after (see
//! [`super::diff::diff`]). Typed objects drop fields their schema does not
//! know (a newer apiserver's fields): such a field is on neither side, so the
//! patch never touches it, and it is kept.
//!
//! The patch is made as [`Ops`]: each value is written as JSON text once,
//! from the typed value, and the answer copies that text as it is.
//!
//! [`diff`]: a JSON Patch from one value to another. Objects are compared key by
//!   key; arrays are aligned by element identity (`name`, else `mountPath`,
//!   else the whole value), so prepending an env var is one `add`, not a
//!   cascade of `replace`s. A missing object is added whole, so the patch never
//!   `add`s below a parent that does not exist; keys are escaped (`~1`, `~0`).

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Add,
    Remove,
    Replace,
}

/// One operation of a JSON Patch whose value (for `add` and `replace`) is
/// already written as JSON text.
#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    pub path: PointerBuf,
    pub value: Option<Box<RawValue>>,
}

/// A JSON Patch as the engine makes it: each value written as JSON text
/// once, where the typed value is, so that the answer copies it as it is
/// (no `Value` tree is built for what the patch adds, nor walked again to
/// write it). [`Ops::to_patch`] gives the `json_patch` form (offline
/// `inject`, tests).
#[derive(Clone, Debug, Default)]
pub struct Ops(pub Vec<Op>);

impl Ops {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The same patch with its values read back into `Value`s.
    pub fn to_patch(&self) -> Patch {
        Patch(
            self.0
                .iter()
                .map(|op| {
                    let path = op.path.clone();
                    let value = || {
                        op.value
                            .as_deref()
                            .and_then(|v| serde_json::from_str(v.get()).ok())
                            .unwrap_or(Value::Null)
                    };
                    match op.kind {
                        OpKind::Add => PatchOperation::Add(AddOperation {
                            path,
                            value: value(),
                        }),
                        OpKind::Remove => PatchOperation::Remove(RemoveOperation { path }),
                        OpKind::Replace => PatchOperation::Replace(ReplaceOperation {
                            path,
                            value: value(),
                        }),
                    }
                })
                .collect(),
        )
    }

    /// A patch of `add`, `remove` and `replace` operations, its values
    /// written as JSON text (other operations are left out: the engine
    /// makes none).
    pub fn from_patch(patch: &Patch) -> Ops {
        Ops(patch
            .0
            .iter()
            .filter_map(|op| match op {
                PatchOperation::Add(a) => Some(Op {
                    kind: OpKind::Add,
                    path: a.path.clone(),
                    value: Some(raw(&a.value)),
                }),
                PatchOperation::Remove(r) => Some(Op {
                    kind: OpKind::Remove,
                    path: r.path.clone(),
                    value: None,
                }),
                PatchOperation::Replace(r) => Some(Op {
                    kind: OpKind::Replace,
                    path: r.path.clone(),
                    value: Some(raw(&r.value)),
                }),
                _ => None,
            })
            .collect())
    }

    /// Write the patch as JSON (what `json_patch` writes for the same
    /// operations: `{"op":..,"path":..,"value":..}` each).
    pub fn write_json(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.push(b'[');
        for (i, op) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(match op.kind {
                OpKind::Add => br#"{"op":"add","path":"#.as_slice(),
                OpKind::Remove => br#"{"op":"remove","path":"#.as_slice(),
                OpKind::Replace => br#"{"op":"replace","path":"#.as_slice(),
            });
            serde_json::to_writer(&mut *out, op.path.as_str())?;
            if let Some(value) = &op.value {
                out.extend_from_slice(br#","value":"#);
                out.extend_from_slice(value.get().as_bytes());
            }
            out.push(b'}');
        }
        out.push(b']');
        Ok(())
    }
}

/// `value` as JSON text (a k8s-openapi type or a `Value` always serialises).
fn raw<T: Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

/// A minimal JSON Patch that turns `left` into `right`.
pub fn diff(left: &Value, right: &Value) -> Patch {
    let mut d = Differ::default();
    d.json(left, right);
    d.finish().to_patch()
}

/// A diff of typed values, built level by level: parts that compare equal
/// (`PartialEq` on the typed model, no allocation) are skipped, and only the
/// parts that differ are turned into JSON and diffed like [`diff`]. Ops
/// come out in the order of the keys at each level, as [`diff`] gives them
/// for the same change.
#[derive(Default)]
pub struct Differ {
    pointer: PointerBuf,
    ops: Vec<Op>,
}

/// A member of an object level diffed by its own closure (a typed child
/// taken out of both sides, see [`Differ::object`]).
pub type Special<'a> = (&'static str, Box<dyn FnOnce(&mut Differ) + 'a>);

impl Differ {
    pub fn finish(self) -> Ops {
        Ops(self.ops)
    }

    /// An operation on member `key` of the current level.
    fn at(&mut self, key: &str, kind: OpKind, value: Option<Box<RawValue>>) {
        self.pointer.push_back(key);
        self.here_op(kind, value);
        self.pointer.pop_back();
    }

    /// An operation at the current pointer.
    fn here_op(&mut self, kind: OpKind, value: Option<Box<RawValue>>) {
        self.ops.push(Op {
            kind,
            path: self.pointer.clone(),
            value,
        });
    }

    /// Member `key` of the object at the current level, given as JSON on
    /// either side (`None`: absent).
    fn member_json(&mut self, key: &str, left: Option<&Value>, right: Option<&Value>) {
        match (left, right) {
            (None, None) => {}
            (Some(_), None) => self.at(key, OpKind::Remove, None),
            (None, Some(r)) => self.at(key, OpKind::Add, Some(raw(r))),
            (Some(l), Some(r)) => {
                self.pointer.push_back(key);
                self.json(l, r);
                self.pointer.pop_back();
            }
        }
    }

    /// An optional member: added whole, removed, or diffed by `inner` (with
    /// the pointer at the member) when present on both sides and different.
    pub fn optional<T: Serialize + PartialEq>(
        &mut self,
        key: &str,
        left: Option<T>,
        right: Option<T>,
        inner: impl FnOnce(&mut Differ, T, T),
    ) {
        match (left, right) {
            (None, None) => {}
            (Some(_), None) => self.at(key, OpKind::Remove, None),
            (None, Some(r)) => self.at(key, OpKind::Add, Some(raw(&r))),
            (Some(l), Some(r)) if l == r => {}
            (Some(l), Some(r)) => {
                self.pointer.push_back(key);
                inner(self, l, r);
                self.pointer.pop_back();
            }
        }
    }

    /// An optional member diffed as JSON when it differs.
    pub fn optional_json<T: Serialize + PartialEq>(
        &mut self,
        key: &str,
        left: Option<T>,
        right: Option<T>,
    ) {
        self.optional(key, left, right, |d, l, r| d.here(&l, &r));
    }

    /// The values at the current pointer, diffed as JSON when they differ.
    pub fn here<T: Serialize + PartialEq>(&mut self, left: &T, right: &T) {
        if left == right {
            return;
        }
        let (Ok(l), Ok(r)) = (serde_json::to_value(left), serde_json::to_value(right)) else {
            return;
        };
        self.json(&l, &r);
    }

    /// An object level: `left` and `right` with the `specials` taken out of
    /// both (so that they serialise the same there), and each special's
    /// closure diffing that member. `specials` are in key order.
    pub fn object<T: Serialize + PartialEq>(
        &mut self,
        left: &T,
        right: &T,
        specials: Vec<Special<'_>>,
    ) {
        debug_assert!(specials.windows(2).all(|w| w[0].0 < w[1].0));
        let rest = if left == right {
            None
        } else {
            match (serde_json::to_value(left), serde_json::to_value(right)) {
                (Ok(Value::Object(l)), Ok(Value::Object(r))) => Some((l, r)),
                // Not objects (cannot happen for a k8s-openapi struct): as JSON.
                (Ok(l), Ok(r)) => {
                    self.json(&l, &r);
                    None
                }
                _ => None,
            }
        };
        let mut specials = specials.into_iter().peekable();
        if let Some((l, r)) = &rest {
            let mut keys: Vec<&String> = l.keys().chain(r.keys()).collect();
            keys.sort_unstable();
            keys.dedup();
            for key in keys {
                while let Some((_, run)) = specials.next_if(|(k, _)| *k < key.as_str()) {
                    run(self);
                }
                if let Some((_, run)) = specials.next_if(|(k, _)| *k == key.as_str()) {
                    run(self);
                    continue;
                }
                self.member_json(key, l.get(key), r.get(key));
            }
        }
        for (_, run) in specials {
            run(self);
        }
    }

    /// A list at the current pointer whose elements have a name (env vars,
    /// mounts, volumes), diffed the way [`diff`] diffs a JSON array (aligned
    /// by name, O(n log n)), but only the elements added or changed are
    /// serialised: a list of 20,000 entries is never turned into JSON.
    pub fn keyed_list<T: Serialize + PartialEq>(
        &mut self,
        left: &[T],
        right: &[T],
        name: impl Fn(&T) -> &str,
    ) {
        if left == right {
            return;
        }
        let anchors = align_by(left, right, &name);
        self.aligned(
            (left.len(), right.len()),
            anchors,
            |j| raw(&right[j]),
            |d, i, j| {
                if left[i] != right[j] {
                    d.here(&left[i], &right[j]);
                }
            },
        );
    }

    /// Walk two lists aligned on `anchors` (pairs of indexes kept in place,
    /// increasing in both), the one walk of every list diff: before each
    /// anchor, `add` the right's new entries (`added(j)` is the JSON of the
    /// right's `j`th) and remove the left's dropped ones; at it,
    /// `matched(i, j)` diffs the pair with the pointer at its index.
    fn aligned(
        &mut self,
        (left_len, right_len): (usize, usize),
        anchors: Vec<(usize, usize)>,
        mut added: impl FnMut(usize) -> Box<RawValue>,
        mut matched: impl FnMut(&mut Differ, usize, usize),
    ) {
        let (mut i, mut j, mut at) = (0usize, 0usize, 0usize);
        for (ai, aj) in anchors
            .into_iter()
            .chain(std::iter::once((left_len, right_len)))
        {
            while j < aj {
                let value = added(j);
                self.pointer.push_back(at);
                self.here_op(OpKind::Add, Some(value));
                self.pointer.pop_back();
                j += 1;
                at += 1;
            }
            while i < ai {
                self.pointer.push_back(at);
                self.here_op(OpKind::Remove, None);
                self.pointer.pop_back();
                i += 1;
            }
            if ai < left_len && aj < right_len {
                self.pointer.push_back(at);
                matched(self, ai, aj);
                self.pointer.pop_back();
                i += 1;
                j += 1;
                at += 1;
            }
        }
    }

    /// An optional list of named elements: added whole, removed, or diffed
    /// with [`Differ::keyed_list`].
    pub fn optional_keyed_list<T: Serialize + PartialEq>(
        &mut self,
        key: &str,
        left: Option<Vec<T>>,
        right: Option<Vec<T>>,
        name: impl Fn(&T) -> &str,
    ) {
        self.optional(key, left, right, |d, l, r| d.keyed_list(&l, &r, name));
    }

    /// A list at the current pointer whose elements are typed objects with
    /// a name (containers), aligned by name like [`Differ::keyed_list`]:
    /// an added element is serialised whole, a changed one is diffed by
    /// `element` (typed, so the parts it leaves alike are never serialised).
    pub fn named_list<T: Serialize + PartialEq>(
        &mut self,
        left: Vec<T>,
        right: Vec<T>,
        name: impl Fn(&T) -> &str,
        element: impl Fn(&mut Differ, T, T),
    ) {
        if left == right {
            return;
        }
        let anchors = align_by(&left, &right, &name);
        let sizes = (left.len(), right.len());
        let mut left: Vec<Option<T>> = left.into_iter().map(Some).collect();
        let mut right: Vec<Option<T>> = right.into_iter().map(Some).collect();
        let added: Vec<Box<RawValue>> = {
            // The right's entries that no anchor keeps, serialised up front so
            // that the walk below can take the anchored ones by value.
            let mut kept = vec![false; sizes.1];
            for &(_, j) in &anchors {
                kept[j] = true;
            }
            right
                .iter()
                .zip(kept)
                .filter(|(_, kept)| !kept)
                .map(|(r, _)| raw(r))
                .collect()
        };
        let mut added = added.into_iter();
        self.aligned(
            sizes,
            anchors,
            |_| added.next().unwrap_or_else(|| RawValue::NULL.to_owned()),
            |d, i, j| {
                if let (Some(l), Some(r)) = (left[i].take(), right[j].take())
                    && l != r
                {
                    element(d, l, r);
                }
            },
        );
    }
}

impl Differ {
    /// The JSON values at the current pointer: objects key by key, arrays
    /// aligned by element identity (see [`Differ::json_array`]), anything
    /// else replaced when it differs.
    fn json(&mut self, left: &Value, right: &Value) {
        match (left, right) {
            (Value::Object(l), Value::Object(r)) => self.json_object(l, r),
            (Value::Array(l), Value::Array(r)) => self.json_array(l, r),
            _ if left == right => {}
            _ => self.here_op(OpKind::Replace, Some(raw(right))),
        }
    }

    fn json_object(&mut self, left: &Map<String, Value>, right: &Map<String, Value>) {
        for key in left.keys() {
            if !right.contains_key(key) {
                self.at(key, OpKind::Remove, None);
            }
        }
        for (key, rv) in right {
            match left.get(key) {
                Some(lv) => {
                    self.pointer.push_back(key.as_str());
                    self.json(lv, rv);
                    self.pointer.pop_back();
                }
                None => self.at(key, OpKind::Add, Some(raw(rv))),
            }
        }
    }

    /// Align the two arrays on element identity, then remove, add and
    /// recurse in one pass over the array as it is being edited.
    ///
    /// The alignment is a longest increasing subsequence of the identity
    /// matches (the k-th occurrence of a key on the left pairs with its k-th
    /// occurrence on the right): with unique keys (env names, mount paths,
    /// container names) it is the longest common subsequence, so prepending
    /// an env var is one `add`; and it costs O(n log n) time and O(n) memory
    /// for arrays of any size, which a hostile review (20,000 env entries)
    /// must not turn into a quadratic table.
    fn json_array(&mut self, left: &[Value], right: &[Value]) {
        if left == right {
            return;
        }
        self.aligned(
            (left.len(), right.len()),
            align(left, right),
            |j| raw(&right[j]),
            |d, i, j| d.json(&left[i], &right[j]),
        );
    }
}

/// What makes two array elements "the same entry": a `name` (containers, env,
/// volumes, ports), else a `mountPath` (mounts), else the whole value.
/// Borrowed, hashed without building anything.
#[derive(Clone, Copy)]
enum Key<'a> {
    Name(&'a str),
    MountPath(&'a str),
    Whole(&'a Value),
}

impl<'a> Key<'a> {
    fn of(v: &'a Value) -> Key<'a> {
        if let Value::Object(m) = v {
            if let Some(Value::String(s)) = m.get("name") {
                return Key::Name(s);
            }
            if let Some(Value::String(s)) = m.get("mountPath") {
                return Key::MountPath(s);
            }
        }
        Key::Whole(v)
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Key::Name(a), Key::Name(b)) | (Key::MountPath(a), Key::MountPath(b)) => a == b,
            (Key::Whole(a), Key::Whole(b)) => a == b,
            _ => false,
        }
    }
}
impl Eq for Key<'_> {}

impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Key::Name(s) => {
                state.write_u8(0);
                s.hash(state);
            }
            Key::MountPath(s) => {
                state.write_u8(1);
                s.hash(state);
            }
            Key::Whole(v) => {
                state.write_u8(2);
                hash_value(v, state);
            }
        }
    }
}

/// A hash of a JSON value consistent with its `==`: object entries are
/// combined order-independently (a map's equality ignores order).
fn hash_value<H: Hasher>(v: &Value, state: &mut H) {
    match v {
        Value::Null => state.write_u8(0),
        Value::Bool(b) => b.hash(state),
        Value::Number(n) => n.hash(state),
        Value::String(s) => s.hash(state),
        Value::Array(a) => {
            state.write_usize(a.len());
            for x in a {
                hash_value(x, state);
            }
        }
        Value::Object(m) => {
            let mut sum = 0u64;
            for (k, x) in m {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                k.hash(&mut h);
                hash_value(x, &mut h);
                sum = sum.wrapping_add(h.finish());
            }
            state.write_usize(m.len());
            state.write_u64(sum);
        }
    }
}

/// The pairs `(left index, right index)` kept in place, increasing in both.
fn align(left: &[Value], right: &[Value]) -> Vec<(usize, usize)> {
    align_by(left, right, Key::of)
}

/// [`align`] for any elements, given their identity.
fn align_by<'a, T, K: Hash + Eq>(
    left: &'a [T],
    right: &'a [T],
    key: impl Fn(&'a T) -> K,
) -> Vec<(usize, usize)> {
    // A common prefix and suffix need no hashing (the usual case: the engine
    // appends or edits a few entries of a long list).
    let prefix = left
        .iter()
        .zip(right)
        .take_while(|(l, r)| key(l) == key(r))
        .count();
    let suffix = left[prefix..]
        .iter()
        .rev()
        .zip(right[prefix..].iter().rev())
        .take_while(|(l, r)| key(l) == key(r))
        .count();
    let (l_mid, r_mid) = (
        &left[prefix..left.len() - suffix],
        &right[prefix..right.len() - suffix],
    );
    let mut anchors: Vec<(usize, usize)> = (0..prefix).map(|k| (k, k)).collect();
    if !l_mid.is_empty() && !r_mid.is_empty() {
        // Left occurrences of each key, in order.
        let mut positions: HashMap<K, VecDeque<usize>> = HashMap::with_capacity(l_mid.len());
        for (i, v) in l_mid.iter().enumerate() {
            positions.entry(key(v)).or_default().push_back(i);
        }
        // Right order, each with its matched left index.
        let matches: Vec<(usize, usize)> = r_mid
            .iter()
            .enumerate()
            .filter_map(|(j, v)| {
                let i = positions.get_mut(&key(v))?.pop_front()?;
                Some((i, j))
            })
            .collect();
        for (i, j) in longest_increasing(&matches) {
            anchors.push((prefix + i, prefix + j));
        }
    }
    let (l_end, r_end) = (left.len() - suffix, right.len() - suffix);
    anchors.extend((0..suffix).map(|k| (l_end + k, r_end + k)));
    anchors
}

/// The longest subsequence of `pairs` (increasing in `.1`) whose `.0` is
/// strictly increasing too: patience sorting, O(n log n).
fn longest_increasing(pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    // tails[k]: index in `pairs` of the smallest tail of an increasing run of length k+1.
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; pairs.len()];
    for (n, &(i, _)) in pairs.iter().enumerate() {
        let k = tails.partition_point(|&t| pairs[t].0 < i);
        if k > 0 {
            prev[n] = Some(tails[k - 1]);
        }
        if k == tails.len() {
            tails.push(n);
        } else {
            tails[k] = n;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut cur = tails.last().copied();
    while let Some(n) = cur {
        out.push(pairs[n]);
        cur = prev[n];
    }
    out.reverse();
    out
}

/// Apply `patch` to `doc` one operation at a time, checking before every
/// `add` that its parent exists (what a kube-apiserver insists on). Returns
/// the patched document, or the first offending path.
pub fn apply_checked(doc: &Value, patch: &Patch) -> Result<Value, String> {
    let mut doc = doc.clone();
    for op in &patch.0 {
        if let PatchOperation::Add(add) = op {
            let parent = add
                .path
                .split_back()
                .map(|(parent, _)| parent.to_buf())
                .unwrap_or_default();
            if parent.resolve(&doc).is_err() {
                return Err(format!("add below a missing parent: {}", add.path));
            }
        }
        json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| e.to_string())?;
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn prepending_env_is_one_add() {
        let l = json!({"env": [{"name": "A", "value": "1"}]});
        let r = json!({"env": [{"name": "X", "value": "x"}, {"name": "A", "value": "1"}]});
        let p = diff(&l, &r);
        assert_eq!(
            serde_json::to_value(&p).unwrap_or_default(),
            json!([{"op": "add", "path": "/env/0", "value": {"name": "X", "value": "x"}}])
        );
        assert_eq!(apply_checked(&l, &p), Ok(r));
    }

    #[test]
    fn missing_parent_is_added_whole_and_keys_escaped() {
        let l = json!({"metadata": {"name": "a"}});
        let r = json!({"metadata": {"name": "a", "annotations": {"trainwire.dev/status": "{}"}}});
        let p = diff(&l, &r);
        assert_eq!(
            serde_json::to_value(&p).unwrap_or_default(),
            json!([{"op": "add", "path": "/metadata/annotations", "value": {"trainwire.dev/status": "{}"}}])
        );
        let r2 = json!({"metadata": {"name": "a", "annotations": {"trainwire.dev/status": "{}", "x~y": "1"}}});
        let p2 = diff(&r, &r2);
        assert_eq!(
            serde_json::to_value(&p2).unwrap_or_default(),
            json!([{"op": "add", "path": "/metadata/annotations/x~0y", "value": "1"}])
        );
    }

    #[test]
    fn mixed_array_edits_apply() {
        let l = json!([1, 2, 3, 4, {"name": "a", "v": 1}]);
        let r = json!([0, 2, 4, 5, {"name": "a", "v": 2}, 6]);
        let p = diff(&l, &r);
        assert_eq!(apply_checked(&l, &p), Ok(r));
    }

    fn entry() -> impl Strategy<Value = Value> {
        prop_oneof![
            (0u8..6, 0u8..3).prop_map(|(n, v)| json!({"name": format!("E{n}"), "value": v})),
            (0u8..4).prop_map(|p| json!({"mountPath": format!("/m{p}")})),
            (0u8..5).prop_map(|n| json!(n)),
            (0u8..3).prop_map(|n| json!({"key": n})),
        ]
    }

    proptest! {
        #[test]
        fn any_array_edit_applies(
            l in proptest::collection::vec(entry(), 0..40),
            r in proptest::collection::vec(entry(), 0..40),
        ) {
            let (l, r) = (json!({"a": l}), json!({"a": r}));
            let p = diff(&l, &r);
            prop_assert_eq!(apply_checked(&l, &p), Ok(r));
        }

        #[test]
        fn unique_names_keep_every_common_entry(
            names in proptest::collection::vec(0u16..500, 0..300),
            drop in proptest::collection::vec(any::<bool>(), 300),
            extra in proptest::collection::vec(500u16..600, 0..20),
        ) {
            let mut seen = std::collections::HashSet::new();
            let names: Vec<u16> = names.into_iter().filter(|n| seen.insert(*n)).collect();
            let env = |ns: &[u16]| json!(ns.iter().map(|n| json!({"name": format!("V{n}")})).collect::<Vec<_>>());
            let kept: Vec<u16> = names.iter().zip(&drop).filter(|(_, d)| !**d).map(|(n, _)| *n).collect();
            let mut right = extra.clone();
            right.dedup();
            right.extend(&kept);
            let (l, r) = (env(&names), env(&right));
            let p = diff(&l, &r);
            prop_assert_eq!(apply_checked(&l, &p), Ok(r));
            // Only the dropped and the added entries are touched.
            prop_assert_eq!(p.0.len(), (names.len() - kept.len()) + right.len() - kept.len());
        }
    }

    #[test]
    fn huge_arrays_are_aligned_in_bounded_time() {
        let n = 20_000;
        let env: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("VAR_{i}"), "value": "x"}))
            .collect();
        let mut prepended = vec![json!({"name": "PET_NNODES", "value": "2"})];
        prepended.extend(env.iter().cloned());
        let (l, r) = (json!({"env": env}), json!({"env": prepended}));
        let started = std::time::Instant::now();
        let p = diff(&l, &r);
        assert_eq!(p.0.len(), 1, "one add");
        // Reversed: every entry moves but one; still linearithmic.
        let mut reversed = env.clone();
        reversed.reverse();
        let p2 = diff(&l, &json!({"env": reversed}));
        assert_eq!(p2.0.len(), 2 * (n - 1));
        // Anonymous entries (whole-value identity), all different.
        let ints = json!((0..n).collect::<Vec<_>>());
        let shifted = json!((1..=n).collect::<Vec<_>>());
        assert_eq!(diff(&ints, &shifted).0.len(), 2);
        // Loose: the quadratic table took seconds here; this takes milliseconds.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn checker_rejects_add_below_missing_parent() {
        let p: Patch = serde_json::from_value(
            json!([{"op": "add", "path": "/metadata/annotations/x", "value": "1"}]),
        )
        .unwrap_or_else(|_| Patch(vec![]));
        assert!(apply_checked(&json!({"metadata": {}}), &p).is_err());
    }
}
