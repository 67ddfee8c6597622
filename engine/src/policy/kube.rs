//! Kubernetes types inside a policy, read strictly.
//!
//! k8s-openapi's own `Deserialize` skips unknown fields, so a typo such as
//! `tolerationSecond:` would vanish silently. These mirrors deny unknown
//! fields and spell out the accepted enum values, then convert to the
//! k8s-openapi types the engine uses.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Deserializer};

#[derive(Clone, Copy, Debug, Deserialize)]
enum Operator {
    Exists,
    Equal,
}

#[derive(Clone, Copy, Debug, Deserialize)]
enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TolerationSpec {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    operator: Option<Operator>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    effect: Option<Effect>,
    #[serde(default)]
    toleration_seconds: Option<i64>,
}

impl From<TolerationSpec> for Toleration {
    fn from(t: TolerationSpec) -> Self {
        Toleration {
            key: t.key,
            operator: t.operator.map(|o| format!("{o:?}")),
            value: t.value,
            effect: t.effect.map(|e| format!("{e:?}")),
            toleration_seconds: t.toleration_seconds,
        }
    }
}

/// `tolerations:` as a list of strict toleration shapes.
pub fn tolerations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Toleration>, D::Error> {
    let specs = Vec::<TolerationSpec>::deserialize(d)?;
    Ok(specs.into_iter().map(Toleration::from).collect())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourcesSpec {
    #[serde(default)]
    limits: Option<BTreeMap<String, String>>,
    #[serde(default)]
    requests: Option<BTreeMap<String, String>>,
}

/// `resources:` with `limits` and `requests` only (quantities are checked
/// after parsing, with the other semantic checks).
pub fn resources<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<ResourceRequirements>, D::Error> {
    let spec = Option::<ResourcesSpec>::deserialize(d)?;
    let quantities = |m: Option<BTreeMap<String, String>>| {
        m.map(|m| m.into_iter().map(|(k, v)| (k, Quantity(v))).collect())
    };
    Ok(spec.map(|s| ResourceRequirements {
        claims: None,
        limits: quantities(s.limits),
        requests: quantities(s.requests),
    }))
}
