//! The peers' names: looked up without the blocking pool, and checked
//! against this pod's DNS configuration.
//!
//! The webhook names peers `<name>-<i>.<service>.<namespace>.svc.<domain>`,
//! with the cluster domain it was told (`cluster.local` by default). The
//! kubelet writes the real one into every pod's `/etc/resolv.conf`
//! (`search <namespace>.svc.<domain> svc.<domain> <domain>`), so a sidecar
//! can tell at start when the two disagree: then no peer name resolves and
//! the rendezvous never forms, and the fix is a webhook flag, not the job.
//!
//! [`Resolver`] looks names up as glibc's `hosts: files dns` does (the
//! pod's `/etc/hosts`, read at each lookup, then the nameservers of
//! `/etc/resolv.conf`), but on the async runtime: a lookup that hangs (no
//! cluster DNS answering: each glibc lookup then holds a thread for the
//! resolver's whole timeout, ~5 s) costs a timer, never a thread of the
//! blocking pool that `/proc` scans and signals need.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, ResolveHosts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;

/// Where the kubelet writes the pod's hosts file.
pub const HOSTS: &str = "/etc/hosts";

/// The most of `/etc/hosts` that is read.
const MAX_HOSTS: u64 = 256 * 1024;

/// A name that did not resolve, and why (shown in `/status`, the log and
/// the peer's reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("name {name} does not resolve: {why}")]
pub struct LookupError {
    pub name: String,
    pub why: String,
}

/// Looks names up: `/etc/hosts`, then DNS, on the async runtime, each
/// lookup within a time limit.
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
}

enum Inner {
    System {
        hosts: PathBuf,
        /// `Err`: why there is no DNS (no readable resolv.conf, no
        /// nameserver in it); the hosts file is still read.
        dns: Result<Box<TokioResolver>, String>,
        timeout: Duration,
    },
    /// A fixed table (tests): names not in it do not resolve.
    Table(Mutex<BTreeMap<String, Vec<IpAddr>>>),
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.inner {
            Inner::System { dns, timeout, .. } => f
                .debug_struct("Resolver")
                .field("dns", &dns.as_ref().map(|_| "resolv.conf"))
                .field("timeout", timeout)
                .finish(),
            Inner::Table(_) => f.write_str("Resolver(table)"),
        }
    }
}

impl Resolver {
    /// This pod's resolver: `/etc/hosts` and `/etc/resolv.conf`, each
    /// lookup given at most `timeout`. Must be called on the runtime that
    /// will run the lookups.
    pub fn system(timeout: Duration) -> Self {
        let dns = hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| format!("no DNS configuration ({RESOLV_CONF}): {e}"))
            .map(|(config, _)| config);
        Self::with_dns(dns, PathBuf::from(HOSTS), timeout)
    }

    /// A resolver over `dns` (the nameservers and search list) and the
    /// hosts file at `hosts`.
    pub fn with_dns(
        dns: Result<hickory_resolver::config::ResolverConfig, String>,
        hosts: PathBuf,
        timeout: Duration,
    ) -> Self {
        let dns = dns.and_then(|config| {
            let mut builder =
                TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
            let opts = builder.options_mut();
            // Answers change when a pod is replaced: never cached here.
            opts.cache_size = 0;
            // The hosts file is read at each lookup, below.
            opts.use_hosts_file = ResolveHosts::Never;
            opts.timeout = timeout;
            opts.attempts = 1;
            // The kubelet's `options ndots:5`: the peers' names have 5 dots.
            opts.ndots = 5;
            opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
            builder
                .build()
                .map(Box::new)
                .map_err(|e| format!("no DNS configuration ({RESOLV_CONF}): {e}"))
        });
        Resolver {
            inner: Arc::new(Inner::System {
                hosts,
                dns,
                timeout,
            }),
        }
    }

    /// A resolver that answers from `table` only (tests).
    pub fn table(table: BTreeMap<String, Vec<IpAddr>>) -> Self {
        Resolver {
            inner: Arc::new(Inner::Table(Mutex::new(table))),
        }
    }

    /// Changes what a [`Resolver::table`] answers for `name` (no effect on
    /// a system resolver).
    pub fn set(&self, name: &str, addrs: Vec<IpAddr>) {
        if let Inner::Table(t) = &*self.inner {
            let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
            t.insert(name.to_string(), addrs);
        }
    }

    /// The addresses `name` leads to now.
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        let fail = |why: String| LookupError {
            name: name.to_string(),
            why,
        };
        let bare = name.trim_end_matches('.');
        if let Ok(ip) = bare
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(vec![ip]);
        }
        match &*self.inner {
            Inner::Table(t) => t
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .filter(|a| !a.is_empty())
                .cloned()
                .ok_or_else(|| fail("not in the table".into())),
            Inner::System {
                hosts,
                dns,
                timeout,
            } => {
                let from_file = read_bounded(hosts, MAX_HOSTS)
                    .map(|text| hosts_lookup(&text, bare))
                    .unwrap_or_default();
                if !from_file.is_empty() {
                    return Ok(from_file);
                }
                let dns = dns.as_ref().map_err(|why| fail(why.clone()))?;
                match tokio::time::timeout(*timeout, dns.lookup_ip(name)).await {
                    Ok(Ok(found)) => {
                        let addrs: Vec<IpAddr> = found.iter().collect();
                        if addrs.is_empty() {
                            Err(fail("no address in the answer".into()))
                        } else {
                            Ok(addrs)
                        }
                    }
                    Ok(Err(e)) => Err(fail(e.to_string())),
                    Err(_) => Err(fail(format!(
                        "no answer from the nameservers of {RESOLV_CONF} within {}ms",
                        timeout.as_millis()
                    ))),
                }
            }
        }
    }
}

