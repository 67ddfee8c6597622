//! The world-wide picture, from the controllers: the `trainwire.dev/world`
//! annotation the world controller keeps on this pod's workload
//! ([`trainwire_contract::world::WorldStatus`]: the phase, the losses, each
//! pod's role: training, spare, waiting, lost).
//!
//! A sidecar watches a bounded set of peers ([`crate::ring`]), so it does not
//! see the whole world itself; the controllers do, through one label-selected
//! watch. The sidecar reads their view **on demand**, never with a standing
//! watch: a watch of one object read by every sidecar would send each change
//! of it to all N sidecars. It is read
//!
//! - once at start;
//! - when a loss opens an episode in an elastic world, before the decision
//!   that counts the survivors ([`survivors`]), bounded by
//!   [`DECISION_WAIT`]: only the lost pod's watchers (two or three sidecars)
//!   read it, whatever the world's size;
//! - when `/status` is asked and the last read is older than
//!   [`STATUS_MAX_AGE`].
//!
//! Each read is two metadata-only GETs at most: this pod's owner (once, its
//! controller ownerReference names the StatefulSet or Job) and the
//! workload's metadata (`PartialObjectMetadata`: annotations, no spec). A
//! read never fails the sidecar: without the right (`get` on statefulsets or
//! jobs), without an API, or before the controllers wrote the annotation,
//! `/status` says why and the decision falls back to what this sidecar
//! watches (unwatched peers presumed up).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde::Serialize;
use trainwire_contract::world::{self as contract, Role, WorldStatus};

use crate::peers::{Peers, State};

/// How long a loss decision in an elastic world waits for a fresh read.
pub const DECISION_WAIT: Duration = Duration::from_secs(1);
/// `/status` reads the view again when the last read is older than this.
pub const STATUS_MAX_AGE: Duration = Duration::from_secs(10);
/// How long `/status` waits for that read before answering with the last.
pub const STATUS_WAIT: Duration = Duration::from_millis(500);
/// After a read was refused (no right, no such workload), the next is
/// tried no sooner than this.
pub const REFUSED_BACKOFF: Duration = Duration::from_secs(300);
/// Two reads are never closer than this.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The workload that owns this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    StatefulSet(String),
    Job(String),
}

impl Owner {
    /// The controller ownerReference of `pod`, when it is a StatefulSet or
    /// a Job.
    pub fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Owner> {
        let o = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))?;
        match (o.api_version.split('/').next(), o.kind.as_str()) {
            (Some("apps"), "StatefulSet") => Some(Owner::StatefulSet(o.name.clone())),
            (Some("batch"), "Job") => Some(Owner::Job(o.name.clone())),
            _ => None,
        }
    }

    /// `statefulset/NAME` or `job/NAME`, as kubectl names it.
    pub fn reference(&self) -> String {
        match self {
            Owner::StatefulSet(n) => format!("statefulset/{n}"),
            Owner::Job(n) => format!("job/{n}"),
        }
    }
}

/// Why the view could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("no Kubernetes API configuration")]
    NoApi,
    #[error("pod {pod} has no StatefulSet or Job as its controller owner")]
    NoOwner { pod: String },
    #[error(
        "the service account may not get {what} (RBAC): bind the trainwire-sidecar ClusterRole"
    )]
    Forbidden { what: String },
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("reading {what}: {detail}")]
    Api { what: String, detail: String },
    #[error("{workload} has no {annotation} yet (the controllers write it)", annotation = contract::ANNOTATION)]
    NotWritten { workload: String },
    #[error("{workload}'s {annotation}: {detail}", annotation = contract::ANNOTATION)]
    Unreadable { workload: String, detail: String },
}

impl ViewError {
    /// Whether asking again soon is pointless (no right, nothing there).
    fn lasting(&self) -> bool {
        matches!(
            self,
            ViewError::NoApi
                | ViewError::NoOwner { .. }
                | ViewError::Forbidden { .. }
                | ViewError::NotFound { .. }
        )
    }
}

