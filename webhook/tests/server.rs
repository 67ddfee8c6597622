//! The real `trainwire-webhook serve` binary over real loopback TLS, with a
//! real HTTP client on HTTP/1.1 and HTTP/2: captured reviews, certificate
//! rotation the way the kubelet does it, graceful shutdown, `certs`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use trainwire_webhook::certs::{Generated, generate};

const SERVICE: &str = "trainwire-webhook";
const NAMESPACE: &str = "trainwire-system";
const HOST: &str = "trainwire-webhook.trainwire-system.svc";

/// A Secret volume laid out as the kubelet does: `..<timestamp>/` holding
/// the files, `..data` → that directory, and `tls.crt` → `..data/tls.crt`.
struct SecretVolume {
    dir: PathBuf,
    generation: usize,
}

impl SecretVolume {
    fn new(dir: &Path, cert_pem: &str, key_pem: &str) -> Self {
        Self::with_files(dir, &[("tls.crt", cert_pem), ("tls.key", key_pem)])
    }

    fn with_files(dir: &Path, files: &[(&str, &str)]) -> Self {
        let mut volume = SecretVolume {
            dir: dir.to_path_buf(),
            generation: 0,
        };
        volume.swap_files(files);
        for (file, _) in files {
            std::os::unix::fs::symlink(format!("..data/{file}"), dir.join(file)).expect("symlink");
        }
        volume
    }

    fn swap(&mut self, cert_pem: &str, key_pem: &str) {
        self.swap_files(&[("tls.crt", cert_pem), ("tls.key", key_pem)]);
    }

    /// The kubelet's atomic update: write a new timestamped directory, point
    /// `..data_tmp` at it, rename `..data_tmp` over `..data`, remove the old.
    fn swap_files(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let name = format!(
            "..2026_11_21_18_00_{:02}.{}",
            self.generation,
            std::process::id()
        );
        let new = self.dir.join(&name);
        std::fs::create_dir(&new).expect("mkdir");
        for (file, contents) in files {
            std::fs::write(new.join(file), contents).expect("write");
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).expect("symlink ..data_tmp");
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        std::fs::rename(&tmp, self.dir.join("..data")).expect("rename over ..data");
        if let Some(old) = old {
            let _ = std::fs::remove_dir_all(self.dir.join(old));
        }
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }
    fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
}

/// The running binary.
struct Server {
    child: Child,
    addr: SocketAddr,
    probe: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

/// `trainwire-webhook serve` on loopback ports the OS picks, without a
/// cluster (no reconciler, no kubeconfig), logging at `info`.
fn serve_command(cert: &Path, key: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--probe-listen",
        "127.0.0.1:0",
    ])
    .arg("--tls-cert")
    .arg(cert)
    .arg("--tls-key")
    .arg(key)
    .env("RUST_LOG", "info")
    .env("KUBECONFIG", "/nonexistent/kubeconfig")
    .env_remove("KUBERNETES_SERVICE_HOST")
    .env_remove("KUBERNETES_SERVICE_PORT");
    cmd
}

impl Server {
    fn start(cert: &Path, key: &Path, extra: &[&str]) -> Server {
        let mut child = serve_command(cert, key)
            .args(["--log-format", "json"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start trainwire-webhook");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<Value>(&line)
                    && event["message"] == "serving admission reviews"
                {
                    let _ = tx.send((
                        event["listen"].as_str().unwrap_or_default().to_string(),
                        event["probe_listen"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    ));
                }
                sink.lock().expect("lock").push(line);
            }
        });
        let (addr, probe) = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addrs) => addrs,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "server did not start; log:\n{}",
                    log.lock().expect("lock").join("\n")
                );
            }
        };
        Server {
            child,
            addr: addr.parse().expect("listen addr"),
            probe: probe.parse().expect("probe addr"),
            log,
        }
    }

    fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("lock").clone()
    }

    async fn probe_get(&self, path: &str) -> (u16, String) {
        let response = reqwest::Client::builder()
            .use_preconfigured_tls(client_tls(&[], &[b"http/1.1"]))
            .build()
            .expect("client")
            .get(format!("http://{}{path}", self.probe))
            .send()
            .await
            .expect("probe request");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!("server did not exit after SIGTERM");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ca_roots(cas: &[&Generated]) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        let der = CertificateDer::from_pem_slice(ca.ca_cert_pem.as_bytes()).expect("ca pem");
        roots.add(der).expect("add root");
    }
    roots
}

