//! A stalled world's workers write their Python stacks before they are
//! restarted: trainwire's `sitecustomize` (installed beside the rendezvous
//! handler, on the trainer's `PYTHONPATH`) registers `faulthandler` for the
//! signal the sidecar sends ([`ask_for_stacks`]). Real Python processes,
//! one stopped (SIGSTOP) while it waits on a lock, as a hung worker would.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;
use trainwire_contract::stall::{STACKS_SIGNAL, STACKS_SIGNAL_ENV};
use trainwire_sidecar::progress::ask_for_stacks;
use trainwire_sidecar::signal::Process;
use trainwire_test_support::wait::wait_until_or;
use trainwire_test_support::{Prerequisite, require};

/// A worker that says `ready` and then blocks in `stuck_in_collective()`.
const WORKER: &str = r#"
import sys, threading
def stuck_in_collective():
    print("ready", flush=True)
    threading.Event().wait()
stuck_in_collective()
"#;

fn handler_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rendezvous")
}

/// Starts the worker with (or without) the stacks variable; stderr goes to
/// a file, as a container's does to its log.
fn worker(stacks: bool, err: &std::path::Path) -> std::process::Child {
    let mut cmd = Command::new("python3");
    cmd.args(["-c", WORKER])
        .env("PYTHONPATH", handler_dir())
        .env_remove(STACKS_SIGNAL_ENV)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(err).expect("stderr file"));
    if stacks {
        cmd.env(STACKS_SIGNAL_ENV, STACKS_SIGNAL);
    }
    let mut child = cmd.spawn().expect("python3");
    let mut ready = [0u8; 6];
    child
        .stdout
        .as_mut()
        .expect("stdout")
        .read_exact(&mut ready)
        .expect("the worker says ready");
    assert_eq!(&ready, b"ready\n");
    child
}

fn process(child: &std::process::Child) -> Process {
    Process {
        pid: child.id() as i32,
        ppid: std::process::id() as i32,
        start_ticks: 0,
        argv: vec!["python3".into()],
    }
}

#[test]
fn a_stopped_worker_writes_its_python_stack_and_runs_on() {
    let test = "a_stopped_worker_writes_its_python_stack_and_runs_on";
    if !require(test, Prerequisite::command("python3", &["--version"])) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let err = dir.path().join("stderr");
    let mut child = worker(true, &err);
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP");
    let sent = ask_for_stacks(&[process(&child)]);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].signal, STACKS_SIGNAL);
    assert_eq!(sent[0].error, None);
    wait_until_or(
        "the stack in the worker's stderr",
        Duration::from_secs(10),
        || format!("{:?}", std::fs::read_to_string(&err)),
        || std::fs::read_to_string(&err).is_ok_and(|t| t.contains("in stuck_in_collective")),
    );
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        text.contains("Thread 0x") || text.contains("Current thread"),
        "{text}"
    );
    // The handler returns: the worker was resumed and runs on until the
    // SIGTERM that follows in a restart.
    assert!(
        matches!(
            nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
            Ok(WaitStatus::StillAlive)
        ),
        "the worker ended"
    );
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let _ = child.wait();
}

#[test]
fn a_worker_without_the_registration_ends_without_a_core() {
    let test = "a_worker_without_the_registration_ends_without_a_core";
    if !require(test, Prerequisite::command("python3", &["--version"])) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let err = dir.path().join("stderr");
    let mut child = worker(false, &err);
    let sent = ask_for_stacks(&[process(&child)]);
    assert_eq!(sent[0].error, None);
    let status = child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    let stacks: Signal = STACKS_SIGNAL.parse().expect("a signal name");
    assert_eq!(status.signal(), Some(stacks as i32), "{status:?}");
    assert!(!status.core_dumped(), "a core dump");
}
