//! The fuzzer's oracles: what an answer, a rendering, a policy or the
//! sidecar's env must satisfy for an input to pass.

use std::collections::BTreeMap;

use serde_json::Value;
use trainwire_contract::config::Config;
use trainwire_contract::{
    ByteSize, Count, Detection, ExitCodes, FailureLimit, Grammar, LogFormat, MountPath, NodeCount,
    NodeFailureAction, PeerLossAction, PollMode, Port, PositiveCount, PositiveDuration, Quantity,
    RdzvBackend, ShmSize, env,
};
use trainwire_engine::mutation::patch::apply_checked;
use trainwire_engine::policy::Policy;

use super::seeds::Seeds;

/// What one input came to.
pub(super) enum Verdict {
    Accepted,
    Refused,
    Broken(String),
}

pub(super) fn sidecar_of(object: &Value) -> Option<&Value> {
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
pub(super) fn sidecar_env_problem(object: &Value) -> Option<String> {
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

pub(super) fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: {x:?} became {y:?}", i + 1);
        }
    }
    format!("{} lines became {}", a.lines().count(), b.lines().count())
}

pub(super) fn decode_patch(b64: &str) -> Result<json_patch::Patch, String> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("the patch is not base64: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("the patch is not a JSON Patch: {e}"))
}

/// The policy parser: a refusal has diagnostics, each with a message (and,
/// from the file's own text, a line); an accepted policy runs the engine on
/// a captured workload for each of its profiles without a broken oracle.
pub(super) fn check_policy(text: &str, seeds: &Seeds) -> Verdict {
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
pub(super) fn check_env(env: &BTreeMap<String, String>) -> Verdict {
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
