//! The contract between trainwire's programs: the admission server (and
//! its platform policy), the controllers, the sidecar and the kubectl
//! plugin.
//!
//! It owns every `TRAINWIRE_*` env name ([`env`]) and one type per value that
//! crosses a program boundary, each with `FromStr`, `Display` (which
//! round-trip: `parse(display(x)) == x`) and serde as that string. The
//! annotation parser, the policy validator and the sidecar's configuration
//! all call these types, so a value one of them accepts, the others accept
//! and read the same way. Values compare by what they mean, not by spelling:
//! `1800s == 30m`, `64Gi == 65536Mi`.
//!
//! No I/O: the sidecar's [`config::Config::from_source`] reads from a
//! [`config::Source`] the caller provides.

pub mod annotations;
pub mod config;
pub mod duration;
pub mod env;
pub mod failure;
pub mod labels;
pub mod loss_window;
pub mod path;
pub mod peer_loss;
pub mod quantity;
pub mod release;
pub mod rendezvous;
pub mod stall;
pub mod values;
pub mod world;

pub use duration::{Duration, PositiveDuration};
pub use failure::{ExitCodes, FailureLimit, NodeFailureAction};
pub use loss_window::LossWindow;
pub use path::MountPath;
pub use quantity::{ByteSize, Quantity, ShmSize};
pub use stall::{StallAction, StallTimeout};
pub use values::{
    Count, Detection, Framework, LogFormat, NodeCount, PeerLossAction, PollMode, Port,
    PositiveCount, RdzvBackend, RdzvHandler, RdzvStore, SpareCount,
};

/// A value that does not fit its grammar. Callers add what holds it (the
/// annotation, the policy field or the env variable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not valid: {reason}; accepted: {accepted}")]
pub struct Invalid {
    /// The text as given.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
    /// The accepted forms.
    pub accepted: &'static str,
}

impl Invalid {
    pub(crate) fn new(value: &str, reason: impl Into<String>, accepted: &'static str) -> Self {
        Invalid {
            value: value.to_string(),
            reason: reason.into(),
            accepted,
        }
    }
}

/// A value type of the contract: its accepted forms, for messages and docs.
pub trait Grammar: std::str::FromStr<Err = Invalid> + std::fmt::Display {
    /// The accepted forms, as shown in refusals.
    const ACCEPTED: &'static str;

    /// The value as a reader of the contract finds it written (an
    /// annotation, a policy field, an env variable): blanks around it are
    /// ignored unless the grammar itself says what blanks mean. Every reader
    /// goes through this, so they all accept the same texts.
    fn read(text: &str) -> Result<Self, Invalid> {
        text.trim().parse()
    }
}

/// serde as the `Display`/`FromStr` string, and `Debug` as that string
/// quoted (refusals print `"30m"`, not a struct).
macro_rules! string_value {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        write!(f, "{}", <$t as $crate::Grammar>::ACCEPTED)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        // Read as the annotation parser and the sidecar's
                        // env reader read it.
                        <$t as $crate::Grammar>::read(v).map_err(|e: $crate::Invalid| E::custom(e))
                    }
                    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<$t, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<$t, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<$t, E> {
                        self.visit_str(&v.to_string())
                    }
                    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<$t, E> {
                        self.visit_str(&v.to_string())
                    }
                }
                d.deserialize_any(V)
            }
        }
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "\"{self}\"")
            }
        }
    };
}
pub(crate) use string_value;
