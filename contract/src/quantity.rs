//! Kubernetes quantities (`8Gi`, `512Mi`, `1.5G`, `100m`, `1e9`), parsed
//! once and compared by value: `64Gi == 65536Mi`, `1G == 1e9`.
//!
//! The grammar is Kubernetes' own (`resource.Quantity`): an optional sign, a
//! decimal number, and a binary suffix (`Ki` … `Ei`), a decimal suffix (`n`,
//! `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or an exponent (`e3`, `E-2`).
//! Values are exact (integer nano-units), never floats.

use std::fmt;
use std::str::FromStr;

use crate::{Grammar, Invalid, string_value};

const QUANTITY_FORMS: &str = "a Kubernetes quantity such as 8Gi, 512Mi, 1.5G, 100m or 1e9";
const BYTES_FORMS: &str = "a size in whole bytes such as 8Gi, 512Mi, 64Gi or 1G (Ki, Mi, Gi, Ti, Pi, Ei are powers of 1024; k, M, G, T, P, E of 1000)";
const SHM_FORMS: &str =
    "a size of at least 1Mi such as 8Gi, 512Mi or 64Gi, or off to leave /dev/shm alone";

const NANO: i128 = 1_000_000_000;

/// Any Kubernetes quantity (CPU, memory, ...), exact, compared by value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

/// A positive size in whole bytes (memory, `/dev/shm`), compared by value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(u64);

/// The memory-backed `/dev/shm`: a size of at least 1Mi, or `off`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShmSize {
    /// Leave `/dev/shm` alone.
    Off,
    /// A memory `emptyDir` of this size.
    Size(ByteSize),
}

fn pow(base: i128, exp: u32) -> Option<i128> {
    base.checked_pow(exp)
}

impl Quantity {
    /// The value in nano-units (`1` is `1_000_000_000`).
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// The value in base units as a plain decimal, the same for every
    /// spelling: `1Gi` and `1024Mi` give `1073741824`, `100m` gives `0.1`.
    pub fn decimal(self) -> String {
        let sign = if self.nanos < 0 { "-" } else { "" };
        let n = self.nanos.unsigned_abs();
        let nano = NANO.unsigned_abs();
        let (whole, frac) = (n / nano, n % nano);
        if frac == 0 {
            format!("{sign}{whole}")
        } else {
            let frac = format!("{frac:09}");
            format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
        }
    }

