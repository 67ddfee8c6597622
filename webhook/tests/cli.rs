//! The command line's own answers: `--version` and `--help`, with no
//! configuration at all.

use std::process::{Command, Output};

fn bare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .args(args)
        .env_clear()
        .output()
        .expect("run trainwire-webhook")
}

#[test]
fn version_is_the_workspace_version() {
    let out = bare(&["--version"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("trainwire-webhook {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_every_subcommand() {
    let out = bare(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for command in ["inject", "serve", "certs", "policy"] {
        assert!(help.contains(command), "{command} missing from\n{help}");
    }
    // The controllers are a program of their own (trainwire-controllers).
    assert!(
        !help
            .lines()
            .any(|l| l.trim_start().starts_with("controllers")),
        "{help}"
    );
}

/// An object injected by an earlier version, whose input is unchanged, is
/// left exactly as it is (README: upgrades never roll running training):
/// the status records 0.1.0 and keeps recording it.
#[test]
fn an_object_injected_by_0_1_0_is_left_as_it_is() {
    let rendered =
        trainwire_test_support::repo_root().join("examples/rendered/train-statefulset.yaml");
    let current = std::fs::read_to_string(&rendered).expect("read the golden");
    let recorded = format!(r#"\"version\":\"{}\""#, env!("CARGO_PKG_VERSION"));
    assert!(current.contains(&recorded), "{recorded} not in the golden");
    let old = current.replace(&recorded, r#"\"version\":\"0.1.0\""#);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("old.yaml");
    std::fs::write(&input, &old).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_trainwire-webhook"))
        .arg("inject")
        .arg("-f")
        .arg(&input)
        .env_remove("TRAINWIRE_POLICY")
        .env_remove("TRAINWIRE_SIDECAR_IMAGE")
        .env_remove("TRAINWIRE_NAMESPACE")
        .output()
        .expect("run trainwire-webhook inject");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), old);
}
