//! The servers a client talks to, with failover.
//!
//! Calls go to the current server. A failure that says the server could not answer (it is
//! unreachable, has no leader, timed out) moves the client to the next server in the list and
//! drops the cached connection, so the next call dials afresh (a restarted server on the same
//! address is found again). Answers that are the server's verdict (not found, denied, invalid)
//! do not move anything. The list is the configured servers plus the `Servers` the servers
//! return in heartbeat and register replies; the configured ones are never forgotten.
//!
//! Every answered call is counted ([`Servers::answers`]): loops backing off after a failure
//! (the alloc watch, the syncer) retry at once when another call gets through, as Nomad's
//! `rpcRetryWatcher` makes them, instead of sleeping out a 30-60 s backoff after a partition.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use nomad_proto::rpc::codec::MAX_MESSAGE_BYTES;
use nomad_proto::rpc::{AllocClient, CsiVolumeClient, NodeClient, NodeServerInfo, ServiceRegistrationClient};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::taskrunner::lock;

/// Why an RPC failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// No server is configured or known.
    #[error("no servers known")]
    NoServers,
    /// A server address is not usable.
    #[error("bad server address {addr:?}: {reason}")]
    BadAddress {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The call failed.
    #[error("{server}: {status}")]
    Status {
        /// Server called.
        server: String,
        /// What it (or the transport) said.
        status: Status,
    },
}

impl RpcError {
    /// The server does not know the node ("node ... not found"): register again.
    pub fn is_node_not_found(&self) -> bool {
        matches!(self, RpcError::Status { status, .. } if status.code() == Code::NotFound && status.message().contains("not found"))
    }

    /// The cluster has no leader right now.
    pub fn is_no_leader(&self) -> bool {
        matches!(self, RpcError::Status { status, .. } if status.message().contains("No cluster leader"))
    }

    /// The server could not answer at all (so another server might).
    pub fn is_unreachable(&self) -> bool {
        match self {
            RpcError::NoServers | RpcError::BadAddress { .. } => true,
            RpcError::Status { status, .. } => {
                matches!(status.code(), Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled | Code::Internal)
            }
        }
    }
}

#[derive(Debug, Default)]
struct List {
    addrs: Vec<String>,
    current: usize,
}

/// The server list and cached connections.
pub struct Servers {
    /// The servers given by the operator (config, `-servers`, `PUT /v1/agent/servers`): never
    /// forgotten when replies name others.
    configured: Mutex<Vec<String>>,
    list: Mutex<List>,
    channels: Mutex<HashMap<String, Channel>>,
    /// HTTP address of the server that last answered a node RPC.
    http: Mutex<Option<String>>,
    answered: watch::Sender<u64>,
}

impl Servers {
    /// Starts with the configured servers.
    pub fn new(configured: Vec<String>) -> Servers {
        let mut addrs = Vec::new();
        for a in &configured {
            if !a.is_empty() && !addrs.contains(a) {
                addrs.push(a.clone());
            }
        }
        Servers {
            configured: Mutex::new(addrs.clone()),
            list: Mutex::new(List { addrs, current: 0 }),
            channels: Mutex::new(HashMap::new()),
            http: Mutex::new(None),
            answered: watch::channel(0).0,
        }
    }

    /// The count of answered calls: `changed()` on a receiver resolves once a call gets an
    /// answer after the receiver was taken (a server's verdict counts, an unreachable server
    /// does not).
    pub fn answers(&self) -> watch::Receiver<u64> {
        self.answered.subscribe()
    }

    /// The server calls go to now.
    pub fn current(&self) -> Option<String> {
        let l = lock(&self.list);
        l.addrs.get(l.current).cloned()
    }

    /// Every known server.
    pub fn all(&self) -> Vec<String> {
        lock(&self.list).addrs.clone()
    }

    /// `addr` failed to answer: forget its connection and move on to the next server.
    pub fn failed(&self, addr: &str) {
        lock(&self.channels).remove(addr);
        let mut l = lock(&self.list);
        if l.addrs.get(l.current).is_some_and(|c| c == addr) && !l.addrs.is_empty() {
            l.current = (l.current + 1) % l.addrs.len();
        }
    }

