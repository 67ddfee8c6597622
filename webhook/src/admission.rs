//! AdmissionReview in, AdmissionReview out: the webhook's answer to one
//! `POST /mutate`, dispatched on the request's kind.
//!
//! | request | answer |
//! | --- | --- |
//! | `apps/v1 StatefulSet` CREATE/UPDATE | the engine's patch and warnings, or a denial with its message |
//! | `batch/v1 Job` CREATE | the same |
//! | `batch/v1 Job` UPDATE | allowed unchanged (a Job's template is immutable) |
//! | `statefulsets/scale` UPDATE | the [scale guard](crate::scale) |
//! | anything else (Pods, Deployments, status, DELETE) | allowed unchanged |
//! | a review without a readable `request`, or whose object does not match its kind | `invalid` (code 400, the reason in `status.message`), with the uid when it could be read |
//! | a body that is not JSON, or not an `admission.k8s.io/v1` AdmissionReview | HTTP 400 with the reason |
//!
//! Dry-run requests are answered the same: nothing here has side effects.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::{DynamicObject, Status};
use serde_json::Value;

use crate::metrics::{self, AdmissionLabels, Kind, KindLabels, Metrics, Outcome};
use crate::mutation::{self, Refusal};
use crate::policy::SharedPolicy;
use crate::scale::{self, StatefulSetSource};

/// The only AdmissionReview version spoken.
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// What answers admissions: the policy in force, where the scale guard reads
/// StatefulSets, and the metrics.
#[derive(Clone)]
pub struct Admitter {
    pub policy: SharedPolicy,
    pub statefulsets: Arc<dyn StatefulSetSource>,
    pub metrics: Arc<Metrics>,
}

/// The answer to a `POST /mutate` body.
#[derive(Debug)]
pub enum Answer {
    /// HTTP 200 with this serialized AdmissionReview.
    Review(Vec<u8>),
    /// An HTTP 400: the body is not JSON or not an `admission.k8s.io/v1`
    /// AdmissionReview. The reason is sent as text.
    BadRequest(String),
}

/// What one admission decided, for the log line and the metrics.
struct Decision {
    response: AdmissionResponse,
    outcome: Outcome,
    /// The refusal or the reason the review was invalid.
    detail: Option<String>,
}

impl Admitter {
    /// Answer one request body.
    pub async fn admit(&self, body: &[u8]) -> Answer {
        let started = Instant::now();
        let mut doc: Value = match serde_json::from_slice(body) {
            Ok(doc) => doc,
            Err(e) => return self.bad_request(format!("the body is not JSON: {e}")),
        };
        if let Err(reason) = check_envelope(&doc) {
            return self.bad_request(reason);
        }
        // The objects stay JSON for the engine; the rest of the review is
        // read with kube's types.
        let (uid, object, old_object) = match doc.get_mut("request") {
            Some(Value::Object(request)) => (
                request
                    .get("uid")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                request.remove("object"),
                request.remove("oldObject"),
            ),
            _ => (None, None, None),
        };
        let review: AdmissionReview<DynamicObject> = match serde_json::from_value(doc) {
            Ok(review) => review,
            Err(e) => {
                return self.answer_invalid(
                    uid,
                    format!("cannot read the AdmissionReview's request: {e}"),
                    started,
                );
            }
        };
        let request: AdmissionRequest<DynamicObject> = match review.try_into() {
            Ok(request) => request,
            Err(_) => {
                return self.answer_invalid(
                    uid,
                    "the AdmissionReview has no request".to_string(),
                    started,
                );
            }
        };
        let object = object.filter(|o| !o.is_null());
        let old_object = old_object.filter(|o| !o.is_null());
        let kind = kind_of(&request);
        let decision = self
            .decide(&request, kind, object.as_ref(), old_object.as_ref())
            .await;
        self.finish(&request, kind, object.as_ref(), decision, started)
    }

    async fn decide(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: Kind,
        object: Option<&Value>,
        old_object: Option<&Value>,
    ) -> Decision {
        use kube::core::admission::Operation as Op;
        let allowed = || Decision {
            response: AdmissionResponse::from(request),
            outcome: Outcome::allowed,
            detail: None,
        };
        let sub_resource = request.sub_resource.as_deref();
        let is_statefulsets =
            request.resource.group == "apps" && request.resource.resource == "statefulsets";
        match (kind, &request.operation, sub_resource) {
            (Kind::StatefulSet, Op::Create | Op::Update, None) | (Kind::Job, Op::Create, None) => {
                let Some(object) = object else {
                    return invalid(
                        request,
                        format!(
                            "request.object is missing from a {:?} of a {}",
                            request.operation, request.kind.kind
                        ),
                    );
                };
                if let Err(reason) = object_matches_kind(request, object) {
                    return invalid(request, reason);
                }
                self.mutate(request, object)
            }
            (_, Op::Update, Some("scale")) if is_statefulsets => {
                let Some(object) = object else {
                    return invalid(
                        request,
                        "request.object (the Scale) is missing from a statefulsets/scale UPDATE"
                            .to_string(),
                    );
                };
                let new_replicas = match replicas_of(object) {
                    Ok(r) => r,
                    Err(reason) => return invalid(request, reason),
                };
                let old_replicas = old_object.and_then(|o| replicas_of(o).ok());
                let namespace = request.namespace.as_deref().unwrap_or_default();
                match scale::decide(
                    || self.statefulsets.lookup(namespace, &request.name),
                    namespace,
                    &request.name,
                    new_replicas,
                    old_replicas,
                ) {
                    scale::Verdict::Allow => allowed(),
                    scale::Verdict::AllowUnknown(reason, warning) => {
                        self.metrics
                            .scale_guard_unknown
                            .get_or_create(&crate::metrics::ScaleGuardLabels { reason })
                            .inc();
                        let mut response = AdmissionResponse::from(request);
                        response.warnings = Some(vec![warning.clone()]);
                        Decision {
                            response,
                            outcome: Outcome::allowed,
                            detail: Some(warning),
                        }
                    }
                    scale::Verdict::Refuse(refusal) => deny(request, &refusal),
                }
            }
            _ => allowed(),
        }
    }

