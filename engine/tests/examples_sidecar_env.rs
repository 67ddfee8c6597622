//! Every example, rendered with the embedded defaults and with every profile
//! of `examples/policy.yaml`, gives the sidecar an env its own configuration
//! parser accepts (the contract's `Config::from_source`, which the sidecar
//! starts with): what the webhook writes, the sidecar reads.

use std::collections::BTreeMap;

use serde_json::Value;
use trainwire_contract::config::Config;
use trainwire_engine::mutation::{self, Outcome};
use trainwire_engine::policy::{self, Profile};

fn examples() -> Vec<(String, Vec<Value>)> {
    let dir = trainwire_test_support::repo_root().join("examples");
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "policy.yaml"))
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path).expect("read example");
        let docs: Vec<Value> = text
            .split("\n---")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_saphyr::from_str(d).unwrap_or(Value::Null))
            .filter(|v: &Value| v.is_object())
            .collect();
        out.push((path.display().to_string(), docs));
    }
    out
}

fn profiles() -> Vec<Profile> {
    let path = trainwire_test_support::repo_root().join("examples/policy.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let p = policy::Policy::from_yaml(&text, &path.display().to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut all = vec![Profile::default()];
    all.extend(p.profiles);
    all
}

/// The sidecar's env as the kubelet would give it: downward-API fields
/// resolved for pod 0.
fn sidecar_env(object: &Value) -> Option<BTreeMap<String, String>> {
    let inits = object
        .pointer("/spec/template/spec/initContainers")?
        .as_array()?;
    let sidecar = inits.iter().find(|c| c["name"] == "trainwire-sidecar")?;
    let mut env = BTreeMap::new();
    for e in sidecar["env"].as_array()? {
        let name = e["name"].as_str()?.to_string();
        let value = match (
            e["value"].as_str(),
            e.pointer("/valueFrom/fieldRef/fieldPath"),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some(Value::String(path))) if path == "metadata.name" => "train-0".into(),
            (None, Some(Value::String(path))) if path == "metadata.namespace" => "ns".into(),
            (None, Some(Value::String(path))) if path == "metadata.uid" => "uid-0".into(),
            (None, Some(_)) => "0".into(),
            (None, None) => continue,
        };
        env.insert(name, value);
    }
    Some(env)
}

#[test]
fn every_injected_sidecar_env_parses_with_the_sidecars_parser() {
    let mut checked = 0;
    for (file, docs) in examples() {
        for profile in profiles() {
            for doc in &docs {
                let ns = doc
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                let m = match mutation::mutate(doc, Some(ns), &profile) {
                    Ok(Outcome::Mutated(m)) => m,
                    Ok(Outcome::NotManaged) => continue,
                    // A profile may refuse an example (a required claim):
                    // nothing reaches a sidecar then.
                    Err(_) => continue,
                };
                let Some(env) = sidecar_env(&m.object) else {
                    continue;
                };
                for (k, v) in &env {
                    assert!(
                        !k.starts_with("TRAINWIRE_")
                            || trainwire_contract::env::ALL.contains(&k.as_str()),
                        "{file} / {}: {k}={v} is not a contract variable",
                        profile.name
                    );
                }
                if let Err(e) = Config::from_source(&env) {
                    panic!(
                        "{file} / profile {}: the sidecar would not start: {e}\n{env:#?}",
                        profile.name
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} sidecars rendered");
}
