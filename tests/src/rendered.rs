//! What `trainwire-webhook inject` renders, as a kubelet would run it: the
//! real CLI's output parsed, a container's env turned into the values its
//! process sees (downward-API fields filled in, `$(VAR)` expanded from
//! earlier entries only).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

/// One env entry of a rendered container: a literal, or a downward-API field.
#[derive(Debug, Clone)]
pub enum Entry {
    Value(String),
    Field(String),
}

/// The env of a rendered container (`containers[i]`, `initContainers[i]`).
pub fn entries(container: &Value) -> Vec<(String, Entry)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            let entry = match e.pointer("/valueFrom/fieldRef/fieldPath") {
                Some(f) => Entry::Field(f.as_str().unwrap_or_default().to_string()),
                None => Entry::Value(e["value"].as_str().unwrap_or_default().to_string()),
            };
            (name, entry)
        })
        .collect()
}

/// Every object the real `trainwire-webhook inject -f -` prints for
/// `manifest` (embedded defaults, no policy file), in order.
pub fn inject(manifest: &str) -> Result<Vec<Value>, String> {
    let bin = crate::webhook_binary()?;
    let mut child = Command::new(&bin)
        .args(["inject", "-f", "-"])
        .env_remove("TRAINWIRE_POLICY")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run {}: {e}", bin.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(manifest.as_bytes())
            .map_err(|e| format!("write the manifest: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for inject: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "inject failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("\n---\n")
        .filter(|doc| !doc.trim().is_empty() && doc.trim() != "---")
        .map(|doc| serde_saphyr::from_str(doc).map_err(|e| format!("inject's output: {e}\n{text}")))
        .collect()
}

/// The object of `kind` named `name` among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value, String> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .ok_or_else(|| format!("inject rendered no {kind} {name}"))
}

/// What the kubelet makes of a rendered env: downward-API fields filled in
/// from `fields`, `$(VAR)` expanded from earlier entries only.
pub fn resolve(
    env: &[(String, Entry)],
    fields: &BTreeMap<&str, String>,
) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, entry) in env {
        let value = match entry {
            Entry::Field(f) => fields
                .get(f.as_str())
                .cloned()
                .ok_or_else(|| format!("env {name}: no value for field {f}"))?,
            Entry::Value(v) => {
                let mut v = v.clone();
                for (k, earlier) in &out {
                    v = v.replace(&format!("$({k})"), earlier);
                }
                v
            }
        };
        out.push((name.clone(), value));
    }
    Ok(out)
}

/// The downward-API fields of pod `index` of StatefulSet `set` (its pod
/// `<set>-<index>`, UID `uid`) in `namespace`.
pub fn pod_fields(
    set: &str,
    index: u32,
    namespace: &str,
    uid: &str,
) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (
            "metadata.labels['apps.kubernetes.io/pod-index']",
            index.to_string(),
        ),
        ("metadata.name", format!("{set}-{index}")),
        ("metadata.namespace", namespace.to_string()),
        ("metadata.uid", uid.to_string()),
    ])
}
