//! Calls from servers to clients, over the connection the client opened (servers never dial
//! clients, which may sit behind NAT or a firewall that only lets them call out).
//!
//! Each client keeps one `Node.ServerRequests` stream open to the server it talks to. That
//! server keeps the stream's sender in [`ClientConns`] (node ID → connection) until the stream
//! ends; a call is one [`ServerRequest`] `{ID, Method, Body}` written on the stream, and the
//! client answers it with the unary `Node.ServerRequestReply` on the same server, authenticated
//! by its SecretID like every node RPC and accepted only for an ID that was sent to that node.
//!
//! - Every call has a deadline ([`ClientCallError::Timeout`] after it) and at most
//!   [`MAX_IN_FLIGHT_PER_NODE`] calls wait on one node at a time (more wait for a turn within
//!   their deadline).
//! - A call to a node whose stream ends (or is replaced by a newer one) before it answered
//!   fails at once with [`ClientCallError::NoPath`].
//! - Bodies over [`MAX_SERVER_REQUEST_BYTES`] are refused before they are sent.
//!
//! A node's stream is on whichever server the node chose, and the calls come mostly from the
//! leader: [`ClientCalls`] tries this server's own connections first, then asks the other
//! servers one at a time (`forward.rs`, the server-only `nomad.server.ClientConn/Call`, one hop:
//! the server asked only looks at its own connections), starting with the one that held the
//! node's stream last time.

mod csi;
mod forward;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

pub use csi::{CSI_CALL_TIMEOUT, RpcClientCsi, methods};
pub use forward::{ClientCalls, ClientConnRpc, ClientConnServer, ClientConnService, ForwardedCall, ForwardedCallReply};
use nomad_proto::rpc::{MAX_SERVER_REQUEST_BYTES, ServerRequest};
use tokio::sync::{Semaphore, mpsc, oneshot};

pub use crate::csi::ClientCallError;

/// Most calls waiting on one node at a time; more wait for a turn (within their deadline).
pub const MAX_IN_FLIGHT_PER_NODE: usize = 16;

/// Longest error text taken from a client's reply.
const MAX_ERROR_CHARS: usize = 8 * 1024;

type Answer = Result<serde_json::Value, String>;

struct Conn {
    /// Tells this stream from a newer one of the same node.
    conn_id: u64,
    tx: mpsc::Sender<ServerRequest>,
    /// Calls sent on this stream and not answered yet.
    pending: HashMap<u64, oneshot::Sender<Answer>>,
    turns: Arc<Semaphore>,
}

/// The client connections this server holds (see the module docs).
pub struct ClientConns {
    conns: Mutex<HashMap<String, Conn>>,
    next_id: AtomicU64,
    max_in_flight: usize,
}

impl Default for ClientConns {
    fn default() -> Self {
        ClientConns::with_max_in_flight(MAX_IN_FLIGHT_PER_NODE)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ClientConns {
    /// An empty registry.
    pub fn new() -> Arc<ClientConns> {
        Arc::new(ClientConns::default())
    }

    /// An empty registry letting `max` calls wait on one node at a time.
    pub fn with_max_in_flight(max: usize) -> ClientConns {
        ClientConns { conns: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), max_in_flight: max.max(1) }
    }

    /// Whether `node_id` has a stream open to this server.
    pub fn has(&self, node_id: &str) -> bool {
        lock(&self.conns).contains_key(node_id)
    }

    /// Nodes with a stream open to this server.
    pub fn nodes(&self) -> Vec<String> {
        lock(&self.conns).keys().cloned().collect()
    }

    /// Registers a new stream for `node_id` (replacing an older one, whose stream ends and whose
    /// unanswered calls fail) and returns what the RPC hands the client. The registration goes
    /// when the stream is dropped (the client went away or the server stops).
    pub fn open(self: &Arc<Self>, node_id: &str) -> RequestStream {
        let conn_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.max_in_flight);
        let conn = Conn { conn_id, tx, pending: HashMap::new(), turns: Arc::new(Semaphore::new(self.max_in_flight)) };
        if lock(&self.conns).insert(node_id.to_string(), conn).is_some() {
            tracing::debug!(node_id, "a node opened a new server-request stream; the older one ends");
        } else {
            tracing::debug!(node_id, "a node opened its server-request stream");
        }
        RequestStream { rx, _guard: ConnGuard { conns: self.clone(), node_id: node_id.to_string(), conn_id } }
    }

