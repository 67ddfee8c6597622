//! AdmissionReview in, AdmissionReview out: the webhook's answer to one
//! `POST /mutate`, dispatched on the request's kind.
//!
//! | request | answer |
//! | --- | --- |
//! | `apps/v1 StatefulSet` CREATE/UPDATE | the engine's patch and warnings, or a denial with its message |
//! | `batch/v1 Job` CREATE | the same |
//! | `batch/v1 Job` UPDATE | allowed unchanged (a Job's template is immutable), with a warning when its `parallelism` leaves the injected world size |
//! | `statefulsets/scale` UPDATE | the [scale guard](crate::scale) |
//! | anything else (Pods, Deployments, status, DELETE) | allowed unchanged |
//! | a review without a readable `request`, or whose object does not match its kind | `invalid` (code 400, the reason in `status.message`), with the uid when it could be read |
//! | a body that is not JSON, or not an `admission.k8s.io/v1` AdmissionReview | HTTP 400 with the reason |
//!
//! Dry-run requests are answered the same: nothing here has side effects.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::{GroupVersionKind, GroupVersionResource, Status};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::metrics::{self, AdmissionLabels, Kind, KindLabels, Metrics, Outcome};
use crate::scale::{self, StatefulSetSource};
use trainwire_engine::mutation::{self, Refusal, workload, workload::Workload};
use trainwire_policyfile::SharedPolicy;

mod review;
use review::{Envelope, Request, Served, TypedRequest, check_envelope, json_type};

/// A review body above this size is answered only while no other such one
/// is (see [`Admitter::admit`]); real workloads' reviews are 5 to 50 KB.
pub const LARGE_BODY_BYTES: usize = 256 * 1024;
static LARGE_REVIEWS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// An object above this size is outlined before it is read (see
/// `Admitter::mutate`). Below it, even a list of the smallest entries takes
/// a few MB once typed.
pub const LARGE_OBJECT_BYTES: usize = 64 * 1024;

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
    /// The response, without its patch (written by [`serialize`]).
    response: AdmissionResponse,
    patch: Option<mutation::patch::Ops>,
    outcome: Outcome,
    /// The refusal or the reason the review was invalid.
    detail: Option<String>,
}

impl Admitter {
    /// Answer one request body.
    pub async fn admit(&self, body: &[u8]) -> Answer {
        let started = Instant::now();
        // Reviews far larger than a real workload's are answered one at a
        // time: however many arrive at once, the memory they take is that of
        // one (small ones never wait).
        let _large = if body.len() > LARGE_BODY_BYTES {
            LARGE_REVIEWS.acquire().await.ok()
        } else {
            None
        };
        // One pass for a review of ordinary size: the object of a
        // StatefulSet or Job is read straight into the typed workload. A
        // larger one is outlined first (see `mutate`); a review the one pass
        // cannot read (an object the typed model refuses, say) is read again
        // below, where the answer says what is wrong.
        if body.len() <= LARGE_OBJECT_BYTES
            && let Ok(Envelope {
                api_version,
                kind,
                request: Some(TypedRequest { request, workload }),
            }) = serde_json::from_slice::<Envelope<'_, TypedRequest<'_>>>(body)
            && kind == "AdmissionReview"
            && api_version == API_VERSION
        {
            let generate_name = workload
                .as_ref()
                .filter(|_| request.name.is_empty())
                .and_then(|w| w.metadata().generate_name.clone());
            let kind = kind_of(&request);
            let decision = self.decide(&request, kind, workload).await;
            return self.finish(&request, kind, decision, started, generate_name);
        }
        let envelope = match serde_json::from_slice::<Envelope<'_, Served<'_>>>(body) {
            Ok(e) if e.kind == "AdmissionReview" && e.api_version == API_VERSION => e,
            // Not a well-formed review: find out why, on the slow path.
            _ => return self.explain_unreadable(body, started),
        };
        let Some(request) = envelope.request else {
            return self.answer_invalid(
                None,
                "the AdmissionReview has no request".to_string(),
                started,
            );
        };
        let kind = kind_of(&request);
        let decision = self.decide(&request, kind, None).await;
        self.finish(&request, kind, decision, started, None)
    }

