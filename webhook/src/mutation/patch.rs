//! From the typed mutation back to JSON, and from JSON to a minimal RFC 6902
//! patch that a kube-apiserver accepts.
//!
//! Two steps:
//! - [`overlay`]: the engine mutates a typed (k8s-openapi) copy of the
//!   workload. Typed objects drop fields their schema does not know (a newer
//!   apiserver's fields), so the output is not the typed object itself: it is
//!   the original JSON with only the places the engine changed replaced. A
//!   field the typed model never saw is therefore kept, never removed.
//! - [`diff`]: a JSON Patch from input to output. Objects are compared key by
//!   key; arrays are aligned by element identity (`name`, else `mountPath`,
//!   else the whole value), so prepending an env var is one `add`, not a
//!   cascade of `replace`s. A missing object is added whole, so the patch never
//!   `add`s below a parent that does not exist; keys are escaped (`~1`, `~0`).

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::{Map, Value};

/// The original JSON with the engine's changes applied. `before` is the typed
/// serialisation of `original`, `after` the typed serialisation of the result.
pub fn overlay(original: &Value, before: &Value, after: &Value) -> Value {
    if before == after {
        return original.clone();
    }
    match (original, before, after) {
        (Value::Object(o), Value::Object(b), Value::Object(a)) => {
            let mut out = o.clone();
            for key in b.keys() {
                if !a.contains_key(key) {
                    out.remove(key);
                }
            }
            for (key, av) in a {
                let merged = match (o.get(key), b.get(key)) {
                    (Some(ov), Some(bv)) => overlay(ov, bv, av),
                    _ => av.clone(),
                };
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(o), Value::Array(b), Value::Array(a)) if o.len() == b.len() => {
            let mut used = vec![false; b.len()];
            let out = a
                .iter()
                .map(|av| {
                    let key = identity(av);
                    let found = b
                        .iter()
                        .enumerate()
                        .position(|(i, bv)| !used[i] && identity(bv) == key);
                    match found {
                        Some(i) => {
                            used[i] = true;
                            overlay(&o[i], &b[i], av)
                        }
                        None => av.clone(),
                    }
                })
                .collect();
            Value::Array(out)
        }
        _ => after.clone(),
    }
}

/// What makes two array elements "the same entry": a `name` (containers, env,
/// volumes, ports), else a `mountPath` (mounts), else the whole value.
fn identity(v: &Value) -> Value {
    if let Value::Object(m) = v {
        for key in ["name", "mountPath"] {
            if let Some(Value::String(s)) = m.get(key) {
                return Value::String(format!("{key}={s}"));
            }
        }
    }
    v.clone()
}

/// A minimal JSON Patch that turns `left` into `right`.
pub fn diff(left: &Value, right: &Value) -> Patch {
    let mut ops = Vec::new();
    let mut pointer = PointerBuf::new();
    diff_value(left, right, &mut pointer, &mut ops);
    Patch(ops)
}

fn diff_value(
    left: &Value,
    right: &Value,
    pointer: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    match (left, right) {
        (Value::Object(l), Value::Object(r)) => diff_object(l, r, pointer, ops),
        (Value::Array(l), Value::Array(r)) => diff_array(l, r, pointer, ops),
        _ if left == right => {}
        _ => ops.push(PatchOperation::Replace(ReplaceOperation {
            path: pointer.clone(),
            value: right.clone(),
        })),
    }
}

fn diff_object(
    left: &Map<String, Value>,
    right: &Map<String, Value>,
    pointer: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    for key in left.keys() {
        if !right.contains_key(key) {
            pointer.push_back(key.as_str());
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: pointer.clone(),
            }));
            pointer.pop_back();
        }
    }
    for (key, rv) in right {
        pointer.push_back(key.as_str());
        match left.get(key) {
            Some(lv) => diff_value(lv, rv, pointer, ops),
            None => ops.push(PatchOperation::Add(AddOperation {
                path: pointer.clone(),
                value: rv.clone(),
            })),
        }
        pointer.pop_back();
    }
}

/// Align the two arrays on element identity (longest common subsequence), then
/// remove, add and recurse in one pass over the array as it is being edited.
fn diff_array(
    left: &[Value],
    right: &[Value],
    pointer: &mut PointerBuf,
    ops: &mut Vec<PatchOperation>,
) {
    if left == right {
        return;
    }
    let lk: Vec<Value> = left.iter().map(identity).collect();
    let rk: Vec<Value> = right.iter().map(identity).collect();
    let (n, m) = (lk.len(), rk.len());
    // lcs[i][j]: length of the LCS of lk[i..] and rk[j..].
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if lk[i] == rk[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut at) = (0usize, 0usize, 0usize);
    while i < n || j < m {
        if i < n && j < m && lk[i] == rk[j] {
            pointer.push_back(at);
            diff_value(&left[i], &right[j], pointer, ops);
            pointer.pop_back();
            i += 1;
            j += 1;
            at += 1;
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            pointer.push_back(at);
            ops.push(PatchOperation::Add(AddOperation {
                path: pointer.clone(),
                value: right[j].clone(),
            }));
            pointer.pop_back();
            j += 1;
            at += 1;
        } else {
            pointer.push_back(at);
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: pointer.clone(),
            }));
            pointer.pop_back();
            i += 1;
        }
    }
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

    #[test]
    fn checker_rejects_add_below_missing_parent() {
        let p: Patch = serde_json::from_value(
            json!([{"op": "add", "path": "/metadata/annotations/x", "value": "1"}]),
        )
        .unwrap_or_else(|_| Patch(vec![]));
        assert!(apply_checked(&json!({"metadata": {}}), &p).is_err());
    }

    #[test]
    fn overlay_keeps_fields_the_typed_model_does_not_know() {
        let original =
            json!({"spec": {"newField": 1, "containers": [{"name": "a", "futureField": true}]}});
        let before = json!({"spec": {"containers": [{"name": "a"}]}});
        let after = json!({"spec": {"containers": [{"name": "a", "env": []}, {"name": "b"}]}});
        assert_eq!(
            overlay(&original, &before, &after),
            json!({"spec": {"newField": 1, "containers": [{"name": "a", "futureField": true, "env": []}, {"name": "b"}]}})
        );
    }
}
