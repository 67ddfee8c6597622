//! The injected-status annotation, `trainwire.dev/status` on the pod template
//! (like Istio's `sidecar.istio.io/status`): the engine version, a hash of the
//! inputs, and a fingerprint of every entry trainwire added or replaced.
//!
//! It makes re-injection correct, not just idempotent. Before injecting, the
//! engine [`strip`]s what an earlier injection added, so a changed input (say
//! `replicas` 2 → 3 through `kubectl apply`) recomputes trainwire's entries
//! (`PET_NNODES=3`). An entry whose fingerprint no longer matches was edited
//! by the user after injection: it is the user's now and is kept. Same input
//! hash: nothing changes at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, PodTemplateSpec, Toleration, Volume};
use serde::{Deserialize, Serialize};

use trainwire_contract::annotations::STATUS;

/// The engine version recorded in the status.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What one injection added. Maps go from an entry's identity (env name,
/// mount path, volume name, ...) to the fingerprint of what trainwire wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Status {
    pub version: String,
    /// `sha256:` of the workload with trainwire's entries stripped, the
    /// namespace, the profile and the engine version.
    pub hash: String,
    /// The world size injected (`N` or `MIN:MAX`); the scale guard reads it.
    pub nnodes: String,
    /// The trainer container.
    pub container: String,
    /// The headless Service the pods' DNS names hang on (`spec.serviceName`
    /// or the template's `subdomain`); the reconciler reads it. Empty in a
    /// status written by trainwire 0.1.0.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// The port of the c10d store on pod 0 as the trainer will use it (the
    /// manifest's `PET_RDZV_ENDPOINT` when it set one); `None` with an
    /// external store (etcd). The reconciler's Service exposes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdzv_port: Option<u16>,
    /// The sidecar's port; `None` without trainwire's sidecar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar_port: Option<u16>,
    /// The dedicated rendezvous store's Service and Deployment (`<name>-rdzv`),
    /// which the reconciler keeps; empty with the store on pod 0.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rdzv_store: String,
    /// Hot spares: pods beyond the world's size (`nnodes`); the scale guard
    /// and the world status read it.
    #[serde(skip_serializing_if = "is_zero")]
    pub spares: u32,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Env values the user had that trainwire replaced (a policy overwrite, or
    /// the merged `PET_RDZV_CONF`): restored before re-injecting.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replaced_env: BTreeMap<String, EnvVar>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub volume_mounts: BTreeMap<String, String>,
    /// `limits/nvidia.com/gpu` → the quantity trainwire set.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub volumes: BTreeMap<String, String>,
    /// Volumes the user had that a policy overwrote (by name).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replaced_volumes: BTreeMap<String, Volume>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub init_containers: BTreeMap<String, String>,
    /// Fingerprints of added tolerations.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<String>,
    /// Tolerations the user had that a policy overwrote: fingerprint of the
    /// new one → the original.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replaced_tolerations: BTreeMap<String, Toleration>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replaced_node_selector: BTreeMap<String, String>,
    /// Scalar fields trainwire set because they were absent
    /// (`shareProcessNamespace`, `subdomain`, `completionMode`, `completions`,
    /// a Job's `podFailurePolicy` or `successPolicy`), or replaced: `completionMode=NonIndexed`,
    /// `podReplacementPolicy` (was
    /// absent) or `podReplacementPolicy=<previous value>`, `dnsPolicy` (was
    /// absent) or `dnsPolicy=ClusterFirst` (on the host's network).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The status recorded on a template, if any and readable.
pub fn read(template: &PodTemplateSpec) -> Option<Status> {
    let raw = template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(STATUS)?;
    if raw.len() > MAX_STATUS_BYTES {
        return None;
    }
    serde_json::from_str::<Status>(raw)
        .ok()
        .filter(|s| s.entries() <= MAX_STATUS_ENTRIES)
}

/// The largest status annotation read, and the most entries it may record:
/// trainwire writes a few dozen (its own env, mounts and volumes, at most
/// [`super::annotations::MAX_LIST_ENTRIES`] of each list annotation); a
/// larger one was not written by trainwire, and is dropped like any other
/// unreadable status (stripping against it would cost time in its size).
pub const MAX_STATUS_BYTES: usize = 64 * 1024;
pub const MAX_STATUS_ENTRIES: usize = 1024;

impl Status {
    /// How many entries the status records.
    pub fn entries(&self) -> usize {
        self.env.len()
            + self.replaced_env.len()
            + self.volume_mounts.len()
            + self.resources.len()
            + self.volumes.len()
            + self.replaced_volumes.len()
            + self.init_containers.len()
            + self.tolerations.len()
            + self.replaced_tolerations.len()
            + self.node_selector.len()
            + self.replaced_node_selector.len()
            + self.fields.len()
    }
}

/// Write the status annotation on the template.
pub fn write(template: &mut PodTemplateSpec, status: &Status) {
    let json = serde_json::to_string(status).unwrap_or_default();
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(Default::default)
        .insert(STATUS.to_string(), json);
}

/// Put the injected label ([`trainwire_contract::labels::INJECTED`]) on the
/// template: the controllers' watches select the pods by it.
pub fn label(template: &mut PodTemplateSpec) {
    use trainwire_contract::labels::{INJECTED, INJECTED_VALUE};
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(INJECTED.to_string(), INJECTED_VALUE.to_string());
}

/// The patch operation that puts the injected label on the workload's own
/// metadata, or `None` when it is there already.
pub fn workload_label(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<super::patch::Op> {
    use json_patch::jsonptr::PointerBuf;
    use trainwire_contract::labels::{INJECTED, INJECTED_VALUE};
    let (path, value) = match &meta.labels {
        Some(labels) if labels.get(INJECTED).map(String::as_str) == Some(INJECTED_VALUE) => {
            return None;
        }
        Some(_) => (
            PointerBuf::from_tokens(["metadata", "labels", INJECTED]),
            serde_json::json!(INJECTED_VALUE),
        ),
        None => (
            PointerBuf::from_tokens(["metadata", "labels"]),
            serde_json::json!({ INJECTED: INJECTED_VALUE }),
        ),
    };
    Some(super::patch::Op {
        kind: super::patch::OpKind::Add,
        path,
        value: serde_json::value::to_raw_value(&value).ok(),
    })
}

/// Take the injected label off the template (before the input hash).
pub fn unlabel(template: &mut PodTemplateSpec) {
    if let Some(labels) = template.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(trainwire_contract::labels::INJECTED);
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    fn template_with(status: &str) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                annotations: Some([(STATUS.to_string(), status.to_string())].into()),
                ..Default::default()
            }),
            spec: None,
        }
    }

    /// A status recording more entries than trainwire ever writes, or
    /// larger than it ever is, is not trainwire's: unreadable.
    #[test]
    fn oversized_statuses_are_unreadable() {
        let mut status = Status {
            version: VERSION.to_string(),
            ..Status::default()
        };
        status.tolerations = (0..MAX_STATUS_ENTRIES)
            .map(|i| format!("{i:012x}"))
            .collect();
        let at_limit = serde_json::to_string(&status).unwrap_or_default();
        assert!(at_limit.len() <= MAX_STATUS_BYTES);
        assert_eq!(read(&template_with(&at_limit)), Some(status.clone()));
        status
            .env
            .insert("ONE_MORE".to_string(), "000000000000".to_string());
        let over = serde_json::to_string(&status).unwrap_or_default();
        assert_eq!(read(&template_with(&over)), None);
        let huge = format!(
            r#"{{"version":"{VERSION}","container":"{}"}}"#,
            "x".repeat(MAX_STATUS_BYTES)
        );
        assert_eq!(read(&template_with(&huge)), None);
    }
}
