//! The grammars of policy values: Kubernetes quantities, durations, label
//! keys and values, namespace and claim patterns, endpoints. Each check
//! answers the accepted forms in its error, so a message built from it tells
//! the user what to write instead.

use std::time::Duration;

/// Bytes of a Kubernetes quantity such as `8Gi`, `512Mi`, `1.5G`, `1e9`.
///
/// Accepted: a non-negative decimal number with an optional binary suffix
/// (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`), decimal suffix (`m`, `k`, `M`, `G`,
/// `T`, `P`, `E`) or exponent (`e3`, `E6`).
pub fn quantity(text: &str) -> Result<f64, String> {
    const FORMS: &str = "a Kubernetes quantity such as 8Gi, 512Mi, 1G or 1e9";
    let bad = || format!("{text:?} is not {FORMS}");
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty()
        || number == "."
        || number.matches('.').count() > 1
        || !number.chars().all(|c| c.is_ascii_digit() || c == '.')
    {
        return Err(bad());
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    // Nano and micro make no sense for the sizes a policy holds.
    if matches!(suffix, "n" | "u") {
        return Err(bad());
    }
    let multiplier = quantity_multiplier(suffix).ok_or_else(bad)?;
    Ok(value * multiplier)
}

/// The factor a Kubernetes quantity suffix stands for: binary (`Ki` … `Ei`),
/// decimal (`n`, `u`, `m`, `k` … `E`) or an exponent (`e3`, `E-2`); `None`
/// for anything else.
pub fn quantity_multiplier(suffix: &str) -> Option<f64> {
    Some(match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            10f64.powi(digits.parse::<i32>().ok()?)
        }
        _ => return None,
    })
}

/// A duration such as `30m`, `90s`, `2h`, `500ms`: one whole number and one
/// unit (`ms`, `s`, `m`, `h`), greater than zero.
pub fn duration(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "a duration: a whole number and a unit ms, s, m or h, such as 90s, 30m, 2h";
    let bad = || format!("{text:?} is not {FORMS}");
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if duration.is_zero() {
        return Err(format!("{text:?} is zero; give {FORMS}"));
    }
    Ok(duration)
}

/// A DNS-1123 label: lowercase letters, digits and `-`, starting and ending
/// with a letter or digit, at most 63 characters (namespace names, profile
/// names).
pub fn dns_label(text: &str) -> Result<(), String> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-')
        && !text.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"
        ))
    }
}

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253
/// characters (PVC names, label key prefixes).
pub fn dns_subdomain(text: &str) -> Result<(), String> {
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|part| dns_label(part).is_ok());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        ))
    }
}

