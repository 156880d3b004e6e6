//! Nomad's HTTP API (`/v1/...`), served with axum.
//!
//! One file per resource. Handlers parse the query options, run a blocking
//! query against state snapshots or call an endpoint, and answer in Nomad's
//! shapes: JSON with `X-Nomad-Index`/`X-Nomad-KnownLeader`/`X-Nomad-LastContact`,
//! plain-text errors with Nomad's status codes, 405 `Invalid method`, and Go's
//! `404 page not found` for unknown paths. `health.rs` holds the agent-wide routes
//! (`/v1/agent/health`, `/`, `/ui/`) the agent merges beside the server's and client's;
//! `agent_local.rs` the routes about the agent itself (`/v1/agent/servers`, `/v1/metrics`,
//! `/v1/agent/monitor`), never forwarded.

mod acl;
mod agent;
pub mod agent_local;
mod allocs;
pub mod authz;
mod csi;
mod deployments;
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
mod scaling;
mod search;
mod services;
mod system;
pub mod util;
mod variables;

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

/// Declares the server's routes once: the router is built from the list, and the list
/// ([`ROUTE_PATHS`]) is what the authorization table is checked against.
macro_rules! server_routes {
    ($($path:literal => $handler:path,)*) => {
        /// Every route pattern of [`router`], as axum spells it.
        pub const ROUTE_PATHS: &[&str] = &[$($path),*];

        fn server_routes() -> Router<HttpState> {
            Router::new()$(.route($path, any($handler)))*
        }
    };
}

server_routes! {
    "/v1/jobs" => jobs::jobs,
    "/v1/jobs/parse" => jobs::jobs_parse,
    "/v1/validate/job" => jobs::validate_job,
    "/v1/job/{*rest}" => jobs::job_specific,
    "/v1/deployments" => deployments::deployments,
    "/v1/deployment/{*rest}" => deployments::deployment_specific,
    "/v1/allocations" => allocs::allocations,
    "/v1/allocation/{*rest}" => allocs::allocation_specific,
    "/v1/evaluations" => evals::evaluations,
    "/v1/evaluation/{*rest}" => evals::evaluation_specific,
    "/v1/nodes" => nodes::nodes,
    "/v1/node/{*rest}" => nodes::node_specific,
    "/v1/namespaces" => namespaces::namespaces,
    "/v1/namespace/{*rest}" => namespaces::namespace_specific,
    "/v1/agent/self" => agent::agent_self,
    "/v1/agent/members" => agent::agent_members,
    "/v1/agent/join" => agent::agent_join,
    "/v1/agent/force-leave" => agent::agent_force_leave,
    "/v1/status/leader" => agent::status_leader,
    "/v1/status/peers" => agent::status_peers,
    "/v1/regions" => agent::regions,
    "/v1/operator/raft/configuration" => operator::raft_configuration,
    "/v1/operator/raft/peer" => operator::raft_peer,
    "/v1/operator/snapshot" => operator::snapshot,
    "/v1/operator/scheduler/configuration" => operator::scheduler_configuration,
    "/v1/event/stream" => events::stream,
    "/v1/services" => services::services,
    "/v1/service/{*rest}" => services::service_specific,
    "/v1/volumes" => csi::volumes,
    "/v1/volume/csi/{*rest}" => csi::volume_specific,
    "/v1/plugins" => csi::plugins,
    "/v1/plugin/csi/{*rest}" => csi::plugin_specific,
    "/v1/acl/{*rest}" => acl::acl_route,
    "/v1/vars" => variables::list,
    "/v1/var/{*rest}" => variables::specific,
    "/v1/operator/keyring/{*rest}" => variables::keyring,
    "/v1/search" => search::prefix,
    "/v1/search/fuzzy" => search::fuzzy,
    "/v1/system/gc" => system::gc,
    "/v1/system/reconcile/summaries" => system::reconcile_summaries,
    "/v1/scaling/policies" => scaling::policies,
    "/v1/scaling/policy/{*rest}" => scaling::policy_specific,
}

/// The `/v1` routes of the server role. The agent merges its own (client) routes. On a
/// follower, requests that need the leader are passed to it (`forward`).
pub fn router(state: HttpState) -> Router {
    let routes = server_routes();
    let routes = match state.forwarder.clone() {
        Some(forwarder) => routes.route_layer(axum::middleware::from_fn_with_state(forwarder, forward::to_leader)),
        None => routes,
    };
    // Authorization runs first (outermost): a refused request is neither forwarded nor handled.
    let routes = routes.route_layer(axum::middleware::from_fn_with_state(state.endpoints.clone(), authz::authorize));
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
mod deployment_tests;
#[cfg(test)]
mod eval_delete_tests;
#[cfg(test)]
mod forward_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod scaling_tests;
#[cfg(test)]
mod secret_tests;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod variables_tests;
