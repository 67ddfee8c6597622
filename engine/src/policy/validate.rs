//! Semantic checks of a parsed policy: what the YAML shape alone cannot say
//! (duplicate names, bad quantities, globs, durations, toleration shapes,
//! contradictions between rules).

use std::collections::HashMap;

use super::parse::{Diagnostic, FieldPath, Locations};
use super::{Enforce, Policy, Profile, RdzvBackend, syntax};
use trainwire_contract::config::{Config, ConfigError};
use trainwire_contract::{Quantity, env};

/// Sidecar env the policy may set: tunables only. The per-pod identity
/// variables are computed by the webhook, and checkpoint dir/max age and the
/// peer-loss action have their own policy fields.
///
/// `TRAINWIRE_HEALTH_PORT` is not among them: the engine owns the port (the
/// sidecar's probes, container port and peers' heartbeats all use it), so
/// `policy check` refuses it instead of the engine ignoring it.
pub const SIDECAR_TUNABLE_ENV: &[&str] = &[
    env::CHECKPOINT_POLL,
    env::DETECTION,
    env::HEARTBEAT_INTERVAL,
    env::HEARTBEAT_MISSES,
    env::HEARTBEAT_TIMEOUT,
    env::NOT_READY_GRACE,
    env::ACTION_COOLDOWN,
    env::MAX_ACTIONS,
    env::ACTION_WINDOW,
    env::CHECKPOINT_SETTLE,
    env::CHECKPOINT_POLL_INTERVAL,
    env::AGENT_MATCH,
    env::LOG_FORMAT,
    env::CONFIRM_AFTER,
    env::REPLACEMENT_WAIT,
];

struct Checker<'a> {
    file: &'a str,
    locations: &'a Locations,
    errors: Vec<Diagnostic>,
}

impl Checker<'_> {
    fn error(&mut self, path: FieldPath, message: impl Into<String>) {
        let (line, column) = match self.locations.value(&path) {
            Some((l, c)) => (Some(l), Some(c)),
            None => (None, None),
        };
        self.errors.push(Diagnostic {
            file: self.file.to_string(),
            line,
            column,
            path,
            message: message.into(),
        });
    }

    /// An error about a map key itself (a bad NCCL name, a bad label key).
    fn key_error(&mut self, path: FieldPath, message: impl Into<String>) {
        let (line, column) = match self.locations.key(&path) {
            Some((l, c)) => (Some(l), Some(c)),
            None => (None, None),
        };
        self.errors.push(Diagnostic {
            file: self.file.to_string(),
            line,
            column,
            path,
            message: message.into(),
        });
    }

    fn check(&mut self, r: Result<(), String>, path: FieldPath) {
        if let Err(message) = r {
            self.error(path, message);
        }
    }
}