fn client_tls(cas: &[&Generated], alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_root_certificates(ca_roots(cas))
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Http {
    One,
    Two,
}

/// A reqwest client that trusts `cas`, reaches `HOST` at `addr`, and speaks
/// exactly `http`.
fn client(cas: &[&Generated], addr: SocketAddr, http: Http, pooled: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .resolve(HOST, addr)
        .timeout(Duration::from_secs(10));
    let builder = match http {
        Http::One => builder
            .use_preconfigured_tls(client_tls(cas, &[b"http/1.1"]))
            .http1_only(),
        Http::Two => builder
            .use_preconfigured_tls(client_tls(cas, &[b"h2"]))
            .http2_prior_knowledge(),
    };
    let builder = if pooled {
        builder
    } else {
        builder.pool_max_idle_per_host(0)
    };
    builder.build().expect("client")
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://{HOST}:{}{path}", addr.port())
}

async fn post_review(
    client: &reqwest::Client,
    addr: SocketAddr,
    body: Vec<u8>,
) -> Result<(reqwest::Version, Value), String> {
    let response = client
        .post(url(addr, "/mutate"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let version = response.version();
    if response.status() != reqwest::StatusCode::OK {
        return Err(format!("HTTP {}", response.status()));
    }
    let json = response.json::<Value>().await.map_err(|e| e.to_string())?;
    Ok((version, json))
}

fn pair() -> Generated {
    generate(SERVICE, NAMESPACE, 30).expect("generate certs")
}

#[tokio::test]
async fn captured_reviews_over_tls_on_http1_and_http2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = pair();
    let volume = SecretVolume::new(dir.path(), &certs.tls_cert_pem, &certs.tls_key_pem);
    let server = Server::start(&volume.cert(), &volume.key(), &[]);
    assert_eq!(server.probe_get("/readyz").await.0, 200);

    for (http, version) in [
        (Http::One, reqwest::Version::HTTP_11),
        (Http::Two, reqwest::Version::HTTP_2),
    ] {
        let client = client(&[&certs], server.addr, http, true);
        let mut patched_answers = 0;
        for name in common::fixture_names() {
            let fixture = common::fixture(&name);
            let (got_version, review) =
                post_review(&client, server.addr, common::fixture_bytes(&name))
                    .await
                    .unwrap_or_else(|e| panic!("{http:?} {name}: {e}"));
            assert_eq!(got_version, version, "{name}");
            assert_eq!(
                review["response"]["uid"], fixture["request"]["uid"],
                "{name}"
            );
            let response = &review["response"];
            if response["allowed"] == true && response.get("patch").is_some() {
                let patched = common::apply_response_patch(response, &fixture["request"]["object"]);
                // A StatefulSet created at replicas 0 is paused: no world size.
                let paused = fixture["request"]["object"]["spec"]["replicas"] == 0;
                assert_eq!(
                    common::env_value(common::trainer(&patched), "PET_NNODES").is_some(),
                    !paused,
                    "{name}"
                );
                patched_answers += 1;
            }
        }
        // The annotated StatefulSet CREATE/UPDATEs and Job CREATEs (the
        // NonIndexed ones made Indexed).
        assert_eq!(patched_answers, 11, "{http:?}");
        // Bad input over the wire: a 400, not a dropped connection.
        let response = client
            .post(url(server.addr, "/mutate"))
            .header("content-type", "application/json")
            .body(&b"{\"apiVersion\":"[..])
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 400);
        let response = client
            .get(url(server.addr, "/healthz"))
            .send()
            .await
            .expect("healthz");
        assert_eq!(response.status(), 200);
    }

    // A client that does not trust the CA gets no answer.
    let stranger = pair();
    assert!(
        post_review(
            &client(&[&stranger], server.addr, Http::One, false),
            server.addr,
            common::fixture_bytes("statefulset-create.json")
        )
        .await
        .is_err()
    );

    let (status, metrics) = server.probe_get("/metrics").await;
    assert_eq!(status, 200);
    let fixtures = common::fixture_names().len();
    let pods = common::fixture_names()
        .iter()
        .filter(|n| n.starts_with("pod-"))
        .count();
    assert!(
        metrics.contains(&format!(
            "trainwire_webhook_admissions_total{{kind=\"Pod\",operation=\"CREATE\",outcome=\"allowed\"}} {}",
            2 * (pods - 1)
        )),
        "{metrics}"
    );
    assert!(fixtures > pods);
    assert!(
        metrics.contains("trainwire_webhook_certificate_reloads_total{result=\"success\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("trainwire_webhook_certificate_expiry_timestamp_seconds 0\n"),
        "{metrics}"
    );

    // One JSON log line per admission, with the fields operators filter on.
    let lines = server.log_lines();
    let admission = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["message"] == "admission" && e["name"] == "llama-ft-0")
        .expect("an admission log line for pod llama-ft-0");
    for field in [
        "kind",
        "namespace",
        "name",
        "operation",
        "uid",
        "outcome",
        "duration_us",
        "level",
        "timestamp",
    ] {
        assert!(
            admission.get(field).is_some(),
            "{field} missing from {admission}"
        );
    }
    assert_eq!(admission["kind"], "Pod");
    assert_eq!(admission["namespace"], "trainwire-test");
}

/// Keep sending reviews until told to stop (at most `limit`), on new
/// connections when not pooled; count failures.
fn spawn_load(
    client: reqwest::Client,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    limit: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let body = common::fixture_bytes("statefulset-create.json");
        for _ in 0..limit {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            match post_review(&client, addr, body.clone()).await {
                Ok((_, review)) if review["response"]["uid"].is_string() => {}
                Ok((_, review)) => failures.lock().expect("lock").push(review.to_string()),
                Err(e) => failures.lock().expect("lock").push(e),
            }
            sent.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// Poll `check` every 50 ms, at most `tries` times.
async fn eventually<F, Fut>(tries: usize, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..tries {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}");
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn kubelet_style_certificate_rotation_drops_no_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = pair();
    let new = pair();
    let mut volume = SecretVolume::new(dir.path(), &old.tls_cert_pem, &old.tls_key_pem);
    let server = Server::start(&volume.cert(), &volume.key(), &[]);
    let addr = server.addr;

    // Clients that trust both CAs keep sending while the Secret changes:
    // keep-alive ones (HTTP/1.1 and HTTP/2) and ones that reconnect each time.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let mut load = Vec::new();
    for (http, pooled) in [
        (Http::One, true),
        (Http::Two, true),
        (Http::One, false),
        (Http::Two, false),
    ] {
        load.push(spawn_load(
            client(&[&old, &new], addr, http, pooled),
            addr,
            stop.clone(),
            sent.clone(),
            failures.clone(),
            20_000,
        ));
    }
    let before = sent.load(Ordering::SeqCst);
    eventually(200, "load started", || {
        let sent = sent.clone();
        async move { sent.load(Ordering::SeqCst) > before + 20 }
    })
    .await;

    // Only the new CA: refused until the swap, then accepted.
    let only_new = client(&[&new], addr, Http::One, false);
    let body = common::fixture_bytes("statefulset-create.json");
    assert!(post_review(&only_new, addr, body.clone()).await.is_err());
    volume.swap(&new.tls_cert_pem, &new.tls_key_pem);
    eventually(200, "new connections see the new certificate", || {
        let (client, body) = (only_new.clone(), body.clone());
        async move { post_review(&client, addr, body).await.is_ok() }
    })
    .await;
    let only_old = client(&[&old], addr, Http::One, false);
    assert!(
        post_review(&only_old, addr, body.clone()).await.is_err(),
        "old certificate still served"
    );

    // A broken pair (the new certificate with a foreign key, then garbage):
    // the current certificate stays in service and the failure is counted.
    let (_, metrics) = server.probe_get("/metrics").await;
    let failures_before = metric(
        &metrics,
        "trainwire_webhook_certificate_reloads_total{result=\"failure\"}",
    );
    let foreign = pair();
    volume.swap(&new.tls_cert_pem, &foreign.tls_key_pem);
    eventually(
        200,
        "the mismatched pair is refused and counted",
        || async {
            let (_, m) = server.probe_get("/metrics").await;
            metric(
                &m,
                "trainwire_webhook_certificate_reloads_total{result=\"failure\"}",
            ) > failures_before
        },
    )
    .await;
    volume.swap("-----BEGIN CERTIFICATE-----\nnot base64\n", "garbage");
    eventually(200, "the garbage pair is refused and counted", || async {
        let (_, m) = server.probe_get("/metrics").await;
        metric(
            &m,
            "trainwire_webhook_certificate_reloads_total{result=\"failure\"}",
        ) > failures_before + 1.0
    })
    .await;
    assert!(
        post_review(&only_new, addr, body.clone()).await.is_ok(),
        "the good certificate stays in service"
    );
    assert_eq!(server.probe_get("/readyz").await.0, 200);

    let sent_before_stop = sent.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.expect("load task");
    }
    let failures = failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed: {:?}",
        failures.len(),
        sent_before_stop,
        &failures[..failures.len().min(5)]
    );
    let (_, metrics) = server.probe_get("/metrics").await;
    assert!(
        metric(
            &metrics,
            "trainwire_webhook_certificate_reloads_total{result=\"success\"}"
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        server
            .log_lines()
            .iter()
            .any(|l| l.contains("serving certificate not reloaded")
                && l.contains("keeping the previous certificate")),
        "the log says why the broken pair was refused"
    );
}

/// SIGTERM: readiness fails first, the server keeps answering new requests
/// for the drain period (the endpoints controller needs it to drop the pod,
/// or an apiserver call lands on a closed port and, with failurePolicy Fail,
/// refuses the user's apply), then closes the listener and finishes the
/// request in flight.
#[tokio::test]
async fn sigterm_drains_then_finishes_the_request_in_flight() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = pair();
    let volume = SecretVolume::new(dir.path(), &certs.tls_cert_pem, &certs.tls_key_pem);
    let mut server = Server::start(&volume.cert(), &volume.key(), &["--shutdown-drain", "3s"]);
    assert_eq!(server.probe_get("/readyz").await.0, 200);

    // Send the headers and half of the body, then SIGTERM, then the rest.
    let connector =
        tokio_rustls::TlsConnector::from(Arc::new(client_tls(&[&certs], &[b"http/1.1"])));
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from(HOST).expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    let body = common::fixture_bytes("statefulset-create.json");
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("head");
    tls.write_all(&body[..body.len() / 2]).await.expect("half");
    tls.flush().await.expect("flush");
    server.sigterm();
    // Not ready any more, at once...
    let started = std::time::Instant::now();
    while server.probe_get("/readyz").await.0 != 503 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "readiness never failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...but still answering new requests during the drain.
    let client = client(&[&certs], server.addr, Http::One, true);
    let (_, review) = post_review(&client, server.addr, body.clone())
        .await
        .expect("a review answered during the drain");
    assert_eq!(review["response"]["allowed"], true, "{review}");
    // After the drain: the listener is closed.
    let closed = std::time::Instant::now();
    while tokio::net::TcpStream::connect(server.addr).await.is_ok() {
        assert!(
            closed.elapsed() < Duration::from_secs(15),
            "the listener never closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "closed before the drain"
    );
    tls.write_all(&body[body.len() / 2..]).await.expect("rest");
    tls.flush().await.expect("flush");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("5a6e7f1c") || answer.contains("\"uid\""),
        "{answer}"
    );
    let status = server.wait_exit();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn certs_command_output_serves_the_service_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args([
            "certs",
            "--service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--out",
        ])
        .arg(dir.path())
        .output()
        .expect("run certs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = String::from_utf8(out.stdout).expect("utf8");
    let ca_pem = std::fs::read_to_string(dir.path().join("ca.crt")).expect("ca.crt");
    assert_eq!(
        common::base64_decode(bundle.trim()),
        ca_pem.as_bytes(),
        "stdout is the base64 caBundle"
    );
    let ca = Generated {
        ca_cert_pem: ca_pem,
        ca_key_pem: String::new(),
        tls_cert_pem: String::new(),
        tls_key_pem: String::new(),
    };
    let server = Server::start(
        &dir.path().join("tls.crt"),
        &dir.path().join("tls.key"),
        &[],
    );
    let (_, review) = post_review(
        &client(&[&ca], server.addr, Http::Two, true),
        server.addr,
        common::fixture_bytes("statefulset-create.json"),
    )
    .await
    .expect("the generated certificate verifies for the Service name");
    assert!(review["response"]["allowed"].is_boolean());
}

#[test]
fn serve_help_documents_every_flag_and_its_env_var() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for (flag, env) in [
        ("--listen", "TRAINWIRE_LISTEN"),
        ("--probe-listen", "TRAINWIRE_PROBE_LISTEN"),
        ("--tls-cert", "TRAINWIRE_TLS_CERT"),
        ("--tls-key", "TRAINWIRE_TLS_KEY"),
        ("--log-format", "TRAINWIRE_LOG_FORMAT"),
        ("--policy", "TRAINWIRE_POLICY"),
        ("--sidecar-image", "TRAINWIRE_SIDECAR_IMAGE"),
    ] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
        assert!(help.contains(env), "{env} missing:\n{help}");
    }
    assert!(
        help.contains("0.0.0.0:8443") && help.contains("0.0.0.0:8080"),
        "{help}"
    );
}

