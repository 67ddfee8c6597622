//! The trainer's rendezvous handler (`trainwire-c10d`) as the sidecar ships
//! it: `trainwire-sidecar install-rendezvous-handler` installs it, then its
//! Python unit tests (`sidecar/rendezvous/tests/test_handler.py`) run on
//! the installed files with real torch: eviction on a real TCPStore
//! (fencing, a second loss during the first, the spare's deadline left to
//! torch), the fallbacks (a missing private field, no pod index: plain c10d,
//! the start does not fail), real torchrun selecting it by name, and warm
//! forkserver workers.

use std::process::Command;

use trainwire_tests::{repo_root, torch};

#[test]
fn the_installed_handler_passes_its_tests_with_real_torch() {
    if !torch::require_torch("the_installed_handler_passes_its_tests_with_real_torch") {
        return;
    }
    let sidecar = trainwire_tests::sidecar_binary().expect("the sidecar binary");
    let tmp = tempfile::tempdir().expect("tempdir");
    let python_dir = tmp.path().join("python");
    let channel = tmp.path().join("rendezvous");
    let installed = Command::new(&sidecar)
        .arg("install-rendezvous-handler")
        .arg(&python_dir)
        .arg("--channel")
        .arg(&channel)
        .status()
        .expect("run the sidecar");
    assert!(
        installed.success(),
        "install-rendezvous-handler: {installed}"
    );
    let tests = repo_root().join("sidecar/rendezvous/tests");
    let out = Command::new(torch::python())
        .args(["-m", "unittest", "-v", "test_handler"])
        .current_dir(&tests)
        .env("TRAINWIRE_HANDLER_DIR", &python_dir)
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // unittest's summary is the last lines of stderr.
    let summary: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.contains(" ... ")
                || l.starts_with("Ran ")
                || l.starts_with("OK")
                || l.starts_with("FAILED")
        })
        .collect();
    println!("{}", summary.join("\n"));
    assert!(
        out.status.success(),
        "the handler's tests failed:\n{stderr}"
    );
    assert!(
        summary
            .iter()
            .any(|l| l.starts_with("Ran ") && !l.starts_with("Ran 0 ")),
        "no test ran:\n{stderr}"
    );
}
