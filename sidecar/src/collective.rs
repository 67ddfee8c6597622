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
//! Read from `/proc/<pid>/fd` (the worker's sockets, by inode),
//! `/proc/<pid>/net/tcp{,6}` (its network namespace's TCP table),
//! `/proc/<pid>/environ` (what torchrun told it of its world) and the
//! kernel's socket diagnostics (`sock_diag`, what `ss -i` reads: the bytes
//! each connection carried). A connection to the rendezvous store (its
//! port) or to the loopback does not count: every agent and worker talks to
//! the store before its peers.
//!
//! [`Watch`] turns the scans into the one observation that training runs,
//! with what it was seen by ([`TrainingSeenBy`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::SystemTime;

use trainwire_contract::peer_loss::{
    STEP_BURSTS, TRAFFIC_WAIT, TRAINING_SETTLE, TrainingSeenBy, UNCONNECTED_WAIT,
};

/// One row of `/proc/net/tcp{,6}`: its remote end and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRow {
    pub remote: std::net::IpAddr,
    pub remote_port: u16,
    pub established: bool,
    pub inode: u64,
}

/// The rows of a `/proc/net/tcp` or `/proc/net/tcp6` text; lines that do
/// not parse are skipped.
pub fn parse_tcp_table(text: &str) -> Vec<TcpRow> {
    text.lines().skip(1).filter_map(parse_row).collect()
}

fn parse_row(line: &str) -> Option<TcpRow> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    let (addr, port) = fields.get(2)?.split_once(':')?;
    let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some(TcpRow {
        remote: parse_addr(addr)?,
        remote_port: u16::from_str_radix(port, 16).ok()?,
        established: state == 0x01,
        inode,
    })
}

/// An address as the kernel prints it: 32-bit words in host byte order
/// (little-endian here), in hex.
fn parse_addr(hex: &str) -> Option<std::net::IpAddr> {
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_le_bytes())
    };
    match hex.len() {
        8 => Some(std::net::Ipv4Addr::from(word(0)?).into()),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = std::net::Ipv6Addr::from(bytes);
            Some(match v6.to_ipv4_mapped() {
                Some(v4) => v4.into(),
                None => v6.into(),
            })
        }
        _ => None,
    }
}

/// Whether `row` is a connection to a peer: established, not to the
/// loopback, not to one of `store_ports`.
pub fn is_peer(row: &TcpRow, store_ports: &[u16]) -> bool {
    row.established && !row.remote.is_loopback() && !store_ports.contains(&row.remote_port)
}

