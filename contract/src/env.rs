//! The sidecar's whole configuration contract: the `TRAINWIRE_*` environment
//! variables that the webhook sets on the sidecar container.
//!
//! The names are defined once, here; the engine (which the webhook runs)
//! and the sidecar import them, so the two programs cannot drift apart.

/// The pod's own name (downward API `metadata.name`).
pub const POD_NAME: &str = "TRAINWIRE_POD_NAME";
/// The pod's namespace (downward API `metadata.namespace`).
pub const POD_NAMESPACE: &str = "TRAINWIRE_POD_NAMESPACE";
/// The pod's UID (downward API `metadata.uid`); reported in heartbeats so a
/// replaced peer is told apart from the one it replaced.
pub const POD_UID: &str = "TRAINWIRE_POD_UID";
/// This pod's node rank (from the pod-index label or the job-completion-index annotation).
pub const NODE_RANK: &str = "TRAINWIRE_NODE_RANK";
/// The world's node count: `N`, or `MIN:MAX` for an elastic world.
pub const NNODES: &str = "TRAINWIRE_NNODES";
/// Label selector (`k=v,k2=v2`) that matches exactly the pods of this workload.
pub const SELECTOR: &str = "TRAINWIRE_SELECTOR";
/// Host name pattern of the peers, `{i}` standing for the node rank:
/// `<name>-{i}.<service>.<namespace>.svc.<cluster domain>`.
pub const PEER_HOSTS: &str = "TRAINWIRE_PEER_HOSTS";
/// Rank of the rendezvous host (the pod that runs the c10d store): `0`, or
/// `none` when the store is outside the world (etcd-v2).
pub const RDZV_HOST_RANK: &str = "TRAINWIRE_RDZV_HOST_RANK";
/// Port of the rendezvous store (c10d, static): on the rendezvous host, or
/// of the dedicated store. Its connections are not the collective's (the
/// training scan leaves them out), and with the store on pod 0 the
/// survivors restart their agent only once a replacement host's store
/// accepts connections there. Unset: neither (etcd-v2, older webhooks).
pub const RDZV_PORT: &str = "TRAINWIRE_RDZV_PORT";
/// The directory shared with the trainer's rendezvous handler
/// ([`crate::rendezvous::CHANNEL_DIR`] as injected): the sidecar writes each
/// confirmed loss there, the handler (which reads the same variable) acts
/// on it. Unset: no handler to tell.
pub const RENDEZVOUS_DIR: &str = "TRAINWIRE_RENDEZVOUS_DIR";
/// Port of the sidecar's plain-HTTP endpoints (`/healthz`, `/readyz`,
/// `/status`, `/metrics`, and the heartbeat endpoint peers probe).
pub const HEALTH_PORT: &str = "TRAINWIRE_HEALTH_PORT";
/// Address the sidecar's HTTP endpoints bind to (default `0.0.0.0`; tests
/// give each simulated node its own loopback address such as `127.0.0.11`).
pub const BIND_ADDRESS: &str = "TRAINWIRE_BIND_ADDRESS";
/// Checkpoint directory to watch (the trainer's `CHECKPOINT_DIR`).
pub const CHECKPOINT_DIR: &str = "TRAINWIRE_CHECKPOINT_DIR";
/// Age past which the newest checkpoint is reported stale (`30m`, `90s`, `2h`).
pub const CHECKPOINT_MAX_AGE: &str = "TRAINWIRE_CHECKPOINT_MAX_AGE";
/// `true` forces the polling checkpoint watcher (network filesystems where inotify sees nothing).
pub const CHECKPOINT_POLL: &str = "TRAINWIRE_CHECKPOINT_POLL";
/// What to do when a peer is lost: `auto`, `restart-workers`, `restart-agent`, `none`.
pub const ON_PEER_LOSS: &str = "TRAINWIRE_ON_PEER_LOSS";
/// Peer-health source: `auto`, `kubernetes`, `heartbeat`, `both`.
pub const DETECTION: &str = "TRAINWIRE_DETECTION";
/// Heartbeat probe interval (`1s`, `500ms`); default a fifth of the loss
/// window ([`LOSS_WINDOW`]).
pub const HEARTBEAT_INTERVAL: &str = "TRAINWIRE_HEARTBEAT_INTERVAL";
/// Missed heartbeats after which a peer is lost; default 4 (of a fifth of
/// the loss window each).
pub const HEARTBEAT_MISSES: &str = "TRAINWIRE_HEARTBEAT_MISSES";
/// How long a peer pod may stay not Ready before it counts as lost.
pub const NOT_READY_GRACE: &str = "TRAINWIRE_NOT_READY_GRACE";
/// Least time between two actions.
pub const ACTION_COOLDOWN: &str = "TRAINWIRE_ACTION_COOLDOWN";
/// Most actions within [`ACTION_WINDOW`]; past it the sidecar only reports.
pub const MAX_ACTIONS: &str = "TRAINWIRE_MAX_ACTIONS";
/// The window [`MAX_ACTIONS`] counts over.
pub const ACTION_WINDOW: &str = "TRAINWIRE_ACTION_WINDOW";
/// Substring of a process command line that identifies the torchrun agent
/// (default: `torchrun`, `torch.distributed.run` or `torch.distributed.launch`).
pub const AGENT_MATCH: &str = "TRAINWIRE_AGENT_MATCH";
/// Log format: `text` or `json`.
pub const LOG_FORMAT: &str = "TRAINWIRE_LOG_FORMAT";
/// How long one heartbeat probe may wait for its answer before it is
/// abandoned (default: 1.2 × the loss window, or interval × (misses + 2)
/// when either is set on its own). Misses are
/// counted per interval without an answer, not per probe, so a slow network
/// (an answer that takes longer than the interval) is not a miss storm.
pub const HEARTBEAT_TIMEOUT: &str = "TRAINWIRE_HEARTBEAT_TIMEOUT";
/// How long a checkpoint file or directory must go unwritten before it
/// counts as complete (default `5s`).
pub const CHECKPOINT_SETTLE: &str = "TRAINWIRE_CHECKPOINT_SETTLE";
/// Rescan period of the polling checkpoint watcher (default `10s`).
pub const CHECKPOINT_POLL_INTERVAL: &str = "TRAINWIRE_CHECKPOINT_POLL_INTERVAL";