#[test]
fn the_controllers_subcommand_says_where_the_controllers_went() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args(["controllers", "--crash-loop", "--policy=/p.yaml"])
        .output()
        .expect("trainwire-controllers");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr,
        "error: the controllers are a program of their own: run trainwire-controllers with the same flags (the image ships it beside trainwire-webhook; manifests/base/controllers.yaml)\n"
    );
    // `serve` has none of the controllers' flags any more.
    let serve = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args(["serve", "--help"])
        .output()
        .expect("serve --help");
    let serve = String::from_utf8_lossy(&serve.stdout);
    for flag in [
        "--reconcile",
        "--lease-namespace",
        "--node-failure",
        "--crash-loop",
    ] {
        assert!(!serve.contains(flag), "serve still has {flag}:\n{serve}");
    }
}

#[tokio::test]
async fn a_missing_certificate_keeps_the_server_unready_until_it_appears() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(
        &dir.path().join("tls.crt"),
        &dir.path().join("tls.key"),
        &[],
    );
    let (status, body) = server.probe_get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("no serving certificate"), "{body}");
    let certs = pair();
    let _volume = SecretVolume::new(dir.path(), &certs.tls_cert_pem, &certs.tls_key_pem);
    eventually(200, "ready once the Secret appears", || async {
        server.probe_get("/readyz").await.0 == 200
    })
    .await;
    let client = client(&[&certs], server.addr, Http::One, true);
    assert!(
        post_review(
            &client,
            server.addr,
            common::fixture_bytes("job-update-label.json")
        )
        .await
        .is_ok()
    );
}

