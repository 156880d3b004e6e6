//! A Consul stand-in: the subset of Consul's HTTP API nomad-rs speaks, served in-process.
//!
//! No Consul binary can be installed on the test machines, so the Consul tests run against this.
//! It follows Consul's request decoding (see [`decode`]), status codes and error texts, records
//! every call for assertions, runs http and tcp checks itself at their interval (as the Consul
//! agent does), expires TTL checks to critical, and can be stopped and started again on the same
//! port so a test can take Consul away and bring it back. With a management token it enforces
//! ACLs: requests without a known token are refused.
//!
//! It runs on its own tokio runtime (one worker thread), so blocking and async tests can use it.

pub mod ca;
pub mod decode;
mod routes;
pub mod xds;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde_json::Value;
use tokio::sync::watch;

/// How the stand-in presents itself.
#[derive(Debug, Clone)]
pub struct ConsulOptions {
    pub datacenter: String,
    pub node_name: String,
    pub node_id: String,
    pub version: String,
    pub revision: String,
    pub server: bool,
    pub connect_enabled: bool,
    /// `DebugConfig.GRPCPort` (-1 when off, as Consul reports it). `0` serves the Connect
    /// control plane (delta ADS, [`xds`]) on a kernel-chosen port on 127.0.0.1 and reports that
    /// port; any other value is only reported.
    pub grpc_port: i64,
    pub grpc_tls_port: i64,
    /// `Member.Tags.segment` (Enterprise network segments); `None` leaves the tag out.
    pub segment: Option<String>,
    /// Turns ACLs on (default deny) with this management token's SecretID.
    pub management_token: Option<String>,
    /// The built-in CA's leaf lifetime (Consul's `LeafCertTTL`, 72h by default).
    pub leaf_cert_ttl: Duration,
    /// `xDS.SupportedProxies.envoy`, most preferred first (Consul 1.16.1's by default): the first
    /// is the version Nomad's `${NOMAD_envoy_version}` becomes.
    pub supported_envoy: Vec<String>,
}

impl Default for ConsulOptions {
    fn default() -> Self {
        ConsulOptions {
            datacenter: "dc1".into(),
            node_name: "consul-standin".into(),
            node_id: "8d2c3a1e-6a44-4f5e-9f0e-1c2b3a4d5e6f".into(),
            version: "1.16.1".into(),
            revision: "e0ab4d29".into(),
            server: true,
            connect_enabled: true,
            grpc_port: 8502,
            grpc_tls_port: -1,
            segment: None,
            management_token: None,
            leaf_cert_ttl: Duration::from_secs(72 * 3600),
            supported_envoy: ["1.26.4", "1.25.9", "1.24.10", "1.23.12"].map(String::from).to_vec(),
        }
    }
}

/// One request the stand-in received.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    pub body: Vec<u8>,
}

