//! The grammars of policy-only values: label keys and values, namespace and
//! claim patterns, endpoints. (Durations, sizes, quantities and mount paths
//! are `trainwire-contract` types, shared with the annotations and the
//! sidecar.) Each check
//! answers the accepted forms in its error, so a message built from it tells
//! the user what to write instead.

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