/// The socket inodes among `/proc/<pid>/fd`; `None` when the directory
/// cannot be read (another user's process without `CAP_SYS_PTRACE`).
fn socket_inodes(proc_root: &Path, pid: i32) -> Option<BTreeSet<u64>> {
    let dir = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")).ok()?;
    Some(
        dir.flatten()
            // A process has at most a few thousand descriptors; bounded anyway.
            .take(65_536)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|target| {
                target
                    .to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect(),
    )
}

/// The sockets of `workers` that are connections to a peer ([`is_peer`]),
/// by inode (empty when none is), and whether they hold any established TCP
/// connection at all (to the store, the loopback too); `None` when no
/// worker's sockets could be read.
fn connections(
    proc_root: &Path,
    workers: &[i32],
    store_ports: &[u16],
) -> Option<(BTreeSet<u64>, bool)> {
    let mut readable = false;
    let mut any = false;
    let mut peers = BTreeSet::new();
    for &pid in workers {
        let Some(inodes) = socket_inodes(proc_root, pid) else {
            continue;
        };
        readable = true;
        if inodes.is_empty() {
            continue;
        }
        for table in ["tcp", "tcp6"] {
            let path = proc_root.join(pid.to_string()).join("net").join(table);
            // The table of a namespace with many connections is large;
            // read at most 4 MiB of it.
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let mut text = String::new();
            use std::io::Read;
            if file.take(4 << 20).read_to_string(&mut text).is_err() {
                continue;
            }
            for row in parse_tcp_table(&text)
                .iter()
                .filter(|r| inodes.contains(&r.inode) && r.established)
            {
                any = true;
                if is_peer(row, store_ports) {
                    peers.insert(row.inode);
                }
            }
        }
    }
    readable.then_some((peers, any))
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
                b"MASTER_PORT" => port = !value.is_empty(),
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

/// A worker's environment; `None` when it cannot be read.
pub fn worker_env(proc_root: &Path, pid: i32) -> Option<WorkerEnv> {
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("environ")).ok()?;
    let mut bytes = Vec::new();
    use std::io::Read;
    // A process environment is bounded by the kernel's ARG_MAX; read 1 MiB.
    file.take(1 << 20).read_to_end(&mut bytes).ok()?;
    Some(WorkerEnv::parse(&bytes))
}

/// The bytes each of `inodes` carried, sent and acknowledged plus
/// received (`tcpi_bytes_acked + tcpi_bytes_received`), from the kernel's
/// socket diagnostics of this network namespace (the pod's, shared by the
/// sidecar and the trainer; no privilege needed). `None` when the kernel
/// does not answer or none of `inodes` is in this namespace.
pub fn traffic(inodes: &BTreeSet<u64>) -> Option<BTreeMap<u64, u64>> {
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6};
    let mut carried = BTreeMap::new();
    for family in [AF_INET, AF_INET6] {
        diag::dump(family, inodes, &mut carried).ok()?;
    }
    (!carried.is_empty()).then_some(carried)
}

mod diag {
    //! One `SOCK_DIAG_BY_FAMILY` dump of the established TCP sockets of a
    //! family, with their `tcp_info`.
    use std::collections::{BTreeMap, BTreeSet};

    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_sock_diag::{
        SockDiagMessage,
        constants::IPPROTO_TCP,
        inet::{ExtensionFlags, InetRequest, SocketId, StateFlags, nlas::Nla},
    };
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

    /// Offsets in `struct tcp_info` (linux/tcp.h) of `tcpi_bytes_acked`
    /// and `tcpi_bytes_received` (Linux 4.1 and later), both `__u64`.
    const BYTES_ACKED: usize = 120;
    const BYTES_RECEIVED: usize = 128;
    /// Bounds on one dump: datagrams read and bytes in all.
    const MAX_DATAGRAMS: usize = 4096;
    const MAX_BYTES: usize = 64 << 20;

    pub fn dump(
        family: u8,
        inodes: &BTreeSet<u64>,
        carried: &mut BTreeMap<u64, u64>,
    ) -> std::io::Result<()> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut packet = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: StateFlags::ESTABLISHED,
                socket_id: if family == netlink_packet_sock_diag::constants::AF_INET6 {
                    SocketId::new_v6()
                } else {
                    SocketId::new_v4()
                },
            })
            .into(),
        );
        packet.finalize();
        let mut request = vec![0; packet.buffer_len()];
        packet.serialize(&mut request[..]);
        socket.send(&request, 0)?;
        let mut total = 0usize;
        for _ in 0..MAX_DATAGRAMS {
            let (datagram, _) = socket.recv_from_full()?;
            total += datagram.len();
            if datagram.is_empty() || total > MAX_BYTES {
                return Ok(());
            }
            let mut offset = 0;
            while offset < datagram.len() {
                let Ok(message) =
                    NetlinkMessage::<SockDiagMessage>::deserialize(&datagram[offset..])
                else {
                    return Ok(());
                };
                let length = message.header.length as usize;
                match message.payload {
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                        let inode = u64::from(response.header.inode);
                        if inodes.contains(&inode) {
                            let info = response.nlas.iter().find_map(|nla| match nla {
                                Nla::TcpInfo(bytes) => Some(bytes),
                                _ => None,
                            });
                            if let Some(bytes) = info.and_then(|b| carried_bytes(b)) {
                                carried.insert(inode, bytes);
                            }
                        }
                    }
                    NetlinkPayload::Done(_) | NetlinkPayload::Error(_) => return Ok(()),
                    _ => {}
                }
                if length == 0 {
                    return Ok(());
                }
                offset += length;
            }
        }
        Ok(())
    }

    /// `tcpi_bytes_acked + tcpi_bytes_received` of a `tcp_info`; `None`
    /// from a kernel older than the fields.
    pub fn carried_bytes(info: &[u8]) -> Option<u64> {
        let field = |at: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(info.get(at..at + 8)?.try_into().ok()?))
        };
        Some(field(BYTES_ACKED)?.saturating_add(field(BYTES_RECEIVED)?))
    }
}

