use super::*;
use k8s_openapi::api::core::v1::Pod;
use rstest::rstest;
use serde_json::json;
use trainwire_contract::peer_loss::PeerLossRecord;
use trainwire_contract::world::{self, Stopped};

fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A pod of rank `rank`: Ready since `ready_since` (None: not Ready).
fn pod(rank: u32, uid: &str, ready_since: Option<i64>) -> PodView {
    PodView {
        name: format!("llama-{rank}"),
        uid: uid.to_string(),
        rank,
        ready: ready_since.is_some(),
        ready_since: ready_since.map(at),
        lost: None,
        trainer_exit: None,
        trainer_down: false,
        sidecar: true,
        created: None,
        peer_loss: None,
        checkpoint: None,
        stall: None,
    }
}

fn deleted(mut p: PodView, when: i64) -> PodView {
    p.lost = Some((at(when), "pod-deleted"));
    p
}

fn reported(mut p: PodView, generation: u64, lost_rank: u32, when: i64) -> PodView {
    p.peer_loss = Some(PeerLossRecord {
        generation,
        lost_rank,
        confirmed_by: "pod-deleted".into(),
        action: "report".into(),
        result: "reported".into(),
        at: at(when).to_string(),
        ..PeerLossRecord::default()
    });
    p
}

/// The sidecar's record says the trainer's workers run since `when`.
fn training(mut p: PodView, when: i64) -> PodView {
    let mut r = p.peer_loss.take().unwrap_or_default();
    r.training_since = Some(at(when).to_string());
    p.peer_loss = Some(r);
    p
}

/// The last loss of `s` resumed at `when`, by `by`.
fn assert_resumed(s: &WorldStatus, when: i64, by: &str) {
    let l = s.last_loss.clone().unwrap_or_default();
    assert_eq!(l.resumed_at, Some(at(when).to_string()), "{l:?}");
    assert_eq!(l.resumed_by.as_deref(), Some(by), "{l:?}");
}

fn of(expected: u32) -> WorldOf {
    WorldOf {
        expected,
        ..WorldOf::default()
    }
}

/// Feed `steps` (time, pods) to one memory; the statuses after each.
fn run(workload: &WorldOf, steps: Vec<(i64, Vec<PodView>)>) -> Vec<WorldStatus> {
    let mut memory = Memory::default();
    let mut status: Option<WorldStatus> = None;
    let mut out = Vec::new();
    for (t, pods) in steps {
        let s = observe(status.as_ref(), &mut memory, workload, &pods, None, at(t));
        out.push(s.clone());
        status = Some(s);
    }
    out
}

#[test]
fn a_world_forms_then_runs() {
    let w = of(2);
    let s = run(
        &w,
        vec![
            (0, vec![pod(0, "a", None)]),
            (5, vec![pod(0, "a", Some(4)), pod(1, "b", None)]),
            (9, vec![pod(0, "a", Some(4)), pod(1, "b", Some(8))]),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(phases, [Phase::Forming, Phase::Forming, Phase::Running]);
    assert_eq!(
        s[1].nodes,
        Nodes {
            ready: 1,
            expected: 2,
            spares: 0
        }
    );
    assert_eq!(
        s[2].nodes,
        Nodes {
            ready: 2,
            expected: 2,
            spares: 0
        }
    );
    assert_eq!(s[2].generation, 0);
    assert_eq!(s[2].last_loss, None);
}

fn took_over(mut p: PodView, generation: u64, lost_rank: u32, when: i64) -> PodView {
    p.peer_loss = Some(PeerLossRecord {
        generation,
        lost_rank,
        confirmed_by: String::new(),
        action: peer_loss::SPARE_TOOK_OVER.into(),
        result: "training".into(),
        at: at(when).to_string(),
        ..PeerLossRecord::default()
    });
    p
}

/// torch takes the spare in before the news of the loss is all in: rank 0
/// is deleted at 100, the spare trains from 102, and the old pod object is
/// gone and a survivor's sidecar's report of the loss (at 105) are seen
/// only at 106. News of the same loss does not move the resumption past
/// the training seen before it (the real node: torch's own recovery
/// at +0.6 s, the sidecars' confirmation at +1.5 s).
/// Two training pods and one hot spare.
fn spared_world() -> WorldOf {
    WorldOf {
        expected: 3,
        spares: 1,
        ..WorldOf::default()
    }
}

#[test]
fn news_of_the_same_loss_after_the_take_over_does_not_hide_it() {
    let (w, (a, b, c)) = (
        spared_world(),
        (
            || pod(0, "a", Some(1)),
            || pod(1, "b", Some(1)),
            || pod(2, "c", Some(1)),
        ),
    );
    let s = run(
        &w,
        vec![
            (0, vec![a(), b(), c()]),
            (101, vec![deleted(a(), 100), b(), c()]),
            (
                106,
                vec![reported(b(), 1, 0, 105), took_over(c(), 1, 0, 102)],
            ),
        ],
    );
    let loss = s[2].last_loss.clone().unwrap_or_default();
    assert_eq!((loss.rank, loss.generation), (0, 1));
    assert_eq!(s[2].phase, Phase::Running, "{:?}", s[2]);
    assert_eq!(loss.resumed_at, Some(at(102).to_string()));
}

/// A world of 2 with one hot spare (3 pods): rank 0 is deleted at 100, the
/// spare (rank 2) says at 112 that it trains in its place: resumed at 112
/// (12 s), Running while the replacement is still pending; the world
/// stays Running with 2 of 3 Ready; 1 of 3 Ready is not enough.
#[test]
fn a_spare_taking_over_resumes_the_world_before_the_replacement() {
    let w = spared_world();
    let (a, b, c) = (
        || pod(0, "a", Some(1)),
        || pod(1, "b", Some(1)),
        || pod(2, "c", Some(1)),
    );
    let s = run(
        &w,
        vec![
            (0, vec![a(), b(), c()]),
            (101, vec![deleted(a(), 100), b(), c()]),
            (105, vec![b(), c()]),
            (113, vec![b(), took_over(c(), 1, 0, 112)]),
            (150, vec![pod(0, "d", None), b(), took_over(c(), 1, 0, 112)]),
            (200, vec![b()]),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Running,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Running,
            Phase::Running,
            Phase::Recovering
        ]
    );
    let loss = s[3].last_loss.clone().unwrap_or_default();
    assert_eq!((loss.rank, loss.generation), (0, 1));
    assert_eq!(loss.resumed_at, Some(at(112).to_string()));
    assert_eq!(loss.recovery_seconds, Some(12));
    assert_eq!(
        s[4].nodes,
        Nodes {
            ready: 2,
            expected: 3,
            spares: 1
        }
    );
    // The take-over record is not a loss of its own.
    assert_eq!(s[4].generation, 1);
    // Rank 2 gone too (and the replacement): one of three is not a world.
    assert_eq!(s[5].generation, 3);
}

/// A silent loss (a node that lost power: its pod stays Ready): rank 0
/// goes quiet at 100, the spare (rank 2) trains in its place from 108, and
/// the survivors' sidecars report the loss only at their confirmation
/// (130), saying when they first suspected it. The loss is at 100 and
/// resumed at 108 by the take-over, not at the report.
#[test]
fn a_loss_reported_at_its_confirmation_dates_from_its_suspicion() {
    let w = WorldOf {
        expected: 3,
        spares: 1,
        ..WorldOf::default()
    };
    let (a, b, c) = (
        || pod(0, "a", Some(1)),
        || pod(1, "b", Some(1)),
        || pod(2, "c", Some(1)),
    );
    let suspected = |mut p: PodView| {
        if let Some(r) = p.peer_loss.as_mut() {
            r.suspected_at = Some(at(100).to_string());
        }
        p
    };
    let s = run(
        &w,
        vec![
            (0, vec![a(), b(), c()]),
            (109, vec![a(), b(), took_over(c(), 1, 0, 108)]),
            (
                131,
                vec![
                    a(),
                    suspected(reported(b(), 1, 0, 130)),
                    took_over(c(), 1, 0, 108),
                ],
            ),
        ],
    );
    let loss = s[2].last_loss.clone().unwrap_or_default();
    assert_eq!(
        (loss.rank, loss.at.as_str()),
        (0, at(100).to_string().as_str())
    );
    assert_eq!(loss.resumed_at, Some(at(108).to_string()));
    assert_eq!(loss.resumed_by.as_deref(), Some("spare-took-over"));
    assert_eq!(s[2].phase, Phase::Running);
    // Without the suspicion time, the take-over before the report would
    // not count: the loss would date from the report.
    let s = run(
        &w,
        vec![
            (0, vec![a(), b(), c()]),
            (
                131,
                vec![a(), reported(b(), 1, 0, 130), took_over(c(), 1, 0, 108)],
            ),
        ],
    );
    let loss = s[1].last_loss.clone().unwrap_or_default();
    assert_eq!(loss.at, at(130).to_string());
}

/// Rank 1 deleted at 100; both sidecars' records and the deletion are one
/// loss; the replacement Ready at 160 resumes it (60 s).
#[test]
fn a_loss_told_three_ways_is_one_loss_and_resumes_when_whole() {
    let w = of(2);
    let s = run(
        &w,
        vec![
            (0, vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))]),
            (
                101,
                vec![pod(0, "a", Some(1)), deleted(pod(1, "b", Some(1)), 100)],
            ),
            (
                103,
                vec![
                    reported(pod(0, "a", Some(1)), 1, 1, 102),
                    deleted(pod(1, "b", Some(1)), 100),
                ],
            ),
            (
                150,
                vec![reported(pod(0, "a", Some(1)), 1, 1, 102), pod(1, "c", None)],
            ),
            (
                161,
                vec![
                    reported(pod(0, "a", Some(1)), 1, 1, 102),
                    pod(1, "c", Some(160)),
                ],
            ),
            (
                168,
                vec![
                    training(reported(pod(0, "a", Some(1)), 1, 1, 102), 166),
                    pod(1, "c", Some(160)),
                ],
            ),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Running,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Running
        ]
    );
    // Whole at 161, but training is not seen yet: Recovering, and it says
    // what for; Ready pods are not a resumption.
    assert!(
        s[4].waiting_for
            .as_deref()
            .is_some_and(|w| w.starts_with("training to be seen running")),
        "{:?}",
        s[4].waiting_for
    );
    assert_eq!(
        s[4].last_loss.as_ref().and_then(|l| l.resumed_at.clone()),
        None
    );
    assert_eq!(s[5].generation, 1);
    let loss = s[5].last_loss.clone().unwrap_or_default();
    assert_eq!(loss.rank, 1);
    assert_eq!(loss.detected_by, "pod-deleted");
    assert_eq!(loss.at, at(100).to_string());
    assert_eq!(loss.actions, ["rank 0: report reported"]);
    assert_eq!(loss.resumed_at, Some(at(166).to_string()));
    assert_eq!(loss.recovery_seconds, Some(66));
    assert_eq!(loss.resumed_by.as_deref(), Some("workers-started"));
    assert_eq!(s[5].waiting_for, None);
}