    /// Learns the leader and servers a reply names, keeping the configured ones and the current
    /// choice.
    pub fn learn(&self, leader: &str, servers: &[NodeServerInfo]) {
        let mut l = lock(&self.list);
        let current = l.addrs.get(l.current).cloned();
        let mut addrs: Vec<String> = Vec::new();
        let learned = servers.iter().map(|s| s.rpc_advertise_addr.as_str()).chain(std::iter::once(leader));
        let configured = lock(&self.configured).clone();
        for a in learned.chain(configured.iter().map(String::as_str)) {
            if !a.is_empty() && !addrs.iter().any(|x| x == a) {
                addrs.push(a.to_string());
            }
        }
        l.current = current.and_then(|c| addrs.iter().position(|a| *a == c)).unwrap_or(0);
        l.addrs = addrs;
    }

    /// Replaces the whole list with `addrs` (`PUT /v1/agent/servers`, Nomad's `SetServers`):
    /// they become the configured servers, the first is used next, and connections to servers
    /// no longer listed are dropped. Servers named by later replies are learned again.
    pub fn set_configured(&self, addrs: &[String]) {
        let mut list: Vec<String> = Vec::new();
        for a in addrs {
            if !a.is_empty() && !list.contains(a) {
                list.push(a.clone());
            }
        }
        *lock(&self.configured) = list.clone();
        lock(&self.channels).retain(|addr, _| list.contains(addr));
        *lock(&self.list) = List { addrs: list, current: 0 };
    }

    /// Remembers the answering server's HTTP address (an agent forwards API requests there).
    pub fn learn_http(&self, addr: &str) {
        if !addr.is_empty() {
            *lock(&self.http) = Some(addr.to_string());
        }
    }

    /// A server's HTTP address, once one has answered.
    pub fn http_addr(&self) -> Option<String> {
        lock(&self.http).clone()
    }

    /// The cached connection to `addr` (a stream and the replies to what came over it share it).
    pub fn channel_to(&self, addr: &str) -> Result<Channel, RpcError> {
        self.channel(addr)
    }

