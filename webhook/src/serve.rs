//! `trainwire-webhook serve`: the admission server over TLS. It holds no
//! write right: its only API calls are the scale guard's StatefulSet watch
//! ([`crate::scale::API_PERMISSIONS`]). The controllers run apart
//! (`trainwire-controllers`).
//!
//! - `--listen` (HTTPS, HTTP/1.1 and HTTP/2): `POST /mutate`, plus
//!   `/healthz` and `/readyz`.
//! - `--probe-listen` (plain HTTP): `/healthz`, `/readyz`, `/metrics`.
//!
//! See `docs/serving.md` for the flags, the endpoints and the metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tower::Service as _;

use crate::admission::{Admitter, Answer};
use crate::metrics::{Metrics, Rejection, RejectionLabels};
use crate::scale::{StatefulSetCache, StatefulSetSource};
use crate::tls::CertStore;
use trainwire_policyfile::{PolicyArgs, SharedPolicy};
use trainwire_runtime::telemetry::TelemetryArgs;

/// Largest AdmissionReview body accepted (the apiserver's own request limit
/// is 3 MiB of object, so a real review stays under it).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// How long in-flight requests get to finish after SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(25);

/// How long a client gets to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the HTTPS admission endpoint.
    #[arg(
        long,
        env = "TRAINWIRE_LISTEN",
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:8443"
    )]
    pub listen: SocketAddr,
    /// PEM certificate chain (leaf first), e.g. a mounted cert-manager Secret's tls.crt.
    /// Reloaded when it changes.
    #[arg(long, env = "TRAINWIRE_TLS_CERT", value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// PEM private key of the certificate (PKCS#8, SEC1 or PKCS#1), e.g. tls.key.
    /// Reloaded when it changes.
    #[arg(long, env = "TRAINWIRE_TLS_KEY", value_name = "FILE")]
    pub tls_key: PathBuf,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// After SIGTERM, how long to keep answering with /readyz failing, so the
    /// Service's endpoints drop this pod before its listener closes (with
    /// `failurePolicy: Fail`, an apiserver call to a closed listener would
    /// refuse a user's apply). A Go duration (`5s`, `0s` to close at once).
    #[arg(
        long,
        env = "TRAINWIRE_SHUTDOWN_DRAIN",
        value_name = "DURATION",
        default_value = "5s"
    )]
    pub shutdown_drain: trainwire_contract::Duration,
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// Readiness: the TLS listener is bound, a certificate is loaded, and the
/// server is not shutting down.
#[derive(Debug, Default)]
pub struct Readiness {
    bound: AtomicBool,
    stopping: AtomicBool,
}

impl Readiness {
    pub fn set_bound(&self) {
        self.bound.store(true, Ordering::SeqCst);
    }
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// Everything the HTTP handlers share.
#[derive(Clone)]
pub struct AppState {
    pub admitter: Admitter,
    pub metrics: Arc<Metrics>,
    pub certs: Arc<CertStore>,
    pub readiness: Arc<Readiness>,
}

impl AppState {
    fn ready(&self) -> Result<(), &'static str> {
        if self.readiness.stopping.load(Ordering::SeqCst) {
            return Err("shutting down");
        }
        if !self.readiness.bound.load(Ordering::SeqCst) {
            return Err("the TLS listener is not bound yet");
        }
        if !self.certs.is_loaded() {
            return Err("no serving certificate loaded (see the log for why)");
        }
        Ok(())
    }
}

/// The HTTPS router: `/mutate`, `/healthz`, `/readyz`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The plain-HTTP probe router: `/healthz`, `/readyz`, `/metrics`.
pub fn probe_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.ready() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    metrics_response(&state.metrics, &headers)
}

