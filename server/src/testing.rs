//! Helpers for tests: an in-process server over [`LocalConsensus`] and fixtures; CSI's fake
//! client calls and fixtures in [`csi`].

pub mod csi;

pub use csi::{CsiCall, CsiRequest, RecordingClientCsi};

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::rpc::NodeRegisterRequest;
use nomad_proto::{DriverInfo, Job, Node, NodeResources, Task, TaskGroup};

use crate::consensus::LocalConsensus;
use crate::endpoints::{EndpointConfig, Endpoints};
use crate::heartbeat::{HeartbeatConfig, Heartbeater};
use crate::http::{AgentInfo, HttpState};
use crate::state::StateStore;

/// A server without Raft or sockets: endpoints over a [`LocalConsensus`].
pub struct TestServer {
    /// State.
    pub store: Arc<StateStore>,
    /// The always-leading consensus.
    pub consensus: Arc<LocalConsensus>,
    /// Endpoints.
    pub endpoints: Endpoints,
    /// The event broker the consensus publishes to.
    pub events: Arc<crate::events::EventBroker>,
}

impl TestServer {
    /// A fresh server whose heartbeat timers are armed.
    pub fn new() -> TestServer {
        let store = Arc::new(StateStore::new());
        let events = Arc::new(crate::events::EventBroker::new(100));
        let consensus = Arc::new(LocalConsensus::with_events(store.clone(), events.clone()));
        let heartbeats = Arc::new(Heartbeater::new(HeartbeatConfig::default()));
        heartbeats.arm(Vec::<String>::new());
        let endpoints = Endpoints::new(store.clone(), consensus.clone(), heartbeats, EndpointConfig::default())
            .with_events(events.clone())
            .with_scheduler(Arc::new(crate::scheduler::BuiltinScheduler));
        TestServer { store, consensus, endpoints, events }
    }

    /// This server, reaching CSI plugins on clients through `calls` (a [`RecordingClientCsi`]).
    pub fn with_client_csi(mut self, calls: Arc<dyn crate::csi::ClientCsi>) -> TestServer {
        self.endpoints = self.endpoints.with_client_csi(calls);
        self
    }

    /// The HTTP router over this server.
    pub fn router(&self) -> axum::Router {
        crate::http::router(HttpState {
            endpoints: self.endpoints.clone(),
            agent: Arc::new(AgentInfo { name: "test".into(), region: "global".into(), datacenter: "dc1".into(), ..AgentInfo::default() }),
            forwarder: None,
        })
    }

    /// Registers a node and returns it (with its secret).
    pub async fn register_node(&self, node: Node) -> Node {
        self.endpoints.node_register(NodeRegisterRequest { node: node.clone(), region: String::new() }).await.expect("register node");
        node
    }
}

impl Default for TestServer {
    fn default() -> Self {
        TestServer::new()
    }
}

/// A node fixture: dc1, 4 GHz / 8 GiB, raw_exec healthy.
pub fn node(id: &str) -> Node {
    let mut attributes = BTreeMap::new();
    attributes.insert("kernel.name".to_string(), "linux".to_string());
    attributes.insert("driver.raw_exec".to_string(), "1".to_string());
    attributes.insert("unique.hostname".to_string(), id.to_string());
    attributes.insert("nomad.service_discovery".to_string(), "true".to_string());
    attributes.insert("os.signals".to_string(), "SIGHUP,SIGINT,SIGKILL,SIGQUIT,SIGTERM,SIGUSR1,SIGUSR2".to_string());
    let mut drivers = BTreeMap::new();
    drivers.insert("raw_exec".to_string(), DriverInfo { detected: true, healthy: true, ..DriverInfo::default() });
    Node {
        id: id.to_string(),
        secret_id: format!("secret-{id}"),
        name: id.to_string(),
        datacenter: "dc1".to_string(),
        node_pool: "default".to_string(),
        http_addr: "127.0.0.1:4646".to_string(),
        attributes,
        drivers,
        node_resources: Some(NodeResources {
            cpu: nomad_proto::resources::NodeCpuResources { cpu_shares: 4000, total_cpu_cores: 4, ..Default::default() },
            memory: nomad_proto::resources::NodeMemoryResources { memory_mb: 8192 },
            disk: nomad_proto::resources::NodeDiskResources { disk_mb: 100_000 },
            min_dynamic_port: 20000,
            max_dynamic_port: 32000,
            ..NodeResources::default()
        }),
        ..Node::default()
    }
}

/// A service job fixture with one group of `count` raw_exec tasks.
pub fn job(id: &str, count: i64) -> Job {
    Job {
        id: id.to_string(),
        datacenters: vec!["dc1".to_string()],
        task_groups: vec![TaskGroup {
            name: "web".to_string(),
            count,
            tasks: vec![Task { name: "server".to_string(), driver: "raw_exec".to_string(), ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}
