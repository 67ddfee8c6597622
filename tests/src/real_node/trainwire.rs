//! trainwire installed on a [`RealNode`] exactly as docs/deploy.md says for
//! the self-managed overlay: the `images/build` archives imported under the
//! names the manifests use, `trainwire-webhook certs ... --out
//! manifests/overlays/self-managed/certs`, `kubectl apply -k
//! manifests/overlays/self-managed` (on a copy of `manifests/`, so the
//! checkout gets no certificate files), then the sidecar's RoleBinding per
//! training namespace ([`Install::bind_sidecar`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::RealNode;

/// The namespace the manifests install into.
pub const NAMESPACE: &str = "trainwire-system";

/// What [`RealNode::install_trainwire`] did.
pub struct Install {
    /// The copy of `manifests/` that was applied (with its `certs/`).
    pub manifests: PathBuf,
    /// From the first import to the webhook answering admission.
    pub took: Duration,
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("mkdir {}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| format!("{e}"))?;
        let dst = to.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            copy_dir(&entry.path(), &dst)?;
        } else {
            std::fs::copy(entry.path(), &dst)
                .map_err(|e| format!("copy {}: {e}", dst.display()))?;
        }
    }
    Ok(())
}

impl RealNode {
    /// trainwire's `images/build` archives (built when missing) imported
    /// into containerd's `k8s.io` namespace under the names the manifests
    /// use (`ghcr.io/trainwire/trainwire-{webhook,sidecar}:<version>`);
    /// returns the version. For an install by other means (a Helm chart).
    pub fn import_trainwire_images(&self) -> Result<String, String> {
        let (webhook, sidecar) = super::images::trainwire_archives()?;
        let version = webhook
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("trainwire-webhook-"))
            .and_then(|n| n.strip_suffix(".oci.tar"))
            .ok_or("unexpected webhook archive name")?
            .to_string();
        self.import_image(
            &webhook,
            &format!("ghcr.io/trainwire/trainwire-webhook:{version}"),
        )?;
        self.import_image(
            &sidecar,
            &format!("ghcr.io/trainwire/trainwire-sidecar:{version}"),
        )?;
        Ok(version)
    }

    /// Installs trainwire and waits until both Deployments are available
    /// and the webhook answers the apiserver (a server-side dry-run of an
    /// opted-in StatefulSet is injected). Bounded: 120 s.
    pub fn install_trainwire(&self) -> Result<Install, String> {
        let start = Instant::now();
        self.import_trainwire_images()?;

        let manifests = self.dir().join("manifests");
        copy_dir(&crate::repo_root().join("manifests"), &manifests)?;
        let certs = manifests.join("overlays/self-managed/certs");
        let _ = std::fs::remove_dir_all(&certs);
        // The binary the images were built from, else this build's.
        let release = crate::repo_root().join("target/release/trainwire-webhook");
        let bin = if std::env::var_os("TRAINWIRE_WEBHOOK_BIN").is_none() && release.is_file() {
            release
        } else {
            crate::webhook_binary()?
        };
        super::run(
            &bin.to_string_lossy(),
            &[
                "certs",
                "--service",
                "trainwire-webhook",
                "--namespace",
                NAMESPACE,
                "--out",
                &certs.to_string_lossy(),
            ],
        )?;
        self.kubectl(&[
            "apply",
            "--validate=false",
            "-k",
            &manifests.join("overlays/self-managed").to_string_lossy(),
        ])?;
        for d in ["trainwire-webhook", "trainwire-controllers"] {
            self.wait_deployment_available(NAMESPACE, d, Duration::from_secs(120))?;
        }
        // The webhook answers through the apiserver.
        let probe = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: probe
  namespace: default
  annotations:
    trainwire.dev/inject: "true"
spec:
  serviceName: probe
  replicas: 1
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      containers: [{name: trainer, image: x, command: [torchrun, t.py]}]
"#;
        super::poll(
            "the webhook answering admission",
            Duration::from_secs(60),
            || {
                let out = self.dry_run_create(probe).ok()?;
                out.contains("PET_NNODES").then_some(())
            },
        )?;
        Ok(Install {
            manifests,
            took: start.elapsed(),
        })
    }
}

impl Install {
    /// The sidecar's ClusterRole bound in `namespace` to its `default`
    /// ServiceAccount, with the command docs/deploy.md gives.
    pub fn bind_sidecar(&self, node: &RealNode, namespace: &str) -> Result<(), String> {
        node.kubectl(&[
            "create",
            "rolebinding",
            "trainwire-sidecar",
            "-n",
            namespace,
            "--clusterrole=trainwire-sidecar",
            &format!("--serviceaccount={namespace}:default"),
        ])
        .map(|_| ())
    }
}
