//! One shutdown future over SIGTERM and SIGINT.

/// Resolves on the first SIGTERM or SIGINT. If a handler cannot be
/// installed, that signal is simply not waited for.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await
            }
        }
    };
    let int = async {
        match signal(SignalKind::interrupt()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGINT");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM: shutting down"),
        _ = int => tracing::info!("SIGINT: shutting down"),
    }
}
