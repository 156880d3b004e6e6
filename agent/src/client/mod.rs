//! The client role: runs allocations on this host.
//!
//! ```text
//!  Client::start
//!    ├─ local state (redb): node identity, allocs, task states and handles, hook states
//!    ├─ restore: every stored alloc gets its runner back before any server is contacted
//!    ├─ heartbeat.rs  register, then heartbeat every TTL        ──▶ Node.Register / UpdateStatus
//!    ├─ watch.rs      blocking GetClientAllocs, pull, diff      ──▶ Node.GetClientAllocs / Alloc.GetAllocs
//!    │      └─ add / update (reconnect.rs decides) / remove alloc runners
//!    ├─ sync.rs       batched client alloc states every 200 ms  ──▶ Node.UpdateAlloc
//!    └─ driver fingerprints, periodically; a change re-registers the node
//!
//!  allocrunner/ ─▶ hooks ─▶ taskrunner/ ─▶ hooks ─▶ driver/ ─▶ executor (outlives the agent)
//! ```
//!
//! The client keeps running its tasks while it cannot reach any server; it catches up (and the
//! servers' reconnect protocol sorts out the order) when a server answers again.

pub mod acl;
pub mod agent_api;
pub mod allocrunner;
pub mod artifact;
pub mod base64;
pub mod checks;
pub mod connect;
pub mod consul;
pub mod context;
pub mod csi;
pub mod driver;
pub mod fingerprint;
pub mod gc;
pub mod heartbeat;
pub mod http;
pub mod network;
pub mod reconnect;
pub mod register;
pub mod server_requests;
pub mod servers;
pub mod services;
pub mod si_tokens;
pub mod state;
pub mod sync;
pub mod task_api;
pub mod taskrunner;
pub mod template;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use nomad_proto::{Allocation, Node};
use tokio::sync::{Notify, mpsc, watch as tokio_watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::allocrunner::AllocRunner;
use self::consul::sync::ConsulServices;
use self::consul::{ConsulApi, ConsulClient};
use self::context::ClientContext;
use self::driver::DriverRegistry;
use self::fingerprint::{apply_drivers, drivers_changed};
use self::servers::Servers;
use self::state::{NodeIdentity, StateDb, StateError};
use self::taskrunner::lock;
use crate::config::ClientSettings;
use crate::config::consul::ConsulSettings;

/// Everything the client role runs with.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `client { ... }` and `-servers`.
    pub settings: ClientSettings,
    /// Node name.
    pub node_name: String,
    /// Datacenter.
    pub datacenter: String,
    /// Region.
    pub region: String,
    /// The agent's advertised HTTP address (the node's `HTTPAddr`).
    pub http_addr: String,
    /// Dev mode: retries every second, no heartbeat stagger.
    pub dev_mode: bool,
    /// Mount task secrets dirs as tmpfs where the platform allows.
    pub secrets_tmpfs: bool,
    /// Upper bound on any task's `kill_timeout`.
    pub max_kill_timeout: Duration,
    /// How often pending alloc updates are sent.
    pub sync_interval: Duration,
    /// How often drivers are fingerprinted again.
    pub driver_fingerprint_interval: Duration,
    /// Longest a blocking alloc query waits on the servers.
    pub max_query_time: Duration,
    /// The agent's `consul {}`; `None` leaves Consul out (no fingerprint, no calls).
    pub consul: Option<ConsulSettings>,
    /// How often Consul is fingerprinted again (Nomad: 15 s).
    pub consul_fingerprint_interval: Duration,
    /// How often Consul services are reconciled when nothing changes (Nomad: 30 s).
    pub consul_sync_interval: Duration,
    /// How long after the start unknown Nomad entries in Consul are kept (Nomad: 1 min).
    pub consul_deregister_probation: Duration,
}

