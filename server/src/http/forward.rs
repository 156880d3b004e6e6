//! API requests a follower may not answer go to the leader as they arrived.
//!
//! Writes (and plans, which must see the leader's state) are carried out only by the leader. A
//! follower does not turn such a request into a state command and ship that (a command carries
//! no caller and would be written unchecked); it hands the original HTTP request (method, path,
//! headers with the caller's `X-Nomad-Token`, body) to the leader over the server-only
//! `nomad.server.Forward/Http` RPC, and the leader runs it through its own router: the request is
//! checked and authorized exactly as if it had arrived there. A forwarded request is marked, so
//! it travels one hop at most: a server that lost the leadership meanwhile answers it itself
//! (`No cluster leader`) rather than passing it on.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use tower::ServiceExt as _;

use super::util::{HttpError, MAX_BODY_BYTES, read_body};
use crate::consensus::Consensus;
use crate::rpc::Peers;

#[allow(missing_docs, clippy::all)]
pub(crate) mod generated {
    include!(concat!(env!("OUT_DIR"), "/nomad.server.Forward.rs"));
}

use generated::forward_client::ForwardClient;
pub use generated::forward_server::{Forward as ForwardRpc, ForwardServer};

/// How long a follower waits for a leader to be known before it answers `No cluster leader`
/// (Nomad holds an RPC as long while there is none).
pub const LEADER_HOLD: Duration = Duration::from_secs(5);

/// How often the wait for a leader looks again.
const LEADER_RECHECK: Duration = Duration::from_millis(50);

/// Largest answer taken back from the leader.
const MAX_RESPONSE_BYTES: usize = 128 * 1024 * 1024;

/// Headers that describe one hop, not the request.
const HOP_BY_HOP: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "host", "content-length"];

/// An API request as a follower received it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedRequest {
    /// HTTP method.
    pub method: String,
    /// Path and query string.
    pub path_and_query: String,
    /// Headers (the caller's credentials among them), hop-by-hop ones left out.
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body: String,
}

/// The leader's answer to a [`ForwardedRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedResponse {
    /// HTTP status.
    pub status: u16,
    /// Headers, hop-by-hop ones left out.
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body: String,
}

/// Marks a request that another server forwarded here (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct Forwarded;

/// Whether a request must be answered by the leader: every write, and `Job.Plan` (a dry run of
/// the scheduler on the leader's state). Parsing and validating a job need no state, a join is
/// this server's own, and reads
/// are answered from this server's state, as Nomad's `stale` reads are.
pub fn needs_leader(method: &Method, path: &str) -> bool {
    let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    let stateless = path == "/v1/jobs/parse" || path.starts_with("/v1/validate/");
    // A join is about this server (it may not be in a cluster yet, so have no leader).
    let local = path == "/v1/agent/join";
    !read && !stateless && !local
}

/// Reads only the leader answers: a snapshot save, unless the caller allows a stale one
/// (`?stale`, Nomad's `AllowStale`), so a backup holds everything committed.
pub fn read_needs_leader(method: &Method, uri: &axum::http::Uri) -> bool {
    *method == Method::GET
        && uri.path() == "/v1/operator/snapshot"
        && !uri.query().unwrap_or_default().split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == "stale" && value != "false"
        })
}

/// The follower half: passes requests that need the leader to it.
pub struct LeaderForwarder {
    consensus: Arc<dyn Consensus>,
    peers: Peers,
    hold: Duration,
}

impl LeaderForwarder {
    /// Forwards through `peers` (whose calls carry the server proof) to the leader `consensus` knows.
    pub fn new(consensus: Arc<dyn Consensus>, peers: Peers) -> Arc<LeaderForwarder> {
        Arc::new(LeaderForwarder { consensus, peers, hold: LEADER_HOLD })
    }

    /// The leader's RPC address once one is known, or `None` if this server leads (or comes to)
    /// or no leader appears within the hold time.
    async fn leader(&self) -> Result<Option<String>, HttpError> {
        let deadline = tokio::time::Instant::now() + self.hold;
        loop {
            if self.consensus.is_leader() {
                return Ok(None);
            }
            if let Some(addr) = self.consensus.leader_rpc_addr() {
                return Ok(Some(addr));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(internal("No cluster leader"));
            }
            tokio::time::sleep(LEADER_RECHECK).await;
        }
    }