    fn parse(text: &str, accepted: &'static str) -> Result<Self, Invalid> {
        let bad = |reason: &str| Invalid::new(text, reason, accepted);
        let (negative, s) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
        let (int, rest) = s.split_at(int_len);
        let (frac, suffix) = match rest.strip_prefix('.') {
            Some(r) => {
                let n = r.bytes().take_while(u8::is_ascii_digit).count();
                r.split_at(n)
            }
            None => ("", rest),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(bad("it does not start with a number"));
        }
        if int.len() + frac.len() > 30 {
            return Err(bad("it has too many digits"));
        }
        let too_big = || bad("it is too large");
        // value = digits / 10^frac.len() * multiplier, in nano-units.
        let digits: i128 = format!("{int}{frac}").parse().map_err(|_| too_big())?;
        let frac_len = u32::try_from(frac.len()).map_err(|_| too_big())?;
        // An exponent scales by any power of ten, as long as the value
        // fits: `0.01e20` is `1e18`. (`E` and `Ei` are exa and exbi.)
        if !matches!(suffix, "E" | "Ei")
            && let Some(exp) = suffix.strip_prefix(['e', 'E'])
        {
            let unsigned = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(&format!("{suffix:?} is not a suffix")));
            }
            let e: i64 = exp.parse().map_err(|_| too_big())?;
            // value = digits × 10^(e - frac.len()), in nano-units.
            let scale = e + 9 - i64::from(frac_len);
            let mut nanos = if digits == 0 {
                0
            } else if scale >= 0 {
                u32::try_from(scale)
                    .ok()
                    .and_then(|s| pow(10, s))
                    .and_then(|p| digits.checked_mul(p))
                    .ok_or_else(too_big)?
            } else {
                match u32::try_from(-scale).ok().and_then(|s| pow(10, s)) {
                    // Kubernetes rounds a value finer than 1n up.
                    Some(p) => digits / p + i128::from(digits % p != 0),
                    None => 1,
                }
            };
            if nanos > i128::from(i64::MAX) * NANO {
                return Err(too_big());
            }
            if negative {
                nanos = -nanos;
            }
            return Ok(Quantity { nanos });
        }
        let (mul_num, mul_den): (i128, i128) = match suffix {
            "" => (1, 1),
            "Ki" => (1 << 10, 1),
            "Mi" => (1 << 20, 1),
            "Gi" => (1 << 30, 1),
            "Ti" => (1 << 40, 1),
            "Pi" => (1 << 50, 1),
            "Ei" => (1 << 60, 1),
            "n" => (1, NANO),
            "u" => (1, 1_000_000),
            "m" => (1, 1_000),
            "k" => (1_000, 1),
            "M" => (1_000_000, 1),
            "G" => (1_000_000_000, 1),
            "T" => (1_000_000_000_000, 1),
            "P" => (1_000_000_000_000_000, 1),
            "E" => (1_000_000_000_000_000_000, 1),
            other => return Err(bad(&format!("{other:?} is not a suffix"))),
        };
        let num = digits
            .checked_mul(mul_num)
            .and_then(|n| n.checked_mul(NANO))
            .ok_or_else(too_big)?;
        let den = pow(10, frac_len)
            .and_then(|d| d.checked_mul(mul_den))
            .ok_or_else(too_big)?;
        // Kubernetes rounds a value finer than 1n up.
        let mut nanos = num / den + i128::from(num % den != 0);
        if nanos > i128::from(i64::MAX) * NANO {
            return Err(too_big());
        }
        if negative {
            nanos = -nanos;
        }
        Ok(Quantity { nanos })
    }

    /// The shortest exact spelling: whole values with the largest binary
    /// (else decimal) suffix that divides them, else `m`, `u`, `n`.
    fn write(nanos: i128, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if nanos < 0 {
            f.write_str("-")?;
        }
        let n = nanos.unsigned_abs();
        let nano = NANO.unsigned_abs();
        if n == 0 {
            return f.write_str("0");
        }
        if !n.is_multiple_of(nano) {
            for (unit, per) in [("m", 1_000_000u128), ("u", 1_000), ("n", 1)] {
                if n.is_multiple_of(per) {
                    return write!(f, "{}{unit}", n / per);
                }
            }
        }
        let whole = n / nano;
        for (unit, shift) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            let per = 1u128 << shift;
            if whole.is_multiple_of(per) {
                return write!(f, "{}{unit}", whole / per);
            }
        }
        for (unit, exp) in [
            ("E", 18),
            ("P", 15),
            ("T", 12),
            ("G", 9),
            ("M", 6),
            ("k", 3),
        ] {
            let per = 10u128.pow(exp);
            if whole.is_multiple_of(per) {
                return write!(f, "{}{unit}", whole / per);
            }
        }
        write!(f, "{whole}")
    }
}

impl FromStr for Quantity {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        Quantity::parse(s, QUANTITY_FORMS)
    }
}
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Quantity::write(self.nanos, f)
    }
}

impl ByteSize {
    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
    /// A size of `bytes` bytes, if above zero.
    pub fn new(bytes: u64) -> Option<Self> {
        (bytes > 0).then_some(ByteSize(bytes))
    }
}

impl FromStr for ByteSize {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        let bad = |reason: &str| Invalid::new(s, reason, BYTES_FORMS);
        if s.ends_with(['m', 'u', 'n']) {
            return Err(bad(
                "m, u and n are thousandths, millionths and billionths (a fraction of a byte); write Mi or M for mebibytes or megabytes",
            ));
        }
        let q = Quantity::parse(s, BYTES_FORMS)?;
        if q.nanos <= 0 {
            return Err(bad("a size must be above zero"));
        }
        if q.nanos % NANO != 0 {
            return Err(bad("it is not a whole number of bytes"));
        }
        u64::try_from(q.nanos / NANO)
            .map(ByteSize)
            .map_err(|_| bad("it is too large"))
    }
}
impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Quantity::write(i128::from(self.0) * NANO, f)
    }
}

impl ShmSize {
    /// The smallest `/dev/shm` accepted: 1Mi (NCCL and DataLoader workers need more).
    pub const MIN_BYTES: u64 = 1 << 20;
}

impl FromStr for ShmSize {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        if s == "off" {
            return Ok(ShmSize::Off);
        }
        let size: ByteSize = s.parse().map_err(|e: Invalid| Invalid {
            accepted: SHM_FORMS,
            ..e
        })?;
        if size.0 < Self::MIN_BYTES {
            return Err(Invalid::new(
                s,
                "it is less than 1Mi, too small for NCCL or DataLoader workers",
                SHM_FORMS,
            ));
        }
        Ok(ShmSize::Size(size))
    }
}
impl fmt::Display for ShmSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShmSize::Off => f.write_str("off"),
            ShmSize::Size(b) => b.fmt(f),
        }
    }
}

