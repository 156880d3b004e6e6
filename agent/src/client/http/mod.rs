//! The client's HTTP routes (`/v1/client/...`), merged into the agent's router.
//!
//! - `GET /v1/client/fs/logs/<alloc_id>`: a task's stdout or stderr ([`logs`]).
//! - `PUT|POST /v1/client/allocation/<alloc_id>/restart`: restart tasks ([`restart`]).
//! - `GET /v1/client/allocation/<alloc_id>/stats`: resource usage ([`stats`]).
//! - `GET /v1/client/allocation/<alloc_id>/checks` and `/v1/allocation/<alloc_id>/checks`:
//!   Nomad service check results ([`checks`], [`with_alloc_checks_alias`]).
//! - `GET /v1/client/fs/{ls,stat,cat,readat,stream}/<alloc_id>`: the alloc dir ([`fs`]).
//! - `PUT|POST /v1/client/allocation/<alloc_id>/signal`: signal tasks ([`signal`]).
//! - `GET /v1/client/allocation/<alloc_id>/exec`: a command in a task, over a websocket ([`exec`]).
//! - `GET /v1/client/stats`: the host's usage ([`host_stats`]).
//! - `/v1/client/gc`, `/v1/client/allocation/<alloc_id>/gc`: collect terminal allocs ([`gc`]).
//!
//! An agent serves these for its own allocs. For an alloc another client runs, an agent that
//! can look the alloc up (it runs the server role) forwards the request once to that node: to the
//! IP its RPC connection came from with the port of its `HTTPAddr` (never to a host the node
//! names), with the caller's credentials, so that agent authorizes the same caller (with ACLs
//! on, every agent checks `nomad_server::http::authz::ROWS`). A client-only agent sends it to the server it
//! talks to, which does that (as Nomad's client agents go through their servers); an agent that
//! can do neither answers 400 and says where to send it. `alloc exec`'s websocket is relayed
//! message by message along the same hops.

mod checks;
mod exec;
mod forward;
pub mod fs;
mod gc;
pub mod host_stats;
mod logs;
mod restart;
pub mod signal;
mod stats;

pub use stats::task_resource_usage;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use nomad_server::http::util::HttpError;

pub use forward::{AllocLocator, StateLocator};

use super::Client;
use super::allocrunner::AllocRunner;

/// What the client routes need.
#[derive(Clone)]
pub struct ClientHttp {
    /// The client role, when this agent runs one.
    pub client: Option<Client>,
    /// Finds the `HTTPAddr` of the node running an alloc (server role), for forwarding.
    pub locator: Option<Arc<dyn AllocLocator>>,
    /// This agent's own advertised HTTP address (never forwarded to).
    pub own_addr: String,
}

/// The `/v1/client/...` routes. No fallback, so it merges with the server's router.
pub fn router(state: ClientHttp) -> Router {
    Router::new()
        .route("/v1/client/fs/logs/{alloc_id}", any(logs::handle))
        .route("/v1/client/allocation/{alloc_id}/restart", any(restart::handle))
        .route("/v1/client/allocation/{alloc_id}/stats", any(stats::handle))
        .route("/v1/client/allocation/{alloc_id}/checks", any(checks::handle))
        .route("/v1/client/allocation/{alloc_id}/signal", any(signal::handle))
        .route("/v1/client/allocation/{alloc_id}/exec", any(exec::handle))
        .route("/v1/client/allocation/{alloc_id}/gc", any(gc::alloc))
        .route("/v1/client/gc", any(gc::all))
        .route("/v1/client/stats", any(host_stats::handle))
        .route("/v1/client/fs/ls/{alloc_id}", any(fs::ls))
        .route("/v1/client/fs/stat/{alloc_id}", any(fs::stat_route))
        .route("/v1/client/fs/cat/{alloc_id}", any(fs::cat))
        .route("/v1/client/fs/readat/{alloc_id}", any(fs::readat))
        .route("/v1/client/fs/stream/{alloc_id}", any(fs::stream))
        .route("/v1/client/{*rest}", any(other))
        .with_state(state)
}

