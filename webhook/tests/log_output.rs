//! The webhook's text log, read through a pipe as a log collector reads it,
//! carries no ANSI colour codes (colour only on a terminal), and goes to
//! stderr.

use std::process::{Command, Stdio};
use std::time::Duration;

use trainwire_test_support::output::{has_ansi, read_lines_until};

#[test]
fn text_log_through_a_pipe_has_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No certificate yet: the server starts, logs and waits for it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--probe-listen",
            "127.0.0.1:0",
            "--log-format",
            "text",
            "--reconcile=false",
        ])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env("RUST_LOG", "info")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start trainwire-webhook");
    let stderr = child.stderr.take().expect("stderr");
    let stdout = child.stdout.take().expect("stdout");
    let lines = read_lines_until(stderr, Duration::from_secs(30), |lines| {
        lines
            .iter()
            .any(|l| l.contains("serving admission reviews"))
    });
    let _ = child.kill();
    let _ = child.wait();
    let log = lines.concat();
    assert!(
        log.contains("serving admission reviews"),
        "the log reaches stderr:\n{log}"
    );
    assert!(log.contains("INFO"), "{log}");
    assert!(!has_ansi(&log), "colour codes in a piped log:\n{log:?}");
    let out = read_lines_until(stdout, Duration::from_secs(5), |_| false);
    assert!(out.is_empty(), "nothing is logged on stdout: {out:?}");
}
