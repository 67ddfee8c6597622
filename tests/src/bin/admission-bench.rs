//! Admission server benchmark (not a test): the real `trainwire-webhook
//! serve` against a bare rustls+hyper server that answers a canned response
//! of the same size, over TLS keep-alive, HTTP/2 and HTTP/1.1, with the
//! StatefulSet CREATE review a real kube-apiserver sent; the server pinned to
//! one core, then to two. Reports p50/p99 latency, throughput and the
//! server's peak RSS (VmHWM).
//!
//! ```text
//! cargo build --release -p trainwire-webhook
//! cargo run --release -p trainwire-tests --bin admission-bench
//! ```
//!
//! Every phase is a fixed number of requests. `TRAINWIRE_WEBHOOK_BIN`
//! overrides the server binary (default `target/release/trainwire-webhook`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use trainwire_tests::net::{free_port, wait_listening};

const HOST: &str = "trainwire-webhook.trainwire-system.svc";
/// Concurrent connections, one request in flight on each.
const CONNECTIONS: usize = 4;
/// Requests of the closed-loop (as fast as possible) phase.
const CLOSED_LOOP_REQUESTS: usize = 20_000;
/// Requests of the open-loop phase, sent at `RATE` per second.
const OPEN_LOOP_REQUESTS: usize = 5_000;
const RATE: u64 = 1_000;
const WARMUP: usize = 1_000;

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("bare-server") {
        return bare_server(&args[2..]);
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
    fn peak_rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0)
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

fn start_webhook(bin: &Path, cpus: &str, dir: &Path) -> anyhow::Result<Server> {
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
            "--reconcile=false",
        ])
        .arg("--tls-cert")
        .arg(dir.join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("tls.key"))
        .env("RUST_LOG", "warn")
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

fn start_bare(cpus: &str, dir: &Path, response: &Path) -> anyhow::Result<Server> {
    let port = free_port();
    let child = Command::new("taskset")
        .args(["-c", cpus])
        .arg(std::env::current_exe()?)
        .arg("bare-server")
        .arg(format!("127.0.0.1:{port}"))
        .arg(dir.join("tls.crt"))
        .arg(dir.join("tls.key"))
        .arg(response)
        .stdout(Stdio::null())
        .spawn()?;
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
    println!(
        "machine: {} CPUs ({}), kernel {}",
        cpus_total,
        cpu_model(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "request: statefulset-create.json ({} bytes); {CONNECTIONS} keep-alive connections, 1 request in flight on each; closed loop {CLOSED_LOOP_REQUESTS} requests, open loop {OPEN_LOOP_REQUESTS} requests at {RATE}/s",
        body.len()
    );
    println!();
    println!(
        "| server pinned to | client on | server | protocol | closed-loop req/s | closed p50 ms | closed p99 ms | at {RATE}/s p50 ms | at {RATE}/s p99 ms | at {RATE}/s max ms | errors | server peak RSS MiB |"
    );
    println!("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut response_file: Option<PathBuf> = None;
    let configs: Vec<(&str, &str, &str)> = if cpus_total >= 3 {
        vec![("1 core", "0", "1-2"), ("2 cores", "0-1", "2")]
    } else {
        vec![("1 core", "0", "1"), ("2 cores", "0-1", "0-1")]
    };
    for (label, server_cpus, client_cpus) in configs {
        pin_self(client_cpus)?;
        for kind in ["trainwire", "bare rustls"] {
            let server = match kind {
                "trainwire" => start_webhook(&bin, server_cpus, dir.path())?,
                _ => {
                    let Some(file) = &response_file else {
                        bail!("the real answer was not recorded");
                    };
                    start_bare(server_cpus, dir.path(), file)?
                }
            };
            let url = format!("https://{HOST}:{}/mutate", server.addr.port());
            if response_file.is_none() {
                // The canned answer is the real server's answer to the same review.
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
                let file = dir.path().join("answer.json");
                std::fs::write(&file, &answer)?;
                println!("<!-- answer: {} bytes -->", answer.len());
                response_file = Some(file);
            }
            for http in [Http::Two, Http::One] {
                let (closed, open) = runtime.block_on(async {
                    let clients = (0..CONNECTIONS)
                        .map(|_| client(&certs.ca_cert_pem, server.addr, http))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    let warm = closed_loop(&clients, &url, &body, WARMUP).await;
                    if warm.errors > 0 {
                        bail!(
                            "{kind} {}: {} errors in the warm-up",
                            http.name(),
                            warm.errors
                        );
                    }
                    let closed = closed_loop(&clients, &url, &body, CLOSED_LOOP_REQUESTS).await;
                    let open = open_loop(&clients, &url, &body, OPEN_LOOP_REQUESTS).await;
                    anyhow::Ok((closed, open))
                })?;
                println!(
                    "| {label} (`taskset -c {server_cpus}`) | `{client_cpus}` | {kind} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {:.1} |",
                    http.name(),
                    closed.throughput(),
                    ms(closed.percentile(0.50)),
                    ms(closed.percentile(0.99)),
                    ms(open.percentile(0.50)),
                    ms(open.percentile(0.99)),
                    ms(open.percentile(1.0)),
                    closed.errors + open.errors,
                    server.peak_rss_kib() as f64 / 1024.0,
                );
            }
        }
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
