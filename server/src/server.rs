//! Assembling a server: state store, FSM, Raft, endpoints, RPC listener and
//! the leader-only subsystems.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::client_conn::{ClientCalls, ClientConnService, ClientConns, RpcClientCsi};
use crate::consensus::{Consensus, RaftConsensus};
use crate::endpoints::{EndpointConfig, Endpoints};
use crate::events::EventBroker;
use crate::fsm::ServerFsm;
use crate::heartbeat::{HeartbeatConfig, Heartbeater};
use crate::http::forward::{ForwardService, LeaderForwarder};
use crate::http::{AgentInfo, HttpState};
use crate::leader::{Leader, LeaderConfig, LeaderDeps};
use crate::raft::{RaftConfig, RaftNode};
use crate::rpc::{ClientRpc, Peers};
use crate::rpc_auth::{ClusterAuth, ClusterKey, KeyError, RpcAuthLayer};
use crate::state::StateStore;

/// Settings of the server role (`server { ... }` plus the agent's basics).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where Raft keeps its log and snapshots (under `raft/`).
    pub data_dir: PathBuf,
    /// Region.
    pub region: String,
    /// Datacenter.
    pub datacenter: String,
    /// Address other servers and clients reach the RPC listener on (`host:port`).
    pub rpc_advertise: String,
    /// Servers expected to form the cluster.
    pub bootstrap_expect: usize,
    /// Other servers' RPC addresses to form or join the cluster.
    pub join: Vec<String>,
    /// Heartbeat settings.
    pub heartbeat: HeartbeatConfig,
    /// Scheduler workers on the leader (0: one per core).
    pub num_schedulers: usize,
    /// Raft snapshot threshold (entries).
    pub raft_snapshot_logs: u64,
    /// Event batches kept for `/v1/event/stream` resumption.
    pub event_buffer_size: usize,
    /// This server's advertised HTTP address, told to clients so client-only
    /// agents can forward API requests.
    pub http_advertise: String,
    /// The cluster key (`server { encrypt }`, base64) servers prove themselves to each other
    /// with. `None`: the key stored in the data dir, or a new one for a server that forms a
    /// cluster of one.
    pub encrypt: Option<String>,
    /// Most allocs one job may ask for over all its groups (`server { job_max_count }`).
    pub job_max_count: i64,
    /// The agent's name; the server's member name is `<name>.<region>`. Empty: the name the
    /// [`AgentInfo`] given to [`Server::http_router`] carries.
    pub name: String,
    /// The RPC listener's limits (the agent's `limits { rpc_* }`).
    pub rpc_limits: crate::rpc_listener::RpcLimits,
    /// The CSI volume claim GC (`server { csi_volume_claim_gc_interval, csi_volume_claim_gc_threshold }`).
    pub csi_claim_gc: crate::leader::ClaimGcConfig,
    /// Consul, for SI tokens and gateway config entries (the agent's `consul {}` block).
    pub consul: crate::consul::ConsulHandles,
    /// ACLs (the agent's `acl {}` block); off by default.
    pub acl: crate::acl::AclConfig,
    /// The expired ACL token GC (`server { acl_token_gc_threshold }`), run while ACLs are on.
    pub acl_token_gc: crate::leader::TokenGcConfig,
    /// The periodic GC (`server { job_gc_interval, *_gc_threshold }`).
    pub core_gc: crate::endpoints::GcConfig,
    /// Root key rotation and GC (`server { root_key_* }`).
    pub keyring: crate::leader::KeyringConfig,
}

