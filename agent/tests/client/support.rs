//! Fixtures for the client tests: a real server (Raft in a temp dir) on its own thread and
//! runtime, so it can be stopped like a crashed process and started again on the same data dir
//! and port; a real client on a temp dir; jobs, placements and condition waits.
#![allow(dead_code)] // not every helper is used by every module

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nomad_agent::client::driver::{DriverOptions, DriverRegistry};
use nomad_agent::client::{Client, ClientConfig};
use nomad_agent::config::ClientSettings;
use nomad_agent::config::file::Reserved;
use nomad_proto::job::JobType;
use nomad_proto::resources::{AllocatedResources, AllocatedTaskResources};
use nomad_proto::rpc::{
    AllocRpc, AllocServer, AllocUpdateRequest, AllocsGetRequest, AllocsGetResponse, GenericResponse, NodeClientAllocsResponse,
    NodeRegisterRequest, NodeRpc, NodeServer, NodeSpecificRequest, NodeUpdateResponse, NodeUpdateStatusRequest,
};
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Job, RestartPolicy, Task, TaskGroup, TaskState, Timestamp};
use nomad_server::endpoints::Endpoints;
use nomad_server::fsm::{AllocStop, Command, PlanApply};
use nomad_server::heartbeat::HeartbeatConfig;
use nomad_server::server::{Server, ServerConfig};
use nomad_server::state::StateStore;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response, Status};

pub use nomad_testkit::{DEADLINE, wait_for, wait_until};

/// Counts and gates the client-facing RPCs of a [`TestServer`] started with a gate.
#[derive(Default)]
pub struct Gate {
    /// While false, `Node.GetClientAllocs` does not answer.
    pub open: watch::Sender<bool>,
    /// `Node.UpdateAlloc` calls received.
    pub update_allocs: AtomicU64,
    /// Allocs in those calls.
    pub updated_allocs: AtomicU64,
}

impl Gate {
    /// UpdateAlloc calls so far.
    pub fn update_alloc_calls(&self) -> u64 {
        self.update_allocs.load(Ordering::SeqCst)
    }
}

/// The client RPC services over real endpoints, with the alloc watch held behind the gate.
#[derive(Clone)]
struct GatedRpc {
    endpoints: Endpoints,
    gate: Arc<Gate>,
}

#[tonic::async_trait]
impl NodeRpc for GatedRpc {
    type ServerRequestsStream = futures::stream::Empty<Result<nomad_proto::rpc::ServerRequest, Status>>;

    /// These tests' server calls no client: the client's stream is refused (it retries quietly).
    async fn server_requests(
        &self,
        _: Request<nomad_proto::rpc::NodeServerRequestsRequest>,
    ) -> Result<Response<Self::ServerRequestsStream>, Status> {
        Err(Status::unimplemented("this test server calls no client"))
    }
    async fn server_request_reply(&self, _: Request<nomad_proto::rpc::ServerRequestReply>) -> Result<Response<GenericResponse>, Status> {
        Err(Status::unimplemented("this test server calls no client"))
    }
    async fn register(&self, req: Request<NodeRegisterRequest>) -> Result<Response<NodeUpdateResponse>, Status> {
        Ok(Response::new(self.endpoints.node_register(req.into_inner()).await?))
    }
    async fn update_status(&self, req: Request<NodeUpdateStatusRequest>) -> Result<Response<NodeUpdateResponse>, Status> {
        Ok(Response::new(self.endpoints.node_update_status(req.into_inner()).await?))
    }
    async fn update_alloc(&self, req: Request<AllocUpdateRequest>) -> Result<Response<GenericResponse>, Status> {
        let req = req.into_inner();
        self.gate.update_allocs.fetch_add(1, Ordering::SeqCst);
        self.gate.updated_allocs.fetch_add(req.alloc.len() as u64, Ordering::SeqCst);
        Ok(Response::new(self.endpoints.node_update_alloc(req).await?))
    }
    async fn get_client_allocs(&self, req: Request<NodeSpecificRequest>) -> Result<Response<NodeClientAllocsResponse>, Status> {
        let mut open = self.gate.open.subscribe();
        let _ = open.wait_for(|o| *o).await;
        Ok(Response::new(self.endpoints.node_get_client_allocs(req.into_inner()).await?))
    }
    async fn derive_si_token(
        &self,
        req: Request<nomad_proto::rpc::DeriveSiTokenRequest>,
    ) -> Result<Response<nomad_proto::rpc::DeriveSiTokenResponse>, Status> {
        Ok(Response::new(self.endpoints.node_derive_si_token(req.into_inner()).await?))
    }
    async fn sign_identities(
        &self,
        req: Request<nomad_proto::rpc::SignIdentitiesRequest>,
    ) -> Result<Response<nomad_proto::rpc::SignIdentitiesResponse>, Status> {
        Ok(Response::new(self.endpoints.node_sign_identities(req.into_inner())?))
    }
    async fn resolve_token(
        &self,
        req: Request<nomad_proto::rpc::NodeResolveTokenRequest>,
    ) -> Result<Response<nomad_proto::rpc::NodeResolveTokenResponse>, Status> {
        Ok(Response::new(self.endpoints.node_resolve_token(req.into_inner())?))
    }
}

