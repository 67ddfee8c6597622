//! A real single-node Kubernetes cluster on this machine, for end-to-end
//! tests: etcd, the kube-apiserver, controller-manager and scheduler and the
//! kubelet of `../shared/k8s/` (v1.36.2), containerd + runc, a bridge CNI.
//!
//! ```text
//! let node = RealNode::start("mytest")?;   // Ready, ~20 s
//! let install = node.install_trainwire()?; // docs/deploy.md, self-managed overlay, ~22 s
//! node.kubectl(&["get", "pods", "-A"])?;
//! ```
//!
//! Everything is the run's own and goes when the [`RealNode`] drops: the
//! processes, containerd's root, state and socket, the cgroup root (created
//! under every `/sys/fs/cgroup/*` hierarchy), the bridge `tw<id>` and its
//! iptables rule, the pods' network namespaces and every mount under the
//! run's directory. Facts of this machine the set-up follows are in
//! `../shared/k8s/README.md`.
//!
//! The network: pods live on a bridge with an address range that exists
//! only inside the machine (`198.18.<n>.0/24`, no gateway, no masquerade, no
//! default route, so `ip_forward` stays off). They reach the apiserver at the
//! `kubernetes` Service address (a route to the service range via the bridge
//! address, and a DNAT there to a relay on the bridge address), and names
//! through a minimal cluster DNS on the bridge address ([`dns`]) that
//! answers from the API as CoreDNS would (Services, their endpoints'
//! hostnames), NXDOMAIN at once for everything else.

pub mod dns;
pub mod images;
pub mod trainwire;
pub mod world;

use std::collections::HashMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use images::TRAINER_IMAGE;
pub use trainwire::Install;

/// Where the Kubernetes binaries are (zstd): `../shared/k8s/bin` from the
/// repository root, or `$TRAINWIRE_K8S_DIR/bin`.
pub fn k8s_dir() -> PathBuf {
    std::env::var_os("TRAINWIRE_K8S_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("../shared/k8s"))
}

/// The `kubernetes` Service address (first of the service range).
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
const KUBERNETES_SERVICE: &str = "10.96.0.1";

/// The prerequisites of a real node: root, the binaries, and the Debian
/// packages' programs. `Missing` names what to install.
pub fn prerequisites() -> crate::Prerequisite {
    crate::Prerequisite::from_missing(missing())
}

fn missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("a real node needs root (cgroups, a bridge, iptables, mounts)".into());
    }
    for bin in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
    ] {
        let p = k8s_dir().join("bin").join(format!("{bin}.zst"));
        if !p.is_file() {
            return Some(format!(
                "{} is missing (the real node's binaries live in ../shared/k8s/bin)",
                p.display()
            ));
        }
    }
    for (tool, package) in [
        ("etcd", "etcd-server"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("iptables", "iptables"),
        ("busybox", "busybox-static"),
        ("zstd", "zstd"),
        ("umoci", "umoci"),
        ("kubectl", "kubectl 1.27 or newer"),
        ("gcc", "gcc"),
        ("nsenter", "util-linux"),
        ("ip", "iproute2"),
    ] {
        if !on_path(tool) {
            return Some(format!(
                "{tool} not found (Debian: apt-get install {package})"
            ));
        }
    }
    if !Path::new("/usr/lib/cni/bridge").is_file()
        || !Path::new("/usr/lib/cni/host-local").is_file()
    {
        return Some(
            "the CNI plugins are missing in /usr/lib/cni (Debian: apt-get install containernetworking-plugins)"
                .into(),
        );
    }
    None
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// A running single-node cluster. Dropping it stops everything and undoes
/// every change to the host.
pub struct RealNode {
    /// The run's name (`tw<hex>`): bridge, cgroup root, PV prefix.
    pub id: String,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub api_url: String,
    token: String,
    ca_pem: Vec<u8>,
    /// The bridge's address: DNS, relay, and the route to the service range.
    pub bridge_ip: Ipv4Addr,
    /// The pods' range, `198.18.<n>.0/24`.
    pub pod_subnet: String,
    containerd_socket: PathBuf,
    pod_logs: PathBuf,
    procs: Vec<(String, Child)>,
    runtime: Option<tokio::runtime::Runtime>,
    undo: Vec<Undo>,
    cgroups: Vec<PathBuf>,
    iptables_before: Option<Vec<(String, String, String)>>,
}

/// A host change to undo, in reverse order.
enum Undo {
    Command(Vec<String>),
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("mkdir {}: {e}", parent.display()))?;
    }
    fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