impl ClientConfig {
    /// Nomad's defaults around the given settings.
    pub fn new(settings: ClientSettings, node_name: &str, datacenter: &str, region: &str, http_addr: &str) -> ClientConfig {
        ClientConfig {
            settings,
            node_name: node_name.to_string(),
            datacenter: datacenter.to_string(),
            region: region.to_string(),
            http_addr: http_addr.to_string(),
            dev_mode: false,
            secrets_tmpfs: true,
            max_kill_timeout: Duration::from_secs(30),
            sync_interval: Duration::from_millis(200),
            driver_fingerprint_interval: Duration::from_secs(30),
            max_query_time: Duration::from_secs(300),
            consul: None,
            consul_fingerprint_interval: fingerprint::consul::CONSUL_FINGERPRINT_PERIOD,
            consul_sync_interval: consul::sync::SYNC_PERIOD,
            consul_deregister_probation: consul::sync::DEREGISTER_PROBATION,
        }
    }
}

/// Why the client could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The local state could not be opened or read.
    #[error(transparent)]
    State(#[from] StateError),
    /// A directory could not be created.
    #[error("create {path}: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Counters, for tests and diagnostics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Successful registrations.
    pub registrations: AtomicU64,
    /// Successful heartbeats.
    pub heartbeats: AtomicU64,
    /// Completed alloc watch passes.
    pub alloc_pulls: AtomicU64,
    /// Syncer ticks.
    pub sync_ticks: AtomicU64,
    /// Alloc updates the servers accepted.
    pub alloc_updates_sent: AtomicU64,
    /// Allocs waiting to be sent at the last tick.
    pub sync_pending: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Successful registrations.
    pub registrations: u64,
    /// Successful heartbeats.
    pub heartbeats: u64,
    /// Completed alloc watch passes.
    pub alloc_pulls: u64,
    /// Syncer ticks.
    pub sync_ticks: u64,
    /// Alloc updates the servers accepted.
    pub alloc_updates_sent: u64,
    /// Allocs waiting to be sent at the last tick.
    pub sync_pending: u64,
}

/// The client's shared core.
pub(crate) struct ClientInner {
    config: ClientConfig,
    ctx: Arc<ClientContext>,
    identity: NodeIdentity,
    servers: Arc<Servers>,
    allocs: Mutex<BTreeMap<String, Arc<AllocRunner>>>,
    invalid_allocs: Mutex<BTreeSet<String>>,
    servers_contacted: tokio_watch::Sender<bool>,
    /// Successful registrations so far (the alloc watch waits for the first).
    registered: tokio_watch::Sender<u64>,
    node_changed: Notify,
    stats: Stats,
    gc: gc::Collector,
}

/// The SI token deriver, when the agent's Consul config has a token: Nomad's only sign that
/// Consul ACLs are on, and its condition for the `consul_si_token` hook.
fn si_token_deriver(
    config: &ClientConfig,
    servers: &Arc<Servers>,
    identity: &state::NodeIdentity,
) -> Option<Arc<dyn taskrunner::hooks::consul_si_token::SiTokenDeriver>> {
    let with_token = config.consul.as_ref().is_some_and(|c| !c.token.is_empty());
    with_token.then(|| {
        Arc::new(si_tokens::RpcSiTokens::new(servers.clone(), &identity.node_id, &identity.secret_id, &config.region))
            as Arc<dyn taskrunner::hooks::consul_si_token::SiTokenDeriver>
    })
}

