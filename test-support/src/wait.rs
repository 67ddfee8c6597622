//! Bounded waits on an event, instead of sleeps that assume a timing.

use std::time::{Duration, Instant};

/// Polls `pred` every `every` until it holds (`true`) or `limit` passes (`false`).
pub fn wait_for(limit: Duration, every: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if pred() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// Waits (bounded) until `pred` holds; panics naming `what` otherwise.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, pred: impl FnMut() -> bool) {
    wait_until_or(what, limit, String::new, pred);
}

/// [`wait_until`], and on timeout the panic also carries `context()` (a log,
/// the last status).
#[track_caller]
pub fn wait_until_or(
    what: &str,
    limit: Duration,
    context: impl FnOnce() -> String,
    pred: impl FnMut() -> bool,
) {
    if !wait_for(limit, Duration::from_millis(50), pred) {
        panic!(
            "timed out after {limit:?} waiting for: {what}\n{}",
            context()
        );
    }
}

/// Polls `get` until `pred` holds on what it returned; on timeout, `Err`
/// carries the last value seen.
pub fn wait_value<T: std::fmt::Debug>(
    limit: Duration,
    every: Duration,
    mut get: impl FnMut() -> Option<T>,
    pred: impl Fn(&T) -> bool,
) -> Result<T, Option<T>> {
    let start = Instant::now();
    let mut last = None;
    loop {
        if let Some(v) = get() {
            if pred(&v) {
                return Ok(v);
            }
            last = Some(v);
        }
        if start.elapsed() >= limit {
            return Err(last);
        }
        std::thread::sleep(every);
    }
}
