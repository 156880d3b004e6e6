//! `/v1/agent/self`, `/v1/agent/members`, `/v1/status/*`, `/v1/regions`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::Response;
use serde_json::json;

use super::HttpState;
use super::util::{QueryOptions, json_response, require_method};

/// What the agent tells about itself.
#[derive(Debug, Clone, Default)]
pub struct AgentInfo {
    /// Agent name.
    pub name: String,
    /// Region.
    pub region: String,
    /// Datacenter.
    pub datacenter: String,
    /// The agent's configuration in Nomad's shape (secrets already redacted).
    pub config: serde_json::Value,
    /// Address other members reach it on.
    pub addr: String,
    /// RPC port.
    pub port: u16,
    /// Runs the server role.
    pub server: bool,
    /// The client role's node ID, once it has one (`stats.client.node_id`).
    pub client_node_id: std::sync::Arc<std::sync::OnceLock<String>>,
}

/// The Nomad API version this server speaks.
pub const API_VERSION: &str = "1.6.1";

/// `GET /v1/agent/self`: `{config, member, stats}` (lowercase keys, as Nomad).
pub async fn agent_self(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let a = &s.agent;
        let mut body = json!({
            "config": a.config,
            "member": member(&s, &a.name, &a.addr, a.port),
            "stats": {
                "nomad": {
                    "server": a.server.to_string(),
                    "leader": s.endpoints.consensus().is_leader().to_string(),
                    "known_regions": "1",
                },
                "raft": { "applied_index": s.endpoints.store().snapshot().index.to_string() },
            },
        });
        if let Some(id) = a.client_node_id.get() {
            body["stats"]["client"] = json!({ "node_id": id });
        }
        json_response(&body, None, q.pretty)
    })
    .await
}

fn member(s: &HttpState, name: &str, addr: &str, port: u16) -> serde_json::Value {
    let a = &s.agent;
    json!({
        "Name": name,
        "Addr": addr,
        "Port": port,
        "Tags": {
            "role": if a.server { "nomad" } else { "client" },
            "region": a.region,
            "dc": a.datacenter,
            "build": API_VERSION,
            "port": port.to_string(),
        },
        "Status": "alive",
        "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
        "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4,
    })
}

/// `GET /v1/agent/members`: the servers of the region.
pub async fn agent_members(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let a = &s.agent;
        let self_addr = format!("{}:{}", a.addr, a.port);
        let members: Vec<_> = s
            .endpoints
            .consensus()
            .peers()
            .into_iter()
            .map(|peer| {
                let (host, port) = peer.rsplit_once(':').map(|(h, p)| (h.to_string(), p.parse().unwrap_or(0))).unwrap_or((peer.clone(), 0));
                let name = if peer == self_addr { format!("{}.{}", a.name, a.region) } else { format!("{peer}.{}", a.region) };
                member(&s, &name, &host, port)
            })
            .collect();
        let body = json!({
            "ServerName": a.name,
            "ServerRegion": a.region,
            "ServerDC": a.datacenter,
            "Members": members,
        });
        json_response(&body, None, q.pretty)
    })
    .await
}

/// `GET /v1/status/leader`: the leader's RPC address as a JSON string.
pub async fn status_leader(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let leader = s.endpoints.consensus().leader_rpc_addr().unwrap_or_default();
        json_response(&leader, None, q.pretty)
    })
    .await
}

/// `GET /v1/status/peers`: the voters' RPC addresses.
pub async fn status_peers(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        json_response(&s.endpoints.consensus().peers(), None, q.pretty)
    })
    .await
}

/// `GET /v1/regions`.
pub async fn regions(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        json_response(&vec![s.agent.region.clone()], None, q.pretty)
    })
    .await
}