/// A second loss later is generation 2; a pod that vanished without a
/// deletion being seen (force-deleted between watches) counts too.
#[rstest]
#[case::replaced(vec![pod(0, "a", Some(1)), pod(1, "c", None)], "pod-replaced")]
#[case::gone(vec![pod(0, "a", Some(1))], "pod-gone")]
fn a_pod_that_vanished_is_a_loss(#[case] after: Vec<PodView>, #[case] how: &str) {
    let w = of(2);
    let s = run(
        &w,
        vec![
            (0, vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))]),
            (50, after),
        ],
    );
    assert_eq!(s[1].generation, 1);
    assert_eq!(s[1].phase, Phase::Recovering);
    assert_eq!(
        s[1].last_loss.as_ref().map(|l| l.detected_by.as_str()),
        Some(how)
    );
}

#[test]
fn the_first_observation_counts_nothing_and_keeps_the_history() {
    let previous = WorldStatus {
        version: 1,
        generation: 3,
        ..WorldStatus::default()
    };
    let mut memory = Memory::default();
    let pods = vec![
        reported(pod(0, "a", Some(1)), 7, 1, 0),
        deleted(pod(1, "b", Some(1)), 0),
    ];
    let s = observe(Some(&previous), &mut memory, &of(2), &pods, None, at(10));
    assert_eq!(s.generation, 3);
    // The same pods again: still nothing new.
    let s = observe(Some(&s), &mut memory, &of(2), &pods, None, at(20));
    assert_eq!(s.generation, 3);
}

#[test]
fn scaling_down_is_not_a_loss() {
    let s = run(
        &of(1),
        vec![
            (0, vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))]),
            (10, vec![pod(0, "a", Some(1))]),
        ],
    );
    assert_eq!(s[1].generation, 0);
    assert_eq!(s[1].phase, Phase::Running);
}

#[rstest]
#[case::stopped(WorldOf { expected: 0, stopped: Some(Stopped { reason: "MaxFailures".into(), ..Stopped::default() }), finished: None, spares: 0, dedicated_store: false }, Phase::Stopped)]
#[case::paused(of(0), Phase::Paused)]
#[case::completed(WorldOf { expected: 2, stopped: None, finished: Some(Phase::Completed), spares: 0, dedicated_store: false }, Phase::Completed)]
#[case::running(of(1), Phase::Running)]
fn phase_of_the_workload(#[case] w: WorldOf, #[case] phase: Phase) {
    let s = observe(
        None,
        &mut Memory::default(),
        &w,
        &[pod(0, "a", Some(1))],
        None,
        at(5),
    );
    assert_eq!(s.phase, phase);
    assert_eq!(s.stopped, w.stopped);
}

#[test]
fn the_newest_checkpoint_of_any_sidecar() {
    let mut a = pod(0, "a", Some(1));
    a.checkpoint = Some(CheckpointRecord {
        name: "step-100".into(),
        at: at(100).to_string(),
    });
    let mut b = pod(1, "b", Some(1));
    b.checkpoint = Some(CheckpointRecord {
        name: "step-200".into(),
        at: at(200).to_string(),
    });
    let s = observe(None, &mut Memory::default(), &of(2), &[a, b], None, at(300));
    assert_eq!(
        s.checkpoint,
        Some(CheckpointSeen {
            name: "step-200".into(),
            newest_at: at(200).to_string(),
            reported_by: 2
        })
    );
}

fn status(generation: u64, updated: &str) -> WorldStatus {
    WorldStatus {
        version: 1,
        generation,
        updated_at: updated.into(),
        ..WorldStatus::default()
    }
}

#[rstest]
#[case::nothing_yet(None, None, 100, Write::Now)]
#[case::same_but_the_time(Some(status(1, "x")), Some(99), 100, Write::Unchanged)]
#[case::changed_long_ago(Some(status(0, "x")), Some(50), 100, Write::Now)]
#[case::changed_too_soon(
    Some(status(0, "x")),
    Some(96),
    100,
    Write::After(Duration::from_secs(6))
)]
#[case::changed_at_the_interval(Some(status(0, "x")), Some(90), 100, Write::Now)]
#[case::running_to_forming_waits(
    Some(WorldStatus { phase: Phase::Running, ..status(1, "x") }),
    Some(99),
    100,
    Write::After(Duration::from_secs(9))
)]
#[case::into_or_out_of_recovering_at_once(
    Some(WorldStatus { phase: Phase::Recovering, ..status(1, "x") }),
    Some(99),
    100,
    Write::Now
)]
fn writes_once_per_change_and_rate_limited(
    #[case] current: Option<WorldStatus>,
    #[case] last_write: Option<i64>,
    #[case] now: i64,
    #[case] expected: Write,
) {
    let desired = status(1, "");
    assert_eq!(
        decide_write(
            current.as_ref(),
            &desired,
            last_write.map(at),
            at(now),
            Duration::from_secs(10)
        ),
        expected
    );
}

/// The controller's write is not a change of the user's: re-admitting a
/// workload after the write keeps its injection as it is, even under a
/// policy that would now inject differently.
#[test]
fn a_world_status_write_never_re_injects() {
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "llama", "namespace": "ml", "annotations": {"trainwire.dev/inject": "true"}},
        "spec": {"replicas": 2, "serviceName": "llama", "selector": {"matchLabels": {"app": "llama"}},
            "template": {"metadata": {"labels": {"app": "llama"}},
                "spec": {"containers": [{"name": "trainer", "image": "t", "command": ["torchrun", "train.py"]}]}}}
    });
    let profile = crate::policy::Profile::default();
    let mutated = match crate::mutation::mutate(&sts, None, &profile) {
        Ok(crate::mutation::Outcome::Mutated(m)) => m.object,
        other => panic!("not injected: {other:?}"),
    };
    let mut with_status = mutated.clone();
    with_status["metadata"]["annotations"][world::ANNOTATION] =
        json!(status(2, "2026-11-25T08:00:00Z").to_annotation());
    // A newer sidecar image since: a real re-injection would change the
    // template (and roll the training).
    let mut upgraded = crate::policy::Policy::default();
    upgraded.apply_sidecar_image("registry.example.invalid/trainwire-sidecar:9.9");
    let upgraded = upgraded.profile_for("ml").into_owned();
    match crate::mutation::mutate(&with_status, None, &upgraded) {
        Ok(crate::mutation::Outcome::Mutated(m)) => {
            assert!(m.patch.0.is_empty(), "re-injected: {:?}", m.patch);
            assert!(
                !m.warnings.iter().any(|w| w.contains(world::ANNOTATION)),
                "{:?}",
                m.warnings
            );
        }
        other => panic!("not injected: {other:?}"),
    }
}

