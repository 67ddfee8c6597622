//! StatefulSet and Job specifics: where the pod template is, the world size
//! field, the headless Service that gives pods DNS names, the rank source and
//! the label selector of the workload's pods.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::Deserialize;
use serde_json::Value;

use super::injection::{Ctx, Refusal};
use super::job::{
    FIELD_NON_INDEXED, FIELD_POD_FAILURE_POLICY, FIELD_POD_REPLACEMENT_POLICY,
    FIELD_SUCCESS_POLICY, disruption_policy,
};

/// Downward-API path of a StatefulSet pod's index (Kubernetes 1.28+).
pub const STATEFULSET_RANK_FIELD: &str = "metadata.labels['apps.kubernetes.io/pod-index']";
/// Downward-API path of an Indexed Job pod's completion index.
pub const JOB_RANK_FIELD: &str = "metadata.annotations['batch.kubernetes.io/job-completion-index']";

/// A workload trainwire manages, typed.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    StatefulSet(Box<StatefulSet>),
    Job(Box<Job>),
}

/// An object as admission reads it: the spec typed, the metadata reduced
/// to what the engine reads.
#[derive(Deserialize)]
#[serde(bound(deserialize = "S: Deserialize<'de>"))]
struct ObjectLite<'a, S> {
    #[serde(rename = "apiVersion", default, borrow)]
    api_version: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    metadata: MetaLite,
    #[serde(default = "none")]
    spec: Option<S>,
}

fn none<S>() -> Option<S> {
    None
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaLite {
    name: Option<String>,
    namespace: Option<String>,
    generate_name: Option<String>,
    /// Read for the injected label only (present or not).
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
}

impl From<MetaLite> for ObjectMeta {
    fn from(m: MetaLite) -> ObjectMeta {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            generate_name: m.generate_name,
            labels: m.labels,
            annotations: m.annotations,
            deletion_timestamp: m.deletion_timestamp,
            ..ObjectMeta::default()
        }
    }
}

/// Reads a workload of kind `.0` (`StatefulSet`, else `Job`) as
/// [`Workload::from_str`] does, from any deserializer (an AdmissionReview's
/// `request.object` read in the same pass as the review); `null` is `None`.
/// An object of another apiVersion or kind is an error.
pub struct Typed<'k>(pub &'k str);

impl<'de> serde::de::DeserializeSeed<'de> for Typed<'_> {
    type Value = Option<Workload>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<Workload>, D::Error> {
        /// The object as `S`'s kind, checked to be `want` (apiVersion, kind).
        fn read<'de, S: Deserialize<'de>, D: serde::Deserializer<'de>>(
            d: D,
            want: (&str, &str),
            build: impl FnOnce(ObjectMeta, Option<S>) -> Workload,
        ) -> Result<Option<Workload>, D::Error> {
            let Some(o) = Option::<ObjectLite<'de, S>>::deserialize(d)? else {
                return Ok(None);
            };
            let (api_version, kind) = (o.api_version.as_deref(), o.kind.as_deref());
            if api_version.is_some_and(|v| v != want.0) || kind.is_some_and(|k| k != want.1) {
                return Err(serde::de::Error::custom(format!(
                    "expected {} {}, got {} {}",
                    want.0,
                    want.1,
                    api_version.unwrap_or("(no apiVersion)"),
                    kind.unwrap_or("(no kind)")
                )));
            }
            Ok(Some(build(o.metadata.into(), o.spec)))
        }
        match self.0 {
            "StatefulSet" => read(d, ("apps/v1", "StatefulSet"), |metadata, spec| {
                Workload::StatefulSet(Box::new(StatefulSet {
                    metadata,
                    spec,
                    status: None,
                }))
            }),
            _ => read(d, ("batch/v1", "Job"), |metadata, spec| {
                Workload::Job(Box::new(Job {
                    metadata,
                    spec,
                    status: None,
                }))
            }),
        }
    }
}