impl Call {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// A check's live state.
#[derive(Debug, Clone)]
pub(crate) struct CheckState {
    /// `AgentServiceCheck` as registered, keys canonical.
    pub def: Value,
    pub id: String,
    pub name: String,
    pub service_id: String,
    pub status: String,
    pub output: String,
    pub notes: String,
    /// For TTL checks: when it turns critical unless updated.
    pub ttl_deadline: Option<Instant>,
    pub ttl: Option<Duration>,
    pub runner: Option<tokio::task::AbortHandle>,
    pub create_index: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct KvEntry {
    pub value: Vec<u8>,
    pub flags: u64,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Default)]
pub(crate) struct State {
    pub opts: ConsulOptions,
    /// Registered services by ID: the canonical registration (sidecars already expanded).
    pub services: BTreeMap<String, Value>,
    /// IDs of the services registered as another's `Connect.SidecarService` (Consul's
    /// `LocallyRegisteredAsSidecar`): they go when their parent is deregistered.
    pub sidecars: std::collections::BTreeSet<String>,
    pub checks: BTreeMap<String, CheckState>,
    pub kv: BTreeMap<String, KvEntry>,
    /// The KV table's index: the last write or delete.
    pub kv_index: u64,
    /// ACL tokens by AccessorID.
    pub tokens: BTreeMap<String, Value>,
    /// Config entries by (Kind, Name).
    pub config_entries: BTreeMap<(String, String), Value>,
    pub index: u64,
    pub calls: Vec<Call>,
    /// Every NACK an Envoy sent the xDS server.
    pub xds_nacks: Vec<xds::Nack>,
    /// The proxy ID of every xDS stream accepted, in order.
    pub xds_streams: Vec<String>,
    /// (proxy ID, type URL) of every ACK received, in order.
    pub xds_acks: Vec<(String, String)>,
}

impl State {
    pub fn bump(&mut self) -> u64 {
        self.index += 1;
        self.index
    }
}

pub(crate) struct Shared {
    pub state: Mutex<State>,
    /// The raft-like index, for blocking queries.
    pub index_tx: watch::Sender<u64>,
    /// The built-in Connect CA (when Connect is enabled).
    pub ca: Option<ca::ConnectCa>,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Wakes blocking queries after a write.
    pub fn notify(&self, index: u64) {
        self.index_tx.send_replace(index);
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    stopped: mpsc::Receiver<()>,
}

/// A running stand-in; dropping it shuts it down.
pub struct ConsulStandIn {
    rt: Option<tokio::runtime::Runtime>,
    shared: Arc<Shared>,
    addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    running: Mutex<Option<Running>>,
}

impl ConsulStandIn {
    /// Starts on a kernel-chosen port on 127.0.0.1.
    pub fn start(opts: ConsulOptions) -> Result<ConsulStandIn> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("consul-standin")
            .enable_all()
            .build()
            .context("consul stand-in runtime")?;
        let mut state = State { opts: opts.clone(), index: 1, ..Default::default() };
        if let Some(secret) = &opts.management_token {
            let token = serde_json::json!({
                "AccessorID": "00000000-0000-0000-0000-000000000002",
                "SecretID": secret,
                "Description": "Bootstrap Token (Global Management)",
                "Policies": [{"ID": routes::GLOBAL_MANAGEMENT_ID, "Name": "global-management"}],
                "Local": false,
                "CreateTime": routes::now_rfc3339(),
                "Hash": "",
                "CreateIndex": 1,
                "ModifyIndex": 1,
            });
            state.tokens.insert("00000000-0000-0000-0000-000000000002".into(), token);
        }
        let ca = if opts.connect_enabled { Some(ca::ConnectCa::new(&opts.datacenter, opts.leaf_cert_ttl)?) } else { None };
        let grpc = if opts.grpc_port == 0 && opts.connect_enabled {
            let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind the consul stand-in's gRPC port")?;
            l.set_nonblocking(true)?;
            state.opts.grpc_port = i64::from(l.local_addr()?.port());
            Some(l)
        } else {
            None
        };
        let (index_tx, _) = watch::channel(1);
        let shared = Arc::new(Shared { state: Mutex::new(state), index_tx, ca });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind the consul stand-in")?;
        let addr = listener.local_addr()?;
        let grpc_addr = grpc.as_ref().and_then(|l| l.local_addr().ok());
        if let Some(l) = grpc {
            // The gRPC port stays up across `stop`/`restart`, which only concern the HTTP API.
            rt.spawn(xds::serve(l, shared.clone()));
        }
        let standin = ConsulStandIn { rt: Some(rt), shared, addr, grpc_addr, running: Mutex::new(None) };
        standin.serve(listener)?;
        Ok(standin)
    }

    fn serve(&self, listener: std::net::TcpListener) -> Result<()> {
        listener.set_nonblocking(true)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = mpsc::channel();
        let shared = self.shared.clone();
        self.rt.as_ref().expect("runtime").spawn(async move {
            routes::accept_loop(listener, shared, stop_rx).await;
            let _ = stopped_tx.send(());
        });
        *self.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running { stop: stop_tx, stopped: stopped_rx });
        Ok(())
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.lock().calls.clone()
    }

