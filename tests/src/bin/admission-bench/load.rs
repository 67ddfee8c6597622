//! The load generator: TLS clients over HTTP/2 or HTTP/1.1, and the closed
//! and open loops that time their requests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use rustls_pki_types::pem::PemObject;

pub(crate) const HOST: &str = "trainwire-webhook.trainwire-system.svc";
/// Concurrent connections, one request in flight on each.
pub(crate) const CONNECTIONS: usize = 16;
/// Requests per second of the open-loop phase.
pub(crate) const RATE: u64 = 1_000;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Http {
    Two,
    One,
}

impl Http {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Http::Two => "HTTP/2",
            Http::One => "HTTP/1.1",
        }
    }
}

pub(crate) fn client(
    ca_pem: &str,
    addr: SocketAddr,
    http: Http,
) -> anyhow::Result<reqwest::Client> {
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

pub(crate) async fn one(
    client: &reqwest::Client,
    url: &str,
    body: &bytes::Bytes,
) -> anyhow::Result<usize> {
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

pub(crate) struct Phase {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) elapsed: Duration,
    pub(crate) errors: usize,
}

impl Phase {
    pub(crate) fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    pub(crate) fn throughput(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// `requests` requests over `CONNECTIONS` connections, each as soon as the
/// previous one on its connection is answered.
pub(crate) async fn closed_loop(
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
pub(crate) async fn open_loop(
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
