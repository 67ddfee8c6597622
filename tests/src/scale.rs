//! A scale simulation of heartbeat detection: N real `trainwire-sidecar`
//! processes, each in its own network namespace on one bridge, with the
//! env the webhook renders for pod `i` of an N-pod StatefulSet (heartbeat
//! detection, the default interval and misses, pod 0 the rendezvous host),
//! and no trainer. Over a window it measures, per sidecar, the heartbeat
//! probes sent and answered per second (the sidecar's own counters,
//! `trainwire_sidecar_heartbeat_probes_total` and
//! `trainwire_sidecar_heartbeats_served_total`), the CPU it used
//! (`/proc/<pid>/stat` utime + stime) and its RSS (`/proc/<pid>/status`
//! `VmRSS`), and whether each sidecar sees every peer it watches healthy.
//!
//! The kernel's neighbour table is shared by every network namespace
//! (`net.ipv4.neigh.default.gc_thresh1/2/3`, 128/512/1,024 by default):
//! the simulation raises the thresholds for N namespaces that talk, and
//! puts the old values back when it ends ([`NeighbourTable`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::Value;
use trainwire_sidecar::env as tw;

use crate::netns::{self, Network, Node};
use crate::process::{Log, Proc, Tag, unique_name};

/// The health port every simulated pod listens on.
const PORT: u16 = tw::DEFAULT_HEALTH_PORT;
/// The StatefulSet's name and its headless Service's.
const SET: &str = "sim";
/// The DNS domain of the pods: `<set>-<i>.<service>.<namespace>.svc.cluster.local`.
const DOMAIN: &str = "sim.scale.svc.cluster.local";

/// Raises the shared neighbour-table thresholds for the simulation and
/// restores them when dropped.
pub struct NeighbourTable {
    old: Vec<(String, String)>,
}

const GC_THRESH: [&str; 3] = ["gc_thresh1", "gc_thresh2", "gc_thresh3"];

fn gc_path(name: &str) -> String {
    format!("/proc/sys/net/ipv4/neigh/default/{name}")
}

impl NeighbourTable {
    /// Room for `entries` neighbour entries (never lowers a threshold).
    pub fn raise(entries: u64) -> Result<NeighbourTable, String> {
        let mut old = Vec::new();
        let wanted = [entries / 4, entries / 2, entries];
        for (name, want) in GC_THRESH.iter().zip(wanted) {
            let path = gc_path(name);
            let now = std::fs::read_to_string(&path)
                .map_err(|e| format!("read {path}: {e}"))?
                .trim()
                .to_string();
            let current: u64 = now.parse().map_err(|e| format!("{path}={now:?}: {e}"))?;
            if want > current {
                std::fs::write(&path, want.to_string())
                    .map_err(|e| format!("write {path}: {e}"))?;
                old.push((path, now));
            }
        }
        Ok(NeighbourTable { old })
    }
}

impl Drop for NeighbourTable {
    fn drop(&mut self) {
        // gc_thresh3 first: the thresholds must stay ordered.
        for (path, value) in self.old.iter().rev() {
            let _ = std::fs::write(path, value);
        }
    }
}

/// What was measured of one sidecar over the window.
#[derive(Debug, Clone)]
pub struct Sidecar {
    pub rank: u32,
    /// Share of one core, in percent.
    pub cpu_percent: f64,
    pub rss_mib: f64,
    /// Heartbeat probes sent per second.
    pub probes_sent: f64,
    /// Heartbeat requests answered per second.
    pub probes_served: f64,
    /// The ranks it watches, and how many of them it sees healthy.
    pub watched: Vec<u32>,
    pub watched_healthy: usize,
    /// Losses it declared (its `/status` generation): a false loss, since
    /// no peer is cut while measuring.
    pub losses: u64,
}

/// The simulation's result.
#[derive(Debug, Clone)]
pub struct Report {
    pub n: u32,
    pub window: Duration,
    /// Busy processes spinning on the machine while measuring.
    pub busy: u32,
    pub sidecars: Vec<Sidecar>,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { sum / f64::from(n) }
}

fn max(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, f64::max)
}

impl Report {
    pub fn mean_cpu(&self) -> f64 {
        mean(self.sidecars.iter().map(|s| s.cpu_percent))
    }
    pub fn max_cpu(&self) -> f64 {
        max(self.sidecars.iter().map(|s| s.cpu_percent))
    }
    pub fn mean_rss(&self) -> f64 {
        mean(self.sidecars.iter().map(|s| s.rss_mib))
    }
    pub fn max_rss(&self) -> f64 {
        max(self.sidecars.iter().map(|s| s.rss_mib))
    }
    pub fn max_sent(&self) -> f64 {
        max(self.sidecars.iter().map(|s| s.probes_sent))
    }
    pub fn mean_sent(&self) -> f64 {
        mean(self.sidecars.iter().map(|s| s.probes_sent))
    }
    /// Probes answered per second by the sidecars other than the
    /// rendezvous host (rank 0), at most.
    pub fn max_served_but_host(&self) -> f64 {
        max(self
            .sidecars
            .iter()
            .filter(|s| s.rank != 0)
            .map(|s| s.probes_served))
    }
    pub fn rank(&self, rank: u32) -> Option<&Sidecar> {
        self.sidecars.iter().find(|s| s.rank == rank)
    }
    /// Losses declared by all the sidecars together.
    pub fn losses(&self) -> u64 {
        self.sidecars.iter().map(|s| s.losses).sum()
    }
    /// Sidecars that see every peer they watch healthy.
    pub fn all_watched_healthy(&self) -> usize {
        self.sidecars
            .iter()
            .filter(|s| !s.watched.is_empty() && s.watched_healthy == s.watched.len())
            .count()
    }

