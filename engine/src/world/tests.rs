use super::*;
use rstest::rstest;
use serde_json::json;

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
        peer_loss: None,
        checkpoint: None,
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
    });
    p
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
        let s = observe(status.as_ref(), &mut memory, workload, &pods, at(t));
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
    });
    p
}

/// A world of 2 with one hot spare (3 pods): rank 0 is deleted at 100, the
/// spare (rank 2) says at 112 that it trains in its place: resumed at 112
/// (12 s), Running while the replacement is still pending; the world
/// stays Running with 2 of 3 Ready; 1 of 3 Ready is not enough.
#[test]
fn a_spare_taking_over_resumes_the_world_before_the_replacement() {
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
    let loss = s[4].last_loss.clone().unwrap_or_default();
    assert_eq!(loss.rank, 1);
    assert_eq!(loss.detected_by, "pod-deleted");
    assert_eq!(loss.at, at(100).to_string());
    assert_eq!(loss.actions, ["rank 0: report reported"]);
    assert_eq!(loss.resumed_at, Some(at(160).to_string()));
    assert_eq!(loss.recovery_seconds, Some(60));
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
    let s = observe(Some(&previous), &mut memory, &of(2), &pods, at(10));
    assert_eq!(s.generation, 3);
    // The same pods again: still nothing new.
    let s = observe(Some(&s), &mut memory, &of(2), &pods, at(20));
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
#[case::stopped(WorldOf { expected: 0, stopped: Some(Stopped { reason: "MaxFailures".into(), ..Stopped::default() }), finished: None, spares: 0 }, Phase::Stopped)]
#[case::paused(of(0), Phase::Paused)]
#[case::completed(WorldOf { expected: 2, stopped: None, finished: Some(Phase::Completed), spares: 0 }, Phase::Completed)]
#[case::running(of(1), Phase::Running)]
fn phase_of_the_workload(#[case] w: WorldOf, #[case] phase: Phase) {
    let s = observe(
        None,
        &mut Memory::default(),
        &w,
        &[pod(0, "a", Some(1))],
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
    let s = observe(None, &mut Memory::default(), &of(2), &[a, b], at(300));
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
