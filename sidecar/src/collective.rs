//! Whether the trainer's workers have formed their collective: a worker
//! that holds an established TCP connection to another pod (gloo's full
//! mesh, NCCL's bootstrap ring) has passed `init_process_group`, which is
//! where a world that re-formed after a loss starts training again. A
//! worker that has only started is still importing, loading, waiting for
//! its peers (seconds on a busy node: 3.5 s between the workers' start and
//! the first step in `recovery_e2e`), so its start is not the resumption.
//!
//! Read from `/proc/<pid>/fd` (the worker's sockets, by inode) and
//! `/proc/<pid>/net/tcp{,6}` (its network namespace's TCP table). A
//! connection to the rendezvous store (its port) or to the loopback does
//! not count: every agent and worker talks to the store before its peers.

use std::collections::BTreeSet;
use std::path::Path;

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

/// Whether any of `workers` holds a connection to a peer ([`is_peer`]):
/// `Some(true)` or `Some(false)`, `None` when no worker's sockets could be
/// read.
pub fn workers_connected(proc_root: &Path, workers: &[i32], store_ports: &[u16]) -> Option<bool> {
    let mut readable = false;
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
            if parse_tcp_table(&text)
                .iter()
                .any(|r| inodes.contains(&r.inode) && is_peer(r, store_ports))
            {
                return Some(true);
            }
        }
    }
    readable.then_some(false)
}

/// torch's node rank of a worker: `GROUP_RANK` in its environment (torchrun
/// sets it for every worker of a node); `None` when it cannot be read.
pub fn group_rank(proc_root: &Path, pid: i32) -> Option<u32> {
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("environ")).ok()?;
    let mut bytes = Vec::new();
    use std::io::Read;
    // A process environment is bounded by the kernel's ARG_MAX; read 1 MiB.
    file.take(1 << 20).read_to_end(&mut bytes).ok()?;
    bytes
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(b"GROUP_RANK="))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse().ok())
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

    /// This test process's own connection to a listener on another address
    /// of the loopback is not a peer; the scan reads this process's fds.
    #[test]
    fn a_process_without_peer_connections_is_not_connected() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let _c =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let me = std::process::id() as i32;
        assert_eq!(
            workers_connected(Path::new("/proc"), &[me], &[]),
            Some(false)
        );
        // No such process: nothing readable.
        assert_eq!(
            workers_connected(Path::new("/proc"), &[i32::MAX], &[]),
            None
        );
    }

    #[test]
    fn the_group_rank_comes_from_the_workers_environment() {
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