    /// One line for a table and for logs.
    pub fn summary(&self) -> String {
        let host = self.rank(0);
        format!(
            "N={} window={}s busy_cores={} losses={} cpu_mean={:.3}% cpu_max={:.3}% (rank {}) rss_mean={:.1}MiB rss_max={:.1}MiB probes_sent_per_s mean={:.2} max={:.2} served_per_s max_non_host={:.2} host={:.2} rank0_watched_healthy={}/{} sidecars_all_watched_healthy={}/{}",
            self.n,
            self.window.as_secs(),
            self.busy,
            self.losses(),
            self.mean_cpu(),
            self.max_cpu(),
            self.sidecars
                .iter()
                .max_by(|a, b| a.cpu_percent.total_cmp(&b.cpu_percent))
                .map_or(0, |s| s.rank),
            self.mean_rss(),
            self.max_rss(),
            self.mean_sent(),
            self.max_sent(),
            self.max_served_but_host(),
            host.map_or(0.0, |h| h.probes_served),
            host.map_or(0, |h| h.watched_healthy),
            host.map_or(0, |h| h.watched.len()),
            self.all_watched_healthy(),
            self.sidecars.len(),
        )
    }
}

/// Processes that keep CPUs busy (`sh` spinning) until dropped.
struct Busy(Vec<std::process::Child>);

