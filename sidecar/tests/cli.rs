//! `--help` and `--version` answer without any configuration: the env is
//! read only when the sidecar really starts.

use std::process::{Command, Output};

fn bare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainwire-sidecar"))
        .args(args)
        .env_clear()
        .output()
        .expect("run trainwire-sidecar")
}

#[test]
fn version_needs_no_env() {
    let out = bare(&["--version"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("trainwire-sidecar {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_needs_no_env_and_names_the_required_variables() {
    for flag in ["--help", "-h"] {
        let out = bare(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for needed in ["TRAINWIRE_NNODES", "TRAINWIRE_NODE_RANK", "docs/sidecar.md"] {
            assert!(
                help.contains(needed),
                "{flag}: {needed} missing from\n{help}"
            );
        }
    }
}

#[test]
fn an_unknown_argument_is_a_usage_error_not_a_start() {
    let out = bare(&["--nnodes=2"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--nnodes"), "{stderr}");
}

#[test]
fn without_arguments_and_env_it_still_asks_for_the_configuration() {
    let out = bare(&[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TRAINWIRE_NNODES"), "{stderr}");
}
