//! Admission server benchmark (not a test). One run measures, on the same
//! stack (rustls + hyper-util, ECDSA certificate, TLS keep-alive), with the
//! StatefulSet CREATE review a real kube-apiserver sent, the server pinned
//! to one core and the load generator to the other:
//!
//! - **floor**: a bare rustls+hyper server answering trainwire's own reply,
//!   canned (no parsing, no work);
//! - **one-label baseline**: the shape of kube-rs's
//!   `examples/admission_controller.rs` (axum, typed
//!   `AdmissionReview<DynamicObject>`, a JSON patch adding one label), served
//!   here by the same TLS code as trainwire;
//! - **trainwire**: the real `trainwire-webhook serve` doing the full
//!   mutation, with `RUST_LOG=warn` and with `RUST_LOG=info` (one line per
//!   admission, to a pipe that is drained);
//!
//! each over HTTP/2 and HTTP/1.1, at saturation (closed loop) and at a fixed
//! 1,000 req/s (open loop, latency from when the request was due), with the
//! server's CPU time per request and its peak RSS; then a hostile-input row:
//! a review whose trainer has 20,000 env entries.
//!
//! ```text
//! cargo build --release -p trainwire-webhook -p trainwire-tests
//! target/release/admission-bench
//! ```
//!
//! `admission-bench handlers [N [REVIEW]]` times the two handlers alone,
//! trainwire's and the one-label baseline's, in one loop without a server.
//!
//! Every server runs with mimalloc, trainwire-webhook's allocator. Every
//! phase is a fixed number of requests. `TRAINWIRE_WEBHOOK_BIN`
//! overrides the server binary (default `target/release/trainwire-webhook`);
//! `TRAINWIRE_WEBHOOK_BIN_B` adds the rows of a second build (another
//! allocator, another commit) to the same run.
//!
//! The servers under load are in `servers.rs`, the load generator in
//! `load.rs`; this file runs the phases and prints the table.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

mod load;
mod servers;

use load::{CONNECTIONS, HOST, Http, Phase, RATE, client, closed_loop, one, open_loop};
use servers::{bare_server, handlers, one_label_server, start_bare, start_webhook};

/// The allocator `trainwire-webhook` runs with (`webhook/src/main.rs`), so
/// that the floor and the one-label baseline, served by this binary, run on
/// the same stack as trainwire: with the system allocator the baseline's
/// handler costs 14.1 µs instead of 10.2, which flattered trainwire's ratio.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Env entries of the hostile review.
const HOSTILE_ENV: usize = 20_000;
/// Hostile reviews sent, one after the other.
const HOSTILE_REQUESTS: usize = 20;
/// Requests of the closed-loop (as fast as possible) phase.
const CLOSED_LOOP_REQUESTS: usize = 20_000;
/// Requests of the open-loop phase, sent at `RATE` per second.
const OPEN_LOOP_REQUESTS: usize = 5_000;
const WARMUP: usize = 1_000;

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("bare-server") => return bare_server(&args[2..]),
        Some("one-label-server") => return one_label_server(&args[2..]),
        Some("handlers") => return handlers(&args[2..]),
        _ => {}
    }
    bench()
}

fn pin_self(cpus: &str) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .context("taskset (util-linux) is needed to pin the processes")?;
    if !status.success() {
        bail!("taskset -a -p -c {cpus} failed");
    }
    Ok(())
}

// ------------------------------------------------------------------ the bench

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Floor,
    OneLabel,
    Trainwire,
    TrainwireInfo,
    /// `TRAINWIRE_WEBHOOK_BIN_B`: another build, e.g. with another allocator.
    TrainwireB,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor: bare rustls, canned reply",
            Kind::OneLabel => "one-label baseline (kube-rs example shape)",
            Kind::Trainwire => "trainwire, RUST_LOG=warn",
            Kind::TrainwireInfo => "trainwire, RUST_LOG=info",
            Kind::TrainwireB => "trainwire (TRAINWIRE_WEBHOOK_BIN_B), RUST_LOG=warn",
        }
    }
}