impl Grammar for Quantity {
    const ACCEPTED: &'static str = QUANTITY_FORMS;
}
impl Grammar for ByteSize {
    const ACCEPTED: &'static str = BYTES_FORMS;
}
impl Grammar for ShmSize {
    const ACCEPTED: &'static str = SHM_FORMS;
}
string_value!(Quantity);
string_value!(ByteSize);
string_value!(ShmSize);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rstest::rstest;

    fn b(s: &str) -> u64 {
        s.parse::<ByteSize>().map(ByteSize::bytes).unwrap_or(0)
    }

    #[rstest]
    #[case("8Gi", 8 << 30)]
    #[case("65536Mi", 64 << 30)]
    #[case("64Gi", 64 << 30)]
    #[case("1.5Gi", 3 << 29)]
    #[case("1G", 1_000_000_000)]
    #[case("1e9", 1_000_000_000)]
    #[case("+1Gi", 1 << 30)]
    #[case("1000", 1000)]
    #[case("1.5e3", 1500)]
    // Any exponent, as long as the value fits (YAML reads `0.01e20` as 1e18).
    #[case("0.01e20", 1_000_000_000_000_000_000)]
    #[case("10000e-4", 1)]
    fn sizes(#[case] text: &str, #[case] bytes: u64) {
        assert_eq!(b(text), bytes);
    }

    #[rstest]
    #[case("512m", "fraction of a byte")]
    #[case("0", "above zero")]
    #[case("-1Gi", "above zero")]
    #[case("0.5", "whole number")]
    #[case("8GB", "not a suffix")]
    #[case("Gi", "number")]
    #[case("1e", "not a suffix")]
    #[case("1e400", "too large")]
    #[case("99999999999999999999Ei", "too large")]
    fn bad_sizes(#[case] text: &str, #[case] why: &str) {
        let e = text.parse::<ByteSize>().expect_err(text).to_string();
        assert!(e.contains(why), "{text}: {e}");
    }

    #[test]
    fn compared_by_value_and_printed_canonically() {
        assert_eq!("64Gi".parse::<ShmSize>(), "65536Mi".parse::<ShmSize>());
        assert_eq!("100m".parse::<Quantity>(), "0.1".parse::<Quantity>());
        assert_eq!("1G".parse::<Quantity>(), "1e9".parse::<Quantity>());
        let q: Quantity = "1Gi".parse().expect("q");
        assert_eq!(q.decimal(), "1073741824");
        let q: Quantity = "-100m".parse().expect("q");
        assert_eq!(q.decimal(), "-0.1");
        let q: Quantity = "1536Mi".parse().expect("q");
        assert_eq!(q.to_string(), "1536Mi");
        let q: Quantity = "1.5Gi".parse().expect("q");
        assert_eq!(q.to_string(), "1536Mi");
        assert!("512Ki".parse::<ShmSize>().is_err());
        // Finer than 1n is rounded up, as Kubernetes does, however fine.
        let q: Quantity = "1e-40".parse().expect("q");
        assert_eq!(q.nanos(), 1);
        let q: Quantity = "0e99".parse().expect("q");
        assert_eq!(q.nanos(), 0);
        assert_eq!("off".parse::<ShmSize>(), Ok(ShmSize::Off));
    }

    proptest! {
        #[test]
        fn quantities_round_trip(nanos in -(i128::from(i64::MAX) * NANO)..=(i128::from(i64::MAX) * NANO)) {
            let q = Quantity { nanos };
            prop_assert_eq!(q.to_string().parse::<Quantity>(), Ok(q));
        }

        #[test]
        fn sizes_round_trip(bytes in 1u64..=i64::MAX as u64) {
            let s = ByteSize(bytes);
            prop_assert_eq!(s.to_string().parse::<ByteSize>(), Ok(s));
        }

        #[test]
        fn never_panic(s in "\\PC*") {
            let _ = s.parse::<Quantity>();
            let _ = s.parse::<ByteSize>();
            let _ = s.parse::<ShmSize>();
        }

        #[test]
        fn never_panic_on_quantity_shapes(s in "[-+]?[0-9]{0,40}(\\.[0-9]{0,40})?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|e[-+]?[0-9]{1,12})?") {
            let _ = s.parse::<Quantity>();
            let _ = s.parse::<ByteSize>();
        }
    }
}