/// The addresses of `name` in a hosts-file text (`<address> <names...>`,
/// `#` comments), in file order, as glibc's `files` source answers.
pub fn hosts_lookup(text: &str, name: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let mut fields = line.split_whitespace();
        let Some(Ok(addr)) = fields.next().map(str::parse::<IpAddr>) else {
            continue;
        };
        if fields.any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(name))
            && !found.contains(&addr)
        {
            found.push(addr);
        }
    }
    found
}

fn read_bounded(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(max)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// The HTTP client's resolver (heartbeats): the same lookups.
impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = LookupError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, LookupError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), LookupError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let resolver = self.clone();
        Box::pin(async move {
            let addrs = resolver.lookup(name.as_str()).await?;
            Ok(addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

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

    #[test]
    fn hosts_file_lookups_follow_glibc() {
        let text = "127.0.0.1 localhost\n# 10.0.0.9 train-0\n10.0.0.1 train-0.t.ml.svc.cluster.local train-0 # me\n10.0.0.2\tTRAIN-1.t.ml.svc.cluster.local.\nbad line\nfe80::1 train-0\n";
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        assert_eq!(
            hosts_lookup(text, "train-0"),
            [ip("10.0.0.1"), ip("fe80::1")]
        );
        assert_eq!(
            hosts_lookup(text, "train-1.t.ml.svc.cluster.local"),
            [ip("10.0.0.2")]
        );
        assert!(hosts_lookup(text, "train-9").is_empty());
    }

    #[tokio::test]
    async fn a_table_and_literals() {
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        let r = Resolver::table(BTreeMap::from([("a".to_string(), vec![ip("10.0.0.1")])]));
        assert_eq!(r.lookup("a").await, Ok(vec![ip("10.0.0.1")]));
        assert_eq!(r.lookup("127.0.0.3").await, Ok(vec![ip("127.0.0.3")]));
        assert_eq!(r.lookup("[::1]").await, Ok(vec![ip("::1")]));
        let err = r.lookup("b").await.expect_err("not in the table");
        assert_eq!(err.to_string(), "name b does not resolve: not in the table");
        r.set("b", vec![ip("10.0.0.2")]);
        assert_eq!(r.lookup("b").await, Ok(vec![ip("10.0.0.2")]));
    }

    /// A nameserver that never answers (the cluster DNS unreachable): the
    /// lookups end at their time limit with a reason naming the name, and
    /// none holds a thread of the blocking pool (this runtime's pool has
    /// two threads: a lookup that held one for the resolver's timeout, as
    /// glibc's does, would keep the blocking task below waiting).
    #[test]
    fn a_silent_nameserver_is_a_timeout_not_a_held_thread() {
        use hickory_resolver::config::{
            ConnectionConfig, NameServerConfig, ProtocolConfig, ResolverConfig,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(2)
            .build()
            .expect("runtime");
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = silent.local_addr().expect("addr").port();
        let mut ns = NameServerConfig::udp(IpAddr::from([127, 0, 0, 1]));
        let mut udp = ConnectionConfig::new(ProtocolConfig::Udp);
        udp.port = port;
        ns.connections = vec![udp];
        let config = ResolverConfig::from_parts(None, vec![], vec![ns]);
        let dir = tempfile::tempdir().expect("tmp");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "10.9.9.9 in-the-file\n").expect("hosts");
        runtime.block_on(async {
            let r = Resolver::with_dns(Ok(config), hosts.clone(), Duration::from_millis(300));
            // Many lookups at once, as the heartbeat searches make them.
            let lookups = futures::future::join_all((0..32).map(|i| {
                let r = r.clone();
                async move { r.lookup(&format!("train-{i}.t.ml.svc.cluster.local")).await }
            }));
            let (results, from_file) = tokio::join!(lookups, r.lookup("in-the-file"));
            for result in results {
                let err = result.expect_err("nothing answers");
                assert!(err.to_string().starts_with("name train-"), "{err}");
                assert!(err.why.contains("within 300ms"), "{err}");
            }
            assert_eq!(from_file, Ok(vec![IpAddr::from([10, 9, 9, 9])]));
            // The blocking pool is free at once.
            let free =
                tokio::time::timeout(Duration::from_secs(2), tokio::task::spawn_blocking(|| 7))
                    .await;
            assert!(matches!(free, Ok(Ok(7))), "the blocking pool is held");
            // The file is read at each lookup: a changed line is seen at once.
            std::fs::write(&hosts, "10.9.9.8 in-the-file\n").expect("hosts");
            assert_eq!(
                r.lookup("in-the-file").await,
                Ok(vec![IpAddr::from([10, 9, 9, 8])])
            );
        });
        drop(silent);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(pattern in ".{0,80}", conf in ".{0,400}") {
            let _ = check(&pattern, &conf);
            let _ = hosts_lookup(&conf, &pattern);
        }
    }
}
