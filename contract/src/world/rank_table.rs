//! How [`WorldStatus::ranks`](super::WorldStatus::ranks) is written: one
//! entry per pod in a small world, runs of consecutive indices in a large
//! one, so that the annotation of a 1,024-pod world is a few entries, not a
//! thousand.
//!
//! An entry is `{index, count?, pod?, role, torchRank?, torchRanks?, from}`:
//!
//! - a table of at most [`NAMED_RANKS`] pods has one entry per pod, with its
//!   `pod` name and `torchRank` (`count` absent: the schema of version 1);
//! - a larger table groups consecutive indices of the same `role` and `from`
//!   into one entry of `count` pods, with the torch ranks of its pods in
//!   `torchRanks` (in index order, `null` where unknown; absent when none is
//!   known). Its pods are found by their index: an entry names its `pod`
//!   only when another pod holds the same index (a replacement beside the
//!   pod being deleted), and such a pod is never in a run.
//!
//! Reading expands the runs back into one [`RankRole`] per pod (with an
//! empty `pod` where the entry named none), at most [`MAX_RANKS`] of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

use super::{MAX_RANKS, RankRole, Role};

/// A table of at most this many pods names every pod; a larger one is
/// written in runs.
pub const NAMED_RANKS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    index: u32,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    count: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pod: String,
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    torch_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    torch_ranks: Vec<Option<u32>>,
    from: String,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Entry {
    fn single(r: &RankRole, pod: String) -> Entry {
        Entry {
            index: r.index,
            count: 1,
            pod,
            role: r.role,
            torch_rank: r.torch_rank,
            torch_ranks: Vec::new(),
            from: r.from.clone(),
        }
    }

    /// Whether `r` continues this run.
    fn continued_by(&self, r: &RankRole) -> bool {
        self.pod.is_empty()
            && self.role == r.role
            && self.from == r.from
            && self.index.checked_add(self.count) == Some(r.index)
    }
}

fn entries(ranks: &[RankRole]) -> Vec<Entry> {
    if ranks.len() <= NAMED_RANKS {
        return ranks
            .iter()
            .map(|r| Entry::single(r, r.pod.clone()))
            .collect();
    }
    let mut holders: BTreeMap<u32, usize> = BTreeMap::new();
    for r in ranks {
        *holders.entry(r.index).or_default() += 1;
    }
    let shared = |index: u32| holders.get(&index).is_some_and(|n| *n > 1);
    let mut out: Vec<Entry> = Vec::new();
    for r in ranks {
        if shared(r.index) {
            out.push(Entry::single(r, r.pod.clone()));
            continue;
        }
        match out.last_mut() {
            Some(last) if last.continued_by(r) => {
                if last.count == 1 {
                    last.torch_ranks = vec![last.torch_rank.take()];
                }
                last.torch_ranks.push(r.torch_rank);
                last.count += 1;
            }
            _ => out.push(Entry::single(r, String::new())),
        }
    }
    for e in &mut out {
        if e.torch_ranks.iter().all(Option::is_none) {
            e.torch_ranks.clear();
        }
    }
    out
}

fn expand(entries: Vec<Entry>) -> Result<Vec<RankRole>, String> {
    let mut out: Vec<RankRole> = Vec::new();
    for e in entries {
        let count = usize::try_from(e.count).unwrap_or(usize::MAX);
        if e.count == 0 {
            return Err(format!("ranks: the entry at index {} has count 0", e.index));
        }
        if count > MAX_RANKS.saturating_sub(out.len()) {
            return Err(format!("ranks: more than {MAX_RANKS} pods"));
        }
        if e.index.checked_add(e.count - 1).is_none() {
            return Err(format!(
                "ranks: the run of {} pods at index {} passes the largest index",
                e.count, e.index
            ));
        }
        if e.torch_ranks.len() > count {
            return Err(format!(
                "ranks: the run of {} pods at index {} has {} torchRanks",
                e.count,
                e.index,
                e.torch_ranks.len()
            ));
        }
        if e.count > 1 && (!e.pod.is_empty() || e.torch_rank.is_some()) {
            return Err(format!(
                "ranks: the run of {} pods at index {} gives one pod or torchRank: a run has torchRanks and no pod",
                e.count, e.index
            ));
        }
        for (k, index) in (e.index..=e.index + (e.count - 1)).enumerate() {
            let torch_rank = e.torch_ranks.get(k).copied().flatten();
            out.push(RankRole {
                index,
                pod: e.pod.clone(),
                role: e.role,
                torch_rank: if e.count == 1 {
                    e.torch_rank.or(torch_rank)
                } else {
                    torch_rank
                },
                from: e.from.clone(),
            });
        }
    }
    Ok(out)
}

