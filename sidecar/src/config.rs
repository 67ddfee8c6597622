//! The typed configuration, parsed from the `TRAINWIRE_*` environment.
//!
//! Parsing goes through [`Source`], a small trait over "where the strings
//! come from", so tests feed a map instead of touching the process
//! environment (the pattern of linkerd2-proxy's `env.rs`).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use crate::env;

/// Where configuration strings come from.
pub trait Source {
    /// The value of `key`, if set. An empty value counts as unset.
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Source for ProcessEnv {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().filter(|v| !v.trim().is_empty())
    }
}

impl Source for HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        HashMap::get(self, key)
            .cloned()
            .filter(|v| !v.trim().is_empty())
    }
}

impl Source for BTreeMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        BTreeMap::get(self, key)
            .cloned()
            .filter(|v| !v.trim().is_empty())
    }
}

impl Source for [(&str, &str)] {
    fn get(&self, key: &str) -> Option<String> {
        self.iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| (*v).to_string())
            .filter(|v| !v.trim().is_empty())
    }
}

/// A configuration error, naming the variable, the value and the accepted forms.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A variable holds a value that cannot be used.
    #[error("{var}={value:?} is invalid: {reason} (accepted: {accepted})")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
        accepted: &'static str,
    },
    /// A variable that is needed is not set.
    #[error("{var} is not set: {why}")]
    Missing {
        var: &'static str,
        why: &'static str,
    },
}

type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// How many nodes the world has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCount {
    /// A fixed-size world.
    Fixed(u32),
    /// An elastic world, `MIN:MAX`.
    Elastic { min: u32, max: u32 },
}

impl NodeCount {
    /// The largest number of nodes: the ranks to probe are `0..max()`.
    pub fn max(self) -> u32 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { max, .. } => max,
        }
    }
    /// The number of nodes that must exist; ranks at or above it may be absent.
    pub fn min(self) -> u32 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { min, .. } => min,
        }
    }
}

impl std::fmt::Display for NodeCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeCount::Fixed(n) => write!(f, "{n}"),
            NodeCount::Elastic { min, max } => write!(f, "{min}:{max}"),
        }
    }
}

/// What to do when a peer is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnPeerLoss {
    /// Lost rendezvous host: SIGKILL agent and workers. Other peer: report only.
    Auto,
    /// SIGTERM the agent's workers.
    RestartWorkers,
    /// SIGKILL the agent and its workers.
    RestartAgent,
    /// Report only.
    None,
}

impl OnPeerLoss {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "auto, restart-workers, restart-agent, none";

    /// The spelling used in env, logs and `/status`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnPeerLoss::Auto => "auto",
            OnPeerLoss::RestartWorkers => "restart-workers",
            OnPeerLoss::RestartAgent => "restart-agent",
            OnPeerLoss::None => "none",
        }
    }
}

/// Which peer-health sources run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Detection {
    /// The Kubernetes watch if the service account may list and watch pods, else heartbeats.
    Auto,
    /// Only the Kubernetes watch.
    Kubernetes,
    /// Only heartbeats.
    Heartbeat,
    /// Both; the first to see a loss wins.
    Both,
}

impl Detection {
    /// The accepted spellings.
    pub const ACCEPTED: &'static str = "auto, kubernetes, heartbeat, both";
}

/// Whether the checkpoint watcher polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PollMode {
    /// inotify, unless the directory is on a network or FUSE filesystem.
    Auto,
    /// Always poll.
    Always,
    /// Always inotify.
    Never,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable text.
    Text,
    /// One JSON object per line.
    Json,
}

/// Heartbeat settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatConfig {
    /// Peer host pattern with `{i}` for the rank; `None` when not configured.
    pub peer_hosts: Option<String>,
    /// Probe period.
    pub interval: Duration,
    /// Consecutive misses after which a peer is lost.
    pub misses: u32,
    /// Time limit of one probe.
    pub timeout: Duration,
}

