//! A structured-mutation fuzzer for trainwire's outside-input surfaces, on
//! stable Rust and without instrumentation: the admission handler
//! (`Admitter::admit`), offline `inject` (multi-document YAML, Lists, KRM
//! ResourceLists), the policy parser (`Policy::from_yaml`) and the sidecar's
//! env (`Config::from_source`, with the contract's grammars).
//!
//! Seeds are the real captures (`tests/fixtures/admission/`), the examples
//! and their renderings, and the policy test files; each input is a seed
//! (or an earlier input the engine accepted, fed back) changed by a few
//! mutations that know the shapes involved: trainwire's annotations with
//! values from a dictionary of edge cases, empty user fields, type swaps,
//! deleted or duplicated members, subtrees from other seeds, byte edits.
//!
//! Oracles, per input: no panic; bounded time ([`Limits`]) and peak memory;
//! every refusal carries a message; an answered patch applies to the object
//! as a kube-apiserver applies it (no `add` below a missing parent); the
//! engine is idempotent (admitting or injecting its own output changes
//! nothing); accepted grammar values round-trip (`parse(display(x)) == x`).
//!
//! Deterministic for a seed: a finding is reproduced by running the same
//! surface with the same seed and count. `cargo run --release -p
//! trainwire-tests --bin fuzz -- --help`; the campaign's figures are in
//! docs/benchmarks.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainwire_contract::config::Config;
use trainwire_contract::{
    ByteSize, Count, Detection, ExitCodes, FailureLimit, Grammar, LogFormat, MountPath, NodeCount,
    NodeFailureAction, PeerLossAction, PollMode, Port, PositiveCount, PositiveDuration, Quantity,
    RdzvBackend, ShmSize, env,
};
use trainwire_engine::mutation::patch::apply_checked;
use trainwire_webhook::admission::{Admitter, Answer};
use trainwire_webhook::inject::{Options, render};
use trainwire_webhook::metrics::Metrics;
use trainwire_webhook::scale::StatefulSetCache;
use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

/// A surface under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Admission,
    Inject,
    Policy,
    SidecarEnv,
}

impl Surface {
    pub const ALL: [Surface; 4] = [
        Surface::Admission,
        Surface::Inject,
        Surface::Policy,
        Surface::SidecarEnv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Surface::Admission => "admission",
            Surface::Inject => "inject",
            Surface::Policy => "policy",
            Surface::SidecarEnv => "sidecar-env",
        }
    }

    pub fn from_name(name: &str) -> Option<Surface> {
        Surface::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Bounds an input must stay within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Wall time of one input (all its oracles included).
    pub time: Duration,
    /// Peak resident memory of the process.
    pub peak_rss_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(2),
            peak_rss_mib: 1024,
        }
    }
}

/// One input that broke an oracle.
#[derive(Debug, Clone)]
pub struct Finding {
    pub surface: Surface,
    /// The input's number in the run (with the seed, reproduces it).
    pub index: u64,
    pub oracle: String,
    /// The input itself (truncated for the report).
    pub input: String,
}

/// What a run saw.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub inputs: u64,
    /// Inputs the surface refused (a 400, a refusal, an error) with a message.
    pub refused: u64,
    pub findings: Vec<Finding>,
    /// The slowest input.
    pub slowest: Duration,
    pub peak_rss_mib: u64,
    pub elapsed: Duration,
}

impl Report {
    pub fn summary(&self, surface: Surface, seed: u64) -> String {
        let mut s = format!(
            "{}: {} inputs (seed {seed}), {} refused with a message, {} findings, slowest input {:.1} ms, peak RSS {} MiB, {:.1} s",
            surface.name(),
            self.inputs,
            self.refused,
            self.findings.len(),
            self.slowest.as_secs_f64() * 1e3,
            self.peak_rss_mib,
            self.elapsed.as_secs_f64()
        );
        for f in self.findings.iter().take(20) {
            let _ = write!(
                s,
                "\n  finding at input {}: {}\n    input: {}",
                f.index, f.oracle, f.input
            );
        }
        s
    }
}

/// A small deterministic generator (xorshift64*): the fuzzer needs speed and
/// reproducibility, not statistical quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The annotations trainwire reads.
const ANNOTATIONS: &[&str] = &[
    "trainwire.dev/inject",
    "trainwire.dev/container",
    "trainwire.dev/nnodes",
    "trainwire.dev/nproc-per-node",
    "trainwire.dev/gpus-per-node",
    "trainwire.dev/rdzv-backend",
    "trainwire.dev/rdzv-port",
    "trainwire.dev/max-restarts",
    "trainwire.dev/checkpoint-pvc",
    "trainwire.dev/checkpoint-path",
    "trainwire.dev/checkpoint-max-age",
    "trainwire.dev/volumes",
    "trainwire.dev/nccl",
    "trainwire.dev/shm-size",
    "trainwire.dev/sidecar",
    "trainwire.dev/on-peer-loss",
    "trainwire.dev/fail-fast-exit-codes",
    "trainwire.dev/max-failures",
    "trainwire.dev/resume",
    "trainwire.dev/status",
];

