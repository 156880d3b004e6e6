//! `GET /v1/agent/health` and the agent's root: `GET /` redirects to `/ui/`, which says there is
//! no web UI. These answer for the whole agent, whatever roles it runs, so the agent merges this
//! router beside the server's and the client's.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde::Serialize;

use super::util::{HttpError, QueryOptions, json_response, require_method};

/// One role's health check: `Ok` or why it is not healthy.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The health checks of the roles this agent runs; `None` for a role it does not run.
#[derive(Clone, Default)]
pub struct AgentHealth {
    /// The server role: healthy when a leader is known.
    pub server: Option<HealthCheck>,
    /// The client role: healthy when it knows servers.
    pub client: Option<HealthCheck>,
}

/// One role in the answer (`healthResponseAgent`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
struct RoleHealth {
    ok: bool,
    message: String,
}

/// The answer: a role the agent does not run is left out (`healthResponse`).
#[derive(Debug, Clone, Serialize, Default, PartialEq, Eq)]
struct HealthResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<RoleHealth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<RoleHealth>,
}

/// What `/ui/` answers: nomad-rs has no web UI.
pub const NO_UI_TEXT: &str = "nomad-rs has no web UI.\n\nUse the nomad-rs command line (`nomad-rs status`, `nomad-rs job status`, ...) or the HTTP API under /v1/ (for example /v1/jobs).\n";

/// `/v1/agent/health`, `/` and `/ui/` (no fallback: the agent's other routers keep theirs).
pub fn router(health: AgentHealth) -> Router {
    Router::new()
        .route("/v1/agent/health", any(agent_health))
        .with_state(Arc::new(health))
        .route("/", any(root))
        .route("/ui", any(|| async { redirect(StatusCode::MOVED_PERMANENTLY, "/ui/".to_string()) }))
        .route("/ui/", any(no_ui))
        .route("/ui/{*rest}", any(no_ui))
}

/// `GET /v1/agent/health[?type=client|server]`: 200 with each role's health when all are ok, else
/// 500 with the same JSON as text (Nomad's coded error). Asking for a role the agent does not run
/// reports it not ok.
async fn agent_health(State(health): State<Arc<AgentHealth>>, method: Method, uri: Uri) -> Response {
    let answer = || -> Result<Response, HttpError> {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let asked: &[String] = q.multi.get("type").map_or(&[], Vec::as_slice);
        let (want_client, want_server) =
            if asked.is_empty() { (true, true) } else { (asked.iter().any(|t| t == "client"), asked.iter().any(|t| t == "server")) };
        let judge = |check: &Option<HealthCheck>, want: bool, missing: &str| match (want, check) {
            (false, _) => None,
            (true, None) if asked.is_empty() => None,
            (true, None) => Some(RoleHealth { ok: false, message: missing.to_string() }),
            (true, Some(check)) => Some(match check() {
                Ok(()) => RoleHealth { ok: true, message: "ok".into() },
                Err(message) => RoleHealth { ok: false, message },
            }),
        };
        let body = HealthResponse {
            client: judge(&health.client, want_client, "client not enabled"),
            server: judge(&health.server, want_server, "server not enabled"),
        };
        if [&body.client, &body.server].into_iter().flatten().all(|r| r.ok) {
            return json_response(&body, None, q.pretty);
        }
        let text = serde_json::to_string(&body).unwrap_or_default();
        Err(HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: text })
    };
    answer().unwrap_or_else(IntoResponse::into_response)
}

/// Any request for `/` goes to `/ui/` with its query (307, as Nomad's agent).
async fn root(uri: Uri) -> Response {
    let target = match uri.query() {
        Some(q) if !q.is_empty() => format!("/ui/?{q}"),
        _ => "/ui/".to_string(),
    };
    redirect(StatusCode::TEMPORARY_REDIRECT, target)
}

fn redirect(code: StatusCode, location: String) -> Response {
    (code, [(header::LOCATION, location), (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string())]).into_response()
}

async fn no_ui() -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], NO_UI_TEXT).into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::{Value, json};
    use tower::ServiceExt;

    use super::*;

    fn check(result: Result<(), &'static str>) -> Option<HealthCheck> {
        Some(Arc::new(move || result.map_err(str::to_string)))
    }

    async fn call(health: &AgentHealth, method: Method, path: &str) -> (StatusCode, axum::http::HeaderMap, String) {
        let req = Request::builder().method(method).uri(path).body(Body::empty()).unwrap();
        let resp = router(health.clone()).oneshot(req).await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    fn parse(body: &str) -> Value {
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    #[tokio::test]
    async fn health_reports_each_role_the_agent_runs_in_nomads_shape() {
        let dev = AgentHealth { server: check(Ok(())), client: check(Ok(())) };
        let (status, headers, body) = call(&dev, Method::GET, "/v1/agent/health").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(parse(&body), json!({"client": {"ok": true, "message": "ok"}, "server": {"ok": true, "message": "ok"}}));

        // A role the agent does not run is left out.
        let client_only = AgentHealth { server: None, client: check(Ok(())) };
        let (status, _, body) = call(&client_only, Method::GET, "/v1/agent/health").await;
        assert_eq!((status, parse(&body)), (StatusCode::OK, json!({"client": {"ok": true, "message": "ok"}})));

        // Not ok: 500, the same JSON as the error's text.
        let leaderless = AgentHealth { server: check(Err("no leader")), client: check(Ok(())) };
        let (status, headers, body) = call(&leaderless, Method::GET, "/v1/agent/health").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
        assert_eq!(parse(&body), json!({"client": {"ok": true, "message": "ok"}, "server": {"ok": false, "message": "no leader"}}));

        // ?type= asks for one role; asking for one the agent lacks fails.
        let (status, _, body) = call(&leaderless, Method::GET, "/v1/agent/health?type=client").await;
        assert_eq!((status, parse(&body)), (StatusCode::OK, json!({"client": {"ok": true, "message": "ok"}})));
        let (status, _, body) = call(&client_only, Method::GET, "/v1/agent/health?type=server").await;
        assert_eq!(
            (status, parse(&body)),
            (StatusCode::INTERNAL_SERVER_ERROR, json!({"server": {"ok": false, "message": "server not enabled"}}))
        );

        let (status, _, body) = call(&dev, Method::PUT, "/v1/agent/health").await;
        assert_eq!((status, body.as_str()), (StatusCode::METHOD_NOT_ALLOWED, "Invalid method"));
    }

    #[tokio::test]
    async fn the_root_redirects_to_a_page_that_says_there_is_no_web_ui() {
        let health = AgentHealth::default();
        let (status, headers, _) = call(&health, Method::GET, "/").await;
        assert_eq!((status, headers["location"].to_str().unwrap()), (StatusCode::TEMPORARY_REDIRECT, "/ui/"));
        let (status, headers, _) = call(&health, Method::GET, "/?region=eu").await;
        assert_eq!((status, headers["location"].to_str().unwrap()), (StatusCode::TEMPORARY_REDIRECT, "/ui/?region=eu"));
        let (status, headers, _) = call(&health, Method::GET, "/ui").await;
        assert_eq!((status, headers["location"].to_str().unwrap()), (StatusCode::MOVED_PERMANENTLY, "/ui/"));
        for path in ["/ui/", "/ui/jobs"] {
            let (status, headers, body) = call(&health, Method::GET, path).await;
            assert_eq!((status, body.as_str()), (StatusCode::OK, NO_UI_TEXT), "{path}");
            assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
        }
    }
}
