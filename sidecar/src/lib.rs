//! trainwire-sidecar watches peer health and checkpoint freshness in a
//! torchrun pod and restarts the local trainer when a peer is lost; the
//! binary is a thin `main.rs` over [`run`]. It may use `trainwire-contract`
//! (the `TRAINWIRE_*` names and value grammars it shares with the other
//! programs), `trainwire-runtime` (logging, shutdown, metrics exposition),
//! the kube client, tokio, axum/hyper for its own small HTTP server, and nix
//! and `/proc` for signals; it must not use the engine, the admission server
//! (`trainwire-webhook`) or the controllers (`trainwire-controllers`), which
//! run elsewhere under other identities: it speaks to them through the
//! contract only, and `tests/tests/layering.rs` holds it to that. Its modules, named after what they do:
//! - [`env`] / [`config`]: the `TRAINWIRE_*` contract and its parsing;
//! - [`peers`]: the pure peer-health state machine and loss generations;
//! - [`ring`]: which peers a sidecar watches (a bounded set);
//! - [`heartbeat`]: sidecar-to-sidecar heartbeats;
//! - [`dns`]: the peers' names against this pod's DNS configuration;
//! - [`kubewatch`]: the Kubernetes watch of the watched peers' pods
//!   (`kubewatch::tracker`: its pure decision logic over pod snapshots);
//! - [`world`]: the controllers' view of the whole world (every pod's
//!   role), read on demand from the workload's `trainwire.dev/world`;
//! - [`decide`]: the pure decision of one loss episode's next step;
//! - [`signal`]: finding torchrun in `/proc`, signal plans and the storm
//!   guard, the signal permission; which process a signal is for
//!   ([`signal::Role`]) and what of the trainer a loss has stopped
//!   ([`signal::Stopped`]);
//! - [`respond`]: acting on a loss (`episode`: an episode's state;
//!   `policy`: what is decided and when a step is done; `effects`: carrying
//!   a step out and recording it);
//! - [`permission`]: the signal-permission and trainer-activity watch;
//! - [`rendezvous`]: the trainer's rendezvous handler (its files, installed
//!   by an init container) and the channel that tells it of a loss;
//! - [`collective`]: whether the trainer's workers have formed their
//!   collective (a TCP connection to a peer), when training runs again;
//! - [`checkpoint`]: checkpoint freshness (inotify or polling);
//! - [`progress`]: whether the world makes progress; a stalled world
//!   found and its workers restarted;
//! - [`ras`]: a client of NCCL's RAS service (collectives completed);
//! - [`events`]: Kubernetes Events on the sidecar's pod;
//! - [`status`] / [`server`]: `/status`, `/metrics`, probes, `/heartbeat`.
//!
//! The actions, from the annotation to the signals: the user's choice is a
//! `PeerLossAction` (`trainwire-contract`, `values.rs`), [`decide::decide`]
//! turns it and an episode into a [`decide::Action`], [`decide::Action::plan`]
//! (the only mapping) into a [`signal::Plan`], which [`signal::execute`]
//! carries out. A new step that sends signals touches `decide.rs` (the
//! variant, its plan, when it is chosen), `signal.rs` (a new plan: its name,
//! `Plan::ALL` for the metrics, `needs`, `stops`, `execute`) and the match
//! on the step in `respond/mod.rs`; a new user choice adds a
//! `PeerLossAction` value in `contract/src/values.rs` and its rule in
//! `decide.rs`.

pub mod checkpoint;
pub mod collective;
pub mod config;
pub mod decide;
pub mod dns;
pub mod env;
pub mod events;
pub mod heartbeat;
pub mod kubewatch;
pub mod peers;
pub mod permission;
pub mod progress;
pub mod ras;
pub mod rendezvous;
pub mod respond;
pub mod ring;
pub mod server;
pub mod signal;
pub mod stall;
pub mod status;
pub mod world;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

pub use config::Config;

use crate::config::Detection;
use crate::events::EventSink;
use crate::peers::{Observation, Peers};
use crate::respond::Responder;
use crate::status::{DetectionStatus, Shared};

