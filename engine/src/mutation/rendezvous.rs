//! The torchrun world: `PET_*` env (torchrun reads each as the default of its
//! flag, so `torchrun train.py` needs no flags), `MASTER_*`/`NNODES`/
//! `WORLD_SIZE` for other launchers, and what torchrun's own restart needs
//! to survive a lost peer (measured: `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`
//! and rendezvous keep-alives of 1 s × 3).

use k8s_openapi::api::core::v1::{Container, PodSpec};
use trainwire_contract::rendezvous;

use super::annotations::{self, Annotations, Nnodes, Nproc};
use super::injection::{Ctx, Refusal};
use super::trainer::{self, Conflict, Desired};
use super::workload::Shape;
use crate::policy::{self, Framework, RdzvBackend, RdzvStore};

pub const RDZV_CONF: &str = "PET_RDZV_CONF";
pub const DISABLE_SHARE_STORE: &str = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE";
/// Keep-alive settings merged into `PET_RDZV_CONF`: a lost node leaves the
/// rendezvous after about 3 s instead of 15.
pub const KEEP_ALIVE: [(&str, &str); 2] = [
    ("keep_alive_interval", rendezvous::KEEP_ALIVE_INTERVAL),
    ("keep_alive_max_attempt", rendezvous::KEEP_ALIVE_MAX_ATTEMPT),
];
/// Merged into `PET_RDZV_CONF` for an elastic world (`MIN:MAX`) only:
/// torchrun waits `last_call_timeout` (30 s by default) for more nodes once
/// MIN have joined, so a world that lost a node would stand still that long
/// before it shrinks (measured: 37 s from the cut). With 1 s it goes on
/// within seconds; a node that starts later than that joins at the next
/// scale-up (torchrun restarts the workers when a node waits), which costs
/// one worker restart at the job's start, no progress.
pub const ELASTIC_LAST_CALL: (&str, &str) = ("last_call_timeout", "1");
/// torchrun's default `join_timeout` (seconds); shorter makes recovery impossible.
pub const DEFAULT_JOIN_TIMEOUT: u64 = 600;

/// The world as decided: size, processes per node, backend and endpoint.
#[derive(Clone, Debug)]
pub struct World {
    /// `None`: a StatefulSet created at `replicas: 0` with no
    /// `trainwire.dev/nnodes`: paused, its world size unknown. Its pods get
    /// no world-size env (never a world of 0); the size is injected when the
    /// StatefulSet is scaled up through a path that re-injects (`kubectl
    /// apply`/`patch`), and the scale guard refuses `kubectl scale` from 0.
    pub nnodes: Option<Nnodes>,
    pub nproc: Nproc,
    pub backend: RdzvBackend,
    pub endpoint: String,
    /// Pod 0's DNS name, the rendezvous host for c10d and static.
    pub host: String,
    /// Where the c10d store runs.
    pub store: RdzvStore,
    /// The dedicated store's Service (`<name>-rdzv`), when `store` is
    /// dedicated.
    pub store_service: Option<String>,
    /// Hot spares: pods beyond the world's largest size.
    pub spares: u32,
    /// The framework the world runs (see
    /// [`super::tensorflow`]).
    pub framework: Framework,
}

pub fn backend_name(b: RdzvBackend) -> &'static str {
    match b {
        RdzvBackend::C10d => "c10d",
        RdzvBackend::Static => "static",
        RdzvBackend::EtcdV2 => "etcd-v2",
    }
}

/// Decide the world from the annotations, the workload and the policy.
pub fn world(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    gpus: u32,
    framework: Framework,
) -> Result<World, Refusal> {
    let profile = ctx.profile;
    if framework == Framework::TensorFlow {
        tensorflow_topology(profile, ann)?;
        return sized(ctx, shape, ann, 0, gpus, framework);
    }
    let resolved = policy::resolve(
        profile,
        "spares",
        &profile.spares,
        ann.spares
            .map(|n| (n, format!("annotation {}", annotations::SPARES)))
            .as_ref()
            .map(|(n, s)| (*n, s.as_str())),
    )?;
    if let Some(w) = resolved.warning {
        ctx.warn(w);
    }
    sized(ctx, shape, ann, resolved.value.get(), gpus, framework)
}

