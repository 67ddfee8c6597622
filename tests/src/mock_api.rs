//! A mock Kubernetes API server for controller tests (kube-rs's `tower-test`
//! pattern): the test sees every request the code under test makes (method,
//! path, query, body) and answers it as a kube-apiserver would; every wait is
//! bounded, so a request the test does not expect fails the test instead of
//! hanging it.

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::Value;

/// A bound on every wait.
pub const BOUND: Duration = Duration::from_secs(30);

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A client whose requests reach the returned [`ApiServer`].
pub fn pair() -> (kube::Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), ApiServer(handle))
}

/// One request the code under test made.
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
    respond: tower_test::mock::SendResponse<Response<Body>>,
}

impl Call {
    /// Answer it with `status` and a JSON body.
    pub fn reply(self, status: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap_or_default()));
        match response {
            Ok(r) => self.respond.send_response(r),
            Err(e) => self.respond.send_error(e),
        }
    }
}

/// The mock API server's side.
pub struct ApiServer(Handle);

impl ApiServer {
    /// The next request; fails after [`BOUND`] instead of hanging.
    pub async fn next(&mut self) -> Result<Call> {
        let (request, respond) = tokio::time::timeout(BOUND, self.0.next_request())
            .await
            .context("no further request was made")?
            .context("the client is gone")?;
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).context("request body is not JSON")?
        };
        Ok(Call {
            method: parts.method,
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string(),
            body,
            respond,
        })
    }

    /// The next request, which must be `method path`.
    pub async fn expect(&mut self, method: Method, path: &str) -> Result<Call> {
        let call = self.next().await?;
        ensure!(
            call.method == method && call.path == path,
            "expected {method} {path}, got {} {}?{}",
            call.method,
            call.path,
            call.query
        );
        Ok(call)
    }

    /// An Event in `namespace` with this reason about an object of this kind,
    /// answered as created; its body.
    pub async fn event(
        &mut self,
        namespace: &str,
        reason: &str,
        regarding_kind: &str,
    ) -> Result<Value> {
        let call = self
            .expect(
                Method::POST,
                &format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"),
            )
            .await?;
        ensure!(
            call.body["reason"] == reason,
            "event {}: expected {reason}",
            call.body
        );
        ensure!(
            call.body["regarding"]["kind"] == regarding_kind,
            "regarding {}",
            call.body["regarding"]
        );
        let body = call.body.clone();
        call.reply(StatusCode::CREATED, &body);
        Ok(body)
    }

    /// The client was dropped after no other request.
    pub async fn done(mut self) -> Result<()> {
        match tokio::time::timeout(BOUND, self.0.next_request()).await {
            Ok(None) => Ok(()),
            Ok(Some((r, _))) => bail!("unexpected request {} {}", r.method(), r.uri()),
            Err(_) => bail!("the client was never released"),
        }
    }
}
