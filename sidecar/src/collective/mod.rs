//! Whether the trainer's workers train: a worker that holds an established
//! TCP connection to another pod (gloo's full mesh, NCCL's bootstrap ring)
//! has passed `init_process_group` (its collective formed); when those
//! connections then carry traffic again and again, the workers run
//! collectives, which a training step does (its gradient all-reduce). A
//! worker that has only started is still importing, loading, waiting for
//! its peers (seconds on a busy node: 3.5 s between the workers' start and
//! the first step in `recovery_e2e`), and one whose collective has just
//! formed may still be loading its checkpoint (1–2 s there, minutes for a
//! large model), so neither is the resumption when more can be seen.
//!
//! The sockets come from the kernel's socket diagnostics (`sock_diag`, what
//! `ss -tie` reads) of the pod's network namespace, which the sidecar shares
//! with the trainer: every established TCP socket with its owner's UID, its
//! inode, both ends and the bytes it carried (`tcp_info`). Nothing of the
//! trainer's `/proc/<pid>` is needed for that, so it holds for a root
//! trainer beside a sidecar with only `CAP_KILL`, and for a trainer of
//! another user (reading another process's `/proc/<pid>/fd`, `environ` or
//! `maps` needs ptrace read access: the same user and no more capabilities,
//! or `CAP_SYS_PTRACE`). Which sockets are the collective's ([`select`]):
//! established, not on the loopback, neither end on a rendezvous store's
//! port nor on the sidecar's own port, not the sidecar's own sockets (its
//! `/proc/self/fd`), owned by the workers' UID (`/proc/<pid>/status` is
//! readable by everyone), to a peer pod this sidecar knows when there is
//! one. When the workers' `/proc/<pid>/fd` is readable (the same user), the
//! choice narrows to their own sockets (the agent's are left out), and
//! their `/proc/<pid>/environ` tells torch's node rank and whether they
//! expect peers at all. A worker forked by the agent's forkserver (warm
//! workers) carries the forkserver's environment, which tells neither:
//! for those, and whenever no worker's environment tells the rank, what the
//! agent's rendezvous handler wrote of its last round does
//! ([`crate::rendezvous::agent_node`], readable by every user).
//!
//! [`Watch`] turns the scans into the one observation that training runs,
//! with what it was seen by ([`TrainingSeenBy`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

use trainwire_contract::peer_loss::{
    BURST_LIKENESS, STEP_BURSTS, TRAFFIC_WAIT, TRAINING_SETTLE, TrainingSeenBy, UNCONNECTED_WAIT,
};

mod sockets;

use sockets::canonical;
pub use sockets::{
    Carried, SocketRow, namespace_sockets, parse_status_uid, parse_tcp_table, process_uid,
    socket_inodes,
};

/// What tells the collective's sockets apart from the others of the pod
/// ([`select`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// The rendezvous store's ports: every agent and worker talks to the
    /// store before its peers. Either end.
    pub store_ports: Vec<u16>,
    /// The sidecar's own ports (health, heartbeats, probes). Either end.
    pub own_ports: Vec<u16>,
    /// The sidecar's own sockets (its `/proc/self/fd`).
    pub own_inodes: BTreeSet<u64>,
    /// The workers' users (`/proc/<pid>/status`); empty when unknown.
    pub workers_uids: BTreeSet<u32>,
    /// The workers' own sockets, when their `/proc/<pid>/fd` is readable.
    pub worker_inodes: Option<BTreeSet<u64>>,
    /// Addresses of peer pods this sidecar knows (the pods it watches).
    pub peers: BTreeSet<IpAddr>,
}

/// The sockets [`select`] chose.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chosen {
    /// The collective's connections, by inode, with the bytes each carried
    /// when known.
    pub peers: BTreeMap<u64, Option<Carried>>,
    /// Whether the workers hold any established TCP connection at all (to
    /// the store, on the loopback too).
    pub any: bool,
}

/// The workers' sockets among `rows` that are their collective's
/// connections: established, not on the loopback, neither end on a store
/// port or on the sidecar's own port, not the sidecar's own, owned by the
/// workers' UID (when known), the workers' own (when their descriptors are
/// readable); and, when some of them lead to a peer pod this sidecar knows,
/// only those (a data or logging service the workers also talk to is not
/// their collective). Pure.
pub fn select(rows: &[SocketRow], scope: &Scope) -> Chosen {
    let theirs = |r: &&SocketRow| {
        r.established
            && !scope.own_inodes.contains(&r.inode)
            && (scope.workers_uids.is_empty() || scope.workers_uids.contains(&r.uid))
            && scope
                .worker_inodes
                .as_ref()
                .is_none_or(|inodes| inodes.contains(&r.inode))
    };
    let on = |ports: &[u16], r: &SocketRow| {
        ports.contains(&r.local.port()) || ports.contains(&r.remote.port())
    };
    let workers: Vec<&SocketRow> = rows
        .iter()
        .filter(theirs)
        // The sidecar's own connections are never the workers'.
        .filter(|r| !on(&scope.own_ports, r))
        .collect();
    let candidates: Vec<&SocketRow> = workers
        .iter()
        .copied()
        .filter(|r| {
            !canonical(r.remote.ip()).is_loopback()
                && !canonical(r.local.ip()).is_loopback()
                && !on(&scope.store_ports, r)
        })
        .collect();
    let known = |r: &&SocketRow| scope.peers.contains(&canonical(r.remote.ip()));
    let to_known = candidates.iter().any(known);
    Chosen {
        peers: candidates
            .into_iter()
            .filter(|r| !to_known || known(r))
            .map(|r| (r.inode, r.carried))
            .collect(),
        any: !workers.is_empty(),
    }
}

/// What torchrun told a worker about its world, from its environment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// torch's node rank (`GROUP_RANK`).
    pub group_rank: Option<u32>,
    /// `MASTER_ADDR` and `MASTER_PORT`: it joins a torch process group.
    pub rendezvous: bool,
    /// `WORLD_SIZE`: the workers of the whole world.
    pub world_size: Option<u32>,
    /// `LOCAL_WORLD_SIZE`: the workers on this node.
    pub local_world_size: Option<u32>,
    /// `TF_CONFIG`: a TensorFlow cluster member.
    pub tf_config: bool,
    /// `MASTER_PORT`: the port of the store the workers' process group
    /// meets at (torchrun's agent of node rank 0 serves it, on a free port
    /// it picks): its request-and-answer traffic goes both ways, over and
    /// over, from before the collective forms, and is not the collective.
    pub store_port: Option<u16>,
}

