//! Forwarding a `/v1/client` request to the client that runs the alloc, once.

use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use nomad_server::http::util::HttpError;

/// Marks a request forwarded to the alloc's node, so it is never forwarded again.
const FORWARDED: &str = "x-nomad-rs-forwarded";
/// Marks a request a client-only agent sent to its server, so the server never sends it back
/// to a server (it finds the node, or answers).
const FROM_CLIENT_AGENT: &str = "x-nomad-rs-from-client-agent";

/// Where a request goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hop {
    /// To the node that runs the alloc, marked forwarded. The caller's credentials go along:
    /// the node's agent authorizes the same caller (as Nomad's servers pass the token on to
    /// the client's endpoints).
    Node,
    /// From a client-only agent to its server, credentials kept.
    Server,
}

/// The caller's credentials, carried to the next hop, which authorizes the caller again.
pub(super) const CREDENTIALS: &[&str] = &["x-nomad-token", "authorization"];

/// Finds where an alloc runs.
pub trait AllocLocator: Send + Sync {
    /// `None` when the alloc is unknown; otherwise where to reach its node's HTTP API (empty when
    /// unknown): the IP the node's RPC connection came from with its HTTP port.
    fn node_http_addr(&self, alloc_id: &str) -> Option<String>;
}

/// Finds an alloc's node through the server role's state: the IP the node's own RPC connection
/// came from (`Node::forwarding_http_addr`), never a host the node declared.
pub struct StateLocator(pub std::sync::Arc<nomad_server::state::StateStore>);

impl AllocLocator for StateLocator {
    fn node_http_addr(&self, alloc_id: &str) -> Option<String> {
        let snap = self.0.snapshot();
        let alloc = snap.alloc(alloc_id)?;
        Some(snap.node(&alloc.node_id).and_then(|n| n.forwarding_http_addr()).unwrap_or_default())
    }
}

pub(super) fn already_forwarded(req: &Request<Body>) -> bool {
    req.headers().contains_key(FORWARDED)
}

pub(super) fn from_client_agent(req: &Request<Body>) -> bool {
    req.headers().contains_key(FROM_CLIENT_AGENT)
}

/// The headers a request carries on to the next hop.
pub(super) fn mark(headers: &mut axum::http::HeaderMap, hop: Hop) {
    headers.remove("host");
    match hop {
        Hop::Node => {
            headers.insert(FORWARDED, HeaderValue::from_static("1"));
        }
        Hop::Server => {
            headers.insert(FROM_CLIENT_AGENT, HeaderValue::from_static("1"));
        }
    }
}

/// Sends `req` to `addr` and streams the answer back.
pub(super) async fn forward(addr: &str, req: Request<Body>, hop: Hop) -> Result<Response, HttpError> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    parts.uri = format!("{}://{addr}{path}", crate::tls::agent_scheme())
        .parse()
        .map_err(|e| HttpError::bad_request(format!("node address {addr:?} is not usable: {e}")))?;
    mark(&mut parts.headers, hop);
    let client: Client<_, Body> = crate::tls::agent_http_client_or_plain();
    let resp = client
        .request(Request::from_parts(parts, body))
        .await
        .map_err(|e| HttpError { code: StatusCode::BAD_GATEWAY, message: format!("forwarding to the client at {addr}: {e}") })?;
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, Body::new(body.map_err(axum::Error::new))))
}
