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
            "member": member(&s, &a.name, &a.addr, a.port, "alive"),
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

fn member(s: &HttpState, name: &str, addr: &str, port: u16, status: &str) -> serde_json::Value {
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
        "Status": status,
        "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
        "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4,
    })
}

/// `GET /v1/agent/members`: the servers of the region under their names (`<name>.<region>`),
/// `alive` if they answer now and `failed` if not (Nomad's serf statuses).
pub async fn agent_members(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::GET])?;
        let q = QueryOptions::parse(&uri)?;
        let a = &s.agent;
        let members: Vec<_> = match s.endpoints.consensus().members().await {
            Some(servers) => servers
                .into_iter()
                .map(|server| {
                    let (host, port) = match server.addr.rsplit_once(':') {
                        Some((host, port)) => (host.to_string(), port.parse().unwrap_or(0)),
                        None => (server.addr.clone(), 0),
                    };
                    member(&s, &server.name, &host, port, if server.alive { "alive" } else { "failed" })
                })
                .collect(),
            // No Raft here (in-process tests): only this server is known, and it is answering.
            None => vec![member(&s, &format!("{}.{}", a.name, a.region), &a.addr, a.port, "alive")],
        };
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use serde_json::Value;
    use tokio::net::TcpListener;
    use tower::ServiceExt;

    use super::AgentInfo;
    use crate::rpc_auth::ClusterKey;
    use crate::server::{Server, ServerConfig};

    const DEADLINE: Duration = Duration::from_secs(60);

    async fn members(router: &axum::Router) -> Vec<(String, String)> {
        let request = Request::builder().uri("/v1/agent/members").body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body: Value = serde_json::from_slice(&body).unwrap();
        let mut members: Vec<(String, String)> = body["Members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["Name"].as_str().unwrap().to_string(), m["Status"].as_str().unwrap().to_string()))
            .collect();
        members.sort();
        members
    }

    fn expect(statuses: [&str; 3]) -> Vec<(String, String)> {
        statuses.iter().enumerate().map(|(i, s)| (format!("server{i}.global"), s.to_string())).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn members_are_the_servers_by_name_and_a_stopped_one_is_failed() {
        let key = ClusterKey::generate();
        let mut listeners = Vec::new();
        for _ in 0..3 {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
        let (mut servers, mut routers, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
        for (i, listener) in listeners.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = ServerConfig::new(dir.path(), addrs[i].clone());
            cfg.bootstrap_expect = 3;
            cfg.join = addrs.clone();
            cfg.encrypt = Some(key.encode());
            cfg.name = format!("server{i}");
            let server = Server::start(cfg, listener).await.unwrap();
            let info = AgentInfo { name: format!("server{i}"), region: "global".into(), server: true, ..AgentInfo::default() };
            routers.push(server.http_router(info));
            servers.push(server);
            dirs.push(dir);
        }
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let leader = loop {
            if let Some(i) = (0..3).find(|&i| servers[i].consensus().is_leader()) {
                break i;
            }
            assert!(tokio::time::Instant::now() < deadline, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Every server answers: all alive, under their own names, from any server's view.
        for router in &routers {
            assert_eq!(members(router).await, expect(["alive"; 3]));
        }

        let stopped = (leader + 1) % 3;
        let other = (leader + 2) % 3;
        servers.remove(stopped).shutdown().await;
        let mut want = ["alive"; 3];
        want[stopped] = "failed";
        for viewer in [leader, other] {
            let router = &routers[viewer];
            loop {
                let seen = members(router).await;
                if seen == expect(want) {
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline, "server {viewer} still reports {seen:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        for server in servers {
            server.shutdown().await;
        }
    }
}
