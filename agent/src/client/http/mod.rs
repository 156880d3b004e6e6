//! The client's HTTP routes (`/v1/client/...`), merged into the agent's router.
//!
//! - `GET /v1/client/fs/logs/<alloc_id>`: a task's stdout or stderr ([`logs`]).
//! - `PUT|POST /v1/client/allocation/<alloc_id>/restart`: restart tasks ([`restart`]).
//! - `GET /v1/client/allocation/<alloc_id>/stats`: resource usage ([`stats`]).
//!
//! An agent serves these for its own allocs. For an alloc another client runs, an agent that
//! can look the alloc up (it runs the server role) forwards the request once to that node: to the
//! IP its RPC connection came from with the port of its `HTTPAddr` (never to a host the node
//! names), without the caller's credentials; an agent that can do neither answers 400 and says
//! where to send it.

mod forward;
mod logs;
mod restart;
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
        .route("/v1/client/{*rest}", any(other))
        .with_state(state)
}

/// What a handler does with a request for an alloc.
enum Target {
    /// Serve it from this client's runner.
    Local(Arc<AllocRunner>),
    /// Answered already (forwarded, or an error).
    Done(Response),
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
    /// The local runner, or a forwarded response, or the right error.
    async fn target(&self, alloc_id: &str, req: Request<Body>) -> Target {
        if let Some(runner) = self.client.as_ref().and_then(|c| c.alloc_runner(alloc_id)) {
            return Target::Local(runner);
        }
        let located = self.locator.as_ref().and_then(|l| l.node_http_addr(alloc_id));
        if let Some(addr) = &located
            && !addr.is_empty()
            && *addr != self.own_addr
            && !forward::already_forwarded(&req)
        {
            return Target::Done(forward::forward(addr, req).await.unwrap_or_else(IntoResponse::into_response));
        }
        let err = match located {
            // Known to the servers, but on no node this agent can reach for it.
            Some(_) if self.client.is_none() => no_client(),
            None if self.client.is_none() && self.locator.is_none() => no_client(),
            _ => unknown_alloc(alloc_id),
        };
        Target::Done(err.into_response())
    }
}

async fn other(State(state): State<ClientHttp>, Path(rest): Path<String>) -> Response {
    if state.client.is_none() && state.locator.is_none() {
        return no_client().into_response();
    }
    HttpError::not_found(format!("no client endpoint /v1/client/{rest}")).into_response()
}
