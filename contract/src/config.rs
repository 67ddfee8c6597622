//! The sidecar's typed configuration, parsed from the `TRAINWIRE_*` env.
//!
//! It lives in the contract so that the webhook's `policy check` runs the
//! very parser the sidecar starts with: a policy that passes the check
//! starts the sidecar. Parsing goes through [`Source`], a small trait over
//! "where the strings come from", so tests (and the policy check) feed a map
//! instead of touching the process environment (linkerd2-proxy's `env.rs`);
//! the sidecar's own source adds the fallbacks that need I/O (`HOSTNAME`,
//! the service-account namespace file).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use crate::{Count, Grammar, Invalid, MountPath, PositiveCount, PositiveDuration, env};
pub use crate::{Detection, LogFormat, NodeCount, PeerLossAction, PollMode};

/// Where configuration strings come from.
pub trait Source {
    /// The value of `key`, if set. An empty value counts as unset.
    fn get(&self, key: &str) -> Option<String>;
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

impl ConfigError {
    /// The variable the error is about.
    pub fn var(&self) -> &'static str {
        match self {
            ConfigError::Invalid { var, .. } | ConfigError::Missing { var, .. } => var,
        }
    }
}

type Result<T, E = ConfigError> = std::result::Result<T, E>;

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
    /// Most actions within `window`; `0` disables actions.
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
    /// Hot spares: pods beyond the world's size (0: none).
    pub spares: u32,
    pub selector: Option<String>,
    /// Rank of the pod that runs the c10d store; `None` when the store is
    /// outside the world (etcd-v2).
    pub rdzv_host_rank: Option<u32>,
    /// Port of the rendezvous store on the rendezvous host, when known.
    pub rdzv_port: Option<u16>,
    pub health_port: u16,
    pub bind_address: IpAddr,
    pub checkpoint: Option<CheckpointConfig>,
    pub on_peer_loss: PeerLossAction,
    pub detection: Detection,
    pub heartbeat: HeartbeatConfig,
    /// How long a peer may be silent before its loss is confirmed where
    /// torchrun drops a silent node itself; the heartbeats derive from it
    /// unless set one by one ([`crate::LossWindow`]).
    pub loss_window: crate::LossWindow,
    pub not_ready_grace: Duration,
    pub limits: ActionLimits,
    /// Outage that confirms a loss by itself; `None`: `auto` (see
    /// [`Config::confirm_after_for`]).
    pub confirm_after: Option<Duration>,
    /// How long to wait for the rendezvous host's replacement before
    /// reporting that none came.
    pub replacement_wait: Duration,
    /// Substrings that identify the agent's command line; empty means the
    /// built-in torchrun matcher.
    pub agent_match: Vec<String>,
    pub log_format: LogFormat,
    /// A hung world: `None` when stall detection is off.
    pub stall_timeout: Option<Duration>,
    pub on_stall: crate::StallAction,
    /// Where confirmed losses are written for the trainer's rendezvous
    /// handler; `None`: no handler.
    pub rendezvous_dir: Option<PathBuf>,
}

/// The most spare pods a world may have (`TRAINWIRE_SPARES`).
pub use crate::values::MAX_SPARES;

/// Defaults, documented in `docs/sidecar.md`.
pub mod defaults {
    use std::time::Duration;
    /// The loss window (`TRAINWIRE_LOSS_WINDOW`): 1 s. The heartbeats'
    /// interval (200 ms), misses (4) and probe time limit (1.2 s) derive
    /// from it ([`crate::LossWindow`]).
    pub const LOSS_WINDOW: Duration = crate::loss_window::DEFAULT_LOSS_WINDOW;
    pub const NOT_READY_GRACE: Duration = Duration::from_secs(10);
    pub const ACTION_COOLDOWN: Duration = Duration::from_secs(30);
    pub const MAX_ACTIONS: u32 = 3;
    pub const ACTION_WINDOW: Duration = Duration::from_secs(600);
    pub const CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(30 * 60);
    pub const CHECKPOINT_SETTLE: Duration = Duration::from_secs(5);
    pub const CHECKPOINT_POLL_INTERVAL: Duration = Duration::from_secs(10);
    /// `TRAINWIRE_CONFIRM_AFTER=auto` in a fixed-size world.
    pub const CONFIRM_AFTER_FIXED: Duration = Duration::from_secs(30);
    pub const REPLACEMENT_WAIT: Duration = Duration::from_secs(600);
}

/// Formats a duration in the contract's grammar (`1h30m`, `1s500ms`);
/// beyond the grammar's bound, the bound.
pub fn format_duration(d: Duration) -> String {
    crate::Duration::new(d.min(crate::Duration::MAX))
        .unwrap_or_default()
        .to_string()
}

