//! The objects an injected workload needs beside it, which `inject` adds
//! to its output when the input does not have them (offline there is no
//! reconciler to create them): a Job's headless Service, a dedicated
//! rendezvous store's Deployment and Service.

use serde_json::Value;

use super::{Diagnostic, Options, Place, Severity};

/// An object's namespace, or the one the command was given.
fn namespace_of(v: &Value, default_namespace: &str) -> String {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(default_namespace)
        .to_string()
}

/// The headless Services the injected Jobs among `objects` need and the
/// input does not have (`inputs`: every object of the input), with a note for
/// each. Offline there is no reconciler to create them, and without one a
/// Job's pods never resolve each other's names: the rendezvous never forms.
pub(super) fn missing_job_services(
    objects: &[(Place, &Value)],
    inputs: &[&Value],
    default_namespace: &str,
) -> Vec<(Option<Diagnostic>, Value)> {
    let namespace_of = |v: &Value| namespace_of(v, default_namespace);
    let has_service = |name: &str, namespace: &str| {
        inputs.iter().any(|v| {
            v.get("kind").and_then(Value::as_str) == Some("Service")
                && v.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                && namespace_of(v) == namespace
        })
    };
    let mut out: Vec<(Option<Diagnostic>, Value)> = Vec::new();
    for (who, obj) in objects {
        if obj.get("kind").and_then(Value::as_str) != Some("Job")
            || obj.get("apiVersion").and_then(Value::as_str) != Some("batch/v1")
        {
            continue;
        }
        let Ok(job) = serde_json::from_value::<k8s_openapi::api::batch::v1::Job>((*obj).clone())
        else {
            continue;
        };
        let Ok(Some(service)) = trainwire_engine::service::offline_job_service(&job) else {
            continue;
        };
        let name = service.metadata.name.clone().unwrap_or_default();
        let namespace = namespace_of(obj);
        let emitted = out.iter().any(|(_, s)| {
            s.pointer("/metadata/name").and_then(Value::as_str) == Some(name.as_str())
                && namespace_of(s) == namespace
        });
        if has_service(&name, &namespace) || emitted {
            continue;
        }
        let Ok(value) = serde_json::to_value(&service) else {
            continue;
        };
        out.push((
            Some(who.diagnostic(
                Severity::Info,
                obj,
                format!(
                    "added the headless Service {name} its pods need (no owner: delete it with the Job)"
                ),
            )),
            value,
        ));
    }
    out
}

/// The dedicated rendezvous stores (Deployment and Service `<name>-rdzv`)
/// the injected workloads among `objects` need and the input does not have,
/// with a note for each: offline there is no reconciler to create them.
pub(super) fn missing_stores(
    objects: &[(Place, &Value)],
    inputs: &[&Value],
    default_namespace: &str,
    opts: &Options,
) -> Vec<(Option<Diagnostic>, Value)> {
    let namespace_of = |v: &Value| namespace_of(v, default_namespace);
    let present = |kind: &str, name: &str, namespace: &str, out: &[(Option<Diagnostic>, Value)]| {
        inputs
            .iter()
            .copied()
            .chain(out.iter().map(|(_, v)| v))
            .any(|v| {
                v.get("kind").and_then(Value::as_str) == Some(kind)
                    && v.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
                    && namespace_of(v) == namespace
            })
    };
    let mut out: Vec<(Option<Diagnostic>, Value)> = Vec::new();
    for (who, obj) in objects {
        let str_at = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default();
        let (api_version, kind, name) = (
            str_at("/apiVersion"),
            str_at("/kind"),
            str_at("/metadata/name"),
        );
        if !trainwire_engine::mutation::workload::is_managed_kind(api_version, kind) {
            continue;
        }
        let Some(template) = obj.pointer("/spec/template").and_then(|t| {
            serde_json::from_value::<k8s_openapi::api::core::v1::PodTemplateSpec>(t.clone()).ok()
        }) else {
            continue;
        };
        let Some(status) = trainwire_engine::mutation::status::read(&template) else {
            continue;
        };
        let namespace = namespace_of(obj);
        let written = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let owner = trainwire_engine::store::Owner {
            api_version,
            kind,
            name,
            namespace: written,
            uid: None,
        };
        let profile = opts.profile_for(&namespace);
        let Some(store) = trainwire_engine::store::desired(&owner, &template, &status, &profile)
        else {
            continue;
        };
        let store_name = status.rdzv_store.clone();
        let mut added = Vec::new();
        for (object_kind, value) in [
            ("Deployment", serde_json::to_value(&store.deployment)),
            ("Service", serde_json::to_value(&store.service)),
        ] {
            let Ok(mut value) = value else { continue };
            if present(object_kind, &store_name, &namespace, &out) {
                continue;
            }
            if let Some(map) = value.as_object_mut() {
                let api = if object_kind == "Deployment" {
                    "apps/v1"
                } else {
                    "v1"
                };
                map.insert("apiVersion".to_string(), Value::String(api.to_string()));
                map.insert("kind".to_string(), Value::String(object_kind.to_string()));
            }
            added.push(object_kind);
            out.push((None, value));
        }
        if !added.is_empty() {
            let note = format!(
                "added the rendezvous store {store_name} ({}; no owner: delete them with the {kind})",
                added.join(" and ")
            );
            // The note goes with the first object added for this workload.
            let first = out.len() - added.len();
            out[first].0 = Some(who.diagnostic(Severity::Info, obj, note));
        }
    }
    out
}