/// A StatefulSet whose world size changes on this UPDATE while its update
/// strategy keeps running pods on their old template (`OnDelete`, or a
/// `rollingUpdate.partition` above 0): those pods keep the old
/// `PET_NNODES` and new ones get the new size, and agents that disagree on
/// the size never form one world. Warned, not refused: the user may be
/// about to delete the pods.
pub fn warn_held_back_resize(ctx: &mut Ctx<'_>, workload: &Workload, old_nnodes: &str) {
    let Workload::StatefulSet(s) = workload else {
        return;
    };
    let new_nnodes = ctx.status.nnodes.clone();
    if old_nnodes.is_empty() || new_nnodes.is_empty() || old_nnodes == new_nnodes {
        return;
    }
    let Some(strategy) = s
        .spec
        .as_ref()
        .and_then(|spec| spec.update_strategy.as_ref())
    else {
        return;
    };
    let (held_back, which) = match strategy.type_.as_deref() {
        Some("OnDelete") => (
            "updateStrategy OnDelete".to_string(),
            "running pods".to_string(),
        ),
        _ => match strategy.rolling_update.as_ref().and_then(|r| r.partition) {
            Some(p) if p > 0 => (
                format!("rollingUpdate.partition {p}"),
                format!("pods below ordinal {p}"),
            ),
            _ => return,
        },
    };
    ctx.warn(format!(
        "world size {old_nnodes} -> {new_nnodes}, but {held_back} keeps {which} on the old size: delete those pods"
    ));
}

/// A Job whose `completionMode` is absent or `NonIndexed` (the
/// apiserver's default) is made Indexed (docs/warnings.md).
pub const NON_INDEXED_WARNING: &str = "spec.completionMode NonIndexed (the default) is changed to Indexed: a torchrun world needs a rank per pod";

/// A StatefulSet first injected with `podManagementPolicy` absent or
/// `OrderedReady` (the apiserver's default): its pods start one at a time,
/// each after the previous one is Running and Ready, so the world waits for
/// every pod in turn; the field is immutable (docs/warnings.md).
pub const ORDERED_READY_WARNING: &str = "podManagementPolicy OrderedReady starts the pods one at a time and cannot be changed later: set Parallel";

/// What the rest of the engine needs to know about the workload.
#[derive(Clone, Debug)]
pub struct Shape {
    pub kind: &'static str,
    pub name: String,
    pub namespace: String,
    /// The headless Service: `spec.serviceName` or the pod template's `subdomain`.
    pub service: String,
    /// `spec.replicas` or `spec.parallelism`.
    pub size: i32,
    pub size_field: &'static str,
    /// Label selector of exactly this workload's pods (`k=v,...`).
    pub selector: String,
    pub rank_field: &'static str,
}

impl Shape {
    /// Pod `i`'s DNS name, `{i}` standing for the index in the pattern: the
    /// fully qualified name, `<name>-<i>.<service>.<namespace>.svc.<domain>`.
    ///
    /// Exactly this name is the first on the pod's own line of the
    /// `/etc/hosts` the kubelet writes for a pod with a `hostname` and a
    /// `subdomain` (StatefulSet pods, Indexed Job pods with a subdomain). So
    /// pod 0 resolves its own name to its own address without DNS, and
    /// torchrun's c10d backend, which compares the endpoint with that
    /// canonical name, knows it hosts the store even while DNS still answers
    /// with the address of the pod it replaces, or with nothing yet. A
    /// shorter name (`....svc`) is not in `/etc/hosts` and depends on DNS.
    pub fn host(&self, i: &str, cluster_domain: &str) -> String {
        pod_host(
            &self.name,
            i,
            &self.service,
            &self.namespace,
            cluster_domain,
        )
    }
}

/// The fully qualified DNS name of pod `i` of workload `name` under the
/// headless Service `service` (see [`Shape::host`]).
pub fn pod_host(
    name: &str,
    i: &str,
    service: &str,
    namespace: &str,
    cluster_domain: &str,
) -> String {
    format!("{name}-{i}.{service}.{namespace}.svc.{cluster_domain}")
}

/// Which kinds are managed: `(apiVersion, kind)`.
pub fn is_managed_kind(api_version: &str, kind: &str) -> bool {
    matches!(
        (api_version, kind),
        ("apps/v1", "StatefulSet") | ("batch/v1", "Job")
    )
}