    /// The calls with this method whose path starts with `prefix`.
    pub fn calls_to(&self, method: &str, prefix: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.method == method && c.path.starts_with(prefix)).collect()
    }

    /// `127.0.0.1:<port>` of the xDS gRPC server, when it runs (`grpc_port: 0`).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The built-in Connect CA, when Connect is enabled.
    pub fn ca(&self) -> Option<&ca::ConnectCa> {
        self.shared.ca.as_ref()
    }

    /// Every NACK Envoy sent the xDS server so far.
    pub fn xds_nacks(&self) -> Vec<xds::Nack> {
        self.shared.lock().xds_nacks.clone()
    }

    /// The proxy ID of every xDS stream the server accepted so far, in order.
    pub fn xds_streams(&self) -> Vec<String> {
        self.shared.lock().xds_streams.clone()
    }

    /// The resource types (`type.googleapis.com/...`) a proxy has ACKed at least once.
    pub fn xds_acked(&self, proxy_id: &str) -> std::collections::BTreeSet<String> {
        self.shared.lock().xds_acks.iter().filter(|(p, _)| p == proxy_id).map(|(_, t)| t.clone()).collect()
    }

    /// Changes what `/v1/agent/self` reports (an upgrade, say).
    pub fn set_version(&self, version: &str) {
        self.shared.lock().opts.version = version.to_string();
    }

    /// Takes Consul away: the port is closed and open connections are cut. State is kept.
    pub fn stop(&self) {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(r) = running {
            let _ = r.stop.send(());
            let _ = r.stopped.recv_timeout(Duration::from_secs(10));
        }
    }

    /// Brings Consul back on the same port, with the state it had (a Consul agent that keeps its
    /// data dir). [`ConsulStandIn::forget_services`] first gives a `-dev` agent's empty restart.
    pub fn restart(&self) -> Result<()> {
        self.stop();
        let listener = std::net::TcpListener::bind(self.addr).with_context(|| format!("rebind {}", self.addr))?;
        self.serve(listener)
    }

    /// Drops every service and check, as a Consul agent without persisted state would.
    pub fn forget_services(&self) {
        let mut st = self.shared.lock();
        for c in st.checks.values() {
            if let Some(r) = &c.runner {
                r.abort();
            }
        }
        st.checks.clear();
        st.services.clear();
        st.sidecars.clear();
        let i = st.bump();
        drop(st);
        self.shared.notify(i);
    }

    /// A check's status, as `/v1/agent/checks` reports it.
    pub fn check_status(&self, check_id: &str) -> Option<String> {
        let st = self.shared.lock();
        st.checks.get(check_id).map(|c| routes::effective_status(&st, c))
    }

    /// Whether a service with this ID is registered.
    pub fn has_service(&self, id: &str) -> bool {
        self.shared.lock().services.contains_key(id)
    }

    /// The names of the xDS resources the proxy registered as `proxy_id` would be served now,
    /// by type URL (what Envoy would hold after its wildcard CDS and LDS subscriptions and the
    /// EDS names of its clusters).
    pub fn xds_resource_names(&self, proxy_id: &str) -> Result<BTreeMap<String, Vec<String>>> {
        let st = self.shared.lock();
        let ca = self.shared.ca.as_ref().ok_or_else(|| anyhow!("Connect is not enabled"))?;
        xds::resource_names(&st, ca, proxy_id).map_err(|e| anyhow!(e))
    }

    /// Waits until the port accepts connections.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(anyhow!("consul stand-in at {} did not accept connections", self.addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ConsulStandIn {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // Not a blocking shutdown: the handle may be dropped inside an async test.
            rt.shutdown_background();
        }
    }
}

/// Parses a Go duration (`10s`, `1m30s`, `250ms`, `1.5h`).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += n * scale;
    }
    Some(Duration::from_secs_f64(total))
}

/// The Consul a test talks to: a real one when `E2E_CONSUL_ADDR` (`host:port`, plain http) is
/// set, with `E2E_CONSUL_TOKEN` as its token, else a fresh stand-in. Tests that only use
/// Consul's API run against either; tests of the stand-in itself (calls, stop, restart) use
/// [`ConsulStandIn`] directly.
pub enum ConsulTarget {
    Real { addr: String, token: Option<String> },
    StandIn(ConsulStandIn),
}

impl ConsulTarget {
    /// `E2E_CONSUL_ADDR` / `E2E_CONSUL_TOKEN`, else a stand-in started with `opts`.
    pub fn from_env(opts: ConsulOptions) -> Result<ConsulTarget> {
        match std::env::var("E2E_CONSUL_ADDR").ok().filter(|a| !a.is_empty()) {
            Some(addr) => {
                let addr = addr.trim_start_matches("http://").trim_end_matches('/').to_string();
                Ok(ConsulTarget::Real { addr, token: std::env::var("E2E_CONSUL_TOKEN").ok().filter(|t| !t.is_empty()) })
            }
            None => Ok(ConsulTarget::StandIn(ConsulStandIn::start(opts)?)),
        }
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        match self {
            ConsulTarget::Real { addr, .. } => addr.clone(),
            ConsulTarget::StandIn(s) => s.addr().to_string(),
        }
    }

    /// The token to send, if any.
    pub fn token(&self) -> Option<String> {
        match self {
            ConsulTarget::Real { token, .. } => token.clone(),
            ConsulTarget::StandIn(s) => s.shared.lock().opts.management_token.clone(),
        }
    }

    /// `path` with `token=` added when there is a token (the HTTP client sends no headers).
    pub fn path(&self, path: &str) -> String {
        match self.token() {
            Some(t) => format!("{path}{}token={t}", if path.contains('?') { "&" } else { "?" }),
            None => path.to_string(),
        }
    }

    /// The stand-in, when that is what runs.
    pub fn standin(&self) -> Option<&ConsulStandIn> {
        match self {
            ConsulTarget::StandIn(s) => Some(s),
            ConsulTarget::Real { .. } => None,
        }
    }
}
