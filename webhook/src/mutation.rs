//! The mutation engine: pure, no I/O.
//!
//! Entry point: [`mutate`]. It takes the workload as JSON (as it arrives in an
//! AdmissionReview or a YAML document), the namespace it will live in (when
//! known) and the policy profile that applies, and answers:
//! - [`Outcome::NotManaged`]: not a StatefulSet/Job, or not annotated
//!   `trainwire.dev/inject: "true"`: pass through untouched;
//! - [`Outcome::Mutated`]: the mutated object, the minimal RFC 6902 patch from
//!   input to output (empty when already injected), and warnings;
//! - `Err(Refusal)`: the workload cannot be made a torchrun world; the message
//!   names the annotation (or policy rule), the bad value and the accepted forms.

use serde_json::Value;
use thiserror::Error;

use crate::policy::Profile;

/// The opt-in annotation.
pub const INJECT_ANNOTATION: &str = "trainwire.dev/inject";

#[derive(Debug)]
pub enum Outcome {
    NotManaged,
    Mutated(Mutation),
}

#[derive(Debug)]
pub struct Mutation {
    pub object: Value,
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
}

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

/// Mutate one workload. See the module docs.
pub fn mutate(
    _object: &Value,
    _namespace: Option<&str>,
    _profile: &Profile,
) -> Result<Outcome, Refusal> {
    Ok(Outcome::NotManaged)
}