/// Rank 1's trainer container exited at 50 (the pod status shows it at
/// once): a loss then, not when restartCount moves; back Ready at 62 it is
/// still Recovering until training is seen (rank 0's record at 64).
#[test]
fn a_terminated_trainer_is_a_loss_at_once_and_its_return_closes_it_when_training_is_seen() {
    let exited = |mut p: PodView, when: i64, down: bool| {
        p.trainer_exit = Some(at(when));
        p.trainer_down = down;
        if down {
            p.ready = false;
        }
        p
    };
    let s = run(
        &of(2),
        vec![
            (0, vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))]),
            (
                51,
                vec![
                    pod(0, "a", Some(1)),
                    exited(pod(1, "b", Some(50)), 50, true),
                ],
            ),
            (
                63,
                vec![
                    reported(pod(0, "a", Some(1)), 1, 1, 51),
                    exited(pod(1, "b", Some(62)), 50, false),
                ],
            ),
            (
                66,
                vec![
                    training(reported(pod(0, "a", Some(1)), 1, 1, 51), 64),
                    exited(pod(1, "b", Some(62)), 50, false),
                ],
            ),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Running,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Running
        ]
    );
    let l = s[1].last_loss.clone().unwrap_or_default();
    assert_eq!(
        (l.rank, l.detected_by.as_str(), l.at),
        (1, "container-exited", at(50).to_string())
    );
    assert_eq!(
        s[1].ranks.iter().map(|r| r.role).collect::<Vec<_>>(),
        [Role::Training, Role::Lost]
    );
    assert_eq!(s[3].generation, 1, "the sidecar's report is the same loss");
    let l = s[3].last_loss.clone().unwrap_or_default();
    assert_eq!(
        (l.resumed_at, l.recovery_seconds),
        (Some(at(64).to_string()), Some(14))
    );
}

fn store_pod(uid: &str, ready: bool, lost: Option<(i64, &'static str)>) -> StoreView {
    StoreView {
        name: format!("llama-rdzv-{uid}"),
        uid: uid.to_string(),
        ready,
        ready_since: Some(at(1)),
        lost: lost.map(|(t, how)| (at(t), how)),
    }
}

fn with_store(expected: u32, spares: u32) -> WorldOf {
    WorldOf {
        expected,
        spares,
        dedicated_store: true,
        ..WorldOf::default()
    }
}

/// Steps of (time, pods, store pods) through one memory.
fn run_with_store(
    workload: &WorldOf,
    steps: Vec<(i64, Vec<PodView>, Vec<StoreView>)>,
) -> Vec<WorldStatus> {
    let mut memory = Memory::default();
    let mut status: Option<WorldStatus> = None;
    let mut out = Vec::new();
    for (t, pods, store) in steps {
        let s = observe(
            status.as_ref(),
            &mut memory,
            workload,
            &pods,
            Some(&store),
            at(t),
        );
        out.push(s.clone());
        status = Some(s);
    }
    out
}

/// A formed world of 2 at 0 whose store exits at 100, with `pods` at 101.
fn store_exits_at_100(pods: Vec<PodView>) -> Vec<(i64, Vec<PodView>, Vec<StoreView>)> {
    vec![
        (
            0,
            vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))],
            vec![store_pod("s1", true, None)],
        ),
        (
            101,
            pods,
            vec![store_pod("s1", false, Some((100, "store-exited")))],
        ),
    ]
}

/// The store's pod is deleted at 100: a loss of its own; every trainer
/// exits with it (part of that loss, not three more); the new store and
/// the trainers come back; training seen at 110 resumes it.
#[test]
fn a_lost_store_is_one_loss_of_its_own() {
    let w = with_store(2, 0);
    let up = || {
        vec![
            reported(pod(0, "a", Some(1)), 1, 1, 0),
            pod(1, "b", Some(1)),
        ]
    };
    let down = |p: PodView| PodView {
        trainer_exit: Some(at(101)),
        trainer_down: true,
        ready: false,
        ..p
    };
    let s = run_with_store(
        &w,
        vec![
            (0, up(), vec![store_pod("s1", true, None)]),
            (
                100,
                up(),
                vec![store_pod("s1", false, Some((100, "store-deleted")))],
            ),
            (
                102,
                up().into_iter().map(down).collect(),
                vec![store_pod("s2", false, None)],
            ),
            (106, up(), vec![store_pod("s2", true, None)]),
            (
                112,
                vec![
                    training(reported(pod(0, "a", Some(1)), 1, 1, 0), 110),
                    pod(1, "b", Some(1)),
                ],
                vec![store_pod("s2", true, None)],
            ),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Running,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Running
        ]
    );
    assert_eq!(s[4].generation, 1);
    let l = s[4].last_loss.clone().unwrap_or_default();
    assert_eq!(l.store.as_deref(), Some("llama-rdzv-s1"));
    assert_eq!(l.detected_by, "store-deleted");
    assert!(
        l.actions.contains(&"rank 1: trainer exited".to_string()),
        "{:?}",
        l.actions
    );
    assert_eq!(l.resumed_at, Some(at(110).to_string()));
    assert_eq!(s[1].store.as_ref().map(|st| st.available), Some(false));
    assert!(
        s[1].waiting_for
            .as_deref()
            .is_some_and(|w| w.contains("rendezvous store")),
        "{:?}",
        s[1].waiting_for
    );
    assert_eq!(s[4].store.as_ref().map(|st| st.available), Some(true));
}

/// A pod's sidecar saw its own trainer restarted: the new agent started at
/// `agent`, its workers at `workers` (a `trainer-restarted` record).
fn restarted(mut p: PodView, agent: i64, workers: i64) -> PodView {
    p.peer_loss = Some(PeerLossRecord {
        generation: 0,
        lost_rank: p.rank,
        action: peer_loss::TRAINER_RESTARTED.into(),
        result: "training".into(),
        at: at(agent).to_string(),
        training_since: Some(at(workers).to_string()),
        ..PeerLossRecord::default()
    });
    p
}

/// A first store loss, no sidecar ever recorded a loss: the trainers exit
/// and come back; the sidecars' `trainer-restarted` records (not losses)
/// give `resumedAt` as their workers' start, no checkpoint needed.
/// The store is lost at 100 while a step is in flight: rank 0 still writes
/// its checkpoint at 100.8 (the step needs no store), then every agent
/// exits. That checkpoint does not resume the store's loss; the trainers'
/// records (workers in their collective again at 109) do.
#[test]
fn a_checkpoint_in_flight_does_not_resume_a_store_loss() {
    let w = with_store(2, 0);
    let checkpointed = |mut p: PodView| {
        p.checkpoint = Some(CheckpointRecord {
            name: "step-330".into(),
            at: "2027-01-15T08:01:40.8Z".into(),
        });
        p
    };
    assert_eq!(
        parse_time("2027-01-15T08:01:40.8Z").map(|t| t.as_second()),
        Some(at(100).as_second())
    );
    let mut steps = store_exits_at_100(vec![
        checkpointed(pod(0, "a", Some(1))),
        pod(1, "b", Some(1)),
    ]);
    steps.push((
        110,
        vec![
            checkpointed(restarted(pod(0, "a", Some(1)), 104, 109)),
            restarted(pod(1, "b", Some(1)), 104, 109),
        ],
        vec![store_pod("s1", true, None)],
    ));
    let s = run_with_store(&w, steps);
    assert_eq!(s[1].phase, Phase::Recovering, "{:?}", s[1].last_loss);
    assert_resumed(&s[2], 109, "workers-started");
}

/// The world status names what the sidecar saw training by: its record's
/// `trainingSeenBy`; a record without one (an older sidecar) reads as
/// `workers-started`.
#[test]
fn resumed_by_names_the_sidecars_observation() {
    let w = with_store(2, 0);
    let seen_by = |mut p: PodView, by: &str| {
        if let Some(r) = p.peer_loss.as_mut() {
            r.training_seen_by = Some(by.to_string());
        }
        p
    };
    let mut steps = store_exits_at_100(vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))]);
    steps.push((
        111,
        vec![
            restarted(pod(0, "a", Some(1)), 104, 110),
            seen_by(
                restarted(pod(1, "b", Some(1)), 104, 109),
                "collective-traffic",
            ),
        ],
        vec![store_pod("s1", true, None)],
    ));
    let s = run_with_store(&w, steps);
    assert_resumed(&s[2], 109, "collective-traffic");
}

