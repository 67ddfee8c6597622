//! The fingerprint of an entry trainwire injected (an env variable, a
//! mount, a volume, a toleration, the sidecar container): what the status
//! ([`super::status`]) records of each entry, so that re-injection tells
//! trainwire's own entries from the ones a user edited since.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Toleration, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// A short, stable fingerprint of an injected entry: the first 6 bytes of
/// the SHA-256 of its compact JSON with keys sorted.
///
/// Quantities are compared by value, not spelling: the apiserver stores
/// `1024Mi` as `1Gi`, and trainwire must still recognise its own entry.
///
/// k8s-openapi writes every struct's fields in the sorted order of their
/// JSON names and skips absent ones, so the typed serialisation is already
/// that text (pinned by the `typed_fingerprints_*` tests): no `Value` is
/// built, only quantities are rewritten, on a copy.
pub fn fingerprint<T: Fingerprinted>(entry: &T) -> String {
    let digest = sha256_of(|out| match entry.with_canonical_quantities() {
        Some(canonical) => serde_json::to_writer(out, &canonical),
        None => serde_json::to_writer(out, entry),
    });
    hex::encode(&digest[..6])
}

/// An entry trainwire fingerprints.
pub trait Fingerprinted: Serialize + Sized {
    /// A copy with every quantity written as its value in base units, when
    /// the entry holds quantities; `None` when it holds none.
    fn with_canonical_quantities(&self) -> Option<Self> {
        None
    }
}

impl Fingerprinted for EnvVar {}
impl Fingerprinted for VolumeMount {}
impl Fingerprinted for Toleration {}
impl Fingerprinted for Volume {
    fn with_canonical_quantities(&self) -> Option<Self> {
        let mut v = self.clone();
        if let Some(limit) = v.empty_dir.as_mut().and_then(|e| e.size_limit.as_mut()) {
            canonical_quantity(limit);
        }
        if let Some(resources) = v
            .ephemeral
            .as_mut()
            .and_then(|e| e.volume_claim_template.as_mut())
            .and_then(|t| t.spec.resources.as_mut())
        {
            canonical_quantities(resources.limits.as_mut());
            canonical_quantities(resources.requests.as_mut());
        }
        Some(v)
    }
}
impl Fingerprinted for Container {
    fn with_canonical_quantities(&self) -> Option<Self> {
        let resources = self.resources.as_ref()?;
        if resources.limits.is_none() && resources.requests.is_none() {
            return None;
        }
        let mut c = self.clone();
        if let Some(resources) = c.resources.as_mut() {
            canonical_quantities(resources.limits.as_mut());
            canonical_quantities(resources.requests.as_mut());
        }
        Some(c)
    }
}

fn canonical_quantity(q: &mut Quantity) {
    if let Some(n) = quantity_value(&q.0) {
        q.0 = n;
    }
}

fn canonical_quantities(map: Option<&mut BTreeMap<String, Quantity>>) {
    map.into_iter()
        .flatten()
        .for_each(|(_, q)| canonical_quantity(q));
}

/// A quantity's value in base units, as a canonical string (`1Gi` and
/// `1024Mi` give the same); `None` when it does not parse.
pub fn quantity_value(q: &str) -> Option<String> {
    q.trim()
        .parse::<trainwire_contract::Quantity>()
        .ok()
        .map(trainwire_contract::Quantity::decimal)
}

