//! A cluster of real processes: N servers and M clients, each with its own
//! temp dir, optionally with a [`FaultProxy`] between every client and the
//! servers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};

use crate::proxy::FaultProxy;
use crate::{Agent, AgentOptions, wait_for};

/// How to build a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Servers (1 or more).
    pub servers: usize,
    /// Clients.
    pub clients: usize,
    /// Put a fault proxy between each client and each server.
    pub proxied_clients: bool,
    /// Extra `server {}` settings (HCL body lines), e.g. fast heartbeats.
    pub server_config: String,
    /// Extra `client {}` settings.
    pub client_config: String,
    /// Extra top-level settings for every agent (e.g. `acl { enabled = true }`).
    pub agent_config: String,
}

/// A running cluster.
pub struct Cluster {
    /// Servers, in start order.
    pub servers: Vec<Agent>,
    /// Clients, in start order.
    pub clients: Vec<Agent>,
    /// Per client, its proxies to each server (when proxied).
    pub proxies: Vec<Vec<FaultProxy>>,
    _dir: tempfile::TempDir,
}

/// A new cluster key, as an operator makes one (`nomad-rs operator keygen`).
pub fn cluster_key() -> Result<String> {
    let out = std::process::Command::new(crate::binary()).args(["operator", "keygen"]).output()?;
    if !out.status.success() {
        bail!("nomad-rs operator keygen failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Reserves free ports by binding them, then releasing them just before use.
pub fn reserve_ports(n: usize) -> Result<Vec<u16>> {
    let listeners: Vec<std::net::TcpListener> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    Ok(listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?)
}

impl Cluster {
    /// Starts the servers (formed into one Raft cluster), waits for a leader,
    /// then starts the clients and waits for them to be ready.
    pub fn start(opts: ClusterOptions) -> Result<Cluster> {
        if opts.servers == 0 {
            bail!("a cluster needs at least one server");
        }
        let dir = tempfile::Builder::new().prefix("nomad-rs-e2e-").tempdir()?;
        let key = cluster_key()?;
        let ports = reserve_ports(opts.servers * 2)?;
        let rpc: Vec<String> = (0..opts.servers).map(|i| format!("127.0.0.1:{}", ports[2 * i + 1])).collect();
        let mut servers = Vec::new();
        for i in 0..opts.servers {
            let join: Vec<String> = rpc.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, a)| format!("{a:?}")).collect();
            let config = format!(
                "server {{\n  enabled = true\n  encrypt = {key:?}\n  bootstrap_expect = {}\n  server_join {{\n    retry_join = [{}]\n  }}\n{}\n}}\n{}\n",
                opts.servers,
                join.join(", "),
                opts.server_config,
                opts.agent_config
            );
            let a = Agent::start(
                &format!("server{}", i + 1),
                &dir.path().join(format!("server{}", i + 1)),
                AgentOptions { config: Some(config), ports: Some((ports[2 * i], ports[2 * i + 1])), ..Default::default() },
            )?;
            servers.push(a);
        }
        let mut c = Cluster { servers, clients: Vec::new(), proxies: Vec::new(), _dir: dir };
        c.wait_for_leader(Duration::from_secs(60))?;
        for i in 0..opts.clients {
            c.add_client(i, &rpc, &opts)?;
        }
        Ok(c)
    }

    fn add_client(&mut self, i: usize, rpc: &[String], opts: &ClusterOptions) -> Result<()> {
        let (addrs, proxies) = if opts.proxied_clients {
            let proxies: Vec<FaultProxy> = rpc.iter().map(|a| FaultProxy::start(a)).collect::<Result<_, _>>()?;
            (proxies.iter().map(|p| p.addr().to_string()).collect::<Vec<_>>(), proxies)
        } else {
            (rpc.to_vec(), Vec::new())
        };
        let quoted: Vec<String> = addrs.iter().map(|a| format!("{a:?}")).collect();
        let config = format!(
            "client {{\n  enabled = true\n  servers = [{}]\n{}\n}}\nplugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\n{}\n",
            quoted.join(", "),
            opts.client_config,
            opts.agent_config
        );
        let name = format!("client{}", i + 1);
        let dir = self._dir.path().join(&name);
        let a = Agent::start(&name, &dir, AgentOptions { config: Some(config), ..Default::default() })?;
        self.clients.push(a);
        self.proxies.push(proxies);
        Ok(())
    }

    /// The cluster's temp dir.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Waits until every live server agrees on one leader; returns its index in `servers`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize> {
        wait_for("every server to agree on a leader", timeout, || {
            let leaders: Vec<String> = self
                .servers
                .iter()
                .filter(|s| s.pid().is_some())
                .map(|s| s.http().get_json("/v1/status/leader").ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default())
                .collect();
            let first = leaders.first()?.clone();
            if first.is_empty() || leaders.iter().any(|l| *l != first) {
                return None;
            }
            self.servers.iter().position(|s| s.rpc_addr == first && s.pid().is_some())
        })
        .map_err(|e| {
            let logs: Vec<String> = self.servers.iter().map(Agent::logs).collect();
            anyhow::anyhow!("{e}\n{}", logs.join("\n"))
        })
    }

    /// A live server other than `not`, for talking to followers.
    pub fn other_server(&self, not: usize) -> &Agent {
        self.servers.iter().enumerate().find(|(i, s)| *i != not && s.pid().is_some()).map(|(_, s)| s).expect("another live server")
    }

    /// Data dirs of every agent (for leak checks).
    pub fn agent_dirs(&self) -> Vec<PathBuf> {
        self.servers.iter().chain(self.clients.iter()).map(|a| a.dir().to_path_buf()).collect()
    }
}