/// `/metrics`: OpenMetrics, or the classic Prometheus text format to a
/// client that asks only for `text/plain` (both programs' probe endpoints).
pub fn metrics_response(metrics: &Metrics, headers: &HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = trainwire_runtime::exposition::negotiate(accept, metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn reject(state: &AppState, status: StatusCode, reason: Rejection, message: String) -> Response {
    state
        .metrics
        .rejected_requests
        .get_or_create(&RejectionLabels { reason })
        .inc();
    tracing::warn!(status = status.as_u16(), reason = %message, "rejected a /mutate request");
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

async fn mutate(State(state): State<AppState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if !is_json(&parts.headers) {
        let got = parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_else(|| "no Content-Type".to_string());
        return reject(
            &state,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Rejection::unsupported_media_type,
            format!(
                "Content-Type is {got:?}; expected application/json (an {} AdmissionReview)",
                crate::admission::API_VERSION
            ),
        );
    }
    let too_large = || {
        reject(
            &state,
            StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::too_large,
            format!("the body is larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(bytes) => bytes,
        Err(e) => {
            // `to_bytes` reports the limit as a length-limit error somewhere
            // in the source chain; anything else is a broken connection.
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if err.is::<http_body_util::LengthLimitError>() {
                    return too_large();
                }
                source = err.source();
            }
            return reject(
                &state,
                StatusCode::BAD_REQUEST,
                Rejection::bad_request,
                format!("cannot read the body: {e}"),
            );
        }
    };
    match state.admitter.admit(&bytes).await {
        Answer::Review(json) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            Body::from(json),
        )
            .into_response(),
        Answer::BadRequest(reason) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            reason + "\n",
        )
            .into_response(),
    }
}

/// A bound, running HTTPS server.
pub struct TlsServer {
    pub local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    /// Wait for the server to finish (after the shutdown future completed
    /// and the in-flight requests were answered, or the grace ran out).
    pub async fn join(self) {
        let _ = self.task.await;
    }
}

/// Serve `router` over TLS on `listener` until `shutdown` completes, then
/// stop accepting and let open connections finish their requests (up to
/// [`SHUTDOWN_GRACE`]).
pub fn serve_tls(
    listener: TcpListener,
    config: rustls::ServerConfig,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<TlsServer> {
    let local_addr = listener.local_addr()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let task = tokio::spawn(async move {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30))
            .keep_alive(true);
        builder.http2().timer(TokioTimer::new());
        tokio::pin!(shutdown);
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            // Without it small answers wait for the peer's delayed ACK (~40 ms).
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let router = router.clone();
            let builder = builder.clone();
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        router.clone().call(request)
                    },
                );
                let connection = builder.serve_connection(TokioIo::new(tls), service);
                if let Err(e) = watcher.watch(connection).await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        tokio::select! {
            _ = graceful.shutdown() => tracing::info!("all connections closed"),
            _ = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::warn!("shutdown grace of {}s over; dropping the remaining connections", SHUTDOWN_GRACE.as_secs()),
        }
    });
    Ok(TlsServer { local_addr, task })
}

/// Build the Kubernetes client of the scale guard's cache.
async fn kube_client() -> Result<kube::Client, String> {
    kube::Client::try_default().await.map_err(|e| e.to_string())
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    trainwire_runtime::telemetry::init(args.telemetry.log_format);
    let metrics = Arc::new(Metrics::new());
    let loaded = trainwire_policyfile::load_at_start(&args.policy)?;
    let policy = SharedPolicy::new(loaded);

    let certs = Arc::new(CertStore::new(
        args.tls_cert.clone(),
        args.tls_key.clone(),
        metrics.clone(),
    ));
    certs.reload();
    let cert_watch = tokio::spawn(crate::tls::watch(certs.clone()));

    let policy_watch =
        trainwire_policyfile::keep_in_force(&args.policy, &policy, metrics.policy_reloads.clone());
    let mut background = vec![cert_watch, policy_watch];
    // The scale guard's watch cache of StatefulSets (list/watch only: the
    // admission server writes nothing; the controllers run apart, as
    // `trainwire-controllers`).
    let statefulsets: Arc<dyn StatefulSetSource> = match kube_client().await {
        Ok(client) => {
            let (cache, writer) = StatefulSetCache::new();
            background.push(tokio::spawn(cache.clone().run(client, writer)));
            Arc::new(cache)
        }
        Err(why) => {
            tracing::warn!(
                error = %why,
                "no Kubernetes API client: the scale guard allows every scale with a warning"
            );
            Arc::new(StatefulSetCache::unavailable(why))
        }
    };

    let readiness = Arc::new(Readiness::default());
    let state = AppState {
        admitter: Admitter {
            policy,
            statefulsets,
            metrics: metrics.clone(),
        },
        metrics,
        certs: certs.clone(),
        readiness: readiness.clone(),
    };

    let probe_listener = args.telemetry.bind_probes().await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", args.listen))?;
    let config = crate::tls::server_config(certs).context("cannot build the TLS configuration")?;

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let server = serve_tls(
        listener,
        config,
        router(state.clone()),
        stopped(stop_rx.clone()),
    )?;
    readiness.set_bound();
    let probe_addr = probe_listener.local_addr()?;
    tracing::info!(listen = %server.local_addr, probe_listen = %probe_addr, "serving admission reviews");

    let probe = tokio::spawn({
        let router = probe_router(state);
        let stop = stopped(stop_rx);
        async move {
            if let Err(e) = axum::serve(probe_listener, router)
                .with_graceful_shutdown(stop)
                .await
            {
                tracing::error!(error = %e, "the probe server stopped");
            }
        }
    });

    let signal = crate::shutdown::signal().await;
    // Readiness fails first; the listener keeps answering for the drain
    // period while the endpoints controller removes this pod, then closes
    // and the requests in flight finish (SHUTDOWN_GRACE).
    readiness.set_stopping();
    let drain: Duration = args.shutdown_drain.into();
    tracing::info!(
        signal,
        drain_seconds = drain.as_secs_f64(),
        "shutting down: not ready any more, still answering for the drain period"
    );
    tokio::time::sleep(drain).await;
    tracing::info!("drain over: closing the listener, finishing in-flight requests");
    let _ = stop_tx.send(true);
    server.join().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), probe).await;
    for task in background {
        task.abort();
    }
    tracing::info!("stopped");
    Ok(())
}
