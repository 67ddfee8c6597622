//! What a watch cache keeps of an object: everything a reader needs, not
//! the bookkeeping the apiserver adds for writers.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The annotation `kubectl apply` keeps the last applied manifest in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drop what no reader of a cache needs (`managedFields`, the last-applied
/// annotation), to keep the cache small.
pub fn slim(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn slim_keeps_every_other_annotation() {
        let mut meta = ObjectMeta {
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            annotations: Some(
                [(LAST_APPLIED, "{}"), ("trainwire.dev/status", "{}")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        };
        slim(&mut meta);
        assert_eq!(meta.managed_fields, None);
        let kept: Vec<_> = meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(kept, ["trainwire.dev/status"]);
    }
}