/// How long a peer's outage (no heartbeat answer) must last before it
/// confirms the loss on its own, when nothing else confirms it (Kubernetes,
/// or a different pod answering at the peer's name). Default `auto`: 30 s in
/// a fixed-size world (a blip or slow network that training rides out is
/// never acted on), the loss window ([`LOSS_WINDOW`], 1 s) for a non-host
/// peer of an elastic world or of a world with hot spares, which torchrun
/// drops itself (the survivors shrink the world, or a spare takes over).
pub const CONFIRM_AFTER: &str = "TRAINWIRE_CONFIRM_AFTER";
/// How long, after a confirmed loss of the rendezvous host, to wait for its
/// replacement before reporting that none came (default `10m`). The GPUs
/// stay free meanwhile; a replacement that comes later is still joined.
pub const REPLACEMENT_WAIT: &str = "TRAINWIRE_REPLACEMENT_WAIT";
/// Pods beyond the world's size (`trainwire.dev/spares`): hot spares that
/// wait in torchrun's rendezvous and take a lost node's place. Ranks
/// `NNODES..NNODES+SPARES` (above an elastic range's MAX) are theirs.
pub const SPARES: &str = "TRAINWIRE_SPARES";
/// How long no rank's collective traffic may stand still before the world
/// is stalled: `off` or a duration (`trainwire.dev/stall-timeout`).
pub const STALL_TIMEOUT: &str = "TRAINWIRE_STALL_TIMEOUT";
/// What the sidecar does on a stall: `restart-workers` or `none`
/// (`trainwire.dev/on-stall`).
pub const ON_STALL: &str = "TRAINWIRE_ON_STALL";

/// How long a peer may be silent before its loss is confirmed
/// (`trainwire.dev/loss-window`, default `1s`): the heartbeats derive from
/// it (a probe every fifth of it, suspect after four intervals without an
/// answer, a probe's time limit 1.2 × it), and a silent non-host peer of an
/// elastic world or of a world with hot spares is confirmed lost after it.
/// Set by the injection only when it differs from the default.
pub const LOSS_WINDOW: &str = "TRAINWIRE_LOSS_WINDOW";

/// The sidecar's default plain-HTTP port.
pub const DEFAULT_HEALTH_PORT: u16 = 29600;

/// Every variable of the contract, for documentation and tests.
pub const ALL: &[&str] = &[
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    NODE_RANK,
    NNODES,
    SELECTOR,
    PEER_HOSTS,
    RDZV_HOST_RANK,
    RDZV_PORT,
    HEALTH_PORT,
    BIND_ADDRESS,
    CHECKPOINT_DIR,
    CHECKPOINT_MAX_AGE,
    CHECKPOINT_POLL,
    ON_PEER_LOSS,
    DETECTION,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_MISSES,
    NOT_READY_GRACE,
    ACTION_COOLDOWN,
    MAX_ACTIONS,
    ACTION_WINDOW,
    AGENT_MATCH,
    LOG_FORMAT,
    HEARTBEAT_TIMEOUT,
    CHECKPOINT_SETTLE,
    CHECKPOINT_POLL_INTERVAL,
    CONFIRM_AFTER,
    REPLACEMENT_WAIT,
    SPARES,
    STALL_TIMEOUT,
    ON_STALL,
    RENDEZVOUS_DIR,
    LOSS_WINDOW,
];
