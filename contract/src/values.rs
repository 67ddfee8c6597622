//! Ports, counts, node counts and the named choices (peer-loss action,
//! detection mode, checkpoint poll mode, rendezvous backend, log format).

use std::fmt;
use std::num::{NonZeroU16, NonZeroU32};
use std::str::FromStr;

use crate::{Grammar, Invalid, string_value};

fn digits_only(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A TCP port, 1 to 65535.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Port(NonZeroU16);

impl Port {
    pub const fn new(port: u16) -> Option<Self> {
        match NonZeroU16::new(port) {
            Some(p) => Some(Port(p)),
            None => None,
        }
    }
    pub fn get(self) -> u16 {
        self.0.get()
    }
}
impl FromStr for Port {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <Port as Grammar>::ACCEPTED);
        if !digits_only(s) {
            return Err(bad("not a number"));
        }
        match s.parse::<u16>() {
            Ok(0) => Err(bad("port 0 cannot be connected to")),
            Ok(p) => Ok(Port::new(p).ok_or_else(|| bad("port 0"))?),
            Err(_) => Err(bad("above 65535")),
        }
    }
}
impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl Grammar for Port {
    const ACCEPTED: &'static str = "a TCP port from 1 to 65535, such as 29500";
}

/// A count from 0 to 4294967295 (`MAX_ACTIONS`, where `0` disables actions;
/// `max-restarts`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Count(pub u32);

impl FromStr for Count {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <Count as Grammar>::ACCEPTED);
        if !digits_only(s) {
            return Err(bad("not a whole number"));
        }
        s.parse().map(Count).map_err(|_| bad("above 4294967295"))
    }
}
impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl Grammar for Count {
    const ACCEPTED: &'static str = "a whole number from 0 to 4294967295, such as 3";
}

/// A count from 1 to 4294967295 (heartbeat misses, GPUs, processes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PositiveCount(NonZeroU32);

impl PositiveCount {
    pub const fn new(n: u32) -> Option<Self> {
        match NonZeroU32::new(n) {
            Some(n) => Some(PositiveCount(n)),
            None => None,
        }
    }
    pub fn get(self) -> u32 {
        self.0.get()
    }
}
impl FromStr for PositiveCount {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <PositiveCount as Grammar>::ACCEPTED);
        let Count(n) = s.parse().map_err(|e: Invalid| Invalid {
            accepted: <PositiveCount as Grammar>::ACCEPTED,
            ..e
        })?;
        PositiveCount::new(n).ok_or_else(|| bad("it is zero"))
    }
}
impl fmt::Display for PositiveCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl Grammar for PositiveCount {
    const ACCEPTED: &'static str = "a whole number from 1 to 4294967295, such as 8";
}

/// The most hot spares a world may have (`trainwire.dev/spares`,
/// `TRAINWIRE_SPARES`).
pub const MAX_SPARES: u32 = 1024;

/// How many hot spares a world has: pods beyond its size that torchrun's
/// dynamic rendezvous keeps waiting (its redundancy list) and moves into the
/// world when a participant is lost. 0 to [`MAX_SPARES`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SpareCount(u32);

impl SpareCount {
    pub const NONE: SpareCount = SpareCount(0);
    pub const fn new(n: u32) -> Option<Self> {
        if n <= MAX_SPARES {
            Some(SpareCount(n))
        } else {
            None
        }
    }
    pub fn get(self) -> u32 {
        self.0
    }
}
impl FromStr for SpareCount {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <SpareCount as Grammar>::ACCEPTED);
        if !digits_only(s) {
            return Err(bad("not a whole number"));
        }
        s.parse::<u32>()
            .ok()
            .and_then(SpareCount::new)
            .ok_or_else(|| bad("more than 1024 spares"))
    }
}
impl fmt::Display for SpareCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl Grammar for SpareCount {
    const ACCEPTED: &'static str = "a whole number of spare pods from 0 to 1024, such as 1";
}