#[tonic::async_trait]
impl AllocRpc for GatedRpc {
    async fn get_allocs(&self, req: Request<AllocsGetRequest>) -> Result<Response<AllocsGetResponse>, Status> {
        Ok(Response::new(self.endpoints.alloc_get_allocs(req.into_inner()).await?))
    }
}

#[derive(Debug)]
enum ServerCmd {
    Apply(Command, oneshot::Sender<Result<u64, String>>),
}

struct Running {
    store: Arc<StateStore>,
    commands: mpsc::UnboundedSender<ServerCmd>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    client_addr: SocketAddr,
}

/// A real single server on its own thread and runtime.
pub struct TestServer {
    dir: tempfile::TempDir,
    port: u16,
    gate: Option<Arc<Gate>>,
    consul: nomad_server::consul::ConsulHandles,
    running: Option<Running>,
}

fn heartbeat_config() -> HeartbeatConfig {
    HeartbeatConfig { min_ttl: Duration::from_secs(2), ..HeartbeatConfig::default() }
}

impl TestServer {
    /// Starts a server on a kernel-chosen port.
    pub async fn start() -> TestServer {
        Self::start_with(None).await
    }

    /// Starts a server whose client-facing RPC goes through `gate`.
    pub async fn start_gated(gate: Arc<Gate>) -> TestServer {
        Self::start_with(Some(gate)).await
    }

    /// Starts a server that reaches Consul at `settings` (SI tokens, config entries).
    pub async fn start_with_consul(settings: &nomad_agent::config::consul::ConsulSettings) -> TestServer {
        let consul = Arc::new(nomad_agent::consul::server::ServerConsul(nomad_agent::consul::ConsulClient::new(settings)));
        let mut s = TestServer {
            dir: tempfile::tempdir().unwrap(),
            port: 0,
            gate: None,
            consul: nomad_server::consul::ConsulHandles::from(consul),
            running: None,
        };
        s.boot().await;
        s
    }

    async fn start_with(gate: Option<Arc<Gate>>) -> TestServer {
        let mut s = TestServer { dir: tempfile::tempdir().unwrap(), port: 0, gate, consul: Default::default(), running: None };
        s.boot().await;
        s
    }

