//! The `trainwire-controllers` command line, run as a process.

use std::process::Command;

#[test]
fn help_documents_every_flag_and_its_env_var() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-controllers"))
        .arg("--help")
        .output()
        .expect("trainwire-controllers --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for (flag, env) in [
        ("--probe-listen", "TRAINWIRE_PROBE_LISTEN"),
        ("--log-format", "TRAINWIRE_LOG_FORMAT"),
        ("--lease-namespace", "TRAINWIRE_LEASE_NAMESPACE"),
        ("--node-failure", "TRAINWIRE_NODE_FAILURE"),
        ("--crash-loop", "TRAINWIRE_CRASH_LOOP"),
        ("--policy", "TRAINWIRE_POLICY"),
        ("--sidecar-image", "TRAINWIRE_SIDECAR_IMAGE"),
        ("--cluster-domain", "TRAINWIRE_CLUSTER_DOMAIN"),
    ] {
        assert!(help.contains(flag), "{flag} missing:\n{help}");
        assert!(help.contains(env), "{env} missing:\n{help}");
    }
}

#[test]
fn version_is_the_workspace_version() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-controllers"))
        .arg("--version")
        .output()
        .expect("trainwire-controllers --version");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("trainwire-controllers {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_policy_that_does_not_load_is_a_message_naming_the_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-controllers"))
        .arg("--policy=/nonexistent/policy.yaml")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("trainwire-controllers");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: cannot load the platform policy /nonexistent/policy.yaml: /nonexistent/policy.yaml: cannot read the policy file: "
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("backtrace"), "{stderr}");
}
