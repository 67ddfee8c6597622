//! `status`: the worlds of a namespace, or one world and its ranks.
//!
//! The history (generation, last loss, stop) comes from the
//! `trainwire.dev/world` annotation the controller keeps; the live part
//! (phase, nodes Ready, newest checkpoint) is computed from the pods as they
//! are now, with the controller's own pure [`observe`] (which counts no new
//! loss on a first look), so the output is current even between the
//! controller's rate-limited writes, and useful without the controller.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde::Serialize;
use trainwire_contract::peer_loss::PeerLossRecord;
use trainwire_contract::world::Role;
use trainwire_contract::world::{self, CheckpointRecord, WorldStatus};
use trainwire_engine::mutation::annotations as ann;
use trainwire_engine::world::{Memory, PodView, StoreView, WorldOf, observe};

use crate::Result;
use crate::cluster::{self, Workload};

/// One world, as the list shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct World {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// Whether the controller has written a `trainwire.dev/world` status.
    pub recorded: bool,
    pub status: WorldStatus,
    /// One world's ranks (`status NAME` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<Rank>,
}

/// One pod of a world.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rank {
    pub rank: u32,
    pub pod: String,
    pub node: String,
    /// What it does in the world: `training` (with `torchRank` when its
    /// sidecar said), `spare`, `waiting`, `lost`.
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_rank: Option<u32>,
    pub ready: bool,
    /// Whether the pod is being deleted or has failed.
    pub lost: bool,
    /// Restarts of the trainer container.
    pub restarts: i32,
    /// The sidecar's last action on a lost peer (`trainwire.dev/peer-loss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_loss: Option<PeerLossRecord>,
    /// The newest checkpoint its sidecar sees (`trainwire.dev/checkpoint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointRecord>,
}

/// The worlds of the namespace, by kind then name.
#[derive(Clone, Debug, Serialize)]
pub struct Worlds {
    pub namespace: String,
    pub worlds: Vec<World>,
}

/// Whether trainwire manages the workload: opted in, or injected already.
pub fn managed(w: &Workload) -> bool {
    let opted_in = w
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ann::INJECT))
        .is_some_and(|v| v == "true");
    let template = match w {
        Workload::StatefulSet(s) => s.spec.as_ref().map(|s| &s.template),
        Workload::Job(j) => j.spec.as_ref().map(|s| &s.template),
    };
    let injected = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .is_some_and(|a| a.contains_key(ann::STATUS));
    opted_in || injected
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The trainer's restarts: the trainer container as the engine's
/// [`trainwire_engine::pod::trainer`] names it (the injection's record,
/// else the rendezvous env of torchrun or TensorFlow, else `trainer`), else
/// the most restarted one.
fn trainer_restarts(pod: &Pod) -> i32 {
    let trainer = trainwire_engine::pod::trainer(pod);
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[]);
    statuses
        .iter()
        .find(|c| c.name == trainer)
        .map(|c| c.restart_count)
        .or_else(|| statuses.iter().map(|c| c.restart_count).max())
        .unwrap_or(0)
}

fn world_of(w: &Workload, all_pods: &[Pod], now: Timestamp, with_ranks: bool) -> World {
    let meta = w.meta();
    let uid = meta.uid.clone().unwrap_or_default();
    let pods: Vec<&Pod> = all_pods.iter().filter(|p| controlled_by(p, &uid)).collect();
    let views: Vec<PodView> = pods.iter().filter_map(|p| PodView::of(p, now)).collect();
    let recorded = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(world::ANNOTATION))
        .and_then(|v| WorldStatus::from_annotation(v).ok());
    let of = match w {
        Workload::StatefulSet(s) => WorldOf::of_statefulset(s),
        Workload::Job(j) => WorldOf::of_job(j),
    };
    let store: Vec<StoreView> = all_pods
        .iter()
        .filter(|p| p.metadata.namespace == meta.namespace)
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(trainwire_contract::labels::RDZV_STORE))
                .is_some_and(|v| Some(v) == meta.name.as_ref())
        })
        .map(|p| StoreView::of(p, now))
        .collect();
    let mut status = observe(
        recorded.as_ref(),
        &mut Memory::default(),
        &of,
        &views,
        Some(&store),
        now,
    );
    status.updated_at = recorded
        .as_ref()
        .map(|r| r.updated_at.clone())
        .unwrap_or_default();
    let mut ranks: Vec<Rank> = if with_ranks {
        pods.iter()
            .filter_map(|p| {
                let view = PodView::of(p, now)?;
                let role = status
                    .ranks
                    .iter()
                    // A large table names a pod only where two hold its index.
                    .find(|r| r.index == view.rank && (r.pod.is_empty() || r.pod == view.name));
                Some(Rank {
                    rank: view.rank,
                    role: role.map_or(Role::Waiting, |r| r.role),
                    torch_rank: role.and_then(|r| r.torch_rank),
                    pod: view.name,
                    node: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default(),
                    ready: view.ready,
                    lost: view.lost.is_some(),
                    restarts: trainer_restarts(p),
                    peer_loss: view.peer_loss,
                    checkpoint: view.checkpoint,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    ranks.sort_by(|a, b| (a.rank, &a.pod).cmp(&(b.rank, &b.pod)));
    World {
        kind: w.kind().to_string(),
        name: w.name(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        recorded: recorded.is_some(),
        status,
        ranks,
    }
}

/// The worlds of `namespace`.
pub async fn list(client: &Client, namespace: &str, now: Timestamp) -> Result<Worlds> {
    let mut workloads: Vec<Workload> = cluster::workloads(client, namespace)
        .await?
        .into_iter()
        .filter(managed)
        .collect();
    workloads.sort_by_key(|w| (w.kind(), w.name()));
    let pods = if workloads.is_empty() {
        Vec::new()
    } else {
        cluster::pods(client, namespace).await?
    };
    Ok(Worlds {
        namespace: namespace.to_string(),
        worlds: workloads
            .iter()
            .map(|w| world_of(w, &pods, now, false))
            .collect(),
    })
}

/// One world and its ranks.
pub async fn one(client: &Client, namespace: &str, name: &str, now: Timestamp) -> Result<World> {
    let w = cluster::workload(client, namespace, name).await?;
    let pods = cluster::pods(client, namespace).await?;
    Ok(world_of(&w, &pods, now, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(env: &str) -> Pod {
        serde_json::from_value(json!({
            "spec": {"containers": [
                {"name": "ps"},
                {"name": "worker", "env": [{"name": env, "value": "{}"}]}
            ]},
            "status": {"containerStatuses": [
                {"name": "ps", "image": "i", "imageID": "", "ready": true, "restartCount": 7},
                {"name": "worker", "image": "i", "imageID": "", "ready": true, "restartCount": 2}
            ]}
        }))
        .unwrap_or_default()
    }

    #[test]
    fn the_trainer_of_a_tensorflow_world_is_counted_as_a_torch_one() {
        assert_eq!(trainer_restarts(&pod("PET_RDZV_BACKEND")), 2);
        assert_eq!(trainer_restarts(&pod("TF_CONFIG")), 2);
    }
}
