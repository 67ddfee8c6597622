//! Network namespaces as "nodes" for end-to-end tests.
//!
//! A [`Network`] is a switch namespace holding a bridge, and one namespace
//! per node, each joined to the bridge by a veth pair whose switch end is
//! named after the node. Cutting a node off sets its switch-side link down:
//! its processes see nothing (no error, no reset), exactly like a node whose
//! network or power went away. Each node namespace gets its own
//! `/etc/netns/<ns>/hosts`, so peers are reached by names like `node-1`, and
//! a replacement node can take over a name with a new address.
//!
//! Those files play two parts, as in a pod: the node's own line, which the
//! kubelet writes into every pod's `/etc/hosts` (`<pod IP> <fqdn> <hostname>`:
//! a pod always resolves its own names to its own address), and the cluster
//! DNS for every other name, which may lag behind a replacement
//! ([`Network::add_node_named`], [`Network::set_host`]). With
//! [`Network::set_domain`], a node's DNS name is its fully qualified name
//! (`node-0.<subdomain>...`), as the webhook injects it.
//!
//! Everything is named uniquely per test run, and removed on drop (processes
//! still inside a namespace are SIGKILLed first). Interfaces live only inside
//! the test's own namespaces, so nothing in the host's network changes.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::sys::signal::Signal;

use crate::process::{signal_all, unique_name};

