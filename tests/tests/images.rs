//! The container images `images/build` makes (`target/images/*.oci.tar`),
//! checked as files and run with a real OCI runtime (runc) the way a kubelet
//! runs them: as the image's own user (65532), root filesystem read-only, no
//! capability at all, `no_new_privs`, its own PID, mount, IPC and UTS
//! namespaces. The network is the host's (loopback ports the test picks), so
//! the test reaches the servers without entering a namespace.
//!
//! Prerequisites: the archives (`images/build`, which `.ci/run` runs before
//! the tests), root, `runc` and `umoci` (Debian packages of those names).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use trainwire_tests::Prerequisite;
use trainwire_tests::process::{Log, Proc};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The non-root user both images run as (distroless' `nonroot`).
const USER: u64 = 65532;
/// The webhook's Service as `trainwire-webhook certs` is told it.
const SERVICE_HOST: &str = "trainwire-webhook.trainwire-system.svc";

fn archive(bin: &str) -> PathBuf {
    trainwire_tests::repo_root().join(format!("target/images/{bin}-{VERSION}.oci.tar"))
}

fn tool(program: &str) -> Prerequisite {
    match Prerequisite::command(program, &["--version"]) {
        Prerequisite::Missing(why) => {
            Prerequisite::Missing(format!("{why} (Debian: apt-get install {program})"))
        }
        met => met,
    }
}

fn archives() -> Prerequisite {
    Prerequisite::from_missing(
        ["trainwire-webhook", "trainwire-sidecar"]
            .iter()
            .map(|b| archive(b))
            .find(|a| !a.is_file())
            .map(|a| format!("{} is missing: run images/build", a.display())),
    )
}

/// What running an image needs; `false` when the test is skipped.
#[track_caller]
fn can_run(test: &str) -> bool {
    trainwire_tests::require::require_all(
        test,
        [
            archives(),
            Prerequisite::root(),
            tool("runc"),
            tool("umoci"),
        ],
    )
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An archive unpacked as an OCI image layout, and its manifest and config.
struct Layout {
    dir: tempfile::TempDir,
    manifest_digest: String,
    config: Value,
    layers: Vec<String>,
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

impl Layout {
    fn open(archive: &Path) -> Result<Layout> {
        let dir = tempfile::tempdir()?;
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(dir.path()))?;
        let index = read_json(&dir.path().join("index.json"))?;
        let manifests = index["manifests"]
            .as_array()
            .context("index.json manifests")?;
        let [entry] = manifests.as_slice() else {
            bail!(
                "{}: {} manifests, expected one",
                archive.display(),
                manifests.len()
            );
        };
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"], VERSION,
            "the image's tag is the workspace version"
        );
        let manifest_digest = entry["digest"].as_str().context("digest")?.to_string();
        let manifest = read_json(&blob(dir.path(), &manifest_digest))?;
        let config = read_json(&blob(
            dir.path(),
            manifest["config"]["digest"]
                .as_str()
                .context("config digest")?,
        ))?;
        let layers = manifest["layers"]
            .as_array()
            .context("layers")?
            .iter()
            .filter_map(|l| l["digest"].as_str().map(String::from))
            .collect();
        Ok(Layout {
            dir,
            manifest_digest,
            config,
            layers,
        })
    }

    /// Every path in the image's layers (`./usr/local/bin/...`).
    fn files(&self) -> Result<Vec<String>> {
        let mut files = Vec::new();
        for layer in &self.layers {
            let listing = run(Command::new("tar")
                .arg("-tzf")
                .arg(blob(self.dir.path(), layer)))?;
            files.extend(listing.lines().map(String::from));
        }
        Ok(files)
    }
}

#[test]
fn each_image_is_the_binary_a_numeric_non_root_user_and_oci_labels() -> Result<()> {
    if !trainwire_tests::require(
        "each_image_is_the_binary_a_numeric_non_root_user_and_oci_labels",
        archives(),
    ) {
        return Ok(());
    }
    for bin in ["trainwire-webhook", "trainwire-sidecar"] {
        let layout = Layout::open(&archive(bin))?;
        let config = &layout.config["config"];
        assert_eq!(config["User"], format!("{USER}:{USER}"), "{bin}");
        assert_eq!(
            config["Entrypoint"],
            json!([format!("/usr/local/bin/{bin}")]),
            "{bin}"
        );
        let labels = &config["Labels"];
        assert_eq!(labels["org.opencontainers.image.version"], VERSION);
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        assert_eq!(
            labels["org.opencontainers.image.source"],
            "https://github.com/trainwire/trainwire"
        );
        assert_eq!(labels["org.opencontainers.image.title"], bin);
        assert_eq!(layout.config["os"], "linux");
        // Distroless-like: the binary, the C runtime it links, the account
        // files, the packages' copyright notices; no shell, no tools.
        let files = layout.files()?;
        let has = |p: &str| files.iter().any(|f| f == p);
        for needed in [
            format!("./usr/local/bin/{bin}"),
            "./etc/passwd".to_string(),
            "./etc/group".to_string(),
            "./usr/share/doc/libc6/copyright".to_string(),
        ] {
            assert!(has(&needed), "{bin}: {needed} missing from {files:?}");
        }
        for absent in ["./bin/sh", "./usr/bin/sh", "./bin/bash", "./usr/bin/env"] {
            assert!(!has(absent), "{bin}: {absent} in the image");
        }
        let binaries: Vec<&String> = files
            .iter()
            .filter(|f| f.contains("/bin/") && !f.ends_with('/'))
            .collect();
        // The webhook's image also ships the controllers' program, which
        // their Deployment runs with `command:` (images/build).
        let expected: Vec<String> = match bin {
            "trainwire-webhook" => vec![
                "./usr/local/bin/trainwire-controllers".to_string(),
                "./usr/local/bin/trainwire-webhook".to_string(),
            ],
            _ => vec![format!("./usr/local/bin/{bin}")],
        };
        assert_eq!(
            binaries.iter().map(|b| b.as_str()).collect::<Vec<_>>(),
            expected.iter().map(String::as_str).collect::<Vec<_>>(),
            "{bin}"
        );
    }
    Ok(())
}

#[test]
fn building_twice_from_the_same_binaries_gives_the_same_digests() -> Result<()> {
    let release = trainwire_tests::repo_root().join("target/release");
    let binaries = Prerequisite::from_missing(
        [
            "trainwire-webhook",
            "trainwire-controllers",
            "trainwire-sidecar",
        ]
        .iter()
        .map(|b| release.join(b))
        .find(|b| !b.is_file())
        .map(|b| format!("{} is missing: run images/build", b.display())),
    );
    if !trainwire_tests::require::require_all(
        "building_twice_from_the_same_binaries_gives_the_same_digests",
        [binaries, tool("umoci"), tool("dpkg")],
    ) {
        return Ok(());
    }
    let mut builds = Vec::new();
    for _ in 0..2 {
        let out = tempfile::tempdir()?;
        run(
            Command::new(trainwire_tests::repo_root().join("images/build"))
                .args(["--no-cargo", "--out"])
                .arg(out.path()),
        )?;
        builds.push(out);
    }
    for bin in ["trainwire-webhook", "trainwire-sidecar"] {
        let name = format!("{bin}-{VERSION}.oci.tar");
        let [a, b] = [&builds[0], &builds[1]].map(|d| d.path().join(&name));
        let (first, second) = (Layout::open(&a)?, Layout::open(&b)?);
        assert_eq!(first.manifest_digest, second.manifest_digest, "{bin}");
        assert!(
            std::fs::read(&a)? == std::fs::read(&b)?,
            "{bin}: the archives differ byte for byte"
        );
    }
    Ok(())
}

/// An image unpacked into a runtime bundle (`umoci unpack`), its
/// `config.json` made as strict as a restricted pod: read-only root, no
/// capability, no new privileges, the image's user; the host's network.
struct Bundle {
    _layout: Layout,
    dir: tempfile::TempDir,
    /// The `config.json` umoci wrote, which each [`Bundle::configure`] starts from.
    unpacked: Value,
    /// runc's state directory, this test's own.
    state: tempfile::TempDir,
}

impl Bundle {
    fn unpack(bin: &str) -> Result<Bundle> {
        let layout = Layout::open(&archive(bin))?;
        let dir = tempfile::tempdir()?;
        let bundle = dir.path().join("bundle");
        run(Command::new("umoci")
            .arg("unpack")
            .arg("--image")
            .arg(format!("{}:{VERSION}", layout.dir.path().display()))
            .arg(&bundle))?;
        let unpacked = read_json(&bundle.join("config.json"))?;
        Ok(Bundle {
            _layout: layout,
            dir,
            unpacked,
            state: tempfile::tempdir()?,
        })
    }

    /// The runtime config for `args` (after the entrypoint), `env` added,
    /// and `mounts` (host dir, container path, writable) bound in.
    fn configure(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        mounts: &[(&Path, &str, bool)],
    ) -> Result<()> {
        let path = self.dir.path().join("bundle/config.json");
        let mut config = self.unpacked.clone();
        let process = &mut config["process"];
        // umoci takes the user from the image: it must be the non-root one.
        assert_eq!(process["user"]["uid"], USER);
        assert_eq!(process["user"]["gid"], USER);
        let mut argv: Vec<Value> = process["args"].as_array().cloned().unwrap_or_default();
        argv.extend(args.iter().map(|a| json!(a)));
        process["args"] = json!(argv);
        process["terminal"] = json!(false);
        process["noNewPrivileges"] = json!(true);
        process["capabilities"] = json!({
            "bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []
        });
        if let Some(list) = process["env"].as_array_mut() {
            list.extend(env.iter().map(|(k, v)| json!(format!("{k}={v}"))));
        }
        config["root"]["readonly"] = json!(true);
        if let Some(list) = config["mounts"].as_array_mut() {
            for (source, destination, writable) in mounts {
                list.push(json!({
                    "destination": destination,
                    "type": "bind",
                    "source": source,
                    "options": ["rbind", if *writable { "rw" } else { "ro" }],
                }));
            }
        }
        // The host's network (loopback ports chosen by the test); every
        // other namespace the image's own.
        if let Some(list) = config["linux"]["namespaces"].as_array_mut() {
            list.retain(|ns| ns["type"] != "network");
            let kinds: Vec<&str> = list.iter().filter_map(|ns| ns["type"].as_str()).collect();
            for kind in ["pid", "mount", "ipc", "uts"] {
                assert!(kinds.contains(&kind), "no {kind} namespace in {kinds:?}");
            }
        }
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
        Ok(())
    }

    fn runc(&self) -> Command {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(self.state.path());
        cmd
    }

    /// Runs the configured process to its end (bounded), returning stdout.
    fn run_to_end(
        &self,
        id: &str,
        limit: Duration,
    ) -> Result<(std::process::ExitStatus, String, String)> {
        let log = Log::new(id);
        let mut proc = Proc::spawn_as(
            self.runc()
                .arg("run")
                .arg("--bundle")
                .arg(self.dir.path().join("bundle"))
                .arg(id),
            id,
            &log,
            "",
        )?;
        let status = proc.wait_timeout(limit);
        let _ = self.runc().args(["delete", "--force", id]).output();
        let status = status
            .with_context(|| format!("{id} still running after {limit:?}: {}", log.tail(20)))?;
        // stdout and stderr share the log; the caller looks for its lines.
        let text = log
            .lines()
            .into_iter()
            .map(|l| l.text)
            .collect::<Vec<_>>()
            .join("\n");
        Ok((status, text, log.tail(40)))
    }

    /// Starts the configured process in the background.
    fn start(&self, id: &str) -> Result<Container<'_>> {
        let log = Log::new(id);
        let proc = Proc::spawn_as(
            self.runc()
                .arg("run")
                .arg("--bundle")
                .arg(self.dir.path().join("bundle"))
                .arg(id),
            id,
            &log,
            "",
        )?;
        Ok(Container {
            bundle: self,
            id: id.to_string(),
            proc,
            log,
        })
    }
}

