//! Peer health from the Kubernetes API: a watch on the pods of the peers
//! this sidecar watches.
//!
//! The watch is narrowed by the API server to the peers of [`ring::watched`]
//! (the nearest on each side of the ring of all pods, and the rendezvous
//! host): one watch whose label selector is the workload's plus the pod
//! index among them ([`WatchSet`]), so a pod's change reaches the few
//! sidecars that watch it, not every sidecar of the world.
//!
//! The decisions are a pure function of pod snapshots ([`Tracker`]), so they
//! are tested on recorded event sequences; [`run`] only feeds it from a
//! kube-rs runtime watcher and a timer.
//!
//! A peer is lost when its pod is deleted, fails, stays not Ready past the
//! grace after having been Ready, gets a new UID, has a container that exited
//! with an error (its state `terminated`, at once: the restart count moves
//! only after the kubelet's back-off) or restarted, carries a
//! `DisruptionTarget` condition (taint eviction, preemption, drain), is on a
//! node that is unreachable (`status.reason: NodeLost`, or the node's
//! `node.kubernetes.io/unreachable`/`not-ready` taints when the service
//! account may read nodes), or stays Terminating past the grace.
//!
//! This module is the watch driver; [`tracker`] holds the pure decisions
//! and the pod view they read.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::peers::{Observation, Source};
use crate::ring;

pub mod tracker;

pub use tracker::{
    Exit, JOB_INDEX_KEY, POD_INDEX_LABEL, PodView, Tracker, Verdict, node_is_unreachable,
};

/// Labels the Job controller puts on a Job's pods (the webhook renders a
/// Job's `TRAINWIRE_SELECTOR` as `batch.kubernetes.io/job-name=<job>`).
pub const JOB_LABELS: [&str; 4] = [
    "batch.kubernetes.io/job-name",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "controller-uid",
];

/// Why the pod watch cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    #[error("{var} is not set or empty: the pod watch needs the workload's label selector")]
    NoSelector { var: &'static str },
}

/// What this sidecar's pod watch asks the API server for: the pods of the
/// peers it watches, and no other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSet {
    /// The watched pod indices ([`ring::watched`]): never this pod's own.
    pub indices: BTreeSet<u32>,
    /// The label holding a pod's index in this workload:
    /// [`POD_INDEX_LABEL`] on StatefulSet pods, [`JOB_INDEX_KEY`] on
    /// Indexed Job pods.
    pub index_label: &'static str,
    /// The label selector sent with the list and the watch: the workload's,
    /// and the index among `indices` (`<selector>,<label> in (i,j,...)`).
    pub selector: String,
}

impl WatchSet {
    /// The watch of `config`'s sidecar: `None` when it has no peer to watch
    /// (a world of one pod).
    pub fn of(config: &Config) -> Result<Option<WatchSet>, WatchError> {
        let workload = config
            .selector
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or(WatchError::NoSelector {
                var: crate::env::SELECTOR,
            })?;
        let indices = ring::watched(config.node_rank, config.pods(), config.rdzv_host_rank);
        if indices.is_empty() {
            return Ok(None);
        }
        let index_label = index_label(workload);
        let list: Vec<String> = indices.iter().map(u32::to_string).collect();
        let selector = format!("{workload},{index_label} in ({})", list.join(","));
        Ok(Some(WatchSet {
            indices,
            index_label,
            selector,
        }))
    }
}

/// The keys a label selector string constrains (`k=v`, `k==v`, `k!=v`,
/// `k in (a,b)`, `k notin (a)`, `k`, `!k`).
pub fn selector_keys(selector: &str) -> Vec<String> {
    let key = |part: &str| {
        let part = part.trim().trim_start_matches('!').trim_start();
        let end = part
            .find(|c: char| c == '=' || c == '!' || c == '(' || c.is_whitespace())
            .unwrap_or(part.len());
        part.get(..end)
            .filter(|k| !k.is_empty())
            .map(str::to_string)
    };
    let mut keys = Vec::new();
    let mut depth = 0u32;
    let mut part = String::new();
    for c in selector.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                keys.extend(key(&part));
                part.clear();
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    keys.extend(key(&part));
    keys
}

