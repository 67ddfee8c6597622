//! The sidecar's signal reaches the trainer the way a container runtime
//! really runs the two containers, not as root with every capability.
//!
//! For each case the sidecar's identity is taken from what the engine injects
//! (`securityContext` of the `trainwire-sidecar` container rendered from the
//! captured StatefulSet), and turned into what runc does at exec: `setpriv
//! --reuid/--regid --clear-groups`, the bounding set from `capabilities.add`
//! (everything else dropped), no inheritable capabilities, `--no-new-privs`
//! for `allowPrivilegeEscalation: false`. A non-root user gets no effective
//! capability at exec (Kubernetes sets no ambient ones): that is the rule
//! this test holds the engine to.
//!
//! The trainer (a torchrun-shaped process tree, `sidecar/tests/fake_torchrun.py`)
//! and the sidecar share one PID namespace (`shareProcessNamespace`). A second
//! sidecar outside plays rank 0, the rendezvous host, and is frozen with
//! SIGSTOP: rank 1 (`restart-agent`, the loss confirmed by a 2 s outage) then
//! SIGKILLs the local agent and its workers. The last case is the old shape (UID 65532 with `add: [KILL]`
//! against a root trainer): EPERM, reported loudly, never silently.
//!
//! Needs root (PID namespaces, `setpriv` to other users). With `CI=true` a
//! missing prerequisite fails the test; elsewhere it is reported as skipped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use rstest::rstest;
use serde_json::{Value, json};
use trainwire_engine::mutation::{Outcome, mutate};
use trainwire_engine::policy::Profile;
use trainwire_tests::net::{free_port, http_get, status};
use trainwire_tests::sidecar::{KillOnDrop, loopback_addr, loopback_sidecar_env};
use trainwire_tests::wait::wait_until_or as wait_until;

/// Why the test cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    if !trainwire_tests::process::is_root() {
        return Some(
            "not running as root (PID namespaces and setpriv to other users need it)".into(),
        );
    }
    if python_for_any_user().is_none() {
        return Some(
            "no Python interpreter that a non-root user may run (/usr/bin/python3)".into(),
        );
    }
    for tool in ["unshare", "setpriv"] {
        let ok = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Some(format!("`{tool}` is missing (util-linux / python3)"));
        }
    }
    None
}

/// A Python 3 that any user may run (the one on root's PATH may live under
/// `/root`): checked by running it as `nobody`.
fn python_for_any_user() -> Option<String> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|py| {
            Command::new("setpriv")
                .args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    py,
                    "-c",
                    "pass",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(str::to_string)
}

/// `true` when the test may run; under `CI=true` a missing prerequisite
/// fails the test (`trainwire_test_support::require`).
fn prerequisites(test: &str) -> bool {
    trainwire_tests::require(
        test,
        trainwire_tests::Prerequisite::from_missing(unavailable()),
    )
}

/// What a container runtime applies at exec.
#[derive(Debug, Clone, PartialEq)]
struct Identity {
    uid: u32,
    gid: u32,
    /// The bounding set: `capabilities.add` after `drop: [ALL]`.
    caps: Vec<String>,
    no_new_privs: bool,
}

impl Identity {
    /// `setpriv` arguments that do what runc does.
    fn setpriv(&self) -> Vec<String> {
        let mut bounding = "-all".to_string();
        for cap in &self.caps {
            bounding.push_str(&format!(",+{}", cap.to_lowercase()));
        }
        let mut args = vec![
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            "--clear-groups".to_string(),
            format!("--bounding-set={bounding}"),
            "--inh-caps=-all".to_string(),
        ];
        if self.no_new_privs {
            args.push("--no-new-privs".to_string());
        }
        args
    }
}

/// The image's user (`USER 65532:65532`, images/build), used
/// when the pod does not set one.
const IMAGE_USER: u32 = 65532;