/// A TensorFlow world has a fixed set of workers and no torchrun store:
/// spares and a dedicated store are refused when the workload or an
/// enforced policy asks for them; a policy's mere default is not applied.
fn tensorflow_topology(profile: &policy::Profile, ann: &Annotations) -> Result<(), Refusal> {
    let enforced = |e: &policy::Enforce| *e != policy::Enforce::Default;
    let spares = ann
        .spares
        .filter(|n| n.get() > 0)
        .map(|n| n.to_string())
        .or_else(|| {
            (enforced(&profile.spares.enforce) && profile.spares.value.get() > 0)
                .then(|| profile.spares.value.to_string())
        });
    let store = ann
        .rdzv_store
        .filter(|s| *s == RdzvStore::Dedicated)
        .or_else(|| {
            (enforced(&profile.rdzv_store.enforce)
                && profile.rdzv_store.value == RdzvStore::Dedicated)
                .then_some(RdzvStore::Dedicated)
        });
    let why = format!(
        "{}: tensorflow runs a fixed set of workers with no torchrun rendezvous",
        annotations::FRAMEWORK
    );
    if let Some(n) = spares {
        return Err(Refusal::Annotation {
            annotation: annotations::SPARES.to_string(),
            value: n,
            reason: why,
            accepted: "0 with framework tensorflow, or framework pytorch (torchrun)".to_string(),
        });
    }
    if let Some(s) = store {
        return Err(Refusal::Annotation {
            annotation: annotations::RDZV_STORE.to_string(),
            value: s.to_string(),
            reason: why,
            accepted: "pod0 with framework tensorflow, or framework pytorch (torchrun)".to_string(),
        });
    }
    Ok(())
}

/// The world once the spares are known.
fn sized(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    spares: u32,
    gpus: u32,
    framework: Framework,
) -> Result<World, Refusal> {
    let size = u32::try_from(shape.size).unwrap_or(0);
    let nnodes = match ann.nnodes {
        None if size == 0 && shape.kind == "StatefulSet" => {
            ctx.warn(format!(
                    "replicas 0 without {}: no world size; scale up with kubectl apply or patch, not kubectl scale",
                    annotations::NNODES
                ));
            return finish(ctx, shape, ann, None, spares, gpus, framework);
        }
        None if size == 0 => {
            return Err(Refusal::Workload(format!(
                "{} {} has {} 0 and no annotation {}: a torchrun world of 0 nodes cannot run, and a Job's pod template cannot be re-injected later; set {} to the number of nodes",
                shape.kind,
                shape.name,
                shape.size_field,
                annotations::NNODES,
                shape.size_field
            )));
        }
        None if size <= spares => {
            return Err(Refusal::Workload(format!(
                "{} {}: {} {size} leaves no training node beside {spares} spares ({}); set {} to nodes + spares, or annotate {}",
                shape.kind,
                shape.name,
                shape.size_field,
                annotations::SPARES,
                shape.size_field,
                annotations::NNODES
            )));
        }
        None => Nnodes::Fixed(size - spares),
        Some(n) => {
            let pods = n.max().saturating_add(spares);
            if size < n.min() || size > pods {
                ctx.warn(format!(
                    "{} is {n}{} but {} is {size}: the world {} until they agree",
                    annotations::NNODES,
                    if spares > 0 {
                        format!(" with {spares} spares")
                    } else {
                        String::new()
                    },
                    shape.size_field,
                    if size < n.min() {
                        "does not form"
                    } else {
                        "leaves pods out"
                    }
                ));
            } else if spares > 0 && size < pods {
                ctx.warn(format!(
                    "{} {size} holds {} of the {spares} spares of {}: set it to {pods}",
                    shape.size_field,
                    size.saturating_sub(n.max()),
                    annotations::SPARES
                ));
            }
            n
        }
    };
    finish(ctx, shape, ann, Some(nnodes), spares, gpus, framework)
}

/// The dedicated store's Service name for workload `name`.
pub fn store_service_name(name: &str) -> String {
    format!("{name}-{STORE_SUFFIX}")
}

/// What the dedicated store's Service and Deployment are named after the
/// workload: `<name>-rdzv`.
pub const STORE_SUFFIX: &str = "rdzv";

