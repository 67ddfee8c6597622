//! The real `trainwire-webhook controllers` against a generated cluster
//! served over HTTP (`trainwire_tests::cluster_api`): which watches it opens
//! with each feature on or off. A feature left off must start no watch of
//! its own (it has no rights for it), and every watch of pods, StatefulSets
//! and Jobs must select the injected ones by label.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use trainwire_tests::cluster_api::{self, Cluster, Seen};

/// Bound on the wait for the controllers' watches.
const BOUND: Duration = Duration::from_secs(60);

struct Running {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start(cluster: &Arc<Cluster>, flags: &[&str]) -> Result<Running> {
    let addr = cluster.serve().await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig =
        trainwire_tests::apiserver::write_kubeconfig(dir.path(), addr, "trainwire-system")?;
    let bin = trainwire_tests::webhook_binary().map_err(anyhow::Error::msg)?;
    let probe = trainwire_test_support::net::free_port();
    let child = Command::new(&bin)
        .arg("controllers")
        .args(flags)
        .arg(format!("--probe-listen=127.0.0.1:{probe}"))
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .env("HOSTNAME", "controllers-test")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(Running { child, _dir: dir })
}

/// Wait until the watches `expected` (collection, count) are open.
async fn wait_for_watches(
    cluster: &Cluster,
    running: &mut Running,
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
/// ones.
fn pods_are_selected(seen: &[Seen]) -> Result<()> {
    for collection in ["pods", "statefulsets", "jobs"] {
        let requests = lists_and_watches(seen, collection);
        anyhow::ensure!(!requests.is_empty(), "no {collection} list or watch");
        for s in requests {
            anyhow::ensure!(
                s.query.get("labelSelector").map(String::as_str)
                    == Some(trainwire_contract::labels::injected_selector().as_str()),
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
    // Deployments), the world controller's (pods, StatefulSets, Jobs) and
    // the failure controller's pod watch.
    wait_for_watches(
        &cluster,
        &mut running,
        &[
            ("pods", 2),
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
            ("pods", 2),
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
