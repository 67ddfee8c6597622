//! One injection's running state ([`Ctx`]: the profile in force, the
//! warnings so far, the status being recorded) and how it can end
//! ([`Refusal`]). Every step of the engine takes the one and may return the
//! other; the steps' orchestration (`mutation::mutate`) sits above them.

use thiserror::Error;

use super::status::Status;
use crate::policy::Profile;

/// Why a workload is refused. The message is shown to the user by kubectl.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// A `trainwire.dev/*` annotation has a value that cannot be used.
    #[error("annotation {annotation}: {value:?} is not valid: {reason}; accepted: {accepted}")]
    Annotation {
        annotation: String,
        value: String,
        reason: String,
        accepted: String,
    },
    /// A `trainwire.dev/*` annotation whose YAML value is not a string
    /// (`trainwire.dev/inject: true`, `trainwire.dev/nnodes: 2`): the
    /// message shows the value as written and the quoting that fixes it.
    #[error("{annotation}: {written} is {what}, annotation values are strings: {fix}")]
    NotAString {
        annotation: String,
        /// The value as written in YAML (`true`, `2`).
        written: String,
        /// `a YAML boolean`, `a YAML number`, `empty (YAML null)`, ...
        what: String,
        /// `write "true" in quotes`, ...
        fix: String,
    },
    /// The platform policy forbids what the workload asks for.
    #[error("policy profile {profile:?} rule {rule}: {detail}")]
    Policy {
        profile: String,
        rule: String,
        detail: String,
    },
    /// The workload's shape cannot become a torchrun world (a NonIndexed Job,
    /// a StatefulSet without serviceName, no containers, ...).
    #[error("{0}")]
    Workload(String),
}

impl From<crate::policy::Conflict> for Refusal {
    fn from(c: crate::policy::Conflict) -> Self {
        Refusal::Policy {
            profile: c.profile,
            rule: c.rule,
            detail: c.detail,
        }
    }
}

/// What one mutation accumulates: the profile, warnings, the status record.
pub struct Ctx<'a> {
    pub profile: &'a Profile,
    pub warnings: Vec<String>,
    /// Warnings left out past [`MAX_WARNINGS`] (a set, so that a repeated
    /// one is counted once).
    pub omitted_warnings: std::collections::HashSet<String>,
    pub status: Status,
    /// No earlier injection is recorded on the template: a CREATE (or the
    /// UPDATE that opts an existing workload in), or offline rendering.
    pub first_injection: bool,
}

/// The longest warning, in characters, where the values it quotes allow:
/// one line of a terminal. What a warning leaves out is in
/// docs/warnings.md.
pub const MAX_WARNING_LEN: usize = 120;

/// `core`, followed by ` (detail)` when that still fits in
/// [`MAX_WARNING_LEN`] (a long value quoted in `core` drops the detail,
/// which docs/warnings.md gives).
pub fn with_detail(core: String, detail: &str) -> String {
    if core.chars().count() + 3 + detail.chars().count() <= MAX_WARNING_LEN {
        format!("{core} ({detail})")
    } else {
        core
    }
}

/// At most this many warnings are returned for one workload (a hostile
/// object could otherwise ask for one per entry of a 20,000-entry list; the
/// apiserver truncates long warning lists anyway); the rest are counted in
/// one last warning.
pub const MAX_WARNINGS: usize = 32;

impl Ctx<'_> {
    pub fn new(profile: &Profile) -> Ctx<'_> {
        Ctx {
            profile,
            warnings: Vec::new(),
            omitted_warnings: Default::default(),
            status: Status::default(),
            first_injection: false,
        }
    }

    pub fn warn(&mut self, warning: String) {
        if self.warnings.contains(&warning) {
            return;
        }
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(warning);
        } else {
            self.omitted_warnings.insert(warning);
        }
    }

    /// The warnings, with the count of those left out.
    pub fn into_warnings(self) -> Vec<String> {
        let mut warnings = self.warnings;
        if !self.omitted_warnings.is_empty() {
            warnings.push(format!(
                "{} more warnings are not shown",
                self.omitted_warnings.len()
            ));
        }
        warnings
    }
}