impl Workload {
    /// Read the workload. `object` has already been checked to be a managed kind.
    pub fn from_json(kind: &str, object: Value) -> Result<Workload, Refusal> {
        let object = quantities_as_strings(object);
        let unreadable =
            |e: serde_json::Error| Refusal::Workload(format!("the {kind} cannot be read: {e}"));
        match kind {
            "StatefulSet" => Ok(Workload::StatefulSet(Box::new(
                serde_json::from_value(object).map_err(unreadable)?,
            ))),
            _ => Ok(Workload::Job(Box::new(
                serde_json::from_value(object).map_err(unreadable)?,
            ))),
        }
    }

    pub fn to_json(&self) -> Value {
        match self {
            Workload::StatefulSet(s) => serde_json::to_value(s),
            Workload::Job(j) => serde_json::to_value(j),
        }
        .unwrap_or(Value::Null)
    }

    /// Read the workload from JSON text (an AdmissionReview's object),
    /// without an intermediate `Value`. Of the metadata only what the engine
    /// reads is kept (name, namespace, generateName, labels, annotations,
    /// deletionTimestamp): the rest (managedFields above all) is skipped,
    /// and so is `status`. See [`Typed`] for reading it inside a larger
    /// document.
    pub fn from_str(kind: &str, json: &str) -> Result<Workload, serde_json::Error> {
        use serde::de::DeserializeSeed as _;
        let mut de = serde_json::Deserializer::from_str(json);
        let workload = Typed(kind).deserialize(&mut de)?;
        de.end()?;
        workload.ok_or_else(|| serde::de::Error::custom(format!("expected a {kind}, got null")))
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Workload::StatefulSet(s) => &mut s.metadata,
            Workload::Job(j) => &mut j.metadata,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Workload::StatefulSet(s) => &s.metadata,
            Workload::Job(j) => &j.metadata,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Workload::StatefulSet(_) => "StatefulSet",
            Workload::Job(_) => "Job",
        }
    }

    pub fn template(&self) -> Option<&PodTemplateSpec> {
        match self {
            Workload::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
            Workload::Job(j) => j.spec.as_ref().map(|s| &s.template),
        }
    }

    pub fn template_mut(&mut self) -> Option<&mut PodTemplateSpec> {
        match self {
            Workload::StatefulSet(s) => s.spec.as_mut().map(|s| &mut s.template),
            Workload::Job(j) => j.spec.as_mut().map(|s| &mut s.template),
        }
    }

    /// Unset workload-level fields an earlier injection set, and restore the
    /// values it replaced (see the status).
    pub fn unset(&mut self, fields: &[String]) {
        if let Workload::Job(j) = self
            && let Some(spec) = j.spec.as_mut()
        {
            for f in fields {
                match f.as_str() {
                    "completionMode" => spec.completion_mode = None,
                    FIELD_NON_INDEXED => spec.completion_mode = Some("NonIndexed".to_string()),
                    "completions" => spec.completions = None,
                    FIELD_POD_FAILURE_POLICY => spec.pod_failure_policy = None,
                    FIELD_SUCCESS_POLICY => spec.success_policy = None,
                    FIELD_POD_REPLACEMENT_POLICY => spec.pod_replacement_policy = None,
                    other => {
                        if let Some(previous) = other
                            .strip_prefix(FIELD_POD_REPLACEMENT_POLICY)
                            .and_then(|rest| rest.strip_prefix('='))
                        {
                            spec.pod_replacement_policy = Some(previous.to_string());
                        }
                    }
                }
            }
        }
    }

    /// Check the shape, complete a Job (Indexed, completions, subdomain) and
    /// describe the workload.
    pub fn prepare(&mut self, ctx: &mut Ctx<'_>, namespace: &str) -> Result<Shape, Refusal> {
        let kind = self.kind();
        let name = match self {
            Workload::StatefulSet(s) => s.metadata.name.clone(),
            Workload::Job(j) => j.metadata.name.clone(),
        }
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            Refusal::Workload(format!(
                "the {kind} has no metadata.name; trainwire needs a fixed name for the pods' DNS names (generateName is not supported)"
            ))
        })?;
        // The name becomes the pods' host names and the rendezvous host's
        // DNS name (`<name>-0.<service>...`), and a Job's Service name and
        // selector: found by fuzzing, a name the apiserver would never
        // accept (`eval\u{a0}`) gave `inject` a Service that read back as
        // another name.
        if !super::annotations::is_dns_label(&name) {
            return Err(Refusal::Workload(format!(
                "the {kind}'s metadata.name {name:?} is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters); trainwire needs one for the pods' DNS names ({name}-0.<service>.{namespace}.svc)"
            )));
        }
        if self.template().and_then(|t| t.spec.as_ref()).is_none() {
            return Err(Refusal::Workload(format!(
                "{kind} {name} has no spec.template.spec; add the pod template with the trainer container"
            )));
        }
        match self {
            Workload::StatefulSet(s) => {
                let spec = s
                    .spec
                    .as_ref()
                    .ok_or_else(|| Refusal::Workload(format!("StatefulSet {name} has no spec")))?;
                let service = spec.service_name.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                    Refusal::Workload(format!(
                        "StatefulSet {name} has no spec.serviceName; trainwire needs a headless Service (clusterIP: None) selecting its pods and named in spec.serviceName, so that pod 0 has the DNS name {name}-0.<service>.{namespace}.svc.<cluster domain> for the rendezvous"
                    ))
                })?;
                // `spec.ordinals.start` (Kubernetes 1.27+, meant for moving a
                // StatefulSet between clusters) renumbers the pods: there is
                // no pod 0 to host the rendezvous, and the pod-index label the
                // ranks are read from (the downward API cannot subtract)
                // starts at `start`.
                if let Some(start) = spec
                    .ordinals
                    .as_ref()
                    .and_then(|o| o.start)
                    .filter(|s| *s != 0)
                {
                    return Err(Refusal::Workload(format!(
                        "StatefulSet {name} has spec.ordinals.start {start}, so its pods are {name}-{start}, {name}-{next}, ...; a torchrun world needs pod {name}-0 (the rendezvous host, {name}-0.{service}.{namespace}.svc) and node ranks 0 to replicas-1, which trainwire reads from the pod index; remove spec.ordinals or set start: 0",
                        next = i64::from(start) + 1
                    )));
                }
                // The apiserver defaults it to OrderedReady before admission,
                // and it is immutable: only the first injection says it.
                if ctx.first_injection
                    && spec
                        .pod_management_policy
                        .as_deref()
                        .is_none_or(|p| p == "OrderedReady")
                {
                    ctx.warn(ORDERED_READY_WARNING.to_string());
                }
                Ok(Shape {
                    kind,
                    selector: selector_string(&spec.selector),
                    name,
                    namespace: namespace.to_string(),
                    service,
                    size: spec.replicas.unwrap_or(1),
                    size_field: "spec.replicas",
                    rank_field: STATEFULSET_RANK_FIELD,
                })
            }
            Workload::Job(j) => {
                let spec = j
                    .spec
                    .as_mut()
                    .ok_or_else(|| Refusal::Workload(format!("Job {name} has no spec")))?;
                // The apiserver defaults `completionMode` to `NonIndexed`
                // before admission, so a manifest that says nothing about it
                // arrives as `NonIndexed`, exactly like one that says so: both
                // become Indexed (this runs on CREATE only; a Job's template
                // is immutable after).
                match spec.completion_mode.as_deref() {
                    None => {
                        spec.completion_mode = Some("Indexed".to_string());
                        ctx.status.fields.push("completionMode".to_string());
                        // Offline the field is absent where the apiserver
                        // would have defaulted it: the same warning.
                        ctx.warn(NON_INDEXED_WARNING.to_string());
                    }
                    Some("Indexed") => {}
                    Some("NonIndexed") => {
                        spec.completion_mode = Some("Indexed".to_string());
                        // Recorded with the value it replaced, so that a
                        // re-admission strips back to the very input that
                        // was hashed, and the same input stays a no-op.
                        ctx.status.fields.push(FIELD_NON_INDEXED.to_string());
                        ctx.warn(NON_INDEXED_WARNING.to_string());
                    }
                    Some(other) => {
                        return Err(Refusal::Workload(format!(
                            "Job {name} has spec.completionMode {other:?}, which trainwire does not know; a torchrun world needs a node rank per pod, which only an Indexed Job gives: set completionMode: Indexed, or leave it out and trainwire sets it"
                        )));
                    }
                }
                let parallelism = spec.parallelism.unwrap_or(1);
                match spec.completions {
                    None => {
                        spec.completions = Some(parallelism);
                        ctx.status.fields.push("completions".to_string());
                    }
                    Some(c) if c != parallelism => ctx.warn(format!(
                        "spec.completions {c} differs from spec.parallelism {parallelism}: a world's ranks run at once; set both to the node count"
                    )),
                    Some(_) => {}
                }
                let pod = spec.template.spec.get_or_insert_with(Default::default);
                let service = match pod.subdomain.clone().filter(|s| !s.is_empty()) {
                    Some(s) => s,
                    None => {
                        pod.subdomain = Some(name.clone());
                        ctx.status.fields.push("subdomain".to_string());
                        name.clone()
                    }
                };
                disruption_policy(ctx, spec);
                Ok(Shape {
                    kind,
                    selector: format!("batch.kubernetes.io/job-name={name}"),
                    name,
                    namespace: namespace.to_string(),
                    service,
                    size: parallelism,
                    size_field: "spec.parallelism",
                    rank_field: JOB_RANK_FIELD,
                })
            }
        }
    }
}