#[test]
fn a_store_loss_resumes_from_the_trainers_restarted_records() {
    let w = with_store(2, 0);
    let up = || vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))];
    let down = |p: PodView| PodView {
        trainer_exit: Some(at(101)),
        trainer_down: true,
        ready: false,
        ..p
    };
    let back = |p: PodView| PodView {
        trainer_exit: Some(at(101)),
        ..p
    };
    let s = run_with_store(
        &w,
        vec![
            (0, up(), vec![store_pod("s1", true, None)]),
            (
                100,
                up(),
                vec![store_pod("s1", false, Some((100, "store-deleted")))],
            ),
            (
                102,
                up().into_iter().map(down).collect(),
                vec![store_pod("s2", false, None)],
            ),
            (
                106,
                up().into_iter().map(back).collect(),
                vec![store_pod("s2", true, None)],
            ),
            (
                110,
                vec![
                    back(restarted(pod(0, "a", Some(1)), 104, 107)),
                    back(restarted(pod(1, "b", Some(1)), 104, 108)),
                ],
                vec![store_pod("s2", true, None)],
            ),
        ],
    );
    let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Running,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Recovering,
            Phase::Running
        ]
    );
    // One loss: the records are not losses.
    assert_eq!(s[4].generation, 1);
    let l = s[4].last_loss.clone().unwrap_or_default();
    assert_eq!(l.store.as_deref(), Some("llama-rdzv-s1"));
    assert_resumed(&s[4], 107, "workers-started");
    assert_eq!(l.recovery_seconds, Some(7));
    assert!(
        !l.actions.iter().any(|a| a.contains("trainer-restarted")),
        "{:?}",
        l.actions
    );
    assert!(
        s[3].waiting_for
            .as_deref()
            .is_some_and(|w| w.starts_with("training to be seen running")),
        "{:?}",
        s[3].waiting_for
    );
    // A record of a restart before the trainers' last exit is not training.
    let early = run_with_store(
        &w,
        vec![
            (0, up(), vec![store_pod("s1", true, None)]),
            (
                100,
                up(),
                vec![store_pod("s1", false, Some((100, "store-deleted")))],
            ),
            (
                102,
                up().into_iter().map(down).collect(),
                vec![store_pod("s2", true, None)],
            ),
            (
                110,
                vec![
                    back(restarted(pod(0, "a", Some(1)), 40, 50)),
                    back(restarted(pod(1, "b", Some(1)), 40, 50)),
                ],
                vec![store_pod("s2", true, None)],
            ),
        ],
    );
    assert_eq!(early[3].phase, Phase::Recovering);
    assert_eq!(early[3].generation, 1);
}

/// A store pod that vanishes between two looks is a loss too.
#[test]
fn a_store_gone_unseen_is_a_loss() {
    let s = run_with_store(
        &with_store(1, 0),
        vec![
            (
                0,
                vec![pod(0, "a", Some(1))],
                vec![store_pod("s1", true, None)],
            ),
            (50, vec![pod(0, "a", Some(1))], vec![]),
        ],
    );
    let l = s[1].last_loss.clone().unwrap_or_default();
    assert_eq!(
        (l.detected_by.as_str(), l.store.as_deref()),
        ("store-gone", Some("llama-rdzv-s1"))
    );
    assert_eq!(s[1].phase, Phase::Recovering);
}

/// A world scaled to zero with a loss open shows no open loss.
#[test]
fn a_paused_world_has_no_open_loss() {
    let mut memory = Memory::default();
    let pods = vec![pod(0, "a", Some(1)), pod(1, "b", Some(1))];
    let s = observe(None, &mut memory, &of(2), &pods, None, at(0));
    let s = observe(
        Some(&s),
        &mut memory,
        &of(2),
        &[pods[0].clone()],
        None,
        at(10),
    );
    assert_eq!(s.phase, Phase::Recovering);
    let s = observe(Some(&s), &mut memory, &of(0), &[], None, at(20));
    assert_eq!(s.phase, Phase::Paused);
    let l = s.last_loss.clone().unwrap_or_default();
    assert!(!l.is_open());
    assert_eq!(l.closed_by.as_deref(), Some("paused"));
}

/// Pods without trainwire's sidecar cannot show training: the loss ends
/// as not observable once whole, with no resumedAt.
#[test]
fn without_a_sidecar_a_loss_ends_unobserved() {
    let bare = |p: PodView| PodView {
        sidecar: false,
        ..p
    };
    let s = run(
        &of(2),
        vec![
            (
                0,
                vec![bare(pod(0, "a", Some(1))), bare(pod(1, "b", Some(1)))],
            ),
            (10, vec![bare(pod(0, "a", Some(1)))]),
            (
                30,
                vec![bare(pod(0, "a", Some(1))), bare(pod(1, "c", Some(29)))],
            ),
        ],
    );
    assert_eq!(s[2].phase, Phase::Running);
    let l = s[2].last_loss.clone().unwrap_or_default();
    assert_eq!(
        (l.resumed_at, l.closed_by.as_deref()),
        (None, Some("not-observable"))
    );
}

/// With hot spares, the roles: the spare that took over trains; Ready pods
/// nobody reported fill the training places by index, the rest are spares.
#[rstest]
#[case::by_index(vec![pod(0, "a", Some(1)), pod(1, "b", Some(1)), pod(2, "c", Some(1))], [Role::Training, Role::Training, Role::Spare])]
#[case::took_over(vec![pod(1, "b", Some(1)), took_over(pod(2, "c", Some(1)), 1, 0, 5)], [Role::Training, Role::Training, Role::Training])]
#[case::waiting(vec![pod(0, "a", None), pod(1, "b", Some(1)), pod(2, "c", Some(1))], [Role::Waiting, Role::Training, Role::Training])]
fn roles_with_spares(#[case] pods: Vec<PodView>, #[case] roles: [Role; 3]) {
    let w = WorldOf {
        expected: 3,
        spares: 1,
        ..WorldOf::default()
    };
    let s = observe(None, &mut Memory::default(), &w, &pods, None, at(10));
    let got: Vec<Role> = s.ranks.iter().map(|r| r.role).collect();
    assert_eq!(got, roles[..got.len()].to_vec());
}