    fn mutate(&self, request: &AdmissionRequest<DynamicObject>, object: &Value) -> Decision {
        let namespace = request
            .namespace
            .as_deref()
            .or_else(|| object["metadata"]["namespace"].as_str());
        let policy = self.policy.current();
        let profile = policy.profile_for(namespace.unwrap_or_default());
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            mutation::mutate(object, namespace, &profile)
        }));
        match result {
            Ok(Ok(mutation::Outcome::NotManaged)) => Decision {
                response: AdmissionResponse::from(request),
                outcome: Outcome::allowed,
                detail: None,
            },
            Ok(Ok(mutation::Outcome::Mutated(m))) => {
                let base = AdmissionResponse::from(request);
                let patched = !m.patch.0.is_empty();
                let response = if patched {
                    match base.with_patch(m.patch) {
                        Ok(r) => r,
                        Err(e) => return internal_error(request, e.to_string()),
                    }
                } else {
                    base
                };
                let mut response = response;
                if !m.warnings.is_empty() {
                    response.warnings = Some(m.warnings);
                }
                Decision {
                    response,
                    outcome: if patched {
                        Outcome::patched
                    } else {
                        Outcome::allowed
                    },
                    detail: None,
                }
            }
            Ok(Err(refusal)) => deny(request, &refusal),
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                internal_error(request, format!("the mutation engine panicked: {what}"))
            }
        }
    }

    fn finish(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        kind: Kind,
        object: Option<&Value>,
        decision: Decision,
        started: Instant,
    ) -> Answer {
        let body = serialize(decision.response.into_review());
        let elapsed = started.elapsed();
        let operation = metrics::Operation::from(&request.operation);
        self.metrics
            .admissions
            .get_or_create(&AdmissionLabels {
                kind,
                operation,
                outcome: decision.outcome,
            })
            .inc();
        self.metrics
            .admission_duration
            .get_or_create(&KindLabels { kind })
            .observe(elapsed.as_secs_f64());
        let name = if request.name.is_empty() {
            // Pods of Jobs have only generateName.
            object
                .and_then(|o| o["metadata"]["generateName"].as_str())
                .unwrap_or_default()
        } else {
            request.name.as_str()
        };
        let sub = request
            .sub_resource
            .as_deref()
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        tracing::info!(
            kind = %format_args!("{}{sub}", request.kind.kind),
            namespace = request.namespace.as_deref().unwrap_or_default(),
            name,
            operation = ?operation,
            uid = %request.uid,
            dry_run = request.dry_run,
            outcome = ?decision.outcome,
            duration_us = elapsed.as_micros() as u64,
            detail = decision.detail.as_deref().unwrap_or_default(),
            "admission"
        );
        Answer::Review(body)
    }

    fn bad_request(&self, reason: String) -> Answer {
        self.metrics
            .rejected_requests
            .get_or_create(&metrics::RejectionLabels {
                reason: metrics::Rejection::bad_request,
            })
            .inc();
        tracing::warn!(status = 400, reason = %reason, "rejected a /mutate request");
        Answer::BadRequest(reason)
    }

    fn answer_invalid(&self, uid: Option<String>, reason: String, started: Instant) -> Answer {
        let mut response = AdmissionResponse::invalid(&reason);
        response.result = response.result.with_code(400);
        if let Some(uid) = &uid {
            response.uid = uid.clone();
        }
        self.metrics
            .admissions
            .get_or_create(&AdmissionLabels {
                kind: Kind::Other,
                operation: metrics::Operation::UNKNOWN,
                outcome: Outcome::invalid,
            })
            .inc();
        tracing::warn!(
            uid = uid.as_deref().unwrap_or_default(),
            outcome = "invalid",
            duration_us = started.elapsed().as_micros() as u64,
            reason = %reason,
            "admission"
        );
        Answer::Review(serialize(response.into_review()))
    }
}

