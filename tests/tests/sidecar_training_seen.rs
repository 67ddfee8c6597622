//! Training is seen by the collective's traffic whatever user the trainer
//! runs as, under the rights the sidecar really has in a pod.
//!
//! Two pods, each a network namespace on one bridge and a PID namespace of
//! its own (`shareProcessNamespace`), run a trainer and the real sidecar,
//! each started the way runc starts a container: `setpriv --reuid/--regid
//! --clear-groups`, the bounding set of its capabilities, no inheritable
//! ones. The trainer is real torchrun with `examples/train.py` (gloo over
//! the pods' link) when PyTorch is importable, and in every case also a
//! stand-in: an agent whose two workers exchange TCP traffic with the other
//! pod's. Each sidecar's `/status` must say `training.seen_by:
//! collective-traffic`:
//!
//! - a root trainer (the runtime's default capabilities) beside the sidecar
//!   the webhook injects for it, UID 0 with only `CAP_KILL`: this sidecar
//!   cannot read the workers' `/proc/<pid>/fd` (ptrace read access: the
//!   trainer holds capabilities it does not), which the test shows first;
//! - a trainer of UID 1000 beside the same sidecar (the image's user, not
//!   known to the webhook): another user, again no `/proc/<pid>/fd`;
//! - a trainer of UID 1000 beside a sidecar of UID 1000 without
//!   capabilities (the manifest gives the UID): readable, and torch's node
//!   rank is read from the workers' environment too.
//!
//! The same three with warm workers (trainwire's rendezvous handler,
//! `--start-method forkserver --run-path` as the webhook injects for a plain
//! `torchrun script.py`): a worker forked by the agent's forkserver carries
//! the forkserver's environment, so torch's node rank comes from the
//! handler's `node.json` in every case, and must be the rank the trainer
//! logs.
//!
//! Needs root (namespaces, `setpriv` to other users). With `CI=true` a
//! missing prerequisite fails the test; elsewhere it is reported as skipped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rstest::rstest;
use serde_json::Value;
use trainwire_sidecar::env as tw;
use trainwire_tests::netns::{self, Network, Node};
use trainwire_tests::process::{Log, Proc, Tag, descendants};
use trainwire_tests::torch;

const PORT: u16 = tw::DEFAULT_HEALTH_PORT;
const STORE_PORT: u16 = 29500;
/// Where the stand-in workers listen for the other pod's.
const STANDIN_PORT: u16 = 29700;
/// How long training may take to be seen (torch's start on a loaded
/// 2-core machine included).
const SEEN_WITHIN: Duration = Duration::from_secs(150);

/// What a container runtime applies at exec.
#[derive(Debug, Clone)]
struct Identity {
    uid: u32,
    caps: &'static [&'static str],
}

/// The runtime's default capabilities of a root container (containerd's).
const RUNTIME_DEFAULT: &[&str] = &[
    "chown",
    "dac_override",
    "fsetid",
    "fowner",
    "mknod",
    "net_raw",
    "setgid",
    "setuid",
    "setfcap",
    "setpcap",
    "net_bind_service",
    "sys_chroot",
    "kill",
    "audit_write",
];

impl Identity {
    /// `setpriv` arguments that do what runc does.
    fn setpriv(&self) -> String {
        let mut bounding = "-all".to_string();
        for cap in self.caps {
            bounding.push_str(&format!(",+{cap}"));
        }
        format!(
            "setpriv --reuid={uid} --regid={uid} --clear-groups --bounding-set={bounding} --inh-caps=-all",
            uid = self.uid
        )
    }
}

/// The trainer's user and the sidecar's, and whether the sidecar may read
/// the workers' descriptors.
struct Case {
    trainer: Identity,
    sidecar: Identity,
    fd_readable: bool,
}