impl ServerConfig {
    /// Defaults for a single server with its data under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>, rpc_advertise: impl Into<String>) -> ServerConfig {
        ServerConfig {
            data_dir: data_dir.into(),
            region: nomad_proto::job::DEFAULT_REGION.to_string(),
            datacenter: "dc1".to_string(),
            rpc_advertise: rpc_advertise.into(),
            bootstrap_expect: 1,
            join: Vec::new(),
            heartbeat: HeartbeatConfig::default(),
            num_schedulers: 0,
            raft_snapshot_logs: 8192,
            event_buffer_size: 100,
            http_advertise: String::new(),
            encrypt: None,
            job_max_count: nomad_proto::limits::DEFAULT_JOB_MAX_COUNT,
            name: String::new(),
            rpc_limits: crate::rpc_listener::RpcLimits::default(),
            csi_claim_gc: crate::leader::ClaimGcConfig::default(),
            consul: crate::consul::ConsulHandles::default(),
            acl: crate::acl::AclConfig::default(),
            acl_token_gc: crate::leader::TokenGcConfig::default(),
            core_gc: crate::endpoints::GcConfig::default(),
            keyring: crate::leader::KeyringConfig::default(),
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Raft could not start (storage, configuration).
    #[error("starting raft: {0}")]
    Raft(#[from] crate::raft::RaftError),
    /// A listener failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The cluster key is missing or unusable.
    #[error("{0}")]
    Key(#[from] KeyError),
}

/// A running server.
pub struct Server {
    store: Arc<StateStore>,
    consensus: Arc<RaftConsensus>,
    endpoints: Endpoints,
    tasks: Vec<JoinHandle<()>>,
    rpc_addr: std::net::SocketAddr,
    peers: Peers,
    forward_service: ForwardService,
    /// What `/v1/metrics` reads: the leader's broker, blocked evals and heartbeat timers.
    broker: Arc<crate::broker::EvalBroker>,
    blocked: Arc<crate::broker::BlockedEvals>,
    heartbeats: Arc<Heartbeater>,
}

impl Server {
    /// Starts the server role: Raft over `data_dir`, the RPC services on
    /// `rpc_listener`, and the leader loop.
    pub async fn start(cfg: ServerConfig, rpc_listener: TcpListener) -> Result<Server, ServerError> {
        let rpc_addr = rpc_listener.local_addr()?;
        let store = Arc::new(StateStore::new());
        let events = Arc::new(EventBroker::new(cfg.event_buffer_size));
        let fsm = Arc::new(ServerFsm::with_events(store.clone(), events.clone()));
        let single_server = cfg.bootstrap_expect <= 1 && cfg.join.is_empty();
        let key = ClusterKey::load_or_create(&cfg.data_dir, cfg.encrypt.as_deref(), single_server)?;
        let keyring = Arc::new(crate::keyring::Keyring::for_cluster(&key));
        let auth = ClusterAuth::new(key, &cfg.region);
        let mut raft_cfg = RaftConfig::new(cfg.data_dir.clone(), cfg.rpc_advertise.clone(), auth.clone());
        raft_cfg.bootstrap_expect = cfg.bootstrap_expect;
        raft_cfg.join = cfg.join.clone();
        raft_cfg.snapshot_logs = cfg.raft_snapshot_logs;
        if !cfg.name.is_empty() {
            raft_cfg.name = format!("{}.{}", cfg.name, cfg.region);
        }
        let raft = RaftNode::start(raft_cfg, fsm).await?;
        let consensus = RaftConsensus::new(raft.clone());
        let heartbeats = Arc::new(Heartbeater::new(cfg.heartbeat.clone()));
        let scheduler: Arc<dyn crate::scheduler::Scheduler> = Arc::new(crate::scheduler::BuiltinScheduler);
        let endpoints = Endpoints::new(
            store.clone(),
            consensus.clone(),
            heartbeats.clone(),
            EndpointConfig {
                region: cfg.region.clone(),
                datacenter: cfg.datacenter.clone(),
                http_addr: cfg.http_advertise.clone(),
                job_limits: nomad_proto::JobLimits { max_count: cfg.job_max_count },
                ..EndpointConfig::default()
            },
        )
        .with_events(events)
        .with_scheduler(scheduler.clone())
        .with_consul(cfg.consul.clone())
        .with_acl(cfg.acl.clone())
        .with_keyring(keyring.clone());
        let peers = Peers::new(auth.clone());
        // Calls to clients go over the streams clients keep open to their server; a stream held
        // by another server is reached through it (`client_conn`).
        let conns = ClientConns::new();
        let client_calls = ClientCalls::new(conns.clone(), consensus.clone(), peers.clone(), &cfg.rpc_advertise);
        let endpoints = endpoints.with_client_csi(Arc::new(RpcClientCsi::new(client_calls)));
        let client_conn_svc = ClientConnService::server(conns.clone());
        let client_rpc = ClientRpc::new(endpoints.clone(), peers.clone()).with_conns(conns);
        let (node_svc, alloc_svc) = client_rpc.services();
        let service_svc = client_rpc.service_registration();
        let csi_volume_svc = client_rpc.csi_volume();
        let forward_service = ForwardService::new();
        let forward_svc = forward_service.server();
        let rpc_limits = cfg.rpc_limits;
        let rpc_tls = crate::rpc_tls::current();
        let rpc = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                // Pings find a client gone without a word (a partition), so its request
                // stream ends and calls to it fail instead of waiting out their deadline.
                .http2_keepalive_interval(Some(Duration::from_secs(20)))
                .http2_keepalive_timeout(Some(Duration::from_secs(20)))
                // Who may call what: one table (`rpc_auth::RPC_TABLE`) in front of every service.
                .layer(RpcAuthLayer::new(auth).with_roles(rpc_tls.as_ref().and_then(|t| t.role_check())))
                .add_service(raft.service())
                .add_service(forward_svc)
                .add_service(client_conn_svc)
                .add_service(node_svc)
                .add_service(alloc_svc)
                .add_service(service_svc)
                .add_service(csi_volume_svc)
                // TCP_NODELAY on every accepted connection (a gRPC reply is written as several
                // frames, and with Nagle's algorithm the last one would wait for the peer's
                // delayed ACK, about 40 ms per call on Linux), and the `limits`.
                // Over TLS when `tls { rpc = true }` (`rpc_tls`).
                .serve_with_incoming(crate::rpc_listener::incoming_with(rpc_listener, rpc_limits, rpc_tls))
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "rpc listener stopped");
            }
        });
        let mut leader_cfg = LeaderConfig::default();
        if cfg.num_schedulers > 0 {
            leader_cfg.num_schedulers = cfg.num_schedulers;
        }
        leader_cfg.csi_claim_gc = cfg.csi_claim_gc.clone();
        leader_cfg.acl_token_gc = cfg.acl.enabled.then(|| cfg.acl_token_gc.clone());
        leader_cfg.core_gc = cfg.core_gc.clone();
        leader_cfg.keyring = cfg.keyring.clone();
        let leader = Arc::new(
            Leader::new(
                LeaderDeps {
                    store: store.clone(),
                    consensus: consensus.clone(),
                    heartbeats: heartbeats.clone(),
                    heartbeat_expiry: Arc::new(endpoints.clone()),
                    scheduler,
                    volume_watch: Arc::new(endpoints.clone()),
                    claim_gc: Arc::new(endpoints.clone()),
                    keyring,
                },
                leader_cfg,
            )
            .with_consul_acl(cfg.consul.acl.clone()),
        );
        let (broker, blocked) = (leader.broker().clone(), leader.blocked().clone());
        let leader = tokio::spawn(leader.run());
        Ok(Server { store, consensus, endpoints, tasks: vec![rpc, leader], rpc_addr, peers, forward_service, broker, blocked, heartbeats })
    }

    /// The server role's figures for `/v1/metrics`, under Nomad's names: Raft's last and
    /// applied indexes, and on the leader the eval broker, blocked evals, heartbeat timers and
    /// job statuses (a follower runs none of those, so it reports none).
    pub fn metrics_source(&self) -> crate::metrics::MetricsSource {
        let (raft, consensus, store) = (self.consensus.raft().clone(), self.consensus.clone(), self.store.clone());
        let (broker, blocked, heartbeats) = (self.broker.clone(), self.blocked.clone(), self.heartbeats.clone());
        Arc::new(move |m: &mut crate::metrics::MetricsSnapshot| {
            let raft_metrics = raft.metrics().borrow().clone();
            m.gauge("nomad.raft.lastIndex", raft_metrics.last_log_index.unwrap_or(0) as f64, &[]);
            m.gauge("nomad.raft.appliedIndex", raft_metrics.last_applied.map_or(0, |l| l.index) as f64, &[]);
            if !consensus.is_leader() {
                return;
            }
            let b = broker.stats();
            m.gauge("nomad.nomad.broker.total_ready", b.ready as f64, &[]);
            m.gauge("nomad.nomad.broker.total_unacked", b.unacked as f64, &[]);
            m.gauge("nomad.nomad.broker.total_pending", b.pending as f64, &[]);
            m.gauge("nomad.nomad.broker.total_waiting", b.delayed as f64, &[]);
            m.gauge("nomad.nomad.broker.total_cancelable", b.cancelable as f64, &[]);
            let bl = blocked.stats();
            m.gauge("nomad.nomad.blocked_evals.total_blocked", bl.captured as f64, &[]);
            m.gauge("nomad.nomad.blocked_evals.total_escaped", bl.escaped as f64, &[]);
            m.gauge("nomad.nomad.heartbeat.active", heartbeats.tracked() as f64, &[]);
            let (mut pending, mut running, mut dead) = (0u64, 0u64, 0u64);
            for job in store.snapshot().jobs() {
                match job.status {
                    nomad_proto::job::JobStatus::Pending => pending += 1,
                    nomad_proto::job::JobStatus::Running => running += 1,
                    nomad_proto::job::JobStatus::Dead => dead += 1,
                }
            }
            m.gauge("nomad.nomad.job_status.pending", pending as f64, &[]);
            m.gauge("nomad.nomad.job_status.running", running as f64, &[]);
            m.gauge("nomad.nomad.job_status.dead", dead as f64, &[]);
        })
    }

    /// The state store.
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// The consensus handle.
    pub fn consensus(&self) -> Arc<dyn Consensus> {
        self.consensus.clone()
    }

    /// The bound RPC address.
    pub fn rpc_addr(&self) -> std::net::SocketAddr {
        self.rpc_addr
    }

    /// The HTTP API of this server. Requests another server forwards to this one (as leader)
    /// run through the same routes.
    pub fn http_router(&self, agent: AgentInfo) -> axum::Router {
        if !agent.name.is_empty() {
            self.consensus.raft().set_name(&format!("{}.{}", agent.name, agent.region));
        }
        let forwarder = LeaderForwarder::new(self.consensus.clone(), self.peers.clone());
        let router =
            crate::http::router(HttpState { endpoints: self.endpoints.clone(), agent: Arc::new(agent), forwarder: Some(forwarder) });
        self.forward_service.serve_with(router.clone());
        router
    }

    /// Resolves with a message naming the data dir and the error once Raft has stopped on an
    /// error it cannot recover from (a log write failed: full or broken disk). This server then
    /// neither leads nor follows, so the agent must exit (non-zero) for its supervisor to restart
    /// it. Never resolves while Raft runs, nor after a [`Server::shutdown`].
    pub fn fatal(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut fatal = self.consensus.raft().fatal();
        async move {
            let message = fatal.wait_for(Option::is_some).await.ok().and_then(|message| message.clone());
            match message {
                Some(message) => message,
                // Raft was shut down as asked: nothing fatal will come.
                None => std::future::pending().await,
            }
        }
    }

    /// Waits until this server leads, up to `timeout`.
    pub async fn wait_for_leadership(&self, timeout: Duration) -> bool {
        let mut rx = self.consensus.leadership();
        tokio::time::timeout(timeout, rx.wait_for(|l| *l)).await.is_ok_and(|r| r.is_ok())
    }

    /// Stops the listeners, the leader loop and Raft.
    pub async fn shutdown(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.consensus.raft().shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::job;

    async fn start(dir: &std::path::Path) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut cfg = ServerConfig::new(dir, addr);
        // Snapshot often, so restarts go through snapshot restore plus log replay.
        cfg.raft_snapshot_logs = 4;
        let server = Server::start(cfg, listener).await.unwrap();
        assert!(server.wait_for_leadership(Duration::from_secs(20)).await, "single server becomes leader");
        server
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_whose_log_writes_fail_steps_down_and_reports_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let server = start(dir.path()).await;
        server.endpoints().job_register(job("before", 1), Default::default()).await.unwrap();
        let fatal = server.fatal();

        // The disk fills: every log write fails from now on.
        server.consensus.raft().fail_storage_writes();
        let refused = server.endpoints().job_register(job("after", 1), Default::default()).await;
        assert!(refused.is_err(), "a write the log could not store was acknowledged");

        let message = tokio::time::timeout(Duration::from_secs(20), fatal).await.expect("the fatal signal fires");
        let raft_dir = dir.path().join("raft").display().to_string();
        assert!(message.contains(&raft_dir), "names the data dir: {message}");
        assert!(message.contains("No space left on device"), "names the error: {message}");
        // Stepped down: neither it nor anyone else is reported as leader.
        assert!(!server.consensus.raft().is_leader(), "a server that cannot write still says it leads");
        assert_eq!(server.consensus.leader_rpc_addr(), None);
        let mut leadership = server.consensus.leadership();
        tokio::time::timeout(Duration::from_secs(20), leadership.wait_for(|leads| !leads)).await.expect("leadership is given up").ok();
        assert!(!server.consensus.is_leader());
        server.shutdown().await;
    }

    #[test]
    fn a_crashed_server_restarts_with_every_acknowledged_write() {
        let dir = tempfile::tempdir().unwrap();
        let (index, eval_id) = {
            // A runtime of its own: dropping it kills every task without a graceful shutdown.
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let server = start(dir.path()).await;
                let mut last = None;
                for i in 0..12 {
                    let r = server.endpoints().job_register(job(&format!("job-{i}"), 1), Default::default()).await.unwrap();
                    last = Some((r.index, r.eval_id));
                }
                last.unwrap()
            })
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let server = start(dir.path()).await;
            let s = server.store().snapshot();
            assert_eq!(s.jobs().count(), 12);
            assert!(s.index >= index, "state index {} is behind the acknowledged {index}", s.index);
            let eval = s.eval(&eval_id).expect("acknowledged eval survives");
            assert_eq!(eval.job_id, "job-11");
            assert_eq!(s.job("default", "job-11").unwrap().job_modify_index, eval.create_index);
            assert!(dir.path().join("raft/snapshots/current.snap").exists(), "a snapshot was taken");
            // And it keeps accepting writes after the restart.
            let r = server.endpoints().job_register(job("after", 1), Default::default()).await.unwrap();
            assert!(r.index > index);
            server.shutdown().await;
        });
    }
}
