//! The minimal RFC 6902 patch from the workload as it came to the workload
//! as injected ([`diff`]), computed on the typed model level by level.

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use std::mem::take;

use serde::Serialize;

use super::patch;
use super::workload::*;

/// The minimal patch from `before` to `after`, computed on the typed model:
/// each level is compared typed first, and only the parts that differ are
/// serialised and diffed as JSON. The engine changes the pod template's
/// annotations, the containers' env, mounts and resources, the init
/// containers, volumes and tolerations: those are taken apart; any other
/// change is found by comparing what is left at each level.
pub fn diff(before: Workload, after: Workload) -> patch::Ops {
    let mut d = patch::Differ::default();
    match (before, after) {
        (Workload::StatefulSet(b), Workload::StatefulSet(a)) => {
            let (b, a) = (*b, *a);
            d.optional_json("metadata", Some(b.metadata), Some(a.metadata));
            spec(&mut d, b.spec, a.spec, |s| &mut s.template);
        }
        (Workload::Job(b), Workload::Job(a)) => {
            let (b, a) = (*b, *a);
            d.optional_json("metadata", Some(b.metadata), Some(a.metadata));
            spec(&mut d, b.spec, a.spec, |s| &mut s.template);
        }
        // The engine never changes the kind.
        _ => {}
    }
    d.finish()
}

/// The member `spec` of a StatefulSet or a Job: its `template` taken apart.
fn spec<S: Serialize + PartialEq>(
    d: &mut patch::Differ,
    before: Option<S>,
    after: Option<S>,
    template_of: fn(&mut S) -> &mut PodTemplateSpec,
) {
    d.optional("spec", before, after, |d, mut b, mut a| {
        let (bt, at) = (take(template_of(&mut b)), take(template_of(&mut a)));
        d.object(
            &b,
            &a,
            vec![("template", Box::new(|d| template(d, bt, at)))],
        );
    });
}

/// The member `template` (required, so present on both sides).
fn template(d: &mut patch::Differ, b: PodTemplateSpec, a: PodTemplateSpec) {
    d.optional("template", Some(b), Some(a), |d, b, a| {
        d.optional("metadata", b.metadata, a.metadata, |d, mut b, mut a| {
            let (ba, aa) = (b.annotations.take(), a.annotations.take());
            d.object(
                &b,
                &a,
                vec![(
                    "annotations",
                    Box::new(|d| d.optional_json("annotations", ba, aa)),
                )],
            );
        });
        d.optional("spec", b.spec, a.spec, pod_spec);
    });
}

fn pod_spec(d: &mut patch::Differ, mut b: PodSpec, mut a: PodSpec) {
    let (bc, ac) = (take(&mut b.containers), take(&mut a.containers));
    let (bi, ai) = (b.init_containers.take(), a.init_containers.take());
    let (bt, at) = (b.tolerations.take(), a.tolerations.take());
    let (bv, av) = (b.volumes.take(), a.volumes.take());
    d.object(
        &b,
        &a,
        vec![
            (
                "containers",
                Box::new(|d| d.optional("containers", Some(bc), Some(ac), containers)),
            ),
            (
                "initContainers",
                Box::new(|d| d.optional("initContainers", bi, ai, containers)),
            ),
            (
                "tolerations",
                Box::new(|d| d.optional_json("tolerations", bt, at)),
            ),
            (
                "volumes",
                Box::new(|d| d.optional_keyed_list("volumes", bv, av, |v| v.name.as_str())),
            ),
        ],
    );
}

fn containers(d: &mut patch::Differ, b: Vec<Container>, a: Vec<Container>) {
    d.named_list(
        b,
        a,
        |c| c.name.as_str(),
        |d, mut b, mut a| {
            let (be, ae) = (b.env.take(), a.env.take());
            let (br, ar) = (b.resources.take(), a.resources.take());
            let (bm, am) = (b.volume_mounts.take(), a.volume_mounts.take());
            d.object(
                &b,
                &a,
                vec![
                    (
                        "env",
                        Box::new(|d| d.optional_keyed_list("env", be, ae, |e| e.name.as_str())),
                    ),
                    (
                        "resources",
                        Box::new(|d| d.optional_json("resources", br, ar)),
                    ),
                    (
                        "volumeMounts",
                        Box::new(|d| {
                            d.optional_keyed_list("volumeMounts", bm, am, |m| m.name.as_str())
                        }),
                    ),
                ],
            );
        },
    );
}
