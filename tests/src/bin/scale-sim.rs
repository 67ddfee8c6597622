//! Heartbeat scale benchmark (not a test): N real `trainwire-sidecar`
//! processes, each in its own network namespace on one bridge, with the
//! env the webhook renders for pod `i` of an N-pod StatefulSet (heartbeat
//! detection, 1 s interval, 3 misses, pod 0 the rendezvous host) and no
//! trainer. Needs root and `ip netns`.
//!
//! ```text
//! cargo build --release -p trainwire-sidecar
//! TRAINWIRE_SIDECAR_BIN=target/release/trainwire-sidecar \
//!   cargo run --release -p trainwire-tests --bin scale-sim -- 8 32 64 128 [--window 20] [--settle 10] [--busy 2]
//! ```
//!
//! For each N, once every sidecar sees its watched peers healthy and
//! `--settle` seconds more: CPU per sidecar (share of one core, `/proc/<pid>/stat`
//! utime + stime over the window), RSS (`VmRSS`), heartbeat probes sent
//! and answered per sidecar per second (the sidecars' own counters), and
//! whether rank 0 (and every sidecar) sees every peer it watches healthy,
//! and the losses the sidecars declared (false ones: nothing is cut).
//! `--busy K` keeps K processes spinning on the CPUs during the window (a
//! `stress --cpu K` load), to see whether a loaded node makes false losses.
//! Prints one summary line per N and a Markdown table.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use trainwire_tests::scale::{Report, Sim};

fn main() -> Result<()> {
    let mut sizes = Vec::new();
    let mut window = Duration::from_secs(20);
    // Start-up work (first lookups, the first /proc scans) is left out.
    let mut settle = Duration::from_secs(10);
    let mut busy = 0u32;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--settle" {
            let secs: u64 = args
                .next()
                .context("--settle needs seconds")?
                .parse()
                .context("--settle needs seconds")?;
            settle = Duration::from_secs(secs);
        } else if arg == "--busy" {
            busy = args
                .next()
                .context("--busy needs a number of processes")?
                .parse()
                .context("--busy needs a number of processes")?;
        } else if arg == "--window" {
            let secs: u64 = args
                .next()
                .context("--window needs seconds")?
                .parse()
                .context("--window needs seconds")?;
            window = Duration::from_secs(secs);
        } else {
            sizes.push(
                arg.parse::<u32>()
                    .with_context(|| format!("{arg}: not a size"))?,
            );
        }
    }
    if sizes.is_empty() {
        sizes = vec![8, 32, 64, 128];
    }
    if let Some(why) = trainwire_tests::netns::unavailable() {
        bail!("network namespaces are not available: {why}");
    }
    let bin = trainwire_tests::sidecar_binary().map_err(anyhow::Error::msg)?;
    println!("sidecar: {}", bin.display());
    let mut reports: Vec<Report> = Vec::new();
    for n in sizes {
        let sim = Sim::start(n).map_err(anyhow::Error::msg)?;
        std::thread::sleep(settle);
        let report = sim.measure(window, busy).map_err(anyhow::Error::msg)?;
        println!("SCALE {}", report.summary());
        reports.push(report);
        drop(sim);
    }
    println!();
    println!(
        "| N sidecars | CPU per sidecar (mean / max) | RSS per sidecar (mean / max) | probes sent per sidecar per s (mean / max) | probes answered per s (max but rank 0 / rank 0) | rank 0's watched peers healthy | sidecars seeing all watched peers healthy | busy cores | false losses |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &reports {
        let host = r.rank(0);
        println!(
            "| {} | {:.2} % / {:.2} % | {:.1} / {:.1} MiB | {:.1} / {:.1} | {:.1} / {:.1} | {}/{} | {}/{} | {} | {} |",
            r.n,
            r.mean_cpu(),
            r.max_cpu(),
            r.mean_rss(),
            r.max_rss(),
            r.mean_sent(),
            r.max_sent(),
            r.max_served_but_host(),
            host.map_or(0.0, |h| h.probes_served),
            host.map_or(0, |h| h.watched_healthy),
            host.map_or(0, |h| h.watched.len()),
            r.all_watched_healthy(),
            r.sidecars.len(),
            r.busy,
            r.losses(),
        );
    }
    Ok(())
}
