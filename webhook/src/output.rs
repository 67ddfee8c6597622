//! How a command of the command line says what it has to say: as text
//! lines or one JSON document ([`Format`]), and with which exit status
//! ([`Exit`]). `inject` and `policy check` both use them.

/// How a command prints what it has to say: `text` lines, or one JSON
/// document (docs/cli.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    #[default]
    Text,
    Json,
}

/// A command that has printed all it had to say and ends with this exit
/// status: `main` prints nothing more.
#[derive(Debug, thiserror::Error)]
#[error("exit status {0}")]
pub struct Exit(pub u8);
