//! Heartbeats at a scale the unit tests do not reach: 12 real sidecars,
//! each in its own network namespace on one bridge, with the env the
//! webhook renders (heartbeat detection, the default 1 s loss window: a
//! probe every 200 ms, 4 misses; pod 0 the rendezvous host) and no trainer
//! ([`trainwire_tests::scale`]).
//!
//! - Each sidecar probes a bounded set (its ring neighbours and the host):
//!   at most [`MAX_PROBES_PER_SECOND`] probes a second (3 peers × 5, and
//!   room for the helpers' probes), whatever the world's size, and every
//!   peer it watches is healthy.
//! - A pod cut off silently is lost for its watchers (after they asked its
//!   other watchers, who cannot reach it either) within the heartbeat
//!   budget plus one interval; a sidecar that does not watch it says so.
//!
//! Needs root and `ip netns`; skips with a message otherwise (fails under
//! `CI=true`).

use std::time::{Duration, Instant};

use trainwire_tests::netns;
use trainwire_tests::scale::Sim;

const N: u32 = 12;

/// The most probes a sidecar sends a second: 3 watched peers (two ring
/// neighbours and the host) × 5 (a probe every fifth of the 1 s window),
/// and room for probes asked of it by others.
const MAX_PROBES_PER_SECOND: f64 = 20.0;

#[test]
fn twelve_sidecars_probe_a_bounded_set_and_confirm_a_silent_cut() {
    if !netns::require_netns("sidecar_scale") {
        return;
    }
    let sim = Sim::start(N).unwrap_or_else(|e| panic!("{e}"));
    let report = sim
        .measure(Duration::from_secs(5), 0)
        .unwrap_or_else(|e| panic!("{e}"));
    println!("SCALE {}", report.summary());
    assert_eq!(
        report.losses(),
        0,
        "a loss with nothing cut: {}",
        report.summary()
    );
    assert!(
        report.max_sent() <= MAX_PROBES_PER_SECOND,
        "a sidecar sent {:.1} probes/s (bound {MAX_PROBES_PER_SECOND}): {}",
        report.max_sent(),
        report.summary()
    );
    for s in &report.sidecars {
        assert!(
            !s.watched.is_empty() && s.watched.len() <= 5,
            "rank {} watches {:?}",
            s.rank,
            s.watched
        );
        assert_eq!(
            s.watched_healthy,
            s.watched.len(),
            "rank {} sees {} of its watched peers {:?} healthy",
            s.rank,
            s.watched_healthy,
            s.watched
        );
    }

    // Rank 6 is watched by its ring neighbours 5 and 7 only.
    let lost = 6;
    let status = sim.status(0).unwrap_or_else(|e| panic!("{e}"));
    let state = status["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["rank"] == lost))
        .map(|p| p["state"].clone());
    assert_eq!(
        state,
        Some(serde_json::json!("not-watched")),
        "rank 0 does not watch rank {lost}: {status:#}"
    );
    sim.cut(lost).unwrap_or_else(|e| panic!("{e}"));
    let cut = Instant::now();
    // interval × misses (0.8 s; the helpers are asked one miss early), a
    // margin for a busy machine.
    let bound = Duration::from_secs(1 + 3);
    let watchers: Vec<u32> = trainwire_sidecar::ring::watchers(lost, N, Some(0))
        .into_iter()
        .collect();
    let mut seen: Vec<(u32, Duration)> = Vec::new();
    while seen.len() < watchers.len() && cut.elapsed() < bound {
        for &watcher in &watchers {
            if seen.iter().any(|(w, _)| *w == watcher) {
                continue;
            }
            let lost_here = sim.status(watcher).ok().is_some_and(|s| {
                s["peers"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["rank"] == lost && p["state"] == "lost"))
            });
            if lost_here {
                seen.push((watcher, cut.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("LOST rank {lost} seen by {seen:?}");
    assert_eq!(
        seen.len(),
        watchers.len(),
        "rank {lost}'s watchers that saw it lost within {bound:?}: {seen:?}\n{}",
        sim.log.tail(40)
    );
    let status = sim.status(5).unwrap_or_else(|e| panic!("{e}"));
    let detail = status["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["rank"] == lost))
        .and_then(|p| p["detail"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(
        detail.contains("does not reach it either") || detail.contains("could not be asked"),
        "the loss names the helpers' answers: {detail}"
    );
}
