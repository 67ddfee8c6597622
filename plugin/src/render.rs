//! Text for a terminal (kubectl's table style), JSON and YAML.

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use trainwire_contract::world::WorldStatus;

use crate::check_inject::{Report, Verdict};
use crate::status::{World, Worlds};
use crate::{Error, Format, Result};

/// `value` in `format`; `text` makes the text form.
pub fn output<T: Serialize>(
    format: Format,
    value: &T,
    text: impl FnOnce() -> String,
) -> Result<String> {
    match format {
        Format::Text => Ok(text()),
        Format::Json => serde_json::to_string_pretty(value)
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        Format::Yaml => serde_saphyr::to_string(value).map_err(|e| Error::Output(e.to_string())),
    }
}

/// An age as kubectl prints one: `45s`, `12m`, `5h`, `3d`.
pub fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// The age of an RFC 3339 time at `now`; `-` when it does not read.
fn age_of(time: &str, now: Timestamp) -> String {
    time.parse::<Timestamp>()
        .map(|t| age(now.duration_since(t).as_secs()))
        .unwrap_or_else(|_| "-".to_string())
}

/// Left-aligned columns, three spaces apart, as `kubectl get` prints them.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i + 1 < n {
                let pad = widths[i] + 3 - cell.chars().count();
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn last_loss(s: &WorldStatus, now: Timestamp) -> String {
    match &s.last_loss {
        None => "-".to_string(),
        Some(l) => {
            let resumed = match (l.recovery_seconds, &l.closed_by) {
                (Some(r), _) => format!("resumed in {}", age(i64::try_from(r).unwrap_or(i64::MAX))),
                (None, Some(why)) => format!("ended: {why}"),
                (None, None) => "recovering".to_string(),
            };
            format!("{} {} ago, {resumed}", l.subject(), age_of(&l.at, now))
        }
    }
}

fn checkpoint(s: &WorldStatus, now: Timestamp) -> String {
    s.checkpoint
        .as_ref()
        .map_or_else(|| "-".to_string(), |c| age_of(&c.newest_at, now))
}