impl WorkerEnv {
    /// From the bytes of `/proc/<pid>/environ` (`NAME=value` separated by
    /// NUL); what does not parse is absent.
    pub fn parse(bytes: &[u8]) -> WorkerEnv {
        let mut env = WorkerEnv::default();
        let (mut addr, mut port) = (false, false);
        for var in bytes.split(|b| *b == 0) {
            let Some(eq) = var.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (name, value) = (&var[..eq], &var[eq + 1..]);
            let number = || std::str::from_utf8(value).ok()?.trim().parse().ok();
            match name {
                b"GROUP_RANK" => env.group_rank = number(),
                b"WORLD_SIZE" => env.world_size = number(),
                b"LOCAL_WORLD_SIZE" => env.local_world_size = number(),
                b"MASTER_ADDR" => addr = !value.is_empty(),
                b"MASTER_PORT" => {
                    port = !value.is_empty();
                    env.store_port = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok());
                }
                b"TF_CONFIG" => env.tf_config = !value.is_empty(),
                _ => {}
            }
        }
        env.rendezvous = addr && port;
        env
    }

    /// Whether the worker has peers on other nodes to connect to: a torch
    /// process group with more workers than this node runs (unknown sizes
    /// count as more), or a TensorFlow cluster. A launcher that is not
    /// torchrun, or a world of one node, forms no collective to be seen.
    pub fn expects_peers(&self) -> bool {
        self.tf_config
            || (self.rendezvous
                && match (self.world_size, self.local_world_size) {
                    (Some(world), Some(local)) => world > local,
                    _ => true,
                })
    }
}

impl WorkerEnv {
    /// What the agent's rendezvous handler wrote of its last round, as a
    /// worker's environment would say it: torch's node rank, and peers
    /// expected when the round has more than one node (or an unknown
    /// number).
    pub fn of_agent(node: &crate::rendezvous::AgentNode) -> WorkerEnv {
        WorkerEnv {
            group_rank: node.group_rank,
            rendezvous: true,
            world_size: node.world_size,
            local_world_size: node.world_size.map(|_| 1),
            tf_config: false,
            store_port: node.workers_store_port,
        }
    }
}

/// The trainer's workers on this pod, for [`scan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workers {
    pub pids: Vec<i32>,
    /// Those forked by the agent's forkserver: their `/proc/<pid>/environ`
    /// is the forkserver's, not what torchrun gave them (never read).
    pub forked: BTreeSet<i32>,
    /// What the agent's rendezvous handler wrote of its last round.
    pub agent: Option<WorkerEnv>,
}

impl Workers {
    /// Workers started by the agent itself (their environment is theirs).
    pub fn plain(pids: Vec<i32>) -> Workers {
        Workers {
            pids,
            ..Workers::default()
        }
    }

    /// The workers of `trainers` (a worker whose parent is not its agent is
    /// the forkserver's), with the agent's `node` file when there is one.
    pub fn of(
        trainers: &[crate::signal::Trainer],
        node: Option<&crate::rendezvous::AgentNode>,
    ) -> Workers {
        let all = trainers
            .iter()
            .flat_map(|t| t.workers.iter().map(move |w| (t, w)));
        Workers {
            pids: all.clone().map(|(_, w)| w.pid).collect(),
            forked: all
                .filter(|(t, w)| w.ppid != t.agent.pid)
                .map(|(_, w)| w.pid)
                .collect(),
            agent: node.map(WorkerEnv::of_agent),
        }
    }
}

/// A worker's environment; `None` when it cannot be read.
pub fn worker_env(proc_root: &Path, pid: i32) -> Option<WorkerEnv> {
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("environ")).ok()?;
    let mut bytes = Vec::new();
    use std::io::Read;
    // A process environment is bounded by the kernel's ARG_MAX; read 1 MiB.
    file.take(1 << 20).read_to_end(&mut bytes).ok()?;
    Some(WorkerEnv::parse(&bytes))
}

/// The bytes each of the collective's connections carried, by inode.
pub type Traffic = BTreeMap<u64, Carried>;

/// What one scan saw of the workers' collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Collective {
    /// No worker runs, or their sockets could not be seen.
    #[default]
    Unreadable,
    /// The workers were given no peers on other nodes
    /// ([`WorkerEnv::expects_peers`]): no collective to see.
    NotExpected,
    /// They expect peers and hold no connection to one yet, but to the
    /// rendezvous store (torch's workers talk to it first).
    Forming,
    /// They expect peers and hold no established TCP connection at all:
    /// still importing, or not a torch process group (a stand-in trainer
    /// given torchrun's variables); after [`UNCONNECTED_WAIT`] their start
    /// is all there is to see.
    Unconnected,
    /// They hold connections to peers; the bytes each carried, when the
    /// kernel's socket diagnostics tell.
    Formed { traffic: Option<Traffic> },
}

/// How one scan tells the sidecar's own sockets and the store's apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ports {
    /// The rendezvous store's ports.
    pub store: Vec<u16>,
    /// The sidecar's own ports.
    pub own: Vec<u16>,
}

/// One scan of the collective of `workers` (the trainer's workers on this
/// pod), from the sockets of this network namespace ([`namespace_sockets`],
/// the pod's) chosen by [`select`]: `ports` are neither the collective's
/// (the store's, the sidecar's own), `peers` the peer pods' addresses this
/// sidecar knows, and the sidecar's own sockets (`/proc/self/fd`, read
/// before and after the dump) are left out. With the workers' torch node
/// rank, when their environment or the agent's node file tells it.
pub fn scan(
    proc_root: &Path,
    workers: &Workers,
    ports: &Ports,
    peers: &BTreeSet<IpAddr>,
) -> (Collective, Option<u32>) {
    if workers.pids.is_empty() {
        return (Collective::Unreadable, None);
    }
    let own_before = socket_inodes(Path::new("/proc"), "self").unwrap_or_default();
    let rows = namespace_sockets();
    let own_after = socket_inodes(Path::new("/proc"), "self").unwrap_or_default();
    let scope = Scope {
        store_ports: ports.store.clone(),
        own_ports: ports.own.clone(),
        own_inodes: own_before.union(&own_after).copied().collect(),
        workers_uids: workers
            .pids
            .iter()
            .filter_map(|&w| process_uid(proc_root, w))
            .collect(),
        worker_inodes: None,
        peers: peers.clone(),
    };
    scan_rows(proc_root, workers, rows.as_deref(), scope)
}