/// A deletion's time is when it was asked for: `deletionTimestamp` minus
/// the grace period. A Job pod whose trainer ended with 0 has not lost it;
/// a terminated trainer (restarted or not yet) is seen from its state.
#[rstest]
#[case::terminated(json!({"state": {"terminated": {"exitCode": 137, "finishedAt": "2027-01-15T08:00:10Z"}}}), "Always", Some(10), true)]
#[case::restarted(json!({"state": {"running": {}}, "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2027-01-15T08:00:10Z"}}}), "Always", Some(10), false)]
#[case::back_off(json!({"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2027-01-15T08:00:10Z"}}}), "Always", Some(10), true)]
#[case::job_done(json!({"state": {"terminated": {"exitCode": 0, "finishedAt": "2027-01-15T08:00:10Z"}}}), "Never", None, false)]
#[case::running(json!({"state": {"running": {}}}), "Always", None, false)]
fn pod_view_reads_the_trainer_state(
    #[case] state: serde_json::Value,
    #[case] restart: &str,
    #[case] exit: Option<i64>,
    #[case] down: bool,
) {
    let mut c =
        json!({"name": "trainer", "image": "t", "imageID": "", "ready": false, "restartCount": 0});
    if let (Some(c), Some(s)) = (c.as_object_mut(), state.as_object()) {
        c.extend(s.clone());
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "llama-1", "uid": "u", "labels": {"apps.kubernetes.io/pod-index": "1"},
            "annotations": {"trainwire.dev/status": r#"{"container":"trainer","sidecarPort":29600}"#},
            "deletionTimestamp": "2027-01-15T08:00:40Z", "deletionGracePeriodSeconds": 30},
        "spec": {"containers": [], "restartPolicy": restart},
        "status": {"phase": "Running", "containerStatuses": [c]}
    }))
    .unwrap_or_default();
    let base = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
    let at_ = |s: i64| {
        base.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(s))
            .unwrap_or(base)
    };
    // 2027-01-15T08:00:00Z is the test clock's 0.
    let zero: Timestamp = "2027-01-15T08:00:00Z".parse().unwrap_or(base);
    let v = PodView::of(&pod, at_(100)).expect("a rank");
    assert_eq!(
        v.trainer_exit,
        exit.map(|s| zero
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(s))
            .unwrap_or(zero))
    );
    assert_eq!(v.trainer_down, down);
    assert!(v.sidecar);
    assert_eq!(
        v.lost.map(|(t, how)| (t.to_string(), how)),
        Some(("2027-01-15T08:00:10Z".to_string(), "pod-deleted"))
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// One event in a 3-pod world (1 spare or none) with a store.
    #[derive(Clone, Debug)]
    enum Event {
        Delete(u32),
        Replace(u32),
        Ready(u32),
        Exit(u32),
        Restart(u32),
        Report(u32, u32),
        Train(u32),
        StoreLost,
        StoreBack,
        Pause,
        Unpause,
        Tick,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u32..3).prop_map(Event::Delete),
            (0u32..3).prop_map(Event::Replace),
            (0u32..3).prop_map(Event::Ready),
            (0u32..3).prop_map(Event::Exit),
            (0u32..3).prop_map(Event::Restart),
            ((0u32..3), (0u32..3)).prop_map(|(a, b)| Event::Report(a, b)),
            (0u32..3).prop_map(Event::Train),
            Just(Event::StoreLost),
            Just(Event::StoreBack),
            Just(Event::Pause),
            Just(Event::Unpause),
            Just(Event::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn the_status_follows_what_is_observed(spares in 0u32..2, events in proptest::collection::vec(event(), 1..40)) {
            let mut pods: Vec<PodView> = (0..3).map(|r| pod(r, &format!("p{r}-0"), Some(0))).collect();
            let mut store = store_pod("s0", true, None);
            let mut serial = 0;
            let mut expected = 3;
            let mut memory = Memory::default();
            let mut status: Option<WorldStatus> = None;
            let mut generation = 0;
            for (i, e) in events.into_iter().enumerate() {
                let t = i64::try_from(i).unwrap_or(0) * 3 + 10;
                let mut store_lost = false;
                match e {
                    Event::Delete(r) => if let Some(p) = pods.get_mut(r as usize) { p.lost = Some((at(t), "pod-deleted")); p.ready = false; },
                    Event::Replace(r) => { serial += 1; if let Some(p) = pods.get_mut(r as usize) { *p = pod(r, &format!("p{r}-{serial}"), None); } },
                    Event::Ready(r) => if let Some(p) = pods.get_mut(r as usize) && p.lost.is_none() && !p.trainer_down { p.ready = true; p.ready_since = Some(at(t)); },
                    Event::Exit(r) => if let Some(p) = pods.get_mut(r as usize) { p.trainer_exit = Some(at(t)); p.trainer_down = true; p.ready = false; },
                    Event::Restart(r) => if let Some(p) = pods.get_mut(r as usize) { p.trainer_down = false; },
                    Event::Report(r, lost) => if let Some(p) = pods.get_mut(r as usize) {
                        let g = p.peer_loss.as_ref().map_or(1, |x| x.generation + 1);
                        *p = reported(p.clone(), g, lost, t);
                    },
                    Event::Train(r) => if let Some(p) = pods.get_mut(r as usize) && p.peer_loss.is_some() { *p = training(p.clone(), t); },
                    Event::StoreLost => { store.lost = Some((at(t), "store-deleted")); store.ready = false; store_lost = expected > 0; },
                    Event::StoreBack => { serial += 1; store = store_pod(&format!("s{serial}"), true, None); },
                    Event::Pause => expected = 0,
                    Event::Unpause => expected = 3,
                    Event::Tick => {}
                }
                let w = WorldOf { expected, spares, dedicated_store: true, ..WorldOf::default() };
                let live: Vec<PodView> = if expected == 0 { Vec::new() } else { pods.clone() };
                let was_counted = memory_store_counted(&memory);
                let s = observe(status.as_ref(), &mut memory, &w, &live, Some(std::slice::from_ref(&store)), at(t));
                // resumedAt is never before the loss.
                if let Some(l) = &s.last_loss && let (Some(r), Some(a)) = (l.resumed_at.as_deref().and_then(parse_time), parse_time(&l.at)) {
                    prop_assert!(r >= a, "resumed {r} before the loss {a}");
                }
                // A paused world has no open loss.
                if expected == 0 {
                    prop_assert_eq!(s.phase, Phase::Paused);
                    prop_assert!(s.last_loss.as_ref().is_none_or(|l| !l.is_open()));
                }
                // A store loss always opens an episode (or is part of the open one).
                if store_lost && !was_counted && status.is_some() {
                    let l = s.last_loss.clone().unwrap_or_default();
                    prop_assert!(s.generation > generation || l.is_open(), "{s:?}");
                    prop_assert!(l.is_open(), "a store loss leaves the world recovering: {s:?}");
                }
                // All expected pods Ready with their trainers, the store up,
                // and training seen after the loss: never Recovering.
                let whole = expected > 0 && store.ready && store.lost.is_none()
                    && (0..expected).all(|r| pods.iter().any(|p| p.rank == r && p.ready && p.lost.is_none() && !p.trainer_down));
                let trained = s.last_loss.as_ref().is_some_and(|l| {
                    let since = parse_time(&l.at).unwrap_or(at(0));
                    pods.iter().any(|p| p.peer_loss.as_ref().and_then(|r| r.training_since.as_deref()).and_then(parse_time).is_some_and(|x| x >= since && x >= at(t) ))
                });
                if whole && trained {
                    prop_assert_ne!(s.phase, Phase::Recovering, "{:?}", s);
                }
                prop_assert!(s.generation >= generation);
                generation = s.generation;
                status = Some(s);
            }
        }
    }

    fn memory_store_counted(m: &Memory) -> bool {
        m.store.as_ref().is_some_and(|s| s.counted)
    }
}

/// A node cut off mid-step can finish that step and write a checkpoint
/// after its loss (seen in `spares_e2e`, 4 s after the cut): the first
/// checkpoint after a loss is not a resumption; one with another name after
/// it is, dated by it.
#[test]
fn only_a_second_checkpoint_after_a_loss_resumes_it() {
    let w = of(2);
    let with_checkpoint = |mut p: PodView, name: &str, when: i64| {
        p.checkpoint = Some(CheckpointRecord {
            name: name.into(),
            at: at(when).to_string(),
        });
        p
    };
    let s = run(
        &w,
        vec![
            (
                0,
                vec![
                    with_checkpoint(pod(0, "a", Some(0)), "ckpt-115", 0),
                    pod(1, "b", Some(0)),
                ],
            ),
            // Rank 1 is reported lost at 100; rank 0's in-flight step ends
            // in a checkpoint at 103.
            (
                101,
                vec![
                    reported(
                        with_checkpoint(pod(0, "a", Some(0)), "ckpt-115", 0),
                        1,
                        1,
                        100,
                    ),
                    pod(1, "b", Some(0)),
                ],
            ),
            (
                104,
                vec![
                    reported(
                        with_checkpoint(pod(0, "a", Some(0)), "ckpt-120", 103),
                        1,
                        1,
                        100,
                    ),
                    pod(1, "b", Some(0)),
                ],
            ),
            // The next one, at 112, after training resumed.
            (
                113,
                vec![
                    reported(
                        with_checkpoint(pod(0, "a", Some(0)), "ckpt-125", 112),
                        1,
                        1,
                        100,
                    ),
                    pod(1, "b", Some(0)),
                ],
            ),
        ],
    );
    assert!(
        s[1].last_loss.as_ref().is_some_and(Loss::is_open),
        "{:?}",
        s[1].last_loss
    );
    assert_eq!(s[2].phase, Phase::Recovering, "{:?}", s[2].last_loss);
    assert_resumed(&s[3], 112, "checkpoint");
}

