//! The real binary's start: a configuration error is one readable message
//! and exit code 1, never a stack backtrace.

use std::process::Command;

#[test]
fn a_bad_configuration_is_a_message_not_a_backtrace() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-sidecar"))
        .env_clear()
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env("TRAINWIRE_POD_NAME", "train-1")
        .env("TRAINWIRE_NODE_RANK", "1")
        .env("TRAINWIRE_NNODES", "2")
        .env("TRAINWIRE_HEARTBEAT_INTERVAL", "1e20")
        .output()
        .expect("run trainwire-sidecar");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("TRAINWIRE_HEARTBEAT_INTERVAL"), "{stderr}");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
