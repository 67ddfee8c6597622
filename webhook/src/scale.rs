//! The scale guard: `kubectl scale` (the `statefulsets/scale` subresource)
//! changes `replicas` without going through the injection, so on an injected
//! fixed-size StatefulSet it would leave `PET_NNODES` stale. Such a request
//! is refused unless the world the template holds covers the new size.
//!
//! The `autoscaling/v1 Scale` in the review carries no labels or annotations,
//! so the guard looks the StatefulSet up — in a watch cache (a kube-rs
//! reflector of StatefulSets, the same one the reconciler uses), never with a
//! live GET per request. It reads the typed status trainwire recorded on the
//! pod template (`trainwire.dev/status`: the injected world).
//!
//! Its failure mode is an allowance, never a cluster-wide denial: this entry
//! sees the scale requests of every StatefulSet outside kube-system, so when
//! the guard cannot know (no Kubernetes client, cache not synced yet, the
//! watch failing, the StatefulSet not in the cache, a status it cannot read)
//! the request is allowed with an admission warning that says so, and counted
//! in `trainwire_webhook_scale_guard_unknown_total`. Only a known injected
//! StatefulSet whose new size its world does not cover is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

pub use trainwire_engine::scale::{
    Lookup, Unknown, Verdict, decide, job_size_warning, scale_allowed,
};

/// The Kubernetes API calls the guard's cache makes (the RBAC test holds the
/// ClusterRole to exactly these and the reconciler's).
pub const API_PERMISSIONS: &[(&str, &str, &str)] = &[
    ("apps", "statefulsets", "list"),
    ("apps", "statefulsets", "watch"),
];

/// Where the guard reads StatefulSets from: the watch cache in the server, a
/// map in tests.
pub trait StatefulSetSource: Send + Sync {
    fn lookup(&self, namespace: &str, name: &str) -> Lookup;
}

/// The watch cache of StatefulSets the guard (and the reconciler) read.
#[derive(Clone)]
pub struct StatefulSetCache {
    store: Option<Store<StatefulSet>>,
    /// Why there is no cache at all (no Kubernetes client).
    absent: Option<String>,
    synced: Arc<AtomicBool>,
    /// The last watch error and when it happened, cleared by the next good
    /// event (see [`WATCH_ERROR_WINDOW`]).
    watch_error: Arc<Mutex<Option<(Instant, String)>>>,
}

/// How long after a watch error the cache is not trusted. A watch that keeps
/// failing reports again within kube's back-off (at most about 30 s); one
/// that was re-established quietly (no change to deliver) reports nothing,
/// so after this window the cache is trusted again.
pub const WATCH_ERROR_WINDOW: Duration = Duration::from_secs(60);

impl StatefulSetCache {
    /// A cache and the writer its watch feeds (see [`StatefulSetCache::watch`]).
    pub fn new() -> (StatefulSetCache, reflector::store::Writer<StatefulSet>) {
        let (store, writer) = reflector::store::<StatefulSet>();
        let cache = StatefulSetCache {
            store: Some(store.clone()),
            absent: None,
            synced: Arc::new(AtomicBool::new(false)),
            watch_error: Arc::new(Mutex::new(None)),
        };
        let synced = cache.synced.clone();
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                synced.store(true, Ordering::Release);
                tracing::info!("StatefulSet cache synced: the scale guard answers from it");
            }
        });
        (cache, writer)
    }

    /// No cache: every lookup is unknown, for this reason.
    pub fn unavailable(why: String) -> StatefulSetCache {
        StatefulSetCache {
            store: None,
            absent: Some(why),
            synced: Arc::new(AtomicBool::new(false)),
            watch_error: Arc::new(Mutex::new(None)),
        }
    }

    /// The reader, for a controller that shares the cache.
    pub fn store(&self) -> Option<Store<StatefulSet>> {
        self.store.clone()
    }

    /// The watch that fills the cache: every StatefulSet, without
    /// `managedFields` and the last-applied annotation (the cache keeps what
    /// the guard and the reconciler read). Its events come out for a
    /// controller to use; errors are recorded for [`Self::lookup`].
    pub fn watch(
        &self,
        client: kube::Client,
        writer: reflector::store::Writer<StatefulSet>,
    ) -> impl Stream<Item = Result<watcher::Event<StatefulSet>, watcher::Error>> + Send + use<>
    {
        let errors = self.watch_error.clone();
        watcher(Api::<StatefulSet>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(slim)
            .reflect(writer)
            .inspect(move |event| {
                let mut last = match errors.lock() {
                    Ok(g) => g,
                    Err(poisoned) => poisoned.into_inner(),
                };
                match event {
                    Ok(_) => *last = None,
                    Err(e) => {
                        tracing::warn!(error = %e, "StatefulSet watch failed; the scale guard allows scales it cannot check");
                        *last = Some((Instant::now(), e.to_string()));
                    }
                }
            })
    }

    /// Run the watch alone (when the reconciler, which shares it, is off).
    pub async fn run(self, client: kube::Client, writer: reflector::store::Writer<StatefulSet>) {
        self.watch(client, writer).for_each(|_| async {}).await;
    }
}

