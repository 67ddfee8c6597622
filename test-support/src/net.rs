//! Ports and plain HTTP/1.1 to the sidecar's and the webhook's probe ports.

use std::time::Duration;

/// A free TCP port on loopback (bound and released; good enough for tests
/// that start the listener right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29_500)
}

/// The body of `GET path` on `addr` (`ip:port`), or `None` when nothing
/// answers in time (1 s to connect, 2 s to read).
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// The sidecar's `/status` as JSON, `Null` when it does not answer.
pub fn status(addr: &str) -> serde_json::Value {
    http_get(addr, "/status")
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Whether something accepts TCP connections on `127.0.0.1:port`.
pub fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Waits (bounded by `limit`) until something listens on `127.0.0.1:port`.
pub fn wait_listening(port: u16, limit: Duration) -> bool {
    crate::wait::wait_for(limit, Duration::from_millis(25), || listening(port))
}