/// The label that holds a pod's index for the workload `selector` selects:
/// an Indexed Job's when it names a Job (the Job controller's labels), a
/// StatefulSet's otherwise. Both kinds carry it as a label (Kubernetes
/// 1.28 and newer), which is what [`PodView::of`] reads first.
pub fn index_label(selector: &str) -> &'static str {
    if selector_keys(selector)
        .iter()
        .any(|k| JOB_LABELS.contains(&k.as_str()))
    {
        JOB_INDEX_KEY
    } else {
        POD_INDEX_LABEL
    }
}

/// Asks the API server whether this service account may `verb` `resource`.
pub async fn may(
    client: &kube::Client,
    namespace: Option<&str>,
    verb: &str,
    resource: &str,
) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: namespace.map(str::to_string),
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether the pod watch may be used: `Ok` or the reason it may not.
pub async fn check_access(client: &kube::Client, namespace: &str) -> Result<(), String> {
    let check = async {
        for verb in ["list", "watch"] {
            match may(client, Some(namespace), verb, "pods").await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "the service account may not {verb} pods in namespace {namespace} (RBAC)"
                    ));
                }
                Err(e) => return Err(format!("the Kubernetes API is not usable: {e}")),
            }
        }
        Ok(())
    };
    match tokio::time::timeout(Duration::from_secs(10), check).await {
        Ok(r) => r,
        Err(_) => Err("the Kubernetes API did not answer within 10s".into()),
    }
}

fn send_all(tx: &mpsc::Sender<Observation>, verdicts: Vec<Verdict>) -> bool {
    for v in verdicts {
        let obs = Observation {
            rank: v.rank,
            source: Source::Kubernetes,
            evidence: v.evidence,
            at: Instant::now(),
        };
        if tx.try_send(obs).is_err() && tx.is_closed() {
            return false;
        }
    }
    true
}

