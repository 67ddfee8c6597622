//! The admission engine alone, in a loop on one thread: no TLS, no HTTP.
//! For profiling the per-review CPU (`docs/benchmarks.md`):
//!
//! ```sh
//! cargo build --release -p trainwire-webhook --example admit_loop
//! taskset -c 0 perf stat -e task-clock ./target/release/examples/admit_loop 20000
//! perf record -g ./target/release/examples/admit_loop 20000 && perf report
//! ```
//!
//! Argument: how many admissions (default 10,000); optional second
//! argument: the AdmissionReview file (default: the captured
//! `statefulset-create.json`).

use std::sync::Arc;
use std::time::Instant;

use trainwire_webhook::admission::{Admitter, Answer};
use trainwire_webhook::metrics::Metrics;
use trainwire_webhook::scale::StatefulSetCache;
use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let path = args.next().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/admission/statefulset-create.json"
        )
        .to_string()
    });
    let body = std::fs::read(&path)?;
    let admitter = Admitter {
        policy: SharedPolicy::new(Policy::default()),
        statefulsets: Arc::new(StatefulSetCache::unavailable("no API".to_string())),
        metrics: Arc::new(Metrics::new()),
    };
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let mut bytes = 0;
    let started = Instant::now();
    for _ in 0..n {
        match rt.block_on(admitter.admit(&body)) {
            Answer::Review(r) => bytes += r.len(),
            Answer::BadRequest(reason) => anyhow::bail!("bad request: {reason}"),
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{n} admissions of {path}: {:.1} µs each (wall), {} bytes answered each",
        elapsed.as_secs_f64() * 1e6 / n as f64,
        bytes / n.max(1)
    );
    Ok(())
}
