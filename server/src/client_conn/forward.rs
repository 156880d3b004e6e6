//! Reaching a node whose request stream another server holds: [`ClientCalls`] tries this
//! server's own connections, then asks the other servers one at a time over the server-only
//! `nomad.server.ClientConn/Call` (with the server proof). A server asked only looks at its own
//! connections, so a call travels one hop at most.
//!
//! Why ask rather than record where each stream is: a record would be a Raft write per
//! (re)connect, stale the moment a client fails over, and still need this fallback. Servers are
//! few (3 or 5), a server without the stream answers at once, and the server that held the
//! node's stream last time is asked first, so a steady cluster makes one hop per call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ClientCallError, ClientConns, lock};
use crate::consensus::Consensus;
use crate::rpc::Peers;

#[allow(missing_docs, clippy::all)]
pub(crate) mod generated {
    include!(concat!(env!("OUT_DIR"), "/nomad.server.ClientConn.rs"));
}

use generated::client_conn_client::ClientConnClient;
pub use generated::client_conn_server::{ClientConn as ClientConnRpc, ClientConnServer};

/// Longest deadline a forwarded call may ask for.
const MAX_FORWARDED_TIMEOUT: Duration = Duration::from_secs(600);

/// Extra time a forwarding server gives the server holding the stream, so that server's own
/// timeout (not the hop's) is what the caller sees.
const HOP_SLACK: Duration = Duration::from_secs(5);

/// Largest forwarded call or answer between servers.
const MAX_FORWARDED_BYTES: usize = nomad_proto::rpc::MAX_SERVER_REQUEST_BYTES + 64 * 1024;

/// A call for a node, handed to the server that may hold its stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ForwardedCall {
    /// Target node.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Client RPC.
    pub method: String,
    /// Its request.
    pub body: serde_json::Value,
    /// The call's deadline, ms.
    pub timeout_ms: u64,
}

/// What the server holding (or not holding) the stream answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ForwardedCallReply {
    /// The client's answer, or why there is none.
    pub outcome: Result<serde_json::Value, ClientCallError>,
}

/// Calls to clients from this server: its own connections, else the other servers'.
pub struct ClientCalls {
    local: Arc<ClientConns>,
    consensus: Arc<dyn Consensus>,
    peers: Peers,
    self_addr: String,
    /// The server that last held each node's stream (a hint, asked first).
    pub(super) seen_on: Mutex<HashMap<String, String>>,
}

impl ClientCalls {
    /// Calls through `local`, then through the servers `consensus` names (other than
    /// `self_addr`, this server's advertised RPC address), reached with `peers`.
    pub fn new(local: Arc<ClientConns>, consensus: Arc<dyn Consensus>, peers: Peers, self_addr: &str) -> Arc<ClientCalls> {
        Arc::new(ClientCalls { local, consensus, peers, self_addr: self_addr.to_string(), seen_on: Mutex::new(HashMap::new()) })
    }

    /// This server's own connections.
    pub fn local(&self) -> &Arc<ClientConns> {
        &self.local
    }

    /// Sends `method` to `node_id` wherever its stream is, and waits for the answer.
    pub async fn call(
        &self,
        node_id: &str,
        method: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, ClientCallError> {
        if self.local.has(node_id) {
            return self.local.call(node_id, method, body, timeout).await;
        }
        let hint = lock(&self.seen_on).get(node_id).cloned();
        let mut servers: Vec<String> = hint.into_iter().collect();
        for addr in self.consensus.peers() {
            if addr != self.self_addr && !servers.contains(&addr) {
                servers.push(addr);
            }
        }
        servers.retain(|a| *a != self.self_addr);
        let call = ForwardedCall {
            node_id: node_id.to_string(),
            method: method.to_string(),
            body,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        let mut unreachable = Vec::new();
        for addr in servers {
            match self.ask(&addr, call.clone(), timeout + HOP_SLACK).await {
                Ok(Err(ClientCallError::NoPath { .. })) => continue,
                Ok(outcome) => {
                    lock(&self.seen_on).insert(node_id.to_string(), addr);
                    return outcome;
                }
                Err(status) => unreachable.push(format!("{addr}: {}", status.message())),
            }
        }
        let mut reason = "no server holds a connection from the node".to_string();
        if !unreachable.is_empty() {
            reason.push_str(&format!(" (servers not reached: {})", unreachable.join("; ")));
        }
        lock(&self.seen_on).remove(node_id);
        Err(ClientCallError::NoPath { node_id: node_id.to_string(), reason })
    }

    async fn ask(
        &self,
        addr: &str,
        call: ForwardedCall,
        timeout: Duration,
    ) -> Result<Result<serde_json::Value, ClientCallError>, tonic::Status> {
        let channel = self.peers.channel(addr)?;
        let mut client = ClientConnClient::with_interceptor(channel, self.peers.stamp())
            .max_decoding_message_size(MAX_FORWARDED_BYTES)
            .max_encoding_message_size(MAX_FORWARDED_BYTES);
        let mut request = tonic::Request::new(call);
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.call(request)).await {
            Ok(reply) => Ok(reply?.into_inner().outcome),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!("no answer within {}s", timeout.as_secs()))),
        }
    }
}

/// The server-only service answering [`ForwardedCall`]s from this server's own connections.
#[derive(Clone)]
pub struct ClientConnService {
    conns: Arc<ClientConns>,
}

impl ClientConnService {
    /// The tonic service over `conns`, to mount on the RPC listener.
    pub fn server(conns: Arc<ClientConns>) -> ClientConnServer<ClientConnService> {
        ClientConnServer::new(ClientConnService { conns })
            .max_decoding_message_size(MAX_FORWARDED_BYTES)
            .max_encoding_message_size(MAX_FORWARDED_BYTES)
    }
}

#[tonic::async_trait]
impl ClientConnRpc for ClientConnService {
    async fn call(&self, request: tonic::Request<ForwardedCall>) -> Result<tonic::Response<ForwardedCallReply>, tonic::Status> {
        let call = request.into_inner();
        if call.node_id.is_empty() || call.method.is_empty() {
            return Err(tonic::Status::invalid_argument("forwarded client call: missing node ID or method"));
        }
        let timeout = Duration::from_millis(call.timeout_ms).min(MAX_FORWARDED_TIMEOUT);
        // Only this server's own connections: never passed on again.
        let outcome = self.conns.call(&call.node_id, &call.method, call.body, timeout).await;
        Ok(tonic::Response::new(ForwardedCallReply { outcome }))
    }
}
