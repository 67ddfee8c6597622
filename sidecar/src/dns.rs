//! The peers' names against this pod's DNS configuration.
//!
//! The webhook names peers `<name>-<i>.<service>.<namespace>.svc.<domain>`,
//! with the cluster domain it was told (`cluster.local` by default). The
//! kubelet writes the real one into every pod's `/etc/resolv.conf`
//! (`search <namespace>.svc.<domain> svc.<domain> <domain>`), so a sidecar
//! can tell at start when the two disagree: then no peer name resolves and
//! the rendezvous never forms, and the fix is a webhook flag, not the job.

/// Where the kubelet writes the pod's resolver configuration.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// The most of `/etc/resolv.conf` that is read.
const MAX_RESOLV_CONF: u64 = 64 * 1024;

/// The cluster domain a peer host pattern ends with: what follows `.svc.`.
pub fn cluster_domain_of(pattern: &str) -> Option<&str> {
    let (_, domain) = pattern.rsplit_once(".svc.")?;
    (!domain.is_empty()).then_some(domain.trim_end_matches('.'))
}

/// The `search` domains of a resolv.conf text (the last `search` line wins,
/// as in glibc).
pub fn search_domains(resolv_conf: &str) -> Vec<&str> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("search"))
        .rfind(|rest| rest.starts_with(char::is_whitespace))
        .map(|rest| {
            rest.split_whitespace()
                .map(|d| d.trim_end_matches('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// `Err` (what to do) when the pattern's cluster domain is not the one this
/// pod's search list names; `Ok` when they agree or when it cannot be told
/// (a pattern of another shape, a pod whose DNS the kubelet does not manage).
pub fn check(pattern: &str, resolv_conf: &str) -> Result<(), String> {
    let Some(domain) = cluster_domain_of(pattern) else {
        return Ok(());
    };
    let search = search_domains(resolv_conf);
    let cluster: Vec<&str> = search
        .iter()
        .filter_map(|d| d.strip_prefix("svc."))
        .collect();
    if cluster.is_empty() || cluster.contains(&domain) {
        return Ok(());
    }
    Err(format!(
        "the peer names end in .svc.{domain}, but this pod's DNS search list ({RESOLV_CONF}: {}) says the cluster domain is {}: no peer name resolves and the rendezvous cannot form; run the webhook with --cluster-domain={} (or set clusterDomain in the policy) and re-apply the workload",
        search.join(" "),
        cluster[0],
        cluster[0]
    ))
}

/// [`check`] against this pod's own `/etc/resolv.conf` (an unreadable file
/// is not a problem to report).
pub fn check_pod(pattern: &str) -> Result<(), String> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(RESOLV_CONF)
        .and_then(|f| f.take(MAX_RESOLV_CONF).read_to_string(&mut text));
    match read {
        Ok(_) => check(pattern, &text),
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET: &str = "search ml.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.96.0.10\noptions ndots:5\n";

    #[test]
    fn domains() {
        assert_eq!(
            cluster_domain_of("train-{i}.train.ml.svc.cluster.local"),
            Some("cluster.local")
        );
        assert_eq!(cluster_domain_of("train-{i}.train.ml.svc"), None);
        assert_eq!(cluster_domain_of("127.0.0.1{i}"), None);
        assert_eq!(
            search_domains(KUBELET),
            [
                "ml.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(
            search_domains("searchx a\nnameserver 1.1.1.1"),
            Vec::<&str>::new()
        );
        assert_eq!(search_domains("search a.\nsearch b c\n"), ["b", "c"]);
    }

    #[test]
    fn agreement_and_mismatch() {
        assert_eq!(check("t-{i}.t.ml.svc.cluster.local", KUBELET), Ok(()));
        // Cannot tell: not the webhook's shape, or no kubelet search list.
        assert_eq!(check("node-{i}", KUBELET), Ok(()));
        assert_eq!(
            check("t-{i}.t.ml.svc.cluster.local", "nameserver 1.1.1.1\n"),
            Ok(())
        );
        let err = check(
            "t-{i}.t.ml.svc.cluster.local",
            &KUBELET.replace("cluster.local", "k8s.lab"),
        )
        .expect_err("a mismatch");
        assert!(err.contains("end in .svc.cluster.local"), "{err}");
        assert!(err.contains("--cluster-domain=k8s.lab"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(pattern in ".{0,80}", conf in ".{0,400}") {
            let _ = check(&pattern, &conf);
        }
    }
}
