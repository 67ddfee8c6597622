//! A world of real sidecars on loopback: rank `r` binds `127.0.0.1<r>` (so
//! `127.0.0.10`, `127.0.0.11`, ...), finds its peers at `127.0.0.1{i}`, and
//! heartbeats every 200 ms (5 misses, 300 ms timeout), on one shared port.

use std::ffi::OsStr;
use std::process::{Child, Command};

use nix::unistd::Pid;

/// `bin` (a `trainwire-sidecar`) as rank `rank` of `nnodes` on loopback, with
/// a clean environment (`PATH` kept, `RUST_LOG=info`). Callers add or
/// override what their test is about (`.env(..)` again wins).
pub fn loopback_sidecar(bin: impl AsRef<OsStr>, rank: u32, nnodes: u32, port: u16) -> Command {
    let mut cmd = Command::new(bin);
    loopback_sidecar_env(&mut cmd, rank, nnodes, port);
    cmd
}

/// The environment of [`loopback_sidecar`], on a command that starts the
/// sidecar itself or a wrapper (`unshare ... sh -c`) that passes it on.
pub fn loopback_sidecar_env(cmd: &mut Command, rank: u32, nnodes: u32, port: u16) -> &mut Command {
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .env("TRAINWIRE_POD_NAME", format!("job-{rank}"))
        .env("TRAINWIRE_POD_UID", format!("uid-{rank}-{port}"))
        .env("TRAINWIRE_NNODES", nnodes.to_string())
        .env("TRAINWIRE_NODE_RANK", rank.to_string())
        .env("TRAINWIRE_PEER_HOSTS", "127.0.0.1{i}")
        .env("TRAINWIRE_BIND_ADDRESS", format!("127.0.0.1{rank}"))
        .env("TRAINWIRE_HEALTH_PORT", port.to_string())
        .env("TRAINWIRE_DETECTION", "heartbeat")
        .env("TRAINWIRE_HEARTBEAT_INTERVAL", "200ms")
        .env("TRAINWIRE_HEARTBEAT_MISSES", "5")
        .env("TRAINWIRE_HEARTBEAT_TIMEOUT", "300ms")
}

/// Where rank `rank` of a [`loopback_sidecar`] world answers (`ip:port`).
pub fn loopback_addr(rank: u32, port: u16) -> String {
    format!("127.0.0.1{rank}:{port}")
}

/// A child process that is killed with SIGKILL (which also ends one the test
/// froze with SIGSTOP) and reaped when dropped.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32)
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too. No SIGCONT first: a frozen
        // sidecar woken for a moment would answer the heartbeats queued in
        // its backlog, and its peers would see the lost pod come back just
        // before its replacement starts.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
