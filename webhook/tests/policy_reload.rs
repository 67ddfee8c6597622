//! Policy reload through a real kubelet-style ConfigMap volume: the file is
//! a symlink through `..data`, which is swapped atomically onto a new
//! timestamped directory. Waits are bounded; nothing asserts a duration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::mpsc;
use trainwire_policyfile::{self as policy, PolicyArgs, SharedPolicy};

/// Upper bound for one awaited reload; only reached when the test fails.
const WAIT: Duration = Duration::from_secs(20);

fn policy_text(profile: &str, shm: &str) -> String {
    format!(
        "apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: {profile}\n    shmSize: {{value: {shm}}}\n"
    )
}

/// A directory laid out like a ConfigMap volume.
struct ConfigMapVolume {
    dir: tempfile::TempDir,
    generation: u32,
}

impl ConfigMapVolume {
    fn new(content: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut vol = ConfigMapVolume { dir, generation: 0 };
        vol.swap(content);
        std::os::unix::fs::symlink("..data/policy.yaml", vol.file()).expect("file symlink");
        vol
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("policy.yaml")
    }

    /// What the kubelet does on a ConfigMap update: write a new timestamped
    /// directory, point `..data_tmp` at it, rename it over `..data`, remove
    /// the old directory.
    fn swap(&mut self, content: &str) {
        self.generation += 1;
        let root = self.dir.path();
        let new = format!("..2026_11_21_18_00_00.{:09}", self.generation);
        std::fs::create_dir(root.join(&new)).expect("timestamped dir");
        std::fs::write(root.join(&new).join("policy.yaml"), content).expect("write");
        let old = std::fs::read_link(root.join("..data")).ok();
        let tmp = root.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).expect("..data_tmp");
        std::fs::rename(&tmp, root.join("..data")).expect("atomic rename");
        if let Some(old) = old {
            std::fs::remove_dir_all(root.join(old)).expect("remove old dir");
        }
    }
}

struct Watching {
    shared: SharedPolicy,
    reloads: mpsc::UnboundedReceiver<Result<(), String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(file: &Path, sidecar_image: Option<&str>) -> Watching {
    let args = PolicyArgs {
        policy: Some(file.to_path_buf()),
        sidecar_image: sidecar_image.map(str::to_string),
        cluster_domain: None,
    };
    let shared = SharedPolicy::new(policy::load(&args).expect("initial policy"));
    let (tx, reloads) = mpsc::unbounded_channel();
    let task = tokio::spawn(policy::watch(
        args,
        shared.clone(),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    ));
    Watching {
        shared,
        reloads,
        task,
    }
}

async fn next_reload(w: &mut Watching) -> Result<(), String> {
    tokio::time::timeout(WAIT, w.reloads.recv())
        .await
        .expect("no reload reported in time")
        .expect("watch task ended")
}

fn names(shared: &SharedPolicy) -> Vec<String> {
    shared
        .current()
        .profiles
        .iter()
        .map(|p| p.name.clone())
        .collect()
}

/// The watcher sets itself up inside its task; swap until it reports once,
/// so that later steps know it is live.
async fn until_live(vol: &mut ConfigMapVolume, w: &mut Watching) {
    for attempt in 0..40 {
        let name = format!("warmup-{attempt}");
        vol.swap(&policy_text(&name, "8Gi"));
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(500), w.reloads.recv()).await
        {
            assert_eq!(r, Ok(()));
            // A slow report may belong to an earlier swap: wait for the last.
            while names(&w.shared) != [name.as_str()] {
                assert_eq!(next_reload(w).await, Ok(()));
            }
            return;
        }
    }
    panic!("the watcher never reported a reload");
}

#[tokio::test]
async fn a_configmap_swap_puts_the_new_policy_in_force() {
    let mut vol = ConfigMapVolume::new(&policy_text("first", "8Gi"));
    let mut w = start(&vol.file(), None);
    assert_eq!(names(&w.shared), ["first"]);
    until_live(&mut vol, &mut w).await;

    vol.swap(&policy_text("second", "16Gi"));
    assert_eq!(next_reload(&mut w).await, Ok(()));
    let current = w.shared.current();
    assert_eq!(current.profiles[0].name, "second");
    assert_eq!(current.profiles[0].shm_size.value.to_string(), "16Gi");
}

