//! Direct heartbeats between sidecars over plain HTTP, with a bounded
//! fan-out and an indirect confirmation before a silent peer is lost.
//!
//! Every sidecar answers `GET /heartbeat` with its identity; every sidecar
//! probes the `/heartbeat` of the peers it watches ([`peer_ranks`]: its two
//! nearest on each side of the ring of all pods, and the rendezvous host,
//! [`crate::ring::watched`]) once per interval with a short timeout, so its
//! cost does not grow with the world. A peer that was seen healthy is lost
//! after N consecutive misses, or at once when its identity (pod UID, start
//! time) changes. A host name that does not resolve yet is a miss of a peer
//! never seen: retried, not a loss.
//!
//! Before the miss that would lose a peer is reported, up to [`HELPERS`]
//! other sidecars that watch it are asked, in parallel and within one
//! interval, to probe it (`GET /probe/{rank}`, answered by [`Prober`]), as
//! SWIM and memberlist do: the loss stands only if none of them reaches it
//! (or none can be asked). A peer that another sidecar still reaches is
//! not lost: it is reported suspect (a partition between two sidecars).

use std::time::{Duration, Instant};

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::config::Config;
use crate::dns::Resolver;
use crate::peers::{Evidence, Identity, Observation, Source};
use crate::ring;
use crate::status::ResultLabels;

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

pub use crate::peers::url_of;

/// The ranks this sidecar probes: [`ring::watched`] over every pod of the
/// workload (the world's largest size plus the hot spares,
/// [`Config::pods`]): its nearest on each side of the ring, and the
/// rendezvous host when a training pod hosts the store. At most five,
/// whatever the world's size; every pod, spares included, is probed by its
/// nearest on the ring.
pub fn peer_ranks(config: &Config) -> impl Iterator<Item = u32> + use<> {
    ring::watched(config.node_rank, config.pods(), config.rdzv_host_rank).into_iter()
}

/// The most helpers asked to confirm that a silent peer is lost.
pub const HELPERS: usize = 2;

/// The sidecars that `own` asks to probe the silent `lost`: its other
/// watchers ([`ring::watchers`]), the nearest to it on the ring first,
/// at most [`HELPERS`]; never `own` nor `lost`.
pub fn helpers(own: u32, lost: u32, pods: u32, host: Option<u32>) -> Vec<u32> {
    let distance = |h: u32| {
        let d = h.abs_diff(lost);
        d.min(pods.saturating_sub(d))
    };
    let mut out: Vec<u32> = ring::watchers(lost, pods, host)
        .into_iter()
        .filter(|h| *h != own && *h != lost)
        .collect();
    out.sort_by_key(|h| (distance(*h), *h));
    out.truncate(HELPERS);
    out
}

/// What `GET /probe/{rank}` answers: whether the answering sidecar reaches
/// `rank` (one heartbeat probe, within [`indirect_timeout`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    pub rank: u32,
    pub reachable: bool,
    /// The beat's pod when reached, else why not.
    pub detail: String,
}

/// The URL at which `helper` is asked to probe `rank`.
pub fn probe_url_of(config: &Config, helper: u32, rank: u32) -> Option<String> {
    let beat = url_of(config, helper)?;
    let base = beat.strip_suffix("/heartbeat")?;
    Some(format!("{base}/probe/{rank}"))
}

/// The time limit of a helper's probe: the heartbeat timeout, but at most
/// three quarters of an interval, so that its answer reaches the asker,
/// which waits one interval ([`confirm`]).
pub fn indirect_timeout(config: &Config) -> Duration {
    config
        .heartbeat
        .timeout
        .min(config.heartbeat.interval * 3 / 4)
        .max(Duration::from_millis(1))
}

/// What one helper said about a silent peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperAnswer {
    /// It reaches the peer: not a loss.
    Reached(String),
    /// It does not reach the peer either.
    Unreached(String),
    /// It could not be asked, or did not answer within the limit.
    Unasked(String),
}

impl HelperAnswer {
    fn label(&self) -> &'static str {
        match self {
            HelperAnswer::Reached(_) => "reached",
            HelperAnswer::Unreached(_) => "unreached",
            HelperAnswer::Unasked(_) => "unasked",
        }
    }
}