    /// Sends `method` with `body` to `node_id` over its stream on this server and waits for the
    /// answer, at most `timeout`. [`ClientCallError::NoPath`] when the node has no stream here.
    pub async fn call(
        &self,
        node_id: &str,
        method: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, ClientCallError> {
        let size = serde_json::to_vec(&body).map(|b| b.len()).unwrap_or(usize::MAX);
        if size > MAX_SERVER_REQUEST_BYTES {
            return Err(ClientCallError::Failed(format!(
                "{method}: the request is {size} bytes, more than the {MAX_SERVER_REQUEST_BYTES} a server sends a client"
            )));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || ClientCallError::Timeout { node_id: node_id.to_string(), seconds: timeout.as_secs() };
        let no_path = |reason: &str| ClientCallError::NoPath { node_id: node_id.to_string(), reason: reason.to_string() };
        let (conn_id, turns) = {
            let conns = lock(&self.conns);
            let conn = conns.get(node_id).ok_or_else(|| no_path("the node has no connection to this server"))?;
            (conn.conn_id, conn.turns.clone())
        };
        let _turn = match tokio::time::timeout_at(deadline, turns.acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(no_path("the node's connection to this server closed")),
            Err(_) => return Err(timed_out()),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer_tx, answer_rx) = oneshot::channel();
        let tx = {
            let mut conns = lock(&self.conns);
            let conn = conns
                .get_mut(node_id)
                .filter(|c| c.conn_id == conn_id)
                .ok_or_else(|| no_path("the node's connection to this server closed"))?;
            conn.pending.insert(id, answer_tx);
            conn.tx.clone()
        };
        // Whatever happens below, the call is not waited for any more.
        let _pending = PendingGuard { conns: self, node_id, conn_id, id };
        let request = ServerRequest { id, method: method.to_string(), body };
        match tokio::time::timeout_at(deadline, tx.send(request)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(no_path("the node's connection to this server closed")),
            Err(_) => return Err(timed_out()),
        }
        match tokio::time::timeout_at(deadline, answer_rx).await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(message))) => Err(ClientCallError::Failed(message)),
            Ok(Err(_)) => Err(no_path("the node's connection to this server closed before it answered")),
            Err(_) => Err(timed_out()),
        }
    }

    /// The client's answer to request `id`: taken only when `id` was sent to `node_id` (over
    /// its current stream) and is still waited for.
    pub fn reply(&self, node_id: &str, id: u64, answer: Result<serde_json::Value, String>) -> Result<(), crate::endpoints::EndpointError> {
        let waiting = lock(&self.conns).get_mut(node_id).and_then(|c| c.pending.remove(&id));
        let Some(waiting) = waiting else {
            return Err(crate::endpoints::EndpointError::NotFound(format!(
                "no request {id} sent to node {node_id} is waiting for an answer on this server"
            )));
        };
        let answer = answer.map_err(|mut message| {
            if message.len() > MAX_ERROR_CHARS {
                let mut end = MAX_ERROR_CHARS;
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                message.truncate(end);
                message.push_str(" (truncated)");
            }
            message
        });
        // The caller may have given up just now; nothing is owed to it then.
        let _ = waiting.send(answer);
        Ok(())
    }

    fn remove_pending(&self, node_id: &str, conn_id: u64, id: u64) {
        if let Some(conn) = lock(&self.conns).get_mut(node_id).filter(|c| c.conn_id == conn_id) {
            conn.pending.remove(&id);
        }
    }

    fn close(&self, node_id: &str, conn_id: u64) {
        let mut conns = lock(&self.conns);
        if conns.get(node_id).is_some_and(|c| c.conn_id == conn_id) {
            // Dropping the connection drops its unanswered calls' senders: they fail at once.
            conns.remove(node_id);
            tracing::debug!(node_id, "a node's server-request stream ended");
        }
    }
}

struct PendingGuard<'a> {
    conns: &'a ClientConns,
    node_id: &'a str,
    conn_id: u64,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.conns.remove_pending(self.node_id, self.conn_id, self.id);
    }
}

struct ConnGuard {
    conns: Arc<ClientConns>,
    node_id: String,
    conn_id: u64,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.conns.close(&self.node_id, self.conn_id);
    }
}

/// The stream of requests a node reads (`Node.ServerRequests`); dropping it ends the node's
/// registration on this server.
pub struct RequestStream {
    rx: mpsc::Receiver<ServerRequest>,
    _guard: ConnGuard,
}

impl futures::Stream for RequestStream {
    type Item = Result<ServerRequest, tonic::Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|r| r.map(Ok))
    }
}

#[cfg(test)]
mod tests;
