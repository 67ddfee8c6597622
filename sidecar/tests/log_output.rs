//! The sidecar's text log, read through a pipe as the container runtime reads
//! it, carries no ANSI colour codes (colour only on a terminal), and goes to
//! stderr; a configuration it refuses is said plainly too.

use std::process::{Command, Stdio};
use std::time::Duration;

use trainwire_test_support::free_port;
use trainwire_test_support::output::{has_ansi, read_lines_until};
use trainwire_test_support::sidecar::loopback_sidecar;

#[test]
fn text_log_through_a_pipe_has_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let mut child = loopback_sidecar(env!("CARGO_BIN_EXE_trainwire-sidecar"), 0, 1, port)
        .env("TRAINWIRE_LOG_FORMAT", "text")
        .env("TRAINWIRE_CHECKPOINT_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainwire-sidecar");
    let stderr = child.stderr.take().expect("stderr");
    let stdout = child.stdout.take().expect("stdout");
    let lines = read_lines_until(stderr, Duration::from_secs(30), |lines| lines.len() >= 3);
    let _ = child.kill();
    let _ = child.wait();
    let log = lines.concat();
    assert!(log.contains("INFO"), "the log reaches stderr:\n{log}");
    assert!(!has_ansi(&log), "colour codes in a piped log:\n{log:?}");
    let out = read_lines_until(stdout, Duration::from_secs(5), |_| false);
    assert!(out.is_empty(), "nothing is logged on stdout: {out:?}");
}

#[test]
fn a_refused_configuration_is_plain_text_on_stderr() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-sidecar"))
        .env_clear()
        .env("TRAINWIRE_NNODES", "1")
        .env("TRAINWIRE_NODE_RANK", "0")
        .env("TRAINWIRE_HEARTBEAT_INTERVAL", "1e20")
        .output()
        .expect("run trainwire-sidecar");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TRAINWIRE_HEARTBEAT_INTERVAL"), "{stderr}");
    assert!(!has_ansi(&stderr), "{stderr:?}");
}
