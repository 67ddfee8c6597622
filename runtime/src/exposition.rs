//! The two text formats of `/metrics`. Both programs encode OpenMetrics
//! (prometheus-client) and serve it to every client that accepts it
//! (Prometheus asks for it first) or says nothing. A client that asks only
//! for the classic Prometheus text format (`Accept: text/plain`, as `curl -H`
//! or tools that read format 0.0.4 do, promtool's `check metrics` among them)
//! gets that: the same samples, with each counter's HELP and TYPE under the
//! sample name (`x_total`), and no `# UNIT` or `# EOF` lines.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};
use prometheus_client::registry::Registry;

/// Registers `trainwire_build_info` (no prefix; both programs serve it): an
/// info-style gauge, always 1, with `version` and, when the build was given
/// one, `revision` as labels ([`trainwire_contract::release`]), so a
/// dashboard can join any series with the build that made it.
pub fn register_build_info(root: &mut Registry) {
    use trainwire_contract::release::{REVISION, VERSION};
    let mut labels = vec![("version", VERSION)];
    labels.extend(REVISION.map(|r| ("revision", r)));
    let build_info = Family::<Vec<(&'static str, &'static str)>, Gauge>::default();
    build_info.get_or_create(&labels).set(1);
    root.register(
        "trainwire_build_info",
        "The trainwire build serving: 1, with its version and source revision as labels",
        build_info,
    );
}

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the classic Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request with this `Accept` header gets the classic text format:
/// only when it names `text/plain` and not OpenMetrics.
pub fn wants_classic_text(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("text/plain") && !a.contains("application/openmetrics-text"))
}

/// The content type and body to answer a `/metrics` request with this
/// `Accept` header, from the OpenMetrics text of a registry.
pub fn negotiate(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_classic_text(accept) {
        (PROMETHEUS_TEXT, classic_text(&openmetrics))
    } else {
        (OPENMETRICS, openmetrics)
    }
}

/// Result of a certificate or policy reload (the label of the webhook's
/// and the controllers' `*_reloads_total`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    success,
    failure,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}

/// Count one reload with its result.
pub fn count_reload(family: &Family<ReloadLabels, Counter>, result: ReloadResult) {
    family.get_or_create(&ReloadLabels { result }).inc();
}

/// Create both results' series at 0, so `/metrics` shows the family from
/// the start.
pub fn initialise_reloads(family: &Family<ReloadLabels, Counter>) {
    for result in [ReloadResult::success, ReloadResult::failure] {
        let _ = family.get_or_create(&ReloadLabels { result });
    }
}

/// The classic Prometheus text format of an OpenMetrics exposition.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_sample_name_and_openmetrics_only_lines_go() {
        let om = "# HELP a_seconds Age.\n# TYPE a_seconds gauge\n# UNIT a_seconds seconds\na_seconds 1.5\n\
                  # HELP n Things.\n# TYPE n counter\nn_total{k=\"v\"} 2\n# EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP a_seconds Age.\n# TYPE a_seconds gauge\na_seconds 1.5\n\
             # HELP n_total Things.\n# TYPE n_total counter\nn_total{k=\"v\"} 2\n"
        );
    }

    #[test]
    fn only_a_client_that_asks_for_text_only_gets_it() {
        assert!(!wants_classic_text(None));
        assert!(!wants_classic_text(Some("*/*")));
        assert!(wants_classic_text(Some("text/plain; version=0.0.4")));
        // Prometheus' own scrape header prefers OpenMetrics.
        assert!(!wants_classic_text(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
    }
}
