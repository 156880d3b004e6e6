//! `/v1/agent/self`, `/v1/agent/members`, `/v1/agent/join`, `/v1/agent/force-leave`,
//! `/v1/status/*`, `/v1/regions`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::HttpState;
use super::agent_local::{MAX_ADDRESS_BYTES, MAX_SERVER_ADDRESSES, go_quote};
use super::util::{HttpError, QueryOptions, json_response, require_method};
use crate::endpoints::EndpointError;

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

/// `PUT|POST /v1/agent/join?address=...`: Nomad's `{"num_joined", "error"}`. nomad-rs has no
/// gossip pool; servers are joined through Raft membership, as `server_join` does (see
/// `raft::bootstrap::join_via` for what is joined and what is refused). Not forwarded: the join
/// is this server's.
pub async fn agent_join(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        let q = QueryOptions::parse(&uri)?;
        let addrs: Vec<String> = q.multi.get("address").cloned().unwrap_or_default().into_iter().filter(|a| !a.is_empty()).collect();
        if addrs.is_empty() {
            return Err(HttpError::bad_request("missing address to join"));
        }
        if addrs.len() > MAX_SERVER_ADDRESSES {
            return Err(HttpError::bad_request(format!("too many addresses to join: {} (at most {MAX_SERVER_ADDRESSES})", addrs.len())));
        }
        if addrs.iter().any(|a| a.len() > MAX_ADDRESS_BYTES) {
            return Err(HttpError::bad_request(format!("an address to join is longer than {MAX_ADDRESS_BYTES} bytes")));
        }
        let (joined, errors) = s.endpoints.consensus().join_servers(addrs).await;
        json_response(&json!({ "num_joined": joined, "error": multi_error(&errors) }), None, q.pretty)
    })
    .await
}

/// go-multierror's text of `errors` (empty for none).
fn multi_error(errors: &[String]) -> String {
    if errors.is_empty() {
        return String::new();
    }
    let list: Vec<String> = errors.iter().map(|e| format!("\t* {e}")).collect();
    let noun = if errors.len() == 1 { "error" } else { "errors" };
    format!("{} {noun} occurred:\n{}\n\n", errors.len(), list.join("\n"))
}