/// A running client role. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl Client {
    /// Starts the client: opens the local state, restores every stored alloc (reattaching to
    /// running tasks) before talking to any server, then registers, heartbeats, watches allocs
    /// and syncs their state in the background.
    pub async fn start(config: ClientConfig, drivers: DriverRegistry) -> Result<Client, ClientError> {
        let s = &config.settings;
        for dir in [&s.state_dir, &s.alloc_dir] {
            std::fs::create_dir_all(dir).map_err(|source| ClientError::Dir { path: dir.display().to_string(), source })?;
        }
        let state = Arc::new(StateDb::open(&s.state_dir)?);
        let identity = register::load_or_create_identity(&state)?;
        let driver_infos = drivers.fingerprint_all().await;
        let mut node = register::node(&config, &identity, &driver_infos);
        let consul_client = config.consul.as_ref().map(|c| Arc::new(ConsulClient::new(c)));
        let consul: Option<Arc<dyn ConsulApi>> = consul_client.clone().map(|c| c as Arc<dyn ConsulApi>);
        // The first Consul fingerprint is part of the first registration, as in Nomad.
        let consul_seen = match &consul {
            Some(api) => {
                let fp = fingerprint::consul::fingerprint_consul(api.as_ref(), false).await;
                log_consul_state(None, &fp);
                fingerprint::consul::apply_consul(&mut node, fp.as_ref().ok());
                Some(fp.is_ok())
            }
            None => None,
        };
        let (updates_tx, updates_rx) = mpsc::unbounded_channel();
        let servers = Arc::new(Servers::new(config.settings.servers.clone()));
        let registrar = Arc::new(services::RpcRegistrar::new(servers.clone(), &identity.node_id, &identity.secret_id));
        let csi_connect = csi::grpc_connector();
        let csi_manager = csi::CsiManager::new(csi::FINGERPRINT_INTERVAL, csi_connect.clone(), s.state_dir.join("csi"));
        let consul_services =
            consul.as_ref().map(|api| ConsulServices::new(api.clone(), config.consul_sync_interval, config.consul_deregister_probation));
        let consul_checks = consul.as_ref().map(|api| consul::checks::CheckWatcher::new(api.clone(), consul::checks::POLL_PERIOD));
        let netns_maker = drivers.netns_maker();
        let nomad_checks = checks::CheckStore::restore(state.clone());
        let nomad_check_watcher = consul::checks::CheckWatcher::with_getter(nomad_checks.clone(), consul::checks::POLL_PERIOD);
        let ctx = Arc::new(ClientContext {
            state: state.clone(),
            drivers,
            node: RwLock::new(Arc::new(node)),
            alloc_root: s.alloc_dir.clone(),
            task_state_root: s.state_dir.join("tasks"),
            region: config.region.clone(),
            secrets_tmpfs: config.secrets_tmpfs,
            max_kill_timeout: config.max_kill_timeout,
            host_env: taskrunner::env::host_env(),
            updates: updates_tx,
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            gc_trigger: Notify::new(),
            registrar,
            csi_root: s.state_dir.join("csi"),
            csi_plugins: csi_manager.clone(),
            csi_connect,
            csi_volumes: csi_manager.clone(),
            csi_rpc: Arc::new(allocrunner::hooks::RpcCsiClaims::new(servers.clone(), &identity.secret_id)),
            node_id: identity.node_id.clone(),
            consul_services: consul_services.clone(),
            consul_checks: consul_checks.clone(),
            si_tokens: si_token_deriver(&config, &servers, &identity),
            identities: Arc::new(si_tokens::RpcIdentities::new(servers.clone(), &identity.node_id, &identity.secret_id, &config.region)),
            task_api: Arc::default(),
            si_backoff: Default::default(),
            consul_config: config.consul.clone(),
            consul_api: consul.clone(),
            consul_query: consul_client.map(|c| c as Arc<dyn crate::consul::ConsulQuery>),
            envoy_retry: Default::default(),
            nomad_checks,
            nomad_check_watcher: nomad_check_watcher.clone(),
            artifacts: Arc::new(artifact::HttpGetter::new(s.artifact)),
            template: s.template.clone(),
            network: Arc::new(network::CniNetworks::new(s.cni.clone(), &s.state_dir).with_maker(netns_maker)),
        });
        let gc = gc::Collector::new(s.gc.clone(), s.reserved.disk.unwrap_or(0));
        let inner = Arc::new(ClientInner {
            servers,
            config,
            ctx: ctx.clone(),
            identity,
            allocs: Mutex::new(BTreeMap::new()),
            invalid_allocs: Mutex::new(BTreeSet::new()),
            servers_contacted: tokio_watch::channel(false).0,
            registered: tokio_watch::channel(0).0,
            node_changed: Notify::new(),
            stats: Stats::default(),
            gc,
        });

        // Restore before any server is contacted: tasks are reattached, or their exits
        // recorded, from local state alone.
        for alloc in state.allocs()? {
            let id = alloc.id.clone();
            match AllocRunner::new(ctx.clone(), alloc, true) {
                Ok(runner) => {
                    lock(&inner.allocs).insert(id, runner.clone());
                    ctx.tracker.spawn(runner.run());
                }
                Err(e) => tracing::error!(alloc_id = %id, error = %e, "restoring an alloc failed"),
            }
        }
        tracing::info!(node_id = %inner.identity.node_id, allocs = lock(&inner.allocs).len(), "client started");

        ctx.tracker.spawn(inner.clone().register_and_heartbeat());
        ctx.tracker.spawn(inner.clone().watch_allocations());
        ctx.tracker.spawn(inner.clone().sync_allocs(updates_rx));
        ctx.tracker.spawn(inner.clone().fingerprint_drivers());
        ctx.tracker.spawn(inner.clone().collect_garbage());
        ctx.tracker.spawn(csi_manager.clone().run(ctx.shutdown.clone()));
        // The servers' calls to this client (CSI controller and node detach), over the stream it
        // keeps to its server. A node detach is the volume manager's unmount.
        let node_detach: Arc<dyn csi::endpoint::NodeDetach> = Arc::new(csi::endpoint::VolumeManagerDetach(csi_manager.clone()));
        let handler =
            Arc::new(server_requests::ServerRequestHandler::new(csi::endpoint::CsiEndpoint::new(csi_manager.clone(), node_detach)));
        let creds =
            server_requests::NodeCredentials { node_id: inner.identity.node_id.clone(), secret_id: inner.identity.secret_id.clone() };
        ctx.tracker.spawn(server_requests::run(
            inner.servers.clone(),
            creds,
            handler,
            inner.registered.subscribe(),
            server_requests::Backoff::default(),
            ctx.shutdown.clone(),
        ));
        ctx.tracker.spawn(inner.clone().apply_csi_plugins(csi_manager.subscribe()));
        if let Some(api) = consul {
            ctx.tracker.spawn(inner.clone().fingerprint_consul(api, consul_seen));
        }
        if let Some(sync) = consul_services {
            ctx.tracker.spawn(sync.run(ctx.shutdown.clone()));
        }
        if let Some(watcher) = consul_checks {
            ctx.tracker.spawn(watcher.run(ctx.shutdown.clone()));
        }
        ctx.tracker.spawn(nomad_check_watcher.run(ctx.shutdown.clone()));
        Ok(Client { inner })
    }

    /// The task API: the agent hands it its router once built.
    pub fn task_api(&self) -> &Arc<task_api::TaskApi> {
        &self.inner.ctx.task_api
    }

    /// The node ID.
    pub fn node_id(&self) -> &str {
        &self.inner.identity.node_id
    }

    /// The node as last registered.
    pub fn node(&self) -> Arc<Node> {
        self.inner.ctx.node()
    }

    /// The runner of a local alloc.
    pub fn alloc_runner(&self, alloc_id: &str) -> Option<Arc<AllocRunner>> {
        lock(&self.inner.allocs).get(alloc_id).cloned()
    }

    /// The Nomad service check results of a local alloc; `None` when it has none.
    pub fn nomad_check_results(&self, alloc_id: &str) -> Option<checks::AllocResults> {
        use checks::CheckResults;
        self.inner.ctx.nomad_checks.alloc_results(alloc_id)
    }

    /// Where alloc dirs go.
    pub fn alloc_root(&self) -> std::path::PathBuf {
        self.inner.ctx.alloc_root.clone()
    }

    /// The Consul service sync, when the agent has a `consul {}` block.
    pub fn consul_services(&self) -> Option<Arc<ConsulServices>> {
        self.inner.ctx.consul_services.clone()
    }

    /// IDs of the local allocs.
    pub fn alloc_ids(&self) -> Vec<String> {
        lock(&self.inner.allocs).keys().cloned().collect()
    }

    /// The servers the client knows, current first-come order.
    pub fn servers(&self) -> Vec<String> {
        self.inner.servers.all()
    }

    /// HTTP address of a server that answered this client, for forwarding API requests.
    pub fn server_http_addr(&self) -> Option<String> {
        self.inner.servers.http_addr()
    }

    /// True once an alloc pull succeeded (the syncer may send).
    pub fn servers_contacted(&self) -> bool {
        *self.inner.servers_contacted.borrow()
    }

    /// Counters.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.inner.stats;
        StatsSnapshot {
            registrations: s.registrations.load(Ordering::Relaxed),
            heartbeats: s.heartbeats.load(Ordering::Relaxed),
            alloc_pulls: s.alloc_pulls.load(Ordering::Relaxed),
            sync_ticks: s.sync_ticks.load(Ordering::Relaxed),
            alloc_updates_sent: s.alloc_updates_sent.load(Ordering::Relaxed),
            sync_pending: s.sync_pending.load(Ordering::Relaxed),
        }
    }

    /// Destroys every alloc (tasks killed, alloc dirs removed), then shuts down: what a dev
    /// agent does, since its state dir goes away with it.
    pub async fn shutdown_destroying_allocs(&self) {
        let runners: Vec<Arc<AllocRunner>> = lock(&self.inner.allocs).values().cloned().collect();
        futures::future::join_all(runners.iter().map(|r| r.destroy())).await;
        self.shutdown().await;
    }

    /// Stops the client role and waits until every runner and loop has stopped. Tasks keep
    /// running: a client started later on the same state dir reattaches to them. The local
    /// state is closed on the way out, not when the last holder drops it: a watcher that has
    /// not yet seen the cancellation must not keep the next client from opening it.
    pub async fn shutdown(&self) {
        let ctx = &self.inner.ctx;
        ctx.shutdown.cancel();
        ctx.tracker.close();
        ctx.tracker.wait().await;
        lock(&self.inner.allocs).clear();
        ctx.state.close();
    }
}