/// The sidecar identity the engine injects for a trainer with these
/// container and pod security contexts.
fn injected_identity(container: &Value, pod: &Value) -> Identity {
    let path = trainwire_tests::admission_fixtures_dir().join("statefulset-create.json");
    let review: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("fixture JSON");
    let mut object = review["request"]["object"].clone();
    if !container.is_null() {
        object["spec"]["template"]["spec"]["containers"][0]["securityContext"] = container.clone();
    }
    if !pod.is_null() {
        object["spec"]["template"]["spec"]["securityContext"] = pod.clone();
    }
    let Ok(Outcome::Mutated(m)) = mutate(&object, Some("trainwire-test"), &Profile::default())
    else {
        panic!("the fixture is injected");
    };
    let sidecar = m.object["spec"]["template"]["spec"]["initContainers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "trainwire-sidecar"))
        .cloned()
        .expect("the injected sidecar");
    let sc = &sidecar["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{sc}");
    let uid = sc["runAsUser"]
        .as_u64()
        .map_or(IMAGE_USER, |u| u32::try_from(u).expect("uid"));
    let gid = sc["runAsGroup"]
        .as_u64()
        .map_or(if uid == IMAGE_USER { IMAGE_USER } else { 0 }, |g| {
            u32::try_from(g).expect("gid")
        });
    Identity {
        uid,
        gid,
        caps: sc["capabilities"]["add"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        no_new_privs: sc["allowPrivilegeEscalation"] == false,
    }
}

fn sidecar_env(cmd: &mut Command, rank: u32, port: u16, tag: &str) {
    loopback_sidecar_env(cmd, rank, 2, port)
        .env("TRAINWIRE_LOG_FORMAT", "text")
        .env("TRAINWIRE_POD_NAME", format!("train-{rank}"))
        // `auto` would stop the workers and wait for a replacement host;
        // `restart-agent` signals the whole tree once the loss is confirmed.
        .env("TRAINWIRE_ON_PEER_LOSS", "restart-agent")
        .env("TRAINWIRE_CONFIRM_AFTER", "2s")
        .env("TRAINWIRE_AGENT_MATCH", tag);
}

/// Host PIDs of the live trainer processes (Python, their command line
/// naming the test's directory): the agent and its workers.
fn trainer_processes(needle: &str) -> Vec<i32> {
    trainwire_tests::process::pids_with_cmdline("python", needle)
}

fn copy_executable(from: &Path, dir: &Path) -> PathBuf {
    let to = dir.join(from.file_name().expect("file name"));
    std::fs::copy(from, &to).expect("copy");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    to
}

enum Expect {
    /// The agent and its workers are SIGKILLed.
    Signalled,
    /// Every signal fails with EPERM, said in the status, metrics and log.
    Eperm,
}

fn run_case(test: &str, trainer_uid: u32, sidecar: Identity, expect: Expect) {
    if !prerequisites(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let bin = copy_executable(
        &trainwire_tests::sidecar_binary().expect("the sidecar binary"),
        dir.path(),
    );
    let script = copy_executable(
        &trainwire_tests::repo_root().join("sidecar/tests/fake_torchrun.py"),
        dir.path(),
    );
    let port = free_port();
    let tag = format!("twident-{port}-{}", std::process::id());
    let agent_log = dir.path().join("agent.log");

    // Rank 0, the rendezvous host, outside the namespace.
    let log0 = std::fs::File::create(dir.path().join("rank0.log")).expect("log");
    let mut cmd = Command::new(&bin);
    sidecar_env(&mut cmd, 0, port, &format!("{tag}-nothing"));
    let rank0 = KillOnDrop(
        cmd.stdout(log0.try_clone().expect("log"))
            .stderr(log0)
            .spawn()
            .expect("start rank 0"),
    );

    // The pod: trainer and sidecar in one PID namespace, each under its user.
    let trainer = Identity {
        uid: trainer_uid,
        gid: trainer_uid,
        caps: if trainer_uid == 0 {
            // A root container keeps the runtime's default set, KILL included.
            vec![
                "KILL".into(),
                "CHOWN".into(),
                "SETUID".into(),
                "SETGID".into(),
            ]
        } else {
            Vec::new()
        },
        no_new_privs: false,
    };
    let quote = |args: Vec<String>| args.join(" ");
    let sidecar_log = dir.path().join("rank1.log");
    // The tag reaches the trainer through the environment, so that PID 1
    // (the shell) does not carry it and is not taken for the agent.
    let pod = format!(
        "setpriv {} \"$TW_PYTHON\" {} --log \"$TW_AGENT_LOG\" --workers 2 --tag \"$TW_TAG\" & \
         setpriv {} {} > {} 2>&1 & wait",
        quote(trainer.setpriv()),
        script.display(),
        quote(sidecar.setpriv()),
        bin.display(),
        sidecar_log.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
        "sh",
        "-c",
        &pod,
    ]);
    sidecar_env(&mut cmd, 1, port, &tag);
    cmd.env("TW_PYTHON", python_for_any_user().expect("checked"))
        .env("TW_AGENT_LOG", &agent_log)
        .env("TW_TAG", &tag);
    let _pod = KillOnDrop(cmd.stdin(Stdio::null()).spawn().expect("start the pod"));

    let addr1 = loopback_addr(1, port);
    let needle = dir.path().display().to_string();
    let logs = || {
        format!(
            "--- rank 1 sidecar ---\n{}\n--- agent ---\n{}\n--- trainer processes ---\n{}\n--- status ---\n{}",
            std::fs::read_to_string(&sidecar_log).unwrap_or_default(),
            std::fs::read_to_string(&agent_log).unwrap_or_default(),
            trainer_processes(&needle)
                .iter()
                .map(|p| format!(
                    "{p} {:?} {}",
                    trainwire_tests::process::stat(*p),
                    trainwire_tests::process::cmdline(*p)
                ))
                .collect::<Vec<_>>()
                .join("\n"),
            status(&addr1)
        )
    };
    wait_until(
        "rank 1 sees rank 0 healthy",
        Duration::from_secs(30),
        logs,
        || {
            status(&addr1)["peers"]
                .as_array()
                .is_some_and(|p| p.iter().any(|x| x["rank"] == 0 && x["state"] == "healthy"))
        },
    );
    wait_until(
        "the agent and two workers run",
        Duration::from_secs(30),
        logs,
        || trainer_processes(&needle).len() >= 3,
    );
    // Checked before any loss: the sidecar knows whether it could act.
    wait_until(
        "the sidecar checked its signal permission",
        Duration::from_secs(30),
        logs,
        || {
            status(&addr1)["signal_permission"]
                .as_str()
                .is_some_and(|p| p.starts_with("permitted") || p.starts_with("denied"))
        },
    );
    let permission = status(&addr1)["signal_permission"]
        .as_str()
        .unwrap_or_default()
        .to_string();

    kill(rank0.pid(), Signal::SIGSTOP).expect("freeze rank 0");
    wait_until(
        "rank 1 acts on the lost rendezvous host",
        Duration::from_secs(30),
        logs,
        || status(&addr1)["last_action"]["result"].is_string(),
    );
    let st = status(&addr1);
    let action = &st["last_action"];
    assert_eq!(action["action"], "restart-agent", "{}", logs());
    match expect {
        Expect::Signalled => {
            assert!(
                permission.starts_with("permitted"),
                "{permission}\n{}",
                logs()
            );
            assert_eq!(action["result"], "signalled", "{}", logs());
            let signals = action["signals"].as_array().cloned().unwrap_or_default();
            assert!(signals.iter().all(|s| s["error"].is_null()), "{}", logs());
            wait_until(
                "the agent and its workers are gone",
                Duration::from_secs(15),
                logs,
                || trainer_processes(&needle).is_empty(),
            );
        }
        Expect::Eperm => {
            assert!(permission.starts_with("denied"), "{permission}\n{}", logs());
            assert!(permission.contains("EPERM"), "{permission}");
            assert_eq!(action["result"], "failed", "{}", logs());
            let signals = action["signals"].as_array().cloned().unwrap_or_default();
            assert!(!signals.is_empty(), "{}", logs());
            assert!(
                signals
                    .iter()
                    .all(|s| s["error"].as_str().is_some_and(|e| e.starts_with("EPERM"))),
                "{}",
                logs()
            );
            let metrics = http_get(&addr1, "/metrics").unwrap_or_default();
            // Counted once per attempt (the step is retried with a back-off).
            assert!(
                metrics.contains(
                    r#"trainwire_sidecar_signal_failures_total{role="agent",error="EPERM"} "#
                ),
                "{metrics}"
            );
            assert!(
                metrics.contains(r#"trainwire_sidecar_signal_permission{state="denied"} 1"#),
                "{metrics}"
            );
            // /status never shows the failed step as done.
            let st = status(&addr1);
            assert_eq!(st["last_loss"]["agent_killed"], false, "{st:#}");
            assert!(
                st["last_loss"]["failed_attempts"].as_u64() >= Some(1),
                "{st:#}"
            );
            assert_eq!(st["last_loss"]["state"], "confirmed", "{st:#}");
            let log = std::fs::read_to_string(&sidecar_log).unwrap_or_default();
            assert!(
                log.lines()
                    .any(|l| l.contains("WARN") && l.contains("every signal failed")),
                "{log}"
            );
            // The trainer was not touched.
            assert!(trainer_processes(&needle).len() >= 3, "{}", logs());
        }
    }
}

#[rstest]
// The image's user (root in most PyTorch images): the webhook cannot know
// it, so the sidecar runs as root with only KILL.
#[case::root_trainer_unknown_uid(0, json!(null), json!(null))]
// The image's user is not root (USER 1000 in the trainer's image), still
// unknown to the webhook: root with KILL reaches it too.
#[case::image_user_1000_unknown_uid(1000, json!(null), json!(null))]
// A trainer whose UID the manifest gives: the sidecar runs as that UID, no
// capability at all.
#[case::trainer_uid_1000(1000, json!({"runAsUser": 1000, "runAsGroup": 1000}), json!(null))]
// A pod that meets Pod Security `restricted`.
#[case::restricted_pod(
    1000,
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
    json!({"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}})
)]
fn the_injected_sidecar_can_signal_the_trainer(
    #[case] trainer_uid: u32,
    #[case] container: Value,
    #[case] pod: Value,
) {
    let identity = injected_identity(&container, &pod);
    if trainer_uid != 0 && !container.is_null() {
        // Known UID: exactly the trainer's, with no capability.
        assert_eq!(identity.uid, trainer_uid, "{identity:?}");
        assert!(identity.caps.is_empty(), "{identity:?}");
    }
    run_case(
        "the_injected_sidecar_can_signal_the_trainer",
        trainer_uid,
        identity,
        Expect::Signalled,
    );
}

/// The shape trainwire injected before: UID 65532 with `add: [KILL]`. The
/// runtime drops KILL at exec, and a root trainer cannot be signalled.
#[test]
fn the_old_shape_gets_eperm_and_says_so() {
    let old = Identity {
        uid: 65532,
        gid: 65532,
        caps: vec!["KILL".into()],
        no_new_privs: true,
    };
    run_case(
        "the_old_shape_gets_eperm_and_says_so",
        0,
        old,
        Expect::Eperm,
    );
}