/// The agent's whole router, with `/v1/allocation/<id>/checks` routed to the client route that
/// serves it (Nomad's one `allocChecks` handler answers both paths; the server role's
/// `/v1/allocation/{*rest}` would take it otherwise). The authorization table decides the
/// rewritten path: `read-job` in the alloc's namespace, as for the original.
pub fn with_alloc_checks_alias(router: Router) -> Router {
    Router::new().fallback_service(router).layer(axum::middleware::map_request(|mut req: Request<Body>| async move {
        if let Some(path) = checks::client_path_of(req.uri().path()) {
            let uri = match req.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path,
            };
            if let Ok(uri) = uri.parse() {
                *req.uri_mut() = uri;
            }
        }
        req
    }))
}

/// What a handler does with a request for an alloc.
enum Target {
    /// Serve it from this client's runner.
    Local(Arc<AllocRunner>),
    /// Answered already (forwarded, or an error).
    Done(Response),
}

/// Where a request for an alloc is served.
enum Located {
    /// Here, by this client's runner.
    Local(Arc<AllocRunner>),
    /// By another agent at this address, one hop on.
    Remote(String, forward::Hop),
    /// Nowhere: the error to answer.
    Nowhere(HttpError),
}

/// Nomad's error for an alloc this client does not run.
pub(crate) fn unknown_alloc(id: &str) -> HttpError {
    HttpError::not_found(format!("Unknown allocation \"{id}\""))
}

fn no_client() -> HttpError {
    HttpError::bad_request(
        "this agent does not run the client role, and cannot find the alloc's node: send /v1/client requests to the HTTP address of the client that runs the allocation (its node's HTTPAddr)",
    )
}

impl ClientHttp {
    /// Where the request is served: this client; the alloc's node, found through the server
    /// role's state; or, from a client-only agent, its server (which finds the node). A request
    /// forwarded once already is served here or nowhere.
    fn locate(&self, alloc_id: &str, req: &Request<Body>) -> Located {
        if let Some(runner) = self.client.as_ref().and_then(|c| c.alloc_runner(alloc_id)) {
            return Located::Local(runner);
        }
        let forwarded = forward::already_forwarded(req);
        let located = self.locator.as_ref().and_then(|l| l.node_http_addr(alloc_id));
        if let Some(addr) = &located
            && !addr.is_empty()
            && *addr != self.own_addr
            && !forwarded
        {
            return Located::Remote(addr.clone(), forward::Hop::Node);
        }
        if self.locator.is_none()
            && !forwarded
            && !forward::from_client_agent(req)
            && let Some(server) = self.client.as_ref().and_then(Client::server_http_addr)
        {
            return Located::Remote(server, forward::Hop::Server);
        }
        Located::Nowhere(match located {
            // Known to the servers, but on no node this agent can reach for it.
            Some(_) if self.client.is_none() => no_client(),
            None if self.client.is_none() && self.locator.is_none() => no_client(),
            _ => unknown_alloc(alloc_id),
        })
    }

    /// The local runner, or a forwarded response, or the right error.
    async fn target(&self, alloc_id: &str, req: Request<Body>) -> Target {
        match self.locate(alloc_id, &req) {
            Located::Local(runner) => Target::Local(runner),
            Located::Remote(addr, hop) => Target::Done(forward::forward(&addr, req, hop).await.unwrap_or_else(IntoResponse::into_response)),
            Located::Nowhere(err) => Target::Done(err.into_response()),
        }
    }
}

/// The local client for a request about a node (`node_id`, empty for this one).
pub(crate) fn local_node_client(state: &ClientHttp, node_id: Option<&str>) -> Result<Client, HttpError> {
    let Some(client) = state.client.clone() else {
        return Err(HttpError::bad_request("No local Node and node_id not provided"));
    };
    match node_id.filter(|n| !n.is_empty()) {
        Some(n) if n != client.node_id() => Err(HttpError::bad_request(format!(
            "node {n:?} is not this agent's node ({}): send the request to that node's HTTP address",
            client.node_id()
        ))),
        _ => Ok(client),
    }
}

/// One core's clock in MHz, as fingerprinted (1000 when unknown).
pub(crate) fn core_mhz(client: &Client) -> f64 {
    client.node().attributes.get("cpu.frequency").and_then(|f| f.parse::<f64>().ok()).filter(|mhz| *mhz > 0.0).unwrap_or(1000.0)
}

async fn other(State(state): State<ClientHttp>, Path(rest): Path<String>) -> Response {
    if state.client.is_none() && state.locator.is_none() {
        return no_client().into_response();
    }
    HttpError::not_found(format!("no client endpoint /v1/client/{rest}")).into_response()
}