fn case(name: &str) -> Case {
    let root_trainer = Identity {
        uid: 0,
        caps: RUNTIME_DEFAULT,
    };
    let user = Identity {
        uid: 1000,
        caps: &[],
    };
    let root_with_kill = Identity {
        uid: 0,
        caps: &["kill"],
    };
    match name {
        "root-trainer" => Case {
            trainer: root_trainer,
            sidecar: root_with_kill,
            fd_readable: false,
        },
        "other-user" => Case {
            trainer: user,
            sidecar: root_with_kill,
            fd_readable: false,
        },
        _ => Case {
            trainer: user.clone(),
            sidecar: user,
            fd_readable: true,
        },
    }
}

/// An agent shaped like torchrun's whose two workers (in their own
/// sessions, given torchrun's variables) exchange traffic with the other
/// pod's: one serves, one talks.
const STANDIN_AGENT: &str = r#"
import os, subprocess, sys
peer, port = sys.argv[1], sys.argv[2]
WORKER = r'''
import socket, sys, time, threading
role, peer, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def echo(c):
    while True:
        data = c.recv(65536)
        if not data:
            return
        c.sendall(data)
if role == "serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(8)
    while True:
        c, _ = s.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
while True:
    try:
        c = socket.create_connection((peer, port), timeout=2)
        break
    except OSError:
        time.sleep(0.2)
print("connected", flush=True)
while True:
    c.sendall(b"x" * 4096)
    got = 0
    while got < 4096:
        got += len(c.recv(65536))
    time.sleep(0.2)
'''
# torch's variables as torchrun gives them: MASTER_PORT names the store the
# workers meet at, never their collective's port.
env = dict(os.environ, MASTER_ADDR=peer, MASTER_PORT=str(int(port) + 1), WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
workers = [
    subprocess.Popen([sys.executable, "-c", WORKER, role, peer, port], start_new_session=True, env=dict(env, GROUP_RANK="0"))
    for role in ("serve", "talk")
]
for w in workers:
    w.wait()
"#;

/// The trainer a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trainer {
    Torchrun,
    /// torchrun with trainwire's handler and forkserver workers.
    Warm,
    StandIn,
}

/// A Python any user may run (the stand-in's).
const ANY_USER_PYTHON: &str = "/usr/bin/python3";

struct Pod {
    node: Node,
    _proc: Proc,
}

struct World {
    net: Network,
    pods: Vec<Pod>,
    log: Log,
    dir: tempfile::TempDir,
    _tag: Tag,
}

impl World {
    fn status(&self, rank: usize) -> Option<Value> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], PORT));
        let body = netns::http_get(&self.pods.get(rank)?.node.ns, addr, "/status").ok()?;
        serde_json::from_str(&body).ok()
    }

    fn files(&self) -> String {
        let mut out = String::new();
        for rank in 0..self.pods.len() {
            for what in ["sidecar", "trainer"] {
                let path = self.dir.path().join(format!("{what}-{rank}.log"));
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {what} {rank} ---\n"));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            out.push_str(&format!(
                "--- status {rank} ---\n{}\n",
                self.status(rank)
                    .map(|s| format!("{s:#}"))
                    .unwrap_or_default()
            ));
        }
        out.push_str(&self.log.tail(40));
        out
    }

    #[track_caller]
    fn until(&self, what: &str, limit: Duration, mut pred: impl FnMut() -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if pred() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "timed out after {limit:?} waiting for {what}\n{}",
            self.files()
        );
    }

    /// The rank the trainer of pod `rank` logged at its (last) start:
    /// torch's node rank with one worker per node.
    fn logged_rank(&self, rank: usize) -> Option<u64> {
        let text =
            std::fs::read_to_string(self.dir.path().join(format!("trainer-{rank}.log"))).ok()?;
        text.lines()
            .rev()
            .filter_map(torch::TrainEvent::parse)
            .filter(|e| e.event == "start")
            .filter_map(|e| e.num("rank"))
            .next()
    }

    /// How many processes a forkserver that pod `rank`'s agent started
    /// forked (the forkserver does not carry the agent's `-X` tag: found
    /// as the agent's child that runs `multiprocessing.forkserver`).
    fn forked_workers(&self, rank: usize) -> usize {
        let tag = format!("trainwire_agent={}.{rank}", self._tag.value());
        let cmdline = |pid: i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default()
        };
        let ppid = |pid: i32| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 1..];
            after.split_whitespace().nth(1)?.parse::<i32>().ok()
        };
        let agents = trainwire_tests::process::pids_with_cmdline("python", &tag);
        let forkservers: Vec<i32> = agents
            .iter()
            .flat_map(|&a| descendants(a))
            .filter(|&p| {
                ppid(p).is_some_and(|pp| agents.contains(&pp))
                    && cmdline(p).contains("multiprocessing.forkserver")
            })
            .collect();
        forkservers
            .iter()
            .flat_map(|&f| descendants(f))
            .filter(|&p| ppid(p).is_some_and(|pp| forkservers.contains(&pp)))
            .count()
    }

    /// The host PIDs of the trainer's workers in pod `rank` (the agent's
    /// children, found by the tag on its command line).
    fn workers(&self, tag: &str) -> Vec<i32> {
        trainwire_tests::process::pids_with_cmdline("python", tag)
            .into_iter()
            .flat_map(descendants)
            .collect()
    }
}

