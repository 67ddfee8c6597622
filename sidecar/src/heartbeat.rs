//! Direct heartbeats between sidecars over plain HTTP.
//!
//! Every sidecar answers `GET /heartbeat` with its identity; every sidecar
//! probes each peer's `/heartbeat` once per interval with a short timeout.
//! A peer that was seen healthy is lost after N consecutive misses, or at
//! once when its identity (pod UID, start time) changes. A host name that
//! does not resolve yet is a miss of a peer never seen: retried, not a loss.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::dns::Resolver;
use crate::peers::{Evidence, Identity, Observation, Source};

/// What `GET /heartbeat` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    pub pod: String,
    pub uid: String,
    /// When this sidecar started (RFC 3339); tells a restarted peer apart
    /// when the pod UID is not available.
    pub start_time: String,
    pub rank: u32,
    /// The answering sidecar's own loss generation.
    pub generation: u64,
}

impl Beat {
    pub fn identity(&self) -> Identity {
        Identity {
            pod: self.pod.clone(),
            uid: self.uid.clone(),
            start_time: self.start_time.clone(),
            ..Identity::default()
        }
    }
}

/// The probe URL of rank `rank`.
pub fn url_of(config: &Config, rank: u32) -> Option<String> {
    let host = config.heartbeat.host_of(rank)?;
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    Some(format!("http://{host}:{}/heartbeat", config.health_port))
}

/// The ranks this sidecar probes: every pod of the workload (the world's
/// largest size plus the hot spares, [`Config::pods`]) but its own. A
/// spare is probed like any peer, whatever this pod's own rank, so that a
/// spare that trains after a take-over, or stops answering, is seen by all.
pub fn peer_ranks(config: &Config) -> impl Iterator<Item = u32> + use<> {
    let own = config.node_rank;
    (0..config.pods()).filter(move |r| *r != own)
}

type HttpClient = Client<HttpConnector<Resolver>, Empty<Bytes>>;

/// The probes' HTTP client: names are looked up by `resolver` (on the
/// runtime, never on the blocking pool: a DNS that does not answer costs
/// each probe its time limit, not a thread).
fn client(timeout: Duration, resolver: Resolver) -> HttpClient {
    let mut connector = HttpConnector::new_with_resolver(resolver);
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeout));
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1)
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// A beat, with the address it came from (when the connection says).
#[derive(Debug)]
struct Answer {
    beat: Beat,
    from: Option<std::net::IpAddr>,
}

/// One probe: the peer's beat, or why there is none.
async fn probe(client: &HttpClient, url: &str, timeout: Duration) -> Result<Answer, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
    let work = async {
        let resp = client.get(uri).await.map_err(|e| describe(&e))?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let from = resp
            .extensions()
            .get::<hyper_util::client::legacy::connect::HttpInfo>()
            .map(|info| info.remote_addr().ip());
        let body = Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        let beat =
            serde_json::from_slice::<Beat>(&body).map_err(|e| format!("not a heartbeat: {e}"))?;
        Ok(Answer { beat, from })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {}ms", timeout.as_millis())),
    }
}

fn describe(e: &hyper_util::client::legacy::Error) -> String {
    use std::error::Error as _;
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(": ");
        text.push_str(&s.to_string());
        src = s.source();
    }
    text
}

/// Probes in flight at once for one peer that does not answer: enough to
/// start one per interval for as long as a probe may take (at least 2).
fn max_inflight(interval: Duration, timeout: Duration) -> usize {
    let per = interval.as_millis().max(1);
    usize::try_from(timeout.as_millis().div_ceil(per))
        .unwrap_or(usize::MAX)
        .clamp(2, 16)
}

/// While a peer is lost (missed `misses` beats in a row), it is also
/// searched for, so that a replacement answering at its name is seen soon
/// after the name leads to it (the rendezvous host's replacement is what the
/// survivors' restart waits for). Misses are still counted once per interval.
///
/// How often: every [`SEARCH_EVERY_PER_NODE`] × the world's size, within
/// [`MIN_SEARCH_EVERY`] and a quarter interval. A small world searches every
/// 50 ms; in a large one all the survivors together look the lost name up
/// (each search probe resolves it) at most about 500 times a second, what
/// one cluster DNS replica answers without notice.
fn search_every(interval: Duration, nodes: u32) -> Duration {
    let quarter = (interval / 4).max(MIN_SEARCH_EVERY);
    SEARCH_EVERY_PER_NODE
        .saturating_mul(nodes)
        .clamp(MIN_SEARCH_EVERY, quarter)
}

