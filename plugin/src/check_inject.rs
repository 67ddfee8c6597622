//! `check-inject`: would the webhook inject this workload as it is stored
//! now, with which policy profile, and what would it warn about. The
//! webhook's own engine ([`trainwire_engine::mutation::mutate`]) runs here
//! on the stored object, as `trainwire-webhook inject` runs it offline.
//!
//! The policy: `--policy FILE`, else the webhook's ConfigMap
//! (`trainwire-policy`, key `policy.yaml`) when this user may read it, else
//! the embedded defaults (the report says which). The webhook's
//! `--sidecar-image` and `--cluster-domain` flags are not visible from the
//! API: the verdict and the warnings do not depend on them.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use serde::Serialize;
use trainwire_engine::mutation::{self, Outcome, annotations as ann};
use trainwire_engine::policy::{Policy, PolicyError};

use crate::cluster;
use crate::{Error, Result};

/// The webhook's policy ConfigMap and its key.
pub const POLICY_CONFIGMAP: &str = "trainwire-policy";
pub const POLICY_KEY: &str = "policy.yaml";

/// The engine's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It would be injected (or is, and would stay as it is).
    Inject,
    /// It would be let through untouched.
    Skip,
    /// It would be refused.
    Refuse,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// The `trainwire.dev/inject` value as stored, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opt_in: Option<String>,
    /// Whether its pod template already carries trainwire's injection.
    pub injected: bool,
    pub verdict: Verdict,
    /// Why: the refusal, or why it is skipped, or what injecting changes.
    pub reason: String,
    /// The policy profile that applies to the namespace.
    pub profile: String,
    /// Where the policy came from.
    pub policy: String,
    /// JSON Patch operations the webhook would apply (0: as it is).
    pub changes: usize,
    pub warnings: Vec<String>,
}

/// The policy to judge with, and where it came from.
async fn policy_for(
    client: &Client,
    file: Option<&Path>,
    policy_namespace: &str,
) -> Result<(Policy, String)> {
    if let Some(path) = file {
        let file = path.display().to_string();
        let p = std::fs::read_to_string(path)
            .map_err(|error| PolicyError::Read {
                path: file.clone(),
                error,
            })
            .and_then(|text| Policy::from_yaml(&text, &file))
            .map_err(|e| Error::Policy {
                file: file.clone(),
                message: e.to_string(),
            })?;
        return Ok((p, format!("file {}", path.display())));
    }
    let source = format!("ConfigMap {policy_namespace}/{POLICY_CONFIGMAP}");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), policy_namespace);
    let text = match api.get_opt(POLICY_CONFIGMAP).await {
        Ok(Some(cm)) => cm.data.and_then(|mut d| d.remove(POLICY_KEY)),
        Ok(None) => None,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            return Ok((
                Policy::default(),
                format!(
                    "embedded defaults ({source} is not readable with these credentials; --policy FILE judges with a file)"
                ),
            ));
        }
        Err(source) => {
            return Err(Error::Api {
                what: format!("reading the policy ConfigMap {policy_namespace}/{POLICY_CONFIGMAP}"),
                source,
            });
        }
    };
    match text {
        None => Ok((
            Policy::default(),
            format!("embedded defaults (no {source} with a {POLICY_KEY} key)"),
        )),
        Some(text) => Policy::from_yaml(&text, &source)
            .map(|p| (p, source.clone()))
            .map_err(|e| Error::Policy {
                file: source,
                message: e.to_string(),
            }),
    }
}

/// Judge the workload `name` of `namespace`.
pub async fn check(
    client: &Client,
    namespace: &str,
    name: &str,
    policy_file: Option<&Path>,
    policy_namespace: &str,
) -> Result<Report> {
    let workload = cluster::workload(client, namespace, name).await?;
    let (policy, source) = policy_for(client, policy_file, policy_namespace).await?;
    let profile = policy.profile_for(namespace).into_owned();
    let object = workload.to_json();
    let opt_in = workload
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ann::INJECT))
        .cloned();
    let injected = crate::status::managed(&workload) && {
        object
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.as_object())
            .is_some_and(|a| a.contains_key(ann::STATUS))
    };
    let (verdict, reason, changes, warnings) = match mutation::mutate(
        &object,
        Some(namespace),
        &profile,
    ) {
        Err(refusal) => (Verdict::Refuse, refusal.to_string(), 0, Vec::new()),
        Ok(Outcome::NotManaged) => {
            let why = match &opt_in {
                None => format!("no {} annotation", ann::INJECT),
                Some(v) => format!("{}: {v:?} (only \"true\" opts in)", ann::INJECT),
            };
            // What `inject` warns about a workload it leaves alone (a
            // misspelt opt-in key, an opt-in on a kind trainwire does not
            // manage): the likely reason it is not injected.
            (
                Verdict::Skip,
                why,
                0,
                mutation::not_managed_warnings(&object),
            )
        }
        Ok(Outcome::Mutated(m)) => {
            let n = m.patch.0.len();
            let why = if n == 0 {
                "already injected as the policy asks; admission would change nothing".to_string()
            } else if injected {
                format!(
                    "injected, but not as this policy would now: the next change re-injects ({n} patch operations)"
                )
            } else {
                format!("{n} patch operations")
            };
            (Verdict::Inject, why, n, m.warnings)
        }
    };
    Ok(Report {
        kind: workload.kind().to_string(),
        name: workload.name(),
        namespace: namespace.to_string(),
        opt_in,
        injected,
        verdict,
        reason,
        profile: profile.name.clone(),
        policy: source,
        changes,
        warnings,
    })
}