/// Serialize the answer. kube's `AdmissionResponse` writes `patch` as an
/// array of numbers; Kubernetes' own form of a `[]byte` is a base64 string,
/// which is also a third of the size, so the patch is written that way.
fn serialize(mut review: AdmissionReview<DynamicObject>) -> Vec<u8> {
    use base64::Engine as _;
    let patch = review.response.as_mut().and_then(|r| r.patch.take());
    let encoded = serde_json::to_value(&review).and_then(|mut value| {
        if let Some(patch) = patch {
            value["response"]["patch"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        serde_json::to_vec(&value)
    });
    // An AdmissionReview of strings, bools and numbers always serializes;
    // the fallback keeps the answer well-formed regardless.
    encoded.unwrap_or_else(|e| {
        format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"AdmissionReview","response":{{"uid":"","allowed":false,"status":{{"message":"cannot encode the answer: {e}"}}}}}}"#
        )
        .into_bytes()
    })
}

/// The body must be an `admission.k8s.io/v1` AdmissionReview.
fn check_envelope(doc: &Value) -> Result<(), String> {
    let Some(map) = doc.as_object() else {
        return Err(format!(
            "the body is a JSON {}, not an {API_VERSION} AdmissionReview object",
            json_type(doc)
        ));
    };
    let kind = map.get("kind").and_then(Value::as_str);
    if kind != Some("AdmissionReview") {
        return Err(format!(
            "kind is {}; expected \"AdmissionReview\"",
            describe(map.get("kind"))
        ));
    }
    let api_version = map.get("apiVersion").and_then(Value::as_str);
    if api_version != Some(API_VERSION) {
        return Err(format!(
            "apiVersion is {}; this webhook speaks {API_VERSION} only (set admissionReviewVersions: [\"v1\"] in the webhook configuration)",
            describe(map.get("apiVersion"))
        ));
    }
    Ok(())
}

fn describe(v: Option<&Value>) -> String {
    match v {
        None => "missing".to_string(),
        Some(v) => v.to_string(),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn kind_of(request: &AdmissionRequest<DynamicObject>) -> Kind {
    match (request.kind.group.as_str(), request.kind.kind.as_str()) {
        ("apps", "StatefulSet") => Kind::StatefulSet,
        ("batch", "Job") => Kind::Job,
        ("autoscaling", "Scale") => Kind::Scale,
        ("", "Pod") => Kind::Pod,
        _ => Kind::Other,
    }
}

/// `request.object` must be what `request.kind` says.
fn object_matches_kind(
    request: &AdmissionRequest<DynamicObject>,
    object: &Value,
) -> Result<(), String> {
    let gvk = &request.kind;
    let expected_api_version = if gvk.group.is_empty() {
        gvk.version.clone()
    } else {
        format!("{}/{}", gvk.group, gvk.version)
    };
    if !object.is_object() {
        return Err(format!(
            "request.object is a JSON {}, not a {}",
            json_type(object),
            gvk.kind
        ));
    }
    let kind = object.get("kind").and_then(Value::as_str);
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    // The apiserver always sends both; an object without them is read as
    // the kind the request names.
    if kind.is_some_and(|k| k != gvk.kind) || api_version.is_some_and(|v| v != expected_api_version)
    {
        return Err(format!(
            "request.kind is {expected_api_version} {} but request.object is {} {}",
            gvk.kind,
            api_version.unwrap_or("(no apiVersion)"),
            kind.unwrap_or("(no kind)"),
        ));
    }
    Ok(())
}

/// `spec.replicas` of an `autoscaling/v1 Scale` (omitted when 0).
fn replicas_of(scale: &Value) -> Result<i32, String> {
    match scale.get("spec").and_then(|s| s.get("replicas")) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_i64()
            .and_then(|r| i32::try_from(r).ok())
            .filter(|r| *r >= 0)
            .ok_or_else(|| format!("Scale spec.replicas is {v}; expected a non-negative integer")),
    }
}

fn deny(request: &AdmissionRequest<DynamicObject>, refusal: &Refusal) -> Decision {
    let message = refusal.to_string();
    let mut response = AdmissionResponse::from(request).deny(&message);
    response.result = Status::failure(&message, "Forbidden").with_code(403);
    Decision {
        response,
        outcome: Outcome::denied,
        detail: Some(message),
    }
}

fn invalid(request: &AdmissionRequest<DynamicObject>, reason: String) -> Decision {
    let mut response = AdmissionResponse::invalid(&reason);
    response.result = response.result.with_code(400);
    response.uid = request.uid.clone();
    Decision {
        response,
        outcome: Outcome::invalid,
        detail: Some(reason),
    }
}

fn internal_error(request: &AdmissionRequest<DynamicObject>, detail: String) -> Decision {
    tracing::error!(uid = %request.uid, error = %detail, "internal error while admitting; refusing the request");
    let message = format!("trainwire webhook internal error, please report it: {detail}");
    let mut response = AdmissionResponse::from(request).deny(&message);
    response.result = Status::failure(&message, "InternalError").with_code(500);
    Decision {
        response,
        outcome: Outcome::denied,
        detail: Some(detail),
    }
}