/// Watches the pods of the peers this sidecar watches ([`WatchSet`]) until
/// `tx` closes. API errors are logged and retried with backoff; never fatal.
pub async fn run(config: Config, client: kube::Client, tx: mpsc::Sender<Observation>) {
    let set = match WatchSet::of(&config) {
        Ok(Some(set)) => set,
        Ok(None) => {
            tracing::info!("pod watch: no peer to watch (a world of one pod)");
            return;
        }
        Err(e) => {
            tracing::error!("no pod watch: {e}");
            return;
        }
    };
    tracing::info!(
        watched = ?set.indices,
        selector = %set.selector,
        "pod watch: the pods of the watched peers only"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let nodes: Api<Node> = Api::all(client.clone());
    let may_read_nodes = matches!(may(&client, None, "get", "nodes").await, Ok(true));
    if may_read_nodes {
        tracing::info!("node taints: checked for peers that stop being Ready");
    } else {
        tracing::info!(
            "node taints: not readable by this service account; relying on pod conditions (Ready, DisruptionTarget, NodeLost)"
        );
    }
    let mut tracker = Tracker::new(&config.pod_name, config.not_ready_grace);
    let stream = watcher(pods, watcher::Config::default().labels(&set.selector)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let tick_every =
        (config.not_ready_grace / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
    let mut ticker = tokio::time::interval(tick_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        let verdicts = tokio::select! {
            ev = stream.next() => match ev {
                None => return,
                Some(Err(e)) => {
                    if !failing {
                        tracing::warn!(error = %e, "pod watch failed; retrying with backoff");
                        failing = true;
                    }
                    continue;
                }
                Some(Ok(ev)) => {
                    if failing {
                        tracing::info!("pod watch working again");
                        failing = false;
                    }
                    let now = Timestamp::now();
                    match ev {
                        watcher::Event::Init => { tracker.relist_started(); Vec::new() }
                        watcher::Event::InitApply(p) | watcher::Event::Apply(p) => tracker.apply(PodView::of(&p), now),
                        watcher::Event::InitDone => tracker.relist_done(),
                        watcher::Event::Delete(p) => tracker.delete(&PodView::of(&p)),
                    }
                }
            },
            _ = ticker.tick() => {
                let mut v = tracker.tick(Timestamp::now());
                if may_read_nodes {
                    for node in tracker.suspicious_nodes() {
                        match tokio::time::timeout(Duration::from_secs(5), nodes.get(&node)).await {
                            Ok(Ok(n)) => {
                                v.extend(tracker.node_unreachable(&node, node_is_unreachable(&n), Timestamp::now()));
                            }
                            Ok(Err(e)) => tracing::debug!(%node, error = %e, "cannot read node"),
                            Err(_) => tracing::debug!(%node, "reading the node timed out"),
                        }
                    }
                }
                v
            }
        };
        if !send_all(&tx, verdicts) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Config {
        let mut all = vec![
            (crate::env::NNODES, "16"),
            (crate::env::NODE_RANK, "5"),
            (crate::env::DETECTION, "kubernetes"),
            (crate::env::SELECTOR, "app=train"),
        ];
        all.extend_from_slice(vars);
        Config::from_source(all.as_slice()).expect("config")
    }

    #[test]
    fn the_watch_is_narrowed_to_the_ring_and_the_host() {
        let set = WatchSet::of(&config(&[])).expect("set").expect("peers");
        assert_eq!(set.indices, BTreeSet::from([0, 4, 6]));
        assert_eq!(set.index_label, POD_INDEX_LABEL);
        assert_eq!(
            set.selector,
            "app=train,apps.kubernetes.io/pod-index in (0,4,6)"
        );
        // The store outside the world: the ring alone.
        let set = WatchSet::of(&config(&[(crate::env::RDZV_HOST_RANK, "none")]))
            .expect("set")
            .expect("peers");
        assert_eq!(set.indices, BTreeSet::from([4, 6]));
        // Spares are on the ring too: rank 0 of 4 + 2 spares.
        let set = WatchSet::of(&config(&[
            (crate::env::NNODES, "4"),
            (crate::env::SPARES, "2"),
            (crate::env::NODE_RANK, "0"),
        ]))
        .expect("set")
        .expect("peers");
        assert_eq!(set.indices, BTreeSet::from([1, 5]));
        // A world of one pod has no peer to watch.
        let one = config(&[(crate::env::NNODES, "1"), (crate::env::NODE_RANK, "0")]);
        assert_eq!(WatchSet::of(&one), Ok(None));
    }

    #[test]
    fn an_indexed_jobs_pods_are_selected_by_their_completion_index() {
        let set = WatchSet::of(&config(&[(
            crate::env::SELECTOR,
            "batch.kubernetes.io/job-name=llama",
        )]))
        .expect("set")
        .expect("peers");
        assert_eq!(
            set.selector,
            "batch.kubernetes.io/job-name=llama,batch.kubernetes.io/job-completion-index in (0,4,6)"
        );
        // A StatefulSet's selector, set-based parts included.
        assert_eq!(
            index_label("app=train,tier in (a,b),!canary"),
            POD_INDEX_LABEL
        );
        assert_eq!(index_label("job-name=x"), JOB_INDEX_KEY);
        assert_eq!(
            selector_keys("a=b, c in (d,e),!f,g!=h,i"),
            vec!["a", "c", "f", "g", "i"]
        );
    }

    #[test]
    fn no_selector_is_a_typed_error() {
        let mut c = config(&[]);
        c.selector = Some("  ".into());
        assert_eq!(
            WatchSet::of(&c),
            Err(WatchError::NoSelector {
                var: crate::env::SELECTOR
            })
        );
    }
}