    async fn boot(&mut self) {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (cmd_tx, mut cmd_rx) = mpsc::unbounded_channel::<ServerCmd>();
        let data_dir = self.dir.path().to_path_buf();
        let port = self.port;
        let gate = self.gate.clone();
        let consul = self.consul.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(async move {
                // The port of a stopped server may take a moment to be free again.
                let start = Instant::now();
                let listener = loop {
                    match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                        Ok(l) => break l,
                        Err(e) if start.elapsed() < DEADLINE => {
                            let _ = e;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("binding port {port}: {e}"),
                    }
                };
                let addr = listener.local_addr().unwrap();
                let mut cfg = ServerConfig::new(&data_dir, addr.to_string());
                cfg.heartbeat = heartbeat_config();
                cfg.consul = consul;
                let server = Server::start(cfg, listener).await.unwrap();
                assert!(server.wait_for_leadership(DEADLINE).await, "the test server leads");
                let client_addr = match gate {
                    None => addr,
                    Some(gate) => {
                        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                        let gated = l.local_addr().unwrap();
                        let rpc = GatedRpc { endpoints: server.endpoints().clone(), gate };
                        tokio::spawn(
                            tonic::transport::Server::builder()
                                .add_service(NodeServer::new(rpc.clone()))
                                .add_service(AllocServer::new(rpc))
                                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
                        );
                        gated
                    }
                };
                let _ = ready_tx.send((server.store().clone(), addr.port(), client_addr));
                let consensus = server.consensus();
                let mut stop_rx = stop_rx;
                loop {
                    tokio::select! {
                        cmd = cmd_rx.recv() => match cmd {
                            Some(ServerCmd::Apply(c, reply)) => {
                                let consensus = consensus.clone();
                                tokio::spawn(async move {
                                    let _ = reply.send(consensus.apply(c).await.map_err(|e| e.to_string()));
                                });
                            }
                            None => break,
                        },
                        _ = &mut stop_rx => break,
                    }
                }
                server.shutdown().await;
            });
            // Dropping the runtime ends every connection task: the server is gone like a killed
            // process.
            drop(rt);
        });
        let (store, port, client_addr) = ready_rx.await.expect("the test server started");
        self.port = port;
        self.running = Some(Running { store, commands: cmd_tx, stop: Some(stop_tx), thread: Some(thread), client_addr });
    }

    /// The address clients use.
    pub fn addr(&self) -> String {
        self.running.as_ref().expect("server running").client_addr.to_string()
    }

    /// The server's state.
    pub fn store(&self) -> Arc<StateStore> {
        self.running.as_ref().expect("server running").store.clone()
    }

    /// Applies a command through Raft.
    pub async fn apply(&self, cmd: Command) -> u64 {
        let (tx, rx) = oneshot::channel();
        let running = self.running.as_ref().expect("server running");
        running.commands.send(ServerCmd::Apply(cmd, tx)).expect("server thread alive");
        rx.await.expect("server answered").expect("command applied")
    }

    /// Stops the server the way a killed process stops: every connection closes.
    pub async fn stop(&mut self) {
        let mut running = self.running.take().expect("server running");
        let _ = running.stop.take().unwrap().send(());
        let thread = running.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap()).await.unwrap();
    }

    /// Starts the server again on the same data dir and port.
    pub async fn restart(&mut self) {
        assert!(self.running.is_none(), "stop it first");
        self.boot().await;
    }

    /// The alloc as the server has it.
    pub fn alloc(&self, id: &str) -> Option<Allocation> {
        self.store().snapshot().alloc(id).map(|a| (**a).clone())
    }

    /// A task's state as the server has it.
    pub fn task_state(&self, alloc_id: &str, task: &str) -> Option<TaskState> {
        self.alloc(alloc_id)?.task_states?.get(task).cloned()
    }

    /// Registers `job` and places one alloc of its first group on `node_id`; returns the alloc ID.
    pub async fn place(&self, job: &Job, node_id: &str) -> String {
        self.place_with(job, node_id, |_| {}).await
    }

    /// [`TestServer::place`], with `f` completing the alloc first (ports, say).
    pub async fn place_with(&self, job: &Job, node_id: &str, f: impl FnOnce(&mut Allocation)) -> String {
        let now = Timestamp::now();
        self.apply(Command::JobRegister { job: job.clone(), eval: None, now }).await;
        // The alloc carries the job as stored (with its indexes), as a scheduler's plan does;
        // otherwise the scheduler would take it for an alloc of an older job version.
        let stored = self.store().snapshot().job(&job.namespace, &job.id).map(|j| (**j).clone()).expect("the job was registered");
        let mut alloc = alloc_for(&stored, node_id);
        f(&mut alloc);
        let id = alloc.id.clone();
        self.apply(Command::PlanApply(PlanApply { job: Some(stored), allocs_upserted: vec![alloc], now, ..PlanApply::default() })).await;
        id
    }

    /// The scheduler's stop of an alloc (desired status stop).
    pub async fn stop_alloc(&self, alloc_id: &str) {
        let stop = AllocStop {
            alloc_id: alloc_id.into(),
            desired_description: "alloc not needed since job was stopped".into(),
            ..AllocStop::default()
        };
        self.apply(Command::PlanApply(PlanApply { allocs_stopped: vec![stop], now: Timestamp::now(), ..PlanApply::default() })).await;
    }

    /// The stored alloc rewritten by the scheduler: `f` changes it, then it is upserted whole.
    pub async fn rewrite_alloc(&self, alloc_id: &str, f: impl FnOnce(&mut Allocation)) {
        let mut a = self.alloc(alloc_id).expect("alloc exists");
        f(&mut a);
        let job = a.job.as_deref().cloned();
        self.apply(Command::PlanApply(PlanApply { job, allocs_upserted: vec![a], now: Timestamp::now(), ..PlanApply::default() })).await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(mut r) = self.running.take() {
            if let Some(stop) = r.stop.take() {
                let _ = stop.send(());
            }
            if let Some(t) = r.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// The executor binary cargo built for these tests.
pub fn executor_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nomad-rs-executor"))
}

/// Drivers with raw_exec enabled and the test executor.
pub fn drivers() -> DriverRegistry {
    DriverRegistry::new(&DriverOptions { executor_path: executor_path(), ..DriverOptions::new(true) })
}

/// A client config rooted at `root`, in dev mode (1 s retries), talking to `servers`.
pub fn client_config(root: &Path, servers: Vec<String>) -> ClientConfig {
    kill_tasks_at_exit(root);
    let settings = ClientSettings {
        servers,
        state_dir: root.join("client"),
        alloc_dir: root.join("alloc"),
        node_class: "test".into(),
        node_pool: "default".into(),
        meta: BTreeMap::from([("rack".to_string(), "r1".to_string())]),
        options: BTreeMap::new(),
        reserved: Reserved::default(),
        host_volumes: BTreeMap::new(),
        dynamic_ports: (20000, 32000),
        cpu_total_compute: None,
        memory_total_mb: None,
        network_interface: None,
        cni: nomad_agent::config::CniSettings::default(),
        chroot_env: None,
        artifact: Default::default(),
        template: Default::default(),
        gc: nomad_agent::client::gc::GcConfig::dev(),
    };
    let mut c = ClientConfig::new(settings, "test-node", "dc1", "global", "127.0.0.1:4646");
    c.dev_mode = true;
    // Tests leave temp dirs behind them; a tmpfs mounted in one would outlive the test.
    c.secrets_tmpfs = false;
    c.max_query_time = Duration::from_secs(5);
    c
}

/// A client on `root` talking to `server`.
pub async fn start_client(root: &Path, server: &TestServer) -> Client {
    Client::start(client_config(root, vec![server.addr()]), drivers()).await.expect("client starts")
}

/// Waits until the server sees the client's node `ready`.
pub async fn wait_ready(server: &TestServer, client: &Client) {
    let id = client.node_id().to_string();
    wait_until("the node is ready", || server.store().snapshot().node(&id).is_some_and(|n| n.status == nomad_proto::NodeStatus::Ready))
        .await;
}

/// A raw_exec task running `sh -c script`.
pub fn sh_task(name: &str, script: &str) -> Task {
    let mut t = Task { name: name.into(), driver: "raw_exec".into(), ..Task::default() };
    t.config.insert("command".into(), json!("/bin/sh"));
    t.config.insert("args".into(), json!(["-c", script]));
    t.resources.cpu = 100;
    t.resources.memory_mb = 64;
    t
}

/// A restart policy.
pub fn restart_policy(attempts: i64, delay_ms: i64) -> RestartPolicy {
    RestartPolicy { attempts, interval: 3_600_000_000_000, delay: delay_ms * 1_000_000, mode: "fail".into(), ..RestartPolicy::default() }
}

/// A job with one group "g" holding `tasks`.
pub fn job(id: &str, job_type: JobType, tasks: Vec<Task>, restart: RestartPolicy) -> Job {
    let mut job = Job {
        id: id.into(),
        name: id.into(),
        job_type,
        datacenters: vec!["dc1".into()],
        task_groups: vec![TaskGroup { name: "g".into(), count: 1, tasks, restart_policy: Some(restart), ..TaskGroup::default() }],
        ..Job::default()
    };
    job.canonicalize();
    job
}

/// An alloc of `job`'s first group on `node_id`, as the scheduler would place it.
pub fn alloc_for(job: &Job, node_id: &str) -> Allocation {
    let group = &job.task_groups[0];
    let tasks = group
        .tasks
        .iter()
        .map(|t| {
            let mut r = AllocatedTaskResources::default();
            r.cpu.cpu_shares = t.resources.cpu;
            r.memory.memory_mb = t.resources.memory_mb;
            (t.name.clone(), r)
        })
        .collect();
    Allocation {
        id: nomad_proto::new_id(),
        namespace: job.namespace.clone(),
        eval_id: nomad_proto::new_id(),
        name: format!("{}.{}[0]", job.id, group.name),
        node_id: node_id.into(),
        job_id: job.id.clone(),
        task_group: group.name.clone(),
        allocated_resources: Some(AllocatedResources { tasks, ..AllocatedResources::default() }),
        desired_status: DesiredStatus::Run,
        client_status: ClientStatus::Pending,
        ..Allocation::default()
    }
}

/// The PID of a task while the client runs it.
pub fn task_pid(client: &Client, alloc_id: &str, task: &str) -> Option<i32> {
    client.alloc_runner(alloc_id)?.task(task)?.handle().map(|h| h.task.pid)
}

/// True while the process exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s.rfind(')').and_then(|i| s[i + 2..].chars().next());
        !matches!(state, Some('Z') | Some('X') | None)
    })
}