/// Whether the test may run here.
fn prerequisites(test: &str) -> bool {
    let missing = if !trainwire_tests::process::is_root() {
        Some("not running as root (namespaces and setpriv to other users need it)".to_string())
    } else if !Path::new(ANY_USER_PYTHON).exists() {
        Some(format!("{ANY_USER_PYTHON} is missing"))
    } else {
        ["setpriv", "unshare"].into_iter().find_map(|tool| {
            let ok = Command::new(tool)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            (!ok).then(|| format!("`{tool}` (util-linux) is missing"))
        })
    };
    trainwire_tests::require(test, trainwire_tests::Prerequisite::from_missing(missing))
        && netns::require_netns(test)
}

/// The interpreter torch runs in, and the directory under `/root` it lives
/// in, if any (a trainer of another user reaches it through a mount of its
/// own: `/root` is not searchable by others).
fn torch_python() -> Result<(String, Option<String>), String> {
    let out = Command::new(torch::python())
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .map_err(|e| format!("run {}: {e}", torch::python()))?;
    let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let under_root = exe
        .strip_prefix("/root/")
        .and_then(|rest| rest.split('/').next())
        .map(|top| format!("/root/{top}"));
    Ok((exe, under_root))
}

fn copy_executable(from: &Path, dir: &Path) -> PathBuf {
    let to = dir.join(from.file_name().expect("file name"));
    std::fs::copy(from, &to).expect("copy");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    to
}