/// The controllers' view as last read, in `/status` (`world.controllers`).
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    /// `statefulset/NAME` or `job/NAME`, once known.
    pub workload: Option<String>,
    /// When the last successful read was made (RFC 3339).
    pub read_at: Option<String>,
    /// The annotation as read (its own schema, docs/status.md).
    pub status: Option<WorldStatus>,
    /// Why the last read failed, if it did.
    pub error: Option<String>,
    /// Reads made so far (each one or two metadata GETs).
    pub reads: u64,
    #[serde(skip)]
    read_instant: Option<Instant>,
    #[serde(skip)]
    tried: Option<Instant>,
    #[serde(skip)]
    refused: bool,
}

impl Seen {
    /// The view, when it was read at or after `since`.
    pub fn fresh_since(&self, since: Instant) -> Option<&WorldStatus> {
        self.status
            .as_ref()
            .filter(|_| self.read_instant.is_some_and(|r| r >= since))
    }
}

/// The survivors of losing `lost` as the decision counts them (this pod
/// included): every other peer of `peers` that is up. A peer this sidecar
/// watches counts by its own state (healthy, suspect, replaced); one it
/// does not watch by the controllers' `view` (training or spare), or, when
/// the view does not list it (none read since the loss, or left out of a
/// table too large for the annotation: `ranksOmitted`), presumed up unless
/// the view expects fewer pods:
/// its own watchers see its loss.
pub fn survivors(lost: u32, peers: &Peers, view: Option<&WorldStatus>) -> u32 {
    let roles: std::collections::BTreeMap<u32, Role> = view
        .map(|v| v.ranks.iter().map(|r| (r.index, r.role)).collect())
        .unwrap_or_default();
    let expected = view.map(|v| v.nodes.expected);
    let up = |p: &crate::peers::Peer| -> bool {
        match p.state {
            State::Healthy | State::Suspect | State::Replaced => true,
            State::Lost | State::Unknown | State::Absent => false,
            State::NotWatched => match roles.get(&p.rank) {
                Some(Role::Training | Role::Spare) => true,
                Some(Role::Waiting | Role::Lost) => false,
                None => expected.is_none_or(|e| p.rank < e),
            },
        }
    };
    let others = peers.iter().filter(|p| p.rank != lost && up(p)).count();
    1 + u32::try_from(others).unwrap_or(u32::MAX - 1)
}

/// Reads the controllers' view for one sidecar and keeps the last read.
#[derive(Clone)]
pub struct Reader {
    inner: Arc<Inner>,
}

struct Inner {
    client: Option<kube::Client>,
    namespace: String,
    pod: String,
    seen: Mutex<Seen>,
    owner: Mutex<Option<Owner>>,
    /// [`MIN_INTERVAL`] (shorter in tests).
    min_interval: Duration,
    /// Held while a read is in flight: concurrent askers wait for it.
    reading: tokio::sync::Mutex<()>,
}

impl Reader {
    pub fn new(client: Option<kube::Client>, namespace: &str, pod: &str) -> Self {
        Self::build(client, namespace, pod, MIN_INTERVAL)
    }

