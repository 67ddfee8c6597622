//! One watch per kind in the process, shared by every controller that
//! reads it (kube-rs's shared reflectors, `examples/shared_stream_controllers.rs`):
//! a reflector fills one cache and fans each change out to every
//! subscriber, and each controller keeps its own filter on what it gets.
//!
//! | watch | selects | read by |
//! | --- | --- | --- |
//! | `pods` | the injected pods (label) | failures (its primary), world |
//! | `store_pods` | the dedicated stores' pods (label `trainwire.dev/rdzv-store`) | world |
//! | `statefulsets`, `jobs` | the injected workloads (label) | reconciler (new generations only), world, crash-loop stop |
//! | `services`, `deployments` | trainwire's own (label `app.kubernetes.io/managed-by`) | reconciler (owned objects) |
//! | `nodes` | every Node, with dead-node reclaim only | failures |
//!
//! [`Watches::new`] makes the caches, the controllers subscribe, then
//! [`Watches::run`] (which takes the whole set, so no subscription can come
//! after it starts) runs the watches that have a subscriber; a kind no
//! controller asked for is never watched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt as _, Stream, StreamExt};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};

use trainwire_contract::labels::{MANAGED_BY, MANAGED_BY_LABEL};

/// Changes buffered per watch for its subscribers before the watch waits
/// for the slowest one.
const BUFFER: usize = 256;

/// One shared watch: its cache and its fan-out.
pub struct Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    writer: Writer<K>,
    subscribed: AtomicBool,
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    fn new() -> Self {
        let (store, writer) = reflector::store_shared::<K>(BUFFER);
        Watched {
            store,
            writer,
            subscribed: AtomicBool::new(false),
        }
    }

    /// The cache (filled once the watch runs).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Every change of the kind, from the one watch. A subscription makes
    /// [`Watches::run`] start the watch.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribed.store(true, Ordering::SeqCst);
        // A writer made by `store_shared` always gives a subscription.
        futures::stream::iter(self.writer.subscribe()).flatten()
    }

    /// The watch, feeding the cache and the subscribers; `None` when no
    /// controller subscribed.
    fn run(
        self,
        api: Api<K>,
        config: watcher::Config,
        modify: impl FnMut(&mut K) + Send + 'static,
    ) -> Option<futures::future::BoxFuture<'static, ()>>
    where
        K: serde::de::DeserializeOwned,
    {
        if !self.subscribed.load(Ordering::SeqCst) {
            return None;
        }
        Some(
            watcher(api, config)
                .default_backoff()
                .modify(modify)
                .reflect_shared(self.writer)
                .for_each(|_| futures::future::ready(()))
                .boxed(),
        )
    }
}

/// The process's watches, one per kind (and selector).
pub struct Watches {
    pub pods: Watched<Pod>,
    pub store_pods: Watched<Pod>,
    pub statefulsets: Watched<StatefulSet>,
    pub jobs: Watched<Job>,
    pub services: Watched<Service>,
    pub deployments: Watched<Deployment>,
    pub nodes: Watched<Node>,
}

impl Default for Watches {
    fn default() -> Self {
        Self::new()
    }
}

impl Watches {
    pub fn new() -> Self {
        Watches {
            pods: Watched::new(),
            store_pods: Watched::new(),
            statefulsets: Watched::new(),
            jobs: Watched::new(),
            services: Watched::new(),
            deployments: Watched::new(),
            nodes: Watched::new(),
        }
    }

    /// Run every watch a controller subscribed to, until aborted.
    pub async fn run(self, client: Client) {
        let injected =
            watcher::Config::default().labels(&trainwire_contract::labels::injected_selector());
        let owned = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
        let store_pods = watcher::Config::default().labels(trainwire_contract::labels::RDZV_STORE);
        let watches = [
            self.pods.run(
                Api::all(client.clone()),
                injected.clone(),
                trainwire_engine::pod::slim,
            ),
            self.store_pods.run(
                Api::all(client.clone()),
                store_pods,
                trainwire_engine::pod::slim,
            ),
            self.statefulsets.run(
                Api::all(client.clone()),
                injected.clone(),
                crate::reconcile::slim,
            ),
            self.jobs
                .run(Api::all(client.clone()), injected, crate::reconcile::slim),
            self.services.run(
                Api::all(client.clone()),
                owned.clone(),
                crate::reconcile::slim,
            ),
            self.deployments
                .run(Api::all(client.clone()), owned, crate::reconcile::slim),
            self.nodes.run(
                Api::all(client),
                watcher::Config::default(),
                |n: &mut Node| {
                    crate::reconcile::slim(n);
                    if let Some(s) = n.status.as_mut() {
                        // Dozens of images per node, never read.
                        s.images = None;
                    }
                },
            ),
        ];
        futures::future::join_all(watches.into_iter().flatten()).await;
    }
}

/// The most objects [`new_generations`] remembers; past it, it forgets
/// them all (each then passes once more: one reconcile too many, never one
/// too few).
const MAX_REMEMBERED: usize = 65_536;

/// Only the objects whose `metadata.generation` changed (a spec change), as
/// kube's `predicates::generation` filters a stream of its own; objects
/// without a generation always pass.
pub fn new_generations<K: Resource>(
    changes: impl Stream<Item = Arc<K>>,
) -> impl Stream<Item = Arc<K>> {
    let mut seen: HashMap<String, i64> = HashMap::new();
    changes.filter(move |object| {
        let meta = object.meta();
        let pass = match (meta.uid.as_ref(), meta.generation) {
            (Some(uid), Some(generation)) => {
                if seen.len() >= MAX_REMEMBERED && !seen.contains_key(uid) {
                    seen.clear();
                }
                seen.insert(uid.clone(), generation) != Some(generation)
            }
            _ => true,
        };
        futures::future::ready(pass)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn job(uid: &str, generation: i64) -> Arc<Job> {
        Arc::new(Job {
            metadata: ObjectMeta {
                uid: Some(uid.to_string()),
                generation: Some(generation),
                ..ObjectMeta::default()
            },
            ..Job::default()
        })
    }

    #[tokio::test]
    async fn only_new_generations_pass() {
        let changes = futures::stream::iter([
            job("a", 1),
            job("a", 1),
            job("b", 1),
            job("a", 2),
            job("a", 2),
            Arc::new(Job::default()),
        ]);
        let passed: Vec<_> = new_generations(changes)
            .map(|j| (j.metadata.uid.clone(), j.metadata.generation))
            .collect()
            .await;
        assert_eq!(
            passed,
            [
                (Some("a".to_string()), Some(1)),
                (Some("b".to_string()), Some(1)),
                (Some("a".to_string()), Some(2)),
                (None, None),
            ]
        );
    }
}
