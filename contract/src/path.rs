//! Absolute mount paths (`/checkpoints`, `/data`), normalised: repeated and
//! trailing `/` and `.` segments are dropped, so `//ckpt/` is `/ckpt`; the
//! root itself, `..`, characters the annotations use as separators and
//! blanks at the start or end of a segment (`/ckpt /`, `/ data`, `/ckpt `)
//! are refused. Every reader of a path (the annotations, the policy, the
//! `volumes` entries, the sidecar's env) reads it as written with this one
//! grammar ([`Grammar::read`]), so no reader's trim can turn the directory
//! the webhook mounts into another one the sidecar watches. A pod never gets
//! `mountPath: ""`.

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, string_value};

/// An absolute directory path below `/`, normalised; its text never starts
/// or ends a segment with a blank, so it reads back the same after a trim.
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
        if s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
            return Err(bad(
                "it starts or ends with a blank, which readers that trim values would drop",
            ));
        }
        let path = s;
        if !path.starts_with('/') {
            return Err(bad("not an absolute path"));
        }
        if path.chars().any(|c| c.is_control() || c == ',') {
            return Err(bad("it holds a control character or ','"));
        }
        let parts: Vec<&str> = path
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(bad("it holds '..'"));
        }
        if let Some(part) = parts
            .iter()
            .find(|p| p.starts_with(char::is_whitespace) || p.ends_with(char::is_whitespace))
        {
            return Err(bad(&format!(
                "the segment {part:?} starts or ends with a blank, which readers that trim values would drop"
            )));
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
    const ACCEPTED: &'static str = "an absolute directory path below / without '..' or ',' and with no blank at the start or end of a segment, such as /checkpoints";

    /// As written: a blank around the path is a blank at a segment's end,
    /// refused like any other (a trimming reader would read another path).
    fn read(text: &str) -> Result<Self, Invalid> {
        text.parse()
    }
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
        assert_eq!(p("/my ckpt/a b").as_deref(), Ok("/my ckpt/a b"));
        for bad in [
            "//", "/", "", "ckpt", "/a/../b", "/a,b", "/./", " ", " /ckpt", "/ckpt\t",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    /// Found by fuzzing: `/ckpt /` was mounted at `/ckpt ` while the sidecar,
    /// which trims its env, watched `/ckpt`. A blank at a segment's start or
    /// end is refused, naming the value as written and the accepted form.
    #[test]
    fn blanks_at_a_segments_ends_are_refused() {
        for bad in [
            "/ckpt /",
            "/ ",
            "/k ",
            "/ k",
            "/a /b",
            "/a/ b/",
            "/a/\u{a0}b",
            "/ /a",
            "/a/ .",
        ] {
            let e = bad.parse::<MountPath>().expect_err(bad);
            assert_eq!(e.value, bad);
            assert!(e.reason.contains("ends with a blank"), "{bad}: {e}");
            assert_eq!(e.accepted, MountPath::ACCEPTED);
            // The serde reader (policy files) refuses it the same way.
            let json = serde_json::to_string(bad).expect("json");
            assert!(serde_json::from_str::<MountPath>(&json).is_err(), "{bad}");
        }
    }

    /// Paths made of the characters that matter: separators, dots, blanks
    /// (ASCII and not), letters, a comma.
    fn pathlike() -> impl Strategy<Value = String> {
        prop_oneof![
            "[/ a.\t\u{a0},]{0,12}",
            "/[a-z ]{0,4}(/[a-z .]{0,4}){0,3} ?",
            "\\PC*",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        /// One grammar, every reader: `FromStr`, [`Grammar::read`] (the
        /// annotations, the sidecar's env) and serde (the policy) accept the
        /// same values and read them the same; a value accepted is unchanged
        /// by a trim; the display reads back to the same path.
        #[test]
        fn round_trips_and_never_panics(s in pathlike()) {
            let parsed = s.parse::<MountPath>();
            prop_assert_eq!(&MountPath::read(&s), &parsed);
            if parsed.is_ok() {
                prop_assert_eq!(s.trim(), s.as_str());
            }
            let json = serde_json::to_string(&s).expect("json");
            prop_assert_eq!(serde_json::from_str::<MountPath>(&json).ok(), parsed.clone().ok());
            if let Ok(p) = parsed {
                let shown = p.to_string();
                prop_assert!(!shown.is_empty());
                prop_assert_eq!(shown.trim(), shown.as_str());
                prop_assert_eq!(shown.parse::<MountPath>(), Ok(p.clone()));
                let json = serde_json::to_string(&p).expect("json");
                prop_assert_eq!(serde_json::from_str::<MountPath>(&json).ok(), Some(p));
            }
        }
    }
}