/// Values that sit on the edges of the grammars.
const STRINGS: &[&str] = &[
    "",
    " ",
    "true",
    "True",
    "false",
    "yes",
    "0",
    "1",
    "2",
    "-1",
    "3:2",
    "2:8",
    "1:1",
    "0:0",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "1e3",
    "0.5",
    "NaN",
    "auto",
    "gpu",
    "cpu",
    "none",
    "c10d",
    "static",
    "etcd-v2",
    "etcd",
    "restart-workers",
    "restart-agent",
    "/checkpoints",
    "/ckpt /",
    "/ckpt ",
    " /ckpt",
    "/ ",
    "/k ",
    "//",
    "/a/../b",
    "/a,b",
    "/a:b",
    "ckpt",
    "data:/data:ro,out:/out",
    "data:/d /:ro",
    "data: /d",
    "a:/x,a:/x",
    "Data:/data",
    "NCCL_DEBUG=INFO,NCCL_IB_DISABLE=1",
    "NCCL_DEBUG=",
    "FOO=bar",
    "TORCH_NCCL_BLOCKING_WAIT=1",
    "8Gi",
    "512m",
    "1Mi",
    "off",
    "0Gi",
    "1.5Gi",
    "+1Gi",
    "1e9",
    "99999999999999999999Ei",
    "30m",
    "0s",
    "1h30m",
    "8761h",
    "500ms",
    "1,2,126-127",
    "300-2",
    "256",
    "3/10m",
    "3/0s",
    "trainer",
    "Trainer",
    "trainwire-sidecar",
    "NonIndexed",
    "Indexed",
    "Never",
    "OnFailure",
    "Always",
    "Failed",
    "TerminatingOrFailed",
    "{\"version\":\"0.1.0\",\"hash\":\"sha256:0\"}",
    "{}",
    "[]",
    "null",
    "ünïcödé",
    "\u{a0}/x\u{a0}",
    "a\nb",
    "\t",
    "x.y.z",
    "apps.kubernetes.io/pod-index",
];

/// Paths below a workload where users write things (and empty fields).
const TEMPLATE_SPOTS: &[(&str, &str, &str)] = &[
    (
        "/spec/template/spec/containers/0",
        "resources",
        r#"{"requests":{}}"#,
    ),
    (
        "/spec/template/spec/containers/0",
        "resources",
        r#"{"limits":{}}"#,
    ),
    (
        "/spec/template/spec/containers/0",
        "resources",
        r#"{"limits":{"nvidia.com/gpu":"2"}}"#,
    ),
    ("/spec/template/spec/containers/0", "env", "[]"),
    (
        "/spec/template/spec/containers/0",
        "env",
        r#"[{"name":"PET_NNODES","value":"9"}]"#,
    ),
    ("/spec/template/spec/containers/0", "volumeMounts", "[]"),
    (
        "/spec/template/spec/containers/0",
        "securityContext",
        r#"{"runAsNonRoot":true}"#,
    ),
    (
        "/spec/template/spec/containers/0",
        "securityContext",
        r#"{"runAsUser":1000}"#,
    ),
    ("/spec/template/spec", "volumes", "[]"),
    ("/spec/template/spec", "initContainers", "[]"),
    (
        "/spec/template/spec",
        "initContainers",
        r#"[{"name":"trainwire-sidecar","image":"x"}]"#,
    ),
    ("/spec/template/spec", "tolerations", "[]"),
    ("/spec/template/spec", "nodeSelector", "{}"),
    (
        "/spec/template/spec",
        "securityContext",
        r#"{"runAsNonRoot":true}"#,
    ),
    ("/spec/template/spec", "hostNetwork", "true"),
    ("/spec/template/spec", "shareProcessNamespace", "false"),
    ("/spec/template/spec", "subdomain", "\"other\""),
    ("/spec/template", "metadata", r#"{"annotations":{}}"#),
    ("/spec", "completionMode", "\"NonIndexed\""),
    ("/spec", "completions", "5"),
    ("/spec", "parallelism", "0"),
    ("/spec", "replicas", "0"),
    ("/spec", "replicas", "3"),
    ("/spec", "podReplacementPolicy", "\"Failed\""),
    ("/spec", "ordinals", r#"{"start":1}"#),
    ("/metadata", "annotations", "{}"),
    ("/metadata", "deletionTimestamp", "\"2026-01-01T00:00:00Z\""),
];

fn interesting_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0 => Value::Null,
        1 => json!({}),
        2 => json!([]),
        3 => json!(rng.chance(2)),
        4 => json!(*rng.pick(&[
            0i64,
            -1,
            1,
            2,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::MAX,
            1 << 53
        ])),
        5 => json!(*rng.pick(&[0.5f64, -0.0, 1e300, 2.5])),
        6 => json!(long_string(rng)),
        _ => json!(*rng.pick(STRINGS)),
    }
}

fn long_string(rng: &mut Rng) -> String {
    let unit = *rng.pick(&["a", ",", "x:/y,", "/", " ", "NCCL_A=1,", "é"]);
    unit.repeat(1 + rng.below(4096))
}

