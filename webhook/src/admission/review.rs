//! Reading an AdmissionReview: the envelope as the apiserver sends it, the
//! request typed without copying the object, and the checks that turn a
//! malformed review into a 400 with a reason.

use super::*;

/// The review as it is read: `R` is the request, either
/// [`Request<&RawValue>`] (the object kept as the JSON text it is in the
/// body) or [`TypedRequest`] (a StatefulSet's or Job's object read as the
/// typed workload in the same pass).
#[derive(Deserialize)]
#[serde(bound(deserialize = "R: Deserialize<'de>"))]
pub(super) struct Envelope<'a, R> {
    #[serde(rename = "apiVersion", borrow)]
    pub api_version: Cow<'a, str>,
    #[serde(borrow)]
    pub kind: Cow<'a, str>,
    #[serde(default = "none")]
    pub request: Option<R>,
}

/// The fields of an `AdmissionRequest` the webhook reads; the objects are
/// `O` (borrowed JSON text when serving).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "O: Deserialize<'de>"))]
pub(super) struct Request<O> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default = "none")]
    pub object: Option<O>,
    #[serde(default = "none")]
    pub old_object: Option<O>,
}

pub(super) fn none<O>() -> Option<O> {
    None
}

/// A request as served.
pub(super) type Served<'a> = Request<&'a RawValue>;

/// A request whose object, when `request.kind` (which the apiserver writes
/// before the object) is a StatefulSet or a Job, is read as the typed
/// workload; any other object is kept as JSON text in `request.object`.
pub(super) struct TypedRequest<'a> {
    pub request: Served<'a>,
    pub workload: Option<Workload>,
}

impl<'de: 'a, 'a> Deserialize<'de> for TypedRequest<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(TypedRequestVisitor(std::marker::PhantomData))
    }
}

pub(super) struct TypedRequestVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> serde::de::Visitor<'de> for TypedRequestVisitor<'a> {
    type Value = TypedRequest<'a>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an AdmissionRequest")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error as _;
        #[derive(Deserialize)]
        #[serde(field_identifier, rename_all = "camelCase")]
        enum Field {
            Uid,
            Kind,
            Resource,
            SubResource,
            Name,
            Namespace,
            Operation,
            DryRun,
            Object,
            OldObject,
            #[serde(other)]
            Other,
        }
        fn once<T, E: serde::de::Error>(
            slot: &mut Option<T>,
            value: T,
            name: &'static str,
        ) -> Result<(), E> {
            if slot.replace(value).is_some() {
                return Err(E::duplicate_field(name));
            }
            Ok(())
        }
        let (mut uid, mut kind, mut resource, mut operation) = (None, None, None, None);
        let (mut sub_resource, mut name, mut namespace, mut dry_run) = (None, None, None, None);
        let (mut object, mut old_object) = (None, None);
        let mut workload = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Uid => once(&mut uid, map.next_value()?, "uid")?,
                Field::Kind => once(&mut kind, map.next_value::<GroupVersionKind>()?, "kind")?,
                Field::Resource => once(&mut resource, map.next_value()?, "resource")?,
                Field::SubResource => once(&mut sub_resource, map.next_value()?, "subResource")?,
                Field::Name => once(&mut name, map.next_value()?, "name")?,
                Field::Namespace => once(&mut namespace, map.next_value()?, "namespace")?,
                Field::Operation => once(&mut operation, map.next_value()?, "operation")?,
                Field::DryRun => once(&mut dry_run, map.next_value()?, "dryRun")?,
                Field::OldObject => once(
                    &mut old_object,
                    map.next_value::<Option<&'a RawValue>>()?,
                    "oldObject",
                )?,
                Field::Object => match kind
                    .as_ref()
                    .map(|k: &GroupVersionKind| (k.group.as_str(), k.kind.as_str()))
                {
                    Some(("apps", "StatefulSet")) | Some(("batch", "Job")) => {
                        let kind = kind.as_ref().map(|k| k.kind.as_str()).unwrap_or_default();
                        let typed = map.next_value_seed(workload::Typed(kind))?;
                        once(&mut object, None, "object")?;
                        workload = typed;
                    }
                    _ => once(
                        &mut object,
                        map.next_value::<Option<&'a RawValue>>()?,
                        "object",
                    )?,
                },
                Field::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(TypedRequest {
            request: Request {
                uid: uid.ok_or_else(|| A::Error::missing_field("uid"))?,
                kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
                resource: resource.ok_or_else(|| A::Error::missing_field("resource"))?,
                sub_resource: sub_resource.flatten(),
                name: name.unwrap_or_default(),
                namespace: namespace.flatten(),
                operation: operation.ok_or_else(|| A::Error::missing_field("operation"))?,
                dry_run: dry_run.unwrap_or_default(),
                object: object.flatten(),
                old_object: old_object.flatten(),
            },
            workload,
        })
    }
}

/// The body must be an `admission.k8s.io/v1` AdmissionReview.
pub(super) fn check_envelope(doc: &Value) -> Result<(), String> {
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

pub(super) fn describe(v: Option<&Value>) -> String {
    match v {
        None => "missing".to_string(),
        Some(v) => v.to_string(),
    }
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