/// A 1,024-pod world: every pod in the table, the annotation a few runs,
/// and the value read back is what the controller computes again (no write
/// for nothing).
#[test]
fn a_world_of_1024_pods_lists_every_pod_in_a_small_annotation() {
    let w = of(1024);
    let whole: Vec<PodView> = (0..1024)
        .map(|i| pod(i, &format!("u{i}"), Some(1)))
        .collect();
    let mut cut = whole.clone();
    cut[900] = deleted(cut[900].clone(), 10);
    let s = run(&w, vec![(1, whole), (10, cut.clone())]);
    let last = &s[1];
    assert_eq!(last.phase, Phase::Recovering);
    assert_eq!(last.ranks.len(), 1024);
    assert_eq!(last.ranks[900].role, Role::Lost);
    assert_eq!(last.ranks[1023].role, Role::Training);
    assert_eq!(
        last.waiting_for.as_deref(),
        Some("1023 of 1024 needed pods Ready with their trainer running (not: rank 900)")
    );
    let text = last.to_annotation();
    assert!(text.len() < 1024, "{} bytes: {text}", text.len());
    let back = WorldStatus::from_annotation(&text).expect("reads");
    assert_eq!(back.ranks.len(), 1024);
    assert_eq!(back.ranks[900].role, Role::Lost);
    let mut memory = Memory::default();
    observe(Some(&back), &mut memory, &w, &cut, None, at(10));
    let again = observe(Some(&back), &mut memory, &w, &cut, None, at(11));
    assert_eq!(
        decide_write(
            Some(&back),
            &again,
            Some(at(10)),
            at(30),
            Duration::from_secs(10)
        ),
        Write::Unchanged
    );
}

/// What a world waits for names at most 8 ranks, and how many more.
#[test]
fn waiting_for_many_pods_names_eight_and_counts_the_rest() {
    let w = of(1024);
    let whole: Vec<PodView> = (0..1024)
        .map(|i| pod(i, &format!("u{i}"), Some(1)))
        .collect();
    let mut cut = whole.clone();
    for p in &mut cut[100..120] {
        *p = deleted(p.clone(), 10);
    }
    let s = run(&w, vec![(1, whole), (10, cut)]);
    assert_eq!(
        s[1].waiting_for.as_deref(),
        Some(
            "1004 of 1024 needed pods Ready with their trainer running (not: rank 100, 101, 102, 103, 104, 105, 106, 107, and 12 more)"
        )
    );
}

/// Silent losses (a pod that stops answering while its object stays Ready:
/// a partition, a dead node before the node controller's grace period), a
/// spare's take-over, and the deletion of a pod already out of the world.
mod silent_loss {
    use super::*;

    /// A world of 2 with one hot spare (rank 2).
    fn spared() -> WorldOf {
        WorldOf {
            expected: 3,
            spares: 1,
            ..WorldOf::default()
        }
    }

    /// A pod created at 0.
    fn old(rank: u32, uid: &str) -> PodView {
        PodView {
            created: Some(at(0)),
            ..pod(rank, uid, Some(1))
        }
    }

    /// A survivor's record of a loss of `lost_rank` it saw by heartbeats:
    /// the first beat unanswered at `lost`, suspected at `suspected`,
    /// acted on at `acted`.
    fn heard_lost(
        mut p: PodView,
        generation: u64,
        lost_rank: u32,
        (lost, suspected, acted): (i64, i64, i64),
    ) -> PodView {
        p.peer_loss = Some(PeerLossRecord {
            generation,
            lost_rank,
            action: "report".into(),
            result: "reported".into(),
            at: at(acted).to_string(),
            suspected_at: Some(at(lost.min(suspected)).to_string()),
            lost_by: Some(peer_loss::LOST_BY_HEARTBEAT.into()),
            ..PeerLossRecord::default()
        });
        p
    }

    /// The record's training seen since `when`, by `by`.
    fn trains(mut p: PodView, when: i64, by: &str) -> PodView {
        p = training(p, when);
        if let Some(r) = p.peer_loss.as_mut() {
            r.training_seen_by = Some(by.into());
        }
        p
    }

    /// A spare's take-over record, its training seen at `when` by `by`.
    fn takes_over(p: PodView, lost_rank: u32, when: i64, by: &str) -> PodView {
        let mut p = took_over(p, 1, lost_rank, when);
        if let Some(r) = p.peer_loss.as_mut() {
            r.training_seen_by = Some(by.into());
        }
        p
    }

    fn roles_of(s: &WorldStatus) -> Vec<(Role, &str)> {
        s.ranks.iter().map(|r| (r.role, r.from.as_str())).collect()
    }

    /// Rank 0's network is cut at 100: its pod stays Ready. Rank 1's
    /// sidecar misses its heartbeats from 101 and records the loss at 103;
    /// the spare (rank 2) trains in its place, its collective's traffic
    /// seen at 110; rank 1's record says the same at 110.5 (110). The pod
    /// of rank 0 is deleted at 133, gone at 140, replaced at 145.
    #[test]
    fn a_silent_loss_opens_at_the_cut_and_the_deletion_after_it_is_no_new_loss() {
        let cut = || old(0, "a");
        let survivor = || heard_lost(old(1, "b"), 1, 0, (101, 102, 103));
        let steps = vec![
            (0, vec![cut(), old(1, "b"), old(2, "c")]),
            // Nothing shows it yet: its pod is as it was.
            (102, vec![cut(), old(1, "b"), old(2, "c")]),
            (103, vec![cut(), survivor(), old(2, "c")]),
            (
                110,
                vec![
                    cut(),
                    survivor(),
                    takes_over(old(2, "c"), 0, 110, "collective-traffic"),
                ],
            ),
            (
                111,
                vec![
                    cut(),
                    trains(survivor(), 110, "collective-traffic"),
                    takes_over(old(2, "c"), 0, 110, "collective-traffic"),
                ],
            ),
            (
                134,
                vec![
                    deleted(cut(), 133),
                    trains(survivor(), 110, "collective-traffic"),
                    takes_over(old(2, "c"), 0, 110, "collective-traffic"),
                ],
            ),
            (
                140,
                vec![
                    trains(survivor(), 110, "collective-traffic"),
                    takes_over(old(2, "c"), 0, 110, "collective-traffic"),
                ],
            ),
            (
                160,
                vec![
                    PodView {
                        created: Some(at(145)),
                        ..pod(0, "d", Some(159))
                    },
                    trains(survivor(), 110, "collective-traffic"),
                    takes_over(old(2, "c"), 0, 110, "collective-traffic"),
                ],
            ),
        ];
        let s = run(&spared(), steps);
        let phases: Vec<Phase> = s.iter().map(|s| s.phase).collect();
        assert_eq!(
            phases,
            [
                Phase::Running,
                Phase::Running,
                Phase::Recovering,
                Phase::Running,
                Phase::Running,
                Phase::Running,
                Phase::Running,
                Phase::Running
            ]
        );
        // Opened by the survivor's record, dated at the first beat
        // unanswered, by its source.
        let loss = s[2].last_loss.clone().unwrap_or_default();
        assert_eq!(
            (loss.rank, loss.at.clone(), loss.detected_by.as_str()),
            (0, at(101).to_string(), "heartbeat")
        );
        // The cut pod is out at once; the spare trains from its record on.
        assert_eq!(
            roles_of(&s[2]),
            [
                (Role::Lost, "peer-loss"),
                (Role::Training, "index"),
                (Role::Training, "index")
            ]
        );
        assert_eq!(
            roles_of(&s[3]),
            [
                (Role::Lost, "peer-loss"),
                (Role::Training, "index"),
                (Role::Training, "spare-took-over")
            ]
        );
        assert_resumed(&s[3], 110, "spare-took-over");
        // Its deletion and disappearance interrupt nothing: still the one
        // loss, resumed, with a note.
        for later in &s[5..] {
            assert_eq!(later.generation, 1, "{:?}", later.last_loss);
            assert_resumed(later, 110, "spare-took-over");
        }
        let loss = s[6].last_loss.clone().unwrap_or_default();
        assert_eq!(
            loss.actions,
            [
                "rank 1: report reported",
                "rank 0: pod-deleted after its loss"
            ]
        );
        // The replacement is a new pod of the world (a spare), not out.
        assert_eq!(
            roles_of(&s[7]),
            [
                (Role::Spare, "index"),
                (Role::Training, "sidecar"),
                (Role::Training, "spare-took-over")
            ]
        );
    }