/// The outcome of an indirect confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No helper reaches the peer (or none could be asked): the loss stands.
    Confirmed(String),
    /// Helper `by` reaches the peer: a partition between this sidecar and
    /// it, not a loss.
    Reachable { by: u32, detail: String },
}

/// The verdict of the helpers' answers: confirmed unless one reached the
/// peer; with no helper at all, confirmed.
pub fn verdict(answers: &[(u32, HelperAnswer)]) -> Verdict {
    if let Some((by, HelperAnswer::Reached(d))) = answers
        .iter()
        .find(|(_, a)| matches!(a, HelperAnswer::Reached(_)))
    {
        return Verdict::Reachable {
            by: *by,
            detail: format!("rank {by} reaches it ({d})"),
        };
    }
    if answers.is_empty() {
        return Verdict::Confirmed("no other sidecar watches it to ask".into());
    }
    let said: Vec<String> = answers
        .iter()
        .map(|(h, a)| match a {
            HelperAnswer::Unreached(d) => format!("rank {h} does not reach it either ({d})"),
            HelperAnswer::Unasked(d) => format!("rank {h} could not be asked ({d})"),
            HelperAnswer::Reached(d) => format!("rank {h} reaches it ({d})"),
        })
        .collect();
    Verdict::Confirmed(said.join("; "))
}

/// Counters of what the heartbeats do (the sidecar's metrics; defaults that
/// count into nothing for tests).
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Probes sent.
    pub probes: Counter,
    /// Helpers asked, by their answer.
    pub indirect: Family<ResultLabels, Counter>,
}

/// Asks `helpers` (in parallel, each within one interval) whether they
/// reach `rank`; returns as soon as one does, else once all have answered.
pub async fn confirm(
    http: &HttpClient,
    config: &Config,
    rank: u32,
    helpers: &[u32],
    counters: &Counters,
) -> Verdict {
    let limit = config.heartbeat.interval;
    let mut asked: FuturesUnordered<_> = helpers
        .iter()
        .map(|&h| async move { (h, ask(http, config, h, rank, limit).await) })
        .collect();
    let mut answers = Vec::new();
    while let Some((h, answer)) = asked.next().await {
        counters
            .indirect
            .get_or_create(&ResultLabels {
                result: answer.label().into(),
            })
            .inc();
        let reached = matches!(answer, HelperAnswer::Reached(_));
        answers.push((h, answer));
        if reached {
            break;
        }
    }
    verdict(&answers)
}

/// Asks `helper` to probe `rank`, within `limit`.
async fn ask(
    http: &HttpClient,
    config: &Config,
    helper: u32,
    rank: u32,
    limit: Duration,
) -> HelperAnswer {
    let Some(url) = probe_url_of(config, helper, rank) else {
        return HelperAnswer::Unasked("no peer host pattern".into());
    };
    let work = async {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
        let resp = http.get(uri).await.map_err(|e| describe(&e))?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        let body = Limited::new(resp.into_body(), 64 * 1024)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        serde_json::from_slice::<Reach>(&body).map_err(|e| format!("not a probe answer: {e}"))
    };
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(reach)) if reach.rank == rank && reach.reachable => {
            HelperAnswer::Reached(reach.detail)
        }
        Ok(Ok(reach)) if reach.rank == rank => HelperAnswer::Unreached(reach.detail),
        Ok(Ok(reach)) => HelperAnswer::Unasked(format!(
            "answered about rank {}, not rank {rank}",
            reach.rank
        )),
        Ok(Err(e)) => HelperAnswer::Unasked(e),
        Err(_) => HelperAnswer::Unasked(format!("no answer within {}ms", limit.as_millis())),
    }
}

/// The most `/probe` requests served at once; more are refused (503),
/// which the asker counts as "could not be asked".
const MAX_PROBES_SERVED: usize = 16;

/// Answers `GET /probe/{rank}`: probes a peer once for another sidecar.
#[derive(Clone)]
pub struct Prober {
    config: Config,
    http: HttpClient,
    counters: Counters,
    permits: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("rank", &self.config.node_rank)
            .finish()
    }
}

