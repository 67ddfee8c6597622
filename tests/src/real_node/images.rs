//! The images a real node needs that no registry gives it here: the
//! sandbox's pause, and a trainer image; trainwire's own come from
//! `images/build` ([`trainwire_archives`]).
//!
//! Both test images are built like `images/build` builds trainwire's: a root
//! filesystem, one layer, `umoci`, an OCI archive that
//! [`RealNode::import_image`](super::RealNode::import_image) imports.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The sandbox image containerd runs for every pod.
pub const PAUSE_IMAGE: &str = "trainwire.test/pause:test";
/// The trainer image: busybox and the mount points of the host's Python
/// (see [`trainer_image`]).
pub const TRAINER_IMAGE: &str = "trainwire.test/trainer:test";

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    super::run(program, args).map(|_| ())
}

/// A pause of its own (static C: it reaps the zombies of a pod that shares
/// its PID namespace, and exits on SIGTERM/SIGINT).
pub fn pause_image(work: &Path) -> Result<PathBuf, String> {
    let dir = work.join("pause");
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(&rootfs).map_err(|e| format!("mkdir: {e}"))?;
    let src = dir.join("pause.c");
    fs::write(
        &src,
        r#"#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction a = {0};
    a.sa_handler = quit;
    sigaction(SIGINT, &a, NULL);
    sigaction(SIGTERM, &a, NULL);
    a.sa_handler = reap;
    a.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &a, NULL);
    for (;;) pause();
}
"#,
    )
    .map_err(|e| format!("pause.c: {e}"))?;
    run(
        "gcc",
        &[
            "-static",
            "-O2",
            "-o",
            &rootfs.join("pause").to_string_lossy(),
            &src.to_string_lossy(),
        ],
    )?;
    oci_archive(&dir, &rootfs, "test", &["/pause"], &[], "65535:65535")
}

/// The trainer image: busybox (`/bin/sh`, `kill`, ...), `/etc/passwd` with
/// root and `trainer` (1000), `/lib` and `/lib64` pointing into `/usr`, and
/// `PATH` starting with the host Python's prefix. The Python itself, torch
/// and the host's libraries are not in it: the test mounts them read-only
/// from the host (a test device, see `tests/tests/real_node.rs`).
pub fn trainer_image(work: &Path, python_prefix: &Path) -> Result<PathBuf, String> {
    let dir = work.join("trainer");
    let rootfs = dir.join("rootfs");
    for d in ["bin", "etc", "usr/lib", "usr/lib64", "root", "home/trainer"] {
        fs::create_dir_all(rootfs.join(d)).map_err(|e| format!("mkdir: {e}"))?;
    }
    fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox"))
        .or_else(|_| fs::copy("/bin/busybox", rootfs.join("bin/busybox")))
        .map_err(|e| format!("busybox: {e}"))?;
    for tool in ["sh", "cat", "ls", "kill", "sleep", "ps", "env", "id", "ip"] {
        symlink("busybox", rootfs.join("bin").join(tool)).map_err(|e| format!("{tool}: {e}"))?;
    }
    symlink("usr/lib", rootfs.join("lib")).map_err(|e| format!("lib: {e}"))?;
    symlink("usr/lib64", rootfs.join("lib64")).map_err(|e| format!("lib64: {e}"))?;
    fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\ntrainer:x:1000:1000:trainer:/home/trainer:/bin/sh\n",
    )
    .map_err(|e| format!("passwd: {e}"))?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\ntrainer:x:1000:\n")
        .map_err(|e| format!("group: {e}"))?;
    fs::write(rootfs.join("etc/nsswitch.conf"), "hosts: files dns\n")
        .map_err(|e| format!("nsswitch: {e}"))?;
    let tmp = rootfs.join("tmp");
    fs::create_dir_all(&tmp).map_err(|e| format!("mkdir: {e}"))?;
    for (path, mode) in [
        (tmp.as_path(), 0o1777),
        (&rootfs.join("root"), 0o755),
        (&rootfs.join("home/trainer"), 0o777),
    ] {
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    }
    let path = format!("PATH={}/bin:/bin", python_prefix.display());
    oci_archive(
        &dir,
        &rootfs,
        "test",
        &["/bin/sh"],
        &[&path, "HOME=/tmp", "PYTHONDONTWRITEBYTECODE=1"],
        "0:0",
    )
}

