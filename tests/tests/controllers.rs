//! The real `trainwire-controllers` against a generated cluster
//! served over HTTP (`trainwire_tests::cluster_api`): which watches it opens
//! with each feature on or off. A feature left off must start no watch of
//! its own (it has no rights for it), and every watch of pods, StatefulSets
//! and Jobs must select the injected ones by label.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    // The reconciler's (StatefulSets, Jobs, its own Services and
    // Deployments), the world controller's (pods, the stores' pods,
    // StatefulSets, Jobs) and the failure controller's pod watch.
    wait_for_watches(
        &cluster,
        &mut running,
        &[
            ("pods", 3),
            ("statefulsets", 2),
            ("jobs", 2),
            ("services", 2),
            ("deployments", 2),
        ],
    )
    .await?;
    let seen = cluster.seen();
    pods_are_selected(&seen)?;
    let nodes = lists_and_watches(&seen, "nodes");
    anyhow::ensure!(
        nodes.is_empty(),
        "nodes read without --node-failure: {nodes:?}"
    );
    // No third StatefulSet or Job watch: crash-loop stop is off.
    let watches = cluster.watches();
    anyhow::ensure!(
        watches.get("statefulsets") == Some(&2) && watches.get("jobs") == Some(&2),
        "{watches:?}"
    );
    // Nothing it has no right to: no delete, no pods/status, no nodes.
    for s in &seen {
        anyhow::ensure!(s.method != http::Method::DELETE, "a delete: {s:?}");
        anyhow::ensure!(!s.path.ends_with("/status"), "a status write: {s:?}");
    }
    Ok(())
}

#[tokio::test]
async fn each_feature_opens_its_own_watches() -> Result<()> {
    let (cluster, _) = cluster_api::generate(400, false)?;
    let cluster = Arc::new(cluster);
    let mut running = start(&cluster, &["--node-failure", "--crash-loop"]).await?;
    wait_for_watches(
        &cluster,
        &mut running,
        &[
            ("pods", 3),
            ("nodes", 1),
            ("statefulsets", 3),
            ("jobs", 3),
            ("services", 2),
            ("deployments", 2),
        ],
    )
    .await?;
    pods_are_selected(&cluster.seen())?;
    Ok(())
}
