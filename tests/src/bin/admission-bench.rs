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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use trainwire_tests::net::{free_port, wait_listening};

/// The allocator `trainwire-webhook` runs with (`webhook/src/main.rs`), so
/// that the floor and the one-label baseline, served by this binary, run on
/// the same stack as trainwire: with the system allocator the baseline's
/// handler costs 14.1 µs instead of 10.2, which flattered trainwire's ratio.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HOST: &str = "trainwire-webhook.trainwire-system.svc";
/// Concurrent connections, one request in flight on each.
const CONNECTIONS: usize = 16;
/// Env entries of the hostile review.
const HOSTILE_ENV: usize = 20_000;
/// Hostile reviews sent, one after the other.
const HOSTILE_REQUESTS: usize = 20;
/// Requests of the closed-loop (as fast as possible) phase.
const CLOSED_LOOP_REQUESTS: usize = 20_000;
/// Requests of the open-loop phase, sent at `RATE` per second.
const OPEN_LOOP_REQUESTS: usize = 5_000;
const RATE: u64 = 1_000;
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

// ---------------------------------------------------------------- bare server

/// `bare-server ADDR CERT KEY RESPONSE`: rustls + hyper-util (the same stack
/// and settings as the webhook), answering every request with RESPONSE.
fn bare_server(args: &[String]) -> anyhow::Result<()> {
    let [addr, cert, key, response] = args else {
        bail!("usage: admission-bench bare-server ADDR CERT KEY RESPONSE_FILE");
    };
    let addr: SocketAddr = addr.parse()?;
    let response = bytes::Bytes::from(std::fs::read(response)?);
    let config = server_config(cert, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        loop {
            let (tcp, _) = listener.accept().await?;
            let _ = tcp.set_nodelay(true);
            let (acceptor, builder, response) =
                (acceptor.clone(), builder.clone(), response.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let response = response.clone();
                        async move {
                            use http_body_util::BodyExt;
                            let _ = request.into_body().collect().await;
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(http_body_util::Full::new(response))
                        }
                    },
                );
                let _ = builder
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    })
}

use rustls_pki_types::pem::PemObject;

// ------------------------------------------------------ the one-label baseline

/// The one-label baseline's handler: the shape of kube-rs's
/// `examples/admission_controller.rs` (the request out of the review, one
/// label added with a JSON patch, the response in a review).
fn one_label(
    review: kube::core::admission::AdmissionReview<kube::core::DynamicObject>,
) -> kube::core::admission::AdmissionReview<kube::core::DynamicObject> {
    use json_patch::jsonptr::PointerBuf;
    use json_patch::{AddOperation, Patch, PatchOperation};
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse};

    fn add_label(res: AdmissionResponse, obj: &DynamicObject) -> anyhow::Result<AdmissionResponse> {
        let mut patches = Vec::new();
        if obj.metadata.labels.is_none() {
            patches.push(PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "labels"]),
                value: serde_json::json!({}),
            }));
        }
        patches.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "labels", "admission"]),
            value: serde_json::Value::String("modified-by-admission-controller".into()),
        }));
        Ok(res.with_patch(Patch(patches))?)
    }

    let req: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(req) => req,
        Err(err) => return AdmissionResponse::invalid(err.to_string()).into_review(),
    };
    let mut res = AdmissionResponse::from(&req);
    if let Some(obj) = req.object {
        res = match add_label(res.clone(), &obj) {
            Ok(res) => res,
            Err(err) => res.deny(err.to_string()),
        };
    }
    res.into_review()
}

/// `one-label-server ADDR CERT KEY`: [`one_label`] behind axum's `Json`,
/// served by trainwire's own TLS code (`serve_tls`).
fn one_label_server(args: &[String]) -> anyhow::Result<()> {
    use axum::Json;
    use kube::core::DynamicObject;
    use kube::core::admission::AdmissionReview;

    async fn mutate(
        Json(body): Json<AdmissionReview<DynamicObject>>,
    ) -> Json<AdmissionReview<DynamicObject>> {
        Json(one_label(body))
    }

    let [addr, cert, key] = args else {
        bail!("usage: admission-bench one-label-server ADDR CERT KEY");
    };
    let addr: SocketAddr = addr.parse()?;
    let config = server_config(cert, key)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let router = axum::Router::new().route("/mutate", axum::routing::post(mutate));
        let server = trainwire_webhook::serve::serve_tls(
            listener,
            config,
            router,
            std::future::pending::<()>(),
        )?;
        server.join().await;
        anyhow::Ok(())
    })
}