/// Event types of a task state, in order.
pub fn event_types(state: &TaskState) -> Vec<String> {
    state.events.iter().map(|e| e.event_type.clone()).collect()
}

/// Contents of a task's log file `<task>.<stream>.0` under the client's alloc dir.
pub fn log_file(root: &Path, alloc_id: &str, task: &str, stream: &str) -> String {
    std::fs::read_to_string(root.join("alloc").join(alloc_id).join("alloc/logs").join(format!("{task}.{stream}.0"))).unwrap_or_default()
}

/// Roots whose tasks are killed when the test process exits.
static TASK_ROOTS: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Tasks outlive their client by design (an agent restart reattaches them), so a test's tasks
/// would outlive the test: at exit, every executor started under `root` is killed with all the
/// processes under it.
pub fn kill_tasks_at_exit(root: &Path) {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    // SAFETY: the handler is an `extern "C" fn` that does not unwind.
    REGISTER.call_once(|| unsafe {
        libc::atexit(kill_test_tasks);
    });
    TASK_ROOTS.lock().unwrap_or_else(|e| e.into_inner()).push(root.to_path_buf());
}

extern "C" fn kill_test_tasks() {
    let _ = std::panic::catch_unwind(|| {
        let roots: Vec<String> =
            TASK_ROOTS.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|r| r.to_string_lossy().into_owned()).collect();
        let mut parent_of = Vec::new();
        let mut executors = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // The parent PID is the second field after the command's closing parenthesis.
            let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("nomad-rs-executor") && roots.iter().any(|r| cmdline.contains(r.as_str())) {
                executors.push(pid);
            }
        }
        let mut doomed = executors.clone();
        let mut i = 0;
        while i < doomed.len() {
            let p = doomed[i];
            doomed.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        for pid in doomed {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    });
}
