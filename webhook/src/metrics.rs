//! Prometheus metrics of the admission server, served as OpenMetrics text on
//! the probe port's `/metrics`. Every label is a small closed set: no names,
//! namespaces or UIDs.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The kind of object an admission was about.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Kind {
    StatefulSet,
    Job,
    /// `statefulsets/scale` (an `autoscaling/v1 Scale`).
    Scale,
    Pod,
    Other,
}

/// The admission operation.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(clippy::upper_case_acronyms)]
pub enum Operation {
    CREATE,
    UPDATE,
    DELETE,
    CONNECT,
    /// The review was unreadable.
    UNKNOWN,
}

impl From<&kube::core::admission::Operation> for Operation {
    fn from(op: &kube::core::admission::Operation) -> Self {
        use kube::core::admission::Operation as O;
        match op {
            O::Create => Operation::CREATE,
            O::Update => Operation::UPDATE,
            O::Delete => Operation::DELETE,
            O::Connect => Operation::CONNECT,
        }
    }
}

/// What the webhook answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Allowed with a non-empty JSON Patch.
    patched,
    /// Allowed unchanged (not managed, already injected, a Job UPDATE, ...).
    allowed,
    /// Refused, with the engine's or the scale guard's message.
    denied,
    /// The review could not be understood (`AdmissionResponse::invalid`).
    invalid,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub kind: Kind,
    pub operation: Operation,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: Kind,
}

/// Why a request to `/mutate` got an HTTP error instead of an AdmissionReview.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Rejection {
    /// 400: not JSON, or JSON that is not an `admission.k8s.io/v1` AdmissionReview.
    bad_request,
    /// 413: body over the limit.
    too_large,
    /// 415: not `application/json`.
    unsupported_media_type,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub reason: Rejection,
}

pub use trainwire_runtime::exposition::{ReloadLabels, ReloadResult};

/// Why the scale guard could not know ([`trainwire_engine::scale::Unknown`]),
/// as the metric's label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct UnknownReason(pub trainwire_engine::scale::Unknown);