impl HeartbeatConfig {
    /// The host name of the peer with rank `rank`.
    pub fn host_of(&self, rank: u32) -> Option<String> {
        self.peer_hosts
            .as_ref()
            .map(|p| p.replace("{i}", &rank.to_string()))
    }
}

/// Checkpoint-freshness settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The directory the trainer writes checkpoints to.
    pub dir: PathBuf,
    /// Age past which the newest checkpoint is stale.
    pub max_age: Duration,
    /// inotify or polling.
    pub poll: PollMode,
    /// Rescan period when polling.
    pub poll_interval: Duration,
    /// Quiet time after which a checkpoint counts as complete.
    pub settle: Duration,
}

/// Restart-storm limits on actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionLimits {
    /// Least time between two actions.
    pub cooldown: Duration,
    /// Most actions within `window`.
    pub max_actions: u32,
    /// Window `max_actions` counts over.
    pub window: Duration,
}

/// The sidecar's whole configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub pod_name: String,
    pub namespace: String,
    pub pod_uid: String,
    pub node_rank: u32,
    pub nnodes: NodeCount,
    pub selector: Option<String>,
    /// Rank of the pod that runs the c10d store; `None` when the store is
    /// outside the world (etcd-v2).
    pub rdzv_host_rank: Option<u32>,
    pub health_port: u16,
    pub bind_address: IpAddr,
    pub checkpoint: Option<CheckpointConfig>,
    pub on_peer_loss: OnPeerLoss,
    pub detection: Detection,
    pub heartbeat: HeartbeatConfig,
    pub not_ready_grace: Duration,
    pub limits: ActionLimits,
    /// Substrings that identify the agent's command line; empty means the
    /// built-in torchrun matcher.
    pub agent_match: Vec<String>,
    pub log_format: LogFormat,
}

/// Defaults, documented in `docs/sidecar.md`.
pub mod defaults {
    use std::time::Duration;
    pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
    pub const HEARTBEAT_MISSES: u32 = 3;
    pub const NOT_READY_GRACE: Duration = Duration::from_secs(10);
    pub const ACTION_COOLDOWN: Duration = Duration::from_secs(30);
    pub const MAX_ACTIONS: u32 = 3;
    pub const ACTION_WINDOW: Duration = Duration::from_secs(600);
    pub const CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(30 * 60);
    pub const CHECKPOINT_SETTLE: Duration = Duration::from_secs(5);
    pub const CHECKPOINT_POLL_INTERVAL: Duration = Duration::from_secs(10);
    pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";
}

const DURATION_FORMS: &str =
    "a number with a unit: 500ms, 1s, 1.5s, 30m, 2h, 1m30s (a bare number is seconds)";

/// Parses `500ms`, `1s`, `1.5s`, `30m`, `2h`, `1h30m`, `1d`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(secs) = text.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * factor;
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total))
}

/// Formats a duration the way [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        "0s".into()
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn duration<S: Source + ?Sized>(src: &S, var: &'static str, default: Duration) -> Result<Duration> {
    match src.get(var) {
        None => Ok(default),
        Some(v) => parse_duration(&v).ok_or_else(|| ConfigError::Invalid {
            var,
            value: v.clone(),
            reason: "not a duration".into(),
            accepted: DURATION_FORMS,
        }),
    }
}

fn positive_duration<S: Source + ?Sized>(
    src: &S,
    var: &'static str,
    default: Duration,
) -> Result<Duration> {
    let d = duration(src, var, default)?;
    if d.is_zero() {
        return Err(ConfigError::Invalid {
            var,
            value: src.get(var).unwrap_or_default(),
            reason: "must be more than zero".into(),
            accepted: DURATION_FORMS,
        });
    }
    Ok(d)
}

fn number<S: Source + ?Sized, T: std::str::FromStr>(
    src: &S,
    var: &'static str,
    accepted: &'static str,
) -> Result<Option<T>> {
    match src.get(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| ConfigError::Invalid {
                var,
                value: v.clone(),
                reason: "not a number in range".into(),
                accepted,
            }),
    }
}