    /// The cut pod deleted while its loss is still open: one loss, still
    /// dated at the cut by the heartbeats; and a pod deleted first and told
    /// of by a heartbeat record later is dated earlier by it.
    #[test]
    fn a_deletion_and_a_heartbeat_record_of_one_pod_are_one_loss_dated_by_the_first() {
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (
                    103,
                    vec![
                        old(0, "a"),
                        heard_lost(old(1, "b"), 1, 0, (101, 102, 103)),
                        old(2, "c"),
                    ],
                ),
                (
                    106,
                    vec![
                        deleted(old(0, "a"), 105),
                        heard_lost(old(1, "b"), 1, 0, (101, 102, 103)),
                        old(2, "c"),
                    ],
                ),
            ],
        );
        assert_eq!(s[2].generation, 1);
        assert_eq!(s[2].phase, Phase::Recovering);
        let loss = s[2].last_loss.clone().unwrap_or_default();
        assert_eq!(
            (loss.at, loss.detected_by.as_str()),
            (at(101).to_string(), "heartbeat")
        );
        // Deletion seen first (at 105), the heartbeats' record after it
        // says 101: the loss moves to 101, by heartbeats.
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (
                    106,
                    vec![deleted(old(0, "a"), 105), old(1, "b"), old(2, "c")],
                ),
                (
                    107,
                    vec![
                        deleted(old(0, "a"), 105),
                        heard_lost(old(1, "b"), 1, 0, (101, 102, 106)),
                        old(2, "c"),
                    ],
                ),
            ],
        );
        assert_eq!(
            s[1].last_loss.as_ref().map(|l| l.at.clone()),
            Some(at(105).to_string())
        );
        let loss = s[2].last_loss.clone().unwrap_or_default();
        assert_eq!(
            (loss.generation, loss.at, loss.detected_by.as_str()),
            (1, at(101).to_string(), "heartbeat")
        );
    }

    /// A record without `lostBy` (an older sidecar) is dated at its
    /// suspicion and named `sidecar`.
    #[test]
    fn a_record_without_its_source_is_the_sidecars() {
        let mut survivor = heard_lost(old(1, "b"), 1, 0, (101, 102, 103));
        if let Some(r) = survivor.peer_loss.as_mut() {
            r.lost_by = None;
        }
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (104, vec![old(0, "a"), survivor, old(2, "c")]),
            ],
        );
        let loss = s[1].last_loss.clone().unwrap_or_default();
        assert_eq!(
            (loss.at, loss.detected_by.as_str()),
            (at(101).to_string(), "sidecar")
        );
    }

    /// The cut pod's own sidecar, reaching the API again, tells of its
    /// peers' loss (the mirror of its own): no loss. Its trainer's exit is
    /// none either. Back in the world (its own record: training again
    /// after its loss), its deletion is a loss again.
    #[test]
    fn a_pod_out_of_the_world_tells_no_loss_until_it_trains_again() {
        let survivor = || {
            trains(
                heard_lost(old(1, "b"), 1, 0, (101, 102, 103)),
                110,
                "collective-traffic",
            )
        };
        let spare = || takes_over(old(2, "c"), 0, 110, "collective-traffic");
        let exited = |mut p: PodView, when: i64| {
            p.trainer_exit = Some(at(when));
            p
        };
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (111, vec![old(0, "a"), survivor(), spare()]),
                (
                    120,
                    vec![
                        exited(heard_lost(old(0, "a"), 1, 1, (101, 102, 119)), 118),
                        survivor(),
                        spare(),
                    ],
                ),
                // Back: its sidecar says its workers train since 130.
                (
                    131,
                    vec![
                        exited(
                            trains(
                                heard_lost(old(0, "a"), 1, 1, (101, 102, 119)),
                                130,
                                "collective-traffic",
                            ),
                            118,
                        ),
                        survivor(),
                        spare(),
                    ],
                ),
                (141, vec![deleted(old(0, "a"), 140), survivor(), spare()]),
            ],
        );
        assert_eq!(s[1].generation, 1);
        assert_eq!((s[2].generation, s[2].phase), (1, Phase::Running));
        assert_eq!(s[2].ranks[0].role, Role::Lost);
        assert_eq!(
            (s[3].ranks[0].role, s[3].ranks[0].from.as_str()),
            (Role::Training, "sidecar")
        );
        assert_eq!((s[4].generation, s[4].phase), (2, Phase::Recovering));
        let loss = s[4].last_loss.clone().unwrap_or_default();
        assert_eq!((loss.rank, loss.detected_by.as_str()), (0, "pod-deleted"));
    }

    /// A new leader learns from the pods: a pod older than a survivor's
    /// record of its rank's loss is out (its deletion no new loss); a pod
    /// created after it is the replacement.
    #[rstest]
    #[case::the_lost_pod(0, 1, Role::Lost)]
    #[case::its_replacement(150, 2, Role::Spare)]
    fn a_new_leader_finds_the_pods_out_of_the_world(
        #[case] created: i64,
        #[case] generation: u64,
        #[case] role: Role,
    ) {
        let previous = WorldStatus {
            version: 1,
            phase: Phase::Running,
            generation: 1,
            last_loss: Some(Loss {
                generation: 1,
                rank: 0,
                at: at(101).to_string(),
                detected_by: "heartbeat".into(),
                resumed_at: Some(at(110).to_string()),
                recovery_seconds: Some(9),
                resumed_by: Some("spare-took-over".into()),
                ..Loss::default()
            }),
            ..WorldStatus::default()
        };
        let zero = || PodView {
            created: Some(at(created)),
            ..pod(0, "a", Some(1))
        };
        let survivor = || {
            trains(
                heard_lost(old(1, "b"), 1, 0, (101, 102, 103)),
                110,
                "collective-traffic",
            )
        };
        let spare = || takes_over(old(2, "c"), 0, 110, "collective-traffic");
        let mut memory = Memory::default();
        let first = observe(
            Some(&previous),
            &mut memory,
            &spared(),
            &[zero(), survivor(), spare()],
            None,
            at(200),
        );
        assert_eq!(first.ranks[0].role, role);
        let then = observe(
            Some(&first),
            &mut memory,
            &spared(),
            &[deleted(zero(), 210), survivor(), spare()],
            None,
            at(211),
        );
        assert_eq!(then.generation, generation, "{:?}", then.last_loss);
    }

    /// `resumedAt` is when the sidecars saw training: a spare's workers
    /// started (seen by their start, 106) resume the world at once, and
    /// the collective's traffic seen after (110) dates it.
    #[test]
    fn resumed_at_is_the_strongest_observation_of_the_first_step() {
        let survivor = || heard_lost(old(1, "b"), 1, 0, (101, 102, 103));
        let spare = || takes_over(old(2, "c"), 0, 106, "workers-started");
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (103, vec![old(0, "a"), survivor(), old(2, "c")]),
                (107, vec![old(0, "a"), survivor(), spare()]),
                (
                    111,
                    vec![
                        old(0, "a"),
                        trains(survivor(), 110, "collective-traffic"),
                        spare(),
                    ],
                ),
            ],
        );
        assert_eq!(s[2].phase, Phase::Running);
        assert_resumed(&s[2], 106, "spare-took-over");
        assert_resumed(&s[3], 110, "collective-traffic");
        assert_eq!(
            s[3].last_loss.as_ref().and_then(|l| l.recovery_seconds),
            Some(9)
        );
        // Both seen at once: the traffic, not the earlier start.
        let s = run(
            &spared(),
            vec![
                (0, vec![old(0, "a"), old(1, "b"), old(2, "c")]),
                (
                    111,
                    vec![
                        old(0, "a"),
                        trains(survivor(), 110, "collective-traffic"),
                        spare(),
                    ],
                ),
            ],
        );
        assert_resumed(&s[1], 110, "collective-traffic");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// The controller's period: how often a recovering world is looked
        /// at again (`RECOVERING_RECHECK` of the world controller).
        const PERIOD: i64 = 5;
        /// Its write interval (`MIN_WRITE_INTERVAL`).
        const WRITE_INTERVAL: Duration = Duration::from_secs(10);

        /// One silent loss in a world of 2 + 1 spare, as the pods show it.
        #[derive(Clone, Debug)]
        struct Timeline {
            /// The rank cut (0 or 1) at 100; the other trains on.
            cut: u32,
            /// The first heartbeat unanswered, after the cut.
            lost: i64,
            /// The survivor's and the spare's records of the loss (their
            /// suspicion and action), after `lost`.
            survivor_record: i64,
            spare_record: Option<i64>,
            /// The first training step after it; the sidecars see the
            /// collective's traffic at it (their `trainingSince`) and
            /// write their records `write` later.
            step: i64,
            survivor_write: i64,
            spare_write: i64,
            /// The cut pod's own sidecar tells of its peers' loss, after
            /// the survivor's record.
            mirror: Option<i64>,
            /// The cut pod deleted, then gone, a replacement Ready.
            deleted: Option<i64>,
            /// The first look of the controller's timer.
            offset: i64,
        }

        prop_compose! {
            fn timeline()(cut in 0u32..2, lost in 100i64..102, detect in 1i64..5, spare_record in proptest::option::of(1i64..6),
                          step in 5i64..20, survivor_write in 0i64..3, spare_write in 0i64..3,
                          mirror in proptest::option::of(1i64..30), deleted in proptest::option::of(1i64..60), offset in 0i64..PERIOD) -> Timeline {
                let survivor_record = lost + detect;
                Timeline {
                    cut, lost, survivor_record,
                    spare_record: spare_record.map(|d| lost + d),
                    step: survivor_record + step,
                    survivor_write, spare_write,
                    mirror: mirror.map(|d| survivor_record + d),
                    deleted: deleted.map(|d| survivor_record + step + d),
                    offset,
                }
            }
        }

        impl Timeline {
            /// The pods as the API shows them at `t`.
            fn pods(&self, t: i64) -> Vec<PodView> {
                let other = 1 - self.cut;
                let mut pods = Vec::new();
                let gone = self.deleted.map(|d| d + 5);
                if gone.is_none_or(|g| t < g) {
                    let mut p = old(self.cut, "cut");
                    if let Some(m) = self.mirror
                        && t >= m
                    {
                        p = heard_lost(p, 1, other, (self.lost, m, m));
                    }
                    if let Some(d) = self.deleted
                        && t >= d
                    {
                        p = deleted(p, d);
                        p.ready = false;
                    }
                    pods.push(p);
                } else if let Some(g) = gone {
                    pods.push(PodView {
                        created: Some(at(g)),
                        ..pod(self.cut, "new", (t >= g + 5).then_some(g + 5))
                    });
                }
                let mut survivor = old(other, "survivor");
                if t >= self.survivor_record {
                    survivor = heard_lost(
                        survivor,
                        1,
                        self.cut,
                        (self.lost, self.survivor_record, self.survivor_record),
                    );
                }
                if t >= self.step + self.survivor_write {
                    survivor = trains(survivor, self.step, "collective-traffic");
                }
                pods.push(survivor);
                let mut spare = old(2, "spare");
                if let Some(r) = self.spare_record
                    && t >= r
                {
                    spare = heard_lost(spare, 1, self.cut, (self.lost, r, r));
                }
                if t >= self.step + self.spare_write {
                    spare = takes_over(spare, self.cut, self.step, "collective-traffic");
                }
                pods.push(spare);
                pods.sort_by_key(|p| p.rank);
                pods
            }

            /// When the controller looks: at every change of a pod (its
            /// watch) and on its timer.
            fn looks(&self) -> Vec<i64> {
                let mut times: Vec<i64> = (0..40).map(|k| 90 + self.offset + k * PERIOD).collect();
                times.extend([
                    0,
                    self.survivor_record,
                    self.step + self.survivor_write,
                    self.step + self.spare_write,
                ]);
                times.extend(self.spare_record);
                times.extend(self.mirror);
                if let Some(d) = self.deleted {
                    times.extend([d, d + 5, d + 10]);
                }
                times.sort_unstable();
                times.dedup();
                times
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Whatever the order of the records and the controller's
            /// looks: one loss, dated at the first beat unanswered, by
            /// heartbeats; never resumed before it; `Running` written
            /// within one period of the first step's record; the cut pod
            /// never training, its deletion no new interruption.
            #[test]
            fn a_silent_loss_is_one_episode_from_the_cut_to_the_first_step(tl in timeline()) {
                let w = spared();
                let mut memory = Memory::default();
                let mut computed: Option<WorldStatus> = None;
                let mut written: Option<WorldStatus> = None;
                let mut last_write: Option<Timestamp> = None;
                let mut pending_until: Option<i64> = None;
                let first_record = tl.step + tl.survivor_write.min(tl.spare_write);
                let mut looks = tl.looks();
                let mut k = 0;
                while k < looks.len() {
                    let t = looks[k];
                    k += 1;
                    let pods = tl.pods(t);
                    let s = observe(computed.as_ref(), &mut memory, &w, &pods, None, at(t));
                    match decide_write(written.as_ref(), &s, last_write, at(t), WRITE_INTERVAL) {
                        Write::Now => { written = Some(s.clone()); last_write = Some(at(t)); }
                        Write::After(d) => {
                            // Held back: looked at again then.
                            let again = t + i64::try_from(d.as_secs()).unwrap_or(0);
                            if pending_until.is_none_or(|p| p != again) { looks.push(again); looks.sort_unstable(); looks.dedup(); pending_until = Some(again); }
                        }
                        Write::Unchanged => {}
                    }
                    computed = Some(s.clone());
                    if t < tl.survivor_record.min(tl.spare_record.unwrap_or(i64::MAX)) {
                        prop_assert_eq!(s.generation, 0);
                        continue;
                    }
                    // One loss, of the cut rank, at the first beat unanswered.
                    prop_assert_eq!(s.generation, 1, "{:?}", s.last_loss);
                    let l = s.last_loss.clone().unwrap_or_default();
                    prop_assert_eq!((l.rank, l.at.clone(), l.detected_by.as_str()), (tl.cut, at(tl.lost).to_string(), "heartbeat"));
                    if let Some(r) = l.resumed_at.as_deref().and_then(parse_time) {
                        prop_assert!(r >= at(tl.lost));
                        prop_assert_eq!(r, at(tl.step), "{:?}", l);
                    }
                    // The cut pod never trains while it is there.
                    if pods.iter().any(|p| p.uid == "cut") {
                        let role = s.ranks.iter().find(|r| r.index == tl.cut).map(|r| r.role);
                        prop_assert_eq!(role, Some(Role::Lost), "{:?}", s.ranks);
                    }
                    // The spare trains once its take-over is there.
                    if t >= tl.step + tl.spare_write {
                        prop_assert_eq!(s.ranks.iter().find(|r| r.index == 2).map(|r| r.role), Some(Role::Training));
                    }
                    if t >= first_record {
                        // Computed at once, written at once (a new phase).
                        prop_assert_eq!(s.phase, Phase::Running, "{:?}", s);
                        prop_assert_eq!(written.as_ref().map(|w| w.phase), Some(Phase::Running));
                    } else {
                        prop_assert_eq!(s.phase, Phase::Recovering, "{:?}", s);
                    }
                    // On the timer alone, within one period.
                    if t >= first_record + PERIOD {
                        prop_assert_eq!(written.as_ref().map(|w| w.phase), Some(Phase::Running));
                    }
                }
            }
        }
    }
}