    fn build(
        client: Option<kube::Client>,
        namespace: &str,
        pod: &str,
        min_interval: Duration,
    ) -> Self {
        Reader {
            inner: Arc::new(Inner {
                client,
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                seen: Mutex::new(Seen::default()),
                owner: Mutex::new(None),
                min_interval,
                reading: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn seen_mut(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.inner.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last read.
    pub fn seen(&self) -> Seen {
        self.seen_mut().clone()
    }

    /// Reads the view again unless the last read is younger than `max_age`
    /// (or a refused read younger than [`REFUSED_BACKOFF`]), waiting at
    /// most `wait` for it: a read that takes longer goes on and serves the
    /// next asker. A read already in flight is joined, not doubled.
    pub async fn refresh(&self, max_age: Duration, wait: Duration) {
        let me = self.clone();
        let read = tokio::spawn(async move { me.refresh_inner(max_age).await });
        let _ = tokio::time::timeout(wait, read).await;
    }

    async fn refresh_inner(&self, max_age: Duration) {
        let started = Instant::now();
        let _reading = self.inner.reading.lock().await;
        {
            let seen = self.seen_mut();
            // A read made while this one waited serves it.
            if seen.read_instant.is_some_and(|r| r >= started) {
                return;
            }
            let too_soon = |t: Option<Instant>, d: Duration| t.is_some_and(|t| t.elapsed() < d);
            let min = self.inner.min_interval;
            if too_soon(seen.read_instant, max_age.max(min))
                || too_soon(seen.tried, min)
                || (seen.refused && too_soon(seen.tried, REFUSED_BACKOFF))
            {
                return;
            }
        }
        self.seen_mut().tried = Some(Instant::now());
        let result = self.read().await;
        let mut seen = self.seen_mut();
        seen.reads += 1;
        match result {
            Ok((owner, status)) => {
                seen.workload = Some(owner.reference());
                seen.status = Some(status);
                seen.read_instant = Some(Instant::now());
                seen.read_at = Some(k8s_openapi::jiff::Timestamp::now().to_string());
                seen.error = None;
                seen.refused = false;
            }
            Err(e) => {
                if seen.error.as_deref() != Some(&e.to_string()) {
                    tracing::info!(error = %e, "the controllers' world view was not read");
                }
                seen.refused = e.lasting();
                seen.error = Some(e.to_string());
            }
        }
    }

    fn owner(&self) -> Option<Owner> {
        self.inner
            .owner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    async fn read(&self) -> Result<(Owner, WorldStatus), ViewError> {
        let client = self.inner.client.clone().ok_or(ViewError::NoApi)?;
        let ns = &self.inner.namespace;
        let owner = match self.owner() {
            Some(o) => o,
            None => {
                let what = format!("pod {ns}/{}", self.inner.pod);
                let meta = Api::<Pod>::namespaced(client.clone(), ns)
                    .get_metadata(&self.inner.pod)
                    .await
                    .map_err(|e| api_error(&what, e))?;
                let owner = Owner::of(&meta.metadata).ok_or_else(|| ViewError::NoOwner {
                    pod: self.inner.pod.clone(),
                })?;
                self.seen_mut().workload = Some(owner.reference());
                *self.inner.owner.lock().unwrap_or_else(|p| p.into_inner()) = Some(owner.clone());
                owner
            }
        };
        let what = format!("{} in namespace {ns}", owner.reference());
        let meta = match &owner {
            Owner::StatefulSet(name) => Api::<StatefulSet>::namespaced(client, ns)
                .get_metadata(name)
                .await
                .map(|m| m.metadata),
            Owner::Job(name) => Api::<Job>::namespaced(client, ns)
                .get_metadata(name)
                .await
                .map(|m| m.metadata),
        }
        .map_err(|e| api_error(&what, e))?;
        let workload = owner.reference();
        let value = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(contract::ANNOTATION))
            .ok_or_else(|| ViewError::NotWritten {
                workload: workload.clone(),
            })?;
        let status = WorldStatus::from_annotation(value).map_err(|e| ViewError::Unreadable {
            workload,
            detail: e.to_string(),
        })?;
        Ok((owner, status))
    }
}

fn api_error(what: &str, e: kube::Error) -> ViewError {
    match &e {
        kube::Error::Api(s) if s.code == 403 => ViewError::Forbidden {
            what: what.to_string(),
        },
        kube::Error::Api(s) if s.code == 404 => ViewError::NotFound {
            what: what.to_string(),
        },
        _ => ViewError::Api {
            what: what.to_string(),
            detail: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
