//! The one plain-HTTP port: `/healthz`, `/readyz`, `/status`, `/metrics`
//! and `/heartbeat` (which peers probe).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::heartbeat::Beat;
use crate::status::Shared;

/// The sidecar's HTTP routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/heartbeat", get(heartbeat))
        .with_state(shared)
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let doc = shared.status().clone();
    Json(doc).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: axum::http::HeaderMap) -> Response {
    use trainwire_runtime::exposition;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if exposition::wants_classic_text(accept) {
        return (
            [(header::CONTENT_TYPE, exposition::PROMETHEUS_TEXT)],
            exposition::classic_text(&shared.encode_metrics()),
        )
            .into_response();
    }
    (
        [(header::CONTENT_TYPE, exposition::OPENMETRICS)],
        shared.encode_metrics(),
    )
        .into_response()
}

async fn heartbeat(State(shared): State<Arc<Shared>>) -> Json<Beat> {
    let c = &shared.config;
    Json(Beat {
        pod: c.pod_name.clone(),
        uid: c.pod_uid.clone(),
        start_time: shared.started_text.clone(),
        rank: c.node_rank,
        generation: shared.generation(),
    })
}