/// Polls `f` every 200 ms until it returns `Some`, at most `limit`.
pub fn poll<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T, String> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A free pod subnet `198.18.<n>.0/24`: no route of the host covers it.
fn free_subnet() -> Result<u8, String> {
    let routes = run("ip", &["-4", "route", "show", "table", "all"])?;
    let start = u8::try_from(std::process::id() % 200).unwrap_or(0) + 20;
    (0..200u16)
        .map(|i| u8::try_from((u16::from(start) + i) % 230 + 20).unwrap_or(20))
        .find(|n| !routes.contains(&format!("198.18.{n}.")))
        .ok_or_else(|| "no free 198.18.<n>.0/24 subnet".to_string())
}

impl RealNode {
    /// Starts the whole node and waits until it is Ready (bounded: 90 s).
    /// `label` goes into the directory name, to find a run's files.
    pub fn start(label: &str) -> Result<RealNode, String> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("trainwire-realnode-{label}-"))
            .tempdir_in("/var/tmp")
            .map_err(|e| format!("tempdir: {e}"))?;
        let id = format!("tw{:06x}", std::process::id() & 0xff_ffff);
        let n = free_subnet()?;
        let bridge_ip = Ipv4Addr::new(198, 18, n, 1);
        let mut node = RealNode {
            id,
            kubeconfig: dir.path().join("admin.kubeconfig"),
            api_url: String::new(),
            token: format!("{:032x}", rand_u128()),
            ca_pem: Vec::new(),
            bridge_ip,
            pod_subnet: format!("198.18.{n}.0/24"),
            containerd_socket: dir.path().join("containerd.sock"),
            pod_logs: dir.path().join("pod-logs"),
            dir,
            procs: Vec::new(),
            runtime: None,
            undo: Vec::new(),
            cgroups: Vec::new(),
            iptables_before: None,
        };
        // On error the node drops here and undoes what was done.
        node.boot()?;
        Ok(node)
    }

    /// The run's directory (`/var/tmp/trainwire-realnode-*`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// An admin kubeconfig (token of `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `ctr -a <this containerd> -n k8s.io <args>`.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        let socket = self.containerd_socket.to_string_lossy().into_owned();
        let mut all = vec!["-a", socket.as_str(), "-n", "k8s.io"];
        all.extend_from_slice(args);
        run("ctr", &all)
    }

    /// `kubectl --kubeconfig <admin> <args>`, its stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_stdin(args, None)
    }

    /// `kubectl` with `input` on its stdin (`apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`kubectl {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `kubectl get <args> -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value, String> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let text = self.kubectl(&all)?;
        serde_json::from_str(&text).map_err(|e| format!("kubectl get {}: {e}", args.join(" ")))
    }

    /// The object `yaml` as the apiserver would create it (a server-side
    /// dry run, admission included), as JSON text.
    pub fn dry_run_create(&self, yaml: &str) -> Result<String, String> {
        self.kubectl_stdin(
            &[
                "create",
                "--dry-run=server",
                "--validate=false",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    }

    /// `kubectl apply --validate=false -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<(), String> {
        self.kubectl_stdin(&["apply", "--validate=false", "-f", "-"], Some(yaml))
            .map(|_| ())
    }

    /// Waits until the Deployment has the condition `Available=True`.
    pub fn wait_deployment_available(
        &self,
        namespace: &str,
        name: &str,
        limit: Duration,
    ) -> Result<(), String> {
        poll(
            &format!("deployment {namespace}/{name} available"),
            limit,
            || {
                let d = self.get_json(&["deployment", "-n", namespace, name]).ok()?;
                d["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Available" && c["status"] == "True")
                    .then_some(())
            },
        )
    }

    /// A namespace whose ServiceAccount `default` and the ConfigMaps every
    /// service-account volume mounts exist (pods start without a retry).
    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<(), String> {
        let labels: String = labels
            .iter()
            .map(|(k, v)| format!("\n    {k}: \"{v}\""))
            .collect();
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:{}\n",
            if labels.is_empty() {
                " {}".to_string()
            } else {
                labels
            }
        ))?;
        poll(
            &format!("namespace {name} ready for pods"),
            Duration::from_secs(30),
            || {
                (self
                    .kubectl(&[
                        "get",
                        "-n",
                        name,
                        "serviceaccount/default",
                        "configmap/kube-root-ca.crt",
                        "configmap/openshift-service-ca.crt",
                    ])
                    .is_ok())
                .then_some(())
            },
        )
    }

    /// The kubelet's log files of a container of a pod (CRI format, one file
    /// per restart), oldest first.
    pub fn container_logs(&self, namespace: &str, pod: &str, container: &str) -> Vec<PathBuf> {
        let prefix = format!("{namespace}_{pod}_");
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.pod_logs).into_iter().flatten().flatten() {
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for f in fs::read_dir(entry.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
            {
                files.push(f.path());
            }
        }
        files.sort_by_key(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or(0)
        });
        files
    }

    /// Every log line of every container named `container` of the pods of
    /// `namespace` whose name starts with `pod_prefix`: (time, pod, text).
    pub fn log_lines(
        &self,
        namespace: &str,
        pod_prefix: &str,
        container: &str,
    ) -> Vec<(std::time::SystemTime, String, String)> {
        let ns_prefix = format!("{namespace}_{pod_prefix}");
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.pod_logs).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&ns_prefix) {
                continue;
            }
            let pod = name
                .strip_prefix(&format!("{namespace}_"))
                .and_then(|rest| rest.rsplit_once('_'))
                .map(|(pod, _)| pod.to_string())
                .unwrap_or_default();
            for f in fs::read_dir(entry.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
            {
                let Ok(text) = fs::read_to_string(f.path()) else {
                    continue;
                };
                for line in text.lines() {
                    // <RFC 3339 time> <stream> <P|F> <text>
                    let mut parts = line.splitn(4, ' ');
                    let (Some(ts), Some(_), Some(_), Some(body)) =
                        (parts.next(), parts.next(), parts.next(), parts.next())
                    else {
                        continue;
                    };
                    if let Some(at) = parse_rfc3339(ts) {
                        out.push((at, pod.clone(), body.to_string()));
                    }
                }
            }
        }
        out.sort_by_key(|(at, _, _)| *at);
        out
    }

    /// The CRI containers of a pod (`ctr` info documents), the sandbox
    /// included (label `io.cri-containerd.kind=sandbox`).
    pub fn pod_containers(&self, namespace: &str, pod: &str) -> Result<Vec<Value>, String> {
        let filter = format!(
            "labels.\"io.kubernetes.pod.name\"=={pod},labels.\"io.kubernetes.pod.namespace\"=={namespace}"
        );
        let ids = self.ctr(&["containers", "ls", "-q", &filter])?;
        Ok(ids
            .lines()
            .filter_map(|id| {
                let info = self.ctr(&["containers", "info", id.trim()]).ok()?;
                serde_json::from_str::<Value>(&info).ok()
            })
            .collect())
    }

    /// The network namespace path of a pod's sandbox (`/var/run/netns/cni-*`).
    pub fn pod_netns(&self, namespace: &str, pod: &str) -> Result<String, String> {
        self.pod_containers(namespace, pod)?
            .iter()
            .filter(|c| c["Labels"]["io.cri-containerd.kind"] == "sandbox")
            .filter_map(netns_of)
            .find(|p| Path::new(p).exists())
            .ok_or_else(|| format!("no network namespace for {namespace}/{pod}"))
    }

    /// The host PID of a running container's first process.
    pub fn container_pid(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<i32, String> {
        let tasks = self.ctr(&["tasks", "ls"])?;
        let running: HashMap<&str, i32> = tasks
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let id = f.next()?;
                let pid = f.next()?.parse().ok()?;
                (f.next()? == "RUNNING").then_some((id, pid))
            })
            .collect();
        self.pod_containers(namespace, pod)?
            .iter()
            .filter(|c| c["Labels"]["io.kubernetes.container.name"] == container)
            .filter_map(|c| running.get(c["ID"].as_str()?).copied())
            .next()
            .ok_or_else(|| format!("no running container {container} in {namespace}/{pod}"))
    }

    fn boot(&mut self) -> Result<(), String> {
        let t0 = Instant::now();
        let dir = self.dir.path().to_path_buf();
        let bin = unpacked_binaries()?;
        self.pki(&dir)?;
        self.network()?;
        self.cgroup_root()?;

        // etcd.
        let etcd_client = crate::net::free_port();
        let etcd_peer = crate::net::free_port();
        self.spawn(
            "etcd",
            Command::new("etcd").args([
                "--name",
                "default",
                "--data-dir",
                &dir.join("etcd").to_string_lossy(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-cluster",
                &format!("default=http://127.0.0.1:{etcd_peer}"),
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ]),
        )?;

        // kube-apiserver.
        let api_port = crate::net::free_port();
        self.api_url = format!("https://127.0.0.1:{api_port}");
        let pki = dir.join("pki");
        let p = |f: &str| pki.join(f).to_string_lossy().into_owned();
        write(
            &self.kubeconfig,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: real-node\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: real-node\n  context:\n    cluster: real-node\n    user: admin\ncurrent-context: real-node\n",
                self.api_url,
                p("ca.crt"),
                self.token
            ),
        )?;
        self.spawn(
            "kube-apiserver",
            Command::new(bin.join("kube-apiserver")).args([
                "--etcd-servers",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &api_port.to_string(),
                "--advertise-address",
                &self.bridge_ip.to_string(),
                "--tls-cert-file",
                &p("apiserver.crt"),
                "--tls-private-key-file",
                &p("apiserver.key"),
                "--token-auth-file",
                &p("tokens.csv"),
                "--authorization-mode",
                "Node,RBAC",
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                &p("sa.pub"),
                "--service-account-signing-key-file",
                &p("sa.key"),
                "--service-cluster-ip-range",
                SERVICE_RANGE,
                "--kubelet-preferred-address-types",
                "Hostname",
                "--endpoint-reconciler-type",
                "none",
                "--enable-aggregator-routing=true",
                "--allow-privileged=true",
                "--cert-dir",
                &p("apiserver-generated"),
                "--profiling=false",
            ]),
        )?;
        self.poll_alive("the apiserver's /readyz", Duration::from_secs(60), |n| {
            n.kubectl(&["get", "--raw", "/readyz"]).ok()
        })?;

        // The pods' DNS and the relay to the apiserver, on the bridge address.
        self.serve_bridge(api_port)?;

        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        self.spawn(
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager")).args([
                "--kubeconfig",
                &kubeconfig,
                "--controllers",
                "*",
                "--leader-elect=false",
                "--service-account-private-key-file",
                &p("sa.key"),
                "--root-ca-file",
                &p("ca.crt"),
                "--secure-port",
                "0",
            ]),
        )?;
        self.spawn(
            "kube-scheduler",
            Command::new(bin.join("kube-scheduler")).args([
                "--kubeconfig",
                &kubeconfig,
                "--leader-elect=false",
                "--secure-port",
                "0",
            ]),
        )?;

        // containerd with its own root, state and socket; the images it
        // needs before the kubelet (the sandbox's pause).
        self.containerd()?;
        let pause = images::pause_image(&dir.join("images"))?;
        self.import_image(&pause, images::PAUSE_IMAGE)?;

        // The kubelet (it adds KUBE-* chains and rules to the host's
        // iptables: the ones it adds are removed at the end).
        self.iptables_before = iptables_rules();
        self.kubelet(&bin)?;
        self.poll_alive("node localhost Ready", Duration::from_secs(60), |node| {
            let n = node.get_json(&["node", "localhost"]).ok()?;
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        })?;
        poll(
            "the default ServiceAccount",
            Duration::from_secs(30),
            || {
                self.kubectl(&["get", "serviceaccount", "default", "-n", "default"])
                    .ok()
            },
        )?;
        eprintln!(
            "real node {} Ready in {:.1} s ({})",
            self.id,
            t0.elapsed().as_secs_f64(),
            self.dir().display()
        );
        Ok(())
    }

    /// [`poll`], failing at once with its log when a component exited.
    fn poll_alive<T>(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&RealNode) -> Option<T>,
    ) -> Result<T, String> {
        poll(what, limit, || {
            if self.exited().is_some() {
                return Some(None);
            }
            f(self).map(Some)
        })?
        .ok_or_else(|| {
            let name = self.exited().unwrap_or_default();
            format!("{what}: {name} exited:\n{}", self.component_log(&name, 15))
        })
    }

    /// The first component that is no longer running.
    fn exited(&self) -> Option<String> {
        self.procs.iter().find_map(|(name, child)| {
            let pid = i32::try_from(child.id()).ok()?;
            match trainwire_test_support::process::stat(pid) {
                Some((state, _)) if state != 'Z' => None,
                _ => Some(name.clone()),
            }
        })
    }

    fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<(), String> {
        let log = self.dir.path().join("logs").join(format!("{name}.log"));
        if let Some(parent) = log.parent() {
            fs::create_dir_all(parent).map_err(|e| format!("mkdir: {e}"))?;
        }
        let out = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{e}"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        self.procs.push((name.to_string(), child));
        Ok(())
    }

    /// The last lines of a component's log (for error messages).
    pub fn component_log(&self, name: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn pki(&mut self, dir: &Path) -> Result<(), String> {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let pki = dir.join("pki");
        let e = |e: rcgen::Error| format!("certificates: {e}");
        let ca_key = KeyPair::generate().map_err(e)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "real-node CA");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(e)?;
        let key = KeyPair::generate().map_err(e)?;
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            KUBERNETES_SERVICE.to_string(),
            self.bridge_ip.to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])
        .map_err(e)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let cert = params.signed_by(&key, &ca).map_err(e)?;
        let sa = KeyPair::generate().map_err(e)?;
        self.ca_pem = ca.pem().into_bytes();
        write(&pki.join("ca.crt"), &ca.pem())?;
        write(&pki.join("apiserver.crt"), &cert.pem())?;
        write(&pki.join("apiserver.key"), &key.serialize_pem())?;
        write(&pki.join("sa.key"), &sa.serialize_pem())?;
        write(&pki.join("sa.pub"), &sa.public_key_pem())?;
        write(
            &pki.join("tokens.csv"),
            &format!("{},admin,admin,system:masters\n", self.token),
        )
    }

    /// The bridge with its address, and the DNAT of the `kubernetes`
    /// Service to the relay (set up in [`RealNode::serve_bridge`]).
    fn network(&mut self) -> Result<(), String> {
        let br = self.id.clone();
        run("ip", &["link", "add", &br, "type", "bridge"])?;
        self.undo.push(Undo::Command(vec![
            "ip".into(),
            "link".into(),
            "del".into(),
            br.clone(),
        ]));
        run(
            "ip",
            &["addr", "add", &format!("{}/24", self.bridge_ip), "dev", &br],
        )?;
        run("ip", &["link", "set", &br, "up"])?;
        let cni = self.dir.path().join("cni");
        let conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": br,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": br,
                    "isGateway": false,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": cni.join("ipam").to_string_lossy(),
                        "ranges": [[{
                            "subnet": self.pod_subnet,
                            "rangeStart": Ipv4Addr::from(u32::from(self.bridge_ip) + 9).to_string(),
                            "gateway": self.bridge_ip.to_string(),
                        }]],
                        "routes": [{"dst": SERVICE_RANGE, "gw": self.bridge_ip.to_string()}],
                    },
                },
                {"type": "loopback"},
            ],
        });
        write(&cni.join("net.d/10-real-node.conflist"), &conf.to_string())
    }

    fn serve_bridge(&mut self, api_port: u16) -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio: {e}"))?;
        let records: dns::Records = Arc::new(RwLock::new(HashMap::new()));
        let api = dns::Api {
            url: self.api_url.clone(),
            token: self.token.clone(),
            ca_pem: self.ca_pem.clone(),
        };
        let bridge = self.bridge_ip;
        let (udp, tcp) = runtime.block_on(async move {
            let udp = tokio::net::UdpSocket::bind(SocketAddr::from((bridge, 53))).await;
            let tcp = tokio::net::TcpListener::bind(SocketAddr::from((bridge, 0))).await;
            (udp, tcp)
        });
        let udp = udp.map_err(|e| format!("DNS on {bridge}:53: {e}"))?;
        let tcp = tcp.map_err(|e| format!("relay on {bridge}: {e}"))?;
        let relay_port = tcp.local_addr().map_err(|e| format!("{e}"))?.port();
        runtime.spawn(dns::poll_records(api, records.clone()));
        runtime.spawn(dns::serve(udp, records));
        runtime.spawn(dns::relay(
            tcp,
            SocketAddr::from(([127, 0, 0, 1], api_port)),
        ));
        self.runtime = Some(runtime);
        let rule: Vec<String> = [
            "PREROUTING",
            "-i",
            &self.id,
            "-d",
            KUBERNETES_SERVICE,
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            &format!("{}:{relay_port}", self.bridge_ip),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut add = vec!["-w", "-t", "nat", "-A"];
        add.extend(rule.iter().map(String::as_str));
        run("iptables", &add)?;
        let mut del: Vec<String> = ["iptables", "-w", "-t", "nat", "-D"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        del.extend(rule);
        self.undo.push(Undo::Command(del));
        Ok(())
    }

    /// `/<id>` under every cgroup v1 hierarchy (and the unified one), with
    /// the parent's cpuset.
    fn cgroup_root(&mut self) -> Result<(), String> {
        for entry in fs::read_dir("/sys/fs/cgroup").map_err(|e| format!("/sys/fs/cgroup: {e}"))? {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if path.is_symlink() || !path.is_dir() {
                continue;
            }
            let mine = path.join(&self.id);
            fs::create_dir_all(&mine).map_err(|e| format!("mkdir {}: {e}", mine.display()))?;
            self.cgroups.push(mine.clone());
            if entry.file_name() == "cpuset" {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = fs::read_to_string(path.join(f)).unwrap_or_default();
                    let _ = fs::write(mine.join(f), v.trim());
                }
            }
        }
        Ok(())
    }

    fn containerd(&mut self) -> Result<(), String> {
        let d = self.dir.path().join("containerd");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = self.containerd_socket.display(),
            d = d.display(),
            pause = images::PAUSE_IMAGE,
            cni = self.dir.path().join("cni/net.d").display(),
        );
        let path = d.join("config.toml");
        write(&path, &config)?;
        self.spawn(
            "containerd",
            Command::new("containerd").args(["--config", &path.to_string_lossy()]),
        )?;
        self.poll_alive("containerd's socket", Duration::from_secs(30), |n| {
            n.ctr(&["version"]).ok()
        })
        .map(|_| ())
    }

    /// Imports an OCI archive into containerd's `k8s.io` namespace as
    /// `name` (`repo:tag`; the archive's own reference is its tag).
    pub fn import_image(&self, archive: &Path, name: &str) -> Result<(), String> {
        let base = name.rsplit_once(':').map_or(name, |(repo, _)| repo);
        self.ctr(&[
            "images",
            "import",
            "--base-name",
            base,
            &archive.to_string_lossy(),
        ])?;
        let listed = self.ctr(&["images", "ls", "-q"])?;
        if listed.lines().any(|l| l.trim() == name) {
            Ok(())
        } else {
            Err(format!(
                "{} imported, but containerd lists no {name} ({})",
                archive.display(),
                listed.trim().replace('\n', ", ")
            ))
        }
    }

    fn kubelet(&mut self, bin: &Path) -> Result<(), String> {
        let d = self.dir.path().join("kubelet");
        let port = crate::net::free_port();
        let healthz = crate::net::free_port();
        write(&d.join("resolv.conf"), "")?;
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{id}
containerRuntimeEndpoint: unix://{sock}
address: 127.0.0.1
port: {port}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
readOnlyPort: 0
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: ["{dns}"]
clusterDomain: {domain}
resolvConf: {resolv}
podLogsDir: {logs}
failSwapOn: false
registerNode: true
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
volumePluginDir: {d}/volume-plugins
maxPods: 60
"#,
            id = self.id,
            sock = self.containerd_socket.display(),
            dns = self.bridge_ip,
            domain = dns::CLUSTER_DOMAIN,
            resolv = d.join("resolv.conf").display(),
            logs = self.pod_logs.display(),
            d = d.display(),
        );
        let path = d.join("config.yaml");
        write(&path, &config)?;
        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        self.spawn(
            "kubelet",
            Command::new(bin.join("kubelet")).args([
                "--config",
                &path.to_string_lossy(),
                "--kubeconfig",
                &kubeconfig,
                "--root-dir",
                &d.join("root").to_string_lossy(),
                "--cert-dir",
                &d.join("pki").to_string_lossy(),
                "--hostname-override",
                "localhost",
                "--node-ip",
                &self.bridge_ip.to_string(),
            ]),
        )
    }

    /// Stops a component and everything of the run, in order.
    fn teardown(&mut self) {
        let stop = |name: &str, procs: &mut Vec<(String, Child)>| {
            if let Some(i) = procs.iter().position(|(n, _)| n == name) {
                let (_, mut child) = procs.remove(i);
                terminate(&mut child);
            }
        };
        // The sandboxes' network namespaces, while containerd still answers.
        let netns: Vec<String> = self
            .ctr(&[
                "containers",
                "ls",
                "-q",
                "labels.\"io.cri-containerd.kind\"==sandbox",
            ])
            .unwrap_or_default()
            .lines()
            .filter_map(|id| {
                let info = self.ctr(&["containers", "info", id.trim()]).ok()?;
                netns_of(&serde_json::from_str(&info).ok()?)
            })
            .collect();
        stop("kubelet", &mut self.procs);
        // Every container process: they live in the run's cgroups.
        for _ in 0..3 {
            let pids = self.cgroup_pids();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        stop("containerd", &mut self.procs);
        // The shims of this containerd (they outlive it).
        let socket = self.containerd_socket.to_string_lossy().into_owned();
        let shims = trainwire_test_support::process::pids_with_cmdline("containerd-shim", &socket);
        for pid in shims {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for name in [
            "kube-scheduler",
            "kube-controller-manager",
            "kube-apiserver",
            "etcd",
        ] {
            stop(name, &mut self.procs);
        }
        while let Some((_, mut child)) = self.procs.pop() {
            terminate(&mut child);
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        // Mounts under the run's directory (kubelet volumes, containerd's
        // rootfs and shm), deepest first; then the pods' netns.
        let root = self.dir.path().to_string_lossy().into_owned();
        let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&root))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = run("umount", &["-l", &m]);
        }
        for ns in netns {
            let _ = run("umount", &[&ns]);
            let _ = fs::remove_file(&ns);
        }
        while let Some(Undo::Command(cmd)) = self.undo.pop() {
            if let Some((program, args)) = cmd.split_first() {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                if let Err(e) = run(program, &args) {
                    eprintln!("real node teardown: {e}");
                }
            }
        }
        for cg in std::mem::take(&mut self.cgroups) {
            remove_cgroup(&cg);
        }
        if let Some(before) = self.iptables_before.take() {
            remove_kubelet_rules(&before);
        }
    }

    fn cgroup_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for cg in &self.cgroups {
            collect_pids(cg, &mut pids);
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// (program, table, line) of every `iptables -S` / `ip6tables -S` line.
fn iptables_rules() -> Option<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    for program in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(text) = run(program, &["-w", "-t", table, "-S"]) else {
                continue;
            };
            out.extend(
                text.lines()
                    .map(|l| (program.to_string(), table.to_string(), l.to_string())),
            );
        }
    }
    Some(out)
}

