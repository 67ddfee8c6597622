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
//! `statefulset-create.json`). With `TRAINWIRE_ENGINE=one-label`, the loop
//! runs the bench's one-label baseline handler instead (the shape of
//! kube-rs's `examples/admission_controller.rs`: read the review as
//! `AdmissionReview<DynamicObject>`, add one label, write the answer), so
//! the two handlers' CPU can be compared without the server around them.

use std::sync::Arc;
use std::time::Instant;

use trainwire_webhook::admission::{Admitter, Answer};
use trainwire_webhook::metrics::Metrics;
use trainwire_webhook::policy::{Policy, SharedPolicy};
use trainwire_webhook::scale::StatefulSetCache;

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
    let one_label = std::env::var("TRAINWIRE_ENGINE").is_ok_and(|e| e == "one-label");
    let started = Instant::now();
    for _ in 0..n {
        if one_label {
            bytes += one_label_answer(&body)?.len();
            continue;
        }
        match rt.block_on(admitter.admit(&body)) {
            Answer::Review(r) => bytes += r.len(),
            Answer::BadRequest(reason) => anyhow::bail!("bad request: {reason}"),
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{n} {} admissions of {path}: {:.1} µs each (wall), {} bytes answered each",
        if one_label { "one-label" } else { "trainwire" },
        elapsed.as_secs_f64() * 1e6 / n as f64,
        bytes / n.max(1)
    );
    Ok(())
}

/// The one-label baseline's handler (`admission-bench one-label-server`),
/// from the body to the answer's bytes.
fn one_label_answer(body: &[u8]) -> anyhow::Result<Vec<u8>> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, Patch, PatchOperation};
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};

    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
    let request: AdmissionRequest<DynamicObject> = review.try_into()?;
    let mut response = AdmissionResponse::from(&request);
    if let Some(object) = &request.object {
        let mut patches = Vec::new();
        if object.metadata.labels.is_none() {
            patches.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "labels"]),
                value: serde_json::json!({}),
            }));
        }
        patches.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "labels", "admission"]),
            value: serde_json::Value::String("modified-by-admission-controller".into()),
        }));
        response = response.with_patch(Patch(patches))?;
    }
    Ok(serde_json::to_vec(&response.into_review())?)
}
