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

/// A process tree shaped like torchrun's (`sidecar/tests/fake_torchrun.py`):
/// an agent whose workers run in their own sessions and are restarted when
/// they die, every event logged one line each. Dropping it kills the agent
/// and every worker it spawned.
pub struct FakeAgent {
    child: Child,
    log: std::path::PathBuf,
}

impl FakeAgent {
    /// `py` runs the script with `workers` workers; `tag` makes its command
    /// line unique (for `TRAINWIRE_AGENT_MATCH`); events go to `log`.
    pub fn start(py: &str, tag: &str, workers: u32, log: std::path::PathBuf) -> FakeAgent {
        let script = crate::repo_root().join("sidecar/tests/fake_torchrun.py");
        let child = Command::new(py)
            .arg(script)
            .args(["--log", &log.display().to_string()])
            .args(["--workers", &workers.to_string()])
            .args(["--tag", tag])
            .spawn()
            .expect("start fake torchrun");
        FakeAgent { child, log }
    }

    /// The agent's pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether the agent has exited (it is reaped if so).
    pub fn exited(&mut self) -> bool {
        self.exit_status().is_some()
    }

    /// How the agent ended, once it has (it is reaped then).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn lines(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    /// How many `event` lines the log has (`spawn`, `worker-sigterm`, ...).
    pub fn count(&self, event: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.get(1).map(String::as_str) == Some(event))
            .count()
    }

    /// The pids of the `event` lines.
    pub fn pids(&self, event: &str) -> Vec<i32> {
        self.lines()
            .iter()
            .filter(|l| l.get(1).map(String::as_str) == Some(event))
            .filter_map(|l| l.get(2).and_then(|p| p.parse().ok()))
            .collect()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in self.pids("spawn") {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}