/// Every Kubernetes API call the sidecar makes, as `(API group, resource,
/// verb)`; `tests/tests/manifests.rs` holds the `trainwire-sidecar`
/// ClusterRole and docs/deploy.md's table to it.
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    // The watched peers' pods ([`kubewatch`]), and its own pod's owner
    // ([`world`]).
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    // Its own pod's records (`trainwire.dev/peer-loss`, `trainwire.dev/checkpoint`).
    ("", "pods", "patch"),
    // The controllers' view of the world: the workload's metadata ([`world`]).
    ("apps", "statefulsets", "get"),
    ("batch", "jobs", "get"),
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    // Not called: the marker that puts every pod write of its holder under
    // the ValidatingAdmissionPolicy trainwire-sidecar-own-pod.
    ("trainwire.dev", "sidecar-records", "write"),
];

/// Errors that stop the sidecar (everything else degrades and retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr} ({var}/{port_var}): {source}")]
    Bind {
        addr: SocketAddr,
        var: &'static str,
        port_var: &'static str,
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which detectors to run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectionChoice {
    pub heartbeat: bool,
    pub kubernetes: bool,
    pub why: String,
}

/// Decides the detectors without the Kubernetes API (the API check is
/// done by the caller and passed as `kube_allowed`).
pub fn choose_detection(config: &Config, kube_allowed: Result<(), String>) -> DetectionChoice {
    let hb_possible = config.heartbeat.peer_hosts.is_some();
    match config.detection {
        Detection::Heartbeat => DetectionChoice {
            heartbeat: true,
            kubernetes: false,
            why: "TRAINWIRE_DETECTION=heartbeat".into(),
        },
        Detection::Kubernetes => DetectionChoice {
            heartbeat: false,
            kubernetes: true,
            why: "TRAINWIRE_DETECTION=kubernetes".into(),
        },
        Detection::Both => DetectionChoice {
            heartbeat: true,
            kubernetes: true,
            why: "TRAINWIRE_DETECTION=both: the first to see a loss wins".into(),
        },
        // The two sources answer different questions: the watch sees a pod
        // deleted, failed, replaced or restarted at once; heartbeats see a
        // pod that stops answering while its object stays as it was (a
        // partition, a dead node before the node controller's grace, a
        // frozen host). `auto` runs every source it can.
        Detection::Auto => match kube_allowed {
            Ok(()) if hb_possible => DetectionChoice {
                heartbeat: true,
                kubernetes: true,
                why: format!(
                    "auto: the Kubernetes watch (the service account may list and watch pods: deletions, failures, restarts and replacements at once) and heartbeats ({} is set: a pod that stops answering while its object is unchanged)",
                    env::PEER_HOSTS
                ),
            },
            Ok(()) => DetectionChoice {
                heartbeat: false,
                kubernetes: true,
                why: format!(
                    "auto: the Kubernetes watch only (the service account may list and watch pods; {} is not set, so a pod that stops answering while its object is unchanged is not seen)",
                    env::PEER_HOSTS
                ),
            },
            Err(why) if hb_possible => DetectionChoice {
                heartbeat: true,
                kubernetes: false,
                why: format!("auto: heartbeats, because {why}"),
            },
            Err(why) => DetectionChoice {
                heartbeat: false,
                kubernetes: false,
                why: format!(
                    "auto: no detection possible: {why}, and {} is not set",
                    env::PEER_HOSTS
                ),
            },
        },
    }
}

/// Runs the sidecar until `shutdown` resolves.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let addr = SocketAddr::new(config.bind_address, config.health_port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind {
            addr,
            var: env::BIND_ADDRESS,
            port_var: env::HEALTH_PORT,
            source,
        })?;
    tracing::info!(%addr, rank = config.node_rank, nnodes = %config.nnodes, on_peer_loss = config.on_peer_loss.as_str(), "trainwire-sidecar listening");
    let shared = Shared::new(config.clone());

    let client = match kube::Client::try_default().await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::info!(error = %e, "no Kubernetes API configuration: no pod watch, no Events");
            shared.status().kubernetes_api = Some(format!("not configured: {e}"));
            None
        }
    };
    let kube_allowed: Result<(), String> = match (&client, &config.selector, config.detection) {
        (_, _, Detection::Heartbeat) => Err("not asked for".into()),
        (None, _, _) => Err("there is no Kubernetes API configuration".into()),
        (Some(_), None, _) => Err(format!("{} is not set", env::SELECTOR)),
        (Some(c), Some(_), _) => kubewatch::check_access(c, &config.namespace).await,
    };
    if let (Some(_), Err(why)) = (&client, &kube_allowed) {
        shared.status().kubernetes_api = Some(why.clone());
    } else if client.is_some() {
        shared.status().kubernetes_api = Some("reachable; pods may be listed and watched".into());
    }
    let choice = choose_detection(&config, kube_allowed);
    // The controllers' view: read once now, then on demand (a loss in an
    // elastic world, `/status`).
    let world = world::Reader::new(client.clone(), &config.namespace, &config.pod_name);
    shared.set_world_reader(world.clone());
    if client.is_some() {
        tokio::spawn(async move {
            world
                .refresh(
                    std::time::Duration::ZERO,
                    std::time::Duration::from_secs(30),
                )
                .await
        });
    }
    if !choice.heartbeat && !choice.kubernetes {
        tracing::error!("{}", choice.why);
    } else {
        tracing::info!(
            heartbeat = choice.heartbeat,
            kubernetes = choice.kubernetes,
            "peer detection: {}",
            choice.why
        );
    }
    {
        let mut s = shared.status();
        let mut active = Vec::new();
        if choice.heartbeat {
            active.push("heartbeat");
        }
        if choice.kubernetes {
            active.push("kubernetes");
        }
        s.detection = DetectionStatus {
            configured: config.detection.as_str().to_string(),
            active,
            why: choice.why.clone(),
            problem: None,
            pod_watch: choice
                .kubernetes
                .then(|| kubewatch::WatchSet::of(&config).ok().flatten())
                .flatten()
                .map(|w| w.selector),
        };
        if let Some(pattern) = &config.heartbeat.peer_hosts
            && let Err(problem) = dns::check_pod(pattern)
        {
            tracing::error!("{problem}");
            s.detection.problem = Some(problem);
        }
    }

    // Names are looked up on this runtime, never on the blocking pool.
    let names = dns::Resolver::system(respond::RESOLVE_TIMEOUT);
    let (tx, rx) = mpsc::channel::<Observation>(1024);
    let mut tasks = tokio::task::JoinSet::new();
    let counters = heartbeat::Counters {
        probes: shared.metrics.heartbeat_probes.clone(),
        indirect: shared.metrics.indirect_probes.clone(),
    };
    if choice.heartbeat {
        tasks.spawn(heartbeat::run_counted(
            config.clone(),
            names.clone(),
            tx.clone(),
            counters.clone(),
        ));
    }
    // Peers ask this sidecar to probe a silent peer for them (whatever this
    // sidecar's own detection).
    let prober = config
        .heartbeat
        .peer_hosts
        .is_some()
        .then(|| heartbeat::Prober::new(config.clone(), names.clone(), counters));
    let events = match &client {
        Some(c) => EventSink::new(
            c.clone(),
            &config.namespace,
            &config.pod_name,
            &config.pod_uid,
        ),
        None => EventSink::disabled(),
    };
    if choice.kubernetes {
        match &client {
            Some(c) => {
                tasks.spawn(kubewatch::run(config.clone(), c.clone(), tx.clone()));
            }
            None => tracing::error!(
                "TRAINWIRE_DETECTION asks for the Kubernetes watch but there is no API configuration; no pod watch"
            ),
        }
    }
    if let Some(ck) = config.checkpoint.clone() {
        tasks.spawn(checkpoint::run(shared.clone(), ck, events.clone()));
    }
    drop(tx);
    tasks.spawn(permission::watch_permission(shared.clone(), events.clone()));
    tasks.spawn(progress::run(shared.clone(), events.clone(), names.clone()));
    let responder = Responder::new(shared.clone(), events.clone(), choice.heartbeat, names);
    // Heartbeats and the Kubernetes watch follow the same bounded set of
    // peers (`ring::watched`); the others are `not-watched`.
    let watched = heartbeat::peer_ranks(&config).collect();
    tasks.spawn(coordinate(shared.clone(), rx, responder, watched));

    shared.set_ready(true);
    let app = server::router(shared.clone(), prober);
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    tasks.abort_all();
    served.map_err(Error::Serve)
}