/// Every JSON pointer in `v` (at most `cap`).
fn pointers(v: &Value, at: &mut String, out: &mut Vec<String>, cap: usize) {
    if out.len() >= cap {
        return;
    }
    out.push(at.clone());
    let len = at.len();
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                at.push('/');
                at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                pointers(child, at, out, cap);
                at.truncate(len);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let _ = write!(at, "/{i}");
                pointers(child, at, out, cap);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

fn split_pointer(p: &str) -> Option<(&str, String)> {
    let (parent, last) = p.rsplit_once('/')?;
    Some((parent, last.replace("~1", "/").replace("~0", "~")))
}

/// One structured mutation of a JSON value; `donors` give subtrees.
fn mutate_value(rng: &mut Rng, v: &mut Value, donors: &[Value]) {
    let mut all = Vec::new();
    pointers(v, &mut String::new(), &mut all, 4096);
    let target = rng.pick(&all).clone();
    match rng.below(12) {
        // Replace a node by an interesting value.
        0 | 1 => {
            if let Some(node) = v.pointer_mut(&target) {
                *node = interesting_value(rng);
            }
        }
        // Delete a member or an element.
        2 => {
            if let Some((parent, key)) = split_pointer(&target)
                && let Some(p) = v.pointer_mut(parent)
            {
                match p {
                    Value::Object(m) => {
                        m.remove(&key);
                    }
                    Value::Array(a) => {
                        if let Ok(i) = key.parse::<usize>()
                            && i < a.len()
                        {
                            a.remove(i);
                        }
                    }
                    _ => {}
                }
            }
        }
        // Duplicate an array element.
        3 => {
            if let Some((parent, key)) = split_pointer(&target)
                && let Some(Value::Array(a)) = v.pointer_mut(parent)
                && let Ok(i) = key.parse::<usize>()
                && let Some(e) = a.get(i).cloned()
                && a.len() < 300
            {
                a.insert(i, e);
            }
        }
        // Swap the type of a scalar (a number as a string, and back).
        4 => {
            if let Some(node) = v.pointer_mut(&target) {
                *node = match node.take() {
                    Value::String(s) => s
                        .parse::<i64>()
                        .map(Value::from)
                        .or_else(|_| s.parse::<bool>().map(Value::from))
                        .unwrap_or(Value::String(s)),
                    Value::Number(n) => Value::String(n.to_string()),
                    Value::Bool(b) => Value::String(b.to_string()),
                    other => other,
                };
            }
        }
        // A trainwire annotation on the workload or its template.
        5 | 6 => {
            let at = *rng.pick(&[
                "/metadata",
                "/spec/template/metadata",
                "/request/object/metadata",
            ]);
            if let Some(Value::Object(m)) = v.pointer_mut(at) {
                let ann = m.entry("annotations").or_insert_with(|| json!({}));
                if let Value::Object(a) = ann {
                    a.insert(
                        (*rng.pick(ANNOTATIONS)).to_string(),
                        if rng.chance(8) {
                            interesting_value(rng)
                        } else {
                            json!(*rng.pick(STRINGS))
                        },
                    );
                }
            }
        }
        // A field users write, often empty.
        7 | 8 => {
            let (parent, key, value) = *rng.pick(TEMPLATE_SPOTS);
            let base = if v.pointer("/request/object").is_some() {
                "/request/object"
            } else {
                ""
            };
            if let Some(Value::Object(m)) = v.pointer_mut(&format!("{base}{parent}"))
                && let Ok(value) = serde_json::from_str(value)
            {
                m.insert(key.to_string(), value);
            }
        }
        // A subtree from another seed at the same place, or anywhere.
        9 => {
            if donors.is_empty() {
                return;
            }
            let donor = rng.pick(donors);
            let graft = donor.pointer(&target).cloned().unwrap_or_else(|| {
                let mut ps = Vec::new();
                pointers(donor, &mut String::new(), &mut ps, 4096);
                donor
                    .pointer(rng.pick::<String>(&ps))
                    .cloned()
                    .unwrap_or(Value::Null)
            });
            if let Some(node) = v.pointer_mut(&target) {
                *node = graft;
            }
        }
        // A string edited: a character or a blank added, cut short.
        _ => {
            if let Some(Value::String(s)) = v.pointer_mut(&target) {
                edit_string(rng, s);
            }
        }
    }
}

fn edit_string(rng: &mut Rng, s: &mut String) {
    let at = |rng: &mut Rng, s: &str| {
        let mut i = rng.below(s.len() + 1);
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    match rng.below(4) {
        0 => {
            let i = at(rng, s);
            s.insert(
                i,
                *rng.pick(&[' ', ',', ':', '/', '=', '\t', '\u{a0}', '-', '.', '0']),
            );
        }
        1 => {
            let i = at(rng, s);
            s.truncate(i);
        }
        2 => {
            let i = at(rng, s);
            let piece = rng.pick::<&str>(STRINGS);
            s.insert_str(i, piece);
        }
        _ => {
            if !s.is_empty() {
                let i = at(rng, s);
                let rest: String = s[i..].chars().skip(1).collect();
                s.truncate(i);
                s.push_str(&rest);
            }
        }
    }
}

/// Byte-level edits of a text (what a structured mutation never produces).
fn mutate_text(rng: &mut Rng, text: &mut String) {
    let mut bytes = std::mem::take(text).into_bytes();
    for _ in 0..1 + rng.below(4) {
        let i = rng.below(bytes.len() + 1);
        match rng.below(5) {
            0 if i < bytes.len() => {
                bytes.remove(i);
            }
            1 => bytes.insert(i, *rng.pick(b"{}[]:,\"\\ \n\t-#&*!|>'0aZ")),
            2 => bytes.truncate(i),
            3 if i < bytes.len() => bytes[i] ^= 1 << rng.below(8),
            _ => {
                let piece = *rng.pick(&[
                    "\n---\n",
                    "\n...\n",
                    " &a ",
                    " *a",
                    "<<: *a\n",
                    "? ",
                    "!!binary ",
                    "~",
                    "\n  - ",
                    "{",
                    "# c\n",
                ]);
                let mut j = i.min(bytes.len());
                while j > 0 && (bytes[j - 1] & 0xC0) == 0x80 {
                    j -= 1;
                }
                bytes.splice(j..j, piece.bytes());
            }
        }
    }
    *text = String::from_utf8_lossy(&bytes).into_owned();
}

/// Peak resident memory of this process, MiB (0 where unknown).
pub fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

fn clip(s: &str) -> String {
    const MAX: usize = 700;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

/// What one input came to.
enum Verdict {
    Accepted,
    Refused,
    Broken(String),
}

/// The seeds, read once.
pub struct Seeds {
    /// AdmissionReview bodies.
    reviews: Vec<Value>,
    /// Manifests: YAML texts.
    manifests: Vec<String>,
    /// Manifests as values (for structured mutations and ResourceLists).
    objects: Vec<Value>,
    policies: Vec<String>,
    envs: Vec<BTreeMap<String, String>>,
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

/// Runs `count` inputs of `surface` from `seed`; stops early after
/// `max_findings` findings.
pub fn run(
    surface: Surface,
    seeds: &Seeds,
    count: u64,
    seed: u64,
    limits: Limits,
    max_findings: usize,
) -> Report {
    run_with_progress(surface, seeds, count, seed, limits, max_findings, |_| {})
}

/// [`run`], calling `progress` with the report so far every
/// [`PROGRESS_EVERY`] inputs.
pub fn run_with_progress(
    surface: Surface,
    seeds: &Seeds,
    count: u64,
    seed: u64,
    limits: Limits,
    max_findings: usize,
    mut progress: impl FnMut(&Report),
) -> Report {
    let started = Instant::now();
    let mut rng = Rng::new(seed ^ ((surface as u64 + 1) << 32));
    let mut report = Report::default();
    let mut state = State::new(surface, seeds);
    // Panics are findings: keep their messages off the terminal.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for index in 0..count {
        let input = state.next_input(&mut rng, seeds);
        let t = Instant::now();
        let verdict =
            catch_unwind(AssertUnwindSafe(|| state.check(&input, seeds))).unwrap_or_else(|e| {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Verdict::Broken(format!("panic: {msg}"))
            });
        let took = t.elapsed();
        report.slowest = report.slowest.max(took);
        report.inputs += 1;
        let mut broken = match verdict {
            Verdict::Accepted => None,
            Verdict::Refused => {
                report.refused += 1;
                None
            }
            Verdict::Broken(why) => Some(why),
        };
        if broken.is_none() && took > limits.time {
            broken = Some(format!("took {took:?} (limit {:?})", limits.time));
        }
        if index % 1024 == 0 || broken.is_some() {
            let rss = peak_rss_mib();
            report.peak_rss_mib = report.peak_rss_mib.max(rss);
            if broken.is_none() && rss > limits.peak_rss_mib {
                broken = Some(format!(
                    "peak RSS {rss} MiB (limit {} MiB)",
                    limits.peak_rss_mib
                ));
            }
        }
        if report.inputs % PROGRESS_EVERY == 0 {
            report.elapsed = started.elapsed();
            progress(&report);
        }
        if let Some(oracle) = broken {
            let text = input.text();
            // The report holds a clipped input; `$TRAINWIRE_FUZZ_DUMP` names
            // a directory where each finding's whole input and oracle go,
            // to reproduce it without running the campaign again.
            if let Some(dir) = std::env::var_os(DUMP_ENV) {
                let path = std::path::Path::new(&dir)
                    .join(format!("{}-{seed}-{index}.txt", surface.name()));
                let _ = std::fs::write(path, format!("{oracle}\n---\n{text}"));
            }
            report.findings.push(Finding {
                surface,
                index,
                oracle,
                input: clip(&text),
            });
            if report.findings.len() >= max_findings {
                break;
            }
        }
    }
    std::panic::set_hook(hook);
    report.elapsed = started.elapsed();
    report
}

/// One kept input (a finding's, as [`DUMP_ENV`] writes it) through its
/// surface's oracles: `Ok(true)` accepted, `Ok(false)` refused with a
/// message, `Err` names the oracle it breaks. The sidecar-env surface's
/// inputs are maps, kept as unit tests beside the sidecar's parser instead.
pub fn replay(surface: Surface, text: &str, seeds: &Seeds) -> Result<bool, String> {
    let input = match surface {
        Surface::Admission => Input::Review(text.as_bytes().to_vec()),
        Surface::Inject => Input::Manifest(text.to_string()),
        Surface::Policy => Input::Policy(text.to_string()),
        Surface::SidecarEnv => {
            return Err("sidecar-env inputs are not replayed from text".into());
        }
    };
    match State::new(surface, seeds).check(&input, seeds) {
        Verdict::Accepted => Ok(true),
        Verdict::Refused => Ok(false),
        Verdict::Broken(why) => Err(why),
    }
}

/// A directory for every finding's whole input (see [`run_with_progress`]).
pub const DUMP_ENV: &str = "TRAINWIRE_FUZZ_DUMP";

/// How often [`run_with_progress`] reports.
pub const PROGRESS_EVERY: u64 = 50_000;

/// One input.
enum Input {
    Review(Vec<u8>),
    Manifest(String),
    Policy(String),
    Env(BTreeMap<String, String>),
}

impl Input {
    fn text(&self) -> String {
        match self {
            Input::Review(b) => String::from_utf8_lossy(b).into_owned(),
            Input::Manifest(s) | Input::Policy(s) => s.clone(),
            Input::Env(m) => format!("{m:?}"),
        }
    }
}

/// Per-surface state: the admitter, the options, and accepted outputs that
/// are fed back as inputs (bounded).
struct State {
    surface: Surface,
    admitter: Option<Admitter>,
    runtime: Option<tokio::runtime::Runtime>,
    options: Options,
    /// Reviews whose object the engine injected, re-admitted later.
    fed_back: Vec<Value>,
}

const FED_BACK: usize = 256;

impl State {
    fn new(surface: Surface, seeds: &Seeds) -> State {
        let policy = seeds
            .policies
            .first()
            .and_then(|p| Policy::from_yaml(p, "policy.yaml").ok())
            .unwrap_or_default();
        let (admitter, runtime) = if surface == Surface::Admission {
            (
                Some(Admitter {
                    policy: SharedPolicy::new(Policy::default()),
                    statefulsets: Arc::new(StatefulSetCache::unavailable("fuzzing".to_string())),
                    metrics: Arc::new(Metrics::new()),
                }),
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok(),
            )
        } else {
            (None, None)
        };
        State {
            surface,
            admitter,
            runtime,
            options: Options {
                policy,
                namespace: None,
            },
            fed_back: Vec::new(),
        }
    }

    fn next_input(&mut self, rng: &mut Rng, seeds: &Seeds) -> Input {
        let rounds = 1 + rng.below(4);
        match self.surface {
            Surface::Admission => {
                let mut review = if !self.fed_back.is_empty() && rng.chance(4) {
                    rng.pick(&self.fed_back).clone()
                } else {
                    rng.pick(&seeds.reviews).clone()
                };
                for _ in 0..rounds {
                    mutate_value(rng, &mut review, &seeds.reviews);
                }
                let mut body = serde_json::to_string(&review).unwrap_or_default();
                if rng.chance(16) {
                    mutate_text(rng, &mut body);
                }
                Input::Review(body.into_bytes())
            }
            Surface::Inject => {
                let text = match rng.below(6) {
                    // A seed manifest edited as text.
                    0 => {
                        let mut t = rng.pick(&seeds.manifests).clone();
                        mutate_text(rng, &mut t);
                        t
                    }
                    // A few objects mutated, as a KRM ResourceList.
                    1 => {
                        let mut items: Vec<Value> = (0..1 + rng.below(3))
                            .map(|_| rng.pick(&seeds.objects).clone())
                            .collect();
                        for _ in 0..rounds {
                            let i = rng.below(items.len());
                            mutate_value(rng, &mut items[i], &seeds.objects);
                        }
                        let mut list = json!({
                            "apiVersion": "config.kubernetes.io/v1",
                            "kind": "ResourceList",
                            "items": items,
                        });
                        if rng.chance(2) {
                            list["results"] = json!([{"message": "earlier", "severity": *rng.pick(&["error", "warning", "info", ""])}]);
                        }
                        if rng.chance(4) {
                            mutate_value(rng, &mut list, &[]);
                        }
                        serde_json::to_string_pretty(&list).unwrap_or_default()
                    }
                    // A v1 List.
                    2 => {
                        let mut items: Vec<Value> = (0..1 + rng.below(3))
                            .map(|_| rng.pick(&seeds.objects).clone())
                            .collect();
                        for _ in 0..rounds {
                            let i = rng.below(items.len());
                            mutate_value(rng, &mut items[i], &seeds.objects);
                        }
                        serde_json::to_string(
                            &json!({"apiVersion": "v1", "kind": "List", "items": items}),
                        )
                        .unwrap_or_default()
                    }
                    // Several documents, mutated structurally.
                    _ => {
                        let docs: Vec<String> = (0..1 + rng.below(3))
                            .map(|_| {
                                let mut o = rng.pick(&seeds.objects).clone();
                                for _ in 0..rounds {
                                    mutate_value(rng, &mut o, &seeds.objects);
                                }
                                serde_json::to_string_pretty(&o).unwrap_or_default()
                            })
                            .collect();
                        docs.join("\n---\n")
                    }
                };
                Input::Manifest(text)
            }
            Surface::Policy => {
                // The example policy half of the time: the test files are
                // broken on purpose.
                let mut text = if rng.chance(2) {
                    seeds.policies[0].clone()
                } else {
                    rng.pick(&seeds.policies).clone()
                };
                if rng.chance(4) {
                    mutate_text(rng, &mut text);
                } else if let Ok(mut v) = serde_saphyr::from_str::<Value>(&text) {
                    for _ in 0..rounds {
                        mutate_policy_value(rng, &mut v);
                    }
                    text = serde_json::to_string_pretty(&v).unwrap_or_default();
                } else {
                    mutate_text(rng, &mut text);
                }
                Input::Policy(text)
            }
            Surface::SidecarEnv => {
                let mut env = rng.pick(&seeds.envs).clone();
                for _ in 0..rounds {
                    let key = (*rng.pick(env::ALL)).to_string();
                    match rng.below(4) {
                        0 => {
                            env.remove(&key);
                        }
                        1 => {
                            if let Some(v) = env.get_mut(&key) {
                                edit_string(rng, v);
                            }
                        }
                        2 => {
                            env.insert(key, long_string(rng));
                        }
                        _ => {
                            env.insert(key, (*rng.pick(STRINGS)).to_string());
                        }
                    }
                }
                Input::Env(env)
            }
        }
    }

    fn check(&mut self, input: &Input, seeds: &Seeds) -> Verdict {
        match input {
            Input::Review(body) => self.check_review(body),
            Input::Manifest(text) => self.check_manifest(text),
            Input::Policy(text) => check_policy(text, seeds),
            Input::Env(env) => check_env(env),
        }
    }

    fn admit(&self, body: &[u8]) -> Option<Answer> {
        let (admitter, rt) = (self.admitter.as_ref()?, self.runtime.as_ref()?);
        Some(rt.block_on(admitter.admit(body)))
    }

    fn check_review(&mut self, body: &[u8]) -> Verdict {
        let Some(answer) = self.admit(body) else {
            return Verdict::Broken("no admitter".into());
        };
        let response = match answer {
            Answer::BadRequest(reason) if reason.trim().is_empty() => {
                return Verdict::Broken("a 400 without a reason".into());
            }
            Answer::BadRequest(_) => return Verdict::Refused,
            Answer::Review(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => v["response"].clone(),
                Err(e) => return Verdict::Broken(format!("the answer is not JSON: {e}")),
            },
        };
        if response["allowed"] != true {
            let message = response["status"]["message"].as_str().unwrap_or_default();
            if message.trim().is_empty() {
                return Verdict::Broken(format!("a refusal without a message: {response}"));
            }
            if message.contains("internal error") {
                return Verdict::Broken(format!("an internal error: {message}"));
            }
            return Verdict::Refused;
        }
        let Some(patch) = response["patch"].as_str() else {
            return Verdict::Accepted;
        };
        let Ok(review) = serde_json::from_slice::<Value>(body) else {
            return Verdict::Broken("a patch for a body that is not JSON".into());
        };
        let patch = match decode_patch(patch) {
            Ok(p) => p,
            Err(e) => return Verdict::Broken(e),
        };
        let object = &review["request"]["object"];
        let patched = match apply_checked(object, &patch) {
            Ok(p) => p,
            Err(e) => return Verdict::Broken(format!("the patch does not apply: {e}")),
        };
        // A sidecar trainwire wrote (not one the input already had) starts
        // with the env it was given, and watches the checkpoint directory
        // it was given as a mount.
        if sidecar_of(object).is_none()
            && let Some(problem) = sidecar_env_problem(&patched)
        {
            return Verdict::Broken(problem);
        }
        // Admitting the patched object again (the apiserver's reinvocation,
        // `kubectl apply` of the same manifest) changes nothing.
        let mut again = review.clone();
        again["request"]["object"] = patched;
        let body = serde_json::to_vec(&again).unwrap_or_default();
        match self.admit(&body) {
            Some(Answer::Review(bytes)) => {
                let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                let r = &v["response"];
                if r["allowed"] != true {
                    return Verdict::Broken(format!(
                        "the injected object is refused on re-admission: {}",
                        r["status"]["message"]
                    ));
                }
                if let Some(p) = r["patch"].as_str() {
                    let p = decode_patch(p).map(|p| serde_json::to_string(&p).unwrap_or_default());
                    return Verdict::Broken(format!("not idempotent: re-admission patches {p:?}"));
                }
            }
            other => {
                return Verdict::Broken(format!("re-admission answered {other:?}"));
            }
        }
        if self.fed_back.len() < FED_BACK {
            self.fed_back.push(again);
        } else {
            let i = (self.fed_back.len() * 7919 + body.len()) % FED_BACK;
            self.fed_back[i] = again;
        }
        Verdict::Accepted
    }

    fn check_manifest(&self, text: &str) -> Verdict {
        let rendered = match render(text, &self.options) {
            Ok(r) => r,
            Err(e) if e.to_string().trim().is_empty() => {
                return Verdict::Broken("an error without a message".into());
            }
            Err(_) => return Verdict::Refused,
        };
        if rendered.refusals.iter().any(|r| r.trim().is_empty()) {
            return Verdict::Broken("a refusal without a message".into());
        }
        if let Some(r) = rendered
            .refusals
            .iter()
            .find(|r| r.contains("internal error"))
        {
            return Verdict::Broken(format!("an internal error: {r}"));
        }
        if !rendered.refusals.is_empty() {
            return Verdict::Refused;
        }
        // Injecting the output again gives the same output.
        match render(&rendered.output, &self.options) {
            Ok(again) if !again.refusals.is_empty() => Verdict::Broken(format!(
                "the output is refused when injected again: {:?}",
                again.refusals
            )),
            Ok(again) if again.output != rendered.output => {
                if rendered.resource_list {
                    // A ResourceList's answer gains this run's results again;
                    // its items must not change.
                    let items = |t: &str| {
                        serde_saphyr::from_str::<Value>(t)
                            .ok()
                            .map(|v| v["items"].clone())
                    };
                    if items(&again.output) == items(&rendered.output) {
                        return Verdict::Accepted;
                    }
                }
                Verdict::Broken(format!(
                    "not idempotent: the output changes when injected again:\n{}",
                    clip(&first_difference(&rendered.output, &again.output))
                ))
            }
            Ok(_) => Verdict::Accepted,
            Err(e) => Verdict::Broken(format!("the output does not read back: {e}")),
        }
    }
}

fn sidecar_of(object: &Value) -> Option<&Value> {
    object
        .pointer("/spec/template/spec/initContainers")?
        .as_array()?
        .iter()
        .find(|c| c["name"] == "trainwire-sidecar")
}

/// The injected sidecar's env as the kubelet would give it (downward-API
/// values filled in), read by the sidecar's own parser: it must start, and
/// its checkpoint directory must be the path its checkpoint volume is
/// mounted at.
fn sidecar_env_problem(object: &Value) -> Option<String> {
    let sidecar = sidecar_of(object)?;
    // A StatefulSet paused at `replicas: 0` has no world size (and no pod
    // for a sidecar to run in) until it is scaled up, which re-injects.
    // (The status records no world size then.)
    let status = object
        .pointer("/spec/template/metadata/annotations/trainwire.dev~1status")
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str::<Value>(s).ok());
    if status.is_some_and(|s| s["nnodes"] == "") {
        return None;
    }
    let env: BTreeMap<String, String> = sidecar["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let value = match e["value"].as_str() {
                Some(v) => v.to_string(),
                None => match e.pointer("/valueFrom/fieldRef/fieldPath")?.as_str()? {
                    "metadata.name" => "w-0".to_string(),
                    "metadata.namespace" => "default".to_string(),
                    "metadata.uid" => "8d1c".to_string(),
                    _ => "0".to_string(),
                },
            };
            Some((e["name"].as_str()?.to_string(), value))
        })
        .collect();
    let config = match Config::from_source(&env) {
        Ok(c) => c,
        Err(e) => return Some(format!("the injected sidecar would not start: {e}")),
    };
    let dir = config.checkpoint.as_ref()?.dir.display().to_string();
    let mounted = sidecar["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["mountPath"].as_str() == Some(dir.as_str()));
    (!mounted).then(|| {
        format!(
            "the sidecar watches {dir:?}, which is not among its mounts {}",
            sidecar["volumeMounts"]
        )
    })
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: {x:?} became {y:?}", i + 1);
        }
    }
    format!("{} lines became {}", a.lines().count(), b.lines().count())
}