/// `PUT|POST /v1/agent/force-leave?node=<name>`: takes a failed server out of the cluster
/// (Raft membership; Nomad's serf marks it left and its leader then removes it from Raft). The
/// name is the member name (`<name>.<region>`, or `<name>`). A server that answers is refused: it
/// would only come back; a name no server has is left alone (200, as Nomad). Forwarded to the
/// leader, which removes servers.
pub async fn agent_force_leave(State(s): State<HttpState>, method: Method, uri: Uri, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        let q = QueryOptions::parse(&uri)?;
        let node = q.params.get("node").filter(|n| !n.is_empty()).ok_or_else(|| HttpError::bad_request("missing node to force leave"))?;
        if node.len() > MAX_ADDRESS_BYTES {
            return Err(HttpError::bad_request(format!("node name is longer than {MAX_ADDRESS_BYTES} bytes")));
        }
        let consensus = s.endpoints.consensus();
        let Some(members) = consensus.members().await else {
            return Err(HttpError::bad_request("this server does not run Raft: there is no member to remove"));
        };
        let qualified = format!("{node}.{}", s.agent.region);
        let Some(member) = members.iter().find(|m| m.name == *node || m.name == qualified) else {
            tracing::info!(node = %node, "force-leave: no server of that name; nothing to remove");
            return Ok(axum::http::StatusCode::OK.into_response());
        };
        if member.alive {
            return Err(HttpError::bad_request(format!(
                "server {} is alive: force-leave removes only a failed server (stop it first, or use operator raft remove-peer)",
                go_quote(&member.name)
            )));
        }
        consensus.remove_raft_peer(member.id).await.map_err(EndpointError::from)?;
        tracing::info!(node = %member.name, id = member.id, "force-leave: removed the failed server from the raft cluster");
        Ok(axum::http::StatusCode::OK.into_response())
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

    async fn start_server(key: &ClusterKey, name: &str, bootstrap_expect: usize) -> (Server, axum::Router, tempfile::TempDir) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ServerConfig::new(dir.path(), addr);
        cfg.bootstrap_expect = bootstrap_expect;
        cfg.encrypt = Some(key.encode());
        cfg.name = name.to_string();
        let server = Server::start(cfg, listener).await.unwrap();
        let info = AgentInfo { name: name.to_string(), region: "global".into(), server: true, ..AgentInfo::default() };
        let router = server.http_router(info);
        (server, router, dir)
    }

    async fn put(router: &axum::Router, uri: &str) -> (axum::http::StatusCode, String) {
        let request = Request::builder().method("PUT").uri(uri).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn wait_for(what: &str, mut ok: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !ok().await {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn join_brings_servers_into_one_cluster_and_force_leave_removes_a_failed_one() {
        let key = ClusterKey::generate();
        // `a` forms a cluster of one; `b` and `c` start in none (no bootstrap, no join list).
        let (a, a_router, _a_dir) = start_server(&key, "a", 1).await;
        let (b, b_router, _b_dir) = start_server(&key, "b", 0).await;
        let (c, c_router, _c_dir) = start_server(&key, "c", 0).await;
        let (a_addr, b_addr, c_addr) = (a.rpc_addr().to_string(), b.rpc_addr().to_string(), c.rpc_addr().to_string());
        wait_for("a to lead", async || a.consensus().is_leader()).await;

        // Two servers in no cluster cannot form one by a join: refused, with why.
        let (status, body) = put(&b_router, &format!("/v1/agent/join?address={c_addr}")).await;
        assert_eq!(status, axum::http::StatusCode::OK);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["num_joined"], 0);
        assert!(v["error"].as_str().unwrap().contains("neither this server nor server"), "{v}");

        // The cluster's server adds a server in no cluster (the leader adds it to Raft)...
        let (_, body) = put(&a_router, &format!("/v1/agent/join?address={b_addr}")).await;
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), serde_json::json!({"num_joined": 1, "error": ""}));
        // ... and a server in no cluster joins through any member of one.
        let (_, body) = put(&c_router, &format!("/v1/agent/join?address={b_addr}")).await;
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), serde_json::json!({"num_joined": 1, "error": ""}));
        wait_for("three voters", async || a.consensus().peers().len() == 3).await;
        wait_for("all alive", async || members(&a_router).await.iter().filter(|(_, s)| s == "alive").count() == 3).await;

        // A member joined again, and an address where no server answers.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let (_, body) = put(&b_router, &format!("/v1/agent/join?address={a_addr}&address={dead}")).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["num_joined"], 1);
        let error = v["error"].as_str().unwrap();
        assert!(error.starts_with("1 error occurred:\n\t* Failed to join ") && error.contains(&dead), "{error}");
        assert_eq!(put(&a_router, "/v1/agent/join").await, (axum::http::StatusCode::BAD_REQUEST, "missing address to join".into()));

        // force-leave: a live server is refused, an unknown name is left alone, a failed one goes.
        let (status, body) = put(&a_router, "/v1/agent/force-leave?node=b.global").await;
        assert_eq!(status, axum::http::StatusCode::BAD_REQUEST);
        assert!(body.contains("is alive"), "{body}");
        assert_eq!(put(&a_router, "/v1/agent/force-leave?node=nope").await, (axum::http::StatusCode::OK, String::new()));
        assert_eq!(
            put(&a_router, "/v1/agent/force-leave").await,
            (axum::http::StatusCode::BAD_REQUEST, "missing node to force leave".into())
        );
        c.shutdown().await;
        wait_for("c failed", async || members(&a_router).await.contains(&("c.global".to_string(), "failed".to_string()))).await;
        // Sent to a follower: forwarded to the leader, which removes servers.
        let follower = if b.consensus().is_leader() { &a_router } else { &b_router };
        assert_eq!(put(follower, "/v1/agent/force-leave?node=c").await, (axum::http::StatusCode::OK, String::new()));
        wait_for("c removed", async || !a.consensus().raft_configuration().iter().any(|p| p.addr == c_addr)).await;
        assert_eq!(a.consensus().peers().len(), 2);
        b.shutdown().await;
        a.shutdown().await;
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