/// The worlds of a namespace.
pub fn worlds(w: &Worlds, now: Timestamp) -> String {
    if w.worlds.is_empty() {
        return format!("No trainwire worlds in namespace {}.\n", w.namespace);
    }
    let rows: Vec<Vec<String>> = w
        .worlds
        .iter()
        .map(|w| {
            vec![
                format!("{}/{}", w.kind.to_lowercase(), w.name),
                w.status.phase.to_string(),
                format!("{}/{}", w.status.nodes.ready, w.status.nodes.expected),
                w.status.generation.to_string(),
                last_loss(&w.status, now),
                checkpoint(&w.status, now),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "PHASE",
            "READY",
            "LOSSES",
            "LAST LOSS",
            "CHECKPOINT",
        ],
        &rows,
    )
}

/// One world and its ranks.
pub fn world(w: &World, now: Timestamp) -> String {
    let s = &w.status;
    let mut out = String::new();
    let mut field = |k: &str, v: String| out.push_str(&format!("{k:<12}{v}\n"));
    field("World:", format!("{}/{}", w.kind.to_lowercase(), w.name));
    field("Namespace:", w.namespace.clone());
    field("Phase:", s.phase.to_string());
    if let Some(w) = &s.waiting_for {
        field("Waiting:", w.clone());
    }
    field(
        "Nodes:",
        match (s.nodes.spares, s.nodes.expected) {
            // A paused world trains with nothing: no spares to speak of.
            (0, _) | (_, 0) => format!("{}/{} ready", s.nodes.ready, s.nodes.expected),
            (n, _) => format!(
                "{}/{} ready ({n} of them hot spares: trains with {})",
                s.nodes.ready,
                s.nodes.expected,
                s.nodes.expected.saturating_sub(n)
            ),
        },
    );
    if let Some(st) = &s.store {
        field(
            "Store:",
            match (st.pod.as_str(), st.available) {
                ("", _) => "dedicated rendezvous store: no pod".to_string(),
                (pod, true) => format!("{pod} available"),
                (pod, false) => format!("{pod} NOT available"),
            },
        );
    }
    field("Losses:", s.generation.to_string());
    if let Some(l) = &s.last_loss {
        let mut text = format!(
            "{} at {} ({} ago), seen by {}",
            l.subject(),
            l.at,
            age_of(&l.at, now),
            l.detected_by
        );
        match (&l.resumed_at, l.recovery_seconds, &l.closed_by) {
            (Some(at), Some(r), _) => text.push_str(&format!(
                "; training resumed at {at}, {} later ({})",
                age(i64::try_from(r).unwrap_or(i64::MAX)),
                l.resumed_by.as_deref().unwrap_or("observed")
            )),
            (_, _, Some(why)) => {
                text.push_str(&format!("; ended without a resumption seen: {why}"))
            }
            _ => text.push_str("; training not seen running again yet"),
        }
        field("Last loss:", text);
        for a in &l.actions {
            field("", format!("- {a}"));
        }
    }
    if let Some(c) = &s.checkpoint {
        field(
            "Checkpoint:",
            format!(
                "{} ({} old, reported by {} pods)",
                c.name,
                age_of(&c.newest_at, now),
                c.reported_by
            ),
        );
    }
    if let Some(st) = &s.stopped {
        let code = st
            .exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default();
        field(
            "Stopped:",
            format!("{} at {} (pod {}{code})", st.reason, st.at, st.pod),
        );
        field("Resume:", st.resume.clone());
    }
    if !w.recorded {
        field(
            "Status:",
            "no trainwire.dev/world annotation yet (is the webhook's controller running?); live view only".to_string(),
        );
    } else {
        field("Updated:", s.updated_at.clone());
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = w
        .ranks
        .iter()
        .map(|r| {
            let (peers, action) = match &r.peer_loss {
                None => ("-".to_string(), "-".to_string()),
                Some(p) => (
                    match p.action.as_str() {
                        // Its own trainer came back: no peer lost.
                        trainwire_contract::peer_loss::TRAINER_RESTARTED => "-".to_string(),
                        trainwire_contract::peer_loss::SPARE_TOOK_OVER => {
                            format!("took over rank {} (gen {})", p.lost_rank, p.generation)
                        }
                        _ => format!("lost rank {} (gen {})", p.lost_rank, p.generation),
                    },
                    format!("{} {} {} ago", p.action, p.result, age_of(&p.at, now)),
                ),
            };
            vec![
                r.rank.to_string(),
                r.pod.clone(),
                match (r.role, r.torch_rank) {
                    (trainwire_contract::world::Role::Training, Some(t)) => {
                        format!("training (torch rank {t})")
                    }
                    (role, _) => role.to_string(),
                },
                if r.node.is_empty() {
                    "<none>".to_string()
                } else {
                    r.node.clone()
                },
                if r.lost {
                    "Terminating".to_string()
                } else if r.ready {
                    "True".to_string()
                } else {
                    "False".to_string()
                },
                r.restarts.to_string(),
                peers,
                r.checkpoint
                    .as_ref()
                    .map_or_else(|| "-".to_string(), |c| age_of(&c.at, now)),
                action,
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No pods.\n");
    } else {
        out.push_str(&table(
            &[
                "RANK",
                "POD",
                "ROLE",
                "NODE",
                "READY",
                "RESTARTS",
                "PEER VIEW",
                "CHECKPOINT",
                "LAST ACTION",
            ],
            &rows,
        ));
    }
    out
}

/// The check-inject report.
pub fn check(r: &Report) -> String {
    let mut out = String::new();
    let mut field = |k: &str, v: String| out.push_str(&format!("{k:<10}{v}\n"));
    field(
        "Workload:",
        format!("{}/{} in {}", r.kind.to_lowercase(), r.name, r.namespace),
    );
    field(
        "Opt-in:",
        r.opt_in.as_ref().map_or_else(
            || "none".to_string(),
            |v| format!("trainwire.dev/inject: {v:?}"),
        ),
    );
    field(
        "Injected:",
        if r.injected { "yes" } else { "no" }.to_string(),
    );
    field(
        "Policy:",
        format!("profile {:?} from {}", r.profile, r.policy),
    );
    let verdict = match r.verdict {
        Verdict::Inject => "would be injected",
        Verdict::Skip => "would be let through untouched",
        Verdict::Refuse => "would be REFUSED",
    };
    field("Verdict:", format!("{verdict}: {}", r.reason));
    if r.warnings.is_empty() {
        field("Warnings:", "none".to_string());
    } else {
        out.push_str("Warnings:\n");
        for w in &r.warnings {
            out.push_str(&format!("  - {w}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (-5, "0s"),
            (45, "45s"),
            (119, "119s"),
            (120, "2m"),
            (7199, "119m"),
            (7200, "2h"),
            (172_800, "2d"),
        ];
        for (s, want) in cases {
            assert_eq!(age(s), want, "{s}");
        }
    }

    #[test]
    fn a_world_with_spares_says_how_many_it_trains_with() {
        let mut status = WorldStatus::default();
        status.nodes.ready = 3;
        status.nodes.expected = 5;
        status.nodes.spares = 1;
        let w = World {
            kind: "StatefulSet".into(),
            name: "llama".into(),
            namespace: "ml".into(),
            recorded: true,
            status,
            ranks: Vec::new(),
        };
        let text = world(&w, Timestamp::UNIX_EPOCH);
        assert!(
            text.contains("Nodes:      3/5 ready (1 of them hot spares: trains with 4)\n"),
            "{text}"
        );
    }

    #[test]
    fn columns_line_up() {
        let t = table(
            &["A", "BB"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["p".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A     BB\nxyz   1\np     22\n");
    }
}