impl EncodeLabelValue for UnknownReason {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelValueEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        encoder.write_str(self.0.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScaleGuardLabels {
    pub reason: UnknownReason,
}

type HistogramFamily = Family<KindLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// All metrics, registered under the `trainwire_webhook_` prefix, and
/// `trainwire_build_info` (shared with the sidecar, without the prefix).
pub struct Metrics {
    registry: Registry,
    pub admissions: Family<AdmissionLabels, Counter>,
    pub admission_duration: HistogramFamily,
    pub rejected_requests: Family<RejectionLabels, Counter>,
    pub cert_reloads: Family<ReloadLabels, Counter>,
    pub cert_expiry: Gauge,
    pub policy_reloads: Family<ReloadLabels, Counter>,
    /// Scale requests the guard allowed because it could not check them.
    pub scale_guard_unknown: Family<ScaleGuardLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        trainwire_runtime::exposition::register_build_info(&mut root);
        let registry = root.sub_registry_with_prefix("trainwire_webhook");
        let admissions = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admissions",
            "Admission reviews answered, by object kind, operation and outcome",
            admissions.clone(),
        );
        let admission_duration: HistogramFamily =
            Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register(
            "admission_duration_seconds",
            "Time from the full request body to the answer, by object kind",
            admission_duration.clone(),
        );
        let rejected_requests = Family::<RejectionLabels, Counter>::default();
        registry.register(
            "rejected_requests",
            "Requests to /mutate answered with an HTTP error (400, 413, 415) instead of a review",
            rejected_requests.clone(),
        );
        let cert_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate loads from --tls-cert/--tls-key, by result",
            cert_reloads.clone(),
        );
        let cert_expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use, as a Unix timestamp (0 before one is loaded)",
            cert_expiry.clone(),
        );
        let policy_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "policy_reloads",
            "Platform policy file reloads, by result",
            policy_reloads.clone(),
        );
        let scale_guard_unknown = Family::<ScaleGuardLabels, Counter>::default();
        registry.register(
            "scale_guard_unknown",
            "statefulsets/scale requests allowed with a warning because the scale guard could not check them, by reason",
            scale_guard_unknown.clone(),
        );
        let metrics = Metrics {
            registry: root,
            scale_guard_unknown,
            admissions,
            admission_duration,
            rejected_requests,
            cert_reloads,
            cert_expiry,
            policy_reloads,
        };
        metrics.initialise();
        metrics
    }

    /// Creates every series whose labels are a known, small set, at 0, so
    /// that `/metrics` shows each family from the start and alerts and
    /// dashboards see a series before the first event (a counter that
    /// appears at 1 has no increase to alert on). Admissions and their
    /// durations: the kinds and operations the webhook configuration sends
    /// (manifests/base/webhook.yaml), with every outcome.
    fn initialise(&self) {
        const ROUTED: [(Kind, Operation); 4] = [
            (Kind::StatefulSet, Operation::CREATE),
            (Kind::StatefulSet, Operation::UPDATE),
            (Kind::Job, Operation::CREATE),
            (Kind::Scale, Operation::UPDATE),
        ];
        for (kind, operation) in ROUTED {
            for outcome in [
                Outcome::patched,
                Outcome::allowed,
                Outcome::denied,
                Outcome::invalid,
            ] {
                let _ = self.admissions.get_or_create(&AdmissionLabels {
                    kind,
                    operation,
                    outcome,
                });
            }
            let _ = self.admission_duration.get_or_create(&KindLabels { kind });
        }
        // An unreadable review is counted with no kind and no operation.
        let _ = self.admissions.get_or_create(&AdmissionLabels {
            kind: Kind::Other,
            operation: Operation::UNKNOWN,
            outcome: Outcome::invalid,
        });
        for reason in [
            Rejection::bad_request,
            Rejection::too_large,
            Rejection::unsupported_media_type,
        ] {
            let _ = self
                .rejected_requests
                .get_or_create(&RejectionLabels { reason });
        }
        trainwire_runtime::exposition::initialise_reloads(&self.cert_reloads);
        trainwire_runtime::exposition::initialise_reloads(&self.policy_reloads);
        use trainwire_engine::scale::Unknown;
        for reason in [
            Unknown::no_client,
            Unknown::not_synced,
            Unknown::watch_error,
            Unknown::not_cached,
            Unknown::unreadable_status,
        ] {
            let _ = self.scale_guard_unknown.get_or_create(&ScaleGuardLabels {
                reason: UnknownReason(reason),
            });
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn reload(family: &Family<ReloadLabels, Counter>, result: ReloadResult) {
        trainwire_runtime::exposition::count_reload(family, result);
    }
}

/// Content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = trainwire_runtime::exposition::OPENMETRICS;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_is_one_with_the_version_before_any_event() {
        let text = Metrics::new().encode();
        let version = trainwire_contract::release::VERSION;
        let line = text
            .lines()
            .find(|l| l.starts_with("trainwire_build_info{"))
            .unwrap_or_default();
        assert!(line.contains(&format!("version=\"{version}\"")), "{text}");
        assert!(line.ends_with("} 1"), "{text}");
        assert!(text.contains("# TYPE trainwire_build_info gauge"), "{text}");
        // The other families keep their prefix.
        assert!(
            text.contains("# TYPE trainwire_webhook_certificate_expiry_timestamp_seconds gauge"),
            "{text}"
        );
    }

    #[test]
    fn every_family_has_series_before_any_event() {
        let text = Metrics::new().encode();
        let families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(families.len() >= 8, "{text}");
        for family in families {
            assert!(
                text.lines()
                    .any(|l| !l.starts_with('#') && l.starts_with(family)),
                "{family} has no series at start:\n{text}"
            );
        }
        for series in [
            r#"trainwire_webhook_admissions_total{kind="StatefulSet",operation="CREATE",outcome="denied"} 0"#,
            r#"trainwire_webhook_admissions_total{kind="Other",operation="UNKNOWN",outcome="invalid"} 0"#,
            r#"trainwire_webhook_certificate_reloads_total{result="failure"} 0"#,
            r#"trainwire_webhook_scale_guard_unknown_total{reason="not_synced"} 0"#,
            r#"trainwire_webhook_admission_duration_seconds_count{kind="Job"} 0"#,
        ] {
            assert!(
                text.lines().any(|l| l == series),
                "{series} missing:\n{text}"
            );
        }
    }
}