/// How many nodes the world has: `N`, or `MIN:MAX` for an elastic world.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeCount {
    /// A fixed-size world.
    Fixed(u32),
    /// An elastic world, `MIN:MAX` with `1 <= MIN <= MAX`.
    Elastic { min: u32, max: u32 },
}

impl NodeCount {
    /// The largest number of nodes: the ranks are `0..max()`.
    pub fn max(self) -> u32 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { max, .. } => max,
        }
    }
    /// The number of nodes that must exist; ranks at or above it may be absent.
    pub fn min(self) -> u32 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { min, .. } => min,
        }
    }
    /// Whether a world of `n` nodes fits.
    pub fn covers(self, n: u32) -> bool {
        (self.min()..=self.max()).contains(&n)
    }
    /// Whether `n` pods fit a world with `spares` hot spares beside it: at
    /// least the minimum (the world forms; fewer spares) and at most the
    /// maximum plus the spares.
    pub fn covers_with_spares(self, n: u32, spares: u32) -> bool {
        (self.min()..=self.max().saturating_add(spares)).contains(&n)
    }
}
impl FromStr for NodeCount {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <NodeCount as Grammar>::ACCEPTED);
        let one = |t: &str, what: &str| -> Result<u32, Invalid> {
            let PositiveCount(n) = t
                .parse()
                .map_err(|_| bad(&format!("{what} is not a whole number from 1")))?;
            Ok(n.get())
        };
        match s.split_once(':') {
            None => Ok(NodeCount::Fixed(one(s, "N")?)),
            Some((a, b)) => {
                let (min, max) = (one(a, "MIN")?, one(b, "MAX")?);
                if min > max {
                    return Err(bad("MIN is above MAX"));
                }
                Ok(NodeCount::Elastic { min, max })
            }
        }
    }
}
impl fmt::Display for NodeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeCount::Fixed(n) => write!(f, "{n}"),
            NodeCount::Elastic { min, max } => write!(f, "{min}:{max}"),
        }
    }
}
impl Grammar for NodeCount {
    const ACCEPTED: &'static str = "a whole number N from 1 such as 4, or an elastic range MIN:MAX such as 2:8 with 1 <= MIN <= MAX";
}

string_value!(Port);
string_value!(Count);
string_value!(PositiveCount);
string_value!(NodeCount);
string_value!(SpareCount);