/// Why a `/probe` request is not answered with a [`Reach`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeRefused {
    #[error("rank {rank} is not a pod of this workload ({pods} pods)")]
    NoSuchRank { rank: u32, pods: u32 },
    #[error("too many probes in flight")]
    Busy,
}

impl Prober {
    /// A prober with its own HTTP client (names looked up by `resolver`).
    pub fn new(config: Config, resolver: Resolver, counters: Counters) -> Self {
        let http = client(indirect_timeout(&config), resolver);
        Prober {
            config,
            http,
            counters,
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_PROBES_SERVED)),
        }
    }

    /// Probes `rank` once, within [`indirect_timeout`].
    pub async fn reach(&self, rank: u32) -> Result<Reach, ProbeRefused> {
        let pods = self.config.pods();
        if rank >= pods {
            return Err(ProbeRefused::NoSuchRank { rank, pods });
        }
        if rank == self.config.node_rank {
            return Ok(Reach {
                rank,
                reachable: true,
                detail: format!("rank {rank} is the answering sidecar"),
            });
        }
        let Ok(_permit) = self.permits.clone().try_acquire_owned() else {
            return Err(ProbeRefused::Busy);
        };
        let Some(url) = url_of(&self.config, rank) else {
            return Ok(Reach {
                rank,
                reachable: false,
                detail: "no peer host pattern".into(),
            });
        };
        self.counters.probes.inc();
        Ok(
            match probe(&self.http, &url, indirect_timeout(&self.config)).await {
                Ok(Answer { beat, .. }) if beat.rank == rank => Reach {
                    rank,
                    reachable: true,
                    detail: format!("pod {}", beat.pod),
                },
                Ok(Answer { beat, .. }) => Reach {
                    rank,
                    reachable: false,
                    detail: format!("{url} answered as rank {}", beat.rank),
                },
                Err(e) => Reach {
                    rank,
                    reachable: false,
                    detail: e,
                },
            },
        )
    }
}

/// The client heartbeats, helpers' probes and indirect requests use.
pub type HttpClient = Client<HttpConnector<Resolver>, Empty<Bytes>>;

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

/// While a peer misses beats (half of `misses` in a row, [`searched_from`]),
/// and once it is lost, it is also searched for: probes on new connections,
/// so that a peer back from a blip answers within a search period (not
/// after TCP's retransmission of a probe lost in the blip: a blip shorter
/// than the loss window costs nothing), and a replacement answering at its
/// name is seen soon after the name leads to it (the rendezvous host's
/// replacement is what the survivors' restart waits for). Misses are still
/// counted once per interval.
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

/// The misses in a row from which a silent peer is searched for: half of
/// those that lose it (2 of 4 at the defaults), at least one.
fn searched_from(misses: u32) -> u32 {
    (misses / 2).max(1)
}

/// The shortest time between two searches of a lost peer.
const MIN_SEARCH_EVERY: Duration = Duration::from_millis(50);
/// The search period per node of the world (see [`search_every`]).
const SEARCH_EVERY_PER_NODE: Duration = Duration::from_millis(2);

/// An indirect confirmation in progress.
type Confirming = std::pin::Pin<Box<dyn std::future::Future<Output = Verdict> + Send>>;

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

/// The last miss before a loss, with what the helpers said: confirmed, it
/// counts (the peer is lost); reached by a helper, a partition between this
/// pod and the peer, reported suspect.
fn judged(
    verdict: Verdict,
    held: String,
    tally: &mut Tally,
    lost_after: u32,
    rank: u32,
) -> Evidence {
    match verdict {
        Verdict::Confirmed(why) => {
            tally.missed_in_a_row = tally.missed_in_a_row.saturating_add(1);
            Evidence::Missed(format!("{held}; {why}"))
        }
        Verdict::Reachable { by, detail } => {
            tracing::info!(
                rank,
                helper = by,
                "the peer misses beats here but another sidecar reaches it: a partition, not a loss"
            );
            Evidence::Suspect(format!(
                "{lost_after} heartbeats missed (last: {held}), but {detail}: a partition between this pod and rank {rank}, not a loss"
            ))
        }
    }
}

