//! The house's rules, as each crate's `lib.rs` states them: which crate may
//! depend on which (`cargo metadata`, the normal dependencies, transitively),
//! and no import circle between the files of any crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// Packages a crate must not reach through its normal dependencies, with
/// the reason its `lib.rs` gives.
const FORBIDDEN: &[(&str, &[&str], &str)] = &[
    (
        "trainwire-engine",
        &[
            "tokio",
            "hyper",
            "kube-client",
            "kube-runtime",
            "tracing",
            "trainwire-runtime",
            "trainwire-policyfile",
            "trainwire-webhook",
            "trainwire-controllers",
            "trainwire-sidecar",
        ],
        "the engine is pure: no runtime, no client, no log, no program",
    ),
    (
        "trainwire-contract",
        &[
            "tokio",
            "k8s-openapi",
            "trainwire-engine",
            "trainwire-runtime",
        ],
        "the contract is values and names only",
    ),
    (
        "trainwire-webhook",
        &[
            "trainwire-controllers",
            "trainwire-sidecar",
            "kube-lease-manager",
        ],
        "the admission server links no controller",
    ),
    (
        "trainwire-controllers",
        &[
            "trainwire-webhook",
            "trainwire-sidecar",
            "rcgen",
            "x509-parser",
        ],
        "the controllers link no admission server",
    ),
    (
        "trainwire-policyfile",
        &["kube-client", "trainwire-webhook", "trainwire-controllers"],
        "the policy file is read the same by both cluster programs",
    ),
    (
        "kubectl-trainwire",
        &[
            "trainwire-webhook",
            "trainwire-controllers",
            "trainwire-sidecar",
            "axum",
            "rcgen",
            "kube-lease-manager",
        ],
        "the plugin links neither server",
    ),
    (
        "trainwire-sidecar",
        &[
            "trainwire-engine",
            "trainwire-webhook",
            "trainwire-controllers",
        ],
        "the sidecar speaks to the others through the contract only",
    ),
];

/// The host's target triple (`rustc -vV`): the dependencies of other
/// platforms are not resolved offline.
fn host() -> Result<String> {
    let out = std::process::Command::new("rustc").arg("-vV").output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .context("rustc -vV names no host")
}

fn metadata() -> Result<Value> {
    let root = trainwire_test_support::repo_root();
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", &host()?])
        .current_dir(&root)
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Every package's name and its normal (not dev, not build) dependencies.
fn normal_dependencies(meta: &Value) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let names: BTreeMap<&str, &str> = meta["packages"]
        .as_array()
        .context("packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
        .collect();
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().context("resolve")? {
        let id = node["id"].as_str().context("id")?;
        let name = names.get(id).context("a node's package")?;
        let deps: BTreeSet<String> = node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null())
            })
            .filter_map(|d| names.get(d["pkg"].as_str()?).map(|n| n.to_string()))
            .collect();
        graph
            .entry(name.to_string())
            .or_insert_with(BTreeSet::new)
            .extend(deps);
    }
    Ok(graph)
}