fn policy_yaml(nccl_debug: &str) -> String {
    format!(
        "apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: gpu\n    nccl:\n      NCCL_DEBUG: {{value: {nccl_debug}}}\n"
    )
}

async fn nccl_debug_injected(client: &reqwest::Client, addr: SocketAddr) -> Option<String> {
    let fixture = common::fixture("statefulset-create.json");
    let (_, review) = post_review(
        client,
        addr,
        common::fixture_bytes("statefulset-create.json"),
    )
    .await
    .expect("review");
    let patched = common::apply_response_patch(&review["response"], &fixture["request"]["object"]);
    common::env_value(common::trainer(&patched), "NCCL_DEBUG")
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
}

#[tokio::test]
async fn the_policy_configmap_is_reloaded_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = pair();
    let tls_dir = dir.path().join("tls");
    let policy_dir = dir.path().join("policy");
    std::fs::create_dir_all(&tls_dir).expect("mkdir");
    std::fs::create_dir_all(&policy_dir).expect("mkdir");
    let volume = SecretVolume::new(&tls_dir, &certs.tls_cert_pem, &certs.tls_key_pem);
    let mut configmap =
        SecretVolume::with_files(&policy_dir, &[("policy.yaml", &policy_yaml("INFO"))]);
    let policy = policy_dir.join("policy.yaml");
    let server = Server::start(
        &volume.cert(),
        &volume.key(),
        &["--policy", policy.to_str().expect("utf8 path")],
    );
    let client = client(&[&certs], server.addr, Http::Two, true);
    assert_eq!(
        nccl_debug_injected(&client, server.addr).await.as_deref(),
        Some("INFO")
    );

    configmap.swap_files(&[("policy.yaml", &policy_yaml("WARN"))]);
    eventually(200, "the new policy is in force", || {
        let client = client.clone();
        async move { nccl_debug_injected(&client, server.addr).await.as_deref() == Some("WARN") }
    })
    .await;

    // A broken policy is refused and counted; the last good one stays.
    configmap.swap_files(&[("policy.yaml", "profiles: [")]);
    eventually(200, "the broken policy is counted", || async {
        let (_, m) = server.probe_get("/metrics").await;
        metric(
            &m,
            "trainwire_webhook_policy_reloads_total{result=\"failure\"}",
        ) >= 1.0
    })
    .await;
    assert_eq!(
        nccl_debug_injected(&client, server.addr).await.as_deref(),
        Some("WARN")
    );
    let (_, metrics) = server.probe_get("/metrics").await;
    assert!(
        metric(
            &metrics,
            "trainwire_webhook_policy_reloads_total{result=\"success\"}"
        ) >= 1.0,
        "{metrics}"
    );
}

