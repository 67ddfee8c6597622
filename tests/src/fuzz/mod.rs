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
//!
//! The mutations are in `fuzz/mutate.rs`, the seeds in `fuzz/seeds.rs`,
//! the oracles in `fuzz/oracles.rs`; this file runs the campaign.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainwire_contract::env;
use trainwire_engine::mutation::patch::apply_checked;
use trainwire_webhook::admission::{Admitter, Answer};
use trainwire_webhook::inject::{Options, render};
use trainwire_webhook::metrics::Metrics;
use trainwire_webhook::scale::StatefulSetCache;
use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

mod mutate;
mod oracles;
mod seeds;

pub use mutate::Rng;
use mutate::{STRINGS, edit_string, long_string, mutate_policy_value, mutate_text, mutate_value};
use oracles::{
    Verdict, check_env, check_policy, decode_patch, first_difference, sidecar_env_problem,
    sidecar_of,
};
pub use oracles::{grammar_round_trips, grammars_round_trip};
pub use seeds::Seeds;

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