/// A `LabelSelector` as a selector string (`k=v,k2 in (a,b),!k3`).
pub fn selector_string(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// YAML turns `nvidia.com/gpu: 1` into a number, which the apiserver accepts
/// as a quantity but the typed model does not: make quantity values strings.
fn quantities_as_strings(mut v: Value) -> Value {
    fn walk(v: &mut Value, quantity_map: bool) {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter_mut() {
                    if let Value::Number(n) = child
                        && (quantity_map || k == "sizeLimit" || k == "storage")
                    {
                        *child = Value::String(n.to_string());
                        continue;
                    }
                    walk(
                        child,
                        matches!(k.as_str(), "limits" | "requests" | "overhead" | "capacity"),
                    );
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|c| walk(c, false)),
            _ => {}
        }
    }
    walk(&mut v, false);
    v
}

/// The most entries of each large list of a pod template trainwire works on.
/// A k8s-openapi `Volume` takes 3.2 KB in memory and a `Container` 2.1 KB,
/// from as little as 25 bytes of JSON: without a bound, a 4 MiB review of
/// 150,000 one-line volumes would take over a gigabyte to read. No real pod
/// comes near these numbers (the kubelet would not start it).
pub const MAX_VOLUMES: usize = 1024;
/// See [`MAX_VOLUMES`]: containers, init containers and ephemeral containers
/// together.
pub const MAX_CONTAINERS: usize = 256;