    async fn send(&self, leader: &str, request: ForwardedRequest) -> Result<ForwardedResponse, tonic::Status> {
        let channel = self.peers.channel(leader)?;
        let mut client = ForwardClient::with_interceptor(channel, self.peers.stamp())
            .max_decoding_message_size(nomad_proto::rpc::codec::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(nomad_proto::rpc::codec::MAX_MESSAGE_BYTES);
        client.http(request).await.map(tonic::Response::into_inner)
    }

    /// Sends `request` to the leader and returns its answer. A leader that refuses the
    /// connection (it just died) is looked up again until the hold time runs out; a call that
    /// may have reached it is never sent twice.
    async fn forward(&self, request: ForwardedRequest) -> Result<Option<ForwardedResponse>, HttpError> {
        let deadline = tokio::time::Instant::now() + self.hold;
        loop {
            let Some(leader) = self.leader().await? else { return Ok(None) };
            match self.send(&leader, request.clone()).await {
                Ok(answer) => return Ok(Some(answer)),
                Err(status) if crate::raft::never_sent(&status) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(leader, error = %status.message(), "leader unreachable, looking again");
                    tokio::time::sleep(LEADER_RECHECK).await;
                }
                Err(status) => {
                    return Err(internal(format!("forwarding to the leader at {leader}: {}", status.message())));
                }
            }
        }
    }
}

/// The middleware on a server's API routes (see the module docs).
pub async fn to_leader(State(forwarder): State<Arc<LeaderForwarder>>, request: Request, next: Next) -> Response {
    if request.extensions().get::<Forwarded>().is_some()
        || !(needs_leader(request.method(), request.uri().path()) || read_needs_leader(request.method(), request.uri()))
        || forwarder.consensus.is_leader()
    {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let forwarded = ForwardedRequest {
        method: parts.method.to_string(),
        path_and_query: parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers: header_pairs(&parts.headers),
        body: BASE64.encode(&body),
    };
    match forwarder.forward(forwarded).await {
        Ok(Some(answer)) => into_response(answer).unwrap_or_else(IntoResponse::into_response),
        // This server leads now: answer it here.
        Ok(None) => next.run(Request::from_parts(parts, Body::from(body))).await,
        Err(e) => e.into_response(),
    }
}

fn internal(message: impl Into<String>) -> HttpError {
    HttpError { code: StatusCode::INTERNAL_SERVER_ERROR, message: message.into() }
}

fn header_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

fn header_map(pairs: &[(String, String)]) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let name = HeaderName::try_from(name.as_str()).map_err(|e| format!("header {name:?}: {e}"))?;
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        headers.append(name, HeaderValue::try_from(value.as_str()).map_err(|e| format!("header value {value:?}: {e}"))?);
    }
    Ok(headers)
}

fn into_response(answer: ForwardedResponse) -> Result<Response, HttpError> {
    let bad = |what: String| internal(format!("the leader's answer is malformed: {what}"));
    let status = StatusCode::from_u16(answer.status).map_err(|e| bad(e.to_string()))?;
    let body = BASE64.decode(answer.body).map_err(|e| bad(e.to_string()))?;
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = header_map(&answer.headers).map_err(bad)?;
    Ok(response)
}

/// The leader half: runs forwarded requests through this server's own API routes.
#[derive(Clone, Default)]
pub struct ForwardService {
    router: Arc<OnceLock<axum::Router>>,
}

impl ForwardService {
    /// A service that answers once [`ForwardService::serve_with`] gave it the routes.
    pub fn new() -> ForwardService {
        ForwardService::default()
    }

    /// The routes forwarded requests run through (the server's API router).
    pub fn serve_with(&self, router: axum::Router) {
        let _ = self.router.set(router);
    }

