//! Tests that cannot pass by skipping.
//!
//! A test whose prerequisite (root, `ip netns`, PyTorch, kubectl, kpt,
//! python3) is missing calls [`require`] first:
//!
//! - under CI (`CI` set to anything but empty, `0` or `false`; GitHub and
//!   `.ci/run` set `CI=true`) it panics with the reason: the test fails;
//! - elsewhere it prints `SKIPPED: <test>: <why>` on stderr and returns
//!   `false`, and the test returns at once. libtest and nextest have no
//!   "skipped at run time" outcome, so such a test is counted as passed:
//!   `cargo nextest run --workspace --success-output final 2>&1 | grep '^SKIPPED'`
//!   lists them (README, "Tests").

/// Something a test needs from the machine, and whether it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prerequisite {
    /// Present.
    Met,
    /// Missing, with why (and how to get it, where that helps).
    Missing(String),
}

impl Prerequisite {
    /// From `Ok(_)` / `Err(why)`.
    pub fn from_result<T>(r: Result<T, String>) -> Self {
        match r {
            Ok(_) => Prerequisite::Met,
            Err(why) => Prerequisite::Missing(why),
        }
    }

    /// From an `Option` of the reason it is missing.
    pub fn from_missing(why: Option<String>) -> Self {
        match why {
            None => Prerequisite::Met,
            Some(why) => Prerequisite::Missing(why),
        }
    }

    /// The process runs as root (namespaces, `setpriv` to other users).
    pub fn root() -> Self {
        if crate::process::is_root() {
            Prerequisite::Met
        } else {
            Prerequisite::Missing("not running as root".to_string())
        }
    }

    /// `program ARGS` runs and exits 0 (e.g. `kubectl version --client`).
    pub fn command(program: &str, args: &[&str]) -> Self {
        match std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            Ok(s) if s.success() => Prerequisite::Met,
            Ok(s) => {
                Prerequisite::Missing(format!("`{program} {}` exited with {s}", args.join(" ")))
            }
            Err(e) => Prerequisite::Missing(format!("`{program}` cannot run: {e}")),
        }
    }
}

/// What a test does about a prerequisite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Run,
    /// Outside CI: say so and return.
    Skip(String),
    /// Under CI: the test fails with this message.
    Fail(String),
}

/// Whether this run is CI: `CI` set, and not empty, `0` or `false`.
pub fn in_ci() -> bool {
    ci_value(std::env::var("CI").ok().as_deref())
}

/// [`in_ci`] on a given value of `CI`.
pub fn ci_value(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

/// The pure decision: run, skip (outside CI) or fail (under CI).
pub fn decide(test: &str, prerequisite: &Prerequisite, ci: bool) -> Decision {
    match prerequisite {
        Prerequisite::Met => Decision::Run,
        Prerequisite::Missing(why) if ci => Decision::Fail(format!(
            "{test}: a prerequisite is missing and CI is set, so this fails instead of skipping: {why}"
        )),
        Prerequisite::Missing(why) => {
            Decision::Skip(format!("SKIPPED: {test}: {why} (under CI=true this fails)"))
        }
    }
}

/// `true` when `test` may run. Under CI a missing prerequisite panics (the
/// test fails); elsewhere it prints `SKIPPED: ...` and returns `false`.
#[track_caller]
pub fn require(test: &str, prerequisite: Prerequisite) -> bool {
    match decide(test, &prerequisite, in_ci()) {
        Decision::Run => true,
        Decision::Skip(line) => {
            eprintln!("{line}");
            false
        }
        Decision::Fail(message) => panic!("{message}"),
    }
}

/// [`require`] over several prerequisites: the first missing one decides.
#[track_caller]
pub fn require_all(test: &str, prerequisites: impl IntoIterator<Item = Prerequisite>) -> bool {
    let first_missing = prerequisites
        .into_iter()
        .find(|p| *p != Prerequisite::Met)
        .unwrap_or(Prerequisite::Met);
    require(test, first_missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        assert!(ci_value(Some("true")));
        assert!(ci_value(Some("1")));
        assert!(ci_value(Some("TRUE")));
        assert!(!ci_value(None));
        assert!(!ci_value(Some("")));
        assert!(!ci_value(Some("0")));
        assert!(!ci_value(Some("false")));
    }

    #[test]
    fn a_missing_prerequisite_fails_under_ci_and_skips_visibly_outside() {
        let missing = Prerequisite::Missing("kubectl not found".to_string());
        assert_eq!(decide("t", &Prerequisite::Met, true), Decision::Run);
        assert_eq!(decide("t", &Prerequisite::Met, false), Decision::Run);
        match decide("t", &missing, true) {
            Decision::Fail(m) => assert!(m.contains("kubectl not found"), "{m}"),
            other => panic!("expected a failure, got {other:?}"),
        }
        match decide("t", &missing, false) {
            Decision::Skip(m) => assert!(m.starts_with("SKIPPED: t: kubectl not found"), "{m}"),
            other => panic!("expected a skip, got {other:?}"),
        }
    }

    #[test]
    fn a_program_that_is_not_there_is_missing() {
        assert!(matches!(
            Prerequisite::command("/nonexistent/trainwire-no-such-tool", &[]),
            Prerequisite::Missing(_)
        ));
        assert_eq!(Prerequisite::command("true", &[]), Prerequisite::Met);
    }
}