/// Removes the KUBE-* rules, then chains, that were not there before.
fn remove_kubelet_rules(before: &[(String, String, String)]) {
    let Some(now) = iptables_rules() else { return };
    let added: Vec<&(String, String, String)> = now
        .iter()
        .filter(|r| r.2.contains("KUBE-") && !before.contains(r))
        .collect();
    for (program, table, line) in &added {
        if let Some(rule) = line.strip_prefix("-A ") {
            let mut args = vec![
                "-w".to_string(),
                "-t".to_string(),
                table.clone(),
                "-D".to_string(),
            ];
            args.extend(shell_words(rule));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _ = run(program, &args);
        }
    }
    for (program, table, line) in &added {
        if let Some(chain) = line.strip_prefix("-N ") {
            let _ = run(program, &["-w", "-t", table, "-F", chain]);
            let _ = run(program, &["-w", "-t", table, "-X", chain]);
        }
    }
}

/// Splits an `iptables -S` rule into its arguments (double quotes group).
fn shell_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            ' ' if !quoted => {
                if any {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            _ => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// The Kubernetes binaries, unpacked once into `target/real-node-bin`
/// (again when a `.zst` is newer than its copy).
fn unpacked_binaries() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile>/deps/<test> -> target/real-node-bin
    let bin = exe
        .ancestors()
        .nth(3)
        .map(|target| target.join("real-node-bin"))
        .ok_or("no target directory")?;
    fs::create_dir_all(&bin).map_err(|e| format!("mkdir {}: {e}", bin.display()))?;
    for b in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
    ] {
        let src = k8s_dir().join("bin").join(format!("{b}.zst"));
        let dst = bin.join(b);
        let newer = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
        if newer(&dst).is_some_and(|d| newer(&src).is_some_and(|s| s <= d)) {
            continue;
        }
        let part = bin.join(format!("{b}.part"));
        run(
            "zstd",
            &[
                "-q",
                "-d",
                "-f",
                "-o",
                &part.to_string_lossy(),
                &src.to_string_lossy(),
            ],
        )?;
        fs::rename(&part, &dst).map_err(|e| format!("rename {}: {e}", dst.display()))?;
    }
    Ok(bin)
}