/// Parse one variable with its contract type.
fn var<S: Source + ?Sized, T: Grammar>(src: &S, var: &'static str) -> Result<Option<T>> {
    match src.get(var) {
        None => Ok(None),
        Some(v) => T::read(&v)
            .map(Some)
            .map_err(|e: Invalid| ConfigError::Invalid {
                var,
                value: v.clone(),
                reason: e.reason,
                accepted: e.accepted,
            }),
    }
}

fn duration<S: Source + ?Sized>(
    src: &S,
    name: &'static str,
    default: Duration,
) -> Result<Duration> {
    Ok(var::<S, crate::Duration>(src, name)?.map_or(default, Into::into))
}

fn positive_duration<S: Source + ?Sized>(
    src: &S,
    name: &'static str,
    default: Duration,
) -> Result<Duration> {
    Ok(var::<S, PositiveDuration>(src, name)?.map_or(default, Into::into))
}

fn rank<S: Source + ?Sized>(
    src: &S,
    name: &'static str,
    accepted: &'static str,
) -> Result<Option<u32>> {
    var::<S, Count>(src, name)
        .map(|c| c.map(|c| c.0))
        .map_err(|e| match e {
            ConfigError::Invalid {
                var, value, reason, ..
            } => ConfigError::Invalid {
                var,
                value,
                reason,
                accepted,
            },
            other => other,
        })
}

/// Parses `N` or `MIN:MAX`.
pub fn parse_nnodes(value: &str) -> Result<NodeCount> {
    value
        .trim()
        .parse()
        .map_err(|e: Invalid| ConfigError::Invalid {
            var: env::NNODES,
            value: value.into(),
            reason: e.reason,
            accepted: e.accepted,
        })
}

impl Config {
    /// Every pod of the workload: the world's largest size plus the spares.
    pub fn pods(&self) -> u32 {
        self.nnodes.max().saturating_add(self.spares)
    }

    /// The outage that confirms the loss of `lost_rank` by itself: the
    /// configured `TRAINWIRE_CONFIRM_AFTER`, else (`auto`) the loss window
    /// (`TRAINWIRE_LOSS_WINDOW`, 1 s by default) for a peer that is not the
    /// rendezvous host in a world where torchrun itself drops a silent node
    /// (an elastic world, which shrinks, or a world with hot spares, one of
    /// which takes the node's place; the sidecar tells the trainer's
    /// rendezvous handler, which evicts it at once), 30 s otherwise (a fixed
    /// world rides out a shorter outage: its connections resume, and the
    /// rendezvous host's loss costs every survivor its agent);
    /// never shorter than the reporting detection (interval × misses).
    pub fn confirm_after_for(&self, lost_rank: u32) -> Duration {
        let detection = self
            .heartbeat
            .interval
            .saturating_mul(self.heartbeat.misses);
        let dropped_by_torchrun =
            matches!(self.nnodes, NodeCount::Elastic { .. }) || self.spares > 0;
        let auto = if dropped_by_torchrun && Some(lost_rank) != self.rdzv_host_rank {
            self.loss_window.get()
        } else {
            defaults::CONFIRM_AFTER_FIXED
        };
        self.confirm_after.unwrap_or(auto).max(detection)
    }