fn boolish(var: &'static str, value: &str) -> Result<PollMode> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "always" => Ok(PollMode::Always),
        "false" | "0" | "no" | "off" | "never" => Ok(PollMode::Never),
        "auto" => Ok(PollMode::Auto),
        _ => Err(ConfigError::Invalid {
            var,
            value: value.into(),
            reason: "not a boolean".into(),
            accepted: "true (always poll), false (never poll), auto (poll on nfs/cifs/fuse)",
        }),
    }
}

/// Parses `N` or `MIN:MAX`.
pub fn parse_nnodes(value: &str) -> Result<NodeCount> {
    let bad = |reason: &str| ConfigError::Invalid {
        var: env::NNODES,
        value: value.into(),
        reason: reason.into(),
        accepted: "N (a positive number) or MIN:MAX with 1 <= MIN <= MAX",
    };
    let v = value.trim();
    if let Some((min, max)) = v.split_once(':') {
        let min: u32 = min.trim().parse().map_err(|_| bad("MIN is not a number"))?;
        let max: u32 = max.trim().parse().map_err(|_| bad("MAX is not a number"))?;
        if min == 0 || min > max {
            return Err(bad("MIN must be at least 1 and at most MAX"));
        }
        Ok(NodeCount::Elastic { min, max })
    } else {
        let n: u32 = v.parse().map_err(|_| bad("not a number"))?;
        if n == 0 {
            return Err(bad("must be at least 1"));
        }
        Ok(NodeCount::Fixed(n))
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_source(&ProcessEnv)
    }

    /// Reads the configuration from any [`Source`].
    pub fn from_source<S: Source + ?Sized>(src: &S) -> Result<Self> {
        let pod_name = src
            .get(env::POD_NAME)
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".into());
        let namespace = src
            .get(env::POD_NAMESPACE)
            .or_else(|| {
                std::fs::read_to_string(defaults::NAMESPACE_FILE)
                    .ok()
                    .map(|s| s.trim().to_string())
            })
            .unwrap_or_else(|| "default".into());
        let pod_uid = src.get(env::POD_UID).unwrap_or_default();

        let nnodes = match src.get(env::NNODES) {
            Some(v) => parse_nnodes(&v)?,
            None => {
                return Err(ConfigError::Missing {
                    var: env::NNODES,
                    why: "the sidecar must know how many peers to watch (N or MIN:MAX)",
                });
            }
        };
        let node_rank: u32 = number(src, env::NODE_RANK, "a rank from 0 to NNODES-1")?.ok_or(
            ConfigError::Missing {
                var: env::NODE_RANK,
                why: "the sidecar must know its own rank to skip itself",
            },
        )?;
        if node_rank >= nnodes.max() {
            return Err(ConfigError::Invalid {
                var: env::NODE_RANK,
                value: node_rank.to_string(),
                reason: format!("must be below the node count {nnodes}"),
                accepted: "a rank from 0 to NNODES-1",
            });
        }
        // `none`: the rendezvous store runs outside the world (etcd-v2), so
        // losing any peer leaves the local agent able to recover by itself.
        let rdzv_host_rank: Option<u32> = match src.get(env::RDZV_HOST_RANK).as_deref() {
            Some("none") => None,
            _ => Some(
                number(
                    src,
                    env::RDZV_HOST_RANK,
                    "a rank from 0 to NNODES-1, or none",
                )?
                .unwrap_or(0),
            ),
        };
        if let Some(rank) = rdzv_host_rank
            && rank >= nnodes.max()
        {
            return Err(ConfigError::Invalid {
                var: env::RDZV_HOST_RANK,
                value: rank.to_string(),
                reason: format!("must be below the node count {nnodes}"),
                accepted: "a rank from 0 to NNODES-1, or none",
            });
        }
        let selector = src.get(env::SELECTOR);
        let peer_hosts = src.get(env::PEER_HOSTS);
        if let Some(p) = &peer_hosts
            && !p.contains("{i}")
        {
            return Err(ConfigError::Invalid {
                var: env::PEER_HOSTS,
                value: p.clone(),
                reason: "has no {i} placeholder for the rank".into(),
                accepted: "a host pattern such as <name>-{i}.<service>.<namespace>.svc",
            });
        }
        let health_port: u16 = number(src, env::HEALTH_PORT, "a TCP port from 1 to 65535")?
            .unwrap_or(env::DEFAULT_HEALTH_PORT);
        if health_port == 0 {
            return Err(ConfigError::Invalid {
                var: env::HEALTH_PORT,
                value: "0".into(),
                reason: "port 0 cannot be probed by peers".into(),
                accepted: "a TCP port from 1 to 65535",
            });
        }
        let bind_address: IpAddr = number(src, env::BIND_ADDRESS, "an IPv4 or IPv6 address")?
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));

        let checkpoint = match src.get(env::CHECKPOINT_DIR) {
            None => None,
            Some(dir) => Some(CheckpointConfig {
                dir: PathBuf::from(dir),
                max_age: positive_duration(
                    src,
                    env::CHECKPOINT_MAX_AGE,
                    defaults::CHECKPOINT_MAX_AGE,
                )?,
                poll: match src.get(env::CHECKPOINT_POLL) {
                    None => PollMode::Auto,
                    Some(v) => boolish(env::CHECKPOINT_POLL, &v)?,
                },
                poll_interval: positive_duration(
                    src,
                    env::CHECKPOINT_POLL_INTERVAL,
                    defaults::CHECKPOINT_POLL_INTERVAL,
                )?,
                settle: duration(src, env::CHECKPOINT_SETTLE, defaults::CHECKPOINT_SETTLE)?,
            }),
        };

        let on_peer_loss = match src.get(env::ON_PEER_LOSS) {
            None => OnPeerLoss::Auto,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "auto" => OnPeerLoss::Auto,
                "restart-workers" => OnPeerLoss::RestartWorkers,
                "restart-agent" => OnPeerLoss::RestartAgent,
                "none" => OnPeerLoss::None,
                _ => {
                    return Err(ConfigError::Invalid {
                        var: env::ON_PEER_LOSS,
                        value: v,
                        reason: "unknown action".into(),
                        accepted: OnPeerLoss::ACCEPTED,
                    });
                }
            },
        };
        let detection = match src.get(env::DETECTION) {
            None => Detection::Auto,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "auto" => Detection::Auto,
                "kubernetes" | "k8s" => Detection::Kubernetes,
                "heartbeat" | "heartbeats" => Detection::Heartbeat,
                "both" => Detection::Both,
                _ => {
                    return Err(ConfigError::Invalid {
                        var: env::DETECTION,
                        value: v,
                        reason: "unknown detection mode".into(),
                        accepted: Detection::ACCEPTED,
                    });
                }
            },
        };
        if matches!(detection, Detection::Heartbeat | Detection::Both) && peer_hosts.is_none() {
            return Err(ConfigError::Missing {
                var: env::PEER_HOSTS,
                why: "heartbeat detection needs the peers' host pattern",
            });
        }
        if matches!(detection, Detection::Kubernetes | Detection::Both) && selector.is_none() {
            return Err(ConfigError::Missing {
                var: env::SELECTOR,
                why: "Kubernetes detection needs the label selector of the workload's pods",
            });
        }

        let interval =
            positive_duration(src, env::HEARTBEAT_INTERVAL, defaults::HEARTBEAT_INTERVAL)?;
        let misses: u32 = number(src, env::HEARTBEAT_MISSES, "a whole number from 1")?
            .unwrap_or(defaults::HEARTBEAT_MISSES);
        if misses == 0 {
            return Err(ConfigError::Invalid {
                var: env::HEARTBEAT_MISSES,
                value: "0".into(),
                reason: "a peer needs at least one missed beat to be lost".into(),
                accepted: "a whole number from 1",
            });
        }
        let default_timeout = (interval / 2).max(Duration::from_millis(50));
        let timeout = positive_duration(src, env::HEARTBEAT_TIMEOUT, default_timeout)?;

        let max_actions: u32 =
            number(src, env::MAX_ACTIONS, "a whole number (0 disables actions)")?
                .unwrap_or(defaults::MAX_ACTIONS);
        let limits = ActionLimits {
            cooldown: duration(src, env::ACTION_COOLDOWN, defaults::ACTION_COOLDOWN)?,
            max_actions,
            window: positive_duration(src, env::ACTION_WINDOW, defaults::ACTION_WINDOW)?,
        };
        let agent_match = src
            .get(env::AGENT_MATCH)
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let log_format = match src.get(env::LOG_FORMAT) {
            None => LogFormat::Text,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "text" | "plain" => LogFormat::Text,
                "json" => LogFormat::Json,
                _ => {
                    return Err(ConfigError::Invalid {
                        var: env::LOG_FORMAT,
                        value: v,
                        reason: "unknown log format".into(),
                        accepted: "text, json",
                    });
                }
            },
        };

        Ok(Config {
            pod_name,
            namespace,
            pod_uid,
            node_rank,
            nnodes,
            selector,
            rdzv_host_rank,
            health_port,
            bind_address,
            checkpoint,
            on_peer_loss,
            detection,
            heartbeat: HeartbeatConfig {
                peer_hosts,
                interval,
                misses,
                timeout,
            },
            not_ready_grace: duration(src, env::NOT_READY_GRACE, defaults::NOT_READY_GRACE)?,
            limits,
            agent_match,
            log_format,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
        let mut all = vec![(env::NNODES, "2"), (env::NODE_RANK, "1")];
        all.extend_from_slice(pairs);
        Config::from_source(all.as_slice())
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("10"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in ["", "s", "5x", "-1s", "1s5", "ms", "1..2s", "five"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        for d in [0, 1, 500, 1000, 90_000, 1_800_000, 7_200_000] {
            let d = Duration::from_millis(d);
            assert_eq!(parse_duration(&format_duration(d)), Some(d));
        }
    }

    #[test]
    fn defaults_when_only_required_set() {
        let c = cfg(&[]).expect("minimal config");
        assert_eq!(c.nnodes, NodeCount::Fixed(2));
        assert_eq!(c.node_rank, 1);
        assert_eq!(c.heartbeat.interval, Duration::from_secs(1));
        assert_eq!(c.heartbeat.misses, 3);
        assert_eq!(c.heartbeat.timeout, Duration::from_millis(500));
        assert_eq!(c.health_port, 29600);
        assert_eq!(c.on_peer_loss, OnPeerLoss::Auto);
        assert_eq!(c.detection, Detection::Auto);
        assert_eq!(c.limits.max_actions, 3);
        assert_eq!(c.limits.window, Duration::from_secs(600));
        assert_eq!(c.not_ready_grace, Duration::from_secs(10));
        assert!(c.checkpoint.is_none());
        assert!(c.agent_match.is_empty());
    }

    #[test]
    fn full_config() {
        let c = cfg(&[
            (env::NNODES, "2:4"),
            (env::PEER_HOSTS, "127.0.0.1{i}"),
            (env::BIND_ADDRESS, "127.0.0.11"),
            (env::HEALTH_PORT, "29601"),
            (env::HEARTBEAT_INTERVAL, "200ms"),
            (env::HEARTBEAT_MISSES, "2"),
            (env::ON_PEER_LOSS, "restart-workers"),
            (env::DETECTION, "heartbeat"),
            (env::CHECKPOINT_DIR, "/ckpt"),
            (env::CHECKPOINT_MAX_AGE, "90s"),
            (env::CHECKPOINT_POLL, "true"),
            (env::AGENT_MATCH, "fake_torchrun, other"),
            (env::LOG_FORMAT, "json"),
        ])
        .expect("full config");
        assert_eq!(c.nnodes, NodeCount::Elastic { min: 2, max: 4 });
        assert_eq!(c.heartbeat.host_of(3).as_deref(), Some("127.0.0.13"));
        assert_eq!(c.bind_address.to_string(), "127.0.0.11");
        assert_eq!(c.heartbeat.timeout, Duration::from_millis(100));
        let ck = c.checkpoint.expect("checkpoint");
        assert_eq!(ck.max_age, Duration::from_secs(90));
        assert_eq!(ck.poll, PollMode::Always);
        assert_eq!(c.agent_match, vec!["fake_torchrun", "other"]);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.on_peer_loss, OnPeerLoss::RestartWorkers);
    }

    #[test]
    fn rendezvous_host_rank_or_none() {
        assert_eq!(cfg(&[]).expect("default").rdzv_host_rank, Some(0));
        let c = cfg(&[(env::RDZV_HOST_RANK, "none")]).expect("external store");
        assert_eq!(c.rdzv_host_rank, None);
        let e = cfg(&[(env::RDZV_HOST_RANK, "7")]).expect_err("beyond the world");
        assert!(e.to_string().contains("or none"), "{e}");
    }

    #[test]
    fn errors_name_variable_value_and_forms() {
        let e = cfg(&[(env::HEARTBEAT_INTERVAL, "fast")]).expect_err("must be refused");
        let text = e.to_string();
        assert!(text.contains("TRAINWIRE_HEARTBEAT_INTERVAL"), "{text}");
        assert!(text.contains("\"fast\""), "{text}");
        assert!(text.contains("500ms"), "{text}");

        let e = cfg(&[(env::ON_PEER_LOSS, "reboot")])
            .expect_err("must be refused")
            .to_string();
        assert!(
            e.contains("TRAINWIRE_ON_PEER_LOSS") && e.contains("restart-workers"),
            "{e}"
        );

        let e = cfg(&[(env::NNODES, "4:2")])
            .expect_err("must be refused")
            .to_string();
        assert!(e.contains("MIN:MAX"), "{e}");

        let e = cfg(&[(env::NODE_RANK, "2")])
            .expect_err("must be refused")
            .to_string();
        assert!(
            e.contains("TRAINWIRE_NODE_RANK") && e.contains("below"),
            "{e}"
        );

        let e = cfg(&[(env::PEER_HOSTS, "pod-0.svc")])
            .expect_err("must be refused")
            .to_string();
        assert!(e.contains("{i}"), "{e}");

        let e = cfg(&[(env::DETECTION, "heartbeat")]).expect_err("must be refused");
        assert!(matches!(e, ConfigError::Missing { var, .. } if var == env::PEER_HOSTS));

        let e = cfg(&[(env::DETECTION, "kubernetes")]).expect_err("must be refused");
        assert!(matches!(e, ConfigError::Missing { var, .. } if var == env::SELECTOR));

        let e = cfg(&[(env::HEARTBEAT_MISSES, "0")])
            .expect_err("must be refused")
            .to_string();
        assert!(e.contains("TRAINWIRE_HEARTBEAT_MISSES"), "{e}");

        let e = cfg(&[(env::CHECKPOINT_DIR, "/c"), (env::CHECKPOINT_POLL, "maybe")])
            .expect_err("must be refused")
            .to_string();
        assert!(e.contains("TRAINWIRE_CHECKPOINT_POLL"), "{e}");

        let e =
            Config::from_source([(env::NODE_RANK, "0")].as_slice()).expect_err("must be refused");
        assert!(matches!(e, ConfigError::Missing { var, .. } if var == env::NNODES));
    }

    #[test]
    fn empty_value_counts_as_unset() {
        let c = cfg(&[(env::HEARTBEAT_INTERVAL, " ")]).expect("blank uses default");
        assert_eq!(c.heartbeat.interval, Duration::from_secs(1));
    }
}