/// The newest stall a pod's sidecar recorded is the world's `lastStall`,
/// kept once the pods' records are gone (a restarted pod).
#[test]
fn the_newest_stall_of_the_pods_is_the_worlds() {
    use trainwire_contract::stall::StallRecord;
    let record = |when: i64, ranks: &str| StallRecord {
        at: at(when).to_string(),
        ranks: ranks.into(),
        action: "restart-workers".into(),
        result: "signalled".into(),
        stuck: u32::from(ranks.contains("stopped")),
    };
    let mut a = pod(0, "a", Some(0));
    a.stall = Some(record(100, "rank 1 worker 7 stopped"));
    let mut b = pod(1, "b", Some(0));
    b.stall = Some(record(90, "2 ranks idle 20s or more"));
    assert_eq!(
        newest_stall(&[a.clone(), b.clone()]),
        Some(record(100, "rank 1 worker 7 stopped"))
    );
    assert_eq!(newest_stall(&[pod(0, "a", Some(0))]), None);
    // Of one stall's records, the one that names a stuck worker, although
    // another was written later (after that worker was restarted).
    let mut c = pod(2, "c", Some(0));
    c.stall = Some(record(105, "1 rank idle 20s or more; 1 unknown"));
    assert_eq!(
        newest_stall(&[a.clone(), c.clone()]),
        Some(record(100, "rank 1 worker 7 stopped"))
    );
    // Of one stall's records, the one of the sidecar that acted, although
    // another in its cooldown recorded it first and saw the stuck worker.
    let mut d = pod(3, "d", Some(0));
    d.stall = Some(StallRecord {
        result: "cooldown".into(),
        ..record(110, "rank 1 worker 7 stopped")
    });
    let mut e = pod(1, "e", Some(0));
    e.stall = Some(record(112, "rank 1 worker 7 stopped"));
    assert_eq!(
        newest_stall(&[d.clone(), e.clone()]),
        Some(record(112, "rank 1 worker 7 stopped"))
    );
    e.stall = Some(record(108, "rank 1 worker 7 stopped"));
    assert_eq!(
        newest_stall(&[d, e]),
        Some(record(108, "rank 1 worker 7 stopped"))
    );
    // A later stall is another one: the newest.
    c.stall = Some(record(400, "2 ranks idle 20s or more"));
    assert_eq!(
        newest_stall(&[a.clone(), c]),
        Some(record(400, "2 ranks idle 20s or more"))
    );
    // A record whose time does not parse is not taken.
    b.stall = Some(StallRecord {
        at: "yesterday".into(),
        ..record(0, "")
    });
    assert_eq!(newest_stall(&[b]), None);
}