fn decode_patch(b64: &str) -> Result<json_patch::Patch, String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("the patch is not a JSON Patch: {e}"))
}

/// Structured mutations of a policy document.
fn mutate_policy_value(rng: &mut Rng, v: &mut Value) {
    const FIELDS: &[(&str, &str)] = &[
        // Accepted ones, so the engine runs under mutated policies.
        ("checkpointPath", r#"{"value": "/data/ckpt"}"#),
        (
            "checkpointMaxAge",
            r#"{"value": "1h", "enforce": "refuse"}"#,
        ),
        ("shmSize", r#"{"value": "64Gi", "enforce": "overwrite"}"#),
        ("shmSize", r#"{"value": "off"}"#),
        ("maxNodes", "1"),
        ("maxGpusPerNode", "8"),
        (
            "nccl",
            r#"{"NCCL_SOCKET_IFNAME": {"value": "eth0", "enforce": "overwrite"}}"#,
        ),
        (
            "tolerations",
            r#"[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]"#,
        ),
        ("nodeSelector", r#"{"pool": "gpu"}"#),
        ("nodeFailure", r#"{"reclaimAfter": "30s"}"#),
        (
            "crashLoop",
            r#"{"failFastExitCodes": "1,2", "maxFailures": "3/10m"}"#,
        ),
        (
            "sidecar",
            r#"{"runAsUser": 1000, "onPeerLoss": {"value": "none", "enforce": "refuse"}}"#,
        ),
        (
            "sidecar",
            r#"{"image": {"value": "registry.example/sidecar:9"}}"#,
        ),
        (
            "checkpoint",
            r#"{"claim": "{namespace}-ckpt", "mountPath": "/ckpt", "enforce": "overwrite"}"#,
        ),
        ("allowedClaims", r#"["{namespace}-*", "ckpt"]"#),
        // Refused ones.
        ("checkpointPath", r#"{"value": "/ckpt /"}"#),
        ("checkpointPath", r#"{"value": "/ckpt "}"#),
        (
            "checkpointPath",
            r#"{"value": "/data/ckpt", "enforce": "refuse"}"#,
        ),
        ("checkpointMaxAge", r#"{"value": "0s"}"#),
        ("shmSize", r#"{"value": "512m"}"#),
        ("shmSize", r#"{"value": "off", "enforce": "overwrite"}"#),
        ("maxNodes", "0"),
        ("maxNodes", "4294967296"),
        ("maxGpusPerNode", "-1"),
        ("rdzvBackend", r#"{"value": "etcd-v2"}"#),
        ("etcdEndpoint", r#""[fd00::5]:2379""#),
        ("allowedClaims", r#"["{namespace}-*", "["]"#),
        ("namespaces", r#"["*", ""]"#),
        ("nodeFailureTolerationSeconds", r#"{"value": -5}"#),
        (
            "nodeFailure",
            r#"{"reclaimAfter": "30s", "maxPodsPerMinute": 0}"#,
        ),
        (
            "crashLoop",
            r#"{"failFastExitCodes": "300", "maxFailures": "3/0s"}"#,
        ),
        (
            "checkpoint",
            r#"{"claim": "{namespace}-ckpt", "mountPath": "/ c", "enforce": "overwrite"}"#,
        ),
        (
            "sidecar",
            r#"{"env": {"TRAINWIRE_HEARTBEAT_MISSES": "0", "TRAINWIRE_AGENT_MATCH": ""}}"#,
        ),
        (
            "sidecar",
            r#"{"image": {"value": "not an image"}, "runAsUser": -1}"#,
        ),
        (
            "nccl",
            r#"{"NCCL_DEBUG": {"value": "INFO", "enforce": "refuse"}, "FOO": {"value": "1"}}"#,
        ),
        (
            "tolerations",
            r#"[{"key": "k", "operator": "Exists", "value": "v"}]"#,
        ),
        ("nodeSelector", r#"{"": "x"}"#),
        ("clusterDomain", r#""..""#),
    ];
    if rng.chance(4) {
        mutate_value(rng, v, &[]);
        return;
    }
    let profiles = v.pointer_mut("/profiles").and_then(Value::as_array_mut);
    let Some(profiles) = profiles.filter(|p| !p.is_empty()) else {
        mutate_value(rng, v, &[]);
        return;
    };
    let i = rng.below(profiles.len());
    let (key, value) = *rng.pick(FIELDS);
    if let (Value::Object(p), Ok(value)) = (&mut profiles[i], serde_json::from_str(value)) {
        p.insert(key.to_string(), value);
    }
}

/// The policy parser: a refusal has diagnostics, each with a message (and,
/// from the file's own text, a line); an accepted policy runs the engine on
/// a captured workload for each of its profiles without a broken oracle.
fn check_policy(text: &str, seeds: &Seeds) -> Verdict {
    match Policy::from_yaml(text, "fuzz.yaml") {
        Err(e) => {
            let shown = e.to_string();
            if shown.trim().is_empty() {
                return Verdict::Broken("a refusal without a message".into());
            }
            if e.diagnostics().is_empty() {
                return Verdict::Broken(format!("a refusal without diagnostics: {shown}"));
            }
            if let Some(d) = e.diagnostics().iter().find(|d| d.message.trim().is_empty()) {
                return Verdict::Broken(format!("a diagnostic without a message: {d}"));
            }
            Verdict::Refused
        }
        Ok(policy) => {
            policy.prepare();
            for r in seeds.reviews.iter().take(4) {
                let object = &r["request"]["object"];
                let ns = r["request"]["namespace"].as_str().unwrap_or("default");
                let profile = policy.profile_for(ns);
                if let Ok(trainwire_engine::mutation::Outcome::Mutated(m)) =
                    trainwire_engine::mutation::mutate(object, Some(ns), &profile)
                {
                    if let Err(e) = apply_checked(object, &m.patch) {
                        return Verdict::Broken(format!(
                            "under this policy the patch does not apply: {e}"
                        ));
                    }
                    match trainwire_engine::mutation::mutate(&m.object, Some(ns), &profile) {
                        Ok(trainwire_engine::mutation::Outcome::Mutated(again))
                            if again.patch.0.is_empty() => {}
                        other => {
                            return Verdict::Broken(format!(
                                "under this policy, not idempotent: {other:?}"
                            ));
                        }
                    }
                }
            }
            Verdict::Accepted
        }
    }
}

/// The sidecar's env: an error names its variable (one of the contract's)
/// and the value; every value given to any contract grammar that accepts it
/// round-trips.
fn check_env(env: &BTreeMap<String, String>) -> Verdict {
    for v in env.values() {
        if let Err(why) = grammars_round_trip(v) {
            return Verdict::Broken(why);
        }
    }
    match Config::from_source(env) {
        Ok(_) => Verdict::Accepted,
        Err(e) => {
            let text = e.to_string();
            if !env::ALL.contains(&e.var()) {
                return Verdict::Broken(format!("an error about an unknown variable: {text}"));
            }
            if !text.contains(e.var()) {
                return Verdict::Broken(format!(
                    "an error that does not name its variable: {text}"
                ));
            }
            Verdict::Refused
        }
    }
}

/// `text` read by every grammar of the contract: where one accepts it, its
/// display reads back to the same value through `FromStr`, [`Grammar::read`]
/// and serde, and is unchanged by a trim.
pub fn grammars_round_trip(text: &str) -> Result<(), String> {
    let one = |f: fn(&str, &str) -> Result<(), String>, name: &str| f(name, text);
    one(grammar_round_trips::<MountPath>, "MountPath")?;
    one(grammar_round_trips::<PositiveDuration>, "PositiveDuration")?;
    one(
        grammar_round_trips::<trainwire_contract::Duration>,
        "Duration",
    )?;
    one(grammar_round_trips::<Quantity>, "Quantity")?;
    one(grammar_round_trips::<ByteSize>, "ByteSize")?;
    one(grammar_round_trips::<ShmSize>, "ShmSize")?;
    one(grammar_round_trips::<Count>, "Count")?;
    one(grammar_round_trips::<PositiveCount>, "PositiveCount")?;
    one(grammar_round_trips::<NodeCount>, "NodeCount")?;
    one(grammar_round_trips::<Port>, "Port")?;
    one(grammar_round_trips::<PeerLossAction>, "PeerLossAction")?;
    one(grammar_round_trips::<Detection>, "Detection")?;
    one(grammar_round_trips::<PollMode>, "PollMode")?;
    one(grammar_round_trips::<LogFormat>, "LogFormat")?;
    one(grammar_round_trips::<RdzvBackend>, "RdzvBackend")?;
    one(grammar_round_trips::<ExitCodes>, "ExitCodes")?;
    one(grammar_round_trips::<FailureLimit>, "FailureLimit")?;
    one(
        grammar_round_trips::<NodeFailureAction>,
        "NodeFailureAction",
    )?;
    Ok(())
}

/// `text` read by the grammar `T` (named `name` in the report): where it is
/// accepted, its display reads back to the same value through `FromStr`,
/// [`Grammar::read`] and serde, and is unchanged by a trim; `read` and
/// `parse` agree on a text without blanks around it.
pub fn grammar_round_trips<T>(name: &str, text: &str) -> Result<(), String>
where
    T: Grammar + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    {
        let read = T::read(text);
        let parsed = text.trim().parse::<T>();
        if let (Ok(a), Err(_)) | (Err(_), Ok(a)) = (&read, &parsed)
            && text.trim() == text
        {
            return Err(format!(
                "{name}: read and parse disagree on {text:?} ({a:?})"
            ));
        }
        if let Ok(x) = read {
            let shown = x.to_string();
            if shown.trim() != shown {
                return Err(format!(
                    "{name}: {text:?} displays as {shown:?}, with blanks around"
                ));
            }
            match shown.parse::<T>() {
                Ok(y) if y == x => {}
                other => {
                    return Err(format!(
                        "{name}: {text:?} displays as {shown:?}, which reads back as {other:?}"
                    ));
                }
            }
            match T::read(&shown) {
                Ok(y) if y == x => {}
                other => return Err(format!("{name}: read({shown:?}) gives {other:?}")),
            }
            let json = serde_json::to_string(&x).map_err(|e| e.to_string())?;
            match serde_json::from_str::<T>(&json) {
                Ok(y) if y == x => {}
                other => return Err(format!("{name}: serde of {text:?} gives {other:?}")),
            }
        }
    }
    Ok(())
}