/// The shortest time between two searches of a lost peer.
const MIN_SEARCH_EVERY: Duration = Duration::from_millis(50);
/// The search period per node of the world (see [`search_every`]).
const SEARCH_EVERY_PER_NODE: Duration = Duration::from_millis(2);

/// One probe in flight.
type Probe = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Answer, String>> + Send>>;

/// What the probes of one peer have shown since the last tick.
struct Tally {
    rank: u32,
    url: String,
    /// A good beat arrived since the last tick.
    answered: bool,
    missed_in_a_row: u32,
    last_error: Option<String>,
    /// The peer's name does not resolve (said once, in the log, until it
    /// does again; `/status` shows it as the peer's detail).
    unresolved: bool,
}

impl Tally {
    /// The evidence a finished probe gives, if any (an error is only kept
    /// for the next tick's miss).
    fn judge(&mut self, result: Result<Answer, String>) -> Option<Evidence> {
        match result {
            Ok(Answer { beat, from }) if beat.rank == self.rank => {
                if std::mem::take(&mut self.unresolved) {
                    tracing::info!(rank = self.rank, url = %self.url, "the peer's name resolves again");
                }
                self.answered = true;
                self.missed_in_a_row = 0;
                self.last_error = None;
                Some(Evidence::Alive(Identity {
                    address: from,
                    ..beat.identity()
                }))
            }
            Ok(Answer { beat, .. }) => {
                self.last_error = Some(format!(
                    "{} answered as rank {} (pod {}), not rank {}",
                    self.url, beat.rank, beat.pod, self.rank
                ));
                None
            }
            Err(e) => {
                if e.contains(" does not resolve: ") && !self.unresolved {
                    self.unresolved = true;
                    tracing::warn!(
                        rank = self.rank,
                        url = %self.url,
                        "heartbeats to the peer fail: {e}; it is reported unknown (or, once seen, missed) until its name resolves"
                    );
                }
                tracing::trace!(rank = self.rank, url = %self.url, error = %e, "heartbeat missed");
                self.last_error = Some(e);
                None
            }
        }
    }
}

