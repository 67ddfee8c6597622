//! The real `trainwire-controllers` against a generated cluster
//! served over HTTP (`trainwire_tests::cluster_api`): which watches it opens
//! with each feature on or off. The process watches each kind once (the
//! controllers share the watch), a feature left off must start no watch of
//! its own (it has no rights for it), and every watch of pods, StatefulSets
//! and Jobs must select the injected ones by label. A failed reconcile of
//! the world controller is counted on the served `/metrics`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use trainwire_tests::cluster_api::{self, Cluster, Controllers, Seen};

/// Bound on the wait for the controllers' watches.
const BOUND: Duration = Duration::from_secs(60);

async fn start(cluster: &Arc<Cluster>, flags: &[&str]) -> Result<Controllers> {
    let bin = trainwire_tests::controllers_binary().map_err(anyhow::Error::msg)?;
    cluster
        .start_controllers(&bin, flags, "controllers-test")
        .await
}

/// Wait until the watches `expected` (collection, count) are open.
async fn wait_for_watches(
    cluster: &Cluster,
    running: &mut Controllers,
    expected: &[(&str, usize)],
) -> Result<()> {
    let start = Instant::now();
    loop {
        let watches = cluster.watches();
        if expected
            .iter()
            .all(|(c, n)| watches.get(*c).copied().unwrap_or(0) >= *n)
        {
            return Ok(());
        }
        if let Some(status) = running.child.try_wait()? {
            bail!("the controllers exited ({status}) before opening their watches");
        }
        if start.elapsed() > BOUND {
            bail!("after {BOUND:?}, watches open: {watches:?}; expected {expected:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn lists_and_watches(seen: &[Seen], collection: &str) -> Vec<Seen> {
    seen.iter()
        .filter(|s| s.method == http::Method::GET && s.collection() == Some(collection))
        .cloned()
        .collect()
}

/// How long the controllers must make no request before their watches are
/// taken as all open.
const QUIET: Duration = Duration::from_secs(2);

/// Wait until the controllers have opened `expected` and then made no
/// request for [`QUIET`]; the watches open then, per (collection, label
/// selector).
async fn settled_watches(
    cluster: &Cluster,
    running: &mut Controllers,
    expected: &[(&str, usize)],
) -> Result<BTreeMap<(String, String), usize>> {
    wait_for_watches(cluster, running, expected).await?;
    let start = Instant::now();
    while cluster.quiet_for().is_none_or(|t| t < QUIET) {
        if start.elapsed() > BOUND {
            bail!("the controllers kept making requests for {BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut open = BTreeMap::new();
    for s in cluster.seen().iter().filter(|s| s.is_watch()) {
        let collection = s.collection().unwrap_or_default().to_string();
        let selector = s.query.get("labelSelector").cloned().unwrap_or_default();
        *open.entry((collection, selector)).or_default() += 1;
    }
    Ok(open)
}

/// One watch per kind and selector: the controllers share it.
fn each_watched_once(open: &BTreeMap<(String, String), usize>) -> Result<()> {
    for ((collection, selector), n) in open {
        anyhow::ensure!(
            *n == 1,
            "{collection} ({selector}) watched {n} times, not once: {open:?}"
        );
    }
    Ok(())
}

/// Every list and watch of pods, StatefulSets and Jobs selects the injected
/// ones, but the world controller's watch of the dedicated stores' pods,
/// which selects those by their own label.
fn pods_are_selected(seen: &[Seen]) -> Result<()> {
    let injected = trainwire_contract::labels::injected_selector();
    for collection in ["pods", "statefulsets", "jobs"] {
        let requests = lists_and_watches(seen, collection);
        anyhow::ensure!(!requests.is_empty(), "no {collection} list or watch");
        for s in requests {
            let selector = s.query.get("labelSelector").map(String::as_str);
            anyhow::ensure!(
                selector == Some(injected.as_str())
                    || (collection == "pods"
                        && selector == Some(trainwire_contract::labels::RDZV_STORE)),
                "a {collection} request without the injected-label selector: {s:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn without_the_components_no_node_watch_and_only_injected_pods() -> Result<()> {
    let (cluster, _) = cluster_api::generate(400, false)?;
    let cluster = Arc::new(cluster);
    let mut running = start(&cluster, &[]).await?;
    // The injected pods, the dedicated stores' pods, StatefulSets and Jobs,
    // trainwire's own Services and Deployments: each once.
    let open = settled_watches(
        &cluster,
        &mut running,
        &[
            ("pods", 2),
            ("statefulsets", 1),
            ("jobs", 1),
            ("services", 1),
            ("deployments", 1),
        ],
    )
    .await?;
    each_watched_once(&open)?;
    anyhow::ensure!(open.len() == 6, "{open:?}");
    let seen = cluster.seen();
    pods_are_selected(&seen)?;
    let nodes = lists_and_watches(&seen, "nodes");
    anyhow::ensure!(
        nodes.is_empty(),
        "nodes read without --node-failure: {nodes:?}"
    );
    // Nothing it has no right to: no delete, no pods/status, no nodes.
    for s in &seen {
        anyhow::ensure!(s.method != http::Method::DELETE, "a delete: {s:?}");
        anyhow::ensure!(!s.path.ends_with("/status"), "a status write: {s:?}");
    }
    Ok(())
}

#[tokio::test]
async fn with_every_feature_each_kind_is_still_watched_once() -> Result<()> {
    let (cluster, _) = cluster_api::generate(400, false)?;
    let cluster = Arc::new(cluster);
    let mut running = start(&cluster, &["--node-failure", "--crash-loop"]).await?;
    let open = settled_watches(
        &cluster,
        &mut running,
        &[
            ("pods", 2),
            ("nodes", 1),
            ("statefulsets", 1),
            ("jobs", 1),
            ("services", 1),
            ("deployments", 1),
        ],
    )
    .await?;
    each_watched_once(&open)?;
    anyhow::ensure!(open.len() == 7, "{open:?}");
    pods_are_selected(&cluster.seen())?;
    Ok(())
}

/// `trainwire_webhook_reconcile_errors_total{controller="world"}` as served.
fn world_errors(probe: u16) -> Option<u64> {
    trainwire_test_support::net::http_get(&format!("127.0.0.1:{probe}"), "/metrics")?
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"trainwire_webhook_reconcile_errors_total{controller="world"} "#)
        })
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_world_status_write_that_fails_is_counted_on_metrics() -> Result<()> {
    let (cluster, _) = cluster_api::generate(400, false)?;
    // The world controller writes its annotation on the injected
    // StatefulSets and Jobs; nothing else here patches them.
    cluster.refuse_patches("statefulsets");
    cluster.refuse_patches("jobs");
    let cluster = Arc::new(cluster);
    let mut running = start(&cluster, &[]).await?;
    let start = Instant::now();
    loop {
        if let Some(status) = running.child.try_wait()? {
            bail!("the controllers exited ({status})");
        }
        let refused = cluster
            .seen()
            .iter()
            .any(|s| s.method == http::Method::PATCH && s.path.contains("/statefulsets/"));
        // Once a write was refused, the counter must move.
        if refused && world_errors(running.probe).is_some_and(|n| n > 0) {
            return Ok(());
        }
        if start.elapsed() > BOUND {
            bail!(
                "after {BOUND:?}: a world write refused: {refused}; world errors on /metrics: {:?}",
                world_errors(running.probe)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