    /// Why a body is not a readable review: a 400 for a body that is not an
    /// `admission.k8s.io/v1` AdmissionReview, an `invalid` review (with the
    /// uid when it could be read) for an unreadable request.
    fn explain_unreadable(&self, body: &[u8], started: Instant) -> Answer {
        let doc: Value = match serde_json::from_slice(body) {
            Ok(doc) => doc,
            Err(e) => return self.bad_request(format!("the body is not JSON: {e}")),
        };
        if let Err(reason) = check_envelope(&doc) {
            return self.bad_request(reason);
        }
        let uid = doc
            .pointer("/request/uid")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let reason = match doc.get("request") {
            None | Some(Value::Null) => "the AdmissionReview has no request".to_string(),
            Some(request) => match Request::<serde::de::IgnoredAny>::deserialize(request) {
                Err(e) => format!("cannot read the AdmissionReview's request: {e}"),
                // Borrowed objects cannot come from a `Value`: a request
                // readable as a `Value` but not as text does not happen.
                Ok(_) => "cannot read the AdmissionReview's request".to_string(),
            },
        };
        self.answer_invalid(uid, reason, started)
    }

    /// `workload`: the request's object, already read as the typed
    /// workload (then `request.object` is `None`).
    async fn decide(
        &self,
        request: &Served<'_>,
        kind: Kind,
        workload: Option<Workload>,
    ) -> Decision {
        use Operation as Op;
        let allowed = || Decision {
            response: allow(request),
            patch: None,
            outcome: Outcome::allowed,
            detail: None,
        };
        let sub_resource = request.sub_resource.as_deref();
        let is_statefulsets =
            request.resource.group == "apps" && request.resource.resource == "statefulsets";
        let object = request.object.filter(|o| o.get() != "null");
        match (kind, &request.operation, sub_resource) {
            (Kind::StatefulSet, Op::Create | Op::Update, None) | (Kind::Job, Op::Create, None) => {
                if let Some(workload) = workload {
                    return self.mutate_workload(request, workload);
                }
                let Some(object) = object else {
                    return invalid(
                        request,
                        format!(
                            "request.object is missing from a {:?} of a {}",
                            request.operation, request.kind.kind
                        ),
                    );
                };
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
                let old_replicas = request
                    .old_object
                    .filter(|o| o.get() != "null")
                    .and_then(|o| replicas_of(o).ok());
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
                            .get_or_create(&crate::metrics::ScaleGuardLabels {
                                reason: crate::metrics::UnknownReason(reason),
                            })
                            .inc();
                        allow_with_warning(request, warning)
                    }
                    scale::Verdict::Refuse(refusal) => deny(request, &refusal),
                }
            }
            // A Job's template is immutable: let the UPDATE through, but say
            // when its parallelism leaves the injected world size.
            (Kind::Job, Op::Update, None) => match &workload {
                Some(Workload::Job(job)) => match scale::job_size_warning(job) {
                    Some(warning) => allow_with_warning(request, warning),
                    None => allowed(),
                },
                _ => allowed(),
            },
            _ => allowed(),
        }
    }

    /// Run the engine. The object is read straight into the typed workload;
    /// only an object the typed model cannot read (a mismatched kind, a
    /// number where a string belongs, ...) goes through `Value`, where the
    /// engine explains what is wrong with it.
    fn mutate(&self, request: &Served<'_>, object: &RawValue) -> Decision {
        // A large object is outlined first: one not opted in is never read
        // into the typed model, and one whose lists would take far more
        // memory than any real pod is refused before it is read.
        if object.get().len() > LARGE_OBJECT_BYTES {
            match workload::Outline::of(object.get()) {
                Some(workload::Outline::NotManaged) => {
                    return Decision {
                        response: allow(request),
                        patch: None,
                        outcome: Outcome::allowed,
                        detail: None,
                    };
                }
                Some(workload::Outline::Managed(sizes)) => {
                    if let Err(refusal) = sizes.check(&request.kind.kind) {
                        return deny(request, &refusal);
                    }
                }
                None => {}
            }
        }
        let Ok(workload) = Workload::from_str(&request.kind.kind, object.get()) else {
            let value: Value = match serde_json::from_str(object.get()) {
                Ok(v) => v,
                Err(e) => return invalid(request, format!("request.object is not JSON: {e}")),
            };
            if let Err(reason) = object_matches_kind(request, &value) {
                return invalid(request, reason);
            }
            let policy = self.policy.current();
            let namespace = request
                .namespace
                .as_deref()
                .or_else(|| value["metadata"]["namespace"].as_str());
            let profile = policy.profile_for(namespace.unwrap_or_default());
            return Self::decision_of(
                request,
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    mutation::mutate(&value, namespace, &profile).map(|o| match o {
                        mutation::Outcome::NotManaged => mutation::Outcome::NotManaged,
                        mutation::Outcome::Mutated(m) => {
                            mutation::Outcome::Mutated(mutation::Admitted {
                                patch: mutation::patch::Ops::from_patch(&m.patch),
                                warnings: m.warnings,
                            })
                        }
                    })
                })),
            );
        };
        self.mutate_workload(request, workload)
    }

    /// Run the engine on the typed workload.
    fn mutate_workload(&self, request: &Served<'_>, workload: Workload) -> Decision {
        let policy = self.policy.current();
        let namespace = request
            .namespace
            .clone()
            .or_else(|| workload.metadata().namespace.clone());
        let profile = policy.profile_for(namespace.as_deref().unwrap_or_default());
        Self::decision_of(
            request,
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                mutation::mutate_typed(workload, namespace.as_deref(), &profile)
            })),
        )
    }

    /// The decision for what the engine answered (or a panic in it).
    fn decision_of(
        request: &Served<'_>,
        result: std::thread::Result<Result<mutation::Outcome<mutation::Admitted>, Refusal>>,
    ) -> Decision {
        match result {
            Ok(Ok(mutation::Outcome::NotManaged)) => Decision {
                response: allow(request),
                patch: None,
                outcome: Outcome::allowed,
                detail: None,
            },
            Ok(Ok(mutation::Outcome::Mutated(m))) => {
                let mut response = allow(request);
                let patched = !m.patch.is_empty();
                let mut warnings = m.warnings;
                // `podManagementPolicy` is immutable: said at CREATE only
                // (the engine says it at any first injection, which on an
                // UPDATE is one that opts an existing StatefulSet in).
                if !matches!(request.operation, Operation::Create) {
                    warnings.retain(|w| {
                        w != trainwire_engine::mutation::workload::ORDERED_READY_WARNING
                    });
                }
                if !warnings.is_empty() {
                    response.warnings = Some(warnings);
                }
                Decision {
                    response,
                    patch: patched.then_some(m.patch),
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
        request: &Served<'_>,
        kind: Kind,
        decision: Decision,
        started: Instant,
        generate_name: Option<String>,
    ) -> Answer {
        let body = serialize(&decision.response, decision.patch.as_ref());
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
        if tracing::enabled!(tracing::Level::INFO) {
            let fallback;
            let name = if request.name.is_empty() {
                // Pods of Jobs, and Jobs, may have only generateName.
                fallback = generate_name.or_else(|| request.object.and_then(generate_name_of));
                fallback.as_deref().unwrap_or_default()
            } else {
                request.name.as_str()
            };
            let sub = request.sub_resource.as_deref();
            tracing::info!(
                kind = %format_args!(
                    "{}{}{}",
                    request.kind.kind,
                    if sub.is_some() { "/" } else { "" },
                    sub.unwrap_or_default()
                ),
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
        }
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
        Answer::Review(serialize(&response, None))
    }
}

/// `metadata.generateName` of an object given as JSON text.
fn generate_name_of(object: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "generateName")]
        generate_name: Option<String>,
    }
    #[derive(Deserialize)]
    struct Object {
        metadata: Option<Meta>,
    }
    serde_json::from_str::<Object>(object.get())
        .ok()?
        .metadata?
        .generate_name
}

