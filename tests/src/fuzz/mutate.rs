//! The fuzzer's structured mutations: values from a dictionary of edge
//! cases, type swaps, deleted or duplicated members, subtrees from other
//! seeds, byte edits, and a policy document's fields.

use std::fmt::Write as _;

use serde_json::{Value, json};

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
pub(super) const STRINGS: &[&str] = &[
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

pub(super) fn long_string(rng: &mut Rng) -> String {
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
pub(super) fn mutate_value(rng: &mut Rng, v: &mut Value, donors: &[Value]) {
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

pub(super) fn edit_string(rng: &mut Rng, s: &mut String) {
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
pub(super) fn mutate_text(rng: &mut Rng, text: &mut String) {
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

/// Structured mutations of a policy document.
pub(super) fn mutate_policy_value(rng: &mut Rng, v: &mut Value) {
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
