//! `nomad-rs agent`: run the server role, the client role, or both.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use nomad_server::http::AgentInfo;
use nomad_server::server::{Server, ServerConfig};
use tokio::net::TcpListener;

use crate::client::consul::sync::ConsulServices;
use crate::client::consul::{ConsulApi, ConsulClient};
use crate::client::driver::{DriverOptions, DriverRegistry};
use crate::client::http::{AllocLocator, ClientHttp, StateLocator};
use crate::client::{Client, ClientConfig};
use crate::config::{AgentConfig, AgentFlags};

/// Flags of `nomad-rs agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Config file or directory of `.hcl` files (repeatable; later ones win).
    #[arg(long = "config", value_name = "PATH")]
    pub config: Vec<PathBuf>,
    /// Development mode: server and client in one process, temporary state, raw_exec enabled.
    #[arg(long)]
    pub dev: bool,
    /// Development mode for Consul Connect: as -dev, listening on every address, with the default
    /// route's interface as the node's (bridge networks reach it). Root only.
    #[arg(long = "dev-connect")]
    pub dev_connect: bool,
    /// Enforce ACLs (`acl { enabled = true }`).
    #[arg(long = "acl-enabled")]
    pub acl_enabled: bool,
    /// Run the server role.
    #[arg(long)]
    pub server: bool,
    /// Run the client role.
    #[arg(long)]
    pub client: bool,
    /// Directory for state.
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Address listeners bind to.
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Servers a client talks to (comma-separated `host:port`).
    #[arg(long, value_name = "ADDRS", value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Datacenter.
    #[arg(long, value_name = "DC")]
    pub dc: Option<String>,
    /// Region.
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// Node (agent) name.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Servers expected before the cluster bootstraps.
    #[arg(long = "bootstrap-expect", value_name = "N")]
    pub bootstrap_expect: Option<usize>,
    /// Server RPC address to join (repeatable).
    #[arg(long = "retry-join", visible_alias = "join", value_name = "ADDR")]
    pub join: Vec<String>,
    /// Log level (TRACE, DEBUG, INFO, WARN, ERROR).
    #[arg(long = "log-level", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// HTTP port (overrides `ports { http }`).
    #[arg(long = "http-port", value_name = "PORT")]
    pub http_port: Option<u16>,
    /// RPC port (overrides `ports { rpc }`).
    #[arg(long = "rpc-port", value_name = "PORT")]
    pub rpc_port: Option<u16>,
    /// The servers' cluster key, base64 (`server { encrypt }`; `nomad-rs operator keygen` makes one).
    #[arg(long, value_name = "KEY")]
    pub encrypt: Option<String>,
    /// The client's state directory (`client { state_dir }`).
    #[arg(long = "state-dir", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The directory allocations live in (`client { alloc_dir }`).
    #[arg(long = "alloc-dir", value_name = "DIR")]
    pub alloc_dir: Option<PathBuf>,
    /// The node's class (`client { node_class }`).
    #[arg(long = "node-class", value_name = "CLASS")]
    pub node_class: Option<String>,
    /// The node's pool (`client { node_pool }`).
    #[arg(long = "node-pool", value_name = "POOL")]
    pub node_pool: Option<String>,
    /// Node metadata, `key=value` (repeatable; added to `client { meta }`).
    #[arg(long, value_name = "KEY=VALUE")]
    pub meta: Vec<String>,
}

