//! Controllers' memory benchmark (not a test): the real
//! `trainwire-controllers` (every feature on: `--node-failure --crash-loop`) against a
//! generated cluster served over HTTP by this program, a fake apiserver that
//! answers list (paginated), watch, get, create and patch as the real one
//! does, label selectors included, and keeps the controllers' Lease.
//!
//! One run per cluster size: N pods of which 1 % belong to injected
//! workloads (StatefulSets and Jobs of 4 pods, from the captured
//! AdmissionReviews, injected by the real engine), N/100 other StatefulSets
//! and N/100 other Jobs, N/50 Nodes (50 pods per node, each with 40 images
//! in its status). Pods carry a realistic status and managedFields. The
//! controllers' peak RSS (`VmHWM`) is read from /proc once every watch the
//! controllers open is open and the process has made no request for 3 s.
//!
//! ```text
//! cargo build --release -p trainwire-controllers -p trainwire-tests
//! target/release/controllers-bench                 # 10000 and 50000 pods
//! target/release/controllers-bench 50000 --ignore-selectors
//! target/release/controllers-bench 10000 50000 --base   # without the components
//! ```
//!
//! `--ignore-selectors` makes the fake apiserver ignore label selectors
//! (every pod is sent, as the controllers' unselected pod watches were): the
//! figure without the label. `TRAINWIRE_CONTROLLERS_BIN` overrides the binary
//! (default `target/release/trainwire-controllers`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use trainwire_tests::cluster_api;

/// How long the controllers must stay silent before the figure is read.
const QUIET: Duration = Duration::from_secs(3);
/// Bound on one run.
const BOUND: Duration = Duration::from_secs(300);
/// The watches the controllers open with every feature on, per resource,
/// each shared by the controllers that read it: pods (the injected ones and
/// the dedicated stores'), nodes (dead-node reclaim), StatefulSets, Jobs,
/// and trainwire's own Services and Deployments.
const WATCHES: &[(&str, usize)] = &[
    ("pods", 2),
    ("nodes", 1),
    ("statefulsets", 1),
    ("jobs", 1),
    ("services", 1),
    ("deployments", 1),
];
/// The same without the components (`--base`): no Node watch.
const BASE_WATCHES: &[(&str, usize)] = &[
    ("pods", 2),
    ("statefulsets", 1),
    ("jobs", 1),
    ("services", 1),
    ("deployments", 1),
];

fn proc_status(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn controllers_bin() -> PathBuf {
    std::env::var_os("TRAINWIRE_CONTROLLERS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            trainwire_test_support::fixtures::repo_root()
                .join("target/release/trainwire-controllers")
        })
}

async fn run(pods: usize, ignore_selectors: bool, base: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let (cluster, bytes) = cluster_api::generate(pods, ignore_selectors)?;
    eprintln!(
        "{pods} pods generated ({} MiB of JSON) in {:.1}s",
        bytes / (1024 * 1024),
        started.elapsed().as_secs_f64()
    );
    let cluster = Arc::new(cluster);
    let flags: &[&str] = if base {
        &[]
    } else {
        &["--node-failure", "--crash-loop"]
    };
    let mut running = cluster
        .start_controllers(&controllers_bin(), flags, "controllers-bench")
        .await?;
    let child = &mut running.child;
    let pid = child.id();
    let start = Instant::now();
    let outcome = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Ok(Some(status)) = child.try_wait() {
            break Err(anyhow::anyhow!("the controllers exited: {status}"));
        }
        let watches = cluster.watches();
        let all_open = (if base { BASE_WATCHES } else { WATCHES })
            .iter()
            .all(|(r, n)| watches.get(*r).copied().unwrap_or(0) >= *n);
        let quiet = cluster.quiet_for().is_some_and(|t| t >= QUIET);
        if all_open && quiet {
            break Ok(start.elapsed());
        }
        if start.elapsed() > BOUND {
            break Err(anyhow::anyhow!(
                "not settled within {BOUND:?}; watches open: {watches:?}"
            ));
        }
    };
    let hwm = proc_status(pid, "VmHWM:");
    let rss = proc_status(pid, "VmRSS:");
    drop(running);
    let settled = outcome?;
    let requests = cluster.seen().len();
    println!(
        "| {pods} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {requests} |",
        pods / 100,
        if base {
            "none"
        } else {
            "node-failure, crash-loop"
        },
        if ignore_selectors {
            "ignored"
        } else {
            "honoured"
        },
        hwm.unwrap_or(0) as f64 / 1024.0,
        rss.unwrap_or(0) as f64 / 1024.0,
        settled.as_secs_f64(),
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ignore = args.iter().any(|a| a == "--ignore-selectors");
    let base = args.iter().any(|a| a == "--base");
    let mut sizes: Vec<usize> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse().with_context(|| format!("{a} is not a pod count")))
        .collect::<anyhow::Result<_>>()?;
    if sizes.is_empty() {
        sizes = vec![10_000, 50_000];
    }
    println!(
        "| cluster pods | trainwire pods | components | label selectors | peak RSS (MiB) | RSS settled (MiB) | seconds to settle | API requests |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for pods in sizes {
        run(pods, ignore, base).await?;
    }
    Ok(())
}