/// The rest of the world once its size is known (or paused).
fn finish(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    nnodes: Option<Nnodes>,
    spares: u32,
    gpus: u32,
    framework: Framework,
) -> Result<World, Refusal> {
    let profile = ctx.profile;
    // Spares are nodes too (they hold GPUs while they wait).
    if let Some(max) = profile.max_nodes
        && let Some(nnodes) = nnodes
        && nnodes.max().saturating_add(spares) > max
    {
        let spares = match spares {
            0 => String::new(),
            n => format!(" plus {n} spares ({})", annotations::SPARES),
        };
        return Err(Refusal::Policy {
            profile: profile.name.clone(),
            rule: "maxNodes".to_string(),
            detail: format!(
                "the world asks for up to {} nodes ({} or annotation {}){spares}, more than the {max} allowed",
                nnodes.max(),
                shape.size_field,
                annotations::NNODES
            ),
        });
    }
    let nproc = ann
        .nproc_per_node
        .clone()
        .unwrap_or(Nproc::Count(gpus.max(1)));
    let resolved = policy::resolve(
        profile,
        "rdzvBackend",
        &profile.rdzv_backend,
        ann.rdzv_backend
            .map(|b| (b, format!("annotation {}", annotations::RDZV_BACKEND)))
            .as_ref()
            .map(|(b, s)| (*b, s.as_str())),
    )?;
    if let Some(w) = resolved.warning {
        ctx.warn(w);
    }
    let backend = resolved.value;
    if backend == RdzvBackend::Static
        && let Some(nnodes @ Nnodes::Elastic { .. }) = nnodes
    {
        return Err(Refusal::Annotation {
                annotation: annotations::NNODES.to_string(),
                value: nnodes.to_string(),
                reason: "the static rendezvous backend cannot run an elastic world".to_string(),
                accepted: "a fixed node count such as \"4\" with rdzv-backend static, or rdzv-backend c10d for MIN:MAX".to_string(),
            });
    }
    let resolved = policy::resolve(
        profile,
        "rdzvStore",
        &profile.rdzv_store,
        ann.rdzv_store
            .map(|b| (b, format!("annotation {}", annotations::RDZV_STORE)))
            .as_ref()
            .map(|(b, s)| (*b, s.as_str())),
    )?;
    if let Some(w) = resolved.warning {
        ctx.warn(w);
    }
    // A TensorFlow world has no torchrun store ([`tensorflow_topology`]).
    let store = match framework {
        Framework::TensorFlow => RdzvStore::Pod0,
        Framework::PyTorch => resolved.value,
    };
    topology(ctx, shape, backend, store, spares)?;
    let host = shape.host("0", profile.cluster_domain());
    let store_service = (store == RdzvStore::Dedicated).then(|| store_service_name(&shape.name));
    let endpoint = match (backend, &store_service) {
        (RdzvBackend::EtcdV2, _) => profile
            .etcd_endpoint
            .clone()
            .filter(|e| !e.is_empty())
            .ok_or_else(|| Refusal::Policy {
                profile: profile.name.clone(),
                rule: "etcdEndpoint".to_string(),
                detail: "the etcd-v2 rendezvous backend needs an etcd endpoint and the policy gives none; use rdzv-backend c10d, or ask the platform team to set etcdEndpoint".to_string(),
            })?,
        (_, Some(service)) => format!(
            "{service}.{}.svc.{}:{}",
            shape.namespace,
            profile.cluster_domain(),
            ann.rdzv_port
        ),
        _ => format!("{host}:{}", ann.rdzv_port),
    };
    Ok(World {
        nnodes,
        nproc,
        backend,
        endpoint,
        host,
        store,
        store_service,
        spares,
        framework,
    })
}

