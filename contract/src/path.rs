//! Absolute mount paths (`/checkpoints`, `/data`), normalised: repeated and
//! trailing `/` and `.` segments are dropped, so `//ckpt/` is `/ckpt`; the
//! root itself, `..` and characters the annotations use as separators are
//! refused. A pod never gets `mountPath: ""`.

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, string_value};

/// An absolute directory path below `/`, normalised.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MountPath(String);

impl MountPath {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for MountPath {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |r: &str| Invalid::new(s, r, <MountPath as Grammar>::ACCEPTED);
        if !s.starts_with('/') {
            return Err(bad("not an absolute path"));
        }
        if s.chars().any(|c| c.is_control() || c == ',') {
            return Err(bad("it holds a control character or ','"));
        }
        let parts: Vec<&str> = s
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(bad("it holds '..'"));
        }
        if parts.is_empty() {
            return Err(bad("it is the root directory"));
        }
        Ok(MountPath(format!("/{}", parts.join("/"))))
    }
}
impl fmt::Display for MountPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl Grammar for MountPath {
    const ACCEPTED: &'static str =
        "an absolute directory path below / without '..' or ',', such as /checkpoints";
}
string_value!(MountPath);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn normalises_and_refuses() {
        let p = |s: &str| s.parse::<MountPath>().map(|p| p.to_string());
        assert_eq!(p("/checkpoints/").as_deref(), Ok("/checkpoints"));
        assert_eq!(p("//a//b/./").as_deref(), Ok("/a/b"));
        for bad in ["//", "/", "", "ckpt", "/a/../b", "/a,b", "/./"] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn round_trips_and_never_panics(s in "\\PC*") {
            if let Ok(p) = s.parse::<MountPath>() {
                prop_assert!(!p.as_str().is_empty());
                prop_assert_eq!(p.to_string().parse::<MountPath>(), Ok(p));
            }
        }
    }
}
