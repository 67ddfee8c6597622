//! Durations: Go's `time.ParseDuration` grammar, the one Kubernetes users
//! write everywhere (`metav1.Duration`): `1h30m`, `500ms`, `1.5s`, `90s`.
//!
//! Parsed with checked integer arithmetic (as Go does): a value past
//! [`Duration::MAX`] is an error, never a saturation or a panic.
//! (`kube::core::Duration` parses the same grammar but multiplies floats into
//! `std::time::Duration` and panics on `1e20s` or `NaNs`, so it is not used
//! on outside input.) Negative durations and days (`1d`) are refused: Go has
//! no day unit, and a day is written `24h`.

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, string_value};

const NANOS_PER: [(&str, u128); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("\u{00b5}s", 1_000),
    ("\u{03bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("", 0),
];

const ACCEPTED: &str = "a Go duration: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)";
const ACCEPTED_POSITIVE: &str = "a Go duration above zero: numbers with units ns, us, ms, s, m, h, such as 500ms, 1.5s, 90s, 30m, 1h30m (at most 8760h)";

/// A duration from zero to [`Duration::MAX`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

/// A duration above zero, at most [`Duration::MAX`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PositiveDuration(Duration);

impl Duration {
    /// The longest duration accepted: a year (`8760h`). Nothing trainwire
    /// times (heartbeats, checkpoint ages, cooldowns) is meaningful beyond.
    pub const MAX: std::time::Duration = std::time::Duration::from_secs(8760 * 3600);

    /// A duration, if it is at most [`Duration::MAX`].
    pub fn new(d: std::time::Duration) -> Option<Self> {
        (d <= Self::MAX).then_some(Duration(d))
    }
    /// The standard library duration.
    pub fn get(self) -> std::time::Duration {
        self.0
    }
}

impl PositiveDuration {
    /// A duration, if it is above zero and at most [`Duration::MAX`].
    pub fn new(d: std::time::Duration) -> Option<Self> {
        Duration::new(d)
            .filter(|d| !d.0.is_zero())
            .map(PositiveDuration)
    }
    /// The standard library duration.
    pub fn get(self) -> std::time::Duration {
        self.0.0
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}
impl From<PositiveDuration> for std::time::Duration {
    fn from(d: PositiveDuration) -> Self {
        d.0.0
    }
}
impl From<PositiveDuration> for Duration {
    fn from(d: PositiveDuration) -> Self {
        d.0
    }
}

/// Go's grammar, in nanoseconds, checked.
fn parse_nanos(text: &str) -> Result<u128, Invalid> {
    let bad = |reason: &str| Invalid::new(text, reason, ACCEPTED);
    let mut s = text;
    if let Some(rest) = s.strip_prefix('-') {
        if rest != "0" {
            return Err(bad("a duration cannot be negative"));
        }
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(bad("it is empty"));
    }
    let max = Duration::MAX.as_nanos();
    let mut total: u128 = 0;
    while !s.is_empty() {
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int, rest) = s.split_at(int_len);
        s = rest;
        let (mut frac, mut frac_scale, mut frac_len) = (0u128, 1u128, 0usize);
        if let Some(rest) = s.strip_prefix('.') {
            frac_len = rest.bytes().take_while(u8::is_ascii_digit).count();
            let (digits, rest) = rest.split_at(frac_len);
            // Digits past nanosecond precision of an hour change nothing.
            for b in digits.bytes().take(18) {
                frac = frac * 10 + u128::from(b - b'0');
                frac_scale *= 10;
            }
            s = rest;
        }
        if int_len == 0 && frac_len == 0 {
            return Err(bad("a unit must follow a number"));
        }
        let unit_len = s
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(s.len());
        let (unit, rest) = s.split_at(unit_len);
        s = rest;
        let per = match NANOS_PER.iter().find(|(u, _)| *u == unit) {
            Some((_, 0)) => {
                return Err(bad(
                    "a number has no unit (a bare number is not a duration)",
                ));
            }
            Some((_, n)) => *n,
            None if unit == "d" => {
                return Err(bad("d is not a unit of Go durations; write 24h for a day"));
            }
            None => return Err(bad(&format!("{unit:?} is not a unit"))),
        };
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| bad("it is longer than 8760h"))?
        };
        let part = int
            .checked_mul(per)
            .and_then(|n| n.checked_add(frac * per / frac_scale))
            .ok_or_else(|| bad("it is longer than 8760h"))?;
        total = total
            .checked_add(part)
            .filter(|t| *t <= max)
            .ok_or_else(|| bad("it is longer than 8760h"))?;
    }
    Ok(total)
}