#[test]
fn a_broken_policy_at_start_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = pair();
    let volume = SecretVolume::new(dir.path(), &certs.tls_cert_pem, &certs.tls_key_pem);
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, "profiles: [").expect("write");
    let out = serve_command(&volume.cert(), &volume.key())
        .arg("--policy")
        .arg(&policy)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot load the platform policy") && stderr.contains("policy.yaml"),
        "{stderr}"
    );
}

/// The text log, read through a pipe as a log collector reads it, carries no
/// ANSI colour codes (colour only on a terminal), and goes to stderr.
#[test]
fn text_log_through_a_pipe_has_no_colour_codes() {
    use trainwire_test_support::output::{has_ansi, read_lines_until};
    let dir = tempfile::tempdir().expect("tempdir");
    // No certificate yet: the server starts, logs and waits for it.
    let mut child = serve_command(&dir.path().join("tls.crt"), &dir.path().join("tls.key"))
        .args(["--log-format", "text"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainwire-webhook");
    let stderr = child.stderr.take().expect("stderr");
    let stdout = child.stdout.take().expect("stdout");
    let lines = read_lines_until(stderr, Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| l.contains("serving admission reviews"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let log = lines.concat();
    assert!(
        log.contains("serving admission reviews") && log.contains("INFO"),
        "the log reaches stderr:\n{log}"
    );
    assert!(!has_ansi(&log), "colour codes in a piped log:\n{log:?}");
    let out = read_lines_until(stdout, Duration::from_secs(5), |_| false);
    assert!(out.is_empty(), "nothing is logged on stdout: {out:?}");
}
