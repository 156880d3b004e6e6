//! The channel servers call this client over (Nomad's server-to-client RPCs; servers never dial
//! clients): one `Node.ServerRequests` stream kept open to the server the client talks to.
//!
//! Each request is handled on its own task (at most [`MAX_CONCURRENT`] at a time) and answered
//! with `Node.ServerRequestReply` on the connection it came over, since the server that sent it
//! is the one waiting. The stream is opened once the node is registered, opened again with
//! backoff when it ends or fails, and moved when the client fails over to another server.
//! Requests larger than [`MAX_SERVER_REQUEST_BYTES`] end the stream (the server never sends
//! them); a result larger than that is answered with an error instead.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::rpc::{
    MAX_SERVER_REQUEST_BYTES, NodeClient, NodeServerRequestsRequest, SERVER_REQUEST_ENVELOPE_BYTES, ServerRequest, ServerRequestReply,
};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::csi::endpoint::CsiEndpoint;
use super::servers::{RpcError, Servers};

/// Requests handled at once; more wait in the stream.
pub const MAX_CONCURRENT: usize = 16;

/// How often an open stream checks whether the client moved to another server.
const FAILOVER_CHECK: Duration = Duration::from_secs(5);

/// A stream up this long counts as having worked (the backoff starts over).
const STEADY: Duration = Duration::from_secs(5);

/// Longest wait for the server to take a reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Answers the servers' requests, by method.
pub struct ServerRequestHandler {
    csi: CsiEndpoint,
}

impl ServerRequestHandler {
    /// Requests answered by `csi`.
    pub fn new(csi: CsiEndpoint) -> ServerRequestHandler {
        ServerRequestHandler { csi }
    }

    /// The method's result, or its error text.
    pub async fn handle(&self, method: &str, body: serde_json::Value) -> Result<serde_json::Value, String> {
        if CsiEndpoint::serves(method) {
            return self.csi.handle(method, body).await;
        }
        Err(format!("unknown client rpc {method:?}"))
    }
}

/// Backoff between attempts to open the stream.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First wait.
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30) }
    }
}

/// Who this node is, for the stream and the replies.
#[derive(Debug, Clone)]
pub struct NodeCredentials {
    /// Node ID.
    pub node_id: String,
    /// SecretID.
    pub secret_id: String,
}

fn stream_client(channel: Channel) -> NodeClient<Channel> {
    NodeClient::new(channel)
        .max_decoding_message_size(MAX_SERVER_REQUEST_BYTES + SERVER_REQUEST_ENVELOPE_BYTES)
        .max_encoding_message_size(MAX_SERVER_REQUEST_BYTES + SERVER_REQUEST_ENVELOPE_BYTES)
}

/// Keeps the stream open until `shutdown`, once `registered` is past 0.
pub async fn run(
    servers: Arc<Servers>,
    creds: NodeCredentials,
    handler: Arc<ServerRequestHandler>,
    mut registered: watch::Receiver<u64>,
    backoff: Backoff,
    shutdown: CancellationToken,
) {
    tokio::select! {
        r = registered.wait_for(|n| *n > 0) => if r.is_err() { return },
        _ = shutdown.cancelled() => return,
    }
    let turns = Arc::new(Semaphore::new(MAX_CONCURRENT));
    let mut wait = backoff.initial;
    loop {
        let started = tokio::time::Instant::now();
        let opened = serve_one(&servers, &creds, &handler, &turns, &shutdown).await;
        if shutdown.is_cancelled() {
            return;
        }
        match opened {
            // It was up a while: open it again at once (a failover, the server going away).
            Ok(()) if started.elapsed() >= STEADY => wait = backoff.initial,
            // Ended as soon as it opened: not a loop of reconnects.
            Ok(()) => {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
                wait = (wait * 2).min(backoff.max);
            }
            Err(e) => {
                tracing::debug!(error = %e, retry_in = ?wait, "the server-request stream could not be opened");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
                wait = (wait * 2).min(backoff.max);
            }
        }
    }
}

/// Opens the stream on the current server and serves it until it ends, the client moves to
/// another server, or `shutdown`. `Err` when it could not be opened.
async fn serve_one(
    servers: &Servers,
    creds: &NodeCredentials,
    handler: &Arc<ServerRequestHandler>,
    turns: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Result<(), RpcError> {
    let addr = servers.current().ok_or(RpcError::NoServers)?;
    let channel = servers.channel_to(&addr)?;
    let req = NodeServerRequestsRequest { node_id: creds.node_id.clone(), secret_id: creds.secret_id.clone() };
    let mut client = stream_client(channel.clone());
    let opened = tokio::select! {
        r = client.server_requests(req) => r,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let mut stream = match opened {
        Ok(s) => s.into_inner(),
        Err(status) => {
            let e = RpcError::Status { server: addr.clone(), status };
            if e.is_unreachable() {
                servers.failed(&addr);
            }
            return Err(e);
        }
    };
    tracing::debug!(server = %addr, "server-request stream open");
    let mut check = tokio::time::interval(FAILOVER_CHECK);
    check.tick().await;
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            _ = check.tick() => {
                if servers.current().as_deref() != Some(addr.as_str()) {
                    tracing::debug!(from = %addr, "moving the server-request stream to the server now in use");
                    return Ok(());
                }
                continue;
            }
            _ = shutdown.cancelled() => return Ok(()),
        };
        match next {
            Ok(Some(request)) => {
                let Ok(turn) = turns.clone().acquire_owned().await else { return Ok(()) };
                let (handler, channel, creds, shutdown) = (handler.clone(), channel.clone(), creds.clone(), shutdown.clone());
                tokio::spawn(async move {
                    let _turn = turn;
                    tokio::select! {
                        _ = answer(&handler, channel, &creds, request) => {}
                        _ = shutdown.cancelled() => {}
                    }
                });
            }
            Ok(None) => {
                tracing::debug!(server = %addr, "the server ended the server-request stream");
                return Ok(());
            }
            Err(status) => {
                let e = RpcError::Status { server: addr.clone(), status };
                tracing::debug!(error = %e, "the server-request stream broke");
                if e.is_unreachable() {
                    servers.failed(&addr);
                }
                return Ok(());
            }
        }
    }
}

/// Handles one request and sends the answer back over `channel`.
async fn answer(handler: &ServerRequestHandler, channel: Channel, creds: &NodeCredentials, request: ServerRequest) {
    let ServerRequest { id, method, body } = request;
    let outcome = handler.handle(&method, body).await;
    let (result, error) = match outcome {
        Ok(value) => match serde_json::to_vec(&value).map(|b| b.len()) {
            Ok(n) if n <= MAX_SERVER_REQUEST_BYTES => (Some(value), None),
            _ => (None, Some(format!("{method}: the result is larger than the {MAX_SERVER_REQUEST_BYTES} bytes a client sends"))),
        },
        Err(e) => (None, Some(e)),
    };
    if let Some(e) = &error {
        tracing::debug!(method, error = %e, "answering a server request with an error");
    }
    let reply = ServerRequestReply { node_id: creds.node_id.clone(), secret_id: creds.secret_id.clone(), id, result, error };
    let mut request = tonic::Request::new(reply);
    request.set_timeout(REPLY_TIMEOUT);
    match tokio::time::timeout(REPLY_TIMEOUT, stream_client(channel).server_request_reply(request)).await {
        Ok(Ok(_)) => {}
        Ok(Err(status)) => tracing::warn!(method, id, error = %status.message(), "the server did not take the answer to its request"),
        Err(_) => tracing::warn!(method, id, "the server did not take the answer to its request in time"),
    }
}

#[cfg(test)]
mod tests;
