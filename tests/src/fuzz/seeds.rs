//! The fuzzer's seeds: the captures, the examples and their renderings,
//! the policy files and the sidecar's env, read once.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

/// The seeds, read once.
pub struct Seeds {
    /// AdmissionReview bodies.
    pub(super) reviews: Vec<Value>,
    /// Manifests: YAML texts.
    pub(super) manifests: Vec<String>,
    /// Manifests as values (for structured mutations and ResourceLists).
    pub(super) objects: Vec<Value>,
    pub(super) policies: Vec<String>,
    pub(super) envs: Vec<BTreeMap<String, String>>,
}

impl Seeds {
    /// The captures, the examples and their renderings, the policy files.
    pub fn load(root: &Path) -> std::io::Result<Seeds> {
        let read_dir = |dir: &Path, ext: &str| -> std::io::Result<Vec<(String, String)>> {
            let mut out = Vec::new();
            for e in std::fs::read_dir(dir)? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == ext) {
                    out.push((p.display().to_string(), std::fs::read_to_string(&p)?));
                }
            }
            out.sort();
            Ok(out)
        };
        let mut reviews = Vec::new();
        for (_, text) in read_dir(&root.join("tests/fixtures/admission"), "json")? {
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                reviews.push(v);
            }
        }
        let mut manifests = Vec::new();
        let mut policies = Vec::new();
        for dir in ["examples", "examples/rendered", "examples/rendered-policy"] {
            for (name, text) in read_dir(&root.join(dir), "yaml")? {
                if name.ends_with("policy.yaml") && dir == "examples" {
                    policies.push(text);
                } else if !text.trim().is_empty() {
                    manifests.push(text);
                }
            }
        }
        for (_, text) in read_dir(&root.join("webhook/tests/data/policy"), "yaml")? {
            policies.push(text);
        }
        let mut objects: Vec<Value> = Vec::new();
        for text in &manifests {
            for doc in text.split("\n---") {
                if let Ok(v) = serde_saphyr::from_str::<Value>(doc)
                    && v.is_object()
                {
                    objects.push(v);
                }
            }
        }
        // The captured objects, as manifests and as reviews of the examples.
        for r in &reviews {
            if let Some(o) = r.pointer("/request/object").filter(|o| o.is_object()) {
                objects.push(o.clone());
            }
        }
        let template = reviews
            .iter()
            .find(|r| r["request"]["operation"] == "CREATE")
            .cloned();
        if let Some(template) = template {
            for o in objects.clone() {
                if matches!(o["kind"].as_str(), Some("StatefulSet" | "Job")) {
                    let mut r = template.clone();
                    r["request"]["kind"] = json!({
                        "group": if o["kind"] == "Job" { "batch" } else { "apps" },
                        "version": "v1",
                        "kind": o["kind"],
                    });
                    r["request"]["resource"]["resource"] = json!(if o["kind"] == "Job" {
                        "jobs"
                    } else {
                        "statefulsets"
                    });
                    r["request"]["object"] = o;
                    reviews.push(r);
                }
            }
        }
        // The sidecar env the examples inject, and the empty world.
        let mut envs = Vec::new();
        for o in &objects {
            for c in o
                .pointer("/spec/template/spec/initContainers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let map: BTreeMap<String, String> = c["env"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        let v = e["value"].as_str().map(str::to_string).or_else(|| {
                            // Downward-API values, as the kubelet fills them.
                            e.pointer("/valueFrom/fieldRef/fieldPath")
                                .map(|p| match p.as_str() {
                                    Some("metadata.name") => "train-0".to_string(),
                                    Some("metadata.namespace") => "default".to_string(),
                                    Some("metadata.uid") => "0c4c-11".to_string(),
                                    _ => "0".to_string(),
                                })
                        })?;
                        Some((e["name"].as_str()?.to_string(), v))
                    })
                    .collect();
                if !map.is_empty() {
                    envs.push(map);
                }
            }
        }
        envs.push(BTreeMap::new());
        if reviews.is_empty() || manifests.is_empty() || objects.is_empty() || policies.is_empty() {
            return Err(std::io::Error::other(format!(
                "no seeds under {}: the captures, examples and policy files are needed",
                root.display()
            )));
        }
        Ok(Seeds {
            reviews,
            manifests,
            objects,
            policies,
            envs,
        })
    }
}
