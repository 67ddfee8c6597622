//! What the controllers' failure controller reads: the trainer exit codes that
//! mean "the script is broken" (`trainwire.dev/fail-fast-exit-codes`), the
//! failure budget (`trainwire.dev/max-failures`) and the dead-node action of
//! the policy (`nodeFailure.action`).

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, PositiveDuration, string_value};

/// A set of process exit codes, `1,2,126-127` (each 0 to 255, ranges
/// inclusive). Printed sorted, adjacent codes joined into ranges.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct ExitCodes(std::collections::BTreeSet<u8>);

impl ExitCodes {
    /// Whether `code` (as Kubernetes reports it, an `i32`) is in the set.
    pub fn contains(&self, code: i32) -> bool {
        u8::try_from(code).is_ok_and(|c| self.0.contains(&c))
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for ExitCodes {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: String| Invalid::new(s, r, <ExitCodes as Grammar>::ACCEPTED);
        let code = |t: &str| -> Result<u8, Invalid> {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(format!("{t:?} is not an exit code")));
            }
            t.parse::<u8>()
                .map_err(|_| bad(format!("{t} is above 255 (exit codes are 0 to 255)")))
        };
        let mut set = std::collections::BTreeSet::new();
        if s.trim() == "none" {
            return Ok(ExitCodes(set));
        }
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (code(a)?, code(b)?);
                    if a > b {
                        return Err(bad(format!("the range {a}-{b} is backwards")));
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(code(part)?);
                }
            }
        }
        Ok(ExitCodes(set))
    }
}

impl fmt::Display for ExitCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut ranges: Vec<(u8, u8)> = Vec::new();
        for &c in &self.0 {
            match ranges.last_mut() {
                Some((_, hi)) if u16::from(*hi) + 1 == u16::from(c) => *hi = c,
                _ => ranges.push((c, c)),
            }
        }
        let parts: Vec<String> = ranges
            .into_iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Grammar for ExitCodes {
    const ACCEPTED: &'static str =
        "comma-separated exit codes or ranges from 0 to 255, such as 1,2,126-127, or none";
}
string_value!(ExitCodes);

/// How many trainer failures a world may have within a window before it is
/// stopped: `N` (a window of [`FailureLimit::DEFAULT_WINDOW`]) or `N/window`
/// (`5/1h`); `0` never stops.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FailureLimit {
    pub failures: u32,
    pub window: PositiveDuration,
}

impl FailureLimit {
    /// The window of a bare `N`.
    pub const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

    /// Whether it never stops a world.
    pub fn disabled(&self) -> bool {
        self.failures == 0
    }
}

impl FromStr for FailureLimit {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: String| Invalid::new(s, r, <FailureLimit as Grammar>::ACCEPTED);
        let (n, window) = match s.split_once('/') {
            Some((n, w)) => {
                let window: PositiveDuration = w
                    .trim()
                    .parse()
                    .map_err(|e: Invalid| bad(format!("the window: {}", e.reason)))?;
                (n, window)
            }
            None => (
                s,
                PositiveDuration::new(Self::DEFAULT_WINDOW)
                    .ok_or_else(|| bad("no default window".to_string()))?,
            ),
        };
        let n = n.trim();
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{n:?} is not a whole number of failures")));
        }
        let failures = n
            .parse::<u32>()
            .map_err(|_| bad("above 4294967295".to_string()))?;
        Ok(FailureLimit { failures, window })
    }
}

impl fmt::Display for FailureLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.window.get() == Self::DEFAULT_WINDOW {
            write!(f, "{}", self.failures)
        } else {
            write!(f, "{}/{}", self.failures, self.window)
        }
    }
}

impl Grammar for FailureLimit {
    const ACCEPTED: &'static str = "N or N/window: a number of trainer failures and a Go duration, such as 5 (within 1h) or 3/10m; 0 never stops";
}
string_value!(FailureLimit);

/// What the controller does to make a pod on a dead node replaceable.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NodeFailureAction {
    /// Delete the pod with grace period 0 (the StatefulSet or Job controller
    /// creates the replacement at once). Its ReadWriteOnce volumes stay
    /// attached to the dead node until the attach/detach controller gives up.
    #[default]
    ForceDelete,
    /// Taint the node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`:
    /// the control plane deletes its pods and force-detaches their volumes.
    /// A node-level action: every pod on the node goes, not only trainwire's.
    OutOfService,
}

impl FromStr for NodeFailureAction {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        match s {
            "force-delete" => Ok(NodeFailureAction::ForceDelete),
            "out-of-service" => Ok(NodeFailureAction::OutOfService),
            _ => Err(Invalid::new(
                s,
                "not an action",
                <NodeFailureAction as Grammar>::ACCEPTED,
            )),
        }
    }
}

impl fmt::Display for NodeFailureAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeFailureAction::ForceDelete => "force-delete",
            NodeFailureAction::OutOfService => "out-of-service",
        })
    }
}

impl Grammar for NodeFailureAction {
    const ACCEPTED: &'static str = "force-delete or out-of-service";
}
string_value!(NodeFailureAction);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_round_trip_and_compare_by_value() {
        let c: ExitCodes = "127,1,2,126".parse().unwrap_or_default();
        assert_eq!(c.to_string(), "1-2,126-127");
        assert_eq!(c, "1-2, 126-127".parse().unwrap_or_default());
        assert!(c.contains(126) && !c.contains(3) && !c.contains(-1) && !c.contains(300));
        for bad in ["", "1,", "a", "256", "5-2", "1;2"] {
            assert!(bad.parse::<ExitCodes>().is_err(), "{bad:?}");
        }
        let none: ExitCodes = "none".parse().unwrap_or_default();
        assert!(none.is_empty());
        assert_eq!(none.to_string(), "none");
    }

    #[test]
    fn failure_limits() {
        let l: FailureLimit = "3/10m".parse().expect("valid");
        assert_eq!(l.failures, 3);
        assert_eq!(l.window.get(), std::time::Duration::from_secs(600));
        assert_eq!(l.to_string(), "3/10m");
        assert_eq!(l, l.to_string().parse().expect("round trip"));
        let bare: FailureLimit = "5".parse().expect("valid");
        assert_eq!(bare.window.get(), FailureLimit::DEFAULT_WINDOW);
        assert_eq!(bare.to_string(), "5");
        assert_eq!(bare, "5/1h".parse().expect("valid"));
        for bad in ["", "x", "3/", "3/0s", "-1", "3/10"] {
            assert!(bad.parse::<FailureLimit>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn actions() {
        for a in ["force-delete", "out-of-service"] {
            assert_eq!(
                a.parse::<NodeFailureAction>()
                    .map(|x| x.to_string())
                    .ok()
                    .as_deref(),
                Some(a)
            );
        }
        assert!("delete".parse::<NodeFailureAction>().is_err());
    }
}