    /// Reads the configuration from any [`Source`]. Without
    /// `TRAINWIRE_POD_NAME` the name is `unknown`; without
    /// `TRAINWIRE_POD_NAMESPACE`, `default` (the sidecar's process source
    /// falls back to `HOSTNAME` and the service-account namespace first).
    pub fn from_source<S: Source + ?Sized>(src: &S) -> Result<Self> {
        let pod_name = src.get(env::POD_NAME).unwrap_or_else(|| "unknown".into());
        let namespace = src
            .get(env::POD_NAMESPACE)
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
        let spares = var::<_, crate::SpareCount>(src, env::SPARES)?
            .unwrap_or_default()
            .get();
        let node_rank = rank(src, env::NODE_RANK, "a rank from 0 to NNODES+SPARES-1")?.ok_or(
            ConfigError::Missing {
                var: env::NODE_RANK,
                why: "the sidecar must know its own rank to skip itself",
            },
        )?;
        if node_rank >= nnodes.max().saturating_add(spares) {
            return Err(ConfigError::Invalid {
                var: env::NODE_RANK,
                value: node_rank.to_string(),
                reason: format!("must be below the node count {nnodes} plus {spares} spares"),
                accepted: "a rank from 0 to NNODES+SPARES-1",
            });
        }
        // `none`: the rendezvous store runs outside the world (etcd-v2), so
        // losing any peer leaves the local agent able to recover by itself.
        let rdzv_host_rank: Option<u32> =
            match src.get(env::RDZV_HOST_RANK).as_deref().map(str::trim) {
                Some("none") => None,
                _ => Some(
                    rank(
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
                accepted: "a host pattern such as <name>-{i}.<service>.<namespace>.svc.cluster.local",
            });
        }
        let rdzv_port = var::<S, crate::Port>(src, env::RDZV_PORT)?.map(crate::Port::get);
        let health_port = var::<S, crate::Port>(src, env::HEALTH_PORT)?
            .map_or(env::DEFAULT_HEALTH_PORT, crate::Port::get);
        let bind_address: IpAddr = match src.get(env::BIND_ADDRESS) {
            None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            Some(v) => v.trim().parse().map_err(|_| ConfigError::Invalid {
                var: env::BIND_ADDRESS,
                value: v.clone(),
                reason: "not an IP address".into(),
                accepted: "an IPv4 or IPv6 address",
            })?,
        };

        let checkpoint = match var::<S, MountPath>(src, env::CHECKPOINT_DIR)? {
            None => None,
            Some(dir) => Some(CheckpointConfig {
                dir: PathBuf::from(dir.as_str()),
                max_age: positive_duration(
                    src,
                    env::CHECKPOINT_MAX_AGE,
                    defaults::CHECKPOINT_MAX_AGE,
                )?,
                poll: var(src, env::CHECKPOINT_POLL)?.unwrap_or(PollMode::Auto),
                poll_interval: positive_duration(
                    src,
                    env::CHECKPOINT_POLL_INTERVAL,
                    defaults::CHECKPOINT_POLL_INTERVAL,
                )?,
                settle: duration(src, env::CHECKPOINT_SETTLE, defaults::CHECKPOINT_SETTLE)?,
            }),
        };

        let on_peer_loss = var(src, env::ON_PEER_LOSS)?.unwrap_or(PeerLossAction::Auto);
        let detection = var(src, env::DETECTION)?.unwrap_or(Detection::Auto);
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

        // The heartbeats derive from the loss window; each may still be
        // set on its own (tests, a platform's tuning in `sidecar.env`).
        let loss_window = var::<S, crate::LossWindow>(src, env::LOSS_WINDOW)?.unwrap_or_default();
        let set_interval = var::<S, PositiveDuration>(src, env::HEARTBEAT_INTERVAL)?;
        let set_misses = var::<S, PositiveCount>(src, env::HEARTBEAT_MISSES)?;
        let interval = set_interval.map_or(loss_window.heartbeat_interval(), Into::into);
        let misses = set_misses.map_or(loss_window.heartbeat_misses(), PositiveCount::get);
        let default_timeout = if set_interval.is_none() && set_misses.is_none() {
            loss_window.probe_timeout()
        } else {
            interval.saturating_mul(misses.saturating_add(2))
        };
        let timeout = positive_duration(src, env::HEARTBEAT_TIMEOUT, default_timeout)?;

        let max_actions =
            var::<S, Count>(src, env::MAX_ACTIONS)?.map_or(defaults::MAX_ACTIONS, |c| c.0);
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
        let log_format = var(src, env::LOG_FORMAT)?.unwrap_or_default();
        let confirm_after = match src.get(env::CONFIRM_AFTER) {
            Some(v) if v.trim() == "auto" => None,
            Some(_) => Some(positive_duration(
                src,
                env::CONFIRM_AFTER,
                defaults::CONFIRM_AFTER_FIXED,
            )?),
            None => None,
        };
        let replacement_wait =
            positive_duration(src, env::REPLACEMENT_WAIT, defaults::REPLACEMENT_WAIT)?;
        let rendezvous_dir =
            var::<S, MountPath>(src, env::RENDEZVOUS_DIR)?.map(|d| PathBuf::from(d.as_str()));

        let stall_timeout = var::<S, crate::StallTimeout>(src, env::STALL_TIMEOUT)?
            .unwrap_or_default()
            .get();
        let on_stall = var(src, env::ON_STALL)?.unwrap_or(crate::StallAction::RestartWorkers);

        Ok(Config {
            stall_timeout,
            on_stall,
            pod_name,
            namespace,
            pod_uid,
            node_rank,
            nnodes,
            selector,
            rdzv_host_rank,
            spares,
            rdzv_port,
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
            loss_window,
            not_ready_grace: duration(src, env::NOT_READY_GRACE, defaults::NOT_READY_GRACE)?,
            limits,
            confirm_after,
            replacement_wait,
            agent_match,
            log_format,
            rendezvous_dir,
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
    fn regression_findings() {
        // Overflowing durations are refused, never a panic.
        for var in [
            env::HEARTBEAT_INTERVAL,
            env::NOT_READY_GRACE,
            env::ACTION_COOLDOWN,
            env::ACTION_WINDOW,
        ] {
            for bad in ["1e20", "1e20s", "18446744073709551615s", "10"] {
                let e = cfg(&[(var, bad)]).expect_err(bad);
                assert_eq!(e.var(), var, "{e}");
            }
        }
        // MAX_ACTIONS=0 disables actions; the whole u32 range is read.
        assert_eq!(
            cfg(&[(env::MAX_ACTIONS, "0")]).map(|c| c.limits.max_actions),
            Ok(0)
        );
        assert_eq!(
            cfg(&[(env::HEARTBEAT_MISSES, "4294967295")]).map(|c| c.heartbeat.misses),
            Ok(u32::MAX)
        );
        // Documented spellings.
        let c = cfg(&[
            (env::DETECTION, "k8s"),
            (env::SELECTOR, "a=b"),
            (env::CHECKPOINT_DIR, "/c"),
            (env::CHECKPOINT_POLL, "auto"),
        ])
        .expect("k8s");
        assert_eq!(c.detection, Detection::Kubernetes);
        assert_eq!(c.checkpoint.map(|c| c.poll), Some(PollMode::Auto));
        // One grammar with the annotations: 1h30m and 1.5s, not 1d.
        let c = cfg(&[
            (env::HEARTBEAT_INTERVAL, "1.5s"),
            (env::CHECKPOINT_DIR, "//ckpt/"),
            (env::CHECKPOINT_MAX_AGE, "1h30m"),
        ])
        .expect("go durations");
        assert_eq!(c.heartbeat.interval, Duration::from_millis(1500));
        let ck = c.checkpoint.expect("checkpoint");
        assert_eq!(ck.max_age, Duration::from_secs(5400));
        assert_eq!(ck.dir, PathBuf::from("/ckpt"));
        let e =
            cfg(&[(env::CHECKPOINT_DIR, "/c"), (env::CHECKPOINT_MAX_AGE, "1d")]).expect_err("1d");
        assert!(e.to_string().contains("24h"), "{e}");
        assert!(cfg(&[(env::CHECKPOINT_DIR, "//")]).is_err());
    }

    #[test]
    fn confirmation_outage_by_topology() {
        let elastic = cfg(&[(env::NNODES, "2:3")]).expect("elastic");
        assert_eq!(elastic.confirm_after_for(2), Duration::from_secs(1));
        assert_eq!(
            elastic.confirm_after_for(0),
            Duration::from_secs(30),
            "the rendezvous host of an elastic world is still the store"
        );
        // With hot spares a spare takes a silent node's place once its
        // keep-alive expires (or the handler evicts it): the loss window,
        // but for the store's host.
        let spares = cfg(&[(env::SPARES, "1"), (env::RDZV_HOST_RANK, "0")]).expect("spares");
        assert_eq!(spares.confirm_after_for(1), Duration::from_secs(1));
        assert_eq!(spares.confirm_after_for(2), Duration::from_secs(1));
        assert_eq!(spares.confirm_after_for(0), Duration::from_secs(30));
        let store_outside =
            cfg(&[(env::SPARES, "1"), (env::RDZV_HOST_RANK, "none")]).expect("spares");
        assert_eq!(store_outside.confirm_after_for(0), Duration::from_secs(1));
        // A longer window: longer to confirm, slower heartbeats.
        let slow = cfg(&[(env::SPARES, "1"), (env::LOSS_WINDOW, "2s")]).expect("2s");
        assert_eq!(slow.confirm_after_for(1), Duration::from_secs(2));
        assert_eq!(slow.confirm_after_for(0), Duration::from_secs(30));
        assert_eq!(slow.heartbeat.interval, Duration::from_millis(400));
        assert_eq!(slow.heartbeat.misses, 4);
        assert_eq!(slow.heartbeat.timeout, Duration::from_millis(2400));
        let e = cfg(&[(env::LOSS_WINDOW, "100ms")]).expect_err("too short");
        assert_eq!(e.var(), env::LOSS_WINDOW);
        assert!(e.to_string().contains("1500ms"), "{e}");
        let set =
            cfg(&[(env::CONFIRM_AFTER, "12s"), (env::REPLACEMENT_WAIT, "2m")]).expect("explicit");
        assert_eq!(set.confirm_after_for(0), Duration::from_secs(12));
        assert_eq!(set.replacement_wait, Duration::from_secs(120));
        let auto = cfg(&[(env::CONFIRM_AFTER, "auto")]).expect("auto");
        assert_eq!(auto.confirm_after, None);
        // Never shorter than the reporting detection.
        let short = cfg(&[
            (env::CONFIRM_AFTER, "1s"),
            (env::HEARTBEAT_INTERVAL, "1s"),
            (env::HEARTBEAT_MISSES, "3"),
        ])
        .expect("short");
        assert_eq!(short.confirm_after_for(1), Duration::from_secs(3));
        assert!(cfg(&[(env::CONFIRM_AFTER, "0s")]).is_err());
        assert!(cfg(&[(env::CONFIRM_AFTER, "soon")]).is_err());
    }

    #[test]
    fn defaults_when_only_required_set() {
        let c = cfg(&[]).expect("minimal config");
        assert_eq!(c.nnodes, NodeCount::Fixed(2));
        assert_eq!(c.node_rank, 1);
        assert_eq!(c.loss_window, crate::LossWindow::default());
        assert_eq!(c.heartbeat.interval, Duration::from_millis(200));
        assert_eq!(c.heartbeat.misses, 4);
        assert_eq!(c.heartbeat.timeout, Duration::from_millis(1200));
        assert_eq!(c.confirm_after, None);
        assert_eq!(c.confirm_after_for(0), Duration::from_secs(30));
        assert_eq!(c.replacement_wait, Duration::from_secs(600));
        assert_eq!(c.health_port, 29600);
        assert_eq!(c.on_peer_loss, PeerLossAction::Auto);
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
        assert_eq!(c.heartbeat.timeout, Duration::from_millis(800));
        let ck = c.checkpoint.expect("checkpoint");
        assert_eq!(ck.max_age, Duration::from_secs(90));
        assert_eq!(ck.poll, PollMode::Always);
        assert_eq!(c.agent_match, vec!["fake_torchrun", "other"]);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.on_peer_loss, PeerLossAction::RestartWorkers);
    }

    #[test]
    fn spares_add_ranks_beyond_the_world() {
        assert_eq!(cfg(&[]).expect("default").spares, 0);
        let c = cfg(&[(env::SPARES, "1"), (env::NODE_RANK, "2")]).expect("the spare's own rank");
        assert_eq!((c.spares, c.node_rank, c.pods()), (1, 2, 3));
        let e = cfg(&[(env::NODE_RANK, "2")]).expect_err("no spares: rank 2 of 2 is out");
        assert!(e.to_string().contains("NNODES+SPARES-1"), "{e}");
        for bad in ["-1", "x", "1025"] {
            let e = cfg(&[(env::SPARES, bad)]).expect_err(bad);
            assert!(e.to_string().contains("TRAINWIRE_SPARES"), "{e}");
        }
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
    fn rendezvous_port_is_optional() {
        assert_eq!(cfg(&[]).expect("default").rdzv_port, None);
        let c = cfg(&[(env::RDZV_PORT, "29500")]).expect("a port");
        assert_eq!(c.rdzv_port, Some(29500));
        let e = cfg(&[(env::RDZV_PORT, "0")])
            .expect_err("not a port")
            .to_string();
        assert!(e.contains("TRAINWIRE_RDZV_PORT"), "{e}");
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

    /// The checkpoint directory is read with the path grammar as written:
    /// a value the webhook would refuse (`/ckpt /`, `/ckpt `) stops the
    /// sidecar with the variable named, instead of being trimmed into a
    /// directory that is not the mount.
    #[test]
    fn checkpoint_dir_is_read_with_the_path_grammar() {
        let c = cfg(&[(env::CHECKPOINT_DIR, "/ckpt/")]).expect("a path");
        assert_eq!(
            c.checkpoint.expect("checkpoint").dir,
            PathBuf::from("/ckpt")
        );
        for bad in ["/ckpt /", "/ckpt ", " /ckpt", "/ ", "/k "] {
            let e = cfg(&[(env::CHECKPOINT_DIR, bad)]).expect_err(bad);
            assert_eq!(e.var(), env::CHECKPOINT_DIR);
            let text = e.to_string();
            assert!(text.contains(&format!("{bad:?}")), "{text}");
            assert!(text.contains(MountPath::ACCEPTED), "{text}");
        }
    }

    #[test]
    fn empty_value_counts_as_unset() {
        let c = cfg(&[(env::HEARTBEAT_INTERVAL, " ")]).expect("blank uses default");
        assert_eq!(c.heartbeat.interval, Duration::from_millis(200));
    }
}
