//! The one plain-HTTP port: `/healthz`, `/readyz`, `/status`, `/metrics`,
//! `/heartbeat` (which peers probe) and `/probe/{rank}` (a peer asks this
//! sidecar to probe a silent peer before declaring it lost).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::heartbeat::{Beat, ProbeRefused, Prober};
use crate::status::Shared;

/// The sidecar's HTTP routes; `/probe/{rank}` only with a `prober` (a
/// peer host pattern is configured).
pub fn router(shared: Arc<Shared>, prober: Option<Prober>) -> Router {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/heartbeat", get(heartbeat))
        .route(
            "/progress",
            get(|State(shared): State<Arc<Shared>>| async move {
                Json(crate::progress::answer(&shared))
            }),
        )
        .with_state(shared);
    match prober {
        Some(prober) => app.merge(
            Router::new()
                .route("/probe/{rank}", get(probe))
                .with_state(prober),
        ),
        None => app,
    }
}

async fn probe(State(prober): State<Prober>, Path(rank): Path<u32>) -> Response {
    match prober.reach(rank).await {
        Ok(reach) => Json(reach).into_response(),
        Err(e @ ProbeRefused::NoSuchRank { .. }) => {
            (StatusCode::NOT_FOUND, format!("{e}\n")).into_response()
        }
        Err(e @ ProbeRefused::Busy) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if shared.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

async fn status(State(shared): State<Arc<Shared>>) -> Response {
    let controllers = match shared.world_reader() {
        Some(reader) => {
            reader
                .refresh(crate::world::STATUS_MAX_AGE, crate::world::STATUS_WAIT)
                .await;
            Some(reader.seen())
        }
        None => None,
    };
    let mut doc = shared.status().clone();
    doc.world.controllers = controllers;
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
    shared.metrics.heartbeats_served.inc();
    let c = &shared.config;
    Json(Beat {
        pod: c.pod_name.clone(),
        uid: c.pod_uid.clone(),
        start_time: shared.started_text.clone(),
        rank: c.node_rank,
        generation: shared.generation(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::env;
    use http_body_util::BodyExt;
    use tower_service::Service;

    async fn get(app: &mut Router, path: &str) -> (StatusCode, String) {
        let req = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        let resp = app.call(req).await.expect("infallible");
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// `/probe/{rank}`: this sidecar's own rank is reachable, a rank of no
    /// pod is refused, a peer that does not answer is unreachable; each
    /// heartbeat answered is counted.
    #[tokio::test]
    async fn probe_answers_for_a_peer() {
        let config = Config::from_source(
            [
                (env::NNODES, "3"),
                (env::NODE_RANK, "1"),
                // Nothing listens there.
                (env::PEER_HOSTS, "127.0.0.9{i}"),
                (env::HEALTH_PORT, "9"),
                (env::HEARTBEAT_INTERVAL, "200ms"),
            ]
            .as_slice(),
        )
        .expect("config");
        let shared = Shared::new(config.clone());
        let resolver = crate::dns::Resolver::table(Default::default());
        let prober = Prober::new(config, resolver, Default::default());
        let mut app = router(shared.clone(), Some(prober));
        let (status, body) = get(&mut app, "/probe/1").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(r#""reachable":true"#), "{body}");
        let (status, _) = get(&mut app, "/probe/3").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = get(&mut app, "/probe/x").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, body) = get(&mut app, "/probe/0").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(r#""reachable":false"#), "{body}");
        let (status, _) = get(&mut app, "/heartbeat").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(shared.metrics.heartbeats_served.get(), 1);
        // Without a peer host pattern there is no /probe.
        let mut plain = router(shared, None);
        let (status, _) = get(&mut plain, "/probe/0").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
}