/// Probes every watched peer ([`peer_ranks`]) forever, sending observations to `tx`; returns when
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
/// Once the peer has missed half the beats that lose it, and while it is
/// lost, it is also searched for: a probe every
/// [`search_every`] (50 ms in a small world, at most a quarter interval),
/// each given one interval, in a set of its own. A probe stuck on the dead
/// address ends within the interval, so these never pile up to a limit, and
/// a replacement that answers at the name (a new address behind it) is seen
/// within one search period of answering, however long the regular probes
/// still wait on the old address.
///
/// The miss that would lose the peer is held back while up to [`HELPERS`]
/// of its other watchers are asked to probe it ([`confirm`], in parallel,
/// within one interval): reported if none reaches it, replaced by a
/// `Suspect` observation (a partition, not a loss) if one does, and asked
/// again at the next tick that brings a miss.
pub async fn run(config: Config, resolver: Resolver, tx: mpsc::Sender<Observation>) {
    run_counted(config, resolver, tx, Counters::default()).await
}

/// [`run`], counting into `counters`.
pub async fn run_counted(
    config: Config,
    resolver: Resolver,
    tx: mpsc::Sender<Observation>,
    counters: Counters,
) {
    let timeout = config.heartbeat.timeout;
    let http = client(timeout, resolver);
    let config = Arc::new(config);
    let mut tasks = tokio::task::JoinSet::new();
    for rank in peer_ranks(&config) {
        let helpers = helpers(config.node_rank, rank, config.pods(), config.rdzv_host_rank);
        let counters = counters.clone();
        let config = config.clone();
        let Some(url) = url_of(&config, rank) else {
            tracing::warn!("no peer host pattern: heartbeats disabled");
            return;
        };
        let http = http.clone();
        let tx = tx.clone();
        let interval = config.heartbeat.interval;
        let max_inflight = max_inflight(interval, timeout);
        let lost_after = config.heartbeat.misses.max(1);
        let search_from = searched_from(lost_after);
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
                counters.probes.inc();
                Box::pin(async move { probe(&http, &url, timeout).await })
            };
            // The indirect confirmation in progress (started one miss
            // before the one that would lose the peer, so that its answer is
            // there when that miss comes), its verdict if it came first, and
            // the miss it holds (when the last miss came first).
            let mut confirming: Option<Confirming> = None;
            let mut early: Option<Verdict> = None;
            let mut held: Option<String> = None;
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
                        let ask = || {
                            let (http, config, helpers, counters) =
                                (http.clone(), config.clone(), helpers.clone(), counters.clone());
                            Box::pin(async move {
                                confirm(&http, &config, rank, &helpers, &counters).await
                            }) as Confirming
                        };
                        match miss {
                            Some(e) if tally.missed_in_a_row.saturating_add(1) == lost_after => {
                                // This miss would lose the peer: what the
                                // others say decides (asked now if not yet).
                                match early.take() {
                                    Some(verdict) => judged(verdict, e, &mut tally, lost_after, rank),
                                    None => {
                                        if confirming.is_none() {
                                            confirming = Some(ask());
                                        }
                                        held = Some(e);
                                        continue;
                                    }
                                }
                            }
                            Some(e) => {
                                tally.missed_in_a_row = tally.missed_in_a_row.saturating_add(1);
                                // One miss before the last: ask the others now.
                                if tally.missed_in_a_row.saturating_add(1) == lost_after
                                    && confirming.is_none()
                                    && early.is_none()
                                {
                                    confirming = Some(ask());
                                }
                                Evidence::Missed(e)
                            }
                            None => {
                                tally.missed_in_a_row = 0;
                                continue;
                            }
                        }
                    }
                    _ = search_ticker.tick(), if tally.missed_in_a_row >= search_from => {
                        if searching.len() < max_searching {
                            searching.push(start(search_timeout));
                        }
                        continue;
                    }
                    verdict = async {
                        match confirming.as_mut() {
                            Some(c) => c.await,
                            None => std::future::pending().await,
                        }
                    }, if confirming.is_some() => {
                        confirming = None;
                        match held.take() {
                            Some(e) => judged(verdict, e, &mut tally, lost_after, rank),
                            None => {
                                // Before the last miss: kept for it.
                                early = Some(verdict);
                                continue;
                            }
                        }
                    }
                    Some(result) = inflight.next(), if !inflight.is_empty() => {
                        if inflight.is_empty() {
                            inflight_since = Instant::now();
                        }
                        match tally.judge(result) {
                            Some(e) => {
                                // It answers: nothing to confirm.
                                (confirming, early, held) = (None, None, None);
                                e
                            }
                            None => continue,
                        }
                    }
                    Some(result) = searching.next(), if !searching.is_empty() => {
                        match tally.judge(result) {
                            Some(e) => {
                                (confirming, early, held) = (None, None, None);
                                e
                            }
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
        fake_peer_at(ip, 0, answer).await
    }

    /// [`fake_peer`] on `port` (0: any).
    async fn fake_peer_at(
        ip: &str,
        port: u16,
        answer: impl Fn() -> Option<Vec<u8>> + Send + Sync + 'static,
    ) -> (
        String,
        std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
        tokio::task::JoinHandle<()>,
    ) {
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind((ip, port))
            .await
            .expect("bind");
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
    fn a_silent_peer_is_searched_for_from_half_its_misses() {
        assert_eq!(searched_from(4), 2);
        assert_eq!(searched_from(3), 1);
        assert_eq!(searched_from(1), 1);
    }

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

    /// In a fixed world with a spare, the spares sit on the ring with the
    /// others: rank 0 of nnodes 2 + 1 spare probes 1 and 2 (a spare that
    /// trains after a take-over, or is lost, is seen by its neighbours).
    #[test]
    fn a_fixed_world_probes_its_spares() {
        assert_eq!(probed("2", "1", "0"), [1, 2]);
        assert_eq!(probed("2", "1", "1"), [0, 2]);
        assert_eq!(probed("2", "1", "2"), [0, 1]);
        assert_eq!(probed("3", "2", "1"), [0, 2]);
    }

    /// In an elastic world, the spares are the pods above MAX: they sit on
    /// the ring with the others and are probed by their nearest.
    #[test]
    fn an_elastic_world_probes_its_spares_above_max() {
        assert_eq!(probed("1:2", "1", "0"), [1, 2]);
        // 6 pods: rank 0 (the host) probes its nearest on each side.
        assert_eq!(probed("2:4", "2", "0"), [1, 5]);
        // The spare 5 probes 4 and 0 (its neighbours; 0 is also the host).
        assert_eq!(probed("2:4", "2", "5"), [0, 4]);
    }

    /// The probed set is bounded whatever the world's size: the nearest on
    /// each side and the rendezvous host; with a dedicated store
    /// (`TRAINWIRE_RDZV_HOST_RANK=none`), no host.
    #[test]
    fn the_probed_set_is_bounded() {
        assert_eq!(probed("128", "0", "64"), [0, 63, 65]);
        assert_eq!(probed("1024", "0", "0"), [1, 1023]);
        assert_eq!(probed("1024", "4", "1027"), [0, 1026]);
        let config = Config::from_source(
            [
                (env::NNODES, "1024"),
                (env::NODE_RANK, "500"),
                (env::RDZV_HOST_RANK, "none"),
                (env::PEER_HOSTS, "p-{i}.svc"),
            ]
            .as_slice(),
        )
        .expect("config");
        assert_eq!(peer_ranks(&config).collect::<Vec<_>>(), [499, 501]);
        for n in [2u32, 3, 8, 128, 1024, 8192] {
            for own in [0, 1, n / 2, n - 1] {
                let c = Config::from_source(
                    [
                        (env::NNODES, n.to_string().as_str()),
                        (env::NODE_RANK, own.to_string().as_str()),
                        (env::PEER_HOSTS, "p-{i}.svc"),
                    ]
                    .as_slice(),
                )
                .expect("config");
                let probed: Vec<u32> = peer_ranks(&c).collect();
                assert!(probed.len() <= 3, "{n}/{own}: {probed:?}");
                assert!(!probed.contains(&own));
                if own != 0 {
                    assert!(probed.contains(&0), "the host: {n}/{own}: {probed:?}");
                }
            }
        }
    }

    /// Helpers are the silent peer's other watchers, nearest to it first,
    /// at most two, never the asker or the peer itself.
    #[test]
    fn helpers_are_the_lost_peers_other_watchers() {
        assert_eq!(helpers(10, 11, 128, Some(0)), [12]);
        assert_eq!(helpers(9, 11, 128, Some(0)), [10, 12]);
        // The host is watched by everyone: its nearest on the ring help.
        assert_eq!(helpers(5, 0, 128, Some(0)), [1, 127]);
        assert_eq!(helpers(1, 0, 128, Some(0)), [127, 2]);
        // Small worlds: whoever is left.
        assert_eq!(helpers(1, 0, 3, Some(0)), [2]);
        assert_eq!(helpers(1, 0, 2, Some(0)), Vec::<u32>::new());
        for lost in [0u32, 1, 63, 127] {
            for own in ring::watchers(lost, 128, Some(0)) {
                let h = helpers(own, lost, 128, Some(0));
                assert!(h.len() <= HELPERS);
                assert!(!h.contains(&own) && !h.contains(&lost));
                assert!(
                    h.iter()
                        .all(|x| ring::watched(*x, 128, Some(0)).contains(&lost))
                );
            }
        }
    }

    #[test]
    fn the_verdict_of_the_helpers() {
        let un = |d: &str| HelperAnswer::Unreached(d.into());
        let unasked = |d: &str| HelperAnswer::Unasked(d.into());
        let reached = |d: &str| HelperAnswer::Reached(d.into());
        // Confirmed when every helper fails to reach it.
        assert!(matches!(
            verdict(&[(2, un("timeout")), (3, un("refused"))]),
            Verdict::Confirmed(_)
        ));
        // Not confirmed when one reaches it.
        assert_eq!(
            verdict(&[(2, un("timeout")), (3, reached("pod p-0"))]),
            Verdict::Reachable {
                by: 3,
                detail: "rank 3 reaches it (pod p-0)".into()
            }
        );
        // Confirmed when no helper can be asked, or there is none.
        assert!(matches!(
            verdict(&[(2, unasked("refused")), (3, unasked("no answer"))]),
            Verdict::Confirmed(_)
        ));
        assert!(matches!(verdict(&[]), Verdict::Confirmed(_)));
    }

    /// The HTTP answer of a helper asked about rank `rank` (the connection
    /// is closed after it: the next request gets the fake's answer anew).
    fn reach_reply(rank: u32, reachable: bool) -> Vec<u8> {
        let body = format!(r#"{{"rank":{rank},"reachable":{reachable},"detail":"d"}}"#);
        format!(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    /// Rank 1 of 4 at `127.0.0.<net>{i}` (200 ms interval, 3 misses), port `port`.
    fn four(net: &str, port: u16) -> Config {
        let pattern = format!("127.0.0.{net}{{i}}");
        let port = port.to_string();
        Config::from_source(
            [
                (env::NNODES, "4"),
                (env::NODE_RANK, "1"),
                (env::PEER_HOSTS, pattern.as_str()),
                (env::HEALTH_PORT, port.as_str()),
                (env::HEARTBEAT_INTERVAL, "200ms"),
                (env::HEARTBEAT_MISSES, "3"),
            ]
            .as_slice(),
        )
        .expect("config")
    }

    /// Indirect confirmation against helpers over real sockets: confirmed
    /// when all fail to reach the peer, not when one reaches it, confirmed
    /// when none can be asked; within one interval.
    #[tokio::test]
    async fn indirect_confirmation_asks_the_helpers() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let counters = Counters::default();
        // Helpers 2 and 3 at 127.0.0.52/53, on one port.
        let (port, _, h2) = fake_peer("127.0.0.52", || Some(reach_reply(0, false))).await;
        let port: u16 = port.parse().expect("port");
        let reaches = Arc::new(AtomicBool::new(false));
        let flag = reaches.clone();
        let (_, _, h3) = fake_peer_at("127.0.0.53", port, move || {
            Some(reach_reply(0, flag.load(Ordering::SeqCst)))
        })
        .await;
        let config = four("5", port);
        let http = client(config.heartbeat.timeout, no_names());
        let started = Instant::now();
        let v = confirm(&http, &config, 0, &[2, 3], &counters).await;
        assert!(matches!(v, Verdict::Confirmed(_)), "{v:?}");
        // Helper 3 now reaches it.
        reaches.store(true, Ordering::SeqCst);
        let v = confirm(&http, &config, 0, &[2, 3], &counters).await;
        assert!(matches!(v, Verdict::Reachable { by: 3, .. }), "{v:?}");
        h2.abort();
        h3.abort();
        // Nobody listens at 127.0.0.82/83: no helper can be asked.
        let config = four("8", port);
        let v = confirm(&http, &config, 0, &[2, 3], &counters).await;
        assert!(matches!(v, Verdict::Confirmed(_)), "{v:?}");
        let v = confirm(&http, &config, 0, &[], &counters).await;
        assert!(matches!(v, Verdict::Confirmed(_)), "{v:?}");
        assert!(started.elapsed() < Duration::from_secs(4));
        let reached = counters
            .indirect
            .get_or_create(&ResultLabels {
                result: "reached".into(),
            })
            .get();
        assert_eq!(reached, 1);
    }

    /// A helper that does not answer is waited for one interval at most.
    #[tokio::test]
    async fn a_silent_helper_is_waited_for_one_interval() {
        let (port, _, h2) = fake_peer("127.0.0.62", || None).await;
        let config = four("6", port.parse().expect("port"));
        let http = client(config.heartbeat.timeout, no_names());
        let started = Instant::now();
        let v = confirm(&http, &config, 0, &[2], &Counters::default()).await;
        let took = started.elapsed();
        h2.abort();
        assert!(matches!(v, Verdict::Confirmed(_)), "{v:?}");
        assert!(
            took >= Duration::from_millis(190) && took < Duration::from_millis(600),
            "{took:?}"
        );
    }

    /// Rank 1 of 4 stops hearing rank 0 while rank 2 (a helper) still
    /// reaches it: rank 0 is reported suspect (a partition), never lost;
    /// when rank 2 no longer reaches it either, the loss is reported, within
    /// the heartbeat budget plus one interval.
    #[tokio::test]
    async fn a_peer_another_sidecar_reaches_is_suspect_not_lost() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let (port, _, p0) = fake_peer("127.0.0.70", || {
            Some(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_vec())
        })
        .await;
        let reaches = Arc::new(AtomicBool::new(true));
        let flag = reaches.clone();
        let (_, _, p2) = fake_peer_at("127.0.0.72", port.parse().expect("port"), move || {
            Some(reach_reply(0, flag.load(Ordering::SeqCst)))
        })
        .await;
        let config = four("7", port.parse().expect("port"));
        let (tx, mut rx) = mpsc::channel(256);
        let prober = tokio::spawn(run(config, no_names(), tx));
        // Two misses, then suspect (a helper reaches it), for eight intervals.
        let mut misses = 0;
        let mut suspects = 0;
        let watch = Instant::now();
        while watch.elapsed() < Duration::from_millis(200 * 8) {
            let obs = next(&mut rx).await;
            if obs.rank != 0 {
                continue;
            }
            match obs.evidence {
                Evidence::Missed(_) => misses += 1,
                Evidence::Suspect(d) => {
                    assert!(d.contains("rank 2 reaches it"), "{d}");
                    suspects += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(misses, 2, "two misses, then the third is held back");
        assert!(suspects >= 3, "{suspects} suspect reports");
        // Rank 2 no longer reaches it: the held miss is reported.
        reaches.store(false, Ordering::SeqCst);
        let cut = Instant::now();
        let detail = loop {
            let obs = next(&mut rx).await;
            if obs.rank == 0
                && let Evidence::Missed(d) = obs.evidence
            {
                break d;
            }
        };
        let took = cut.elapsed();
        prober.abort();
        p0.abort();
        p2.abort();
        assert!(
            detail.contains("rank 2 does not reach it either"),
            "{detail}"
        );
        assert!(took < Duration::from_millis(600), "{took:?}");
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
