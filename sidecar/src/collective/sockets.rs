//! The TCP sockets of the pod's network namespace, as the kernel reports
//! them: its socket diagnostics (`sock_diag`, what `ss -tie` reads: owner,
//! inode, both ends and the bytes each carried, from `tcp_info`), else
//! `/proc/net/tcp{,6}`; a process's socket inodes and its owner, from
//! `/proc`. What [`super::select`] chooses the collective from.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// One TCP socket of the pod's network namespace, as the kernel's socket
/// diagnostics (or `/proc/net/tcp{,6}`) report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketRow {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub established: bool,
    /// The socket's owner (`idiag_uid`): the user that created it.
    pub uid: u32,
    pub inode: u64,
    /// The bytes it carried each way; `None` when the source does not say
    /// (`/proc/net/tcp`, a kernel older than 4.1).
    pub carried: Option<Carried>,
}

/// The bytes a connection carried each way, from its `tcp_info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// Sent and acknowledged (`tcpi_bytes_acked`).
    pub sent: u64,
    /// Received (`tcpi_bytes_received`).
    pub received: u64,
}

impl Carried {
    /// `n` bytes each way.
    #[cfg(test)]
    pub fn each_way(n: u64) -> Carried {
        Carried {
            sent: n,
            received: n,
        }
    }

    /// Both ways together.
    pub fn total(self) -> u64 {
        self.sent.saturating_add(self.received)
    }
}

/// An address with an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, a dual
/// stack socket's view of an IPv4 peer) as the IPv4 address it is.
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The rows of a `/proc/net/tcp` or `/proc/net/tcp6` text; lines that do
/// not parse are skipped.
pub fn parse_tcp_table(text: &str) -> Vec<SocketRow> {
    text.lines().skip(1).filter_map(parse_row).collect()
}

fn parse_row(line: &str) -> Option<SocketRow> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    let end = |i: usize| -> Option<SocketAddr> {
        let (addr, port) = fields.get(i)?.split_once(':')?;
        Some(SocketAddr::new(
            parse_addr(addr)?,
            u16::from_str_radix(port, 16).ok()?,
        ))
    };
    let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
    Some(SocketRow {
        local: end(1)?,
        remote: end(2)?,
        established: state == 0x01,
        uid: fields.get(7)?.parse().ok()?,
        inode: fields.get(9)?.parse().ok()?,
        carried: None,
    })
}

/// An address as the kernel prints it: 32-bit words in host byte order
/// (little-endian here), in hex.
fn parse_addr(hex: &str) -> Option<IpAddr> {
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
            Some(canonical(std::net::Ipv6Addr::from(bytes).into()))
        }
        _ => None,
    }
}

/// The socket inodes among `/proc/<pid>/fd`; `None` when the descriptors
/// cannot be read (another user's process, or a root process with more
/// capabilities than the reader, without `CAP_SYS_PTRACE`: the directory
/// of a process of the same UID lists, but none of its links reads).
pub fn socket_inodes(proc_root: &Path, pid: &str) -> Option<BTreeSet<u64>> {
    let dir = std::fs::read_dir(proc_root.join(pid).join("fd")).ok()?;
    let mut inodes = BTreeSet::new();
    // A process has at most a few thousand descriptors; bounded anyway.
    for entry in dir.flatten().take(65_536) {
        let target = match std::fs::read_link(entry.path()) {
            Ok(target) => target,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return None,
            // Closed since the listing.
            Err(_) => continue,
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse().ok())
        {
            inodes.insert(inode);
        }
    }
    Some(inodes)
}

/// The file-system UID of a process from the text of its
/// `/proc/<pid>/status` (the line `Uid: real effective saved fs`): the
/// owner of the sockets it creates. `None` when there is no such line.
pub fn parse_status_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A process's file-system UID; `None` when its status cannot be read
/// (it has exited). `/proc/<pid>/status` is readable by every user.
pub fn process_uid(proc_root: &Path, pid: i32) -> Option<u32> {
    use std::io::Read;
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("status")).ok()?;
    let mut text = String::new();
    // A status is a few KiB; bounded anyway.
    file.take(64 << 10).read_to_string(&mut text).ok()?;
    parse_status_uid(&text)
}

