//! The Dockerfiles cannot be built on this machine (no container engine);
//! these checks keep them consistent with the release build CI runs.

use anyhow::{Context, Result};

fn read(path: &str) -> Result<String> {
    let full = trainwire_tests::repo_root().join(path);
    std::fs::read_to_string(&full).with_context(|| full.display().to_string())
}

#[test]
fn each_image_runs_the_ci_release_build_and_a_numeric_non_root_user() -> Result<()> {
    let ci = read(".ci/run")?;
    let ci_build = ci
        .lines()
        .find(|l| l.starts_with("cargo build --release"))
        .context(".ci/run has no release build")?;
    assert!(ci_build.contains("--locked"), "{ci_build}");
    for bin in ["webhook", "sidecar"] {
        let text = read(&format!("docker/{bin}.Dockerfile"))?;
        let package = format!("trainwire-{bin}");
        assert!(
            ci_build.contains(&format!("-p {package}")),
            "CI does not build {package}"
        );
        assert!(
            text.contains(&format!("cargo build --release --locked -p {package}")),
            "docker/{bin}.Dockerfile does not run CI's release build"
        );
        let from: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
        assert_eq!(from.len(), 2, "multi-stage: a builder and a runtime");
        assert!(from[0].contains(" AS builder"));
        // The builder's toolchain is no older than the workspace's MSRV.
        let rust = from[0]
            .split("rust:")
            .nth(1)
            .and_then(|t| t.split('-').next())
            .context("builder is not a rust image")?;
        let version: Vec<u32> = rust
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .with_context(|| format!("builder tag {rust}"))?;
        assert!(
            version >= vec![1, 89],
            "builder rust {rust} is older than rust-version 1.89"
        );
        let user = text
            .lines()
            .filter_map(|l| l.strip_prefix("USER "))
            .next_back()
            .context("no USER")?;
        let uid: u32 = user
            .split(':')
            .next()
            .unwrap_or_default()
            .parse()
            .context("USER must be numeric")?;
        assert_ne!(uid, 0, "runs as root");
        let entry = text
            .lines()
            .find(|l| l.starts_with("ENTRYPOINT"))
            .context("no ENTRYPOINT")?;
        assert!(
            entry.contains(&format!("/usr/local/bin/{package}")),
            "{entry}"
        );
    }
    Ok(())
}

#[test]
fn the_deployment_runs_the_image_this_repository_builds() -> Result<()> {
    let deployment = read("manifests/base/deployment.yaml")?;
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        deployment.contains(&format!(
            "image: ghcr.io/trainwire/trainwire-webhook:{version}"
        )),
        "the Deployment's image tag is not the workspace version {version}"
    );
    assert!(
        trainwire_webhook::policy::DEFAULT_SIDECAR_IMAGE
            .ends_with(&format!("trainwire-sidecar:{version}"))
    );
    Ok(())
}