struct Row {
    kind: Kind,
    http: Http,
    closed: Phase,
    open: Phase,
    cpu_us_per_request: f64,
    peak_rss_mib: f64,
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The captured review with `n` extra env entries on the trainer.
fn hostile_review(body: &[u8], n: usize) -> anyhow::Result<bytes::Bytes> {
    let mut review: serde_json::Value = serde_json::from_slice(body)?;
    let env: Vec<serde_json::Value> = (0..n)
        .map(
            |i| serde_json::json!({"name": format!("USER_VAR_{i}"), "value": format!("value-{i}")}),
        )
        .collect();
    review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["env"] =
        serde_json::Value::Array(env);
    Ok(bytes::Bytes::from(serde_json::to_vec(&review)?))
}

fn bench() -> anyhow::Result<()> {
    let repo = trainwire_tests::repo_root();
    let bin = std::env::var_os("TRAINWIRE_WEBHOOK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/release/trainwire-webhook"));
    if !bin.is_file() {
        bail!(
            "{} not found: build it first with `cargo build --release -p trainwire-webhook`",
            bin.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let certs = trainwire_webhook::certs::generate("trainwire-webhook", "trainwire-system", 30)?;
    trainwire_webhook::certs::write(&certs, dir.path())?;
    let body = bytes::Bytes::from(std::fs::read(
        trainwire_tests::admission_fixtures_dir().join("statefulset-create.json"),
    )?);
    let cpus_total = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (server_cpus, client_cpus) = if cpus_total >= 3 {
        ("0", "1-2")
    } else {
        ("0", "1")
    };
    println!(
        "machine: {} CPUs ({}), kernel {}; load average before the run: {}",
        cpus_total,
        cpu_model(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "request: statefulset-create.json ({} bytes); server `taskset -c {server_cpus}`, load generator `taskset -c {client_cpus}`; {CONNECTIONS} keep-alive connections, 1 request in flight on each; closed loop {CLOSED_LOOP_REQUESTS} requests, open loop {OPEN_LOOP_REQUESTS} requests at {RATE}/s",
        body.len()
    );
    pin_self(client_cpus)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ticks = clock_ticks_per_second();

    // The canned answer is the real server's answer to the same review.
    let answer_file = dir.path().join("answer.json");
    {
        let server = start_webhook(&bin, server_cpus, dir.path(), "warn")?;
        let url = format!("https://{HOST}:{}/mutate", server.addr.port());
        let answer = runtime.block_on(async {
            let client = client(&certs.ca_cert_pem, server.addr, Http::One)?;
            let response = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await?;
            anyhow::Ok(response.bytes().await?)
        })?;
        std::fs::write(&answer_file, &answer)?;
        println!(
            "answer: {} bytes (the canned reply is the same)",
            answer.len()
        );
    }

    let bin_b = std::env::var_os("TRAINWIRE_WEBHOOK_BIN_B").map(PathBuf::from);
    if let Some(b) = &bin_b {
        println!("TRAINWIRE_WEBHOOK_BIN_B: {}", b.display());
    }
    let mut kinds = vec![
        Kind::Floor,
        Kind::OneLabel,
        Kind::Trainwire,
        Kind::TrainwireInfo,
    ];
    if bin_b.is_some() {
        kinds.push(Kind::TrainwireB);
    }
    let mut rows = Vec::new();
    for kind in kinds.iter().copied() {
        for http in [Http::Two, Http::One] {
            // A fresh server per row: its peak RSS is this row's.
            let server = match kind {
                Kind::Floor => start_bare(server_cpus, dir.path(), Some(&answer_file))?,
                Kind::OneLabel => start_bare(server_cpus, dir.path(), None)?,
                Kind::Trainwire => start_webhook(&bin, server_cpus, dir.path(), "warn")?,
                Kind::TrainwireInfo => start_webhook(&bin, server_cpus, dir.path(), "info")?,
                Kind::TrainwireB => match &bin_b {
                    Some(b) => start_webhook(b, server_cpus, dir.path(), "warn")?,
                    None => continue,
                },
            };
            let url = format!("https://{HOST}:{}/mutate", server.addr.port());
            let (closed, open, cpu) = runtime.block_on(async {
                let clients = (0..CONNECTIONS)
                    .map(|_| client(&certs.ca_cert_pem, server.addr, http))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let warm = closed_loop(&clients, &url, &body, WARMUP).await;
                if warm.errors > 0 {
                    bail!(
                        "{} {}: {} errors in the warm-up",
                        kind.name(),
                        http.name(),
                        warm.errors
                    );
                }
                let cpu_before = server.cpu_ticks();
                let closed = closed_loop(&clients, &url, &body, CLOSED_LOOP_REQUESTS).await;
                let cpu = server.cpu_ticks().saturating_sub(cpu_before);
                let open = open_loop(&clients, &url, &body, OPEN_LOOP_REQUESTS).await;
                anyhow::Ok((closed, open, cpu))
            })?;
            let row = Row {
                kind,
                http,
                cpu_us_per_request: cpu as f64 / ticks * 1e6 / closed.latencies.len().max(1) as f64,
                peak_rss_mib: server.peak_rss_kib() as f64 / 1024.0,
                closed,
                open,
            };
            eprintln!(
                "{} {}: {:.0} req/s",
                kind.name(),
                http.name(),
                row.closed.throughput()
            );
            rows.push(row);
        }
    }

    let find = |kind: Kind, http: Http| rows.iter().find(|r| r.kind == kind && r.http == http);
    println!();
    println!(
        "| server | protocol | req/s at saturation | × one-label | × floor | server CPU µs/req | p50 ms | p99 ms | at {RATE}/s p50 ms | at {RATE}/s p99 ms | p99 × floor's | errors | peak RSS MiB |"
    );
    println!(
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for row in &rows {
        let ratio = |other: Option<&Row>| {
            other.map_or(f64::NAN, |o| {
                row.closed.throughput() / o.closed.throughput()
            })
        };
        let p99_ratio = find(Kind::Floor, row.http).map_or(f64::NAN, |f| {
            row.open.percentile(0.99).as_secs_f64() / f.open.percentile(0.99).as_secs_f64()
        });
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {} | {} | {} | {} | {:.2} | {} | {:.1} |",
            row.kind.name(),
            row.http.name(),
            row.closed.throughput(),
            ratio(find(Kind::OneLabel, row.http)),
            ratio(find(Kind::Floor, row.http)),
            row.cpu_us_per_request,
            ms(row.closed.percentile(0.50)),
            ms(row.closed.percentile(0.99)),
            ms(row.open.percentile(0.50)),
            ms(row.open.percentile(0.99)),
            p99_ratio,
            row.closed.errors + row.open.errors,
            row.peak_rss_mib,
        );
    }

    // Hostile input: one review with 20,000 env entries on the trainer.
    let hostile = hostile_review(&body, HOSTILE_ENV)?;
    println!();
    println!(
        "hostile review: {HOSTILE_ENV} env entries on the trainer ({} bytes), {HOSTILE_REQUESTS} sent one after the other over HTTP/1.1 to a fresh server after a warm-up of {WARMUP} ordinary reviews",
        hostile.len()
    );
    println!();
    println!(
        "| server | p50 ms | max ms | answer bytes | peak RSS before MiB | peak RSS after MiB | extra MiB |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut hostile_kinds = vec![Kind::OneLabel, Kind::Trainwire];
    if bin_b.is_some() {
        hostile_kinds.push(Kind::TrainwireB);
    }
    for kind in hostile_kinds {
        let server = match (kind, &bin_b) {
            (Kind::OneLabel, _) => start_bare(server_cpus, dir.path(), None)?,
            (Kind::TrainwireB, Some(b)) => start_webhook(b, server_cpus, dir.path(), "warn")?,
            _ => start_webhook(&bin, server_cpus, dir.path(), "warn")?,
        };
        let url = format!("https://{HOST}:{}/mutate", server.addr.port());
        let (phase, answer, before) = runtime.block_on(async {
            let clients = (0..CONNECTIONS)
                .map(|_| client(&certs.ca_cert_pem, server.addr, Http::One))
                .collect::<anyhow::Result<Vec<_>>>()?;
            closed_loop(&clients, &url, &body, WARMUP).await;
            let before = server.peak_rss_kib();
            let started = Instant::now();
            let mut phase = Phase {
                latencies: Vec::new(),
                elapsed: Duration::ZERO,
                errors: 0,
            };
            let mut answer = 0;
            for _ in 0..HOSTILE_REQUESTS {
                let t = Instant::now();
                match one(&clients[0], &url, &hostile).await {
                    Ok(n) => {
                        answer = n;
                        phase.latencies.push(t.elapsed());
                    }
                    Err(_) => phase.errors += 1,
                }
            }
            phase.elapsed = started.elapsed();
            phase.latencies.sort();
            anyhow::Ok((phase, answer, before))
        })?;
        if phase.errors > 0 {
            bail!("{}: {} hostile reviews failed", kind.name(), phase.errors);
        }
        let after = server.peak_rss_kib();
        println!(
            "| {} | {} | {} | {answer} | {:.1} | {:.1} | {:.1} |",
            kind.name(),
            ms(phase.percentile(0.5)),
            ms(phase.percentile(1.0)),
            before as f64 / 1024.0,
            after as f64 / 1024.0,
            after.saturating_sub(before) as f64 / 1024.0,
        );
    }
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}