pub fn serialize<S: Serializer>(ranks: &[RankRole], s: S) -> Result<S::Ok, S::Error> {
    entries(ranks).serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RankRole>, D::Error> {
    let entries: Vec<Entry> = Vec::deserialize(d)?;
    expand(entries).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rank(index: u32, role: Role, torch_rank: Option<u32>) -> RankRole {
        RankRole {
            index,
            pod: format!("w-{index}"),
            role,
            torch_rank,
            from: "sidecar".into(),
        }
    }

    /// The table as it reads back: in a large one, pods are named only
    /// where two hold one index.
    fn as_read_back(ranks: &[RankRole]) -> Vec<RankRole> {
        if ranks.len() <= NAMED_RANKS {
            return ranks.to_vec();
        }
        ranks
            .iter()
            .map(|r| RankRole {
                pod: if ranks.iter().filter(|o| o.index == r.index).count() > 1 {
                    r.pod.clone()
                } else {
                    String::new()
                },
                ..r.clone()
            })
            .collect()
    }

    #[test]
    fn a_small_table_is_one_named_entry_per_pod() {
        let ranks = vec![
            rank(0, Role::Training, Some(1)),
            rank(1, Role::Training, Some(0)),
        ];
        let text = serde_json::to_string(&entries(&ranks)).expect("json");
        assert_eq!(
            text,
            r#"[{"index":0,"pod":"w-0","role":"training","torchRank":1,"from":"sidecar"},{"index":1,"pod":"w-1","role":"training","torchRank":0,"from":"sidecar"}]"#
        );
    }

    #[test]
    fn a_thousand_pods_are_a_few_runs() {
        // torchrun ranks the nodes by their host names: w-0, w-1, w-10,
        // w-100, ... so torch ranks are no run of their own.
        let mut names: Vec<String> = (0..1024).map(|i| format!("w-{i}")).collect();
        names.sort();
        let torch = |i: u32| {
            names
                .iter()
                .position(|n| *n == format!("w-{i}"))
                .and_then(|p| u32::try_from(p).ok())
        };
        let mut ranks: Vec<RankRole> = (0..1024)
            .map(|i| rank(i, Role::Training, torch(i)))
            .collect();
        ranks[700].role = Role::Lost;
        ranks[700].torch_rank = None;
        ranks[1023].role = Role::Spare;
        ranks[1023].torch_rank = None;
        ranks[1023].from = "index".into();
        let written = entries(&ranks);
        assert_eq!(written.len(), 4, "{written:?}");
        assert_eq!(
            written
                .iter()
                .map(|e| (e.index, e.count, e.role))
                .collect::<Vec<_>>(),
            vec![
                (0, 700, Role::Training),
                (700, 1, Role::Lost),
                (701, 322, Role::Training),
                (1023, 1, Role::Spare)
            ]
        );
        let text = serde_json::to_string(&written).expect("json");
        assert!(text.len() < 6 * 1024, "{} bytes", text.len());
        let read: Vec<Entry> = serde_json::from_str(&text).expect("reads");
        assert_eq!(expand(read), Ok(as_read_back(&ranks)));
    }

    #[test]
    fn a_replacement_beside_the_pod_being_deleted_is_named() {
        let mut ranks: Vec<RankRole> = (0..100).map(|i| rank(i, Role::Training, None)).collect();
        ranks[5].role = Role::Lost;
        ranks.insert(
            6,
            RankRole {
                pod: "w-5-new".into(),
                ..rank(5, Role::Waiting, None)
            },
        );
        let written = entries(&ranks);
        let named: Vec<&str> = written
            .iter()
            .filter(|e| !e.pod.is_empty())
            .map(|e| e.pod.as_str())
            .collect();
        assert_eq!(named, vec!["w-5", "w-5-new"]);
        assert_eq!(expand(written), Ok(as_read_back(&ranks)));
    }

    #[test]
    fn refuses_runs_that_do_not_read() {
        let read = |text: &str| {
            serde_json::from_str::<Vec<Entry>>(text)
                .map_err(|e| e.to_string())
                .and_then(expand)
        };
        let err = |text: &str| read(text).expect_err(text);
        assert!(
            err(r#"[{"index":0,"count":0,"role":"training","from":"pod"}]"#).contains("count 0")
        );
        assert!(
            err(r#"[{"index":4294967295,"count":2,"role":"training","from":"pod"}]"#)
                .contains("largest index")
        );
        assert!(
            err(r#"[{"index":0,"count":4000000000,"role":"training","from":"pod"}]"#)
                .contains("more than")
        );
        assert!(
            err(r#"[{"index":0,"count":2,"role":"training","torchRanks":[1,2,3],"from":"pod"}]"#)
                .contains("3 torchRanks")
        );
        assert!(
            err(r#"[{"index":0,"count":2,"pod":"w-0","role":"training","from":"pod"}]"#)
                .contains("no pod")
        );
        assert!(
            read(r#"[{"index":0,"count":3,"role":"lost","torchRanks":[null,7],"from":"pod"}]"#)
                .is_ok_and(|r| r.iter().map(|r| r.torch_rank).collect::<Vec<_>>()
                    == vec![None, Some(7), None])
        );
    }

    fn role() -> impl Strategy<Value = Role> {
        prop_oneof![
            4 => Just(Role::Training),
            1 => Just(Role::Spare),
            1 => Just(Role::Waiting),
            1 => Just(Role::Lost),
        ]
    }

    prop_compose! {
        /// Tables as the controller builds them: by index, a few indices
        /// held by two pods.
        fn table()(n in 0usize..300, seed in proptest::collection::vec((role(), proptest::option::of(0u32..2000), 0u8..20, 0u8..3), 300)) -> Vec<RankRole> {
            let mut out = Vec::new();
            for (i, (role, torch_rank, twice, from)) in seed.into_iter().take(n).enumerate() {
                let index = u32::try_from(i).unwrap_or(0);
                let from = ["pod", "sidecar", "index"][usize::from(from)].to_string();
                out.push(RankRole { index, pod: format!("w-{i}"), role, torch_rank, from: from.clone() });
                if twice == 0 {
                    out.push(RankRole { index, pod: format!("w-{i}-b"), role: Role::Waiting, torch_rank: None, from });
                }
            }
            out
        }
    }

    proptest! {
        #[test]
        fn tables_read_back_as_written(ranks in table()) {
            let text = serde_json::to_string(&entries(&ranks)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let read: Vec<Entry> = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let back = expand(read).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&back, &as_read_back(&ranks));
            // Written again, the table read back is the same text.
            prop_assert_eq!(serde_json::to_string(&entries(&back)).ok(), Some(text));
        }

        #[test]
        fn any_entries_read_or_are_refused_within_the_bound(text in proptest::collection::vec((0u32..10, 0u32..5000, proptest::option::of(0u32..5), 0usize..4), 0..20)) {
            let entries: Vec<Entry> = text.into_iter().map(|(index, count, torch_rank, n)| Entry {
                index: index.saturating_mul(1000), count, pod: String::new(), role: Role::Training,
                torch_rank: None, torch_ranks: vec![torch_rank; n], from: "pod".into(),
            }).collect();
            if let Ok(read) = expand(entries) {
                prop_assert!(read.len() <= MAX_RANKS);
            }
        }
    }
}
