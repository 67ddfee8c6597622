//! The I/O both programs share, so each is written once: the shutdown future
//! ([`shutdown::signal`]) and the log ([`logging::init`]). What the programs
//! agree on without I/O (env names, value grammars, [`LogFormat`]) stays in
//! `trainwire-contract`.

pub use trainwire_contract::LogFormat;

pub mod exposition;
pub mod logging;
pub mod shutdown;
pub mod watch;