fn from_nanos(n: u128) -> std::time::Duration {
    // n <= MAX, so the seconds fit u64.
    let secs = u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX);
    std::time::Duration::new(secs, (n % 1_000_000_000) as u32)
}

impl FromStr for Duration {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        parse_nanos(s).map(|n| Duration(from_nanos(n)))
    }
}

impl FromStr for PositiveDuration {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let n = parse_nanos(s).map_err(|e| Invalid {
            accepted: ACCEPTED_POSITIVE,
            ..e
        })?;
        if n == 0 {
            return Err(Invalid::new(s, "it is zero", ACCEPTED_POSITIVE));
        }
        Ok(PositiveDuration(Duration(from_nanos(n))))
    }
}

/// Hours, minutes, seconds, ms, us, ns: each non-zero part, so `1h30m`,
/// `1s500ms`, `0s`.
impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = self.0.as_nanos();
        if n == 0 {
            return f.write_str("0s");
        }
        for (unit, per) in [
            ("h", 3_600_000_000_000u128),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ] {
            if n >= per {
                write!(f, "{}{unit}", n / per)?;
                n %= per;
            }
        }
        Ok(())
    }
}
impl fmt::Display for PositiveDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Grammar for Duration {
    const ACCEPTED: &'static str = ACCEPTED;
}
impl Grammar for PositiveDuration {
    const ACCEPTED: &'static str = ACCEPTED_POSITIVE;
}
string_value!(Duration);
string_value!(PositiveDuration);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;
    use std::time::Duration as D;

    #[rstest]
    #[case("0", D::ZERO)]
    #[case("0s", D::ZERO)]
    #[case("500ms", D::from_millis(500))]
    #[case("1.5s", D::from_millis(1500))]
    #[case(".5s", D::from_millis(500))]
    #[case("1h30m", D::from_secs(5400))]
    #[case("1800s", D::from_secs(1800))]
    #[case("30m", D::from_secs(1800))]
    #[case("1m30s", D::from_secs(90))]
    #[case("2h", D::from_secs(7200))]
    #[case("1us", D::from_micros(1))]
    #[case("1µs", D::from_micros(1))]
    #[case("+5s", D::from_secs(5))]
    #[case("8760h", Duration::MAX)]
    fn parses_go_durations(#[case] text: &str, #[case] want: D) {
        assert_eq!(text.parse::<Duration>().map(Duration::get), Ok(want));
    }

    #[rstest]
    #[case("", "empty")]
    #[case("10", "no unit")]
    #[case("1d", "24h")]
    #[case("-1s", "negative")]
    #[case("5x", "not a unit")]
    #[case("1e20s", "not a unit")]
    #[case("18446744073709551615s", "longer")]
    #[case("99999999999999999999999h", "longer")]
    #[case("8761h", "longer")]
    #[case("8760h1ns", "longer")]
    #[case("NaNs", "must follow")]
    #[case("inf s", "must follow")]
    #[case(".s", "must follow")]
    #[case("s", "must follow")]
    fn refuses(#[case] text: &str, #[case] why: &str) {
        let e = text.parse::<Duration>().expect_err(text);
        assert!(e.to_string().contains(why), "{text}: {e}");
        assert!(e.to_string().contains("1h30m"), "{e}");
    }

    #[test]
    fn positive_refuses_zero_and_compares_by_value() {
        assert!("0s".parse::<PositiveDuration>().is_err());
        assert!("0".parse::<PositiveDuration>().is_err());
        let a: PositiveDuration = "1800s".parse().expect("1800s");
        let b: PositiveDuration = "30m".parse().expect("30m");
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "30m");
    }

    proptest! {
        #[test]
        fn round_trips(n in 0u128..=Duration::MAX.as_nanos()) {
            let d = Duration(from_nanos(n));
            prop_assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
        }

        #[test]
        fn never_panics(s in "\\PC*") {
            let _ = s.parse::<Duration>();
            let _ = s.parse::<PositiveDuration>();
        }

        #[test]
        fn never_panics_on_duration_shapes(s in "[-+]?[0-9.]{0,30}(ns|us|ms|s|m|h|d|x)?([0-9.]{0,25}(ns|us|ms|s|m|h)){0,3}") {
            if let Ok(d) = s.parse::<Duration>() {
                prop_assert!(d.get() <= Duration::MAX);
            }
        }
    }
}