    /// The tonic service, to mount on the RPC listener.
    pub fn server(&self) -> ForwardServer<ForwardService> {
        ForwardServer::new(self.clone())
            .max_decoding_message_size(nomad_proto::rpc::codec::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(nomad_proto::rpc::codec::MAX_MESSAGE_BYTES)
    }

    async fn run(&self, forwarded: ForwardedRequest) -> Result<ForwardedResponse, tonic::Status> {
        let router = self.router.get().cloned().ok_or_else(|| tonic::Status::unavailable("this server's API is not serving yet"))?;
        let bad = |what: String| tonic::Status::invalid_argument(format!("forwarded request: {what}"));
        let body = BASE64.decode(&forwarded.body).map_err(|e| bad(e.to_string()))?;
        if body.len() > MAX_BODY_BYTES {
            return Err(bad(format!("the body is over {MAX_BODY_BYTES} bytes")));
        }
        let method = Method::from_bytes(forwarded.method.as_bytes()).map_err(|e| bad(e.to_string()))?;
        let mut request =
            Request::builder().method(method).uri(&forwarded.path_and_query).body(Body::from(body)).map_err(|e| bad(e.to_string()))?;
        *request.headers_mut() = header_map(&forwarded.headers).map_err(bad)?;
        request.extensions_mut().insert(Forwarded);
        let response = router.oneshot(request).await.unwrap_or_else(|never| match never {});
        let (parts, body) = response.into_parts();
        let body = axum::body::to_bytes(body, MAX_RESPONSE_BYTES)
            .await
            .map_err(|e| tonic::Status::internal(format!("reading the answer to a forwarded request: {e}")))?;
        Ok(ForwardedResponse { status: parts.status.as_u16(), headers: header_pairs(&parts.headers), body: BASE64.encode(&body) })
    }
}

#[tonic::async_trait]
impl ForwardRpc for ForwardService {
    async fn http(&self, request: tonic::Request<ForwardedRequest>) -> Result<tonic::Response<ForwardedResponse>, tonic::Status> {
        self.run(request.into_inner()).await.map(tonic::Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_plans_need_the_leader_reads_parses_and_validations_do_not() {
        assert!(needs_leader(&Method::PUT, "/v1/jobs"));
        assert!(needs_leader(&Method::POST, "/v1/job/web/plan"));
        assert!(needs_leader(&Method::DELETE, "/v1/job/web"));
        assert!(needs_leader(&Method::DELETE, "/v1/operator/raft/peer"));
        assert!(needs_leader(&Method::POST, "/v1/node/n1/drain"));
        assert!(!needs_leader(&Method::GET, "/v1/jobs"));
        assert!(!needs_leader(&Method::PUT, "/v1/jobs/parse"));
        assert!(!needs_leader(&Method::PUT, "/v1/validate/job"));
    }

    #[test]
    fn a_snapshot_save_is_the_leaders_unless_stale_is_allowed() {
        let uri = |s: &str| s.parse::<axum::http::Uri>().unwrap();
        assert!(read_needs_leader(&Method::GET, &uri("/v1/operator/snapshot")));
        assert!(read_needs_leader(&Method::GET, &uri("/v1/operator/snapshot?stale=false")));
        assert!(!read_needs_leader(&Method::GET, &uri("/v1/operator/snapshot?stale")));
        assert!(!read_needs_leader(&Method::GET, &uri("/v1/operator/snapshot?region=global&stale=true")));
        assert!(!read_needs_leader(&Method::GET, &uri("/v1/jobs")));
        assert!(needs_leader(&Method::PUT, "/v1/operator/snapshot"), "a restore is a write");
    }

    #[test]
    fn headers_travel_without_the_hop_by_hop_ones() {
        let mut headers = HeaderMap::new();
        headers.insert("x-nomad-token", HeaderValue::from_static("secret-token"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("connection", HeaderValue::from_static("keep-alive"));
        headers.insert("content-length", HeaderValue::from_static("12"));
        let pairs = header_pairs(&headers);
        assert!(pairs.contains(&("x-nomad-token".into(), "secret-token".into())), "the caller's credentials travel");
        assert!(pairs.iter().all(|(name, _)| name != "connection" && name != "content-length"));
        let back = header_map(&pairs).unwrap();
        assert_eq!(back.get("x-nomad-token").unwrap(), "secret-token");
        assert!(header_map(&[("bad name".into(), "v".into())]).is_err());
    }
}
