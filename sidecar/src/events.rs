//! Kubernetes Events on the sidecar's own pod (an action taken, a stale
//! checkpoint). Best effort: without an API server, or without RBAC to
//! create events, failures are logged and never stop the sidecar.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Where Events go; [`EventSink::disabled`] when the API is not reachable.
#[derive(Clone)]
pub struct EventSink {
    inner: Option<(Recorder, ObjectReference)>,
}

impl EventSink {
    /// No API server: Events are only logged.
    pub fn disabled() -> Self {
        EventSink { inner: None }
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
            inner: Some((Recorder::new(client, reporter), reference)),
        }
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
    #[test]
    fn pascal_case() {
        assert_eq!(super::pascal("restart-agent"), "RestartAgent");
        assert_eq!(super::pascal("report-only"), "ReportOnly");
        assert_eq!(super::truncate("é".repeat(10), 5).len(), 4);
    }
}