/// Probes every peer forever, sending observations to `tx`; returns when
/// `tx` is closed.
///
/// Probing and counting misses are decoupled. A new probe starts at a tick
/// when none is in flight (or, while the peer does not answer, one more per
/// tick, up to [`max_inflight`]), and may take up to the probe timeout (its
/// connection is kept, so a slow network costs one round trip per probe);
/// at each tick with no good answer since the previous one, one miss is
/// reported. So a dead peer is reported after about interval × misses, while
/// an answer that takes longer than the interval (latency) is not a loss.
///
/// Once the peer is lost, it is also searched for: a probe every
/// [`search_every`] (50 ms in a small world, at most a quarter interval),
/// each given one interval, in a set of its own. A probe stuck on the dead
/// address ends within the interval, so these never pile up to a limit, and
/// a replacement that answers at the name (a new address behind it) is seen
/// within one search period of answering, however long the regular probes
/// still wait on the old address.
pub async fn run(config: Config, resolver: Resolver, tx: mpsc::Sender<Observation>) {
    let timeout = config.heartbeat.timeout;
    let http = client(timeout, resolver);
    let mut tasks = tokio::task::JoinSet::new();
    for rank in peer_ranks(&config) {
        let Some(url) = url_of(&config, rank) else {
            tracing::warn!("no peer host pattern: heartbeats disabled");
            return;
        };
        let http = http.clone();
        let tx = tx.clone();
        let interval = config.heartbeat.interval;
        let max_inflight = max_inflight(interval, timeout);
        let lost_after = config.heartbeat.misses.max(1);
        let search_every = search_every(interval, config.pods());
        let search_timeout = interval.min(timeout);
        // One search probe may take `search_timeout`: enough room for one
        // to start at every search tick.
        let max_searching = usize::try_from(
            search_timeout
                .as_millis()
                .div_ceil(search_every.as_millis().max(1)),
        )
        .unwrap_or(usize::MAX)
        .clamp(2, 64)
            + 1;
        tasks.spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut search_ticker = tokio::time::interval(search_every);
            search_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut tally = Tally {
                rank,
                url: url.clone(),
                answered: false,
                missed_in_a_row: 0,
                last_error: None,
                unresolved: false,
            };
            let mut inflight: FuturesUnordered<Probe> = FuturesUnordered::new();
            let mut searching: FuturesUnordered<Probe> = FuturesUnordered::new();
            let mut inflight_since = Instant::now();
            let start = |timeout: Duration| -> Probe {
                let (http, url) = (http.clone(), url.clone());
                Box::pin(async move { probe(&http, &url, timeout).await })
            };
            loop {
                let evidence = tokio::select! {
                    _ = ticker.tick() => {
                        let miss = if tally.answered {
                            None
                        } else if let Some(e) = tally.last_error.take() {
                            Some(e)
                        } else if !inflight.is_empty() || !searching.is_empty() {
                            Some(format!("no answer for {}ms", inflight_since.elapsed().as_millis()))
                        } else {
                            None
                        };
                        tally.answered = false;
                        // One probe at a time while the peer answers; while
                        // it does not, one more per tick (at most
                        // `max_inflight`): a slow answer still counts.
                        if inflight.is_empty() || (miss.is_some() && inflight.len() < max_inflight) {
                            if inflight.is_empty() {
                                inflight_since = Instant::now();
                            }
                            inflight.push(start(timeout));
                        }
                        match miss {
                            Some(e) => {
                                tally.missed_in_a_row = tally.missed_in_a_row.saturating_add(1);
                                Evidence::Missed(e)
                            }
                            None => {
                                tally.missed_in_a_row = 0;
                                continue;
                            }
                        }
                    }
                    _ = search_ticker.tick(), if tally.missed_in_a_row >= lost_after => {
                        if searching.len() < max_searching {
                            searching.push(start(search_timeout));
                        }
                        continue;
                    }
                    Some(result) = inflight.next(), if !inflight.is_empty() => {
                        if inflight.is_empty() {
                            inflight_since = Instant::now();
                        }
                        match tally.judge(result) {
                            Some(e) => e,
                            None => continue,
                        }
                    }
                    Some(result) = searching.next(), if !searching.is_empty() => {
                        match tally.judge(result) {
                            Some(e) => e,
                            None => continue,
                        }
                    }
                };
                let obs = Observation {
                    rank,
                    source: Source::Heartbeat,
                    evidence,
                    at: Instant::now(),
                };
                if tx.send(obs).await.is_err() {
                    return;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::env;

    /// A fake peer listening on `ip`: `answer` is asked once per accepted
    /// connection for the bytes to send to each request on it (`None`: the
    /// connection stays silent, as one to a dead pod's address does). The
    /// requests' arrival times are recorded.
    async fn fake_peer(
        ip: &str,
        answer: impl Fn() -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> (
        String,
        std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
        tokio::task::JoinHandle<()>,
    ) {
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port().to_string();
        let requests: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = requests.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let reply = answer();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        let Ok(n) = conn.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            if let Ok(mut p) = seen.lock() {
                                p.push(Instant::now());
                            }
                            if let Some(reply) = &reply
                                && conn.write_all(reply).await.is_err()
                            {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (port, requests, server)
    }

    /// A resolver that knows no name (the tests' peers are addresses).
    fn no_names() -> Resolver {
        Resolver::table(Default::default())
    }

    /// The HTTP answer of rank 0's sidecar, pod `uid`.
    fn beat_reply(uid: &str) -> Vec<u8> {
        let body =
            format!(r#"{{"pod":"p-0","uid":"{uid}","start_time":"t","rank":0,"generation":0}}"#);
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Rank 1 of 2 probing rank 0 at `pattern` (which names the fake peer's
    /// address), every 200 ms, lost after 3 misses.
    fn probing(pattern: &str, port: &str, more: &[(&str, &str)]) -> Config {
        let mut vars = vec![
            (env::NNODES, "2"),
            (env::NODE_RANK, "1"),
            (env::PEER_HOSTS, pattern),
            (env::HEALTH_PORT, port),
            (env::HEARTBEAT_INTERVAL, "200ms"),
            (env::HEARTBEAT_MISSES, "3"),
        ];
        vars.extend_from_slice(more);
        Config::from_source(vars.as_slice()).expect("config")
    }

    /// The next observation, within 10 s.
    async fn next(rx: &mut mpsc::Receiver<Observation>) -> Observation {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("an observation within 10 s")
            .expect("the prober runs")
    }

    /// The search period of a lost peer: 50 ms in a small world, longer in
    /// a large one (the survivors together resolve the name about 500 times
    /// a second at most), never longer than a quarter interval, never
    /// shorter than 50 ms, whatever the interval.
    #[test]
    fn a_lost_peer_is_searched_for_often_in_a_small_world_and_less_in_a_large_one() {
        let s = Duration::from_secs(1);
        let ms = Duration::from_millis;
        assert_eq!(search_every(s, 2), ms(50));
        assert_eq!(search_every(s, 25), ms(50));
        assert_eq!(search_every(s, 64), ms(128));
        assert_eq!(search_every(s, 1000), ms(250));
        assert_eq!(search_every(s, u32::MAX), ms(250));
        assert_eq!(search_every(ms(100), 2), ms(50));
        assert_eq!(search_every(ms(1), 1000), ms(50));
        assert_eq!(search_every(Duration::from_secs(10), 1000), ms(2000));
        for nodes in [1, 2, 3, 100, 500, 5000] {
            let every = search_every(s, nodes);
            let world_rate = f64::from(nodes) / every.as_secs_f64();
            assert!(
                world_rate <= 500.0 || every == ms(250),
                "{nodes} nodes searching every {every:?}: {world_rate} lookups/s"
            );
        }
    }

    /// A peer that stops answering is probed once per interval until it
    /// is lost (misses reached), then every search period (here a quarter
    /// interval: 50 ms of a 200 ms interval), so that a replacement
    /// answering at its name is seen soon; misses are still reported once
    /// per interval.
    #[tokio::test]
    async fn a_lost_peer_is_probed_four_times_per_interval() {
        // A peer that answers every probe with 503 (a miss).
        let (port, probes, server) = fake_peer("127.0.0.10", || {
            Some(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_vec())
        })
        .await;
        let interval = Duration::from_millis(200);
        // Rank 0: 127.0.0.10.
        let config = probing("127.0.0.1{i}", &port, &[]);
        let (tx, mut rx) = mpsc::channel(64);
        let prober = tokio::spawn(run(config, no_names(), tx));

        // Wait for the third miss: the peer is lost from here on.
        let mut misses = 0;
        while misses < 3 {
            if matches!(next(&mut rx).await.evidence, Evidence::Missed(_)) {
                misses += 1;
            }
        }
        let lost_at = Instant::now();
        // Five intervals (and up to one more for the last wait): about 25
        // probes at four per interval and one per tick, 12 without the
        // faster probing.
        let mut reported = 0;
        while lost_at.elapsed() < interval * 5 {
            if let Ok(Some(obs)) = tokio::time::timeout(interval, rx.recv()).await
                && matches!(obs.evidence, Evidence::Missed(_))
            {
                reported += 1;
            }
        }
        let probed = probes
            .lock()
            .map(|p| p.iter().filter(|at| **at >= lost_at).count())
            .unwrap_or(0);
        prober.abort();
        server.abort();
        assert!(
            probed >= 18,
            "{probed} probes in 5 to 6 intervals after the peer was lost; expected about 25"
        );
        assert!(
            (3..=7).contains(&reported),
            "{reported} misses reported in 5 intervals; expected one per interval"
        );
    }

    /// The survivors' restart after losing the rendezvous host waits for its
    /// replacement to answer at its name: probes still waiting on the dead
    /// address (here: a peer that takes every request and never answers)
    /// must not keep the first probe that can reach the replacement from
    /// starting. Seen within a small part of the interval of answering.
    #[tokio::test]
    async fn a_replacement_is_seen_although_probes_hang_on_the_old_address() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        // A connection made before the replacement stays silent forever.
        let replaced = Arc::new(AtomicBool::new(false));
        let flag = replaced.clone();
        let (port, _, server) = fake_peer("127.0.0.20", move || {
            flag.load(Ordering::SeqCst).then(|| beat_reply("new"))
        })
        .await;
        // Rank 0: 127.0.0.20; regular probes wait long on the silent address.
        let config = probing("127.0.0.2{i}", &port, &[(env::HEARTBEAT_TIMEOUT, "5s")]);
        let (tx, mut rx) = mpsc::channel(256);
        let prober = tokio::spawn(run(config, no_names(), tx));

        // Lost (three misses), then searched for over ten more intervals:
        // long enough for any limit on probes in flight to be reached.
        for _ in 0..13 {
            let obs = next(&mut rx).await;
            assert!(
                matches!(obs.evidence, Evidence::Missed(_)),
                "a silent peer gave {:?}",
                obs.evidence
            );
        }
        replaced.store(true, Ordering::SeqCst);
        let answering = Instant::now();
        let alive = loop {
            if matches!(next(&mut rx).await.evidence, Evidence::Alive(_)) {
                break answering.elapsed();
            }
        };
        prober.abort();
        server.abort();
        // A probe every 50 ms; the regular probes alone would wait on the
        // silent connections for up to 5 s.
        assert!(
            alive < Duration::from_millis(200),
            "the replacement was seen {alive:?} after it answered; expected within an interval (200 ms)"
        );
    }

    /// The ranks of `nnodes` (and `spares`) that rank `own` probes.
    fn probed(nnodes: &str, spares: &str, own: &str) -> Vec<u32> {
        let config = Config::from_source(
            [
                (env::NNODES, nnodes),
                (env::SPARES, spares),
                (env::NODE_RANK, own),
                (env::PEER_HOSTS, "p-{i}.svc"),
            ]
            .as_slice(),
        )
        .expect("config");
        peer_ranks(&config).collect()
    }

    /// In a fixed world with a spare, every sidecar probes every other pod,
    /// the spare included: rank 0 of nnodes 2 + 1 spare probes 1 and 2 (a
    /// spare that trains after a take-over, or is lost, is seen by all).
    #[test]
    fn a_fixed_world_probes_its_spares() {
        assert_eq!(probed("2", "1", "0"), [1, 2]);
        assert_eq!(probed("2", "1", "1"), [0, 2]);
        assert_eq!(probed("2", "1", "2"), [0, 1]);
        assert_eq!(probed("3", "2", "1"), [0, 2, 3, 4]);
    }

    /// In an elastic world, the spares are the pods above MAX: every
    /// sidecar probes them, and every rank up to MAX.
    #[test]
    fn an_elastic_world_probes_its_spares_above_max() {
        assert_eq!(probed("1:2", "1", "0"), [1, 2]);
        assert_eq!(probed("2:4", "2", "0"), [1, 2, 3, 4, 5]);
        assert_eq!(probed("2:4", "2", "5"), [0, 1, 2, 3, 4]);
    }

    /// Without spares the probed set is the world but this rank, as before.
    #[test]
    fn without_spares_the_probed_set_is_the_world() {
        assert_eq!(probed("2", "0", "0"), [1]);
        assert_eq!(probed("3", "0", "1"), [0, 2]);
        assert_eq!(probed("1:3", "0", "0"), [1, 2]);
        assert_eq!(probed("1", "0", "0"), Vec::<u32>::new());
    }

    #[test]
    fn urls() {
        let c = Config::from_source(
            [
                (env::NNODES, "3"),
                (env::NODE_RANK, "0"),
                (env::PEER_HOSTS, "job-{i}.job.ns.svc"),
                (env::HEALTH_PORT, "29601"),
            ]
            .as_slice(),
        )
        .expect("config");
        assert_eq!(
            url_of(&c, 2).as_deref(),
            Some("http://job-2.job.ns.svc:29601/heartbeat")
        );
    }

    /// A beat says which address answered: the survivors compare it with
    /// what the lost peer's name resolves to before restarting torchrun.
    #[tokio::test]
    async fn an_answer_carries_the_address_it_came_from() {
        let (port, _, server) = fake_peer("127.0.0.30", || Some(beat_reply("u"))).await;
        let config = probing("127.0.0.3{i}", &port, &[]);
        let (tx, mut rx) = mpsc::channel(16);
        let prober = tokio::spawn(run(config, no_names(), tx));
        let obs = next(&mut rx).await;
        prober.abort();
        server.abort();
        match obs.evidence {
            Evidence::Alive(identity) => {
                assert_eq!(identity.uid, "u");
                assert_eq!(identity.address, Some([127, 0, 0, 30].into()));
            }
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn dns_that_does_not_resolve_is_a_miss_not_a_crash() {
        let http = client(Duration::from_millis(500), no_names());
        let r = probe(
            &http,
            "http://no-such-peer-0.invalid:29600/heartbeat",
            Duration::from_secs(3),
        )
        .await;
        let err = r.expect_err("no such name");
        assert!(
            err.contains("name no-such-peer-0.invalid does not resolve"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn refused_is_a_miss() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        drop(l);
        let http = client(Duration::from_millis(500), no_names());
        let r = probe(
            &http,
            &format!("http://127.0.0.1:{port}/heartbeat"),
            Duration::from_millis(500),
        )
        .await;
        assert!(r.is_err());
    }
}