impl ClientInner {
    fn known_allocs(&self) -> BTreeMap<String, u64> {
        lock(&self.allocs).iter().map(|(id, r)| (id.clone(), r.alloc().alloc_modify_index)).collect()
    }

    /// Hands every alloc's current state to the syncer, changed or not (the servers wait for
    /// one before a returning node becomes `ready`).
    fn resend_alloc_states(&self) {
        let runners: Vec<Arc<AllocRunner>> = lock(&self.allocs).values().cloned().collect();
        for r in runners {
            let _ = self.ctx.updates.send(r.client_alloc());
        }
    }

    /// Applies one alloc watch pass; new allocs start once the GC made room for them.
    async fn run_allocs(&self, diff: watch::Diff) {
        for id in diff.removed {
            let Some(runner) = lock(&self.allocs).remove(&id) else { continue };
            tracing::info!(alloc_id = %id, "alloc removed by the servers; destroying it");
            self.ctx.tracker.spawn(async move { runner.destroy().await });
        }
        for alloc in diff.updated {
            self.update_alloc(alloc);
        }
        self.make_room_for(&diff.added).await;
        for alloc in diff.added {
            self.add_alloc(alloc);
        }
    }

    fn update_alloc(&self, update: Allocation) {
        let Some(runner) = lock(&self.allocs).get(&update.id).cloned() else { return };
        if reconnect::should_reconnect(runner.alloc().alloc_modify_index, &update) {
            tracing::info!(alloc_id = %update.id, "reconnecting an alloc the servers marked unknown");
            if let Err(e) = runner.reconnect(&update) {
                tracing::error!(alloc_id = %update.id, error = %e, "reconnecting the alloc failed");
            }
            return;
        }
        if let Err(e) = self.ctx.state.put_alloc(&update) {
            tracing::error!(alloc_id = %update.id, error = %e, "persisting the updated alloc failed");
        }
        runner.update(update);
    }