fn netns_of(info: &Value) -> Option<String> {
    info["Spec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == "network")?["path"]
        .as_str()
        .map(str::to_string)
}

fn terminate(child: &mut Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), out);
        }
    }
}

fn remove_cgroup(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&entry.path());
        }
    }
    for _ in 0..20 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("real node teardown: cannot remove {}", dir.display());
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut out = 0u128;
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(out);
        out = (out << 64) | u128::from(h.finish());
    }
    out
}

/// An RFC 3339 time (`2026-12-04T16:40:00.123456789Z`, or with an offset)
/// as a `SystemTime`.
pub fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    let mut nanos = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits: String = frac.chars().take_while(char::is_ascii_digit).collect();
        let padded = format!("{digits:0<9}");
        nanos = padded.get(..9)?.parse().ok()?;
        rest = &frac[digits.len()..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let oh = rest.get(1..3)?.parse::<i64>().ok()?;
            let om = rest.get(4..6)?.parse::<i64>().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if mo > 2 { mo - 3 } else { mo + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(
        std::time::UNIX_EPOCH
            + Duration::from_secs(secs)
            + Duration::from_nanos(u64::try_from(nanos).ok()?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc3339() {
        let t = parse_rfc3339("2026-12-04T16:40:00.5Z")
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        assert_eq!(t.map(|d| d.as_millis()), Some(1_796_402_400_500));
        let o = parse_rfc3339("2026-12-04T17:40:00.5+01:00")
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        assert_eq!(o.map(|d| d.as_millis()), Some(1_796_402_400_500));
        assert!(parse_rfc3339("yesterday").is_none());
    }
}