/// Which store and spares go with which backend: both need torchrun's
/// dynamic rendezvous on a c10d store (measured with it); spares with the
/// store on pod 0 are warned: losing pod 0 still waits for its replacement.
fn topology(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    backend: RdzvBackend,
    store: RdzvStore,
    spares: u32,
) -> Result<(), Refusal> {
    let refuse = |annotation: &str, value: String, reason: String, accepted: &str| {
        Err(Refusal::Annotation {
            annotation: annotation.to_string(),
            value,
            reason,
            accepted: accepted.to_string(),
        })
    };
    if store == RdzvStore::Dedicated && backend != RdzvBackend::C10d {
        return refuse(
            annotations::RDZV_STORE,
            store.to_string(),
            format!(
                "a dedicated store is torch's c10d TCPStore, and the rendezvous backend is {}",
                backend_name(backend)
            ),
            "dedicated with rdzv-backend c10d (the default); etcd-v2's store is already outside the pods",
        );
    }
    if spares > 0 && backend != RdzvBackend::C10d {
        return refuse(
            annotations::SPARES,
            spares.to_string(),
            format!(
                "spares wait in the c10d rendezvous, and the backend is {}",
                backend_name(backend)
            ),
            "0, or spares with rdzv-backend c10d (the default)",
        );
    }
    if store == RdzvStore::Dedicated {
        let service = store_service_name(&shape.name);
        // A Service name is a DNS-1035 label: it starts with a letter.
        if service.len() > 63 || !shape.name.starts_with(|c: char| c.is_ascii_lowercase()) {
            return Err(Refusal::Workload(format!(
                "{} {}: the dedicated store's Service would be named {service:?}, which is not a DNS-1035 label (a letter first, at most 63 characters); shorten the name to at most 58 characters starting with a letter, or use {}: pod0",
                shape.kind,
                shape.name,
                annotations::RDZV_STORE
            )));
        }
    }
    if spares > 0 && store == RdzvStore::Pod0 {
        ctx.warn(format!(
            "spares replace any lost node but pod 0, whose loss stops the store: add {}: dedicated",
            annotations::RDZV_STORE
        ));
    }
    Ok(())
}

/// The status `fields` entry for `dnsPolicy: ClusterFirstWithHostNet` set
/// where it was absent; `dnsPolicy=<previous value>` where it replaced one.
pub const FIELD_DNS_POLICY: &str = "dnsPolicy";
/// The DNS policy that lets a pod on the host's network resolve cluster names.
pub const HOST_NETWORK_DNS_POLICY: &str = "ClusterFirstWithHostNet";

/// Pods on the host's network (`hostNetwork: true`, common for RDMA) get the
/// node's resolver under `dnsPolicy: ClusterFirst` (what the apiserver
/// defaults): pod 0's name, the rendezvous endpoint and the sidecar's peers
/// then resolve nowhere. `ClusterFirst` (or no policy) becomes
/// `ClusterFirstWithHostNet`; a `Default` or `None` policy the user chose is
/// kept with a warning. Such pods also have no line of their own in
/// `/etc/hosts`: pod 0 finds out that it hosts the store from DNS alone.
pub fn host_network_dns(ctx: &mut Ctx<'_>, spec: &mut PodSpec) {
    if spec.host_network != Some(true) {
        return;
    }
    match spec.dns_policy.as_deref() {
        None => ctx.status.fields.push(FIELD_DNS_POLICY.to_string()),
        Some("ClusterFirst") => ctx
            .status
            .fields
            .push(format!("{FIELD_DNS_POLICY}=ClusterFirst")),
        Some(HOST_NETWORK_DNS_POLICY) => {}
        Some(other) => {
            ctx.warn(format!(
                "hostNetwork with dnsPolicy {other} (kept): pod names resolve only through the cluster DNS; remove dnsPolicy"
            ));
            return;
        }
    }
    spec.dns_policy = Some(HOST_NETWORK_DNS_POLICY.to_string());
    ctx.warn(format!(
        "hostNetwork: dnsPolicy set to {HOST_NETWORK_DNS_POLICY} so that pod names resolve"
    ));
}