    fn add_alloc(&self, alloc: Allocation) {
        let id = alloc.id.clone();
        if lock(&self.allocs).contains_key(&id) {
            return;
        }
        // Stored before the runner exists, so a crash right after still knows the alloc.
        if let Err(e) = self.ctx.state.put_alloc(&alloc) {
            tracing::error!(alloc_id = %id, error = %e, "persisting the new alloc failed");
            return;
        }
        match AllocRunner::new(self.ctx.clone(), alloc, false) {
            Ok(runner) => {
                lock(&self.allocs).insert(id, runner.clone());
                self.ctx.tracker.spawn(runner.run());
            }
            Err(e) => {
                tracing::error!(alloc_id = %id, error = %e, "creating the alloc runner failed");
                lock(&self.invalid_allocs).insert(id);
            }
        }
    }

    /// Fingerprints the drivers again every interval; a change updates the node and registers it
    /// again.
    async fn fingerprint_drivers(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.driver_fingerprint_interval) => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
            let infos = self.ctx.drivers.fingerprint_all().await;
            let changed = self.ctx.update_node(|node| {
                let changed = drivers_changed(&node.drivers, &infos);
                if changed {
                    apply_drivers(node, &infos);
                }
                changed
            });
            if changed {
                self.node_changed.notify_one();
            }
        }
    }
}