/// Run `ip ARGS`; the error names the command and what `ip` said.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why network-namespace tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    if !crate::process::is_root() {
        return Some("not running as root (ip netns needs it)".to_string());
    }
    if Command::new("unshare")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        return Some("`unshare` (util-linux) is missing".to_string());
    }
    let probe = unique_name("twprobe");
    if let Err(e) = ip(&["netns", "add", &probe]) {
        return Some(format!("`ip netns` does not work here: {e}"));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

/// Whether the test may run: under `CI=true` a missing prerequisite fails
/// the test, elsewhere it prints `SKIPPED: ...` (see `trainwire_test_support::require`).
pub fn require_netns(test: &str) -> bool {
    crate::require(test, crate::Prerequisite::from_missing(unavailable()))
}

/// One node: a namespace with `eth0` on the bridge.
#[derive(Debug, Clone)]
pub struct Node {
    /// The namespace name (`ip netns exec <ns>`).
    pub ns: String,
    /// The switch-side interface; set down to cut the node off.
    pub port: String,
    /// The host name its processes see (`hostname`).
    pub hostname: String,
    /// The name peers resolve: `hostname` followed by the network's domain.
    pub fqdn: String,
    pub addr: Ipv4Addr,
}

/// The test's network: a switch namespace with a bridge, and nodes.
pub struct Network {
    prefix: String,
    switch: String,
    nodes: Vec<Node>,
    /// The "cluster DNS": name → address, as every node but the named one sees it.
    hosts: Vec<(String, Ipv4Addr)>,
    /// Appended to a node's hostname to make its DNS name (empty: none).
    domain: String,
}

const SUBNET: [u8; 3] = [10, 77, 0];

impl Network {
    /// A new switch namespace with a bridge `br0`.
    pub fn create(prefix: &str) -> Result<Network, String> {
        sweep_orphans(prefix);
        let prefix = network_name(prefix);
        let switch = format!("{prefix}-sw");
        ip(&["netns", "add", &switch])?;
        let net = Network {
            prefix,
            switch,
            nodes: Vec::new(),
            hosts: Vec::new(),
            domain: String::new(),
        };
        net.in_switch(&["link", "add", "br0", "type", "bridge"])?;
        net.in_switch(&["link", "set", "br0", "up"])?;
        Ok(net)
    }

    fn in_switch(&self, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["-n", self.switch.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Nodes added from now on are named `<hostname>.<domain>` in DNS (a
    /// pod's `<hostname>.<subdomain>.<namespace>.svc.<cluster domain>`).
    pub fn set_domain(&mut self, domain: &str) {
        self.domain = format!(".{}", domain.trim_start_matches('.'));
    }

    /// The DNS name of a node called `hostname`.
    pub fn fqdn(&self, hostname: &str) -> String {
        format!("{hostname}{}", self.domain)
    }

    /// An address on the test subnet, `10.77.0.<host>`.
    pub fn addr(host: u8) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], host)
    }

    /// Add a node namespace `label`, with `eth0` at `addr` on the bridge, and
    /// make its name resolve to `addr` in every node (a replacement node
    /// takes over the name from the node it replaces).
    pub fn add_node(
        &mut self,
        label: &str,
        hostname: &str,
        addr: Ipv4Addr,
    ) -> Result<Node, String> {
        self.add_node_named(label, hostname, addr, true)
    }

    /// [`Network::add_node`]; with `point_name` false, the name keeps
    /// resolving to what it did (the node that is being replaced) in every
    /// other node until [`Network::set_host`] re-points it, as DNS does a
    /// moment after a replacement pod starts; the new node itself resolves
    /// its own names to its own address at once, as a pod does through the
    /// `/etc/hosts` line the kubelet writes.
    pub fn add_node_named(
        &mut self,
        label: &str,
        hostname: &str,
        addr: Ipv4Addr,
        point_name: bool,
    ) -> Result<Node, String> {
        let ns = format!("{}-{label}", self.prefix);
        ip(&["netns", "add", &ns])?;
        let node = Node {
            ns: ns.clone(),
            port: format!("p-{label}"),
            hostname: hostname.to_string(),
            fqdn: self.fqdn(hostname),
            addr,
        };
        self.nodes.push(node.clone());
        std::fs::create_dir_all(self.etc(&ns))
            .map_err(|e| format!("create {}: {e}", self.etc(&ns).display()))?;
        let cidr = format!("{addr}/24");
        self.in_switch(&[
            "link", "add", &node.port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        self.in_switch(&["link", "set", &node.port, "master", "br0"])?;
        self.in_switch(&["link", "set", &node.port, "up"])?;
        ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        if point_name {
            self.set_host(&node.fqdn, addr)?;
        } else {
            self.rewrite_hosts()?;
        }
        Ok(node)
    }

    fn etc(&self, ns: &str) -> PathBuf {
        PathBuf::from("/etc/netns").join(ns)
    }

    /// Point the DNS name `name` at `addr` in every node's hosts file (but
    /// the node that owns the name, which resolves it to itself). The files are
    /// rewritten in place, so processes already running see the change (like
    /// a DNS record that follows a rescheduled pod).
    pub fn set_host(&mut self, name: &str, addr: Ipv4Addr) -> Result<(), String> {
        self.hosts.retain(|(h, _)| h != name);
        self.hosts.push((name.to_string(), addr));
        self.rewrite_hosts()
    }

    /// Make `name` resolve to `addr` as well, after the addresses it has
    /// (DNS publishing two pods under one name).
    pub fn add_host(&mut self, name: &str, addr: Ipv4Addr) -> Result<(), String> {
        self.hosts.push((name.to_string(), addr));
        self.rewrite_hosts()
    }

    fn rewrite_hosts(&self) -> Result<(), String> {
        for node in &self.nodes {
            let path = self.etc(&node.ns).join("hosts");
            // Truncate and write the same inode: `ip netns exec` bind-mounts
            // this file over /etc/hosts, and a rename would not be seen.
            std::fs::write(&path, self.hosts_of(node))
                .map_err(|e| format!("write {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// The `/etc/hosts` of `node`: the kubelet's lines (its own names at its
    /// own address, the fully qualified one first, as the canonical name),
    /// then the DNS view of every other name.
    fn hosts_of(&self, node: &Node) -> String {
        let mut text = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost\n");
        if node.fqdn == node.hostname {
            text.push_str(&format!("{}\t{}\n", node.addr, node.hostname));
        } else {
            text.push_str(&format!(
                "{}\t{}\t{}\n",
                node.addr, node.fqdn, node.hostname
            ));
        }
        for (h, a) in &self.hosts {
            if *h != node.fqdn && *h != node.hostname {
                text.push_str(&format!("{a}\t{h}\n"));
            }
        }
        text
    }

    /// Cut a node off: its switch port goes down. Nothing inside the node
    /// notices; its peers stop hearing from it.
    pub fn cut(&self, node: &Node) -> Result<(), String> {
        self.in_switch(&["link", "set", &node.port, "down"])
    }

    /// Undo [`Network::cut`]: the node's switch port comes up again.
    pub fn heal(&self, node: &Node) -> Result<(), String> {
        self.in_switch(&["link", "set", &node.port, "up"])
    }

    /// A blip: the bridge stops forwarding a node's frames, both ways,
    /// until [`Network::unblock`]. Unlike [`Network::cut`] no link goes
    /// down, so nothing waits for the kernel to bring a link back up after
    /// (its link watch applies a carrier change up to a second later): a
    /// blip of this length, as a switch or a network that drops packets
    /// for a while gives it.
    pub fn block(&self, node: &Node) -> Result<(), String> {
        self.port_state(node, "0")
    }

    /// Undo [`Network::block`]: the bridge forwards the node's frames again.
    pub fn unblock(&self, node: &Node) -> Result<(), String> {
        self.port_state(node, "3")
    }

    /// Sets the bridge port state of `node` (0 disabled, 3 forwarding; the
    /// bridge runs no STP, so the state is the caller's to set).
    fn port_state(&self, node: &Node, state: &str) -> Result<(), String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.switch, "bridge", "link", "set"])
            .args(["dev", &node.port, "state", state])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("bridge link set: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "bridge link set dev {} state {state}: {}",
                node.port,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Processes running inside a node's namespace.
    pub fn pids(&self, node: &Node) -> Vec<i32> {
        namespace_pids(&node.ns)
    }

    /// Freeze every process of a node (SIGSTOP): with [`Network::cut`], a
    /// node that lost power.
    pub fn freeze(&self, node: &Node) {
        signal_all(&self.pids(node), Signal::SIGSTOP);
    }

    /// A command that runs `program` inside `node`'s namespace, with the
    /// node's own host name (a private UTS namespace, like a pod's), so that
    /// `socket.gethostname()` there is the name its peers resolve. The spawned
    /// process is `program` itself (`ip netns exec`, `unshare` and `sh` exec
    /// into it), so its pid is the program's pid.
    pub fn command(&self, node: &Node, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns", "exec", &node.ns, "unshare", "--uts", "--", "sh", "-c",
        ])
        .arg("hostname \"$0\" && exec \"$@\"")
        .arg(&node.hostname)
        .arg(program);
        cmd
    }

    /// The arguments of `ip` in [`Network::command`], for a closure that
    /// builds the command again at each (re)start.
    pub fn command_args(&self, node: &Node, program: &str) -> Vec<String> {
        self.command(node, program)
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}

/// Pids of the processes in namespace `ns` (`ip netns pids`).
pub fn namespace_pids(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Network {
    fn drop(&mut self) {
        for node in &self.nodes {
            // SIGKILL works on stopped processes too; retry while some remain.
            for _ in 0..50 {
                let pids = namespace_pids(&node.ns);
                if pids.is_empty() {
                    break;
                }
                signal_all(&pids, Signal::SIGKILL);
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = ip(&["netns", "del", &node.ns]);
            let _ = std::fs::remove_dir_all(self.etc(&node.ns));
        }
        // Deleting the switch namespace removes the bridge and the veth pairs.
        let _ = ip(&["netns", "del", &self.switch]);
    }
}

/// `<prefix><creator pid, hex>x<counter, hex>`: the creator's pid can be read
/// back, so namespaces left behind by a killed test run can be found.
fn network_name(prefix: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}{:x}x{n:x}", std::process::id())
}

/// Delete the namespaces (and their `/etc/netns` folders) of networks named
/// by [`network_name`] whose creating process is gone: a test process killed
/// by a timeout never runs its `Drop`.
fn sweep_orphans(prefix: &str) {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('x') else {
            continue;
        };
        let Ok(pid) = u32::from_str_radix(pid, 16) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        signal_all(&namespace_pids(&name), Signal::SIGKILL);
        let _ = ip(&["netns", "del", &name]);
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{name}"));
    }
}

/// A TCP connection to `addr` made from inside namespace `ns` (the socket
/// belongs to the namespace it was created in; only a short-lived thread
/// switches namespace, the test process stays where it is).
pub fn connect_in(
    ns: &str,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> Result<std::net::TcpStream, String> {
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || {
        let file =
            std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns {}: {e}", path.display()))?;
        std::net::TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connect {addr} in {}: {e}", path.display()))
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?
}

/// A TCP listener on `addr` made inside namespace `ns` (as
/// [`connect_in`]: only a short-lived thread switches namespace).
pub fn listen_in(ns: &str, addr: std::net::SocketAddr) -> Result<std::net::TcpListener, String> {
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || {
        let file =
            std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns {}: {e}", path.display()))?;
        std::net::TcpListener::bind(addr)
            .map_err(|e| format!("listen on {addr} in {}: {e}", path.display()))
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?
}

/// `GET path` over HTTP/1.0 from inside namespace `ns`; the response body.
pub fn http_get(ns: &str, addr: std::net::SocketAddr, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(2);
    let mut stream = connect_in(ns, addr, timeout)?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send GET {path}: {e}"))?;
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .map_err(|e| format!("read GET {path}: {e}"))?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP response: {raw:?}"))?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
        return Err(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_string())
}

/// A node's link slowed down by a userspace forwarder
/// (`tests/scripts/delay_forwarder.py`) in the switch namespace: the node's
/// switch port leaves the bridge, and every frame between it and the bridge
/// waits the delay, both ways. Dropping it stops the forwarder and puts the
/// port back on the bridge.
pub struct DelayedLink {
    switch: String,
    port: String,
    inner: String,
    forwarder: std::process::Child,
}

impl Network {
    /// Add `one_way` of latency to every frame to and from `node` (this
    /// kernel has no `sch_netem`). Checksum offload and TSO are turned off on
    /// every node's `eth0` first (frames crossing a packet socket must be
    /// complete); they stay off for the rest of the test.
    pub fn delay(&self, node: &Node, one_way: std::time::Duration) -> Result<DelayedLink, String> {
        let script = crate::repo_root().join("tests/scripts/delay_forwarder.py");
        let run = |ns: &str, args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "python3"])
                .arg(&script)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("run {}: {e}", script.display()))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{} {args:?} in {ns}: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        for n in &self.nodes {
            run(&n.ns, &["--offload-off", "eth0"])?;
        }
        let inner = format!("d{}", &node.port[1..]);
        let outer = format!("e{}", &node.port[1..]);
        self.in_switch(&[
            "link", "add", &inner, "type", "veth", "peer", "name", &outer,
        ])?;
        self.in_switch(&["link", "set", &outer, "master", "br0"])?;
        run(&self.switch, &["--offload-off", &inner, &outer, &node.port])?;
        for dev in [&inner, &outer, &node.port] {
            self.in_switch(&["link", "set", dev, "promisc", "on", "up"])?;
        }
        let forwarder = Command::new("ip")
            .args(["netns", "exec", &self.switch, "python3"])
            .arg(&script)
            .args(["--forward", &node.port, &inner, "--delay"])
            .arg(format!("{:.3}", one_way.as_secs_f64()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("start the delaying forwarder: {e}"))?;
        let link = DelayedLink {
            switch: self.switch.clone(),
            port: node.port.clone(),
            inner,
            forwarder,
        };
        // The forwarder's sockets are open before the port leaves the bridge.
        std::thread::sleep(std::time::Duration::from_millis(500));
        self.in_switch(&["link", "set", &node.port, "nomaster"])?;
        Ok(link)
    }
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        let _ = ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &self.port,
            "master",
            "br0",
        ]);
        let _ = self.forwarder.kill();
        let _ = self.forwarder.wait();
        let _ = ip(&["-n", &self.switch, "link", "del", &self.inner]);
    }
}