/// `handlers [N [REVIEW]]`: the two handlers alone, without a server, in
/// one loop on this thread: trainwire's `Admitter::admit` and [`one_label`]
/// read from the body's bytes and written to the answer's, N times each
/// (default 20,000; rounded up to whole rounds), alternating in rounds of
/// 1,000, so that the difference
/// at the server can be told apart from the handlers' own. Pin it with
/// `taskset -c 0`. REVIEW defaults to the captured `statefulset-create.json`.
fn handlers(args: &[String]) -> anyhow::Result<()> {
    use kube::core::DynamicObject;
    use kube::core::admission::AdmissionReview;
    use trainwire_webhook::admission::{Admitter, Answer};

    let n: usize = match args.first() {
        Some(a) => a
            .parse()
            .with_context(|| format!("N is a number of reviews, got {a:?}"))?,
        None => 20_000,
    };
    let path = args.get(1).cloned().unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/admission/statefulset-create.json"
        )
        .to_string()
    });
    let body = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
    let admitter = Admitter {
        policy: trainwire_policyfile::SharedPolicy::new(Default::default()),
        statefulsets: Arc::new(trainwire_webhook::scale::StatefulSetCache::unavailable(
            "no API".to_string(),
        )),
        metrics: Arc::new(trainwire_webhook::metrics::Metrics::new()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let trainwire = |body: &[u8]| -> anyhow::Result<usize> {
        match runtime.block_on(admitter.admit(body)) {
            Answer::Review(answer) => Ok(answer.len()),
            Answer::BadRequest(reason) => bail!("trainwire answered 400: {reason}"),
        }
    };
    let baseline = |body: &[u8]| -> anyhow::Result<usize> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
        Ok(serde_json::to_vec(&one_label(review))?.len())
    };
    const ROUND: usize = 1_000;
    let (mut spent, mut bytes) = ([Duration::ZERO; 2], [0usize; 2]);
    for _ in 0..n.div_ceil(ROUND) {
        for (i, handler) in [
            &trainwire as &dyn Fn(&[u8]) -> anyhow::Result<usize>,
            &baseline,
        ]
        .into_iter()
        .enumerate()
        {
            let started = Instant::now();
            for _ in 0..ROUND {
                bytes[i] = handler(&body)?;
            }
            spent[i] += started.elapsed();
        }
    }
    let rounds = n.div_ceil(ROUND) * ROUND;
    println!(
        "review: {path} ({} bytes); {rounds} of each, alternating",
        body.len()
    );
    for (i, name) in ["trainwire", "one-label baseline"].into_iter().enumerate() {
        println!(
            "{name}: {:.1} µs per review (wall), {} bytes answered",
            spent[i].as_secs_f64() * 1e6 / rounds as f64,
            bytes[i]
        );
    }
    Ok(())
}

fn server_config(cert: &str, key: &str) -> anyhow::Result<rustls::ServerConfig> {
    let chain =
        rustls_pki_types::CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key)?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

// ------------------------------------------------------------------ the bench

#[derive(Clone, Copy, Debug, PartialEq)]
enum Http {
    Two,
    One,
}

