//! A child's output, read off its pipe without blocking the test forever.

use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

/// Reads lines from `pipe` (a child's stderr, say) on a thread until
/// `enough(lines so far)` holds, the pipe closes or `limit` passes; returns
/// the lines read by then (bytes kept as they are, lossily as UTF-8).
pub fn read_lines_until(
    pipe: impl Read + Send + 'static,
    limit: Duration,
    enough: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.send(String::from_utf8_lossy(&buf).into_owned()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let deadline = Instant::now() + limit;
    let mut lines = Vec::new();
    while !enough(&lines) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => lines.push(line),
            Err(_) => break,
        }
    }
    lines
}

/// Whether `text` holds an ANSI escape sequence (colour codes and the like).
pub fn has_ansi(text: &str) -> bool {
    text.contains("\x1b[")
}
