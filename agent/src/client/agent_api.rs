//! What the agent-wide routes ask of the client role: its server list (`/v1/agent/servers`,
//! Nomad's `SetServers`) and its figures (`/v1/metrics`, Nomad's client gauges).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::ClientStatus;
use nomad_proto::rpc::NodeResolveTokenRequest;
use nomad_server::consensus::BoxFuture;
use nomad_server::http::agent_local::ClientServers;
use nomad_server::metrics::{MetricsSnapshot, MetricsSource};

use super::Client;
use super::allocrunner::status::client_status;
use super::servers::RpcError;

/// Nomad's client-to-server RPC port, for an address given without one.
pub const DEFAULT_RPC_PORT: u16 = 4647;
/// How long a server has to answer the ping that admits it to the list.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// `host:port`, or `host` with the default port, resolved to one address (Nomad's
/// `resolveServer`: the list holds addresses, not names).
pub async fn resolve_server(addr: &str) -> Result<SocketAddr, String> {
    let with_port = match split_host_port(addr) {
        Some(_) => addr.to_string(),
        None if addr.contains(':') && !addr.starts_with('[') => {
            // A bare IPv6 address has colons but no port.
            match addr.parse::<std::net::Ipv6Addr>() {
                Ok(ip) => SocketAddr::from((ip, DEFAULT_RPC_PORT)).to_string(),
                Err(_) => return Err(format!("address {addr}: too many colons in address")),
            }
        }
        None => format!("{}:{DEFAULT_RPC_PORT}", addr.trim_start_matches('[').trim_end_matches(']')),
    };
    let mut found = tokio::net::lookup_host(&with_port).await.map_err(|e| format!("failed to resolve {addr:?}: {e}"))?;
    found.next().ok_or_else(|| format!("failed to resolve {addr:?}: no address"))
}

/// `(host, port)` when `addr` has a numeric port.
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse().ok()?;
    if host.starts_with('[') {
        return host.ends_with(']').then_some((host, port));
    }
    (!host.contains(':')).then_some((host, port))
}

impl Client {
    /// Replaces the servers with those of `addrs` that resolve and answer a ping; how many,
    /// or Nomad's errors when none does (the list is then left as it was).
    pub async fn set_servers(&self, addrs: Vec<String>) -> Result<usize, String> {
        let checks = addrs.iter().map(|addr| async move {
            let resolved = resolve_server(addr).await?;
            self.ping(&resolved.to_string()).await.map_err(|e| format!("Server at address {resolved} failed ping: {e}"))?;
            Ok::<String, String>(resolved.to_string())
        });
        let outcomes = futures::future::join_all(checks).await;
        let (mut kept, mut errors) = (Vec::new(), Vec::new());
        for outcome in outcomes {
            match outcome {
                Ok(addr) => kept.push(addr),
                Err(e) => errors.push(e),
            }
        }
        if kept.is_empty() {
            if errors.is_empty() {
                return Err("no servers".into());
            }
            let list: Vec<String> = errors.iter().map(|e| format!("\t* {e}")).collect();
            let noun = if errors.len() == 1 { "error" } else { "errors" };
            return Err(format!("{} {noun} occurred:\n{}\n\n", errors.len(), list.join("\n")));
        }
        for e in &errors {
            tracing::warn!(error = %e, "ignoring a server given to the client");
        }
        tracing::info!(servers = ?kept, "client's server list replaced");
        self.inner.servers.set_configured(&kept);
        Ok(kept.len())
    }

    /// Asks the server at `addr` something harmless (this node's anonymous ACL): any answer
    /// from a server, a refusal included, shows one is there; no answer is the error.
    async fn ping(&self, addr: &str) -> Result<(), String> {
        let channel = self.inner.servers.channel_to(addr).map_err(|e| e.to_string())?;
        let request = NodeResolveTokenRequest {
            node_id: self.node_id().to_string(),
            secret_id: self.inner.identity.secret_id.clone(),
            auth_token: String::new(),
            region: self.inner.config.region.clone(),
        };
        let mut rpc = nomad_proto::rpc::NodeClient::new(channel);
        match tokio::time::timeout(PING_TIMEOUT, rpc.resolve_token(request)).await {
            Err(_) => Err(format!("no answer within {}s", PING_TIMEOUT.as_secs())),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => {
                let e = RpcError::Status { server: addr.to_string(), status };
                if e.is_unreachable() { Err(e.to_string()) } else { Ok(()) }
            }
        }
    }

    /// Nomad's client gauges this client can give exactly: its allocs by status (the
    /// `blocked` and `migrating` kinds of pending are not told apart: reported as pending), and
    /// what its allocs hold of the node.
    pub fn metrics_source(&self) -> MetricsSource {
        let client = self.clone();
        Arc::new(move |m: &mut MetricsSnapshot| {
            let node = client.node();
            let status = node.status.as_str();
            let eligibility = serde_json::to_value(node.scheduling_eligibility).ok();
            let eligibility = eligibility.as_ref().and_then(|v| v.as_str()).unwrap_or_default();
            let base = [
                ("node_id", client.node_id()),
                ("datacenter", node.datacenter.as_str()),
                ("node_class", node.node_class.as_str()),
                ("node_pool", node.node_pool.as_str()),
            ];
            let mut labels = base.to_vec();
            labels.extend([("node_status", status), ("node_scheduling_eligibility", eligibility)]);
            let runners: Vec<_> = super::taskrunner::lock(&client.inner.allocs).values().cloned().collect();
            let (mut pending, mut running, mut terminal) = (0u64, 0u64, 0u64);
            for runner in &runners {
                match client_status(&runner.watch_task_states().borrow()).0 {
                    ClientStatus::Pending => pending += 1,
                    ClientStatus::Running => running += 1,
                    ClientStatus::Complete | ClientStatus::Failed => terminal += 1,
                    ClientStatus::Lost | ClientStatus::Unknown => {}
                }
            }
            m.gauge("nomad.client.allocations.pending", pending as f64, &labels);
            m.gauge("nomad.client.allocations.running", running as f64, &labels);
            m.gauge("nomad.client.allocations.terminal", terminal as f64, &labels);
        })
    }
}

impl ClientServers for Client {
    fn servers(&self) -> Vec<String> {
        Client::servers(self)
    }

    fn set_servers(&self, addrs: Vec<String>) -> BoxFuture<'_, Result<usize, String>> {
        Box::pin(Client::set_servers(self, addrs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn server_addresses_resolve_with_nomads_default_port() {
        assert_eq!(resolve_server("127.0.0.1").await.unwrap(), "127.0.0.1:4647".parse().unwrap());
        assert_eq!(resolve_server("127.0.0.1:9").await.unwrap(), "127.0.0.1:9".parse().unwrap());
        assert_eq!(resolve_server("[::1]:9").await.unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(resolve_server("::1").await.unwrap(), "[::1]:4647".parse().unwrap());
        assert_eq!(resolve_server("localhost:9").await.unwrap().port(), 9);
        assert!(resolve_server("a:b:c").await.unwrap_err().contains("too many colons"));
        assert!(resolve_server("no-such-host.invalid").await.unwrap_err().starts_with("failed to resolve"));
    }
}