/// Every semantic error of `policy`, in file order.
pub fn validate(policy: &Policy, file: &str, locations: &Locations) -> Vec<Diagnostic> {
    let mut c = Checker {
        file,
        locations,
        errors: Vec::new(),
    };
    let root = FieldPath::root().key("profiles");
    if policy.profiles.is_empty() {
        c.error(
            root.clone(),
            "a policy needs at least one profile; without a policy file the embedded defaults apply",
        );
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut exact_namespaces: HashMap<&str, usize> = HashMap::new();
    let mut fallback: Option<usize> = None;
    for (i, profile) in policy.profiles.iter().enumerate() {
        let at = root.index(i);
        match names.get(profile.name.as_str()) {
            Some(first) => c.error(
                at.key("name"),
                format!(
                    "profile name {:?} is already used by profiles[{first}]; profile names must be unique",
                    profile.name
                ),
            ),
            None => {
                names.insert(&profile.name, i);
            }
        }
        if profile.namespaces.is_empty() {
            match fallback {
                Some(first) => c.error(
                    at.key("name"),
                    format!(
                        "profile {:?} has no namespaces, like profiles[{first}] before it: only the first profile without namespaces is the fallback, so this one would never apply; give it namespaces",
                        profile.name
                    ),
                ),
                None => fallback = Some(i),
            }
        }
        for (j, ns) in profile.namespaces.iter().enumerate() {
            if syntax::is_glob(ns) {
                continue;
            }
            match exact_namespaces.get(ns.as_str()) {
                Some(first) if *first != i => c.error(
                    at.key("namespaces").index(j),
                    format!(
                        "namespace {ns:?} is already listed by profiles[{first}], which wins; list each namespace in one profile"
                    ),
                ),
                Some(_) => {}
                None => {
                    exact_namespaces.insert(ns, i);
                }
            }
        }
        profile_checks(&mut c, profile, &at);
    }
    c.errors
        .sort_by_key(|d| (d.line.unwrap_or(u64::MAX), d.column.unwrap_or(u64::MAX)));
    c.errors
}

fn profile_checks(c: &mut Checker<'_>, p: &Profile, at: &FieldPath) {
    c.check(syntax::dns_label(&p.name), at.key("name"));
    for (j, ns) in p.namespaces.iter().enumerate() {
        c.check(syntax::namespace_pattern(ns), at.key("namespaces").index(j));
    }

    for (key, setting) in &p.nccl {
        let path = at.key("nccl").key(key);
        if !(key.starts_with("NCCL_") || key.starts_with("TORCH_NCCL_")) || !syntax::env_name(key) {
            c.key_error(
                path.clone(),
                format!(
                    "{key:?} is not an NCCL variable: names start with NCCL_ or TORCH_NCCL_ and hold letters, digits and '_'"
                ),
            );
        }
        if setting.value.contains('\0') {
            c.error(path.key("value"), "the value holds a NUL character");
        }
    }

    for (key, setting) in &p.node_selector {
        let path = at.key("nodeSelector").key(key);
        if let Err(m) = syntax::label_key(key) {
            c.key_error(path.clone(), m);
        }
        c.check(syntax::label_value(&setting.value), path.key("value"));
    }

    for (j, t) in p.tolerations.iter().enumerate() {
        let path = at.key("tolerations").index(j);
        let exists = t.operator.as_deref() == Some("Exists");
        let key = t.key.as_deref().unwrap_or("");
        if exists && t.value.as_deref().is_some_and(|v| !v.is_empty()) {
            c.error(
                path.key("value"),
                "a toleration with operator Exists has no value; remove value or use operator Equal",
            );
        }
        if key.is_empty() && !exists {
            c.error(
                path.key("operator"),
                "a toleration without a key must have operator Exists (it then tolerates every taint)",
            );
        }
        if !key.is_empty()
            && let Err(m) = syntax::label_key(key)
        {
            c.error(path.key("key"), m);
        }
        if let Some(v) = t.value.as_deref()
            && let Err(m) = syntax::label_value(v)
        {
            c.error(path.key("value"), m);
        }
        if t.toleration_seconds.is_some() && t.effect.as_deref() != Some("NoExecute") {
            c.error(
                path.key("tolerationSeconds"),
                "tolerationSeconds applies only to effect NoExecute; set effect: NoExecute or remove it",
            );
        }
        if key == super::UNREACHABLE_TAINT || key == super::NOT_READY_TAINT {
            c.error(
                path.key("key"),
                format!(
                    "{key:?} is managed by nodeFailureTolerationSeconds; set that instead of listing the toleration"
                ),
            );
        }
    }

    if let Some(s) = &p.node_failure_toleration_seconds
        && s.value < 0
    {
        c.error(
            at.key("nodeFailureTolerationSeconds").key("value"),
            format!(
                "{} is negative; give the seconds a pod stays bound to an unreachable or not-ready node (0 or more; Kubernetes' default is 300)",
                s.value
            ),
        );
    }

    if let (Some(n), Some(s)) = (&p.node_failure, &p.node_failure_toleration_seconds)
        && n.toleration_seconds() != s.value
    {
        c.error(
            at.key("nodeFailureTolerationSeconds").key("value"),
            format!(
                "{} s disagrees with nodeFailure.reclaimAfter ({}): pods would be evicted and reclaimed at different times; remove nodeFailureTolerationSeconds (reclaimAfter sets the tolerations) or make them equal",
                s.value, n.reclaim_after
            ),
        );
    }
    if let Some(n) = &p.node_failure
        && n.max_pods_per_minute == 0
    {
        c.error(
            at.key("nodeFailure").key("maxPodsPerMinute"),
            "0 would never reclaim a pod; give 1 or more, or remove nodeFailure to turn reclaim off",
        );
    }

    if let Some(rule) = &p.checkpoint {
        let path = at.key("checkpoint");
        match syntax::claim_pattern(&rule.claim) {
            Err(m) => c.error(path.key("claim"), m),
            Ok(()) => {
                let plain = !syntax::is_glob(&rule.claim);
                if !plain && rule.enforce != Enforce::Refuse {
                    c.error(
                        path.key("enforce"),
                        format!(
                            "claim {:?} is a pattern, so trainwire cannot pick the claim for the workload; a pattern needs enforce: refuse (a workload must name a matching claim), or give a plain claim name",
                            rule.claim
                        ),
                    );
                }
                if let Some(allowed) = &p.allowed_claims {
                    let allowed_ok = plain
                        && allowed.iter().any(|a| {
                            let probe = syntax::substitute_claim(&rule.claim, "ns", "name");
                            syntax::claim_matches(a, "ns", "name", &probe)
                        });
                    if plain && !allowed_ok {
                        c.error(
                            path.key("claim"),
                            format!(
                                "claim {:?} is not in allowedClaims, so every workload would be refused; add it to allowedClaims",
                                rule.claim
                            ),
                        );
                    }
                }
            }
        }
    }
    // checkpointPath, checkpointMaxAge, checkpoint.mountPath and shmSize are
    // contract types: their grammar is checked as the file is read.

    if let Some(allowed) = &p.allowed_claims {
        for (j, a) in allowed.iter().enumerate() {
            c.check(syntax::claim_pattern(a), at.key("allowedClaims").index(j));
        }
    }

    if p.max_nodes == Some(0) {
        c.error(
            at.key("maxNodes"),
            "0 would refuse every workload; give the largest node count allowed (1 or more), or remove maxNodes for no limit",
        );
    }

    if p.rdzv_backend.value == RdzvBackend::EtcdV2 && p.etcd_endpoint.is_none() {
        c.error(
            at.key("rdzvBackend").key("value"),
            "backend etcd-v2 needs etcdEndpoint (host:port of the external etcd)",
        );
    }
    if let Some(ep) = &p.etcd_endpoint {
        c.check(syntax::host_port(ep), at.key("etcdEndpoint"));
    }
    if let Some(domain) = &p.cluster_domain {
        c.check(syntax::dns_subdomain(domain), at.key("clusterDomain"));
    }

    let sc = at.key("sidecar");
    let image = &p.sidecar.image.value;
    if image.is_empty() || image.chars().any(char::is_whitespace) {
        c.error(
            sc.key("image").key("value"),
            format!(
                "{image:?} is not an image reference (registry/repository:tag or @sha256:digest)"
            ),
        );
    }
    if let Some(res) = &p.sidecar.resources {
        for (part, map) in [("limits", &res.limits), ("requests", &res.requests)] {
            for (name, q) in map.iter().flatten() {
                let check = match q.0.parse::<Quantity>() {
                    Ok(v) if v.nanos() < 0 => Err(format!("{:?} is negative", q.0)),
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                };
                c.check(check, sc.key("resources").key(part).key(name));
            }
        }
    }
    for (field, id) in [
        ("runAsUser", p.sidecar.run_as_user),
        ("runAsGroup", p.sidecar.run_as_group),
    ] {
        if let Some(id) = id
            && !(0..=i64::from(u32::MAX - 1)).contains(&id)
        {
            c.error(
                sc.key(field),
                format!("{id} is not a user or group ID; accepted: 0 to 4294967294"),
            );
        }
    }
    let mut one_bad = false;
    for (key, value) in &p.sidecar.env {
        let path = sc.key("env").key(key);
        if !SIDECAR_TUNABLE_ENV.contains(&key.as_str()) {
            let hint = if env::ALL.contains(&key.as_str()) {
                " (the webhook sets it, or it has its own policy field)".to_string()
            } else {
                String::new()
            };
            c.key_error(
                path,
                format!(
                    "{key:?} is not a sidecar setting the policy may set{hint}; accepted: {}",
                    SIDECAR_TUNABLE_ENV.join(", ")
                ),
            );
            continue;
        }
        if let Err(e) = sidecar_config(p, [(key.as_str(), value.as_str())]) {
            c.error(path, sidecar_refusal(&e));
            one_bad = true;
        }
    }
    if one_bad {
        return;
    }
    // Together (one variable may need another: DETECTION=heartbeat and the
    // peers' hosts): what the sidecar of a workload of this profile reads.
    let all = p
        .sidecar
        .env
        .iter()
        .filter(|(k, _)| SIDECAR_TUNABLE_ENV.contains(&k.as_str()));
    if let Err(e) = sidecar_config(p, all.map(|(k, v)| (k.as_str(), v.as_str()))) {
        let path = if p.sidecar.env.contains_key(e.var()) {
            sc.key("env").key(e.var())
        } else {
            sc.key("env")
        };
        c.error(path, sidecar_refusal(&e));
    }
}

fn sidecar_refusal(e: &ConfigError) -> String {
    format!("{e}; the sidecar would not start with it")
}

/// Run the sidecar's own configuration parser on what the engine injects
/// for a workload of this profile (two nodes, rank 0) plus `extra`, so a
/// policy that passes `policy check` starts the sidecar.
fn sidecar_config<'a>(
    p: &Profile,
    extra: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Config, ConfigError> {
    let mut vars = std::collections::BTreeMap::from([
        (env::POD_NAME.to_string(), "train-0".to_string()),
        (env::POD_NAMESPACE.to_string(), "ns".to_string()),
        (env::NODE_RANK.to_string(), "0".to_string()),
        (env::NNODES.to_string(), "2".to_string()),
        (env::SELECTOR.to_string(), "app=train".to_string()),
        (
            env::PEER_HOSTS.to_string(),
            "train-{i}.train.ns.svc".to_string(),
        ),
        (env::RDZV_HOST_RANK.to_string(), "0".to_string()),
        (
            env::HEALTH_PORT.to_string(),
            env::DEFAULT_HEALTH_PORT.to_string(),
        ),
        (
            env::CHECKPOINT_DIR.to_string(),
            p.checkpoint_path.value.to_string(),
        ),
        (
            env::CHECKPOINT_MAX_AGE.to_string(),
            p.checkpoint_max_age.value.to_string(),
        ),
        (
            env::ON_PEER_LOSS.to_string(),
            p.sidecar.on_peer_loss.value.to_string(),
        ),
        (
            env::STALL_TIMEOUT.to_string(),
            p.sidecar.stall_timeout.value.to_string(),
        ),
        (
            env::ON_STALL.to_string(),
            p.sidecar.on_stall.value.to_string(),
        ),
        (
            env::LOSS_WINDOW.to_string(),
            p.sidecar.loss_window.value.to_string(),
        ),
    ]);
    for (k, v) in extra {
        vars.insert(k.to_string(), v.to_string());
    }
    Config::from_source(&vars)
}