/// Every established TCP socket of this network namespace (the pod's), with
/// the bytes each carried: from the kernel's socket diagnostics, else (no
/// answer from the kernel) from `/proc/self/net/tcp{,6}` without the bytes.
/// `None` when neither answers.
pub fn namespace_sockets() -> Option<Vec<SocketRow>> {
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6};
    let mut rows = Vec::new();
    let diag = [AF_INET, AF_INET6]
        .into_iter()
        .try_for_each(|family| diag::dump(family, &mut rows));
    if diag.is_ok() {
        return Some(rows);
    }
    let mut rows = Vec::new();
    let mut any = false;
    for table in ["tcp", "tcp6"] {
        let Ok(file) = std::fs::File::open(Path::new("/proc/self/net").join(table)) else {
            continue;
        };
        let mut text = String::new();
        use std::io::Read;
        // The table of a namespace with many connections is large; read at
        // most 4 MiB of it.
        if file.take(4 << 20).read_to_string(&mut text).is_ok() {
            any = true;
            rows.extend(parse_tcp_table(&text).into_iter().filter(|r| r.established));
        }
    }
    any.then_some(rows)
}

mod diag {
    //! One `SOCK_DIAG_BY_FAMILY` dump of the established TCP sockets of a
    //! family, with their owner, inode, ends and `tcp_info`.
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_sock_diag::{
        SockDiagMessage,
        constants::IPPROTO_TCP,
        inet::{ExtensionFlags, InetRequest, SocketId, StateFlags, nlas::Nla},
    };
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

    use super::SocketRow;

    /// Offsets in `struct tcp_info` (linux/tcp.h) of `tcpi_bytes_acked`
    /// and `tcpi_bytes_received` (Linux 4.1 and later), both `__u64`.
    const BYTES_ACKED: usize = 120;
    const BYTES_RECEIVED: usize = 128;
    /// Bounds on one dump: datagrams read and bytes in all.
    const MAX_DATAGRAMS: usize = 4096;
    const MAX_BYTES: usize = 64 << 20;
    /// The TCP state `ESTABLISHED` (`include/net/tcp_states.h`).
    const TCP_ESTABLISHED: u8 = 1;

