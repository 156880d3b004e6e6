//! The HTTP API of a client-only agent: requests it cannot answer itself are
//! proxied to a server, as Nomad's client agents do, so `NOMAD_ADDR` may point
//! at any agent.
//!
//! The server to use is the one that last answered the client's node RPCs
//! (its HTTP address travels in the reply). Bodies stream both ways, so
//! blocking queries and the event stream work through the proxy.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client as HyperClient;

/// Where to send what this agent does not serve.
pub trait ServerAddress: Send + Sync + 'static {
    /// A server's HTTP address (`host:port`), if one is known yet.
    fn server_http_addr(&self) -> Option<String>;
}

#[derive(Clone)]
struct Forward {
    target: Arc<dyn ServerAddress>,
    http: HyperClient<crate::tls::AgentConnector, Body>,
}

/// Headers that describe one hop, not the request.
const HOP_BY_HOP: &[&str] = &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "host"];

/// A router whose fallback proxies every other `/v1/...` request to a server.
/// `agent_self` is what `/v1/agent/self` answers locally (this agent's own
/// config and `stats.client.node_id`, which `node status -self` reads).
pub fn router(target: Arc<dyn ServerAddress>, agent_self: serde_json::Value) -> axum::Router {
    let http = crate::tls::agent_http_client_or_plain();
    let me = Arc::new(agent_self);
    axum::Router::new()
        .route("/v1/agent/self", axum::routing::get(move || async move { axum::Json((*me).clone()) }))
        .fallback(forward)
        .with_state(Forward { target, http })
}

async fn forward(State(f): State<Forward>, req: Request) -> Response {
    if !req.uri().path().starts_with("/v1/") {
        return StatusCode::NOT_FOUND.into_response();
    }
    let Some(addr) = f.target.server_http_addr() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "No cluster leader: this client agent has not reached a server yet, so it cannot forward API requests",
        );
    };
    let path_and_query = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let uri: Uri = match format!("{}://{addr}{path_and_query}", crate::tls::agent_scheme()).parse() {
        Ok(u) => u,
        Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("bad server address {addr:?}: {e}")),
    };
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    for h in HOP_BY_HOP {
        parts.headers.remove(*h);
    }
    if let Ok(v) = HeaderValue::from_str(&addr) {
        parts.headers.insert("host", v);
    }
    match f.http.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            for h in HOP_BY_HOP {
                parts.headers.remove(*h);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("forwarding to server {addr}: {e}")),
    }
}

fn plain(code: StatusCode, msg: &str) -> Response {
    let mut r = (code, msg.to_string()).into_response();
    r.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tower::ServiceExt;

    use super::*;

    struct Fixed(Mutex<Option<String>>);

    impl ServerAddress for Fixed {
        fn server_http_addr(&self) -> Option<String> {
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn requests_are_proxied_to_the_known_server_with_status_headers_and_body() {
        let ts = nomad_server::testing::TestServer::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(axum::serve(listener, ts.router()).into_future());
        let target = Arc::new(Fixed(Mutex::new(None)));
        let app = router(target.clone(), serde_json::json!({"stats": {"client": {"node_id": "n1"}}}));
        let me = app.clone().oneshot(Request::get("/v1/agent/self").body(Body::empty()).unwrap()).await.unwrap();
        let me: serde_json::Value = serde_json::from_slice(&axum::body::to_bytes(me.into_body(), usize::MAX).await.unwrap()).unwrap();
        assert_eq!(me["stats"]["client"]["node_id"], "n1", "agent self is answered locally");

        let before = app.clone().oneshot(Request::get("/v1/jobs").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(before.status(), StatusCode::INTERNAL_SERVER_ERROR, "no server known yet: a clear error");

        *target.0.lock().unwrap() = Some(addr);
        let body = serde_json::json!({"Job": serde_json::to_value(nomad_server::testing::job("web", 1)).unwrap()}).to_string();
        let put = app.clone().oneshot(Request::put("/v1/jobs").body(Body::from(body)).unwrap()).await.unwrap();
        assert_eq!(put.status(), StatusCode::OK);
        assert!(put.headers().contains_key("x-nomad-index"));
        let list = app.clone().oneshot(Request::get("/v1/jobs?prefix=we").body(Body::empty()).unwrap()).await.unwrap();
        let bytes = axum::body::to_bytes(list.into_body(), usize::MAX).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v[0]["ID"], "web");
        let missing = app.clone().oneshot(Request::get("/v1/job/nope").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND, "the server's status comes back as is");
        let other = app.oneshot(Request::get("/ui/").body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(other.status(), StatusCode::NOT_FOUND, "only the API is forwarded");
    }
}