/// A running container; killed and deleted when dropped.
struct Container<'a> {
    bundle: &'a Bundle,
    id: String,
    proc: Proc,
    log: Log,
}

impl Container<'_> {
    /// The container's first process, as seen from the host.
    fn pid(&self) -> Result<i32> {
        let state: Value =
            serde_json::from_str(&run(self.bundle.runc().args(["state", self.id.as_str()]))?)?;
        let pid = state["pid"].as_i64().context("runc state: pid")?;
        Ok(i32::try_from(pid)?)
    }

    /// What the kernel says about the process: user, capabilities,
    /// no_new_privs, namespaces and the root mount.
    fn assert_confined(&self) -> Result<()> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let user = USER.to_string();
        assert_eq!(field("Uid"), [user.as_str(); 4], "{status}");
        assert_eq!(field("Gid"), [user.as_str(); 4], "{status}");
        for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(field(caps), ["0000000000000000"], "{caps}: {status}");
        }
        assert_eq!(field("NoNewPrivs"), ["1"], "{status}");
        for ns in ["pid", "mnt", "ipc", "uts"] {
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))?;
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"))?;
            assert_ne!(
                theirs, ours,
                "the container shares the host's {ns} namespace"
            );
        }
        let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
        let root = mountinfo
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .rfind(|f| f.get(4) == Some(&"/"))
            .context("no root mount")?;
        let options = root.get(5).copied().unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "the root is mounted {options}"
        );
        Ok(())
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .bundle
            .runc()
            .args(["delete", "--force", self.id.as_str()])
            .output();
        self.proc.kill_tree();
    }
}

