//! A fake kube-apiserver over plain HTTP on loopback that answers GETs from
//! recorded responses: `GET /apis/apps/v1/namespaces/ml/statefulsets` is
//! the file `<dir>/apis/apps/v1/namespaces/ml/statefulsets.json`, the query
//! ignored; anything else is the API server's `404 NotFound` Status. For
//! tests that run a real read-only client (the kubectl plugin) through a
//! kubeconfig ([`crate::apiserver::write_kubeconfig`]).

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The running server; stops with the runtime it was started on.
#[derive(Clone)]
pub struct RecordedApiServer {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

struct Shared {
    dir: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
}

impl RecordedApiServer {
    /// Serves `dir` on `127.0.0.1:0` on the current tokio runtime.
    pub async fn start(dir: &Path) -> std::io::Result<RecordedApiServer> {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            requests: requests.clone(),
        });
        let app = Router::new().fallback(answer).with_state(shared);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RecordedApiServer { addr, requests })
    }

    /// Every request so far, `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

async fn answer(State(shared): State<Arc<Shared>>, method: Method, uri: Uri) -> Response {
    let path = uri.path();
    if let Ok(mut r) = shared.requests.lock() {
        r.push(format!("{method} {path}"));
    }
    // Only plain path segments: never a file outside `dir`.
    let relative = Path::new(path.trim_start_matches('/'));
    let plain = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    let file = shared.dir.join(format!("{}.json", relative.display()));
    let body = if method == Method::GET && plain {
        std::fs::read(&file).ok()
    } else {
        None
    };
    match body {
        Some(bytes) => (
            StatusCode::OK,
            [("content-type", "application/json")],
            bytes,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "NotFound", "code": 404, "message": format!("{path} not found")
            })),
        )
            .into_response(),
    }
}