/// The rendezvous env for the trainer.
pub fn desired(
    ctx: &mut Ctx<'_>,
    shape: &Shape,
    ann: &Annotations,
    world: &World,
    c: &Container,
) -> Vec<Desired> {
    let rank_why = format!("the pod's index, {}", shape.rank_field);
    let size_why = match ann.nnodes {
        Some(_) => format!("annotation {}", annotations::NNODES),
        None => shape.size_field.to_string(),
    };
    let nproc_why = match ann.nproc_per_node {
        Some(_) => format!("annotation {}", annotations::NPROC_PER_NODE),
        None => "the GPUs the trainer asks for, else 1".to_string(),
    };
    let host_why = "pod 0's own DNS name; a Service name resolves to every pod".to_string();
    let mut out = vec![
        Desired::field("PET_NODE_RANK", shape.rank_field, rank_why.clone()),
        Desired::field("NODE_RANK", shape.rank_field, rank_why),
        Desired::value(
            "PET_NPROC_PER_NODE",
            world.nproc.to_string(),
            nproc_why.clone(),
            Conflict::ManifestWins,
        ),
        Desired::value(
            "PET_RDZV_BACKEND",
            backend_name(world.backend),
            "the rendezvous backend",
            Conflict::ManifestWins,
        ),
        Desired::value(
            "PET_RDZV_ENDPOINT",
            world.endpoint.clone(),
            if world.backend == RdzvBackend::EtcdV2 {
                "the policy's etcdEndpoint".to_string()
            } else if world.store_service.is_some() {
                format!(
                    "the dedicated store's Service (annotation {})",
                    annotations::RDZV_STORE
                )
            } else {
                host_why.clone()
            },
            Conflict::ManifestWins,
        ),
        Desired::value(
            "PET_RDZV_ID",
            format!("{}.{}", shape.namespace, shape.name),
            "the workload's namespace and name",
            Conflict::ManifestWins,
        ),
    ];
    if let Some(nnodes) = world.nnodes {
        out.insert(
            2,
            Desired::value(
                "PET_NNODES",
                nnodes.to_string(),
                size_why.clone(),
                Conflict::ManifestWins,
            ),
        );
    }
    out.extend(rdzv_conf(ctx, c, world.nnodes, world.store));
    out.push(Desired::value(
        "PET_MAX_RESTARTS",
        ann.max_restarts.to_string(),
        format!("annotation {} (default 3)", annotations::MAX_RESTARTS),
        Conflict::ManifestWins,
    ));
    out.push(Desired::value(
        DISABLE_SHARE_STORE,
        "1",
        "without it torchrun's own restart never recovers from a lost peer",
        Conflict::ManifestWins,
    ));
    out.push(Desired::value(
        "MASTER_ADDR",
        world.host.clone(),
        host_why,
        Conflict::ManifestWins,
    ));
    out.push(Desired::value(
        "MASTER_PORT",
        ann.rdzv_port.to_string(),
        "annotation trainwire.dev/rdzv-port (default 29500)",
        Conflict::ManifestWins,
    ));
    if let Some(Nnodes::Fixed(n)) = world.nnodes {
        out.push(Desired::value(
            "NNODES",
            n.to_string(),
            size_why.clone(),
            Conflict::ManifestWins,
        ));
        if let Nproc::Count(p) = world.nproc {
            out.push(Desired::value(
                "NPROC_PER_NODE",
                p.to_string(),
                nproc_why,
                Conflict::ManifestWins,
            ));
            out.push(Desired::value(
                "WORLD_SIZE",
                (u64::from(n) * u64::from(p)).to_string(),
                format!("nodes × processes per node ({size_why})"),
                Conflict::ManifestWins,
            ));
        }
    }
    out
}

/// What trainwire puts in `PET_RDZV_CONF`: the keep-alives, and for an
/// elastic world a short `last_call_timeout`.
pub fn rdzv_conf_pairs(
    nnodes: Option<Nnodes>,
    store: RdzvStore,
) -> Vec<(&'static str, &'static str)> {
    let mut pairs = KEEP_ALIVE.to_vec();
    if let Some(Nnodes::Elastic { .. }) = nnodes {
        pairs.push(ELASTIC_LAST_CALL);
    }
    if store == RdzvStore::Dedicated {
        pairs.push(NOT_HOST);
    }
    pairs
}

/// Merged into `PET_RDZV_CONF` with a dedicated store: no training node
/// hosts the store (torch's c10d backend otherwise decides it by matching
/// the endpoint's name with its own).
pub const NOT_HOST: (&str, &str) = ("is_host", "false");

