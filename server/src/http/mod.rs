//! Nomad's HTTP API (`/v1/...`), served with axum.
//!
//! One file per resource. Handlers parse the query options, run a blocking
//! query against state snapshots or call an endpoint, and answer in Nomad's
//! shapes: JSON with `X-Nomad-Index`/`X-Nomad-KnownLeader`/`X-Nomad-LastContact`,
//! plain-text errors with Nomad's status codes, 405 `Invalid method`, and Go's
//! `404 page not found` for unknown paths. `health.rs` holds the agent-wide routes
//! (`/v1/agent/health`, `/`, `/ui/`) the agent merges beside the server's and client's.

mod agent;
mod allocs;
mod csi;
mod evals;
mod events;
pub mod filter;
pub mod forward;
pub mod health;
mod jobs;
pub mod listener;
mod namespaces;
mod nodes;
mod operator;
mod services;
pub mod util;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;

pub use agent::{API_VERSION, AgentInfo};
use util::{HttpResult, QueryMeta};

use crate::endpoints::Endpoints;

/// What handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// The server's endpoints.
    pub endpoints: Endpoints,
    /// About this agent.
    pub agent: Arc<AgentInfo>,
    /// Passes requests that need the leader to it; `None` where this server is the only one
    /// (in-process tests over `LocalConsensus`).
    pub forwarder: Option<Arc<forward::LeaderForwarder>>,
}

impl HttpState {
    fn meta(&self, index: u64) -> QueryMeta {
        QueryMeta { index: index.max(1), known_leader: self.endpoints.consensus().leader_rpc_addr().is_some() }
    }
}

async fn respond(f: impl Future<Output = HttpResult>) -> Response {
    match f.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// The `/v1` routes of the server role. The agent merges its own (client) routes. On a
/// follower, requests that need the leader are passed to it (`forward`).
pub fn router(state: HttpState) -> Router {
    let routes = Router::new()
        .route("/v1/jobs", any(jobs::jobs))
        .route("/v1/jobs/parse", any(jobs::jobs_parse))
        .route("/v1/validate/job", any(jobs::validate_job))
        .route("/v1/job/{*rest}", any(jobs::job_specific))
        .route("/v1/allocations", any(allocs::allocations))
        .route("/v1/allocation/{*rest}", any(allocs::allocation_specific))
        .route("/v1/evaluations", any(evals::evaluations))
        .route("/v1/evaluation/{*rest}", any(evals::evaluation_specific))
        .route("/v1/nodes", any(nodes::nodes))
        .route("/v1/node/{*rest}", any(nodes::node_specific))
        .route("/v1/namespaces", any(namespaces::namespaces))
        .route("/v1/namespace/{*rest}", any(namespaces::namespace_specific))
        .route("/v1/agent/self", any(agent::agent_self))
        .route("/v1/agent/members", any(agent::agent_members))
        .route("/v1/status/leader", any(agent::status_leader))
        .route("/v1/status/peers", any(agent::status_peers))
        .route("/v1/regions", any(agent::regions))
        .route("/v1/operator/raft/configuration", any(operator::raft_configuration))
        .route("/v1/operator/raft/peer", any(operator::raft_peer))
        .route("/v1/event/stream", any(events::stream))
        .route("/v1/services", any(services::services))
        .route("/v1/service/{*rest}", any(services::service_specific))
        .route("/v1/volumes", any(csi::volumes))
        .route("/v1/volume/csi/{*rest}", any(csi::volume_specific))
        .route("/v1/plugins", any(csi::plugins))
        .route("/v1/plugin/csi/{*rest}", any(csi::plugin_specific));
    let routes = match state.forwarder.clone() {
        Some(forwarder) => routes.route_layer(axum::middleware::from_fn_with_state(forwarder, forward::to_leader)),
        None => routes,
    };
    routes
        // Go's http.NotFound, as Nomad answers a path it has no route for: never an empty body.
        .fallback(|| async { (StatusCode::NOT_FOUND, [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], NOT_FOUND_TEXT) })
        .layer(axum::middleware::from_fn(listener::release_after_large_bodies))
        .with_state(state)
}

/// The body of a 404 for a path no route serves (Go's `http.NotFound`).
pub const NOT_FOUND_TEXT: &str = "404 page not found\n";

#[cfg(test)]
mod csi_tests;
#[cfg(test)]
mod forward_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod secret_tests;
#[cfg(test)]
mod tests;
