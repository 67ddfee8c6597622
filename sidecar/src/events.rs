//! Kubernetes Events on the sidecar's own pod (an action taken, a stale
//! checkpoint). Best effort: without an API server, or without RBAC to
//! create events, failures are logged and never stop the sidecar.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Where Events go; [`EventSink::disabled`] when the API is not reachable.
#[derive(Clone)]
pub struct EventSink {
    inner: Option<(Recorder, ObjectReference)>,
    /// For the peer-loss record on the sidecar's own pod.
    pods: Option<(kube::Api<k8s_openapi::api::core::v1::Pod>, String)>,
}

impl EventSink {
    /// No API server: Events are only logged.
    pub fn disabled() -> Self {
        EventSink {
            inner: None,
            pods: None,
        }
    }

    /// Events about pod `name` (UID `uid`) in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, uid: &str) -> Self {
        let reporter = Reporter {
            controller: "trainwire-sidecar".into(),
            instance: Some(name.to_string()),
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: (!uid.is_empty()).then(|| uid.to_string()),
            ..ObjectReference::default()
        };
        EventSink {
            inner: Some((Recorder::new(client.clone(), reporter), reference)),
            pods: Some((kube::Api::namespaced(client, namespace), name.to_string())),
        }
    }

    /// Records what this sidecar did about a lost peer on its own pod
    /// ([`trainwire_contract::peer_loss`]), in the background, for the
    /// controllers' failure controller: a trainer exit this action caused is
    /// then never counted as a script failure. Best effort, like Events.
    pub fn record_peer_loss(&self, record: &trainwire_contract::peer_loss::PeerLossRecord) {
        let Some(value) = record.to_annotation() else {
            return;
        };
        self.annotate(
            trainwire_contract::peer_loss::ANNOTATION,
            value,
            "the peer loss",
        );
    }

    /// Records the newest complete checkpoint on this pod's annotation
    /// `trainwire.dev/checkpoint`, which the controllers' world controller
    /// reads (the age of a world's checkpoint in its `trainwire.dev/world`).
    pub fn record_checkpoint(&self, record: &trainwire_contract::world::CheckpointRecord) {
        self.annotate(
            trainwire_contract::world::CHECKPOINT_ANNOTATION,
            record.to_annotation(),
            "the newest checkpoint",
        );
    }

    /// Records a stall this sidecar found on its pod's annotation
    /// `trainwire.dev/stall`, which the world controller reads (the
    /// world's `lastStall`).
    pub fn record_stall(&self, record: &trainwire_contract::stall::StallRecord) {
        let Some(value) = record.to_annotation() else {
            return;
        };
        self.annotate(trainwire_contract::stall::ANNOTATION, value, "the stall");
    }

    /// Sets one annotation of this pod, in the background (a merge patch of
    /// that key only).
    fn annotate(&self, key: &'static str, value: String, what: &'static str) {
        let Some((pods, name)) = self.pods.clone() else {
            return;
        };
        let patch = serde_json::json!({"metadata": {"annotations": { key: value }}});
        tokio::spawn(async move {
            let params = kube::api::PatchParams::default();
            if let Err(e) = pods
                .patch(&name, &params, &kube::api::Patch::Merge(&patch))
                .await
            {
                tracing::warn!(error = %e, "could not record {what} on this pod (RBAC: patch pods)");
            }
        });
    }

    /// Publishes in the background. `action` is kebab-case; it is sent in PascalCase.
    pub fn publish(&self, warning: bool, reason: &str, action: &str, note: String) {
        let Some((recorder, reference)) = self.inner.clone() else {
            tracing::debug!(reason, action, "no Kubernetes API: event not recorded");
            return;
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(truncate(note, 1000)),
            action: pascal(action),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, reason = %event.reason, "could not record a Kubernetes Event");
            }
        });
    }
}

fn pascal(kebab: &str) -> String {
    kebab
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;

    /// The peer-loss record reaches the API as a merge patch of this pod's
    /// annotation, in the contract's form.
    #[tokio::test]
    async fn the_peer_loss_record_is_a_merge_patch_of_the_own_pod() {
        use trainwire_contract::peer_loss::{ANNOTATION, PeerLossRecord};
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "ml");
        let sink = super::EventSink::new(client, "ml", "train-1", "uid-1");
        let record = PeerLossRecord {
            generation: 2,
            lost_rank: 0,
            confirmed_by: "pod-deleted".into(),
            action: "restart-agent".into(),
            result: "signalled".into(),
            at: "2026-11-23T18:00:00Z".into(),
            ..Default::default()
        };
        sink.record_peer_loss(&record);
        let (request, respond) =
            tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
                .await
                .ok()
                .flatten()
                .expect("a request");
        assert_eq!(request.method(), http::Method::PATCH);
        assert_eq!(request.uri().path(), "/api/v1/namespaces/ml/pods/train-1");
        assert_eq!(
            request
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/merge-patch+json")
        );
        let body = http_body_util::BodyExt::collect(request.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let patch: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let value = patch["metadata"]["annotations"][ANNOTATION]
            .as_str()
            .expect("the annotation");
        assert_eq!(PeerLossRecord::from_annotation(value), Some(record));
        drop(respond);
    }

    #[test]
    fn pascal_case() {
        assert_eq!(super::pascal("restart-agent"), "RestartAgent");
        assert_eq!(super::pascal("report-only"), "ReportOnly");
        assert_eq!(super::truncate("é".repeat(10), 5).len(), 4);
    }
}