/// `PET_RDZV_CONF`: the keep-alives (and, elastic, the last call) merged
/// into the manifest's value.
fn rdzv_conf(
    ctx: &mut Ctx<'_>,
    c: &Container,
    nnodes: Option<Nnodes>,
    store: RdzvStore,
) -> Option<Desired> {
    let wanted = rdzv_conf_pairs(nnodes, store);
    let ours = wanted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    if trainer::sets(c, RDZV_CONF) && trainer::literal(c, RDZV_CONF).is_none() {
        ctx.warn(super::injection::with_detail(
            format!(
                "env {RDZV_CONF} of container {:?} is a reference trainwire cannot merge: give it {ours}",
                c.name
            ),
            "a lost node then leaves the rendezvous in 3 s",
        ));
        return None;
    }
    let Some(user) = trainer::literal(c, RDZV_CONF) else {
        return Some(Desired::value(
            RDZV_CONF,
            ours,
            if wanted.len() > KEEP_ALIVE.len() {
                "rendezvous keep-alives; an elastic world shrinks 1 s after a loss instead of 30"
            } else {
                "rendezvous keep-alives"
            },
            Conflict::ManifestWins,
        ));
    };
    let mut pairs: Vec<(String, String)> = user
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), v.trim().to_string()),
            None => (p.to_string(), String::new()),
        })
        .collect();
    for (key, value) in wanted {
        match pairs.iter().find(|(k, _)| k == key) {
            Some((_, v)) if v != value => ctx.warn(super::injection::with_detail(
                format!(
                    "env {RDZV_CONF} of container {:?}: {key}={v} kept, trainwire would set {key}={value}",
                    c.name
                ),
                if key == ELASTIC_LAST_CALL.0 {
                    "a world shrinks that late"
                } else if key == NOT_HOST.0 {
                    "a node runs a second store"
                } else {
                    "a lost node stays longer"
                },
            )),
            Some(_) => {}
            None => pairs.push((key.to_string(), value.to_string())),
        }
    }
    if let Some((_, v)) = pairs.iter().find(|(k, _)| k == "join_timeout")
        && v.parse::<u64>().is_ok_and(|t| t < DEFAULT_JOIN_TIMEOUT)
    {
        ctx.warn(format!(
                "env {RDZV_CONF} of container {:?}: join_timeout={v} is below torchrun's {DEFAULT_JOIN_TIMEOUT}: a replacement may join too late",
                c.name
            ));
    }
    let merged = pairs
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.clone()
            } else {
                format!("{k}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    (merged != user).then(|| {
        Desired::value(
            RDZV_CONF,
            merged,
            "rendezvous keep-alives merged into the manifest's value",
            Conflict::Replace,
        )
    })
}

/// torchrun's c10d port when an endpoint names none.
pub const C10D_DEFAULT_PORT: u16 = 29400;

/// The port of the rendezvous store on pod 0 as the trainer will use it, for
/// the status (the reconciler's Service exposes it): `None` when the store is
/// outside the world (etcd), else the port of the trainer's effective
/// `PET_RDZV_ENDPOINT` (the manifest's value wins over trainwire's), torchrun's
/// default when it names none, or the annotation's port when the endpoint is
/// a reference trainwire cannot read.
pub fn store_port(world: &World, ann: &Annotations, trainer: &Container) -> Option<u16> {
    let external = world.backend == RdzvBackend::EtcdV2
        || trainer::literal(trainer, "PET_RDZV_BACKEND").is_some_and(|b| b.starts_with("etcd"));
    if external {
        return None;
    }
    let Some(endpoint) = trainer::literal(trainer, "PET_RDZV_ENDPOINT") else {
        return Some(ann.rdzv_port);
    };
    let endpoint = endpoint.trim();
    let port = match endpoint.strip_prefix('[') {
        Some(rest) => rest.split_once("]:").map(|(_, p)| p),
        None => endpoint.rsplit_once(':').map(|(_, p)| p),
    };
    match port {
        None => Some(C10D_DEFAULT_PORT),
        Some(p) => Some(
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .unwrap_or(ann.rdzv_port),
        ),
    }
}

#[cfg(test)]
mod conf_tests {
    use super::*;

    #[test]
    fn an_elastic_world_gets_a_short_last_call_and_a_fixed_one_does_not() {
        let pod0 = RdzvStore::Pod0;
        assert_eq!(
            rdzv_conf_pairs(Some(Nnodes::Fixed(4)), pod0),
            KEEP_ALIVE.to_vec()
        );
        assert_eq!(rdzv_conf_pairs(None, pod0), KEEP_ALIVE.to_vec());
        let dedicated = rdzv_conf_pairs(Some(Nnodes::Fixed(4)), RdzvStore::Dedicated);
        assert_eq!(dedicated.last(), Some(&NOT_HOST));
        let elastic = rdzv_conf_pairs(Some(Nnodes::Elastic { min: 2, max: 6 }), pod0);
        assert!(elastic.contains(&("last_call_timeout", "1")));
        assert!(elastic.starts_with(&KEEP_ALIVE));
    }
}
