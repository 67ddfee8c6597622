//! The crate's error type.

use thiserror::Error;

/// Errors of the webhook library. Refusals of a workload are
/// [`crate::mutation::Refusal`], not errors: they are answers.
#[derive(Debug, Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