/// An allowing response to `request`, nothing else.
fn allow(request: &Served<'_>) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid("");
    response.uid = request.uid.clone();
    response.allowed = true;
    response.result = Status::default();
    response
}

/// The review sent back, written in one go into one buffer. kube's
/// `AdmissionResponse` writes `patch` as an array of numbers; Kubernetes' own
/// form of a `[]byte` is a base64 string, which is also a third of the size,
/// so the patch is written that way: serialised into a reused per-thread
/// buffer and base64-encoded straight into the answer (no intermediate
/// string, and base64 text needs no escaping).
fn serialize(response: &AdmissionResponse, patch: Option<&mutation::patch::Ops>) -> Vec<u8> {
    use base64::Engine as _;
    thread_local! {
        static PATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let write = |out: &mut Vec<u8>, patch_json: &[u8]| -> serde_json::Result<()> {
        out.extend_from_slice(br#"{"apiVersion":""#);
        out.extend_from_slice(API_VERSION.as_bytes());
        out.extend_from_slice(br#"","kind":"AdmissionReview","response":{"uid":"#);
        serde_json::to_writer(&mut *out, &response.uid)?;
        out.extend_from_slice(if response.allowed {
            br#","allowed":true,"status":"#
        } else {
            br#","allowed":false,"status":"#
        });
        serde_json::to_writer(&mut *out, &response.result)?;
        if patch.is_some() {
            out.extend_from_slice(br#","patch":""#);
            let start = out.len();
            let len = base64::encoded_len(patch_json.len(), true).unwrap_or(0);
            out.resize(start + len, 0);
            let written = base64::engine::general_purpose::STANDARD
                .encode_slice(patch_json, &mut out[start..])
                .unwrap_or(0);
            out.truncate(start + written);
            out.extend_from_slice(br#"","patchType":"JSONPatch""#);
        }
        if !response.audit_annotations.is_empty() {
            out.extend_from_slice(br#","auditAnnotations":"#);
            serde_json::to_writer(&mut *out, &response.audit_annotations)?;
        }
        if let Some(warnings) = &response.warnings {
            out.extend_from_slice(br#","warnings":"#);
            serde_json::to_writer(&mut *out, warnings)?;
        }
        out.extend_from_slice(b"}}");
        Ok(())
    };
    let written = PATCH.with_borrow_mut(|patch_json| {
        patch_json.clear();
        if let Some(patch) = patch {
            patch.write_json(patch_json)?;
        }
        let mut out = Vec::with_capacity(256 + patch_json.len() * 4 / 3);
        write(&mut out, patch_json).map(|()| out)
    });
    // An AdmissionReview of strings, bools and numbers always serializes;
    // the fallback keeps the answer well-formed regardless.
    written.unwrap_or_else(|e| {
        format!(
            r#"{{"apiVersion":"{API_VERSION}","kind":"AdmissionReview","response":{{"uid":"","allowed":false,"status":{{"message":"cannot encode the answer: {e}"}}}}}}"#
        )
        .into_bytes()
    })
}

fn kind_of(request: &Served<'_>) -> Kind {
    match (request.kind.group.as_str(), request.kind.kind.as_str()) {
        ("apps", "StatefulSet") => Kind::StatefulSet,
        ("batch", "Job") => Kind::Job,
        ("autoscaling", "Scale") => Kind::Scale,
        ("", "Pod") => Kind::Pod,
        _ => Kind::Other,
    }
}

/// `request.object` must be what `request.kind` says.
fn object_matches_kind(request: &Served<'_>, object: &Value) -> Result<(), String> {
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
fn replicas_of(scale: &RawValue) -> Result<i32, String> {
    let scale: Value = serde_json::from_str(scale.get())
        .map_err(|e| format!("request.object (the Scale) is not JSON: {e}"))?;
    match scale.get("spec").and_then(|s| s.get("replicas")) {
        None | Some(Value::Null) => Ok(0),
        Some(v) => v
            .as_i64()
            .and_then(|r| i32::try_from(r).ok())
            .filter(|r| *r >= 0)
            .ok_or_else(|| format!("Scale spec.replicas is {v}; expected a non-negative integer")),
    }
}

/// Allowed unchanged, with one admission warning (kubectl prints it).
fn allow_with_warning(request: &Served<'_>, warning: String) -> Decision {
    let mut response = allow(request);
    response.warnings = Some(vec![warning.clone()]);
    Decision {
        response,
        patch: None,
        outcome: Outcome::allowed,
        detail: Some(warning),
    }
}

fn deny(request: &Served<'_>, refusal: &Refusal) -> Decision {
    let message = refusal.to_string();
    let mut response = allow(request).deny(&message);
    response.result = Status::failure(&message, "Forbidden").with_code(403);
    Decision {
        response,
        patch: None,
        outcome: Outcome::denied,
        detail: Some(message),
    }
}

fn invalid(request: &Served<'_>, reason: String) -> Decision {
    let mut response = AdmissionResponse::invalid(&reason);
    response.result = response.result.with_code(400);
    response.uid = request.uid.clone();
    Decision {
        response,
        patch: None,
        outcome: Outcome::invalid,
        detail: Some(reason),
    }
}

fn internal_error(request: &Served<'_>, detail: String) -> Decision {
    tracing::error!(uid = %request.uid, error = %detail, "internal error while admitting; refusing the request");
    let message = format!("trainwire webhook internal error, please report it: {detail}");
    let mut response = allow(request).deny(&message);
    response.result = Status::failure(&message, "InternalError").with_code(500);
    Decision {
        response,
        patch: None,
        outcome: Outcome::denied,
        detail: Some(detail),
    }
}