fn start(test: &str, case: &Case, trainer: Trainer) -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let ckpt = dir.path().join("checkpoints");
    std::fs::create_dir(&ckpt).expect("mkdir");
    std::fs::set_permissions(&ckpt, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let bin = copy_executable(
        &trainwire_tests::sidecar_binary().expect("the sidecar binary"),
        dir.path(),
    );
    let train = dir.path().join("train.py");
    std::fs::copy(torch::train_script(), &train).expect("copy train.py");
    let tag = Tag::new("truthseen");
    let mut world = World {
        net: Network::create("truth").unwrap_or_else(|e| panic!("{test}: {e}")),
        pods: Vec::new(),
        log: Log::new("training-seen"),
        dir,
        _tag: tag,
    };
    // The rendezvous handler, installed as the init container does (the
    // channel directories are the pods' own).
    let handler = world.dir.path().join("python");
    if trainer == Trainer::Warm {
        let installed = Command::new(&bin)
            .arg("install-rendezvous-handler")
            .arg(&handler)
            .arg("--channel")
            .arg(world.dir.path().join("channel-0"))
            .status()
            .expect("install-rendezvous-handler");
        assert!(
            installed.success(),
            "install-rendezvous-handler: {installed}"
        );
        let channel = world.dir.path().join("channel-1");
        std::fs::create_dir(&channel).expect("mkdir");
        std::fs::set_permissions(&channel, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    }
    let (python, under_root) = match trainer {
        Trainer::Torchrun | Trainer::Warm => {
            torch_python().unwrap_or_else(|e| panic!("{test}: {e}"))
        }
        Trainer::StandIn => (ANY_USER_PYTHON.to_string(), None),
    };
    for rank in 0..2u32 {
        let node = world
            .net
            .add_node(
                &format!("n{rank}"),
                &format!("node-{rank}"),
                Network::addr(10 + rank as u8),
            )
            .unwrap_or_else(|e| panic!("{test}: {e}"));
        let agent_tag = format!("trainwire_agent={}.{rank}", world._tag.value());
        let peer = format!("node-{}", 1 - rank);
        let trainer_cmd = match trainer {
            Trainer::Torchrun | Trainer::Warm => format!(
                "\"$TW_PYTHON\" -X {agent_tag} -m torch.distributed.run {} --steps 100000 --checkpoint-interval 50 --log-every 10 --sleep 0.1",
                train.display()
            ),
            Trainer::StandIn => {
                format!("\"$TW_PYTHON\" -X {agent_tag} -c \"$TW_STANDIN\" {peer} {STANDIN_PORT}")
            }
        };
        // A trainer of another user reaches an interpreter under /root
        // through a mount of the pod's own (the host's /root is untouched).
        let expose = match (&under_root, case.trainer.uid) {
            (Some(top), uid) if uid != 0 => format!(
                "mkdir -p \"$TW_DIR/expose-{rank}\" && mount --bind {top} \"$TW_DIR/expose-{rank}\" && \
                 mount -t tmpfs -o mode=755 tmpfs /root && mkdir -p {top} && \
                 mount --bind \"$TW_DIR/expose-{rank}\" {top} && "
            ),
            _ => String::new(),
        };
        let script = format!(
            "{expose}{trainer} {trainer_cmd} > \"$TW_DIR/trainer-{rank}.log\" 2>&1 & \
             {sidecar} {bin} > \"$TW_DIR/sidecar-{rank}.log\" 2>&1 & wait",
            trainer = case.trainer.setpriv(),
            sidecar = case.sidecar.setpriv(),
            bin = bin.display(),
        );
        let mut cmd = world.net.command(&node, "unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        cmd.env("TW_DIR", world.dir.path())
            .env("TW_PYTHON", &python)
            .env("TW_STANDIN", STANDIN_AGENT)
            .env("HOME", world.dir.path())
            .env("TMPDIR", world.dir.path())
            .envs([
                (tw::POD_NAME, format!("node-{rank}")),
                (tw::POD_NAMESPACE, "e2e".to_string()),
                (tw::POD_UID, format!("uid-{rank}")),
                (tw::NODE_RANK, rank.to_string()),
                (tw::NNODES, "2".to_string()),
                (tw::PEER_HOSTS, "node-{i}".to_string()),
                (tw::RDZV_HOST_RANK, "0".to_string()),
                (tw::RDZV_PORT, STORE_PORT.to_string()),
                (tw::HEALTH_PORT, PORT.to_string()),
                (tw::BIND_ADDRESS, "0.0.0.0".to_string()),
                (tw::AGENT_MATCH, agent_tag.clone()),
                ("RUST_LOG", "info".to_string()),
            ])
            .envs(torch::webhook_env(
                "2",
                1,
                &format!("node-0:{STORE_PORT}"),
                "seen",
                rank,
            ))
            .env("CHECKPOINT_DIR", &ckpt)
            .env("GLOO_SOCKET_IFNAME", "eth0");
        if trainer == Trainer::Warm {
            // What the webhook injects with the handler (the trainer's and
            // the sidecar's channel directory are one).
            cmd.env(
                "PET_RDZV_BACKEND",
                trainwire_sidecar::rendezvous::HANDLER_BACKEND,
            )
            .env("PYTHONPATH", &handler)
            .env(
                tw::RENDEZVOUS_DIR,
                world.dir.path().join(format!("channel-{rank}")),
            )
            .env("PET_START_METHOD", "forkserver")
            .env("PET_RUN_PATH", "1");
        }
        let proc = Proc::spawn_as(
            &mut cmd,
            world._tag.value(),
            &world.log,
            &format!("pod-{rank}| "),
        )
        .unwrap_or_else(|e| panic!("{test}: start pod {rank}: {e}"));
        world.pods.push(Pod { node, _proc: proc });
    }
    world
}

fn run(test: &str, name: &str, trainer: Trainer) {
    if !prerequisites(test) {
        return;
    }
    if trainer != Trainer::StandIn && !torch::require_torch(test) {
        return;
    }
    let case = case(name);
    let world = start(test, &case, trainer);
    let tag = world._tag.value().to_string();
    world.until("the workers of both pods", SEEN_WITHIN, || {
        world.workers(&tag).len() >= 2
    });
    // What the sidecar may read of the workers, as its own user would:
    // the same rights, in the same kind of process. (The directory of a
    // process of the same UID lists; its links need ptrace read access.)
    let worker = world.workers(&tag)[0];
    let read = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} readlink /proc/{worker}/fd/0",
            case.sidecar.setpriv()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run ls as the sidecar");
    assert_eq!(
        read.status.success(),
        case.fd_readable,
        "reading the worker's /proc/{worker}/fd/0 as the sidecar: {}",
        String::from_utf8_lossy(&read.stderr)
    );
    let mut seen = Vec::new();
    for rank in 0..2 {
        world.until(
            &format!("pod {rank}'s sidecar to see training"),
            SEEN_WITHIN,
            || {
                world
                    .status(rank)
                    .is_some_and(|s| s["training"]["seen_by"].is_string())
            },
        );
        let status = world.status(rank).unwrap_or_default();
        let training = &status["training"];
        assert_eq!(
            training["seen_by"],
            "collective-traffic",
            "pod {rank}: {status:#}\n{}",
            world.files()
        );
        // torch's node rank comes from the workers' environment, readable
        // only as their user; with warm workers from the handler's node
        // file, whoever the trainer runs as.
        if trainer == Trainer::Warm {
            let logged = world.logged_rank(rank);
            assert!(
                logged.is_some(),
                "pod {rank}: no start line\n{}",
                world.files()
            );
            assert_eq!(
                training["torch_rank"].as_u64(),
                logged,
                "pod {rank}: {training}\n{}",
                world.files()
            );
            assert!(
                world.forked_workers(rank) > 0,
                "pod {rank}: no worker forked by a forkserver\n{}",
                world.files()
            );
        }
        if trainer == Trainer::Torchrun {
            assert_eq!(
                training["torch_rank"].is_u64(),
                case.fd_readable,
                "pod {rank}: {training}"
            );
        }
        seen.push(training.clone());
    }
    println!("TRAINING_SEEN case={name} trainer={trainer:?} {seen:?}");
}

#[rstest]
#[case::root_trainer("root-trainer")]
#[case::trainer_of_another_user("other-user")]
#[case::trainer_of_the_sidecars_user("same-user")]
fn a_stand_in_collective_is_seen_by_its_traffic(#[case] name: &str) {
    run(
        "a_stand_in_collective_is_seen_by_its_traffic",
        name,
        Trainer::StandIn,
    );
}

#[rstest]
#[case::root_trainer("root-trainer")]
#[case::trainer_of_another_user("other-user")]
#[case::trainer_of_the_sidecars_user("same-user")]
fn torchrun_training_is_seen_by_its_traffic(#[case] name: &str) {
    run(
        "torchrun_training_is_seen_by_its_traffic",
        name,
        Trainer::Torchrun,
    );
}

#[rstest]
#[case::root_trainer("root-trainer")]
#[case::trainer_of_another_user("other-user")]
#[case::trainer_of_the_sidecars_user("same-user")]
fn warm_workers_training_is_seen_with_its_torch_rank(#[case] name: &str) {
    run(
        "warm_workers_training_is_seen_with_its_torch_rank",
        name,
        Trainer::Warm,
    );
}