/// The pod template's list sizes, and the refusal when one is over its bound.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub volumes: usize,
    pub containers: usize,
}

impl Sizes {
    pub fn of(spec: &PodSpec) -> Sizes {
        Sizes {
            volumes: spec.volumes.as_ref().map_or(0, Vec::len),
            containers: spec.containers.len()
                + spec.init_containers.as_ref().map_or(0, Vec::len)
                + spec.ephemeral_containers.as_ref().map_or(0, Vec::len),
        }
    }

    pub fn check(self, kind: &str) -> Result<(), Refusal> {
        if self.volumes > MAX_VOLUMES {
            return Err(Refusal::Workload(format!(
                "the {kind}'s pod template has {} volumes; trainwire injects into pods of at most {MAX_VOLUMES}",
                self.volumes
            )));
        }
        if self.containers > MAX_CONTAINERS {
            return Err(Refusal::Workload(format!(
                "the {kind}'s pod template has {} containers (with init and ephemeral ones); trainwire injects into pods of at most {MAX_CONTAINERS}",
                self.containers
            )));
        }
        Ok(())
    }
}

/// What a quick pass over a workload's JSON text tells before it is read
/// into the typed model (which costs memory in the size of its lists).
#[derive(Debug, PartialEq, Eq)]
pub enum Outline {
    /// Not opted in (no `trainwire.dev/inject: "true"`), or being deleted:
    /// passed through untouched, never read further.
    NotManaged,
    /// Opted in, with these list sizes.
    Managed(Sizes),
}

