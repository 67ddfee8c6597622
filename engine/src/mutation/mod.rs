//! The mutation engine: pure, no I/O.
//!
//! Entry point: [`mutate`]. It takes the workload as JSON (as it arrives in an
//! AdmissionReview or a YAML document), the namespace it will live in (when
//! known) and the policy profile that applies, and answers:
//! - [`Outcome::NotManaged`]: not a StatefulSet/Job, or not annotated
//!   `trainwire.dev/inject: "true"`: pass through untouched;
//! - [`Outcome::Mutated`]: the mutated object, the minimal RFC 6902 patch from
//!   input to output (empty when already injected), and warnings;
//! - `Err(Refusal)`: the workload cannot be made a torchrun world; the message
//!   names the annotation (or policy rule), the bad value and the accepted forms.
//!
//! The steps live in modules named after their domain: [`annotations`],
//! [`workload`] (StatefulSet/Job specifics), [`trainer`] (the trainer's env),
//! [`rendezvous`], [`nccl`], [`gpu`], [`volumes`], [`placement`],
//! [`sidecar_container`], [`status`] (the injected-status annotation that
//! makes re-injection correct) and [`patch`].

pub mod annotations;
pub mod diff;
pub mod fingerprint;
pub mod gpu;
pub mod injection;
pub mod job;
pub mod nccl;
pub mod patch;
pub mod placement;
pub mod reinjection;
pub mod rendezvous;
pub mod rendezvous_handler;
pub mod sidecar_container;
pub mod status;
pub mod tensorflow;
pub mod trainer;
pub mod volumes;
pub mod workload;

use serde_json::Value;

use crate::policy::{Framework, Profile};
use trainer::{Conflict, Desired};
use workload::Workload;

pub use injection::{Ctx, MAX_WARNING_LEN, MAX_WARNINGS, Refusal, with_detail};

/// The opt-in annotation.
pub const INJECT_ANNOTATION: &str = annotations::INJECT;

#[derive(Debug)]
pub enum Outcome<M = Mutation> {
    NotManaged,
    Mutated(M),
}

/// The offline answer: the mutated object too.
#[derive(Debug)]
pub struct Mutation {
    pub object: Value,
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
}

/// The admission answer: the patch and the warnings, no output object.
#[derive(Debug)]
pub struct Admitted {
    pub patch: patch::Ops,
    pub warnings: Vec<String>,
}

/// Mutate one workload given as JSON (offline `inject`, tests). See the
/// module docs.
///
/// `namespace` is the admission request's namespace; offline, `None` falls
/// back to `metadata.namespace`, then `default` (as kubectl does).
pub fn mutate(
    object: &Value,
    namespace: Option<&str>,
    profile: &Profile,
) -> Result<Outcome, Refusal> {
    let str_at = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (api_version, kind) = (str_at("/apiVersion"), str_at("/kind"));
    if !workload::is_managed_kind(api_version, kind) {
        return Ok(Outcome::NotManaged);
    }
    // Being deleted: let the garbage collector's finalizer updates through.
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Ok(Outcome::NotManaged);
    }
    let ann_map = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    if !annotations::opted_in(ann_map)? {
        return Ok(Outcome::NotManaged);
    }
    let ann = annotations::parse(ann_map)?;
    let workload = Workload::from_json(kind, object.clone())?;
    let admitted = run(workload, &ann, namespace, profile)?;
    let patch = admitted.patch.to_patch();
    let object = if patch.0.is_empty() {
        object.clone()
    } else {
        patch::apply_checked(object, &patch).map_err(|e| {
            Refusal::Workload(format!(
                "internal error: the patch does not apply to the input ({e}); please report it"
            ))
        })?
    };
    Ok(Outcome::Mutated(Mutation {
        object,
        patch,
        warnings: admitted.warnings,
    }))
}

/// What offline `inject` says about an object [`mutate`] passed through
/// untouched ([`Outcome::NotManaged`]) that its author probably meant
/// trainwire to inject: the opt-in on a kind trainwire does not manage (a
/// Deployment, a Pod, a CronJob...), a misspelt opt-in, or the opt-in on
/// the pod template instead of the workload. The admission webhook sees only
/// StatefulSets and Jobs, and a workload not opted in there is not read.
pub fn not_managed_warnings(object: &Value) -> Vec<String> {
    let str_at = |p: &str| object.pointer(p).and_then(Value::as_str);
    let (api_version, kind) = (
        str_at("/apiVersion").unwrap_or_default(),
        str_at("/kind").unwrap_or_default(),
    );
    let annotations = object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let opt_in = |map: Option<&serde_json::Map<String, Value>>| {
        map.and_then(|m| m.get(annotations::INJECT))
            .is_some_and(|v| v == "true" || v == &Value::Bool(true))
    };
    if !workload::is_managed_kind(api_version, kind) {
        if !opt_in(annotations) || kind == "List" {
            return Vec::new();
        }
        // `apps/v1beta2 StatefulSet`: the version is what is wrong.
        let what = if matches!(kind, "StatefulSet" | "Job") {
            format!("{api_version} {kind}")
        } else {
            kind.to_string()
        };
        return vec![format!(
            "{} is ignored on kind {what}: trainwire injects only {MANAGED_KINDS}",
            annotations::INJECT
        )];
    }
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Vec::new();
    }
    let mut warnings = annotations::misspelt_opt_in(annotations);
    let template = object
        .pointer("/spec/template/metadata/annotations")
        .and_then(Value::as_object);
    if !annotations.is_some_and(|a| a.contains_key(annotations::INJECT)) && opt_in(template) {
        warnings.push(format!(
            "{} is on the pod template: not injected; put it in the {kind}'s own metadata.annotations",
            annotations::INJECT
        ));
    }
    warnings
}