impl Busy {
    fn start(n: u32) -> Result<Busy, String> {
        let mut spinning = Busy(Vec::new());
        for _ in 0..n {
            let child = std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .map_err(|e| format!("start a busy process: {e}"))?;
            spinning.0.push(child);
        }
        Ok(spinning)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Pod {
    rank: u32,
    node: Node,
    sidecar: Proc,
}

/// The running simulation: dropping it stops every sidecar, removes the
/// namespaces and restores the neighbour table.
pub struct Sim {
    pods: Vec<Pod>,
    pub log: Log,
    // Dropped in this order: processes, then namespaces, then the table.
    _tag: Tag,
    net: Network,
    _neigh: NeighbourTable,
}

/// A counter's value in Prometheus text.
fn counter(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

impl Sim {
    /// Starts `n` sidecars (`n` ≥ 2) and waits (bounded) until each sees
    /// every peer it watches healthy.
    pub fn start(n: u32) -> Result<Sim, String> {
        if !(2..=240).contains(&n) {
            return Err(format!("{n} sidecars: the simulation runs 2 to 240"));
        }
        let bin = crate::sidecar_binary()?;
        // Each namespace holds an entry per peer it talks to; room for all.
        let entries = u64::from(n) * u64::from(n) + 1024;
        let neigh = NeighbourTable::raise(entries)?;
        let mut net = Network::create("twsc")?;
        net.set_domain(DOMAIN);
        let mut nodes = Vec::new();
        for rank in 0..n {
            let host = u8::try_from(10 + rank).map_err(|_| "too many nodes".to_string())?;
            nodes.push(net.add_node(
                &format!("{rank}"),
                &format!("{SET}-{rank}"),
                Network::addr(host),
            )?);
        }
        let tag = Tag::new("twsc");
        let log = Log::new("scale");
        let mut pods = Vec::new();
        for (rank, node) in (0..n).zip(nodes) {
            let mut cmd = net.command(&node, &bin.to_string_lossy());
            cmd.envs([
                (tw::POD_NAME, format!("{SET}-{rank}")),
                (tw::POD_NAMESPACE, "scale".to_string()),
                (tw::POD_UID, unique_name("uid")),
                (tw::NODE_RANK, rank.to_string()),
                (tw::NNODES, n.to_string()),
                (tw::SELECTOR, format!("app={SET}")),
                (tw::PEER_HOSTS, format!("{SET}-{{i}}.{DOMAIN}")),
                (tw::RDZV_HOST_RANK, "0".to_string()),
                (tw::RDZV_PORT, "29500".to_string()),
                (tw::HEALTH_PORT, PORT.to_string()),
                (tw::ON_PEER_LOSS, "auto".to_string()),
                (tw::DETECTION, "heartbeat".to_string()),
                ("RUST_LOG", "warn".to_string()),
            ]);
            let sidecar = Proc::spawn_as(&mut cmd, tag.value(), &log, &format!("{rank}| "))
                .map_err(|e| format!("start sidecar {rank}: {e}"))?;
            pods.push(Pod {
                rank,
                node,
                sidecar,
            });
        }
        let sim = Sim {
            pods,
            log,
            _tag: tag,
            net,
            _neigh: neigh,
        };
        // Every sidecar sees every peer it watches healthy: the world is up.
        let limit = Duration::from_secs(60 + u64::from(n) / 2);
        let started = Instant::now();
        let mut pending: Vec<u32> = (0..n).collect();
        while !pending.is_empty() {
            if started.elapsed() > limit {
                return Err(format!(
                    "after {limit:?}, ranks {pending:?} do not see all their watched peers healthy\n{}",
                    sim.log.tail(60)
                ));
            }
            pending.retain(|&rank| {
                sim.watched_health(rank)
                    .is_none_or(|(watched, healthy)| watched.is_empty() || healthy < watched.len())
            });
            if !pending.is_empty() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(sim)
    }

    fn pod(&self, rank: u32) -> Option<&Pod> {
        self.pods.iter().find(|p| p.rank == rank)
    }

    fn get(&self, rank: u32, path: &str) -> Result<String, String> {
        let pod = self.pod(rank).ok_or_else(|| format!("no rank {rank}"))?;
        netns::http_get(&pod.node.ns, SocketAddr::from(([127, 0, 0, 1], PORT)), path)
    }

    /// `/status` of `rank`.
    pub fn status(&self, rank: u32) -> Result<Value, String> {
        let body = self.get(rank, "/status")?;
        serde_json::from_str(&body).map_err(|e| format!("/status is not JSON ({e}): {body}"))
    }

    /// The ranks `rank` watches and how many of them it sees healthy.
    pub fn watched_health(&self, rank: u32) -> Option<(Vec<u32>, usize)> {
        let status = self.status(rank).ok()?;
        let watched: Vec<u32> = status["watched"]
            .as_array()?
            .iter()
            .filter_map(|r| r.as_u64().and_then(|r| u32::try_from(r).ok()))
            .collect();
        let healthy = status["peers"]
            .as_array()?
            .iter()
            .filter(|p| {
                p["state"] == "healthy"
                    && p["rank"]
                        .as_u64()
                        .and_then(|r| u32::try_from(r).ok())
                        .is_some_and(|r| watched.contains(&r))
            })
            .count();
        Some((watched, healthy))
    }

    /// Per sidecar: (time, cpu ticks, probes sent, probes served).
    fn sample(&self, pod: &Pod) -> Result<(Instant, u64, f64, f64), String> {
        let metrics = self.get(pod.rank, "/metrics")?;
        let at = Instant::now();
        let pid = pod.sidecar.pid();
        let ticks = cpu_ticks(pid).ok_or_else(|| format!("no /proc/{pid}/stat"))?;
        let sent = counter(&metrics, "trainwire_sidecar_heartbeat_probes_total")
            .ok_or("no trainwire_sidecar_heartbeat_probes_total")?;
        let served = counter(&metrics, "trainwire_sidecar_heartbeats_served_total")
            .ok_or("no trainwire_sidecar_heartbeats_served_total")?;
        Ok((at, ticks, sent, served))
    }

    /// Measures every sidecar over `window`, with `busy` processes spinning
    /// on the CPUs meanwhile (a `stress --cpu <busy>` load).
    pub fn measure(&self, window: Duration, busy: u32) -> Result<Report, String> {
        let _load = Busy::start(busy)?;
        let before = self
            .pods
            .iter()
            .map(|p| self.sample(p))
            .collect::<Result<Vec<_>, _>>()?;
        std::thread::sleep(window);
        let tick = clock_ticks();
        let mut sidecars = Vec::new();
        for (pod, (t0, c0, s0, r0)) in self.pods.iter().zip(before) {
            let (t1, c1, s1, r1) = self.sample(pod)?;
            let secs = t1.saturating_duration_since(t0).as_secs_f64().max(1e-3);
            let (watched, watched_healthy) = self
                .watched_health(pod.rank)
                .ok_or_else(|| format!("no /status from rank {}", pod.rank))?;
            let rss_kib = crate::process::status_kib(pod.sidecar.pid(), "VmRSS").unwrap_or(0);
            let losses = self
                .status(pod.rank)
                .ok()
                .and_then(|s| s["generation"].as_u64())
                .unwrap_or(0);
            sidecars.push(Sidecar {
                rank: pod.rank,
                cpu_percent: (c1.saturating_sub(c0)) as f64 / tick / secs * 100.0,
                rss_mib: rss_kib as f64 / 1024.0,
                probes_sent: (s1 - s0) / secs,
                probes_served: (r1 - r0) / secs,
                watched,
                watched_healthy,
                losses,
            });
        }
        Ok(Report {
            n: u32::try_from(self.pods.len()).unwrap_or(u32::MAX),
            window,
            busy,
            sidecars,
        })
    }

    /// Cuts `rank` off the bridge (its processes notice nothing).
    pub fn cut(&self, rank: u32) -> Result<(), String> {
        let pod = self.pod(rank).ok_or_else(|| format!("no rank {rank}"))?;
        self.net.cut(&pod.node)
    }
}