fn reach(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(p) = todo.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn no_crate_depends_on_what_its_doc_forbids() -> Result<()> {
    let graph = normal_dependencies(&metadata()?)?;
    let mut broken = Vec::new();
    for (krate, forbidden, why) in FORBIDDEN {
        assert!(
            graph.contains_key(*krate),
            "{krate} is not in the workspace"
        );
        let reached = reach(&graph, krate);
        for f in *forbidden {
            if reached.contains(*f) {
                broken.push(format!("{krate} reaches {f} ({why})"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    Ok(())
}

/// One crate's files as modules: `a/b.rs` and `a/b/mod.rs` are `a::b`,
/// `lib.rs` and `main.rs` the root. Test modules (`tests.rs` files and
/// inline `mod tests`) are left out: they may import anything above them.
fn modules(src: &Path) -> Result<BTreeMap<Vec<String>, PathBuf>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![src.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src)?;
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if rel.starts_with("bin") {
                continue;
            }
            match parts.last().map(String::as_str) {
                Some("mod") => {
                    parts.pop();
                }
                Some("lib") | Some("main") if parts.len() == 1 => parts.clear(),
                Some("tests") => continue,
                _ => {}
            }
            out.insert(parts, path);
        }
    }
    Ok(out)
}

/// The code of a file before its inline test module, without comments
/// (a doc link is not an import).
fn code_of(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)?;
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => &text,
    };
    Ok(code
        .lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The modules a file names through `crate::` and `super::` paths
/// (also inside `use` groups: `use super::{a, b::C}`).
fn references(
    module: &[String],
    code: &str,
    known: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let tokens: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{' || c == ','))
        .filter(|t| !t.is_empty())
        .collect();
    let parent: Vec<String> = module[..module.len().saturating_sub(1)].to_vec();
    for token in tokens {
        for (prefix, base) in [("crate::", Vec::new()), ("super::", parent.clone())] {
            let Some(rest) = token.strip_prefix(prefix) else {
                continue;
            };
            // `a::b::{c, d::E}` → a::b::c, a::b::d::E
            let (head, group) = match rest.split_once('{') {
                Some((h, g)) => (h.trim_end_matches("::"), Some(g)),
                None => (rest, None),
            };
            let mut paths: Vec<Vec<String>> = Vec::new();
            let head: Vec<String> = head
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            match group {
                Some(g) => {
                    for item in g.split(',') {
                        let mut p = head.clone();
                        p.extend(
                            item.split("::")
                                .filter(|s| !s.is_empty())
                                .map(str::to_string),
                        );
                        paths.push(p);
                    }
                }
                None => paths.push(head),
            }
            for p in paths {
                let mut full = base.clone();
                full.extend(p);
                // The longest prefix that is a module of this crate.
                while !full.is_empty() && !known.contains(&full) {
                    full.pop();
                }
                if !full.is_empty() && full != module {
                    out.insert(full);
                }
            }
        }
    }
    out
}

/// A circle among the modules, if any.
fn circle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<Vec<String>, Mark>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut c = stack[at..].to_vec();
                c.push(node.clone());
                return Some(c);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        let mut stack = Vec::new();
        if let Some(c) = visit(node, graph, &mut marks, &mut stack) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_import_circle_in_any_crate() -> Result<()> {
    let root = trainwire_test_support::repo_root();
    let crates = [
        "contract",
        "engine",
        "runtime",
        "policyfile",
        "webhook",
        "controllers",
        "sidecar",
        "plugin",
        "test-support",
        "tests",
    ];
    for krate in crates {
        let src = root.join(krate).join("src");
        let modules = modules(&src)?;
        let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
        let mut graph = BTreeMap::new();
        for (module, path) in &modules {
            // The root only declares the modules; a folder's mod.rs is its
            // folder's root and may name its children.
            let refs: BTreeSet<Vec<String>> = references(module, &code_of(path)?, &known)
                .into_iter()
                .filter(|r| !r.starts_with(module) && !module.is_empty())
                .collect();
            graph.insert(module.clone(), refs);
        }
        if let Some(c) = circle(&graph) {
            let shown: Vec<String> = c
                .iter()
                .map(|m| {
                    if m.is_empty() {
                        "crate".to_string()
                    } else {
                        m.join("::")
                    }
                })
                .collect();
            bail!("{krate}: an import circle: {}", shown.join(" -> "));
        }
    }
    Ok(())
}

#[test]
fn the_circle_finder_finds_a_circle() {
    let m = |s: &str| -> Vec<String> { s.split("::").map(str::to_string).collect() };
    let known: BTreeSet<Vec<String>> = [m("a"), m("b"), m("c"), m("c::d")].into_iter().collect();
    let refs = references(
        &m("a"),
        "use crate::b::Thing;\nuse super::{c::d::X, b};",
        &known,
    );
    assert_eq!(refs, [m("b"), m("c::d")].into_iter().collect());
    let graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = [
        (m("a"), [m("b")].into_iter().collect()),
        (m("b"), [m("c::d")].into_iter().collect()),
        (m("c::d"), [m("a")].into_iter().collect()),
        (m("c"), BTreeSet::new()),
    ]
    .into_iter()
    .collect();
    let found = circle(&graph).expect("a circle");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
    let without: BTreeMap<_, _> = graph.into_iter().filter(|(k, _)| *k != m("c::d")).collect();
    assert_eq!(circle(&without), None);
}