impl AgentArgs {
    fn flags(&self) -> AgentFlags {
        AgentFlags {
            config: self.config.clone(),
            dev: self.dev || self.dev_connect,
            dev_connect: self.dev_connect,
            acl_enabled: self.acl_enabled,
            server: self.server,
            client: self.client,
            data_dir: self.data_dir.clone(),
            bind: self.bind.clone(),
            servers: self.servers.clone(),
            dc: self.dc.clone(),
            region: self.region.clone(),
            node: self.node.clone(),
            bootstrap_expect: self.bootstrap_expect,
            join: self.join.clone(),
            log_level: self.log_level.clone(),
            http_port: self.http_port,
            rpc_port: self.rpc_port,
            encrypt: self.encrypt.clone(),
            state_dir: self.state_dir.clone(),
            alloc_dir: self.alloc_dir.clone(),
            node_class: self.node_class.clone(),
            node_pool: self.node_pool.clone(),
            meta: self.meta.clone(),
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM, or until the server role fails for good (its Raft
/// storage cannot be written): then it stops and returns that error, so the process exits
/// non-zero and a supervisor restarts it.
pub async fn run(args: AgentArgs) -> Result<()> {
    if args.dev_connect && !nix::unistd::geteuid().is_root() {
        anyhow::bail!("-dev-connect uses network namespaces and is only supported for root.");
    }
    // Dev mode keeps its state in a temp dir removed on exit.
    let dev_dir = if (args.dev || args.dev_connect) && args.data_dir.is_none() {
        Some(tempfile::Builder::new().prefix("nomad-rs-dev-").tempdir()?)
    } else {
        None
    };
    let mut cfg = AgentConfig::resolve(&args.flags(), dev_dir.as_ref().map(|d| d.path().to_path_buf()))?;
    crate::logging::init(&cfg.log_level);
    if !cfg.sources.is_empty() {
        let list: Vec<String> = cfg.sources.iter().map(|p| p.display().to_string()).collect();
        println!("==> Loaded configuration from {}", list.join(", "));
    }
    for key in &cfg.unused {
        tracing::warn!("agent configuration: {key}");
    }
    if !cfg.dev && !cfg.acl.enabled {
        tracing::warn!(
            "ACLs are disabled: anyone who can reach this agent's HTTP API can run and stop any job; set `acl {{ enabled = true }}` (or -acl-enabled) on every agent and bootstrap a token"
        );
    }
    // HTTPS: the certificates are read now (a bad file stops the start) and again on SIGHUP.
    let https = if cfg.tls.http { Some(crate::tls::ReloadableServer::new(cfg.tls.clone())?) } else { None };
    if let Some(outgoing) = cfg.tls.agent_client()? {
        crate::tls::set_agent_client(outgoing);
    }
    // Mutual TLS on RPC: set before the server and client start, so every channel and the
    // listener use it; the certificates are read now and again on SIGHUP.
    let rpc_tls = cfg.tls.rpc_tls(&cfg.region)?;
    if let Some(tls) = &rpc_tls {
        nomad_server::rpc_tls::install(tls.clone());
    }
    // SIGHUP never stops the agent (its default action would): it reloads what can be reloaded.
    spawn_sighup(https.clone(), rpc_tls)?;
    println!("==> Starting nomad-rs agent...");
    std::fs::create_dir_all(&cfg.data_dir).with_context(|| format!("creating data dir {}", cfg.data_dir.display()))?;

    let http_bind = SocketAddr::new(cfg.bind_addr, cfg.http_port);
    let http_listener = TcpListener::bind(http_bind).await.with_context(|| format!("binding the HTTP listener on {http_bind}"))?;
    let http_addr = http_listener.local_addr()?;
    if cfg.http_port == 0 {
        cfg.advertise_http = http_addr.to_string();
    }

    let mut router = axum::Router::new();
    let mut server = None;
    let client_node_id: Arc<std::sync::OnceLock<String>> = Arc::default();
    if let Some(s) = cfg.server.clone() {
        let rpc_bind = SocketAddr::new(cfg.rpc_bind_addr, cfg.rpc_port);
        let listener = TcpListener::bind(rpc_bind).await.with_context(|| format!("binding the RPC listener on {rpc_bind}"))?;
        if cfg.rpc_port == 0 {
            // An ephemeral port (tests): advertise the one the kernel picked, also to the
            // in-process client that was told to use this server.
            let picked = listener.local_addr()?.to_string();
            if let Some(c) = cfg.client.as_mut() {
                for addr in c.servers.iter_mut().filter(|a| **a == cfg.advertise_rpc) {
                    *addr = picked.clone();
                }
            }
            cfg.advertise_rpc = picked;
        }
        let mut sc = ServerConfig::new(&s.data_dir, cfg.advertise_rpc.clone());
        sc.region = cfg.region.clone();
        sc.datacenter = cfg.datacenter.clone();
        sc.bootstrap_expect = s.bootstrap_expect;
        sc.join = s.join.clone();
        sc.heartbeat = s.heartbeat.clone();
        sc.num_schedulers = s.num_schedulers;
        sc.event_buffer_size = s.event_buffer_size;
        sc.job_max_count = s.job_max_count;
        sc.csi_claim_gc = s.csi_claim_gc.clone();
        sc.acl_token_gc = s.acl_token_gc.clone();
        sc.core_gc = s.core_gc.clone();
        sc.keyring = s.keyring.clone();
        sc.http_advertise = cfg.advertise_http.clone();
        sc.encrypt = s.encrypt.clone();
        sc.name = cfg.name.clone();
        sc.rpc_limits = cfg.limits.rpc();
        // Like Nomad's servers, always with a Consul client (the `consul {}` block, its
        // `CONSUL_*` fallbacks, or Consul's default address): it is used only for SI tokens
        // of Connect tasks and gateway config entries.
        let consul = Arc::new(crate::consul::server::ServerConsul(crate::consul::ConsulClient::new(&cfg.consul)));
        sc.consul = nomad_server::consul::ConsulHandles::from(consul);
        sc.acl = cfg.acl.for_server(&s.data_dir);
        let srv = Server::start(sc, listener).await?;
        let info = AgentInfo {
            name: cfg.name.clone(),
            region: cfg.region.clone(),
            datacenter: cfg.datacenter.clone(),
            config: cfg.to_api_json(),
            addr: cfg.bind_addr.to_string(),
            port: srv.rpc_addr().port(),
            server: true,
            client_node_id: client_node_id.clone(),
        };
        router = router.merge(srv.http_router(info));
        server = Some(srv);
    }

    // The client role starts after the server (in -dev it talks to it) and before the HTTP
    // listener serves, so its routes are there from the first request.
    let client = match cfg.client.clone() {
        Some(settings) => Some(start_client(&cfg, settings).await?),
        None => None,
    };
    // A client-only agent with ACLs resolves tokens through its servers and applies the
    // servers' table to what it answers itself.
    let client_acl = match (&server, &client) {
        (None, Some(c)) if cfg.acl.enabled => {
            let ttl = cfg.acl.token_ttl.min(cfg.acl.policy_ttl);
            Some(Arc::new(crate::client::acl::ClientAcl::new(c.clone(), ttl)))
        }
        _ => None,
    };
    if let Some(c) = &client {
        let _ = client_node_id.set(c.node_id().to_string());
        if server.is_none() {
            // A client-only agent answers its own agent info and forwards the rest of the API
            // (its server authorizes what is forwarded; the agent info needs agent read here).
            let me = serde_json::json!({
                "config": cfg.to_api_json(),
                "member": { "Name": cfg.name, "Addr": cfg.bind_addr.to_string(), "Port": cfg.http_port, "Status": "alive" },
                "stats": { "client": { "node_id": c.node_id() } },
            });
            let local = crate::http_forward::router(Arc::new(c.clone()), me);
            let local = match &client_acl {
                Some(acls) => local.route_layer(axum::middleware::from_fn_with_state(acls.clone(), crate::client::acl::authorize)),
                None => local,
            };
            router = router.merge(local);
        }
    }
    let advertised = advertise_in_consul(&cfg, http_addr, server.as_ref(), client.as_ref());
    router = router.merge(nomad_server::http::health::router(agent_health(server.as_ref(), client.as_ref())));
    let locator = server.as_ref().map(|s| Arc::new(StateLocator(s.store().clone())) as Arc<dyn AllocLocator>);
    let client_routes = crate::client::http::router(ClientHttp { client: client.clone(), locator, own_addr: cfg.advertise_http.clone() });
    // The agent's own routes pass the same authorization table as the server's (with a server here).
    let authorized = |routes: axum::Router| match &server {
        Some(srv) => {
            routes.route_layer(axum::middleware::from_fn_with_state(srv.endpoints().clone(), nomad_server::http::authz::authorize))
        }
        // A client-only agent resolves tokens through its servers and applies the same rows.
        None if cfg.acl.enabled => match &client_acl {
            Some(acls) => routes.route_layer(axum::middleware::from_fn_with_state(acls.clone(), crate::client::acl::authorize)),
            None => routes.route_layer(axum::middleware::from_fn(nomad_server::http::authz::refuse)),
        },
        None => routes,
    };
    router = router.merge(authorized(client_routes));
    // The routes about this agent itself (`/v1/agent/servers`, `/v1/metrics`, `/v1/agent/monitor`,
    // and on a client-only agent 501s for the servers' join and force-leave), authorized as the
    // client routes are.
    let mut metrics = vec![nomad_server::metrics::runtime_source()];
    metrics.extend(server.as_ref().map(Server::metrics_source));
    metrics.extend(client.as_ref().map(Client::metrics_source));
    let local_routes = nomad_server::http::agent_local::router(nomad_server::http::agent_local::AgentLocal {
        client_servers: client.clone().map(|c| Arc::new(c) as Arc<dyn nomad_server::http::agent_local::ClientServers>),
        node_id: client.as_ref().map(|c| c.node_id().to_string()),
        server_name: server.is_some().then(|| format!("{}.{}", cfg.name, cfg.region)),
        server_role: server.is_some(),
        metrics,
        host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
        prometheus: cfg.prometheus_metrics,
        logs: nomad_server::log_hub::LogHub::global().clone(),
    });
    router = router.merge(authorized(local_routes));
    let router = crate::client::http::with_alloc_checks_alias(router);
    if let Some(c) = &client {
        c.task_api().set_router(router.clone());
    }
    // The agent's `limits`: a request head within the handshake timeout, so many connections per client.
    let handshake = https.as_ref().map(crate::tls::ReloadableServer::handshake);
    let http = tokio::spawn(nomad_server::http::listener::serve_with(http_listener, router, cfg.limits.http(), handshake));

    print_banner(&cfg, http_addr, server.as_ref().map(|s| s.rpc_addr()));
    if let Some(srv) = &server
        && !srv.wait_for_leadership(Duration::from_secs(2)).await
        && cfg.server.as_ref().is_some_and(|s| s.bootstrap_expect > 1)
    {
        println!("    Waiting for {} servers to form a cluster...", cfg.server.as_ref().map_or(1, |s| s.bootstrap_expect));
    }

    let server_fatal = server.as_ref().map(|s| s.fatal());
    let fatal = tokio::select! {
        () = wait_for_signal() => {
            println!("==> Caught signal, shutting down...");
            None
        }
        Some(message) = async move { match server_fatal { Some(f) => Some(f.await), None => None } } => {
            println!("==> Server failed, shutting down: {message}");
            Some(message)
        }
    };
    if let Some((sync, stop)) = advertised {
        // Bounded: a Consul that does not answer must not hold the agent's exit.
        let _ = tokio::time::timeout(cfg.consul.timeout * 2, sync.deregister_agent()).await;
        if let Some(stop) = stop {
            stop.cancel();
        }
    }
    http.abort();
    if let Some(client) = client {
        if cfg.dev {
            // A dev agent's state is temporary, so its allocs go with it (as Nomad's do).
            client.shutdown_destroying_allocs().await;
        } else {
            // Tasks keep running; the next agent on this data dir reattaches to them.
            client.shutdown().await;
        }
    }
    if let Some(srv) = server {
        srv.shutdown().await;
    }
    drop(dev_dir);
    match fatal {
        None => Ok(()),
        Some(message) => Err(anyhow::anyhow!("{message}")),
    }
}

/// `consul { auto_advertise }`: the agent's own `nomad`/`nomad-client` services go to the
/// client's Consul sync, or to one of the agent's own for a server-only agent (its stop token is
/// returned with it). `None` when nothing is advertised.
fn advertise_in_consul(
    cfg: &AgentConfig,
    http_bound: SocketAddr,
    server: Option<&Server>,
    client: Option<&Client>,
) -> Option<(Arc<ConsulServices>, Option<tokio_util::sync::CancellationToken>)> {
    use crate::client::consul::agent_services::{AgentAddrs, Role, agent_registrations};
    if !cfg.consul.auto_advertise {
        return None;
    }
    let (sync, stop) = match client.and_then(Client::consul_services) {
        Some(sync) => (sync, None),
        None => {
            let api: Arc<dyn ConsulApi> = Arc::new(ConsulClient::new(&cfg.consul));
            let sync = ConsulServices::new(api, crate::client::consul::sync::SYNC_PERIOD, Duration::ZERO);
            let stop = tokio_util::sync::CancellationToken::new();
            tokio::spawn(sync.clone().run(stop.clone()));
            (sync, Some(stop))
        }
    };
    let addrs = AgentAddrs {
        http_advertise: cfg.advertise_http.clone(),
        http_check: http_bound.to_string(),
        rpc_advertise: cfg.advertise_rpc.clone(),
        rpc_check: server.map(|s| s.rpc_addr().to_string()).unwrap_or_default(),
    };
    if server.is_some() {
        sync.set_agent("server", agent_registrations(&cfg.consul, Role::Server, &addrs));
    }
    if client.is_some() {
        sync.set_agent("client", agent_registrations(&cfg.consul, Role::Client, &addrs));
    }
    Some((sync, stop))
}

/// `/v1/agent/health` for the roles this agent runs, judged as Nomad does: a server is healthy
/// when it knows a leader, a client when it knows servers.
fn agent_health(server: Option<&Server>, client: Option<&Client>) -> nomad_server::http::health::AgentHealth {
    use nomad_server::http::health::{AgentHealth, HealthCheck};
    let server = server.map(|s| {
        let consensus = s.consensus();
        Arc::new(move || consensus.leader_rpc_addr().map(|_| ()).ok_or_else(|| "no leader".to_string())) as HealthCheck
    });
    let client = client.map(|c| {
        let c = c.clone();
        Arc::new(move || if c.servers().is_empty() { Err("no known servers".to_string()) } else { Ok(()) }) as HealthCheck
    });
    AgentHealth { server, client }
}

/// Starts the client role with the agent's settings.
async fn start_client(cfg: &AgentConfig, mut settings: crate::config::ClientSettings) -> Result<Client> {
    let exec_policy = cfg.exec_policy(&settings.options).map_err(anyhow::Error::msg)?;
    if cfg.dev_connect && settings.network_interface.is_none() {
        let iface = crate::client::fingerprint::network::default_route_interface()
            .ok_or_else(|| anyhow::anyhow!("-dev-connect uses network namespaces: could not find public network interface"))?;
        settings.network_interface = Some(iface);
    }
    // A network_interface that names nothing is a configuration error, not a node without a network.
    if let Some(name) = &settings.network_interface {
        crate::client::fingerprint::network::interface_address(name).map_err(anyhow::Error::msg)?;
    }
    let cc_alloc_root = settings.alloc_dir.clone();
    let chroot_env = settings.chroot_env.clone();
    let mut cc = ClientConfig::new(settings, &cfg.name, &cfg.datacenter, &cfg.region, &cfg.advertise_http);
    cc.dev_mode = cfg.dev;
    cc.consul = Some(cfg.consul.clone());
    let mut options = DriverOptions::new(cfg.plugin_enabled("raw_exec"));
    if let Some(root) = cfg.oci_runtime_root().map_err(anyhow::Error::msg)? {
        options.oci.runtime_root = root;
    }
    (options.exec.allow_caps, options.exec.user_denylist) = exec_policy;
    options.exec.chroot_env = chroot_env;
    options.docker = cfg.docker_options().map_err(anyhow::Error::msg)?;
    options.docker.alloc_root = Some(cc_alloc_root);
    let drivers = DriverRegistry::new(&options);
    Client::start(cc, drivers).await.context("starting the client")
}

fn print_banner(cfg: &AgentConfig, http: SocketAddr, rpc: Option<SocketAddr>) {
    println!("==> nomad-rs agent configuration:");
    println!();
    let rpc_str = rpc.map(|r| r.to_string()).unwrap_or_else(|| "-".into());
    println!("       Advertise Addrs: HTTP: {}; RPC: {}", cfg.advertise_http, cfg.advertise_rpc);
    println!("            Bind Addrs: HTTP: [{http}]; RPC: {rpc_str}");
    println!("                Client: {}", cfg.client.is_some());
    println!("             Log Level: {}", cfg.log_level);
    println!("                Region: {} (DC: {})", cfg.region, cfg.datacenter);
    println!("                Server: {}", cfg.server.is_some());
    println!("               Version: {} (nomad-rs {})", nomad_server::http::API_VERSION, env!("CARGO_PKG_VERSION"));
    println!();
    println!("==> nomad-rs agent started! Log data will stream in below:");
    if cfg.dev {
        println!();
        let scheme = if cfg.tls.http { "https" } else { "http" };
        println!("    The HTTP API is at {scheme}://{http}/v1/ (NOMAD_ADDR={scheme}://{http}).");
        println!("    Try a first job:  nomad-rs job run examples/hello.nomad.hcl");
    }
    println!();
}

/// Handles SIGHUP for the agent's life: the TLS certificates and keys are read again (a bad
/// file keeps the ones in use, with an error in the log).
fn spawn_sighup(https: Option<Arc<crate::tls::ReloadableServer>>, rpc: Option<Arc<nomad_server::rpc_tls::RpcTls>>) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            println!("==> Caught signal: hangup");
            if let Some(h) = &https {
                match h.reload() {
                    Ok(()) => tracing::info!("TLS certificates reloaded"),
                    Err(e) => tracing::error!(error = %format!("{e:#}"), "reloading the TLS certificates failed; the ones in use stay"),
                }
            }
            if let Some(r) = &rpc {
                match r.reload() {
                    Ok(()) => tracing::info!("RPC TLS certificates reloaded"),
                    Err(e) => tracing::error!(error = %e, "reloading the RPC TLS certificates failed; the ones in use stay"),
                }
            }
        }
    });
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