/// `rootfs` as a one-layer OCI archive `<dir>/image.oci.tar` tagged `tag`.
fn oci_archive(
    dir: &Path,
    rootfs: &Path,
    tag: &str,
    entrypoint: &[&str],
    env: &[&str],
    user: &str,
) -> Result<PathBuf, String> {
    let layer = dir.join("layer.tar");
    let layout = dir.join("layout");
    let _ = fs::remove_dir_all(&layout);
    run(
        "tar",
        &[
            "--create",
            "--file",
            &layer.to_string_lossy(),
            "--directory",
            &rootfs.to_string_lossy(),
            "--numeric-owner",
            "--owner=0",
            "--group=0",
            ".",
        ],
    )?;
    let image = format!("{}:{tag}", layout.display());
    run("umoci", &["init", "--layout", &layout.to_string_lossy()])?;
    run("umoci", &["new", "--image", &image])?;
    run(
        "umoci",
        &[
            "raw",
            "add-layer",
            "--image",
            &image,
            &layer.to_string_lossy(),
        ],
    )?;
    let mut args = vec![
        "config".to_string(),
        "--image".to_string(),
        image.clone(),
        "--os".to_string(),
        "linux".to_string(),
        "--architecture".to_string(),
        "amd64".to_string(),
        "--config.user".to_string(),
        user.to_string(),
        "--config.workingdir".to_string(),
        "/".to_string(),
    ];
    for e in entrypoint {
        args.push("--config.entrypoint".to_string());
        args.push((*e).to_string());
    }
    for e in env {
        args.push("--config.env".to_string());
        args.push((*e).to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("umoci", &args)?;
    let archive = dir.join("image.oci.tar");
    run(
        "tar",
        &[
            "--create",
            "--file",
            &archive.to_string_lossy(),
            "--directory",
            &layout.to_string_lossy(),
            ".",
        ],
    )?;
    Ok(archive)
}

/// trainwire's image archives of this version, built with `images/build`
/// when one is missing (CI builds them before the tests).
pub fn trainwire_archives() -> Result<(PathBuf, PathBuf), String> {
    let root = crate::repo_root();
    let manifest =
        fs::read_to_string(root.join("Cargo.toml")).map_err(|e| format!("Cargo.toml: {e}"))?;
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .ok_or("no version in Cargo.toml")?
        .to_string();
    let dir = std::env::var_os("TRAINWIRE_IMAGES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/images"));
    let webhook = dir.join(format!("trainwire-webhook-{version}.oci.tar"));
    let sidecar = dir.join(format!("trainwire-sidecar-{version}.oci.tar"));
    if !webhook.is_file() || !sidecar.is_file() {
        eprintln!("real node: building the images (images/build)");
        let status = Command::new(root.join("images/build"))
            .current_dir(&root)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("images/build: {e}"))?;
        if !status.success() {
            return Err(format!("images/build failed: {status}"));
        }
    }
    Ok((webhook, sidecar))
}

/// The host Python's prefix (where torch is).
pub fn python_prefix() -> Result<PathBuf, String> {
    let out = std::process::Command::new(crate::torch::python())
        .args([
            "-c",
            "import sys; print(sys.prefix); print(sys.base_prefix)",
        ])
        .output()
        .map_err(|e| format!("python: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.lines();
    let (prefix, base) = (it.next().unwrap_or_default(), it.next().unwrap_or_default());
    if prefix.is_empty() || prefix != base {
        return Err(format!(
            "the host Python's prefix {prefix:?} is a virtual environment of {base:?}: use the base interpreter (TRAINWIRE_PYTHON)"
        ));
    }
    Ok(PathBuf::from(prefix))
}

/// A test device, not how users ship images: a MutatingAdmissionPolicy
/// (and its binding) that mounts the host's Python prefix (with torch) and
/// its library directories, read-only and at the same paths, into every
/// container of [`TRAINER_IMAGE`] in the namespaces labelled
/// `<namespace_label>: "true"`: the training pods and the dedicated store
/// (which runs `python3` from the trainer's image).
pub fn host_python_policy(prefix: &Path, namespace_label: &str) -> String {
    let prefix = prefix.display();
    let libs = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    let volume = |name: &str, path: &str| {
        format!(
            r#"Object.spec.volumes{{name: "{name}", hostPath: Object.spec.volumes.hostPath{{path: "{path}", type: "Directory"}}}}"#
        )
    };
    let mount = |name: &str, path: &str| {
        format!(
            r#"Object.spec.containers.volumeMounts{{name: "{name}", mountPath: "{path}", readOnly: true}}"#
        )
    };
    let prefix_s = prefix.to_string();
    let volumes = [
        volume("host-python", &prefix_s),
        volume("host-libs", &libs),
        volume("host-lib64", "/usr/lib64"),
    ]
    .join(", ");
    let mounts = [
        mount("host-python", &prefix_s),
        mount("host-libs", &libs),
        mount("host-lib64", "/usr/lib64"),
    ]
    .join(", ");
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: trainwire-test-host-python
spec:
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
  matchConditions:
    - name: trainer-image
      expression: "object.spec.containers.exists(c, c.image == '{TRAINER_IMAGE}')"
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
    - patchType: ApplyConfiguration
      applyConfiguration:
        expression: >-
          Object{{spec: Object.spec{{volumes: [{volumes}],
          containers: object.spec.containers.filter(c, c.image == '{TRAINER_IMAGE}').map(c,
          Object.spec.containers{{name: c.name, volumeMounts: [{mounts}]}})}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: trainwire-test-host-python
spec:
  policyName: trainwire-test-host-python
  matchResources:
    namespaceSelector:
      matchLabels:
        {namespace_label}: "true"
"#
    )
}