fn unique_id(what: &str) -> String {
    format!("trainwire-test-{what}-{}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_image_serves_healthz_over_tls_as_its_non_root_user() -> Result<()> {
    if !can_run("the_webhook_image_serves_healthz_over_tls_as_its_non_root_user") {
        return Ok(());
    }
    let bundle = Bundle::unpack("trainwire-webhook")?;
    // The certificate from the image's own `certs`, written as 65532 into
    // the only writable directory.
    let certs = tempfile::tempdir()?;
    let user = u32::try_from(USER)?;
    std::os::unix::fs::chown(certs.path(), Some(user), Some(user))?;
    bundle.configure(
        &[
            "certs",
            "--service",
            "trainwire-webhook",
            "--namespace",
            "trainwire-system",
            "--out",
            "/certs",
        ],
        &[],
        &[(certs.path(), "/certs", true)],
    )?;
    let (status, _, log) = bundle.run_to_end(&unique_id("certs"), Duration::from_secs(30))?;
    ensure!(status.success(), "certs in the image: {status}\n{log}");
    let ca = std::fs::read(certs.path().join("ca.crt"))?;

    let (listen, probe) = (
        trainwire_tests::net::free_port(),
        trainwire_tests::net::free_port(),
    );
    bundle.configure(
        &[
            "serve",
            "--listen",
            &format!("127.0.0.1:{listen}"),
            "--probe-listen",
            &format!("127.0.0.1:{probe}"),
            "--tls-cert",
            "/certs/tls.crt",
            "--tls-key",
            "/certs/tls.key",
        ],
        // No cluster: the scale guard and reconciler stay off.
        &[("KUBECONFIG", "/nonexistent"), ("RUST_LOG", "info")],
        &[(certs.path(), "/certs", false)],
    )?;
    let container = bundle.start(&unique_id("webhook"))?;
    let serving = container.log.wait_for(Duration::from_secs(30), |l| {
        l.contains("serving admission reviews")
    });
    ensure!(
        serving.is_some(),
        "the webhook did not start:\n{}",
        container.log.tail(40)
    );
    container.assert_confined()?;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(SERVICE_HOST, ([127, 0, 0, 1], listen).into())
        .timeout(Duration::from_secs(5))
        .build()?;
    let response = client
        .get(format!("https://{SERVICE_HOST}:{listen}/healthz"))
        .send()
        .await
        .with_context(|| container.log.tail(40))?;
    assert_eq!(response.status(), 200, "{}", container.log.tail(40));

    // The probe port's metrics report this build.
    let metrics = trainwire_tests::net::http_get(&format!("127.0.0.1:{probe}"), "/metrics")
        .with_context(|| container.log.tail(40))?;
    assert!(
        metrics.contains(&format!("trainwire_build_info{{version=\"{VERSION}\"")),
        "{metrics}"
    );
    Ok(())
}

#[test]
fn the_sidecar_image_answers_version_and_serves_healthz_as_its_non_root_user() -> Result<()> {
    if !can_run("the_sidecar_image_answers_version_and_serves_healthz_as_its_non_root_user") {
        return Ok(());
    }
    let bundle = Bundle::unpack("trainwire-sidecar")?;
    // No TRAINWIRE_* at all: --version still answers.
    bundle.configure(&["--version"], &[], &[])?;
    let (status, out, log) =
        bundle.run_to_end(&unique_id("sidecar-version"), Duration::from_secs(30))?;
    ensure!(status.success(), "--version: {status}\n{log}");
    assert!(
        out.lines()
            .any(|l| l == format!("trainwire-sidecar {VERSION}")),
        "{out}"
    );

    let port = trainwire_tests::net::free_port();
    let port_text = port.to_string();
    bundle.configure(
        &[],
        &[
            ("TRAINWIRE_POD_NAME", "train-0"),
            ("TRAINWIRE_POD_NAMESPACE", "default"),
            // Rank 0 of two, the peer (127.0.0.11) not started: absent, not lost.
            ("TRAINWIRE_NNODES", "2"),
            ("TRAINWIRE_NODE_RANK", "0"),
            ("TRAINWIRE_DETECTION", "heartbeat"),
            ("TRAINWIRE_PEER_HOSTS", "127.0.0.1{i}"),
            ("TRAINWIRE_BIND_ADDRESS", "127.0.0.1"),
            ("TRAINWIRE_HEALTH_PORT", &port_text),
        ],
        &[],
    )?;
    let container = bundle.start(&unique_id("sidecar"))?;
    let addr = format!("127.0.0.1:{port}");
    let mut answered = false;
    // Until /healthz answers, or the sidecar exits with its error.
    trainwire_tests::wait::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
        answered = trainwire_tests::net::http_get(&addr, "/healthz").is_some();
        answered
            || container
                .log
                .lines()
                .iter()
                .any(|l| l.text.starts_with("error:"))
    });
    ensure!(
        answered,
        "the sidecar did not answer /healthz:\n{}",
        container.log.tail(40)
    );
    container.assert_confined()?;
    Ok(())
}

#[test]
fn the_manifests_and_the_default_sidecar_name_the_images_of_this_version() -> Result<()> {
    let root = trainwire_tests::repo_root();
    for path in [
        "manifests/base/deployment.yaml",
        "manifests/install/cert-manager.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(path))?;
        assert!(
            text.contains(&format!(
                "image: ghcr.io/trainwire/trainwire-webhook:{VERSION}"
            )),
            "{path}: the webhook image tag is not the workspace version {VERSION}"
        );
    }
    assert_eq!(
        trainwire_engine::policy::DEFAULT_SIDECAR_IMAGE,
        format!("ghcr.io/trainwire/trainwire-sidecar:{VERSION}")
    );
    Ok(())
}