/// [`scan`] over the namespace's sockets `rows` (`None`: not readable),
/// with `scope` (the workers' descriptors and environment are read here).
pub fn scan_rows(
    proc_root: &Path,
    all: &Workers,
    rows: Option<&[SocketRow]>,
    mut scope: Scope,
) -> (Collective, Option<u32>) {
    let workers = all.pids.as_slice();
    if workers.is_empty() {
        return (Collective::Unreadable, None);
    }
    let mut envs: Vec<WorkerEnv> = workers
        .iter()
        .filter(|w| !all.forked.contains(w))
        .filter_map(|&w| worker_env(proc_root, w))
        .collect();
    let torch_rank = envs
        .iter()
        .find_map(|e| e.group_rank)
        .or_else(|| all.agent.as_ref().and_then(|a| a.group_rank));
    // The workers' store is not their collective: the port their
    // environment names, or the one the agent's handler wrote (a root
    // trainer's environment is not readable by another user).
    scope.store_ports.extend(
        envs.iter()
            .chain(all.agent.as_ref())
            .filter_map(|e| e.store_port),
    );
    // Forked workers' world is the agent's round.
    if workers.iter().any(|w| all.forked.contains(w)) {
        envs.extend(all.agent.clone());
    }
    // The workers' own descriptors, when readable: their sockets alone.
    let readable: Vec<BTreeSet<u64>> = workers
        .iter()
        .filter_map(|&w| socket_inodes(proc_root, &w.to_string()))
        .collect();
    if !readable.is_empty() {
        scope.worker_inodes = Some(readable.into_iter().flatten().collect());
    }
    let Some(rows) = rows else {
        return (Collective::Unreadable, torch_rank);
    };
    let chosen = select(rows, &scope);
    let collective = if !chosen.peers.is_empty() {
        let traffic: Traffic = chosen
            .peers
            .iter()
            .filter_map(|(inode, bytes)| Some((*inode, (*bytes)?)))
            .collect();
        Collective::Formed {
            traffic: (!traffic.is_empty()).then_some(traffic),
        }
    } else if !envs.is_empty() && !envs.iter().any(WorkerEnv::expects_peers) {
        Collective::NotExpected
    } else if chosen.any {
        Collective::Forming
    } else if workers
        .iter()
        .any(|&w| torch_loaded(proc_root, w) == Some(true))
    {
        // torch loaded and not yet connected: a script that loads its data
        // before `init_process_group`; waited for like a forming one.
        Collective::Forming
    } else {
        Collective::Unconnected
    };
    (collective, torch_rank)
}

/// The sockets of `pids` (by their readable `/proc/<pid>/fd`) in their
/// namespace's TCP tables: whether any is an established connection;
/// `None` when no descriptor table could be read.
fn connected(proc_root: &Path, pids: &[i32]) -> Option<bool> {
    let mut readable = false;
    for &pid in pids {
        let Some(inodes) = socket_inodes(proc_root, &pid.to_string()) else {
            continue;
        };
        readable = true;
        if inodes.is_empty() {
            continue;
        }
        for table in ["tcp", "tcp6"] {
            let path = proc_root.join(pid.to_string()).join("net").join(table);
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let mut text = String::new();
            use std::io::Read;
            if file.take(4 << 20).read_to_string(&mut text).is_err() {
                continue;
            }
            if parse_tcp_table(&text)
                .iter()
                .any(|r| r.established && inodes.contains(&r.inode))
            {
                return Some(true);
            }
        }
    }
    readable.then_some(false)
}

/// One scan of an agent that runs no workers (`agents`, the trainer's
/// agents on this pod): [`Collective::Unconnected`] only when none holds a
/// TCP connection and none has torch loaded (a stand-in trainer, not
/// torchrun: its start is all there is to see); anything else is
/// [`Collective::Forming`], never training (torchrun's agent in its
/// rendezvous, or waiting as a spare, holds a connection to its store and
/// has torch loaded; one that cannot be read is not taken as training).
pub fn scan_agents(proc_root: &Path, agents: &[i32]) -> Collective {
    match connected(proc_root, agents) {
        Some(false)
            if !agents.is_empty()
                && agents
                    .iter()
                    .all(|&a| torch_loaded(proc_root, a) == Some(false)) =>
        {
            Collective::Unconnected
        }
        _ => Collective::Forming,
    }
}

/// Whether a process has torch's library mapped (`libtorch` in
/// `/proc/<pid>/maps`): torch imported. `None` when the map cannot be read.
pub fn torch_loaded(proc_root: &Path, pid: i32) -> Option<bool> {
    use std::io::BufRead;
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("maps")).ok()?;
    // A large process maps tens of thousands of regions; read 64 MiB at most.
    let reader = std::io::BufReader::new(std::io::Read::take(file, 64 << 20));
    let mut any = false;
    for line in reader.split(b'\n') {
        let line = line.ok()?;
        any = true;
        if line.windows(8).any(|w| w == b"libtorch") {
            return Some(true);
        }
    }
    any.then_some(false)
}

/// Follows one set of workers (their start in clock ticks) from scan to
/// scan to the observation that they train, then keeps it for them:
///
/// - their collective formed, and the last [`STEP_BURSTS`] scans whose
///   connections carried new bytes since (a connection's bytes count from
///   the scan after the one that first saw it) carried alike
///   ([`BURST_LIKENESS`]): the scan that saw the last of them,
///   [`TrainingSeenBy::CollectiveTraffic`];
/// - formed, and no traffic seen in [`TRAFFIC_WAIT`] or none readable:
///   when it formed, [`TrainingSeenBy::CollectiveFormed`];
/// - their sockets unreadable, or no peers expected: their start, once
///   they are up [`TRAINING_SETTLE`], [`TrainingSeenBy::WorkersStarted`];
///   the same after [`UNCONNECTED_WAIT`] without any TCP connection;
/// - still forming: nothing yet.
#[derive(Debug, Default)]
pub struct Watch {
    workers: Option<u64>,
    started: Option<SystemTime>,
    formed_at: Option<SystemTime>,
    last: Option<Traffic>,
    /// The new bytes of the last scans that saw some, oldest first (at
    /// most [`STEP_BURSTS`]).
    bursts: std::collections::VecDeque<u64>,
    seen: Option<(SystemTime, TrainingSeenBy)>,
}

