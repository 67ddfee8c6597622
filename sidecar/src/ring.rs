//! Which peers one sidecar watches: a bounded set, whatever the world's
//! size, so that a sidecar's cost does not grow with the world.
//!
//! The pods of a workload (the world and its spares, `0..pods`) sit on a
//! ring; a sidecar watches its [`NEIGHBOURS`] nearest on each side, and the
//! rendezvous host when the topology has one (pod 0 runs torchrun's c10d
//! store: its loss is the one that needs every survivor's action). Every
//! pod is watched by its `2 × NEIGHBOURS` nearest (fewer in a world that
//! small), spares included, so each loss is seen by someone, and a change of
//! a pod reaches two sidecars through the apiserver (the host's reaches all:
//! a world that large is better served by a dedicated store, which no pod
//! hosts). Two watchers are enough to decide: a silent peer is confirmed
//! through the other before it is lost (`heartbeat`), and the controllers
//! see every pod. The world-wide
//! picture (who is lost, who trains, who waits as a spare) is the
//! controllers' (`trainwire.dev/world` on the workload), not every sidecar's.
//!
//! Why neighbours are enough to act: a survivor that restarts its workers
//! re-joins torchrun's rendezvous, and every other agent sees a waiting
//! node and restarts its own (a membership change), so the nearest
//! survivors acting brings the whole world along.

use std::collections::BTreeSet;

/// Peers watched on each side of a sidecar on the ring: one, so that a
/// pod's change reaches two sidecars (at most three events per change on
/// average at 1,024 pods, the host's included).
pub const NEIGHBOURS: u32 = 1;

/// The pod indices the sidecar of index `own` watches in a workload of
/// `pods` pods (`0..pods`), with `host` (the rendezvous host's index, when
/// a training pod hosts the store) always among them. Never `own`; at most
/// `2 × NEIGHBOURS + 1` indices.
pub fn watched(own: u32, pods: u32, host: Option<u32>) -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    if pods <= 1 {
        return out;
    }
    for step in 1..=NEIGHBOURS {
        out.insert((own + step) % pods);
        out.insert((own + pods - step % pods) % pods);
    }
    if let Some(h) = host.filter(|h| *h < pods) {
        out.insert(h);
    }
    out.remove(&own);
    out
}

/// The sidecars that watch pod `index` (the inverse of [`watched`]): who
/// sees its loss.
pub fn watchers(index: u32, pods: u32, host: Option<u32>) -> BTreeSet<u32> {
    (0..pods)
        .filter(|&i| i != index && watched(i, pods, host).contains(&index))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_worlds_watch_their_neighbours() {
        assert_eq!(watched(0, 1, Some(0)), BTreeSet::new());
        assert_eq!(watched(0, 2, Some(0)), BTreeSet::from([1]));
        assert_eq!(watched(1, 3, Some(0)), BTreeSet::from([0, 2]));
        assert_eq!(watched(2, 5, None), BTreeSet::from([1, 3]));
    }

    #[test]
    fn a_large_world_watches_the_nearest_and_the_host() {
        assert_eq!(watched(500, 1024, Some(0)), BTreeSet::from([0, 499, 501]));
        assert_eq!(watched(0, 1024, Some(0)), BTreeSet::from([1, 1023]));
        assert_eq!(watched(1023, 1024, None), BTreeSet::from([0, 1022]));
    }

    proptest! {
        #[test]
        fn bounded_and_every_pod_is_watched(pods in 1u32..2048, own in 0u32..2048, host in proptest::option::of(0u32..4)) {
            let own = own % pods;
            let w = watched(own, pods, host);
            prop_assert!(!w.contains(&own));
            prop_assert!(w.len() <= (2 * NEIGHBOURS + 1) as usize);
            prop_assert!(w.iter().all(|&i| i < pods));
            if pods > 1 {
                // Someone watches every pod: its nearest on the ring.
                prop_assert!(watchers(own, pods, host).contains(&((own + 1) % pods)));
            }
        }
    }
}
