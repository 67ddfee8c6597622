//! One future that completes on SIGTERM (what the kubelet sends) or SIGINT.

/// Wait for SIGTERM or SIGINT; returns the signal's name. When a handler
/// cannot be installed, that is logged and Ctrl-C (SIGINT) is waited for.
pub async fn signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }
        (term, int) => {
            let error = term.err().or(int.err()).map(|e| e.to_string());
            tracing::warn!(
                error = error.as_deref().unwrap_or_default(),
                "cannot listen for SIGTERM/SIGINT; waiting for Ctrl-C only"
            );
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