    fn channel(&self, addr: &str) -> Result<Channel, RpcError> {
        let mut map = lock(&self.channels);
        if let Some(c) = map.get(addr) {
            return Ok(c.clone());
        }
        let bad = |reason: String| RpcError::BadAddress { addr: addr.to_string(), reason };
        let ch = nomad_server::rpc_tls::connect_lazy(
            Channel::from_shared(format!("http://{addr}"))
                .map_err(|e| bad(e.to_string()))?
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(10))
                .keep_alive_while_idle(true),
        );
        map.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    async fn call<C, R, Fut>(&self, timeout: Duration, client: impl FnOnce(Channel) -> C, f: impl FnOnce(C) -> Fut) -> Result<R, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let addr = self.current().ok_or(RpcError::NoServers)?;
        let channel = self.channel(&addr)?;
        let result = match tokio::time::timeout(timeout, f(client(channel))).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => Err(Status::deadline_exceeded(format!("no answer within {}s", timeout.as_secs()))),
        };
        let answered = match &result {
            Ok(_) => true,
            Err(status) => !(RpcError::Status { server: String::new(), status: status.clone() }).is_unreachable(),
        };
        if answered {
            self.answered.send_modify(|n| *n += 1);
        }
        result.map_err(|status| {
            let e = RpcError::Status { server: addr.clone(), status };
            if e.is_unreachable() {
                self.failed(&addr);
            }
            e
        })
    }

    /// A `Node.*` call to the current server.
    pub async fn node<R, Fut>(&self, timeout: Duration, f: impl FnOnce(NodeClient<Channel>) -> Fut) -> Result<R, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let client = |ch| NodeClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.call(timeout, client, f).await
    }

    /// An `Alloc.*` call to the current server.
    pub async fn alloc<R, Fut>(&self, timeout: Duration, f: impl FnOnce(AllocClient<Channel>) -> Fut) -> Result<R, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let client = |ch| AllocClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.call(timeout, client, f).await
    }

    /// A `CSIVolume.*` call to the current server.
    pub async fn csi_volume<R, Fut>(&self, timeout: Duration, f: impl FnOnce(CsiVolumeClient<Channel>) -> Fut) -> Result<R, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let client =
            |ch| CsiVolumeClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES);
        self.call(timeout, client, f).await
    }

    /// A `ServiceRegistration.*` call to the current server.
    pub async fn services<R, Fut>(
        &self,
        timeout: Duration,
        f: impl FnOnce(ServiceRegistrationClient<Channel>) -> Fut,
    ) -> Result<R, RpcError>
    where
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let client = |ch| {
            ServiceRegistrationClient::new(ch).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
        };
        self.call(timeout, client, f).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(addr: &str) -> NodeServerInfo {
        NodeServerInfo { rpc_advertise_addr: addr.into(), datacenter: "dc1".into() }
    }

    #[test]
    fn failover_rotates_and_learned_servers_keep_the_configured_ones() {
        let s = Servers::new(vec!["a:1".into(), "b:1".into(), "a:1".into()]);
        assert_eq!(s.all(), ["a:1", "b:1"]);
        assert_eq!(s.current().as_deref(), Some("a:1"));
        s.failed("a:1");
        assert_eq!(s.current().as_deref(), Some("b:1"));
        s.failed("a:1");
        assert_eq!(s.current().as_deref(), Some("b:1"), "a failure of a server not in use moves nothing");
        s.failed("b:1");
        assert_eq!(s.current().as_deref(), Some("a:1"), "wraps around");

        s.learn("d:1", &[info("c:1"), info("a:1")]);
        assert_eq!(s.all(), ["c:1", "a:1", "d:1", "b:1"]);
        assert_eq!(s.current().as_deref(), Some("a:1"), "the server in use stays in use");
        s.failed("a:1");
        assert_eq!(s.current().as_deref(), Some("d:1"));
    }

    #[test]
    fn a_set_list_replaces_the_configured_and_learned_servers() {
        let s = Servers::new(vec!["a:1".into(), "b:1".into()]);
        s.learn("c:1", &[info("c:1")]);
        s.failed("c:1");
        s.set_configured(&["x:1".into(), "y:1".into(), "x:1".into()]);
        assert_eq!(s.all(), ["x:1", "y:1"], "deduplicated, the old ones gone");
        assert_eq!(s.current().as_deref(), Some("x:1"));
        // Replies still teach servers, and the new configured ones are the ones kept.
        s.learn("z:1", &[]);
        assert_eq!(s.all(), ["z:1", "x:1", "y:1"]);
        s.failed("z:1");
        s.failed("x:1");
        assert_eq!(s.current().as_deref(), Some("y:1"), "failover goes on over the new list");
    }

    #[test]
    fn error_classes() {
        let e = |code: Code, msg: &str| RpcError::Status { server: "s".into(), status: Status::new(code, msg) };
        assert!(e(Code::NotFound, "node n1 not found").is_node_not_found());
        assert!(!e(Code::NotFound, "node n1 not found").is_unreachable());
        assert!(e(Code::Unavailable, "No cluster leader").is_no_leader());
        assert!(e(Code::Unavailable, "connection refused").is_unreachable());
        assert!(!e(Code::InvalidArgument, "node n1 is not allowed to update allocs while in status disconnected").is_unreachable());
        assert!(!e(Code::PermissionDenied, "node secret ID does not match").is_unreachable());
    }

    #[tokio::test]
    async fn a_dead_server_fails_over_to_the_next() {
        // A port nothing listens on: bind, note it, close.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        let s = Servers::new(vec![dead.clone(), "127.0.0.1:1".into()]);
        let answered = s.answers();
        let r: Result<nomad_proto::rpc::NodeUpdateResponse, _> = s
            .node(
                Duration::from_secs(5),
                |mut c| async move { c.update_status(nomad_proto::rpc::NodeUpdateStatusRequest::default()).await },
            )
            .await;
        assert!(r.unwrap_err().is_unreachable());
        assert_eq!(s.current().as_deref(), Some("127.0.0.1:1"));
        assert!(!answered.has_changed().unwrap(), "an unreachable server is no answer: backoffs keep waiting");
    }
}