/// A choice among names: canonical spellings first, then aliases.
macro_rules! choice {
    ($(#[$m:meta])* $t:ident, $accepted:literal, { $($(#[$vm:meta])* $v:ident => $name:literal $(| $alias:literal)*,)+ }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $t { $($(#[$vm])* $v,)+ }
        impl $t {
            /// Every value, in documentation order.
            pub const ALL: &'static [$t] = &[$($t::$v,)+];
            /// The canonical spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($t::$v => $name,)+ }
            }
        }
        impl FromStr for $t {
            type Err = Invalid;
            fn from_str(s: &str) -> Result<Self, Invalid> {
                match s {
                    $($name $(| $alias)* => Ok($t::$v),)+
                    _ => Err(Invalid::new(s, "not one of the accepted names", $accepted)),
                }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl Grammar for $t {
            const ACCEPTED: &'static str = $accepted;
        }
        string_value!($t);
    };
}
pub(crate) use choice;

choice!(
    /// What the sidecar does when a peer is lost (see docs/sidecar.md).
    PeerLossAction, "auto, restart-workers, restart-agent, none", {
    /// Lost rendezvous host: SIGKILL agent and workers. Other peer: report
    /// only (restart workers in an elastic world that can shrink).
    Auto => "auto",
    /// SIGTERM the agent's workers.
    RestartWorkers => "restart-workers",
    /// SIGKILL the agent and its workers.
    RestartAgent => "restart-agent",
    /// Report only.
    None => "none",
});

choice!(
    /// Which peer-health sources the sidecar runs.
    Detection, "auto, kubernetes (or k8s), heartbeat (or heartbeats), both", {
    /// Every source the sidecar can run: the Kubernetes watch if the
    /// service account may list and watch pods, heartbeats if the peer
    /// hosts are known.
    Auto => "auto",
    /// Only the Kubernetes watch.
    Kubernetes => "kubernetes" | "k8s",
    /// Only heartbeats.
    Heartbeat => "heartbeat" | "heartbeats",
    /// Both; the first to see a loss wins.
    Both => "both",
});

choice!(
    /// Whether the sidecar's checkpoint watcher polls.
    PollMode, "auto (poll on nfs/cifs/fuse/...), true or always (always poll), false or never (always inotify)", {
    /// inotify, unless the directory is on a network or FUSE filesystem.
    Auto => "auto",
    /// Always poll.
    Always => "true" | "always",
    /// Always inotify.
    Never => "false" | "never",
});

choice!(
    /// torchrun's rendezvous backend.
    RdzvBackend, "c10d, static, etcd-v2", {
    /// The c10d store, run by pod 0.
    C10d => "c10d",
    /// Static rendezvous (MASTER_ADDR of pod 0).
    Static => "static",
    /// An external etcd (the policy's endpoint).
    EtcdV2 => "etcd-v2",
});

choice!(
    /// Where torchrun's c10d rendezvous store runs (`trainwire.dev/rdzv-store`,
    /// the policy's `rdzvStore`).
    RdzvStore, "pod0, dedicated", {
    /// In pod 0's torchrun agent (torchrun's own behaviour): losing pod 0
    /// loses the store, and the world waits for its replacement.
    Pod0 => "pod0",
    /// In a small workload of its own (`<name>-rdzv`), running torch's
    /// `TCPStore` from the trainer's image: no training pod is special.
    Dedicated => "dedicated",
});

choice!(
    /// Which rendezvous handler torchrun runs over a dedicated c10d store
    /// (`trainwire.dev/rdzv-handler`, the policy's `rdzvHandler`).
    RdzvHandler, "trainwire, torch", {
    /// trainwire's `trainwire-c10d`: torch's c10d rendezvous that hears a
    /// lost node from the sidecar at once, with warm forkserver workers.
    Trainwire => "trainwire",
    /// torch's own `c10d`: a lost node is dropped by its keep-alive.
    Torch => "torch",
});

choice!(
    /// The training framework a workload runs (`trainwire.dev/framework`,
    /// the policy's `framework`): what the trainer's env is made for.
    Framework, "pytorch, tensorflow", {
    /// torchrun: `PET_*` env, the c10d/static/etcd-v2 rendezvous.
    PyTorch => "pytorch",
    /// TensorFlow's multi-worker strategies: `TF_CONFIG`, a fixed world.
    TensorFlow => "tensorflow",
});

choice!(
    /// Log line format of both programs.
    LogFormat, "text, json", {
    /// Human-readable text (no colour unless stderr is a terminal).
    Text => "text" | "plain",
    /// One JSON object per line.
    Json => "json",
});

#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for PeerLossAction {
    fn default() -> Self {
        PeerLossAction::Auto
    }
}
#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for RdzvBackend {
    fn default() -> Self {
        RdzvBackend::C10d
    }
}
#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for RdzvStore {
    fn default() -> Self {
        RdzvStore::Pod0
    }
}
#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for RdzvHandler {
    fn default() -> Self {
        RdzvHandler::Trainwire
    }
}
#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for Framework {
    fn default() -> Self {
        Framework::PyTorch
    }
}
#[allow(clippy::derivable_impls)] // the enum comes from `choice!`
impl Default for LogFormat {
    fn default() -> Self {
        LogFormat::Text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn forms() {
        assert_eq!("0".parse::<Count>(), Ok(Count(0)));
        assert!("4294967296".parse::<Count>().is_err());
        assert!("+1".parse::<Count>().is_err());
        assert!("0".parse::<PositiveCount>().is_err());
        assert!("0".parse::<Port>().is_err());
        assert!("65536".parse::<Port>().is_err());
        assert_eq!("k8s".parse::<Detection>(), Ok(Detection::Kubernetes));
        assert_eq!("auto".parse::<PollMode>(), Ok(PollMode::Auto));
        assert_eq!(
            "true".parse::<PollMode>().map(|p| p.to_string()).as_deref(),
            Ok("true")
        );
        assert_eq!(
            "2:8".parse::<NodeCount>(),
            Ok(NodeCount::Elastic { min: 2, max: 8 })
        );
        for bad in ["0", "8:2", "0:2", "a", "", ":", "1:", " 2"] {
            let e = bad.parse::<NodeCount>().expect_err(bad).to_string();
            assert!(e.contains("MIN:MAX"), "{e}");
        }
        assert_eq!("tensorflow".parse::<Framework>(), Ok(Framework::TensorFlow));
        let e = "tf".parse::<Framework>().expect_err("tf").to_string();
        assert!(e.contains("pytorch, tensorflow"), "{e}");
        let e = "reboot"
            .parse::<PeerLossAction>()
            .expect_err("x")
            .to_string();
        assert!(e.contains("restart-workers"), "{e}");
    }

    #[test]
    fn spares_are_bounded_whole_numbers() {
        assert_eq!("0".parse::<SpareCount>().map(SpareCount::get), Ok(0));
        assert_eq!("1024".parse::<SpareCount>().map(SpareCount::get), Ok(1024));
        for bad in ["1025", "-1", "one", "", "1.0", "99999999999"] {
            let e = bad.parse::<SpareCount>().expect_err(bad).to_string();
            assert!(e.contains("0 to 1024"), "{bad}: {e}");
        }
        assert_eq!("dedicated".parse::<RdzvStore>(), Ok(RdzvStore::Dedicated));
        assert!(
            "etcd"
                .parse::<RdzvStore>()
                .expect_err("etcd")
                .to_string()
                .contains("pod0, dedicated")
        );
    }

    fn round_trip<T: Grammar + PartialEq + fmt::Debug>(x: T) -> Result<(), TestCaseError> {
        prop_assert_eq!(x.to_string().parse::<T>(), Ok(x));
        Ok(())
    }

    proptest! {
        #[test]
        fn round_trips(n in any::<u32>(), m in any::<u32>(), p in 1u16..) {
            round_trip(Count(n))?;
            if let Some(c) = PositiveCount::new(n) { round_trip(c)?; }
            if let Some(p) = Port::new(p) { round_trip(p)?; }
            if n > 0 { round_trip(NodeCount::Fixed(n))?; }
            if n > 0 && n <= m { round_trip(NodeCount::Elastic { min: n, max: m })?; }
            for a in PeerLossAction::ALL { round_trip(*a)?; }
            for a in Detection::ALL { round_trip(*a)?; }
            for a in PollMode::ALL { round_trip(*a)?; }
            for a in RdzvBackend::ALL { round_trip(*a)?; }
            for a in LogFormat::ALL { round_trip(*a)?; }
            for a in Framework::ALL { round_trip(*a)?; }
            for a in RdzvStore::ALL { round_trip(*a)?; }
            if let Some(s) = SpareCount::new(n % 2048) { round_trip(s)?; }
        }

        #[test]
        fn never_panic(s in "\\PC*") {
            let _ = s.parse::<Count>();
            let _ = s.parse::<PositiveCount>();
            let _ = s.parse::<Port>();
            let _ = s.parse::<NodeCount>();
            let _ = s.parse::<Detection>();
            let _ = s.parse::<SpareCount>();
            let _ = s.parse::<RdzvStore>();
        }
    }
}