    /// Whether a datagram ended the dump.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Next {
        More,
        Done,
    }

    pub fn dump(family: u8, rows: &mut Vec<SocketRow>) -> std::io::Result<()> {
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
            match parse_datagram(&datagram, rows) {
                Ok(Next::More) => {}
                Ok(Next::Done) => return Ok(()),
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        Ok(())
    }

    /// The sockets in one datagram of a dump, appended to `rows`; whether
    /// the dump is over. A message that does not parse ends the dump; an
    /// error message from the kernel is an error (the dump said nothing).
    pub fn parse_datagram(datagram: &[u8], rows: &mut Vec<SocketRow>) -> Result<Next, String> {
        let mut offset = 0;
        while offset < datagram.len() {
            let Some(rest) = datagram.get(offset..) else {
                return Ok(Next::Done);
            };
            let Ok(message) = NetlinkMessage::<SockDiagMessage>::deserialize(rest) else {
                return Ok(Next::Done);
            };
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                    let id = &response.header.socket_id;
                    let info = response.nlas.iter().find_map(|nla| match nla {
                        Nla::TcpInfo(bytes) => Some(bytes),
                        _ => None,
                    });
                    rows.push(SocketRow {
                        local: std::net::SocketAddr::new(
                            super::canonical(id.source_address),
                            id.source_port,
                        ),
                        remote: std::net::SocketAddr::new(
                            super::canonical(id.destination_address),
                            id.destination_port,
                        ),
                        established: response.header.state == TCP_ESTABLISHED,
                        uid: response.header.uid,
                        inode: u64::from(response.header.inode),
                        carried: info.and_then(|b| carried_bytes(b)),
                    });
                }
                NetlinkPayload::Done(_) => return Ok(Next::Done),
                NetlinkPayload::Error(e) => {
                    return Err(format!("the kernel refused the socket dump: {e}"));
                }
                _ => {}
            }
            if length == 0 {
                return Ok(Next::Done);
            }
            offset = offset.saturating_add(length);
        }
        Ok(Next::More)
    }

    /// `tcpi_bytes_acked` and `tcpi_bytes_received` of a `tcp_info`;
    /// `None` from a kernel older than the fields.
    pub fn carried_bytes(info: &[u8]) -> Option<super::Carried> {
        let field = |at: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(info.get(at..at + 8)?.try_into().ok()?))
        };
        Some(super::Carried {
            sent: field(BYTES_ACKED)?,
            received: field(BYTES_RECEIVED)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{Scope, select};
    use std::collections::BTreeMap;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7468 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 0B004D0A:9C40 0A004D0A:7468 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 20 4 30 10 -1
   2: 0B004D0A:9C42 0A004D0A:D431 01 00000000:00000000 00:00000000 00000000  1000        0 1003 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:9C44 0100007F:7530 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 20 4 30 10 -1
   4: 0B004D0A:9C46 0A004D0A:D432 06 00000000:00000000 00:00000000 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn the_tcp_table_reads_as_the_kernel_writes_it() {
        let rows = parse_tcp_table(TCP);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[1].remote, SocketAddr::from(([10, 77, 0, 10], 29800)));
        assert_eq!(rows[1].local, SocketAddr::from(([10, 77, 0, 11], 40000)));
        assert!(rows[1].established);
        assert_eq!(rows[1].inode, 1002);
        assert_eq!(rows[2].uid, 1000);
        assert_eq!(rows[1].carried, None);
        assert!(!rows[0].established);
        assert!(!rows[4].established, "TIME_WAIT");
        // Store port 29800 (0x7468) excluded; the loopback too.
        let scope = Scope {
            store_ports: vec![29800],
            ..Scope::default()
        };
        let chosen = select(&rows, &scope);
        assert_eq!(chosen.peers, BTreeMap::from([(1003, None)]));
        assert!(chosen.any);
    }

    #[test]
    fn tcp_info_bytes_are_read_at_their_offsets() {
        let mut info = vec![0u8; 232];
        info[120..128].copy_from_slice(&1000u64.to_ne_bytes());
        info[128..136].copy_from_slice(&234u64.to_ne_bytes());
        assert_eq!(
            diag::carried_bytes(&info),
            Some(Carried {
                sent: 1000,
                received: 234
            })
        );
        // An older kernel's shorter struct.
        assert_eq!(diag::carried_bytes(&info[..104]), None);
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

    proptest::proptest! {
        /// Whatever the kernel (or anything posing as it) sends, reading a
        /// dump's datagram never panics, and every row it yields came from
        /// a whole message.
        #[test]
        fn a_diag_datagram_of_any_bytes_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
        ) {
            let mut rows = Vec::new();
            let _ = diag::parse_datagram(&bytes, &mut rows);
            proptest::prop_assert!(rows.len() <= bytes.len() / 16 + 1);
            let _ = diag::carried_bytes(&bytes);
        }

        /// Well-framed netlink messages of a socket dump's type (and of
        /// done and error) whose bodies are any bytes: no panic.
        #[test]
        fn a_diag_message_with_any_body_never_panics(
            messages in proptest::collection::vec(
                (proptest::sample::select(vec![2u16, 3, 20]), proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)),
                1..6,
            ),
        ) {
            let mut datagram = Vec::new();
            for (kind, body) in &messages {
                let length = u32::try_from(16 + body.len()).unwrap_or(u32::MAX);
                datagram.extend_from_slice(&length.to_ne_bytes());
                datagram.extend_from_slice(&kind.to_ne_bytes());
                datagram.extend_from_slice(&[0u8; 10]);
                datagram.extend_from_slice(body);
            }
            let mut rows = Vec::new();
            let _ = diag::parse_datagram(&datagram, &mut rows);
            proptest::prop_assert!(rows.len() <= messages.len());
        }

        /// Any text as a TCP table or a process status: no panic.
        #[test]
        fn tables_and_statuses_of_any_text_never_panic(text in ".{0,512}") {
            let _ = parse_tcp_table(&text);
            let _ = parse_status_uid(&text);
            for line in text.lines() {
                let _ = parse_row(line);
            }
        }
    }
}
