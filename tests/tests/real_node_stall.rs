//! A hung world on a real node (issue 40, docs/real-node.md): trainwire
//! installed from its images, real `torchrun` + `examples/train.py`
//! (CPU/gloo) in a StatefulSet of 2 with a dedicated store, the trainer as
//! root, `trainwire.dev/stall-timeout: 20s` and otherwise the defaults
//! (`on-stall: restart-workers`). One worker of the pod of torch's rank 0 is
//! stopped (SIGSTOP), then one of the other pod: every process stays alive,
//! every pod Ready, every heartbeat answers. Then a world of 2 with a hot
//! spare beside it: one worker of rank 0's pod stopped.
//!
//! For each it prints one line (when a sidecar's `/status` showed the
//! stall, by whom, the first training step after it and the checkpoint it
//! resumed from, the world status's `lastStall`, the `WorldStalled` Events,
//! the `stalls_total` metric, the workers' Python stacks in the trainer's
//! log), then asserts: found within the timeout + 5 s, training again from
//! the newest checkpoint within the timeout + 15 s, the stall shown in
//! `/status`, the world status, an Event and the metric, and the stopped
//! worker's Python stack in its pod's trainer log.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use trainwire_tests::real_node::world::{
    Shape, World, fmt_rel, prepare_trainer, require_node_and_torch, secs, time_of, workers,
};
use trainwire_tests::real_node::{self, RealNode};