fn label_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at
/// most 63 characters (`karpenter.sh/nodepool`, `node.kubernetes.io/instance-type`).
pub fn label_key(text: &str) -> Result<(), String> {
    let ok = match text.split_once('/') {
        Some((prefix, name)) => dns_subdomain(prefix).is_ok() && label_name(name),
        None => label_name(text),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a label key (an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        ))
    }
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_`, `.`,
/// starting and ending with a letter or digit.
pub fn label_value(text: &str) -> Result<(), String> {
    if text.is_empty() || label_name(text) {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a label value (empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        ))
    }
}

/// An environment variable name: letters, digits and `_`, not starting with a digit.
pub fn env_name(text: &str) -> bool {
    !text.is_empty()
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !text.starts_with(|c: char| c.is_ascii_digit())
}

/// Whether `text` has glob metacharacters (`*`, `?`, `[`).
pub fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// Compile a glob, with the error text of globset.
pub fn glob(text: &str) -> Result<globset::GlobMatcher, String> {
    globset::GlobBuilder::new(text)
        .literal_separator(false)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("{text:?} is not a valid glob: {}", e.kind()))
}

/// A namespace name or glob (`ml-*`, `team-?`, `research`).
pub fn namespace_pattern(text: &str) -> Result<(), String> {
    if is_glob(text) {
        glob(text)?;
        let ok = text.chars().all(|c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, '-' | '*' | '?' | '[' | ']' | '!' | '{' | '}' | ',')
        });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{text:?} can never match a namespace: namespace names hold only lowercase letters, digits and '-'"
            ))
        }
    } else {
        dns_label(text)
    }
}

/// The placeholders a claim pattern may hold, replaced by the workload's
/// namespace and name before matching.
pub const CLAIM_PLACEHOLDERS: &[&str] = &["{namespace}", "{name}"];

/// Replace `{namespace}` and `{name}` in a claim pattern.
pub fn substitute_claim(pattern: &str, namespace: &str, name: &str) -> String {
    pattern
        .replace("{namespace}", namespace)
        .replace("{name}", name)
}

/// A claim name or glob, with optional `{namespace}` / `{name}` placeholders
/// (`ckpt-shared`, `ckpt-*`, `{namespace}-checkpoints`).
pub fn claim_pattern(text: &str) -> Result<(), String> {
    let plain = substitute_claim(text, "ns", "name");
    if plain.contains(['{', '}']) {
        return Err(format!(
            "{text:?} holds an unknown placeholder; the accepted ones are {{namespace}} and {{name}}"
        ));
    }
    if is_glob(&plain) {
        glob(&plain)?;
        let ok = plain.chars().all(|c| {
            c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, '-' | '.' | '*' | '?' | '[' | ']' | '!')
        });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{text:?} can never match a claim name: claim names hold only lowercase letters, digits, '-' and '.'"
            ))
        }
    } else {
        dns_subdomain(&plain)
    }
}

/// Whether a claim pattern (after substitution) matches `claim`.
pub fn claim_matches(pattern: &str, namespace: &str, name: &str, claim: &str) -> bool {
    let pattern = substitute_claim(pattern, namespace, name);
    if is_glob(&pattern) {
        glob(&pattern).is_ok_and(|g| g.is_match(claim))
    } else {
        pattern == claim
    }
}

/// `host:port` of an external service: a DNS name, an IPv4 address or a
/// bracketed IPv6 address, and a port 1-65535.
pub fn host_port(text: &str) -> Result<(), String> {
    let bad = |why: &str| {
        format!(
            "{text:?} is not host:port ({why}); accepted: etcd.example.svc:2379, 10.0.0.5:2379, [fd00::5]:2379"
        )
    };
    if text.contains("://") {
        return Err(bad("no scheme"));
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(bad("the port is missing"));
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("the port must be a number from 1 to 65535")),
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| bad("the bracketed IPv6 address is not valid"));
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Ok(());
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if name_ok {
        Ok(())
    } else {
        Err(bad("the host is not a DNS name or IP address"))
    }
}

/// An absolute container path, not `/` and without `..`.
pub fn mount_path(text: &str) -> Result<(), String> {
    if !text.starts_with('/') || text == "/" || text.split('/').any(|part| part == "..") {
        Err(format!(
            "{text:?} is not an absolute mount path (starts with '/', is not '/' itself, has no '..')"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("8Gi", 8.0 * 1024.0 * 1024.0 * 1024.0)]
    #[case("512Mi", 512.0 * 1024.0 * 1024.0)]
    #[case("1G", 1e9)]
    #[case("1.5G", 1.5e9)]
    #[case("1e9", 1e9)]
    #[case("64", 64.0)]
    #[case("+1Ki", 1024.0)]
    fn quantities(#[case] text: &str, #[case] bytes: f64) {
        assert_eq!(quantity(text), Ok(bytes));
    }

    #[rstest]
    #[case("")]
    #[case("8GB")]
    #[case("-1Gi")]
    #[case("Gi")]
    #[case("1..2")]
    #[case("8 Gi")]
    #[case("1e")]
    fn bad_quantities(#[case] text: &str) {
        assert!(quantity(text).is_err(), "{text}");
    }

    #[rstest]
    #[case("90s", Duration::from_secs(90))]
    #[case("30m", Duration::from_secs(1800))]
    #[case("2h", Duration::from_secs(7200))]
    #[case("500ms", Duration::from_millis(500))]
    fn durations(#[case] text: &str, #[case] d: Duration) {
        assert_eq!(duration(text), Ok(d));
    }

    #[rstest]
    #[case("")]
    #[case("30")]
    #[case("0s")]
    #[case("1h30m")]
    #[case("1.5h")]
    #[case("-1m")]
    #[case("10d")]
    fn bad_durations(#[case] text: &str) {
        assert!(duration(text).is_err(), "{text}");
    }

    #[test]
    fn labels() {
        assert!(label_key("karpenter.sh/nodepool").is_ok());
        assert!(label_key("node.kubernetes.io/instance-type").is_ok());
        assert!(label_key("gpu").is_ok());
        assert!(label_key("Karpenter.sh/nodepool").is_err());
        assert!(label_key("a/b/c").is_err());
        assert!(label_key("/x").is_err());
        assert!(label_value("gpu-a100").is_ok());
        assert!(label_value("").is_ok());
        assert!(label_value("-gpu").is_err());
        assert!(label_value("a b").is_err());
    }

    #[test]
    fn patterns() {
        assert!(namespace_pattern("ml-*").is_ok());
        assert!(namespace_pattern("research").is_ok());
        assert!(namespace_pattern("ML-*").is_err());
        assert!(namespace_pattern("ml-[").is_err());
        assert!(claim_pattern("ckpt-*").is_ok());
        assert!(claim_pattern("{namespace}-checkpoints").is_ok());
        assert!(claim_pattern("{team}-checkpoints").is_err());
        assert!(claim_pattern("Ckpt").is_err());
        assert!(claim_matches("{namespace}-ckpt", "ml", "job", "ml-ckpt"));
        assert!(claim_matches("ckpt-*", "ml", "job", "ckpt-a"));
        assert!(!claim_matches("ckpt-*", "ml", "job", "data"));
    }

    #[test]
    fn endpoints() {
        assert!(host_port("etcd.platform.svc:2379").is_ok());
        assert!(host_port("10.0.0.5:2379").is_ok());
        assert!(host_port("[fd00::5]:2379").is_ok());
        assert!(host_port("etcd").is_err());
        assert!(host_port("etcd:0").is_err());
        assert!(host_port("etcd:http").is_err());
        assert!(host_port("http://etcd:2379").is_err());
        assert!(host_port("[zz]:2379").is_err());
    }

    #[test]
    fn mount_paths() {
        assert!(mount_path("/checkpoints").is_ok());
        assert!(mount_path("checkpoints").is_err());
        assert!(mount_path("/").is_err());
        assert!(mount_path("/a/../b").is_err());
    }
}