#[tokio::test]
async fn a_broken_policy_is_rejected_and_the_old_one_stays() {
    let mut vol = ConfigMapVolume::new(&policy_text("first", "8Gi"));
    let mut w = start(&vol.file(), None);
    until_live(&mut vol, &mut w).await;
    vol.swap(&policy_text("good", "8Gi"));
    assert_eq!(next_reload(&mut w).await, Ok(()));

    // A typo in a field name: refused, with the line, column and field path.
    vol.swap(
        "apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: bad\n    shmsize: {value: 8Gi}\n",
    );
    let err = next_reload(&mut w)
        .await
        .expect_err("broken policy accepted");
    let file = vol.file().display().to_string();
    assert!(
        err.starts_with(&format!(
            "{file}:5:5: profiles[0].shmsize: unknown field \"shmsize\""
        )),
        "{err}"
    );
    assert_eq!(names(&w.shared), ["good"]);

    // A semantic error is refused the same way.
    vol.swap(&policy_text("bad", "8GB"));
    let err = next_reload(&mut w)
        .await
        .expect_err("bad quantity accepted");
    assert!(
        err.starts_with(&format!("{file}:5:22: profiles[0].shmSize.value: \"8GB\"")),
        "{err}"
    );
    assert_eq!(names(&w.shared), ["good"]);

    // Fixed: in force again.
    vol.swap(&policy_text("fixed", "8Gi"));
    assert_eq!(next_reload(&mut w).await, Ok(()));
    assert_eq!(names(&w.shared), ["fixed"]);
}

#[tokio::test]
async fn unchanged_content_and_unrelated_files_do_not_reload() {
    let mut vol = ConfigMapVolume::new(&policy_text("first", "8Gi"));
    let mut w = start(&vol.file(), None);
    until_live(&mut vol, &mut w).await;
    let live = w.shared.current();

    // The kubelet re-syncs with identical data, and another key of the
    // ConfigMap appears: neither changes the policy.
    let same = std::fs::read_to_string(vol.file()).expect("read");
    vol.swap(&same);
    std::fs::write(vol.dir.path().join("README"), "other key").expect("write");
    // Then a real change: the first report must be that one.
    vol.swap(&policy_text("changed", "8Gi"));
    assert_eq!(next_reload(&mut w).await, Ok(()));
    assert_eq!(names(&w.shared), ["changed"]);
    assert!(!std::sync::Arc::ptr_eq(&live, &w.shared.current()));
}

#[tokio::test]
async fn the_same_broken_content_is_reported_once() {
    let mut vol = ConfigMapVolume::new(&policy_text("first", "8Gi"));
    let mut w = start(&vol.file(), None);
    until_live(&mut vol, &mut w).await;

    let broken = policy_text("bad", "lots");
    vol.swap(&broken);
    assert!(next_reload(&mut w).await.is_err());
    vol.swap(&broken);
    vol.swap(&policy_text("good", "8Gi"));
    // The repeated broken content was not reported again.
    assert_eq!(next_reload(&mut w).await, Ok(()));
}

#[tokio::test]
async fn reload_applies_the_sidecar_image_flag() {
    let mut vol = ConfigMapVolume::new(&policy_text("first", "8Gi"));
    let mut w = start(&vol.file(), Some("registry.example/sidecar:dev"));
    until_live(&mut vol, &mut w).await;
    vol.swap(
        "apiVersion: trainwire.dev/v1alpha1\nkind: Policy\nprofiles:\n  - name: free\n    namespaces: [a]\n  - name: pinned\n    sidecar:\n      image: {value: registry.example/sidecar:1.0, enforce: refuse}\n",
    );
    assert_eq!(next_reload(&mut w).await, Ok(()));
    let p = w.shared.current();
    assert_eq!(
        p.profiles[0].sidecar.image.value,
        "registry.example/sidecar:dev"
    );
    assert_eq!(
        p.profiles[1].sidecar.image.value,
        "registry.example/sidecar:1.0"
    );
    assert_eq!(
        p.fallback.sidecar.image.value,
        "registry.example/sidecar:dev"
    );
}

#[tokio::test]
async fn a_plain_file_rewritten_in_place_is_reloaded_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("policy.yaml");
    std::fs::write(&file, policy_text("first", "8Gi")).expect("write");
    let mut w = start(&file, None);
    for attempt in 0..40 {
        std::fs::write(&file, policy_text(&format!("v{attempt}"), "8Gi")).expect("write");
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(500), w.reloads.recv()).await
        {
            assert_eq!(r, Ok(()));
            assert!(names(&w.shared)[0].starts_with('v'));
            return;
        }
    }
    panic!("an in-place rewrite was never reloaded");
}
