//! The servers the bench loads: the floor and the one-label baseline,
//! served by this binary as subcommands, and the child processes the bench
//! starts for each row.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustls_pki_types::pem::PemObject;
use trainwire_tests::net::{free_port, wait_listening};

// ---------------------------------------------------------------- bare server

/// `bare-server ADDR CERT KEY RESPONSE`: rustls + hyper-util (the same stack
/// and settings as the webhook), answering every request with RESPONSE.
pub(crate) fn bare_server(args: &[String]) -> anyhow::Result<()> {
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
pub(crate) fn one_label_server(args: &[String]) -> anyhow::Result<()> {
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
pub(crate) fn handlers(args: &[String]) -> anyhow::Result<()> {
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

pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Server {
    /// The server's CPU time so far (user + system), in clock ticks.
    pub(crate) fn cpu_ticks(&self) -> u64 {
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

    pub(crate) fn peak_rss_kib(&self) -> u64 {
        trainwire_test_support::process::status_kib(self.child.id(), "VmHWM").unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_webhook(
    bin: &Path,
    cpus: &str,
    dir: &Path,
    log: &str,
) -> anyhow::Result<Server> {
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

pub(crate) fn start_bare(
    cpus: &str,
    dir: &Path,
    response: Option<&Path>,
) -> anyhow::Result<Server> {
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