const TEST: &str = "real_node_stall";
const STALL_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn real_node_stall() {
    if !require_node_and_torch(TEST) {
        return;
    }
    let started = Instant::now();
    let node = RealNode::start("stall").unwrap_or_else(|e| panic!("real node: {e}"));
    let install = node
        .install_trainwire()
        .unwrap_or_else(|e| panic!("install: {e}\n{}", node.component_log("kubelet", 20)));
    prepare_trainer(&node).unwrap_or_else(|e| panic!("{e}"));
    let world = World::create(&node, &install, "rn-stall", stalling(0))
        .unwrap_or_else(|e| panic!("world: {e}"));
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    let result = (|| -> Result<(), String> {
        let rank0 = world.rank0_pod()?;
        stop_a_worker(&world, &rank0, "rank 0's pod", &mut lines, &mut failures)?;
        world.wait_steady(Duration::from_secs(90))?;
        let rank0 = world.rank0_pod()?;
        let other = world
            .agents()
            .into_keys()
            .find(|p| *p != rank0)
            .ok_or("no second training pod")?;
        stop_a_worker(&world, &other, "the other pod", &mut lines, &mut failures)
    })();
    if let Err(e) = result {
        failures.push(format!("the scenarios stopped: {e}"));
    }
    world.remove();
    // The same with a hot spare waiting beside the world: its agent runs no
    // workers, and the restart leaves it waiting.
    match World::create(&node, &install, "rn-stall-spare", stalling(1)) {
        Ok(spared) => {
            let result = spared.rank0_pod().and_then(|rank0| {
                stop_a_worker(
                    &spared,
                    &rank0,
                    "rank 0's pod, beside a spare",
                    &mut lines,
                    &mut failures,
                )
            });
            if let Err(e) = result {
                failures.push(format!("the world with a spare: {e}"));
            }
            spared.remove();
        }
        Err(e) => failures.push(format!("the world with a spare: {e}")),
    }
    eprintln!(
        "\nreal node stall figures (whole test {:.0} s):",
        started.elapsed().as_secs_f64()
    );
    for line in &lines {
        eprintln!("{line}");
    }
    drop(node);
    assert!(
        failures.is_empty(),
        "{} of issue 40's goals failed on the real node:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

/// A world of 2 with `spares` hot spares, a root trainer and
/// `trainwire.dev/stall-timeout` at [`STALL_TIMEOUT`], the defaults
/// otherwise.
fn stalling(spares: u32) -> Shape {
    Shape {
        user: None,
        spares,
        store_in_pod0: false,
        annotations: vec![(
            "trainwire.dev/stall-timeout",
            format!("{}s", STALL_TIMEOUT.as_secs()),
        )],
    }
}

/// The `WorldStalled` Events of the world's namespace, each counted as
/// often as it was reported: an Event repeated by the same sidecar is one
/// object whose `series.count` grows (events.k8s.io/v1; `count` is the
/// core/v1 view's, which a series does not move).
fn stall_events(world: &World<'_>) -> u64 {
    world
        .events("WorldStalled")
        .iter()
        .map(|e| {
            let count = e["count"].as_u64().unwrap_or(1);
            let series = e["series"]["count"].as_u64().unwrap_or(0);
            count.max(series).max(1)
        })
        .sum()
}

/// Each sidecar's `/status` view of the progress (its idle time, stuck
/// workers and last stall with its detail), one line per pod.
fn progress_views(world: &World<'_>) -> String {
    world
        .pods()
        .iter()
        .map(|(name, p)| match world.sidecar_status(p) {
            Some(status) => format!("    {name}: {}", status["progress"]),
            None => format!("    {name}: no /status answer"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `stalls_total` summed over its labels, from a sidecar's `/metrics`.
fn stalls_total(world: &World<'_>, pod: &Value) -> Option<f64> {
    let text = trainwire_tests::net::http_get(&world.sidecar_addr(pod)?, "/metrics")?;
    Some(
        text.lines()
            .filter(|l| l.contains("stalls_total{") && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// Stops one worker of `pod`, then measures and checks what follows.
fn stop_a_worker(
    world: &World<'_>,
    pod: &str,
    which: &str,
    lines: &mut Vec<String>,
    failures: &mut Vec<String>,
) -> Result<(), String> {
    let agents = world.agents();
    let (_, ws) = agents
        .get(pod)
        .ok_or_else(|| format!("no trainer in {pod}"))?;
    let worker = *ws.first().ok_or_else(|| format!("no worker in {pod}"))?;
    // After a checkpoint, so that the newest one is known.
    let events_before = stall_events(world);
    let pods = world.pods();
    let metric_before: f64 = pods.values().filter_map(|p| stalls_total(world, p)).sum();
    // The newest checkpoint at the stop: wait for one (every 25 steps).
    let checkpoint = real_node::poll(
        "a checkpoint before the stop",
        Duration::from_secs(60),
        || world.latest_checkpoint(),
    )?;
    let at = SystemTime::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(worker),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .map_err(|e| format!("SIGSTOP {worker}: {e}"))?;

    // Found: a sidecar's /status shows a stall after the stop.
    let mut found: Option<(SystemTime, String, Value)> = None;
    // The sidecar that acted: one still in its cooldown finds it too, and
    // acts when the cooldown ends if no other did.
    let mut acted: Option<(SystemTime, String)> = None;
    let mut first: Option<(SystemTime, String)> = None;
    let mut world_stall = Value::Null;
    let hard = at + STALL_TIMEOUT + Duration::from_secs(60);
    loop {
        let now = SystemTime::now();
        if found.is_none() || acted.is_none() {
            for (name, p) in world.pods() {
                if let Some(status) = world.sidecar_status(&p) {
                    let stall = &status["progress"]["last_stall"];
                    if time_of(&stall["at"]).is_some_and(|t| t >= at) {
                        if found.is_none() {
                            found = Some((now, name.clone(), stall.clone()));
                        }
                        if acted.is_none()
                            && stall["action"] == "restart-workers"
                            && stall["result"] == "signalled"
                        {
                            acted = Some((now, name));
                        }
                    }
                }
            }
        }
        if first.is_none() {
            first = world.first_start_after(at);
        }
        let w = world.world();
        if time_of(&w["lastStall"]["at"]).is_some_and(|t| t >= at) {
            world_stall = w["lastStall"].clone();
        }
        if (found.is_some() && acted.is_some() && first.is_some() && !world_stall.is_null())
            || now > hard
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let events = stall_events(world);
    let metric_after: f64 = world
        .pods()
        .values()
        .filter_map(|p| stalls_total(world, p))
        .sum();
    // The workers' Python stacks, dumped into the trainer's log before
    // their restart (faulthandler, asked by the sidecar).
    let stacks: Vec<(String, String)> = world
        .node
        .log_lines(&world.ns, real_node::world::STS, "trainer")
        .into_iter()
        .filter(|(t, _, l)| *t >= at && l.contains("File \"/train/train.py\""))
        .map(|(_, p, l)| (p, l))
        .collect();
    let stack_in_pod = stacks.iter().any(|(p, _)| p == pod);
    let resumed_from = first.as_ref().and_then(|(_, l)| {
        l.split_whitespace()
            .find_map(|kv| kv.strip_prefix("resumed_from="))
            .and_then(|v| v.parse::<u64>().ok())
    });
    let label = format!("root SIGSTOP a worker of {which} ({pod}, pid {worker})");
    lines.push(format!(
        "{label}: found {} by {} ({}), workers restarted by {}; first step {} resumed_from {} (newest checkpoint at the stop {checkpoint}); world lastStall {}; WorldStalled Events +{}; stalls_total {} -> {}; Python stack lines in the log {} (in {pod}: {stack_in_pod})",
        fmt_rel(found.as_ref().map(|f| f.0), at),
        found.as_ref().map_or("-", |f| f.1.as_str()),
        found
            .as_ref()
            .map_or(String::new(), |f| format!("{} {}", f.2["action"], f.2["result"])),
        acted
            .as_ref()
            .map_or("nobody".to_string(), |(t, p)| format!("{p} (seen {})", fmt_rel(Some(*t), at))),
        fmt_rel(first.as_ref().map(|f| f.0), at),
        resumed_from.map_or("-".to_string(), |r| r.to_string()),
        world_stall,
        events.saturating_sub(events_before),
        metric_before,
        metric_after,
        stacks.len(),
    ));
    let mut fail = |what: String| failures.push(format!("{label}: {what}"));
    match &found {
        Some((t, _, stall)) => {
            if secs(*t, at) > (STALL_TIMEOUT + Duration::from_secs(5)).as_secs_f64() {
                fail(format!(
                    "found {} after the stop, later than the timeout + 5 s",
                    fmt_rel(Some(*t), at)
                ));
            }
            if acted.is_none() {
                fail(format!(
                    "no sidecar restarted the workers (the first to find it: {stall}); each sidecar's progress now:\n{}",
                    progress_views(world)
                ));
            }
        }
        None => fail(format!(
            "no sidecar showed the stall within {:?}; since the stop:\n{}",
            hard.duration_since(at).unwrap_or_default(),
            world.since(at)
        )),
    }
    match &first {
        Some((t, _)) if secs(*t, at) <= (STALL_TIMEOUT + Duration::from_secs(15)).as_secs_f64() => {
        }
        other => fail(format!(
            "training stepped again {} after the stop, not within the timeout + 15 s",
            fmt_rel(other.as_ref().map(|f| f.0), at)
        )),
    }
    if resumed_from.is_none_or(|r| r < checkpoint) {
        fail(format!(
            "resumed from {resumed_from:?}, not from the newest checkpoint ({checkpoint}) or later"
        ));
    }
    if world_stall.is_null() {
        fail("the world status shows no lastStall after the stop".into());
    }
    if events <= events_before {
        fail("no new WorldStalled Event".into());
    }
    if metric_after <= metric_before {
        fail(format!(
            "stalls_total did not grow ({metric_before} -> {metric_after})"
        ));
    }
    if !stack_in_pod {
        fail(format!(
            "no Python stack of the stopped worker in {pod}'s trainer log"
        ));
    }
    // The stopped worker is gone (restarted), not left stopped.
    if workers(world.agents().get(pod).map_or(0, |a| a.0)).contains(&worker) {
        fail(format!("worker {worker} is still there"));
    }
    Ok(())
}