impl Http {
    fn name(self) -> &'static str {
        match self {
            Http::Two => "HTTP/2",
            Http::One => "HTTP/1.1",
        }
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    /// The server's CPU time so far (user + system), in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|s| {
                // After the command name in parentheses: field 3 is `state`;
                // utime and stime are fields 14 and 15.
                let rest = s.rsplit_once(')')?.1;
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let utime: u64 = fields.get(11)?.parse().ok()?;
                let stime: u64 = fields.get(12)?.parse().ok()?;
                Some(utime + stime)
            })
            .unwrap_or(0)
    }

    fn peak_rss_kib(&self) -> u64 {
        trainwire_test_support::process::status_kib(self.child.id(), "VmHWM").unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

fn start_webhook(bin: &Path, cpus: &str, dir: &Path, log: &str) -> anyhow::Result<Server> {
    let port = free_port();
    let probe = free_port();
    let child = Command::new("taskset")
        .args(["-c", cpus])
        .arg(bin)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--probe-listen",
            &format!("127.0.0.1:{probe}"),
        ])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .env("RUST_LOG", log)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    if !wait_listening(port, Duration::from_secs(5)) {
        bail!("server on port {port} did not start");
    }
    Ok(Server {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

fn start_bare(cpus: &str, dir: &Path, response: Option<&Path>) -> anyhow::Result<Server> {
    let port = free_port();
    let mut command = Command::new("taskset");
    command
        .args(["-c", cpus])
        .arg(std::env::current_exe()?)
        .arg(if response.is_some() {
            "bare-server"
        } else {
            "one-label-server"
        })
        .arg(format!("127.0.0.1:{port}"))
        .arg(dir.join("tls.crt"))
        .arg(dir.join("tls.key"));
    if let Some(response) = response {
        command.arg(response);
    }
    let child = command.stdout(Stdio::null()).spawn()?;
    if !wait_listening(port, Duration::from_secs(5)) {
        bail!("server on port {port} did not start");
    }
    Ok(Server {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    })
}

fn client(ca_pem: &str, addr: SocketAddr, http: Http) -> anyhow::Result<reqwest::Client> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_slice(
        ca_pem.as_bytes(),
    )?)?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = match http {
        Http::Two => vec![b"h2".to_vec()],
        Http::One => vec![b"http/1.1".to_vec()],
    };
    let builder = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(HOST, addr)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(10));
    let builder = match http {
        Http::Two => builder.http2_prior_knowledge(),
        Http::One => builder.http1_only(),
    };
    Ok(builder.build()?)
}

async fn one(client: &reqwest::Client, url: &str, body: &bytes::Bytes) -> anyhow::Result<usize> {
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("HTTP {}", response.status());
    }
    Ok(response.bytes().await?.len())
}

struct Phase {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: usize,
}

impl Phase {
    fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// `requests` requests over `CONNECTIONS` connections, each as soon as the
/// previous one on its connection is answered.
async fn closed_loop(
    clients: &[reqwest::Client],
    url: &str,
    body: &bytes::Bytes,
    requests: usize,
) -> Phase {
    let started = Instant::now();
    let per = requests / clients.len();
    let mut tasks = Vec::new();
    for client in clients {
        let (client, url, body) = (client.clone(), url.to_string(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per);
            let mut errors = 0;
            for _ in 0..per {
                let t = Instant::now();
                match one(&client, &url, &body).await {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut phase = Phase {
        latencies: Vec::with_capacity(requests),
        elapsed: Duration::ZERO,
        errors: 0,
    };
    for task in tasks {
        if let Ok((l, e)) = task.await {
            phase.latencies.extend(l);
            phase.errors += e;
        }
    }
    phase.elapsed = started.elapsed();
    phase.latencies.sort();
    phase
}

/// `requests` requests at `RATE`/s, each on the next connection in turn;
/// latency counted from when the request was due (no coordinated omission).
async fn open_loop(
    clients: &[reqwest::Client],
    url: &str,
    body: &bytes::Bytes,
    requests: usize,
) -> Phase {
    let started = tokio::time::Instant::now() + Duration::from_millis(10);
    let mut tasks = Vec::with_capacity(requests);
    for i in 0..requests {
        let due = started + Duration::from_micros(i as u64 * 1_000_000 / RATE);
        let (client, url, body) = (
            clients[i % clients.len()].clone(),
            url.to_string(),
            body.clone(),
        );
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let result = one(&client, &url, &body).await;
            result.map(|_| due.elapsed())
        }));
    }
    let mut phase = Phase {
        latencies: Vec::with_capacity(requests),
        elapsed: Duration::ZERO,
        errors: 0,
    };
    for task in tasks {
        match task.await {
            Ok(Ok(l)) => phase.latencies.push(l),
            _ => phase.errors += 1,
        }
    }
    phase.elapsed = started.elapsed();
    phase.latencies.sort();
    phase
}

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