impl Outline {
    /// `None` when the text does not have the expected shape (the typed
    /// reading then says what is wrong with it).
    pub fn of(object: &str) -> Option<Outline> {
        use serde::de::IgnoredAny;

        /// The length of a JSON array (`null`: 0), its elements skipped.
        #[derive(Default)]
        struct Count(usize);
        impl<'de> Deserialize<'de> for Count {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = Count;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a list")
                    }
                    fn visit_unit<E>(self) -> Result<Count, E> {
                        Ok(Count(0))
                    }
                    fn visit_seq<A: serde::de::SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Count, A::Error> {
                        let mut n = 0usize;
                        while seq.next_element::<IgnoredAny>()?.is_some() {
                            n += 1;
                        }
                        Ok(Count(n))
                    }
                }
                d.deserialize_any(V)
            }
        }
        /// The opt-in annotation's value, the others skipped.
        #[derive(Default)]
        struct OptIn(Option<Value>);
        impl<'de> Deserialize<'de> for OptIn {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> serde::de::Visitor<'de> for V {
                    type Value = OptIn;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a map")
                    }
                    fn visit_unit<E>(self) -> Result<OptIn, E> {
                        Ok(OptIn(None))
                    }
                    fn visit_map<A: serde::de::MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<OptIn, A::Error> {
                        let mut value = None;
                        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                            if key == super::annotations::INJECT {
                                value = Some(map.next_value::<Value>()?);
                            } else {
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                        Ok(OptIn(value))
                    }
                }
                d.deserialize_any(V)
            }
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Meta {
            annotations: OptIn,
            deletion_timestamp: Option<IgnoredAny>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Pod {
            volumes: Count,
            containers: Count,
            init_containers: Count,
            ephemeral_containers: Count,
        }
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Template {
            spec: Option<Pod>,
        }
        #[derive(Deserialize, Default)]
        #[serde(default)]
        struct Spec {
            template: Option<Template>,
        }
        #[derive(Deserialize)]
        struct Object {
            #[serde(default)]
            metadata: Option<Meta>,
            #[serde(default)]
            spec: Option<Spec>,
        }
        let o: Object = serde_json::from_str(object).ok()?;
        let meta = o.metadata.unwrap_or_default();
        // The opt-in read with the engine's own grammar; a value it refuses
        // is left to the typed reading, which says so.
        let inject: serde_json::Map<String, Value> = meta
            .annotations
            .0
            .map(|v| (super::annotations::INJECT.to_string(), v))
            .into_iter()
            .collect();
        if !super::annotations::opted_in(Some(&inject)).ok()? || meta.deletion_timestamp.is_some() {
            return Some(Outline::NotManaged);
        }
        let pod = o
            .spec
            .and_then(|s| s.template)
            .and_then(|t| t.spec)
            .unwrap_or_default();
        Some(Outline::Managed(Sizes {
            volumes: pod.volumes.0,
            containers: pod.containers.0 + pod.init_containers.0 + pod.ephemeral_containers.0,
        }))
    }
}

/// Every entry of the lists the engine edits has the fields Kubernetes
/// requires of it (a container's, an env var's and a volume's `name`, a
/// mount's `name` and `mountPath`). The typed model reads an absent one as
/// empty, and a patch that edited such an entry could name a member the
/// object does not have; the apiserver's validation, which runs after
/// admission, would refuse the object anyway. Refused here with what is
/// missing where.
pub fn check_required(spec: &PodSpec, kind: &str) -> Result<(), Refusal> {
    let missing = |what: String| {
        Err(Refusal::Workload(format!(
            "the {kind}'s pod template has {what}; Kubernetes requires it"
        )))
    };
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for (i, c) in containers.enumerate() {
        if c.name.is_empty() {
            return missing(format!("a container without a name (container {i})"));
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            if e.name.is_empty() {
                return missing(format!(
                    "an env entry without a name (container {:?}, env {j})",
                    c.name
                ));
            }
        }
        for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
            if m.name.is_empty() || m.mount_path.is_empty() {
                let field = if m.name.is_empty() {
                    "name"
                } else {
                    "mountPath"
                };
                return missing(format!(
                    "a volumeMount without {field} (container {:?}, volumeMounts {j})",
                    c.name
                ));
            }
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if v.name.is_empty() {
            return missing(format!("a volume without a name (volumes {i})"));
        }
    }
    Ok(())
}
