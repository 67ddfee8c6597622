//! Every `trainwire.dev/*` name, in one place: the annotations a user puts
//! on a workload, the ones trainwire writes (on the workload, its pod
//! template and its pods), and the labels it sets. The engine parses the
//! user's annotations (`trainwire-engine`'s `mutation::annotations`), the
//! controllers and the sidecar read and write the others; all of them name
//! them from here, and docs/annotations.md's table is checked against
//! [`KNOWN`] and [`WRITTEN`].

pub const PREFIX: &str = "trainwire.dev/";
pub const INJECT: &str = "trainwire.dev/inject";
pub const CONTAINER: &str = "trainwire.dev/container";
pub const NNODES: &str = "trainwire.dev/nnodes";
pub const NPROC_PER_NODE: &str = "trainwire.dev/nproc-per-node";
pub const GPUS_PER_NODE: &str = "trainwire.dev/gpus-per-node";
pub const RDZV_BACKEND: &str = "trainwire.dev/rdzv-backend";
pub const RDZV_PORT: &str = "trainwire.dev/rdzv-port";
/// Where the c10d store runs: `pod0` (torchrun's own) or `dedicated`.
pub const RDZV_STORE: &str = "trainwire.dev/rdzv-store";
/// Hot spares: pods beyond the world's size that take over a lost node.
pub const SPARES: &str = "trainwire.dev/spares";
/// `trainwire` (default) or `torch`: the rendezvous handler over a dedicated
/// store (`RdzvHandler`).
pub const RDZV_HANDLER: &str = "trainwire.dev/rdzv-handler";
pub const MAX_RESTARTS: &str = "trainwire.dev/max-restarts";
pub const CHECKPOINT_PVC: &str = "trainwire.dev/checkpoint-pvc";
pub const CHECKPOINT_PATH: &str = "trainwire.dev/checkpoint-path";
pub const CHECKPOINT_MAX_AGE: &str = "trainwire.dev/checkpoint-max-age";
pub const VOLUMES: &str = "trainwire.dev/volumes";
pub const NCCL: &str = "trainwire.dev/nccl";
pub const SHM_SIZE: &str = "trainwire.dev/shm-size";
pub const SIDECAR: &str = "trainwire.dev/sidecar";
pub const ON_PEER_LOSS: &str = "trainwire.dev/on-peer-loss";
/// How long no rank's collective traffic may stand still: `off` or a duration.
pub const STALL_TIMEOUT: &str = "trainwire.dev/stall-timeout";
/// What the sidecars do about a stalled world: `restart-workers` or `none`.
pub const ON_STALL: &str = "trainwire.dev/on-stall";
/// How long a peer may be silent before its loss is confirmed (a duration
/// from 200ms to 10m, [`crate::LossWindow`]).
pub const LOSS_WINDOW: &str = "trainwire.dev/loss-window";
/// The training framework: `pytorch` (torchrun's env) or `tensorflow` (`TF_CONFIG`).
pub const FRAMEWORK: &str = "trainwire.dev/framework";
/// Written by trainwire on the pod template (never read from the workload).
pub const STATUS: &str = "trainwire.dev/status";
/// Trainer exit codes that stop the world at once (read by the controller).
pub const FAIL_FAST_EXIT_CODES: &str = "trainwire.dev/fail-fast-exit-codes";
/// Trainer failures within a window that stop the world (the controller).
pub const MAX_FAILURES: &str = "trainwire.dev/max-failures";
/// Set by the user (any value) on a stopped workload: the controller resumes it.
pub const RESUME: &str = "trainwire.dev/resume";
/// Written by the controller when it stops a workload (its evidence).
pub const STOPPED_REASON: &str = "trainwire.dev/stopped-reason";
pub const STOPPED_AT: &str = "trainwire.dev/stopped-at";
pub const STOPPED_REPLICAS: &str = "trainwire.dev/stopped-replicas";
pub const STOPPED_EXIT_CODE: &str = "trainwire.dev/stopped-exit-code";
pub const STOPPED_POD: &str = "trainwire.dev/stopped-pod";
/// The world's state, kept by the controller (the world controller): accepted
/// without a warning, not part of the input hash (a status write is not a
/// change of the user's), and kept when a stopped world resumes.
pub const WORLD: &str = "trainwire.dev/world";
/// The controller's own annotations: accepted without a warning.
pub const CONTROLLER_OWNED: &[&str] = &[
    STOPPED_REASON,
    STOPPED_AT,
    STOPPED_REPLICAS,
    STOPPED_EXIT_CODE,
    STOPPED_POD,
];

/// Every annotation a user may put on the workload.
pub const KNOWN: &[&str] = &[
    INJECT,
    CONTAINER,
    NNODES,
    NPROC_PER_NODE,
    GPUS_PER_NODE,
    RDZV_BACKEND,
    RDZV_PORT,
    RDZV_STORE,
    RDZV_HANDLER,
    SPARES,
    MAX_RESTARTS,
    CHECKPOINT_PVC,
    CHECKPOINT_PATH,
    CHECKPOINT_MAX_AGE,
    VOLUMES,
    NCCL,
    SHM_SIZE,
    SIDECAR,
    ON_PEER_LOSS,
    STALL_TIMEOUT,
    ON_STALL,
    LOSS_WINDOW,
    FRAMEWORK,
    FAIL_FAST_EXIT_CODES,
    MAX_FAILURES,
    RESUME,
];

/// The sidecar's record of what it did about a lost peer, on its own pod
/// ([`crate::peer_loss`]).
pub const PEER_LOSS: &str = "trainwire.dev/peer-loss";
/// The sidecar's record of the newest complete checkpoint, on its own pod
/// ([`crate::world::CheckpointRecord`]).
pub const CHECKPOINT: &str = "trainwire.dev/checkpoint";
/// The sidecar's record of a stall its world had, on its own pod
/// ([`crate::stall::StallRecord`]).
pub const STALL: &str = "trainwire.dev/stall";
/// On a Service or a dedicated store the controllers created: the workload
/// it serves.
pub const SERVICE_FOR: &str = "trainwire.dev/service-for";

/// Every annotation trainwire writes (never read from the user's input).
pub const WRITTEN: &[&str] = &[
    STATUS,
    WORLD,
    STOPPED_REASON,
    STOPPED_AT,
    STOPPED_REPLICAS,
    STOPPED_EXIT_CODE,
    STOPPED_POD,
    PEER_LOSS,
    CHECKPOINT,
    STALL,
    SERVICE_FOR,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_the_prefix_and_in_one_list() {
        for name in KNOWN.iter().chain(WRITTEN) {
            assert!(name.starts_with(PREFIX), "{name}");
            assert_eq!(
                KNOWN.iter().chain(WRITTEN).filter(|n| *n == name).count(),
                1,
                "{name} twice"
            );
        }
    }
}