/// The SHA-256 of the text `write` produces. The text is gathered in a
/// buffer kept per thread (no allocation per call once it has grown) and
/// hashed in one call; a buffer a huge review made large is not kept.
pub fn sha256_of(write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>) -> [u8; 32] {
    const KEEP: usize = 256 * 1024;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let hash = |buf: &mut Vec<u8>| {
        buf.clear();
        // Writing into a Vec cannot fail, nor can serialising these types.
        let written = write(buf);
        debug_assert!(written.is_ok());
        Sha256::digest(buf.as_slice()).into()
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            let digest = hash(&mut buf);
            if buf.capacity() > KEEP {
                *buf = Vec::new();
            }
            digest
        }
        Err(_) => hash(&mut Vec::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use serde_json::json;

    fn normalize_quantities(v: &mut Value, quantity_map: bool) {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter_mut() {
                    if let Value::String(q) = child
                        && (quantity_map || k == "sizeLimit")
                    {
                        if let Some(n) = quantity_value(q) {
                            *q = n;
                        }
                        continue;
                    }
                    normalize_quantities(child, matches!(k.as_str(), "limits" | "requests"));
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|c| normalize_quantities(c, false)),
            _ => {}
        }
    }

    fn by_value<T: Serialize>(entry: &T) -> String {
        let mut value = serde_json::to_value(entry).unwrap_or(Value::Null);
        normalize_quantities(&mut value, false);
        hex::encode(&Sha256::digest(value.to_string().as_bytes())[..6])
    }

    fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    }

    /// k8s-openapi writes fields in the sorted order of their JSON names:
    /// the typed fingerprint of a container or a volume with many fields
    /// set, quantities included, is the one of its sorted JSON.
    #[test]
    fn typed_fingerprints_equal_the_sorted_json_ones() {
        let container: Container = typed(json!({
            "name": "trainwire-sidecar", "image": "i:1", "imagePullPolicy": "IfNotPresent",
            "args": ["a"], "command": ["c"], "workingDir": "/w", "tty": false, "stdin": false, "stdinOnce": false,
            "restartPolicy": "Always", "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "envFrom": [{"prefix": "P_", "configMapRef": {"name": "cm", "optional": true}}],
            "ports": [{"name": "health", "containerPort": 29600, "protocol": "TCP", "hostIP": "1.2.3.4", "hostPort": 1}],
            "resources": {"limits": {"memory": "128Mi", "cpu": "500m"}, "requests": {"cpu": "0.05", "memory": "64Mi"}, "claims": [{"name": "g", "request": "r"}]},
            "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 29600, "scheme": "HTTP", "httpHeaders": [{"name": "h", "value": "v"}]}, "periodSeconds": 10, "failureThreshold": 3, "timeoutSeconds": 1, "successThreshold": 1, "initialDelaySeconds": 0, "terminationGracePeriodSeconds": 5},
            "readinessProbe": {"tcpSocket": {"port": 29600, "host": "h"}, "periodSeconds": 5},
            "startupProbe": {"exec": {"command": ["true"]}, "grpc": {"port": 1, "service": "s"}},
            "lifecycle": {"preStop": {"sleep": {"seconds": 1}}, "postStart": {"exec": {"command": ["x"]}}, "stopSignal": "SIGTERM"},
            "securityContext": {"allowPrivilegeEscalation": false, "privileged": false, "readOnlyRootFilesystem": true,
                "runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true, "procMount": "Default",
                "capabilities": {"drop": ["ALL"], "add": ["KILL"]}, "seccompProfile": {"type": "RuntimeDefault"},
                "seLinuxOptions": {"level": "s0", "role": "r", "type": "t", "user": "u"},
                "appArmorProfile": {"type": "RuntimeDefault"},
                "windowsOptions": {"gmsaCredentialSpec": "g", "gmsaCredentialSpecName": "n", "hostProcess": false, "runAsUserName": "u"}},
            "volumeMounts": [{"name": "v", "mountPath": "/m", "readOnly": true, "subPath": "s"}],
            "volumeDevices": [{"name": "d", "devicePath": "/dev/x"}]
        }));
        assert_eq!(fingerprint(&container), by_value(&container));
        let mut plain = container.clone();
        plain.resources = None;
        assert_eq!(fingerprint(&plain), by_value(&plain));
        for volume in [
            json!({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1024Mi"}}),
            json!({"name": "ckpt", "persistentVolumeClaim": {"claimName": "c", "readOnly": false}}),
            json!({"name": "h", "hostPath": {"path": "/p", "type": "Directory"}}),
            json!({"name": "n", "nfs": {"server": "s", "path": "/p", "readOnly": true}}),
            json!({"name": "c", "csi": {"driver": "d", "readOnly": true, "volumeAttributes": {"b": "1", "a": "2"}, "fsType": "ext4", "nodePublishSecretRef": {"name": "s"}}}),
            json!({"name": "cm", "configMap": {"name": "m", "defaultMode": 420, "optional": true, "items": [{"key": "k", "path": "p", "mode": 256}]}}),
            json!({"name": "s", "secret": {"secretName": "m", "defaultMode": 420, "items": [{"key": "k", "path": "p"}]}}),
            json!({"name": "p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"audience": "a", "expirationSeconds": 3600, "path": "token"}},
                {"downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}, {"path": "m", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}]}}]}}),
            json!({"name": "e", "ephemeral": {"volumeClaimTemplate": {"metadata": {"labels": {"a": "b"}}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2048Mi"}}}}}}),
            json!({"name": "i", "image": {"reference": "r:1", "pullPolicy": "IfNotPresent"}}),
        ] {
            let volume: Volume = typed(volume);
            assert_eq!(fingerprint(&volume), by_value(&volume), "{volume:?}");
        }
    }

    /// The streamed fingerprint of a plain entry is the one of its sorted
    /// JSON, every field set.
    #[test]
    fn plain_fingerprints_equal_the_sorted_json_ones() {
        let envs: Vec<EnvVar> = [
            json!({"name": "A", "value": "1"}),
            json!({"name": "R", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['x']"}}}),
            json!({"name": "S", "valueFrom": {"secretKeyRef": {"key": "k", "name": "s", "optional": true}}}),
            json!({"name": "C", "valueFrom": {"configMapKeyRef": {"key": "k", "name": "c", "optional": false}}}),
            json!({"name": "F", "valueFrom": {"fileKeyRef": {"key": "k", "path": "p", "volumeName": "v", "optional": true}}}),
            json!({"name": "Q", "valueFrom": {"resourceFieldRef": {"containerName": "c", "divisor": "1Mi", "resource": "limits.memory"}}}),
        ]
        .into_iter()
        .map(typed)
        .collect();
        for e in &envs {
            assert_eq!(fingerprint(e), by_value(e), "{e:?}");
        }
        let mount: VolumeMount = typed(
            json!({"name": "v", "mountPath": "/m", "mountPropagation": "None", "readOnly": true, "recursiveReadOnly": "Disabled", "subPath": "s", "subPathExpr": "e"}),
        );
        assert_eq!(fingerprint(&mount), by_value(&mount));
        let toleration: Toleration = typed(
            json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30, "value": "v"}),
        );
        assert_eq!(fingerprint(&toleration), by_value(&toleration));
    }
}
