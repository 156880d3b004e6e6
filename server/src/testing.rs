//! Helpers for tests: an in-process server over [`LocalConsensus`] and fixtures.

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

/// One server-to-client CSI call, as [`RecordingClientCsi`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsiCall {
    /// `ClientCSI.NodeDetachVolume` to `node_id` for `alloc_id`.
    NodeDetach {
        /// Target node.
        node_id: String,
        /// The alloc whose claim is released.
        alloc_id: String,
        /// The provider's ID of the volume.
        external_id: String,
    },
    /// `ClientCSI.ControllerDetachVolume` to `controller_node_id`.
    ControllerDetach {
        /// The node running the controller asked.
        controller_node_id: String,
        /// The provider's ID of the volume.
        volume_id: String,
        /// The provider's ID of the node it is unpublished from.
        client_csi_node_id: String,
    },
    /// `ClientCSI.ControllerAttachVolume` to `controller_node_id`.
    ControllerAttach {
        /// The node running the controller asked.
        controller_node_id: String,
        /// The provider's ID of the volume.
        volume_id: String,
    },
    /// `ClientCSI.ControllerCreateVolume` to `controller_node_id`.
    ControllerCreate {
        /// The node running the controller asked.
        controller_node_id: String,
    },
    /// `ClientCSI.ControllerDeleteVolume` to `controller_node_id`.
    ControllerDelete {
        /// The node running the controller asked.
        controller_node_id: String,
    },
}

impl CsiCall {
    /// The node the call went to.
    pub fn target(&self) -> &str {
        match self {
            CsiCall::NodeDetach { node_id, .. } => node_id,
            CsiCall::ControllerDetach { controller_node_id, .. }
            | CsiCall::ControllerAttach { controller_node_id, .. }
            | CsiCall::ControllerCreate { controller_node_id }
            | CsiCall::ControllerDelete { controller_node_id } => controller_node_id,
        }
    }
}

/// A [`crate::csi::ClientCsi`] that records every call and answers `Ok`, or the error set
/// for the target node (for a number of calls, or until cleared).
#[derive(Default)]
pub struct RecordingClientCsi {
    calls: std::sync::Mutex<Vec<CsiCall>>,
    failing: std::sync::Mutex<BTreeMap<String, (crate::csi::ClientCallError, Option<usize>)>>,
    called: tokio::sync::Notify,
}

impl RecordingClientCsi {
    /// A fake where every call succeeds.
    pub fn new() -> Arc<RecordingClientCsi> {
        Arc::new(RecordingClientCsi::default())
    }

    /// Calls to `node_id` fail with `err`: the next `times` of them, or all (`None`) until
    /// [`RecordingClientCsi::heal`].
    pub fn fail(&self, node_id: &str, err: crate::csi::ClientCallError, times: Option<usize>) {
        self.failing.lock().unwrap().insert(node_id.to_string(), (err, times));
    }

    /// Calls to `node_id` succeed again.
    pub fn heal(&self, node_id: &str) {
        self.failing.lock().unwrap().remove(node_id);
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<CsiCall> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits (at most 30 s) until `cond` holds on the calls so far;
    /// panics naming `what` otherwise.
    pub async fn wait_for(&self, what: &str, cond: impl Fn(&[CsiCall]) -> bool) -> Vec<CsiCall> {
        let deadline = tokio::time::Instant::now() + nomad_testkit_deadline();
        loop {
            let notified = self.called.notified();
            let calls = self.calls();
            if cond(&calls) {
                return calls;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for CSI calls: {what}; calls: {calls:?}");
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), notified).await;
        }
    }

    fn answer<T: Send + 'static>(
        &self,
        call: CsiCall,
        ok: T,
    ) -> crate::consensus::BoxFuture<'static, Result<T, crate::csi::ClientCallError>> {
        let target = call.target().to_string();
        self.calls.lock().unwrap().push(call);
        self.called.notify_waiters();
        let mut failing = self.failing.lock().unwrap();
        let result = match failing.get_mut(&target) {
            None => Ok(ok),
            Some((err, None)) => Err(err.clone()),
            Some((err, Some(n))) => {
                let err = err.clone();
                *n -= 1;
                if *n == 0 {
                    failing.remove(&target);
                }
                Err(err)
            }
        };
        Box::pin(async move { result })
    }
}

fn nomad_testkit_deadline() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}

impl crate::csi::ClientCsi for RecordingClientCsi {
    fn controller_attach(
        &self,
        req: nomad_proto::rpc::client_csi::ClientCsiControllerAttachRequest,
    ) -> crate::consensus::BoxFuture<'_, Result<nomad_proto::rpc::client_csi::ClientCsiControllerAttachResponse, crate::csi::ClientCallError>>
    {
        let call = CsiCall::ControllerAttach { controller_node_id: req.controller.controller_node_id, volume_id: req.volume_id };
        self.answer(call, Default::default())
    }
    fn controller_detach(
        &self,
        req: nomad_proto::rpc::client_csi::ClientCsiControllerDetachRequest,
    ) -> crate::consensus::BoxFuture<'_, Result<(), crate::csi::ClientCallError>> {
        let call = CsiCall::ControllerDetach {
            controller_node_id: req.controller.controller_node_id,
            volume_id: req.volume_id,
            client_csi_node_id: req.client_csi_node_id,
        };
        self.answer(call, ())
    }
    fn controller_create(
        &self,
        req: nomad_proto::rpc::client_csi::ClientCsiControllerCreateRequest,
    ) -> crate::consensus::BoxFuture<'_, Result<nomad_proto::rpc::client_csi::ClientCsiControllerCreateResponse, crate::csi::ClientCallError>>
    {
        self.answer(CsiCall::ControllerCreate { controller_node_id: req.controller.controller_node_id }, Default::default())
    }
    fn controller_delete(
        &self,
        req: nomad_proto::rpc::client_csi::ClientCsiControllerDeleteRequest,
    ) -> crate::consensus::BoxFuture<'_, Result<(), crate::csi::ClientCallError>> {
        self.answer(CsiCall::ControllerDelete { controller_node_id: req.controller.controller_node_id }, ())
    }
    fn node_detach(
        &self,
        req: nomad_proto::rpc::client_csi::ClientCsiNodeDetachRequest,
    ) -> crate::consensus::BoxFuture<'_, Result<(), crate::csi::ClientCallError>> {
        self.answer(CsiCall::NodeDetach { node_id: req.node_id, alloc_id: req.alloc_id, external_id: req.external_id }, ())
    }
}