/// What one scan saw of the workers' collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Collective {
    /// No worker runs, or their sockets could not be read.
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
    Formed { traffic: Option<BTreeMap<u64, u64>> },
}

/// One scan of the collective of `workers` (the trainer's workers on this
/// pod); the rendezvous store's `store_ports` are not peers. With the
/// workers' torch node rank, when readable.
pub fn scan(proc_root: &Path, workers: &[i32], store_ports: &[u16]) -> (Collective, Option<u32>) {
    if workers.is_empty() {
        return (Collective::Unreadable, None);
    }
    let envs: Vec<WorkerEnv> = workers
        .iter()
        .filter_map(|&w| worker_env(proc_root, w))
        .collect();
    let torch_rank = envs.iter().find_map(|e| e.group_rank);
    let collective = match connections(proc_root, workers, store_ports) {
        None => Collective::Unreadable,
        Some((peers, _)) if !peers.is_empty() => Collective::Formed {
            traffic: traffic(&peers),
        },
        Some(_) if !envs.is_empty() && !envs.iter().any(WorkerEnv::expects_peers) => {
            Collective::NotExpected
        }
        Some((_, true)) => Collective::Forming,
        // torch loaded and not yet connected: a script that loads its data
        // before `init_process_group`; waited for like a forming one.
        Some((_, false))
            if workers
                .iter()
                .any(|&w| torch_loaded(proc_root, w) == Some(true)) =>
        {
            Collective::Forming
        }
        Some((_, false)) => Collective::Unconnected,
    };
    (collective, torch_rank)
}