/// How often open loss episodes are re-evaluated (the replacement wait, a
/// step's retry); an outage's confirmation also wakes the coordinator at
/// its own deadline ([`Responder::next_confirmation`]).
const TICK: std::time::Duration = std::time::Duration::from_millis(200);

/// Feeds observations into the peers' state machine and the responder.
async fn coordinate(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Observation>,
    mut responder: Responder,
    watched: std::collections::BTreeSet<u32>,
) {
    let config = &shared.config;
    let mut peers = Peers::with_spares(
        config.nnodes,
        config.spares,
        config.node_rank,
        config.heartbeat.misses,
        Instant::now(),
    )
    .watching(&watched);
    shared.publish_peers(&peers);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A silent loss is confirmed when its outage reaches the window,
        // not at the next tick after it.
        let deadline = responder.next_confirmation();
        let obs = tokio::select! {
            obs = rx.recv() => match obs {
                Some(obs) => obs,
                None => return,
            },
            _ = tick.tick() => {
                responder.tick(Instant::now(), &peers).await;
                continue;
            }
            _ = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            }, if deadline.is_some() => {
                responder.tick(Instant::now(), &peers).await;
                continue;
            }
        };
        let rank = obs.rank;
        let seen = |peers: &Peers| {
            peers
                .get(rank)
                .map(|p| (p.state, p.misses, p.identity.clone(), p.detail.clone()))
        };
        let before = seen(&peers);
        let loss = peers.observe(obs.clone());
        let after = seen(&peers);
        if before != after {
            if let (Some(b), Some(a)) = (&before, &after)
                && b.0 != a.0
            {
                tracing::info!(rank, from = ?b.0, to = ?a.0, "peer state changed");
            }
            shared.publish_peers(&peers);
        }
        match loss {
            Some(loss) => responder.on_loss(&loss, &peers).await,
            None => responder.on_observation(&obs, &peers).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(detection: &str, peer_hosts: bool) -> Config {
        let mut vars = vec![
            (env::NNODES, "2"),
            (env::NODE_RANK, "0"),
            (env::DETECTION, detection),
            (env::SELECTOR, "app=train"),
        ];
        if peer_hosts {
            vars.push((env::PEER_HOSTS, "train-{i}.train"));
        }
        Config::from_source(vars.as_slice()).expect("config")
    }

    /// `auto` runs both sources when both are possible: a pod whose
    /// network dies keeps its object as it was, and only heartbeats see it.
    #[test]
    fn auto_runs_every_source_it_can() {
        let both = choose_detection(&config("auto", true), Ok(()));
        assert!(both.heartbeat && both.kubernetes, "{both:?}");
        assert!(both.why.contains("heartbeats"), "{}", both.why);
        let watch = choose_detection(&config("auto", false), Ok(()));
        assert!(!watch.heartbeat && watch.kubernetes, "{watch:?}");
        assert!(watch.why.contains("not seen"), "{}", watch.why);
        let beats = choose_detection(&config("auto", true), Err("no right".into()));
        assert!(beats.heartbeat && !beats.kubernetes, "{beats:?}");
        assert!(beats.why.contains("no right"), "{}", beats.why);
        let none = choose_detection(&config("auto", false), Err("no right".into()));
        assert!(!none.heartbeat && !none.kubernetes, "{none:?}");
    }

    #[test]
    fn a_chosen_source_is_kept() {
        let k = choose_detection(&config("kubernetes", true), Ok(()));
        assert!(!k.heartbeat && k.kubernetes);
        let h = choose_detection(&config("heartbeat", true), Ok(()));
        assert!(h.heartbeat && !h.kubernetes);
        let b = choose_detection(&config("both", true), Ok(()));
        assert!(b.heartbeat && b.kubernetes);
    }
}