impl Watch {
    /// The observation after this scan: `workers` their start in ticks,
    /// `started` in wall-clock time, `collective` what the scan saw, at
    /// `now`.
    pub fn observe(
        &mut self,
        workers: Option<u64>,
        started: Option<SystemTime>,
        collective: &Collective,
        now: SystemTime,
    ) -> Option<(SystemTime, TrainingSeenBy)> {
        let Some(workers) = workers else {
            // No workers run: nothing to follow.
            *self = Watch::default();
            return None;
        };
        if self.workers != Some(workers) {
            *self = Watch {
                workers: Some(workers),
                ..Watch::default()
            };
        }
        self.started = started.or(self.started);
        if self.seen.is_some() {
            return self.seen;
        }
        // What the collective did, recorded before the settle time is
        // over too (its forming is dated by the first scan that saw it).
        if let Collective::Formed { traffic } = collective {
            self.formed_at.get_or_insert(now);
            if let Some(carried) = traffic {
                if let Some(before) = &self.last {
                    // A connection first seen in this scan (the mesh's
                    // last ones, opened with their handshake) counts from
                    // the next.
                    let (sent, received) = carried
                        .iter()
                        .filter_map(|(inode, now)| Some((now, before.get(inode)?)))
                        .fold((0u64, 0u64), |(s, r), (now, then)| {
                            (
                                s.saturating_add(now.sent.saturating_sub(then.sent)),
                                r.saturating_add(now.received.saturating_sub(then.received)),
                            )
                        });
                    // A burst goes both ways: a step's all-reduce sends
                    // and receives on every pod; a broadcast, and a rank
                    // sending its part of a gather while others have not
                    // come yet, go one way.
                    let grew = sent.min(received);
                    if grew > 0 {
                        if self.bursts.len() == STEP_BURSTS {
                            self.bursts.pop_front();
                        }
                        self.bursts.push_back(grew);
                    }
                }
                self.last = Some(carried.clone());
            }
        }
        let started = started?;
        if now
            .duration_since(started)
            .map_or(true, |up| up < TRAINING_SETTLE)
        {
            return None;
        }
        self.seen = match (collective, self.formed_at) {
            (Collective::Unreadable | Collective::NotExpected, None) => {
                Some((started, TrainingSeenBy::WorkersStarted))
            }
            (Collective::Unconnected, None)
                if now
                    .duration_since(started)
                    .is_ok_and(|up| up >= UNCONNECTED_WAIT) =>
            {
                Some((started, TrainingSeenBy::WorkersStarted))
            }
            (_, None) => None,
            (Collective::Formed { traffic: None }, Some(formed)) => {
                Some((formed, TrainingSeenBy::CollectiveFormed))
            }
            (_, Some(_)) if self.steps_seen() => Some((now, TrainingSeenBy::CollectiveTraffic)),
            (_, Some(formed))
                if now
                    .duration_since(formed)
                    .is_ok_and(|waited| waited >= TRAFFIC_WAIT) =>
            {
                Some((formed, TrainingSeenBy::CollectiveFormed))
            }
            (_, Some(_)) => None,
        };
        self.seen
    }

    /// Whether the last [`STEP_BURSTS`] scans with new bytes carried alike:
    /// training steps, not a start-up's pieces.
    fn steps_seen(&self) -> bool {
        let least = self.bursts.iter().min().copied().unwrap_or(0);
        let most = self.bursts.iter().max().copied().unwrap_or(0);
        self.bursts.len() >= STEP_BURSTS && least.saturating_mul(BURST_LIKENESS) >= most
    }

    /// Whether these workers are not seen training yet, and started less
    /// than `within` before `now`: the scans that count the collective's
    /// bursts should then run at their fast pace (three scans of 2 s would
    /// date training 6 s late).
    pub fn pending(&self, now: SystemTime, within: std::time::Duration) -> bool {
        self.seen.is_none()
            && self
                .started
                .is_some_and(|s| now.duration_since(s).map_or(true, |age| age < within))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    /// A row of the pod's namespace.
    fn row(local: ([u8; 4], u16), remote: ([u8; 4], u16), uid: u32, inode: u64) -> SocketRow {
        SocketRow {
            local: SocketAddr::from(local),
            remote: SocketAddr::from(remote),
            established: true,
            uid,
            inode,
            carried: Some(Carried::each_way(inode * 10)),
        }
    }

    /// This test process's user.
    fn own_uid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").expect("/proc/self").uid()
    }

    const POD: [u8; 4] = [10, 0, 0, 11];
    const PEER: [u8; 4] = [10, 0, 0, 12];
    const HOST: [u8; 4] = [10, 0, 0, 10];
    const ELSEWHERE: [u8; 4] = [192, 0, 2, 7];
    const LO: [u8; 4] = [127, 0, 0, 1];

    /// A pod's namespace as a root trainer beside a root sidecar has it:
    /// every socket owned by UID 0; which are the collective's.
    fn pod_sockets() -> Vec<SocketRow> {
        vec![
            // The workers' gloo connections, both directions of the mesh.
            row((POD, 41000), (PEER, 52000), 0, 1),
            row((POD, 43000), (PEER, 41001), 0, 2),
            // The agent and a worker to the rendezvous store (its port).
            row((POD, 42000), (HOST, 29500), 0, 3),
            row((POD, 42001), (HOST, 29500), 0, 4),
            // The store's own end, on the rendezvous host.
            row((POD, 29500), (PEER, 40000), 0, 5),
            // Loopback between the workers of this pod.
            row((LO, 44000), (LO, 44001), 0, 6),
            // The sidecar: heartbeats out and in (its port), its API
            // connection (its own socket).
            row((POD, 45000), (PEER, 29600), 0, 7),
            row((POD, 29600), (PEER, 46000), 0, 8),
            row((POD, 47000), (ELSEWHERE, 443), 0, 9),
            // Another container of the pod (a log shipper of another user).
            row((POD, 48000), (ELSEWHERE, 9200), 999, 10),
        ]
    }