/// The kinds trainwire injects, as messages name them.
pub const MANAGED_KINDS: &str = "apps/v1 StatefulSets and batch/v1 Jobs";

/// Mutate one typed workload (the admission server's path: the object was
/// read once, straight into the typed model). Only the patch is computed,
/// from the typed before and after: fields the typed model does not know are
/// on neither side and are never touched.
pub fn mutate_typed(
    workload: Workload,
    namespace: Option<&str>,
    profile: &Profile,
) -> Result<Outcome<Admitted>, Refusal> {
    let meta = workload.metadata();
    if meta.deletion_timestamp.is_some() {
        return Ok(Outcome::NotManaged);
    }
    // Only trainwire's own annotations are read: a small map.
    let own: serde_json::Map<String, Value> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(annotations::PREFIX) || annotations::looks_like_ours(k))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    if !annotations::opted_in(Some(&own))? {
        return Ok(Outcome::NotManaged);
    }
    let ann = annotations::parse(Some(&own))?;
    run(workload, &ann, namespace, profile).map(Outcome::Mutated)
}

/// The engine proper, on the typed workload.
fn run(
    mut workload: Workload,
    ann: &annotations::Annotations,
    namespace: Option<&str>,
    profile: &Profile,
) -> Result<Admitted, Refusal> {
    if let Some(spec) = workload.template().and_then(|t| t.spec.as_ref()) {
        workload::Sizes::of(spec).check(workload.kind())?;
        workload::check_required(spec, workload.kind())?;
    }
    let namespace = namespace
        .filter(|n| !n.is_empty())
        .or(workload.metadata().namespace.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string();
    // The engine never changes the workload's own metadata (often the
    // largest part: managedFields, last-applied-configuration): the copy
    // kept for the diff leaves it out, and so does the diff below.
    let metadata = std::mem::take(workload.metadata_mut());
    let before = workload.clone();
    *workload.metadata_mut() = metadata;
    let mut ctx = Ctx::new(profile);
    for w in &ann.warnings {
        ctx.warn(w.clone());
    }

    if let workload::Workload::Job(j) = &workload {
        job::refuse_invalid(j)?;
    }
    // The workload itself carries the injected label too, so that the
    // controllers' StatefulSet and Job watches select on it: one `add`
    // beside the diff (which leaves the workload's metadata out), also when
    // nothing else changes (a label on the workload rolls no pod).
    let workload_label = status::workload_label(workload.metadata());

    let previous = workload.template().and_then(status::read);
    ctx.first_injection = previous.is_none();
    if previous.is_none()
        && let Some(template) = workload.template_mut()
    {
        reinjection::drop_unreadable(template);
    }
    let mut complete = false;
    if let Some(prev) = &previous
        && let Some(template) = workload.template_mut()
    {
        let stripped = reinjection::strip(template, prev);
        workload.unset(&stripped.workload_fields);
        complete = stripped.complete;
    }
    // The hash covers only what the user controls (see `status::input_hash`):
    // an UPDATE that changes none of it keeps the injected template exactly
    // as it is, even when the engine, the sidecar image or the policy changed
    // since, so an upgrade never rolls running training by itself.
    // The injected label is trainwire's, never the user's input: off before
    // hashing, on again below.
    if let Some(template) = workload.template_mut() {
        status::unlabel(template);
    }
    let hash = reinjection::input_hash(&workload, &namespace);

    inject(&mut ctx, &mut workload, ann, &namespace)?;
    ctx.status.version = status::VERSION.to_string();
    ctx.status.hash = hash.clone();
    if let Some(template) = workload.template_mut() {
        status::write(template, &ctx.status);
        status::label(template);
    }

    // Same user inputs (a label added, an upgrade of trainwire or its policy),
    // or a recomputation that changes nothing but the recorded hash/version:
    // no change at all, so no rollout of the pods.
    let same_inputs = complete && previous.as_ref().is_some_and(|p| p.hash == hash);
    if !same_inputs && let Some(prev) = &previous {
        workload::warn_held_back_resize(&mut ctx, &workload, &prev.nnodes);
    }
    *workload.metadata_mut() = Default::default();
    let mut patch = if same_inputs || reinjection::same_but_hash(&before, &workload) {
        patch::Ops::default()
    } else {
        diff::diff(before, workload)
    };
    if let Some(op) = workload_label {
        patch.0.insert(0, op);
    }
    Ok(Admitted {
        patch,
        warnings: ctx.into_warnings(),
    })
}

/// Every step, on a workload whose earlier injection (if any) is stripped.
fn inject(
    ctx: &mut Ctx<'_>,
    workload: &mut Workload,
    ann: &annotations::Annotations,
    namespace: &str,
) -> Result<(), Refusal> {
    let shape = workload.prepare(ctx, namespace)?;
    let kind = shape.kind;
    let Some(spec) = workload.template_mut().and_then(|t| t.spec.as_mut()) else {
        return Err(Refusal::Workload(format!(
            "{kind} {} has no spec.template.spec",
            shape.name
        )));
    };
    let trainer = trainer::find(spec, ann)?;
    ctx.status.container = spec.containers[trainer].name.clone();
    let gpus = gpu::apply(ctx, spec, trainer, ann)?;
    let framework = tensorflow::framework(ctx, ann)?;
    let world = rendezvous::world(ctx, &shape, ann, gpus, framework)?;
    ctx.status.nnodes = world.nnodes.map(|n| n.to_string()).unwrap_or_default();
    ctx.status.spares = world.spares;
    ctx.status.rdzv_store = world.store_service.clone().unwrap_or_default();
    let sidecar = sidecar_container::enabled(ctx, ann)?;
    // An init container of the sidecar's name that the strip kept is the
    // manifest's own (kept as is, with a warning): trainwire cannot give it
    // the handler's channel, so the trainer keeps torch's c10d.
    let own_sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == sidecar_container::NAME);
    let handler = rendezvous_handler::resolve(
        ctx,
        ann,
        &world,
        sidecar && !own_sidecar,
        &spec.containers[trainer],
    )?;
    let mut desired = match framework {
        Framework::PyTorch => {
            rendezvous::desired(ctx, &shape, ann, &world, &spec.containers[trainer])
        }
        Framework::TensorFlow => {
            tensorflow::check(ctx, ann, &world)?;
            tensorflow::desired(ctx, &shape, ann, &world, &spec.containers[trainer])?
        }
    };
    // PyTorch's own NCCL switch means nothing to TensorFlow (the NCCL_*
    // env of the policy and the annotation applies to both).
    desired.extend(
        nccl::desired(ctx, ann)?.into_iter().filter(|d| {
            framework == Framework::PyTorch || d.var.name != nccl::ASYNC_ERROR_HANDLING
        }),
    );
    if let Some(h) = handler {
        desired.retain(|d| d.var.name != "PET_RDZV_BACKEND");
        desired.extend(rendezvous_handler::desired(&spec.containers[trainer], h));
    }
    let checkpoint = volumes::checkpoint(ctx, &shape, ann, spec, trainer)?;
    if let Some(cp) = &checkpoint {
        desired.push(Desired::value(
            "CHECKPOINT_DIR",
            cp.path.clone(),
            "the checkpoint mount",
            Conflict::ManifestWins,
        ));
        if framework == Framework::PyTorch {
            desired.extend(nccl::flight_recorder(Some(&cp.path)));
        }
    }
    trainer::apply_env(ctx, &mut spec.containers[trainer], desired)?;
    rendezvous::host_network_dns(ctx, spec);
    ctx.status.service = shape.service.clone();
    ctx.status.rdzv_port = match framework {
        Framework::PyTorch => rendezvous::store_port(&world, ann, &spec.containers[trainer]),
        // Each worker's TensorFlow server (the Service exposes it).
        Framework::TensorFlow => Some(ann.rdzv_port),
    };
    volumes::shared(ctx, &shape, ann, spec, trainer)?;
    volumes::shm(ctx, ann, spec, trainer)?;
    if handler.is_some() {
        rendezvous_handler::volume(ctx, spec, trainer);
    }
    placement::apply(ctx, spec)?;
    if sidecar {
        sidecar_container::inject(ctx, &shape, ann, &world, checkpoint.as_ref(), spec, trainer)?;
        if handler.is_some() {
            rendezvous_handler::sidecar(ctx, spec, sidecar_container::NAME);
        }
    }
    if let Some(nnodes) = world.nnodes
        && let workload::Workload::Job(j) = workload
    {
        job::success_policy(ctx, j, nnodes.min(), world.spares);
    }
    if world.store == trainwire_contract::RdzvStore::Dedicated
        && let workload::Workload::Job(j) = workload
    {
        job::store_loss_budget(ctx, j);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