impl ClientInner {
    /// Puts the CSI manager's plugin maps on the node as they change, and registers it again
    /// so the servers' plugin table follows.
    async fn apply_csi_plugins(self: Arc<Self>, mut maps: tokio_watch::Receiver<csi::CsiMaps>) {
        loop {
            tokio::select! {
                changed = maps.changed() => if changed.is_err() { return },
                _ = self.ctx.shutdown.cancelled() => return,
            }
            let csi::CsiMaps { controllers, nodes } = maps.borrow_and_update().clone();
            self.ctx.update_node(|n| {
                n.csi_controller_plugins = controllers;
                n.csi_node_plugins = nodes;
                true
            });
            self.node_changed.notify_one();
        }
    }
}

impl ClientInner {
    /// Fingerprints Consul again every interval; a change (Consul appeared, went away, was
    /// upgraded) updates the node and registers it again, so the servers see it.
    async fn fingerprint_consul(self: Arc<Self>, api: Arc<dyn ConsulApi>, mut seen: Option<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.consul_fingerprint_interval) => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
            let fp = fingerprint::consul::fingerprint_consul(api.as_ref(), false).await;
            log_consul_state(seen, &fp);
            seen = Some(fp.is_ok());
            if self.ctx.update_node(|node| fingerprint::consul::apply_consul(node, fp.as_ref().ok())) {
                self.node_changed.notify_one();
            }
        }
    }
}

/// Logs Consul becoming available or unavailable (not every failed period); like Nomad, a
/// Consul that was never there is not reported as lost.
fn log_consul_state(before: Option<bool>, now: &Result<fingerprint::consul::ConsulFingerprint, String>) {
    match (before, now) {
        (Some(true), Ok(_)) | (Some(false), Err(_)) => {}
        (_, Ok(fp)) => {
            tracing::info!(version = fp.attributes.get("consul.version").map(String::as_str).unwrap_or(""), "consul agent is available")
        }
        (Some(true), Err(e)) => tracing::info!(error = %e, "consul agent is unavailable"),
        (None, Err(e)) => tracing::debug!(error = %e, "consul agent is unavailable"),
    }
}

impl crate::http_forward::ServerAddress for Client {
    fn server_http_addr(&self) -> Option<String> {
        Client::server_http_addr(self)
    }
}
