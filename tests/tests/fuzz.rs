//! The fuzzer (`trainwire_tests::fuzz`) for a few seconds per surface: the
//! same oracles as the long campaign (docs/benchmarks.md), on a fixed seed.
//! `TRAINWIRE_FUZZ_SEED` picks another seed, `TRAINWIRE_FUZZ_INPUTS` another
//! count.

use std::time::Duration;

use trainwire_tests::fuzz::{self, Limits, Seeds, Surface};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_surface_survives_a_short_fuzzing_run() {
    let seeds = Seeds::load(&trainwire_tests::repo_root()).expect("seeds");
    let seed = env_u64("TRAINWIRE_FUZZ_SEED", 22);
    // A hang detector, not a timing: a debug build on a loaded machine.
    let limits = Limits {
        time: Duration::from_secs(30),
        peak_rss_mib: 1024,
    };
    for surface in Surface::ALL {
        let count = env_u64(
            "TRAINWIRE_FUZZ_INPUTS",
            if surface == Surface::Inject { 200 } else { 600 },
        );
        let report = fuzz::run(surface, &seeds, count, seed, limits, 5);
        let summary = report.summary(surface, seed);
        assert!(report.findings.is_empty(), "{summary}");
        assert_eq!(report.inputs, count, "{summary}");
        // Mutations that leave something the surface accepts, and some it
        // refuses: both paths are exercised.
        assert!(report.refused > 0 && report.refused < count, "{summary}");
    }
}

/// Every finding kept in `tests/data/fuzz/` (`SURFACE-SEED-INDEX.txt`: the
/// oracle it broke, `---`, the whole input) now passes its surface's
/// oracles: accepted, or refused with a message.
#[test]
fn kept_findings_pass_their_oracles() {
    let root = trainwire_tests::repo_root();
    let seeds = Seeds::load(&root).expect("seeds");
    let dir = root.join("tests/data/fuzz");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/data/fuzz") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let surface = Surface::ALL
            .into_iter()
            .find(|s| name.starts_with(&format!("{}-", s.name())))
            .unwrap_or_else(|| panic!("{name}: no surface in the name"));
        let text = std::fs::read_to_string(&path).expect("read");
        let (_, input) = text
            .split_once("\n---\n")
            .unwrap_or_else(|| panic!("{name}: no `---` after the oracle"));
        if let Err(why) = fuzz::replay(surface, input, &seeds) {
            panic!("{name}: {why}");
        }
        seen += 1;
    }
    assert!(seen > 0, "no kept findings in {}", dir.display());
}

/// A path grammar with the bug the fuzzer found in `MountPath`: it drops
/// trailing `/` but keeps the blank before it, so `/k /` displays as `/k `,
/// which a trimming reader reads as another path.
#[derive(Debug, PartialEq)]
struct SloppyPath(String);

impl std::str::FromStr for SloppyPath {
    type Err = trainwire_contract::Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim_end_matches('/') {
            p if p.starts_with('/') => Ok(SloppyPath(p.to_string())),
            _ => Err(trainwire_contract::Invalid {
                value: s.to_string(),
                reason: "not absolute".into(),
                accepted: "/path",
            }),
        }
    }
}
impl std::fmt::Display for SloppyPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl trainwire_contract::Grammar for SloppyPath {
    const ACCEPTED: &'static str = "/path";
}
impl serde::Serialize for SloppyPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
impl<'de> serde::Deserialize<'de> for SloppyPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use trainwire_contract::Grammar as _;
        let s = String::deserialize(d)?;
        SloppyPath::read(&s).map_err(serde::de::Error::custom)
    }
}

/// The grammar oracle reports the `MountPath` finding on a grammar that has
/// it, and every contract grammar passes it on the finding's inputs.
#[test]
fn the_grammar_oracle_reports_a_display_that_reads_back_differently() {
    let found = fuzz::grammar_round_trips::<SloppyPath>("SloppyPath", "/ckpt /")
        .expect_err("the sloppy grammar must be reported");
    assert!(found.contains("with blanks around"), "{found}");
    assert!(fuzz::grammar_round_trips::<SloppyPath>("SloppyPath", "/ckpt").is_ok());
    for text in [
        "/ckpt /", "/ckpt ", "/ ", "/k ", " /ckpt", "/ckpt", "30m", "8Gi", "2:8",
    ] {
        fuzz::grammars_round_trip(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}