/// One scan of an agent that runs no workers (`agents`, the trainer's
/// agents on this pod): [`Collective::Unconnected`] only when none holds a
/// TCP connection and none has torch loaded (a stand-in trainer, not
/// torchrun: its start is all there is to see); anything else is
/// [`Collective::Forming`], never training (torchrun's agent in its
/// rendezvous, or waiting as a spare, holds a connection to its store and
/// has torch loaded; one that cannot be read is not taken as training).
pub fn scan_agents(proc_root: &Path, agents: &[i32]) -> Collective {
    match connections(proc_root, agents, &[]) {
        Some((_, false))
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
/// - their collective formed and its connections carried new traffic in
///   [`STEP_BURSTS`] scans after the one that saw it form: the scan that
///   saw the last burst, [`TrainingSeenBy::CollectiveTraffic`];
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
    last: Option<BTreeMap<u64, u64>>,
    bursts: u32,
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
                    let grew = carried
                        .iter()
                        .any(|(inode, bytes)| before.get(inode).map_or(*bytes > 0, |b| bytes > b));
                    self.bursts += u32::from(grew);
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
            (_, Some(_)) if self.bursts >= STEP_BURSTS => {
                Some((now, TrainingSeenBy::CollectiveTraffic))
            }
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

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7468 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0B004D0A:9C40 0A004D0A:7468 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 20 4 30 10 -1
   2: 0B004D0A:9C42 0A004D0A:D431 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:9C44 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 20 4 30 10 -1
   4: 0B004D0A:9C46 0A004D0A:D432 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn the_tcp_table_reads_as_the_kernel_writes_it() {
        let rows = parse_tcp_table(TCP);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[1].remote, std::net::Ipv4Addr::new(10, 77, 0, 10));
        assert_eq!(rows[1].remote_port, 29800);
        assert!(rows[1].established);
        assert_eq!(rows[1].inode, 1002);
        assert!(!rows[0].established);
        assert!(!rows[4].established, "TIME_WAIT");
        // Store port 29800 (0x7468) excluded; the loopback too.
        let peers: Vec<u64> = rows
            .iter()
            .filter(|r| is_peer(r, &[29800]))
            .map(|r| r.inode)
            .collect();
        assert_eq!(peers, vec![1003]);
    }

    #[test]
    fn ipv6_and_v4_mapped_addresses() {
        // ::ffff:10.77.0.10 and ::1, as /proc/net/tcp6 prints them.
        let mapped = parse_addr("0000000000000000FFFF00000A004D0A").expect("mapped");
        assert_eq!(mapped, std::net::IpAddr::from([10, 77, 0, 10]));
        let lo = parse_addr("00000000000000000000000001000000").expect("::1");
        assert!(lo.is_loopback());
        assert_eq!(parse_addr("zz"), None);
        assert_eq!(parse_row("garbage"), None);
    }

    /// This test process's own connection to a listener on the loopback is
    /// not a peer; the scan reads this process's fds.
    #[test]
    fn a_process_without_peer_connections_is_not_connected() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let _c =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let me = std::process::id() as i32;
        assert_eq!(
            connections(Path::new("/proc"), &[me], &[]),
            Some((BTreeSet::new(), true))
        );
        // No such process: nothing readable.
        assert_eq!(connections(Path::new("/proc"), &[i32::MAX], &[]), None);
        assert_eq!(
            scan(Path::new("/proc"), &[i32::MAX], &[]),
            (Collective::Unreadable, None)
        );
        assert_eq!(
            scan(Path::new("/proc"), &[], &[]),
            (Collective::Unreadable, None)
        );
    }

    /// The kernel's socket diagnostics count what a real connection of this
    /// process carried, both ways, by the socket's inode.
    #[test]
    fn the_traffic_of_a_connection_is_read_from_the_kernel() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        let inode = |fd: i32| -> u64 {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).expect("fd link");
            link.to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|l| l.parse().ok())
                .expect("a socket inode")
        };
        let ino = inode(client.as_raw_fd());
        let mine = BTreeSet::from([ino]);
        // A new connection: its handshake only (the client's SYN counts
        // as one byte acknowledged).
        let before = traffic(&mine)
            .and_then(|t| t.get(&ino).copied())
            .expect("the connection's counters");
        assert!(before <= 1, "{before}");
        client.write_all(&[7u8; 5000]).expect("write");
        let mut got = vec![0u8; 5000];
        server.read_exact(&mut got).expect("read");
        server.write_all(&[1u8; 300]).expect("reply");
        let mut reply = vec![0u8; 300];
        client.read_exact(&mut reply).expect("read reply");
        // The acknowledgement of the last bytes may trail the read.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let carried = loop {
            let c = traffic(&mine).and_then(|t| t.get(&ino).copied());
            if c == Some(before + 5300) || std::time::Instant::now() > deadline {
                break c;
            }
            std::thread::yield_now();
        };
        assert_eq!(carried, Some(before + 5300));
        // Inodes not in this namespace's TCP table: nothing to say.
        assert_eq!(traffic(&BTreeSet::from([u64::MAX])), None);
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
    fn tcp_info_bytes_are_read_at_their_offsets() {
        let mut info = vec![0u8; 232];
        info[120..128].copy_from_slice(&1000u64.to_ne_bytes());
        info[128..136].copy_from_slice(&234u64.to_ne_bytes());
        assert_eq!(diag::carried_bytes(&info), Some(1234));
        // An older kernel's shorter struct.
        assert_eq!(diag::carried_bytes(&info[..104]), None);
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
                    _ => Collective::Formed { traffic: Some(BTreeMap::from([(1, bytes)])) },
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
}