    fn pod_scope() -> Scope {
        Scope {
            store_ports: vec![29500],
            own_ports: vec![29600],
            own_inodes: BTreeSet::from([9]),
            workers_uids: BTreeSet::from([0]),
            worker_inodes: None,
            peers: BTreeSet::new(),
        }
    }

    /// Owner UID, ports and the sidecar's own sockets leave the gloo
    /// connections alone, with the bytes each carried.
    #[test]
    fn the_collective_is_chosen_among_the_pods_sockets() {
        let rows = pod_sockets();
        let chosen = select(&rows, &pod_scope());
        assert_eq!(
            chosen.peers,
            BTreeMap::from([
                (1, Some(Carried::each_way(10))),
                (2, Some(Carried::each_way(20)))
            ])
        );
        assert!(chosen.any);
        // Without the owner's UID, another container's connection counts
        // as well (nothing tells it apart).
        let anyone = Scope {
            workers_uids: BTreeSet::new(),
            ..pod_scope()
        };
        assert_eq!(
            select(&rows, &anyone)
                .peers
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1, 2, 10]
        );
        // The sidecar's own sockets are never the workers', whatever the user.
        let no_self = Scope {
            own_inodes: BTreeSet::new(),
            ..pod_scope()
        };
        assert_eq!(
            select(&rows, &no_self)
                .peers
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1, 2, 9]
        );
        // Workers of UID 1000: none of these sockets is theirs.
        let other = Scope {
            workers_uids: BTreeSet::from([1000]),
            ..pod_scope()
        };
        assert_eq!(select(&rows, &other), Chosen::default());
        // The workers' descriptors readable: their own sockets alone.
        let readable = Scope {
            worker_inodes: Some(BTreeSet::from([2, 4])),
            ..pod_scope()
        };
        let chosen = select(&rows, &readable);
        assert_eq!(
            chosen.peers,
            BTreeMap::from([(2, Some(Carried::each_way(20)))])
        );
        assert!(chosen.any);
        // Only the store and the loopback: forming, not formed.
        let forming = Scope {
            worker_inodes: Some(BTreeSet::from([4, 6])),
            ..pod_scope()
        };
        let chosen = select(&rows, &forming);
        assert!(chosen.peers.is_empty() && chosen.any);
        // Nothing of theirs at all.
        assert!(!select(&[], &pod_scope()).any);
        // Not established: never.
        let closing = SocketRow {
            established: false,
            ..row((POD, 41000), (PEER, 52000), 0, 1)
        };
        assert_eq!(select(&[closing], &pod_scope()), Chosen::default());
    }

    /// With a peer pod it knows among them, the connections to it alone: a
    /// service the workers also talk to is not their collective; to no
    /// known peer at all, every candidate.
    #[test]
    fn known_peer_pods_are_preferred() {
        let mut rows = pod_sockets();
        rows.push(row((POD, 49000), (ELSEWHERE, 8080), 0, 11));
        let known = Scope {
            peers: BTreeSet::from([IpAddr::from(PEER)]),
            ..pod_scope()
        };
        assert_eq!(
            select(&rows, &known)
                .peers
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1, 2]
        );
        let unknown = Scope {
            peers: BTreeSet::from([IpAddr::from([10, 0, 0, 99])]),
            ..pod_scope()
        };
        assert_eq!(
            select(&rows, &unknown)
                .peers
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![1, 2, 11]
        );
        // An IPv4 peer seen through a dual-stack socket is the same peer.
        let mapped = SocketRow {
            remote: SocketAddr::new(
                std::net::Ipv4Addr::from(PEER).to_ipv6_mapped().into(),
                52000,
            ),
            ..row((POD, 41000), (PEER, 52000), 0, 12)
        };
        assert_eq!(
            select(&[mapped], &known)
                .peers
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            vec![12]
        );
    }

    #[test]
    fn the_owner_of_a_process_is_read_from_its_status() {
        let status = "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(parse_status_uid(status), Some(1000));
        assert_eq!(parse_status_uid("Uid:\t0\t0\t0\t4\n"), Some(4), "fs UID");
        assert_eq!(parse_status_uid("Uid:\t0\t0\n"), None);
        assert_eq!(parse_status_uid("Name: x\n"), None);
        let me = std::process::id() as i32;
        assert_eq!(process_uid(Path::new("/proc"), me), Some(own_uid()));
        assert_eq!(process_uid(Path::new("/proc"), i32::MAX), None);
    }

    /// A real connection of this process, seen through the namespace's
    /// sockets with its owner, ends and the bytes it carried both ways;
    /// the scan over them finds it for this process as the worker, and
    /// leaves it out as the sidecar's own.
    #[test]
    fn the_namespace_sockets_show_a_real_connection() {
        use std::io::{Read, Write};
        // A non-loopback address of this host, when there is one (the
        // collective never runs over the loopback).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        let local = client.local_addr().expect("local");
        let remote = listener.local_addr().expect("listener");
        let find = || -> Option<SocketRow> {
            namespace_sockets()?
                .into_iter()
                .find(|r| r.local == local && r.remote == remote)
        };
        let found = find().expect("the connection in the namespace's sockets");
        assert!(found.established);
        assert_eq!(found.uid, own_uid());
        let mine = socket_inodes(Path::new("/proc"), "self").expect("own fds");
        assert!(mine.contains(&found.inode), "{found:?}");
        let before = found.carried.expect("tcp_info bytes");
        assert!(before.sent <= 1 && before.received <= 1, "{before:?}");
        let after = Carried {
            sent: before.sent + 5000,
            received: before.received + 300,
        };
        client.write_all(&[7u8; 5000]).expect("write");
        let mut got = vec![0u8; 5000];
        server.read_exact(&mut got).expect("read");
        server.write_all(&[1u8; 300]).expect("reply");
        let mut reply = vec![0u8; 300];
        client.read_exact(&mut reply).expect("read reply");
        // The acknowledgement of the last bytes may trail the read.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let carried = loop {
            let c = find().and_then(|r| r.carried);
            if c == Some(after) || std::time::Instant::now() > deadline {
                break c;
            }
            std::thread::yield_now();
        };
        assert_eq!(carried, Some(after));
        // This process as the worker, its connection not on the loopback
        // (as a peer pod's would be): formed, with its traffic.
        let me = std::process::id() as i32;
        let rows: Vec<SocketRow> = namespace_sockets()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.inode == found.inode)
            .map(|r| SocketRow {
                remote: SocketAddr::from((PEER, r.remote.port())),
                local: SocketAddr::from((POD, r.local.port())),
                ..r
            })
            .collect();
        let (collective, _) = scan_rows(
            Path::new("/proc"),
            &Workers::plain(vec![me]),
            Some(&rows),
            Scope::default(),
        );
        assert_eq!(
            collective,
            Collective::Formed {
                traffic: Some(BTreeMap::from([(found.inode, after)]))
            }
        );
        // The same connection as the sidecar's own: nothing of the workers'.
        let own = Scope {
            own_inodes: mine,
            ..Scope::default()
        };
        let (collective, _) = scan_rows(
            Path::new("/proc"),
            &Workers::plain(vec![me]),
            Some(&rows),
            own,
        );
        assert_eq!(
            collective,
            Collective::NotExpected,
            "no torchrun variables here"
        );
        // No workers, or no sockets to see: unreadable.
        assert_eq!(
            scan_rows(
                Path::new("/proc"),
                &Workers::default(),
                Some(&rows),
                Scope::default()
            )
            .0,
            Collective::Unreadable
        );
        assert_eq!(
            scan_rows(
                Path::new("/proc"),
                &Workers::plain(vec![me]),
                None,
                Scope::default()
            )
            .0,
            Collective::Unreadable
        );
    }

    /// torch's library in a process's map; this test process has none.
    #[test]
    fn torch_is_seen_loaded_from_the_process_map() {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |pid: i32, text: &str| {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("maps"), text).expect("write");
        };
        write(
            1,
            "7f00-7f10 r-xp 0 08:01 12 /usr/lib/python3/site-packages/torch/lib/libtorch_cpu.so\n",
        );
        write(
            2,
            "7f00-7f10 r-xp 0 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n",
        );
        write(3, "");
        assert_eq!(torch_loaded(root.path(), 1), Some(true));
        assert_eq!(torch_loaded(root.path(), 2), Some(false));
        assert_eq!(torch_loaded(root.path(), 3), None);
        assert_eq!(torch_loaded(root.path(), 4), None);
        let me = std::process::id() as i32;
        assert_eq!(torch_loaded(Path::new("/proc"), me), Some(false));
        // This process holds no TCP connection here and has no torch: a
        // stand-in for an agent that is not torchrun.
        assert_eq!(
            scan_agents(Path::new("/proc"), &[me]),
            Collective::Unconnected
        );
        // Unreadable or absent: never taken as training.
        assert_eq!(
            scan_agents(Path::new("/proc"), &[i32::MAX]),
            Collective::Forming
        );
        assert_eq!(scan_agents(Path::new("/proc"), &[]), Collective::Forming);
    }

    #[test]
    fn what_torchrun_tells_a_worker_decides_whether_it_has_peers() {
        let env = |text: &str| WorkerEnv::parse(text.replace(' ', "\0").as_bytes());
        let two_nodes = env(
            "MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=1",
        );
        assert!(two_nodes.expects_peers());
        assert_eq!(two_nodes.group_rank, Some(1));
        let one_node =
            env("MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2");
        assert!(!one_node.expects_peers());
        // Sizes unknown: peers presumed.
        assert!(env("MASTER_ADDR=h MASTER_PORT=1").expects_peers());
        // Not torchrun's workers (a launcher of another kind).
        assert!(!env("PATH=/bin HOME=/root").expects_peers());
        assert!(!env("MASTER_ADDR= MASTER_PORT=29500 WORLD_SIZE=8").expects_peers());
        assert!(env("TF_CONFIG={}").expects_peers());
        // Bytes that are not text, names without values: no panic.
        let odd = WorkerEnv::parse(b"\xff\xfe=\x00GROUP_RANK\x00=\x00WORLD_SIZE=\xff");
        assert_eq!(odd, WorkerEnv::default());
    }

    /// New workers (another start) are watched afresh; what was seen for
    /// the old ones is kept for them until then.
    #[test]
    fn the_watch_follows_one_set_of_workers() {
        use std::time::Duration;
        let t = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s);
        let mut w = Watch::default();
        assert_eq!(w.observe(None, None, &Collective::Unreadable, t(0)), None);
        let seen = w.observe(Some(100), Some(t(1)), &Collective::Unreadable, t(3));
        assert_eq!(seen, Some((t(1), TrainingSeenBy::WorkersStarted)));
        // Still these workers: kept, whatever the scan.
        assert_eq!(
            w.observe(Some(100), Some(t(1)), &Collective::Forming, t(4)),
            seen
        );
        // New workers, still forming: nothing.
        assert_eq!(
            w.observe(Some(900), Some(t(9)), &Collective::Forming, t(11)),
            None
        );
        // Given torchrun's variables but connected to nothing, not even the
        // store (a stand-in trainer): their start, after the wait.
        let mut u = Watch::default();
        assert_eq!(
            u.observe(Some(7), Some(t(0)), &Collective::Unconnected, t(2)),
            None
        );
        let wait = t(0) + UNCONNECTED_WAIT;
        assert_eq!(
            u.observe(Some(7), Some(t(0)), &Collective::Unconnected, wait),
            Some((t(0), TrainingSeenBy::WorkersStarted))
        );
        // Connected to the store, waiting for peers that do not come: never.
        let mut f = Watch::default();
        assert_eq!(
            f.observe(Some(7), Some(t(0)), &Collective::Forming, t(600)),
            None
        );
        // No workers: nothing followed, nothing pending.
        assert_eq!(w.observe(None, None, &Collective::Forming, t(12)), None);
        assert!(!w.pending(t(12), Duration::from_secs(300)));
        assert_eq!(
            w.observe(Some(901), Some(t(12)), &Collective::Forming, t(14)),
            None
        );
        assert!(w.pending(t(14), Duration::from_secs(300)));
        assert!(!w.pending(t(312), Duration::from_secs(300)), "given up");
        // Formed before their settle time is over: dated from that scan.
        let mut w = Watch::default();
        let formed = Collective::Formed { traffic: None };
        assert_eq!(w.observe(Some(5), Some(t(20)), &formed, t(20)), None);
        assert_eq!(
            w.observe(Some(5), Some(t(20)), &formed, t(22)),
            Some((t(20), TrainingSeenBy::CollectiveFormed))
        );
        assert!(!w.pending(t(22), Duration::from_secs(300)), "seen");
    }

    proptest::proptest! {
        /// A start-up sends its pieces one way (bytes each: a broadcast, a
        /// rank's part of a gather while others have not come) in any
        /// number of scans, apart or not, and small ones both ways (the
        /// gather's completion, in one scan or two); then steps both ways,
        /// one or two a scan: training is seen at the third step's scan,
        /// never during the start-up.
        #[test]
        fn a_start_up_in_pieces_is_not_training_and_steps_are(
            pieces in proptest::collection::vec((1u64..2_000, proptest::prelude::any::<bool>(), proptest::prelude::any::<bool>()), 0..12),
            completion in proptest::collection::vec(1u64..2_000, 0..3),
            step in 20_000u64..50_000_000,
            per_scan in proptest::collection::vec(1u64..3, 3),
        ) {
            let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
            let mut w = Watch::default();
            let mut now = start + TRAINING_SETTLE;
            let mut carried = Carried::each_way(100);
            let scan = |w: &mut Watch, carried: Carried, now: SystemTime| {
                let c = Collective::Formed { traffic: Some(BTreeMap::from([(1, carried)])) };
                w.observe(Some(1), Some(start), &c, now)
            };
            let tick = std::time::Duration::from_millis(250);
            proptest::prop_assert_eq!(scan(&mut w, carried, now), None);
            for (bytes, sent, quiet_after) in pieces {
                now += tick;
                if sent {
                    carried.sent += bytes;
                } else {
                    carried.received += bytes;
                }
                proptest::prop_assert_eq!(scan(&mut w, carried, now), None);
                if quiet_after {
                    now += tick;
                    proptest::prop_assert_eq!(scan(&mut w, carried, now), None);
                }
            }
            for bytes in completion {
                now += tick;
                carried.sent += bytes;
                carried.received += bytes;
                proptest::prop_assert_eq!(scan(&mut w, carried, now), None);
            }
            for (i, n) in per_scan.iter().enumerate() {
                now += tick;
                carried.sent += step * n;
                carried.received += step * n;
                let seen = scan(&mut w, carried, now);
                if i + 1 < STEP_BURSTS {
                    proptest::prop_assert_eq!(seen, None);
                } else {
                    proptest::prop_assert_eq!(seen, Some((now, TrainingSeenBy::CollectiveTraffic)));
                }
            }
        }

        /// Arbitrary environments and scan sequences: no panic, and what
        /// the watch says is never before the workers started.
        #[test]
        fn the_watch_never_dates_training_before_the_workers_started(
            env in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            scans in proptest::collection::vec((0u8..4, 0u64..1000, 0u64..5), 0..40),
        ) {
            let _ = WorkerEnv::parse(&env).expects_peers();
            let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
            let mut w = Watch::default();
            let mut now = start;
            for (kind, bytes, step) in scans {
                now += std::time::Duration::from_millis(500 * step);
                let c = match kind {
                    0 => Collective::Unreadable,
                    1 => Collective::NotExpected,
                    2 => Collective::Forming,
                    3 if bytes % 2 == 0 => Collective::Unconnected,
                    _ => Collective::Formed { traffic: Some(BTreeMap::from([(1, Carried::each_way(bytes))])) },
                };
                if let Some((at, _)) = w.observe(Some(1), Some(start), &c, now) {
                    proptest::prop_assert!(at >= start && at <= now);
                }
            }
        }
    }

    #[test]
    fn the_group_rank_comes_from_the_workers_environment() {
        let group_rank = |root: &Path, pid| worker_env(root, pid).and_then(|e| e.group_rank);
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("42");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("environ"),
            b"PATH=/bin\0GROUP_RANK=3\0LOCAL_RANK=0\0",
        )
        .expect("write");
        assert_eq!(group_rank(root.path(), 42), Some(3));
        std::fs::write(dir.join("environ"), b"GROUP_RANK=x\0").expect("write");
        assert_eq!(group_rank(root.path(), 42), None);
        assert_eq!(group_rank(root.path(), 43), None);
    }

    /// Forkserver children carry the forkserver's environment (the agent's,
    /// without torchrun's per-worker variables): it is never taken for
    /// theirs; the agent's node file tells their rank and world instead.
    #[test]
    fn forked_workers_take_their_world_from_the_agents_node_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let forkserver_env = b"PATH=/bin\0PET_NNODES=2\0OMP_NUM_THREADS=1\0";
        for pid in [42, 43] {
            let dir = root.path().join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("environ"), forkserver_env).expect("write");
        }
        let node = crate::rendezvous::AgentNode {
            pid: 7,
            pid_start_ticks: 1,
            round: Some(2),
            group_rank: Some(1),
            world_size: Some(2),
            fast: true,
            workers_store_port: None,
        };
        let rows: Vec<SocketRow> = Vec::new();
        let forked = Workers {
            pids: vec![42, 43],
            forked: [42, 43].into(),
            agent: Some(WorkerEnv::of_agent(&node)),
        };
        // Two nodes: peers expected, the collective is awaited (read as
        // its own, the forkserver's environment would say no peers).
        let (collective, rank) = scan_rows(root.path(), &forked, Some(&rows), Scope::default());
        assert_eq!(rank, Some(1));
        assert_ne!(collective, Collective::NotExpected);
        let (collective, _) = scan_rows(
            root.path(),
            &Workers::plain(vec![42, 43]),
            Some(&rows),
            Scope::default(),
        );
        assert_eq!(collective, Collective::NotExpected, "read as their own");
        // A round of one node: none expected.
        let alone = Workers {
            agent: Some(WorkerEnv::of_agent(&crate::rendezvous::AgentNode {
                world_size: Some(1),
                group_rank: Some(0),
                ..node.clone()
            })),
            ..forked.clone()
        };
        let (collective, rank) = scan_rows(root.path(), &alone, Some(&rows), Scope::default());
        assert_eq!((collective, rank), (Collective::NotExpected, Some(0)));
        // No node file: nothing known, nothing guessed.
        let unknown = Workers {
            agent: None,
            ..forked
        };
        let (collective, rank) = scan_rows(root.path(), &unknown, Some(&rows), Scope::default());
        assert_eq!(rank, None);
        assert_ne!(collective, Collective::NotExpected);
        // Popen workers whose environment is unreadable (another user):
        // the rank is the agent's.
        let unreadable = Workers {
            pids: vec![44],
            forked: BTreeSet::new(),
            agent: Some(WorkerEnv::of_agent(&node)),
        };
        assert_eq!(
            scan_rows(root.path(), &unreadable, Some(&rows), Scope::default()).1,
            Some(1)
        );
    }

    /// The store the workers' process group meets at (node rank 0's
    /// agent serves it on a free port, in another pod for the others)
    /// carries requests and answers both ways from before the collective
    /// forms: by the port their environment names, or the agent's handler
    /// wrote when their environment is not readable, it is left out.
    #[test]
    fn the_workers_store_is_not_their_collective() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("42");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("environ"),
            b"MASTER_ADDR=train-0\0MASTER_PORT=41234\0WORLD_SIZE=4\0LOCAL_WORLD_SIZE=2\0",
        )
        .expect("write");
        let gloo = row((POD, 41000), (PEER, 52000), 0, 1);
        let store = row((POD, 43000), (PEER, 41234), 0, 2);
        let node = crate::rendezvous::AgentNode {
            pid: 7,
            pid_start_ticks: 1,
            round: Some(1),
            group_rank: Some(1),
            world_size: Some(2),
            fast: true,
            workers_store_port: Some(41234),
        };
        let readable = Workers::plain(vec![42]);
        // Environment unreadable (a root trainer, another user's sidecar).
        let unreadable = Workers {
            pids: vec![44],
            forked: BTreeSet::new(),
            agent: Some(WorkerEnv::of_agent(&node)),
        };
        for workers in [&readable, &unreadable] {
            let scan = |rows: &[SocketRow]| {
                scan_rows(root.path(), workers, Some(rows), Scope::default()).0
            };
            assert_eq!(
                scan(std::slice::from_ref(&store)),
                Collective::Forming,
                "{workers:?}"
            );
            assert_eq!(
                scan(&[gloo.clone(), store.clone()]),
                Collective::Formed {
                    traffic: Some(BTreeMap::from([(1, Carried::each_way(10))]))
                },
                "{workers:?}"
            );
        }
        // Neither tells it: the store's connection is taken for the
        // collective's (torch's own handler, a root trainer).
        let untold = Workers {
            agent: Some(WorkerEnv::of_agent(&crate::rendezvous::AgentNode {
                workers_store_port: None,
                ..node
            })),
            ..unreadable
        };
        assert_eq!(
            scan_rows(
                root.path(),
                &untold,
                Some(std::slice::from_ref(&store)),
                Scope::default()
            )
            .0,
            Collective::Formed {
                traffic: Some(BTreeMap::from([(2, Carried::each_way(20))]))
            }
        );
    }

    #[test]
    fn a_worker_whose_parent_is_not_its_agent_is_forked() {
        let p = |pid, ppid| crate::signal::Process {
            pid,
            ppid,
            start_ticks: 1,
            argv: vec!["python3".into()],
        };
        let trainer = crate::signal::Trainer {
            agent: p(10, 1),
            workers: vec![p(11, 10), p(13, 12)],
            below_workers: vec![p(12, 10)],
        };
        let w = Workers::of(&[trainer], None);
        assert_eq!(w.pids, vec![11, 13]);
        assert_eq!(w.forked, [13].into());
        assert_eq!(w.agent, None);
    }

    proptest::proptest! {

        /// What is chosen is always among the rows: established, the
        /// workers' (by owner and descriptors), never the sidecar's own,
        /// never on the loopback or a store or sidecar port.
        #[test]
        fn the_choice_keeps_to_its_rules(
            rows in proptest::collection::vec(
                (proptest::prelude::any::<bool>(), 0u8..4, 0u8..4, 0u16..6, 0u16..6, 0u32..3, 0u64..12),
                0..24,
            ),
            own in proptest::collection::btree_set(0u64..12, 0..4),
            uids in proptest::collection::btree_set(0u32..3, 0..2),
            inodes in proptest::option::of(proptest::collection::btree_set(0u64..12, 0..6)),
            known in proptest::collection::btree_set(0u8..4, 0..2),
        ) {
            let ip = |i: u8| -> IpAddr { if i == 0 { IpAddr::from(LO) } else { IpAddr::from([10, 0, 0, i]) } };
            let port = |p: u16| 29_500 + p * 50;
            let rows: Vec<SocketRow> = rows
                .into_iter()
                .map(|(established, l, r, lp, rp, uid, inode)| SocketRow {
                    local: SocketAddr::new(ip(l), port(lp)),
                    remote: SocketAddr::new(ip(r), port(rp)),
                    established,
                    uid,
                    inode,
                    carried: Some(Carried::each_way(inode)),
                })
                .collect();
            let scope = Scope {
                store_ports: vec![port(0)],
                own_ports: vec![port(2)],
                own_inodes: own,
                workers_uids: uids,
                worker_inodes: inodes,
                peers: known.into_iter().map(ip).collect(),
            };
            let chosen = select(&rows, &scope);
            for inode in chosen.peers.keys() {
                let ok = rows.iter().any(|r| {
                    r.inode == *inode
                        && r.established
                        && !scope.own_inodes.contains(inode)
                        && (scope.workers_uids.is_empty() || scope.workers_uids.contains(&r.uid))
                        && scope.worker_inodes.as_ref().is_none_or(|w| w.contains(inode))
                        && !r.remote.ip().is_loopback()
                        && ![r.local.port(), r.remote.port()].iter().any(|p| *p == port(0) || *p == port(2))
                });
                proptest::prop_assert!(ok, "{inode} chosen against the rules");
            }
            proptest::prop_assert!(chosen.peers.is_empty() || chosen.any);
        }
    }
}