impl StatefulSetSource for StatefulSetCache {
    fn lookup(&self, namespace: &str, name: &str) -> Lookup {
        let Some(store) = &self.store else {
            return Lookup::Unknown(
                Unknown::no_client,
                format!(
                    "no Kubernetes API client: {}",
                    self.absent.as_deref().unwrap_or("not configured")
                ),
            );
        };
        if !self.synced.load(Ordering::Acquire) {
            return Lookup::Unknown(
                Unknown::not_synced,
                "the webhook's StatefulSet cache has not synced yet".to_string(),
            );
        }
        let failing = match self.watch_error.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        if let Some((at, e)) = failing
            && at.elapsed() < WATCH_ERROR_WINDOW
        {
            return Lookup::Unknown(
                Unknown::watch_error,
                format!("the webhook's StatefulSet watch is failing: {e}"),
            );
        }
        match store.get(&ObjectRef::new(name).within(namespace)) {
            Some(sts) => Lookup::Found(sts),
            None => Lookup::Missing,
        }
    }
}

/// Drop what no reader of the cache needs, to keep it small.
pub fn slim<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use trainwire_engine::mutation::status::Status;

    /// A pod template whose status annotation is `status` (none: `None`).
    fn template(status: Option<&str>) -> PodTemplateSpec {
        let annotations = status.map(|s| {
            std::collections::BTreeMap::from([(
                trainwire_engine::mutation::annotations::STATUS.to_string(),
                s.to_string(),
            )])
        });
        PodTemplateSpec {
            metadata: Some(ObjectMeta {
                annotations,
                ..Default::default()
            }),
            spec: None,
        }
    }

    /// The status annotation of a world of `nnodes`.
    fn status_of(nnodes: &str) -> String {
        let status = Status {
            nnodes: nnodes.to_string(),
            ..Default::default()
        };
        serde_json::to_string(&status).expect("json")
    }

    fn sts(status: Option<&str>) -> Lookup {
        Lookup::Found(Arc::new(StatefulSet {
            metadata: ObjectMeta {
                name: Some("train".into()),
                namespace: Some("ml".into()),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                template: template(status),
                ..Default::default()
            }),
            status: None,
        }))
    }

    fn injected(nnodes: &str) -> Lookup {
        sts(Some(&status_of(nnodes)))
    }

    fn verdict(lookup: Lookup, new: i32, old: Option<i32>) -> &'static str {
        match decide(|| lookup, "ml", "train", new, old) {
            Verdict::Allow => "allow",
            Verdict::AllowUnknown(..) => "allow-with-warning",
            Verdict::Refuse(_) => "refuse",
        }
    }

    #[test]
    fn verdicts() {
        let unknown = |r| Lookup::Unknown(r, "why".into());
        let table: Vec<(&str, Lookup, i32, Option<i32>, &str)> = vec![
            ("not injected", sts(None), 5, Some(2), "allow"),
            ("fixed, same size", injected("2"), 2, Some(3), "allow"),
            ("fixed, grow", injected("2"), 3, Some(2), "refuse"),
            ("fixed, shrink", injected("4"), 2, Some(4), "refuse"),
            ("fixed, stop", injected("4"), 0, Some(4), "allow"),
            ("elastic, inside", injected("1:4"), 3, Some(2), "allow"),
            ("elastic, outside", injected("3:4"), 2, Some(3), "refuse"),
            (
                "paused, scale up from 0",
                injected(""),
                2,
                Some(0),
                "refuse",
            ),
            ("paused, stays 0", injected(""), 0, Some(0), "allow"),
            (
                "annotated nnodes at 0, up to it",
                injected("4"),
                4,
                Some(0),
                "allow",
            ),
            (
                "no change, no lookup",
                unknown(Unknown::no_client),
                3,
                Some(3),
                "allow",
            ),
            (
                "no client",
                unknown(Unknown::no_client),
                3,
                Some(2),
                "allow-with-warning",
            ),
            (
                "not synced",
                unknown(Unknown::not_synced),
                3,
                Some(2),
                "allow-with-warning",
            ),
            (
                "API error",
                unknown(Unknown::watch_error),
                3,
                Some(2),
                "allow-with-warning",
            ),
            (
                "not cached",
                Lookup::Missing,
                3,
                Some(2),
                "allow-with-warning",
            ),
            (
                "unreadable status",
                sts(Some("{not json")),
                3,
                Some(2),
                "allow-with-warning",
            ),
        ];
        for (case, lookup, new, old, want) in table {
            assert_eq!(verdict(lookup, new, old), want, "{case}");
        }
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let Verdict::Refuse(r) = decide(|| injected("2"), "ml", "train", 3, Some(2)) else {
            panic!("refused");
        };
        assert_eq!(
            r.to_string(),
            "StatefulSet train: scaling to 3 replicas with the scale subresource (kubectl scale) is refused because its pods were injected with PET_NNODES=2 and it would go stale; change `replicas` with `kubectl apply` or `kubectl patch` (which re-injects PET_NNODES), or annotate an elastic range `trainwire.dev/nnodes: MIN:MAX` that covers 3"
        );
        let Verdict::Refuse(r) = decide(|| injected(""), "ml", "train", 2, Some(0)) else {
            panic!("refused");
        };
        assert!(
            r.to_string()
                .contains("injected paused (replicas 0, no trainwire.dev/nnodes)"),
            "{r}"
        );
    }

    /// A world with hot spares: its pods may number from the world's
    /// minimum (spares used up) to its maximum plus the spares.
    #[test]
    fn spares_widen_the_sizes_a_world_takes() {
        let with_spares = |nnodes: &str, spares| {
            let status = Status {
                nnodes: nnodes.to_string(),
                spares,
                ..Default::default()
            };
            sts(Some(&serde_json::to_string(&status).expect("json")))
        };
        let table: Vec<(&str, &str, u32, i32, &str)> = vec![
            ("fixed 2 + 1, all", "2", 1, 3, "allow"),
            ("fixed 2 + 1, no spare left", "2", 1, 2, "allow"),
            ("fixed 2 + 1, below the world", "2", 1, 1, "refuse"),
            ("fixed 2 + 1, one spare too many", "2", 1, 4, "refuse"),
            ("elastic 2:4 + 2, top", "2:4", 2, 6, "allow"),
            ("elastic 2:4 + 2, above", "2:4", 2, 7, "refuse"),
        ];
        for (case, nnodes, spares, new, want) in table {
            assert_eq!(
                verdict(with_spares(nnodes, spares), new, Some(3)),
                want,
                "{case}"
            );
        }
        let Verdict::Refuse(r) = decide(|| with_spares("2", 1), "ml", "train", 4, Some(3)) else {
            panic!("refused");
        };
        assert!(
            r.to_string()
                .contains("injected with PET_NNODES=2 and 1 spare(s), which takes 2 to 3 pods"),
            "{r}"
        );
    }

    #[tokio::test]
    async fn a_cache_without_a_client_or_not_synced_is_unknown() {
        let none = StatefulSetCache::unavailable("no kubeconfig".into());
        assert!(matches!(
            none.lookup("ml", "train"),
            Lookup::Unknown(Unknown::no_client, why) if why.contains("no kubeconfig")
        ));
        let (cache, _writer) = StatefulSetCache::new();
        assert!(matches!(
            cache.lookup("ml", "train"),
            Lookup::Unknown(Unknown::not_synced, _)
        ));
    }
    /// A Job injected with `nnodes` (or not injected: `None`), at
    /// `parallelism`, suspended or not.
    fn job(
        nnodes: Option<&str>,
        parallelism: i32,
        suspend: bool,
    ) -> k8s_openapi::api::batch::v1::Job {
        use k8s_openapi::api::batch::v1::{Job, JobSpec};
        Job {
            metadata: ObjectMeta {
                name: Some("bert".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                parallelism: Some(parallelism),
                suspend: Some(suspend),
                template: template(nnodes.map(status_of).as_deref()),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_job_whose_parallelism_leaves_its_world_is_warned() {
        let warned =
            |nnodes, parallelism, suspend| job_size_warning(&job(nnodes, parallelism, suspend));
        assert_eq!(
            warned(Some("4"), 2, false).as_deref(),
            Some(
                "parallelism 2 does not fit PET_NNODES=4 of the pods: set it back, or recreate the Job"
            )
        );
        assert!(
            warned(Some("2:4"), 5, false)
                .is_some_and(|w| w.contains("does not fit the elastic world 2:4"))
        );
        assert!(warned(Some("2:4"), 1, false).is_some());
        // Fits, nothing runs, or not trainwire's.
        assert_eq!(warned(Some("4"), 4, false), None);
        assert_eq!(warned(Some("2:4"), 3, false), None);
        assert_eq!(warned(Some("4"), 2, true), None);
        assert_eq!(warned(Some("4"), 0, false), None);
        assert_eq!(warned(None, 2, false), None);
        assert_eq!(warned(Some(""), 2, false), None);
        // A Job with a spare: parallelism from the world to world + spares.
        let spare_job = |parallelism| {
            let status = Status {
                nnodes: "2".into(),
                spares: 1,
                ..Default::default()
            };
            let mut j = job(None, parallelism, false);
            if let Some(spec) = j.spec.as_mut() {
                spec.template = template(Some(&serde_json::to_string(&status).expect("json")));
            }
            job_size_warning(&j)
        };
        assert_eq!(spare_job(3), None);
        assert_eq!(spare_job(2), None);
        assert!(spare_job(4).is_some_and(|w| w.contains("PET_NNODES=2 and 1 spare(s)")));
        // Every warning fits what the apiserver passes on whole.
        assert!(warned(Some("2:4"), 5, false).is_some_and(|w| w.len() <= 256));
    }
}
