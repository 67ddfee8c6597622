//! `admission-bench handlers` times the two handlers whose difference
//! `docs/benchmarks.md` reports; these tests check that what it times is
//! what it says: both handlers answer every captured review they are given,
//! trainwire with its patch and the baseline with its one label.

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_admission-bench");

/// Runs `admission-bench handlers 2 REVIEW` and returns the answer sizes
/// it reports: (trainwire's, the baseline's).
fn answer_sizes(review: &str) -> (usize, usize) {
    let path = format!("{}/fixtures/admission/{review}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(BENCH)
        .args(["handlers", "2", &path])
        .output()
        .expect("admission-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "admission-bench handlers failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let size = |name: &str| -> usize {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no line for {name} in:\n{stdout}"));
        line.split(", ")
            .nth(1)
            .and_then(|s| s.strip_suffix(" bytes answered"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no answer size in {line:?}"))
    };
    (size("trainwire"), size("one-label baseline"))
}

#[test]
fn both_handlers_answer_the_reviews_the_bench_times() {
    for review in [
        "statefulset-create.json",
        "statefulset-update-template.json",
        "job-indexed-create.json",
    ] {
        let (trainwire, baseline) = answer_sizes(review);
        // trainwire's answer carries the whole injection as a base64 patch;
        // the baseline's one label is a few hundred bytes.
        assert!(
            trainwire > 4_000,
            "{review}: trainwire answered {trainwire} bytes"
        );
        assert!(
            (300..1_000).contains(&baseline),
            "{review}: the baseline answered {baseline} bytes"
        );
    }
}

#[test]
fn a_review_that_is_not_json_fails_the_run_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("broken.json");
    std::fs::write(&path, b"{not json").expect("write");
    let out = Command::new(BENCH)
        .args(["handlers", "1"])
        .arg(&path)
        .output()
        .expect("admission-bench runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("400"), "stderr: {stderr}");
}
