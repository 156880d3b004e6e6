//! A server's Raft identity and how servers form a cluster.
//!
//! - `bootstrap_expect = 1`: the server initializes a cluster of itself on first start (see `RaftNode::start`).
//! - `bootstrap_expect = N > 1`: the server asks every `join` address for `Info`. Once it sees N
//!   uninitialized servers (itself included), the one with the lowest id initializes the cluster with
//!   all of them as voters; the others wait to be contacted by the new leader.
//! - Any server (also with `bootstrap_expect = 0`) that finds an initialized server among the `join`
//!   addresses asks it to add it (`Join`, passed on to the leader).
//!
//! Polling retries with backoff until the server has Raft state, logging each change of progress.
//! As with Nomad's `bootstrap_expect`, every server of a new cluster must be given the same N.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::BasicNode;
use openraft::error::{InitializeError, RaftError as OpenraftError};

use super::node::Shared;
use super::rpc::{InfoReply, InfoRequest, JoinRequest};
use super::{NodeId, RaftError};

const NODE_ID_FILE: &str = "node-id";
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);
/// Time allowed for one `Info` call.
const INFO_TIMEOUT: Duration = Duration::from_secs(2);

/// The server's Raft id: the one stored in `<raft_dir>/node-id`, else `configured`, else a random one;
/// stored on first start so it never changes.
pub(crate) fn node_id(raft_dir: &Path, configured: Option<NodeId>) -> Result<NodeId, RaftError> {
    let path = raft_dir.join(NODE_ID_FILE);
    let io_error = |context: &str| {
        let context = format!("{context} {}", path.display());
        move |source| RaftError::Io { context, source }
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let stored = text
                .trim()
                .parse::<NodeId>()
                .map_err(|e| RaftError::Config(format!("{} holds {:?}, not a node id: {e}", path.display(), text.trim())))?;
            match configured {
                Some(id) if id != stored => {
                    Err(RaftError::Config(format!("node id {id} was configured but {} holds {stored}", path.display())))
                }
                _ => Ok(stored),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = configured.unwrap_or_else(rand::random);
            let temp = raft_dir.join(format!("{NODE_ID_FILE}.tmp"));
            std::fs::write(&temp, format!("{id}\n")).map_err(io_error("writing"))?;
            std::fs::File::open(&temp).and_then(|f| f.sync_all()).map_err(io_error("syncing"))?;
            std::fs::rename(&temp, &path).map_err(io_error("renaming to"))?;
            Ok(id)
        }
        Err(e) => Err(io_error("reading")(e)),
    }
}

/// Polls `join` until this server is part of a cluster: bootstraps one or joins one.
pub(crate) async fn form_cluster(shared: Arc<Shared>, expect: usize, join: Vec<String>) {
    let mut delay = FIRST_RETRY;
    let mut last_progress = String::new();
    loop {
        match shared.raft.is_initialized().await {
            Ok(true) => {
                tracing::info!(node_id = shared.id, "raft cluster formed");
                return;
            }
            Ok(false) => {}
            Err(_) => return, // shut down
        }
        match step(&shared, expect, &join).await {
            // Raft state arrives with the leader's first append; check again shortly.
            Ok(()) => delay = FIRST_RETRY,
            Err(progress) if progress != last_progress => {
                tracing::info!(node_id = shared.id, "raft bootstrap: {progress}");
                last_progress = progress;
            }
            Err(progress) => tracing::debug!(node_id = shared.id, "raft bootstrap: {progress}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY);
    }
}

/// A server that restarts with another advertised address than the configuration holds for it
/// (it moved) asks the leader to record the new one (`Join` from a member updates its address),
/// through itself or any other member, until the configuration it holds shows the new address.
pub(crate) async fn record_moved_address(shared: Arc<Shared>) {
    let mut delay = FIRST_RETRY;
    loop {
        let membership = shared.raft.metrics().borrow().membership_config.clone();
        let membership = membership.membership();
        let others: Vec<String> = match membership.get_node(&shared.id) {
            Some(node) if node.addr != shared.addr => {
                membership.nodes().filter(|(id, _)| **id != shared.id).map(|(_, node)| node.addr.clone()).collect()
            }
            // Not a member (removed), or the address is right.
            _ => return,
        };
        let request = JoinRequest { node_id: shared.id, addr: shared.addr.clone(), forwarded: false };
        let mut outcome = shared.join(request).await.map_err(|e| e.to_string());
        for via in &others {
            if outcome.is_ok() {
                break;
            }
            outcome = request_join(&shared, via).await;
        }
        match outcome {
            Ok(()) => tracing::info!(node_id = shared.id, addr = %shared.addr, "asked the cluster to record this server's new address"),
            Err(e) => tracing::info!(node_id = shared.id, addr = %shared.addr, error = %e, "recording this server's new address"),
        }
        if shared.raft.is_initialized().await.is_err() {
            return; // shut down
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY);
    }
}

/// `PUT /v1/agent/join`: brings this server and the server at `addr` into one cluster through
/// the membership path servers already use (there is no gossip pool to join):
/// - this server is not in a cluster yet and `addr`'s is: this server asks to join it (as it
///   does for its `server_join` addresses);
/// - this server is in a cluster and `addr`'s server is not in one: the leader adds it;
/// - both are in the same cluster already (or `addr` is this server): nothing to do.
///
/// Refused: two servers not yet in any cluster (they form one with `bootstrap_expect` and their
/// join lists) and a server of another cluster (it would have to leave its own first).
pub(crate) async fn join_via(shared: &Shared, addr: &str) -> Result<(), String> {
    let mut client = shared.pool.client(addr).map_err(|e| format!("Failed to join {addr}: {e}"))?;
    let info = match tokio::time::timeout(INFO_TIMEOUT, client.info(InfoRequest {})).await {
        Ok(Ok(reply)) => reply.into_inner(),
        Ok(Err(status)) => return Err(format!("Failed to join {addr}: {}", status.message())),
        Err(_) => return Err(format!("Failed to join {addr}: no answer within {}s", INFO_TIMEOUT.as_secs())),
    };
    if info.node_id == shared.id {
        return Ok(());
    }
    let initialized = shared.raft.is_initialized().await.map_err(|e| format!("Failed to join {addr}: {e}"))?;
    if !initialized {
        if !info.initialized {
            return Err(format!(
                "Failed to join {addr}: neither this server nor server {} is in a cluster yet; servers form one with bootstrap_expect and server_join (retry_join)",
                info.node_id
            ));
        }
        return request_join(shared, addr).await.map_err(|e| format!("Failed to join {addr}: {e}"));
    }
    let membership = shared.raft.metrics().borrow().membership_config.clone();
    if membership.membership().get_node(&info.node_id).is_some() {
        return Ok(());
    }
    if info.initialized {
        return Err(format!(
            "Failed to join {addr}: server {} belongs to another cluster; remove it there (operator raft remove-peer) and clear its data dir first",
            info.node_id
        ));
    }
    let request = JoinRequest { node_id: info.node_id, addr: info.addr.clone(), forwarded: false };
    match tokio::time::timeout(shared.apply_timeout, shared.join(request)).await {
        Ok(Ok(())) => {
            tracing::info!(node_id = info.node_id, addr = %info.addr, "joined server to the raft cluster");
            Ok(())
        }
        Ok(Err(refusal)) => Err(format!("Failed to join {addr}: {refusal}")),
        Err(_) => Err(format!("Failed to join {addr}: timed out")),
    }
}

/// One round of discovery. `Ok` when this server initialized or joined a cluster, else what it waits for.
async fn step(shared: &Shared, expect: usize, join: &[String]) -> Result<(), String> {
    let (peers, refusals) = discover(shared, join).await;
    if let Some(member) = peers.iter().find(|peer| peer.initialized) {
        return request_join(shared, &member.addr).await;
    }
    if !refusals.is_empty() {
        // Say it plainly: the usual cause is a missing or wrong `encrypt` key.
        return Err(format!("refused by {}", refusals.join("; ")));
    }
    if expect < 2 {
        return Err(format!("no initialized server among {join:?} to join"));
    }
    let servers: BTreeMap<NodeId, BasicNode> =
        peers.iter().map(|peer| (peer.node_id, BasicNode::new(&peer.addr))).chain([(shared.id, BasicNode::new(&shared.addr))]).collect();
    if servers.len() < expect {
        return Err(format!("found {} of {expect} expected servers", servers.len()));
    }
    let lowest = *servers.keys().next().expect("servers holds this server");
    if lowest != shared.id {
        return Err(format!("waiting for server {lowest} to bootstrap the cluster"));
    }
    tracing::info!(node_id = shared.id, voters = ?servers.keys().collect::<Vec<_>>(), "bootstrapping raft cluster");
    match shared.raft.initialize(servers).await {
        // Someone reached this server first: it is part of a cluster already.
        Ok(()) | Err(OpenraftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(format!("initializing the cluster: {e}")),
    }
}

/// `Info` from every reachable `join` address other than this server, and the servers that
/// refused to answer it (this server could not prove it is one of theirs).
async fn discover(shared: &Shared, join: &[String]) -> (Vec<InfoReply>, Vec<String>) {
    let calls = join.iter().filter(|addr| **addr != shared.addr).map(|addr| async move {
        let mut client = shared.pool.client(addr).ok()?;
        match tokio::time::timeout(INFO_TIMEOUT, client.info(InfoRequest {})).await {
            Ok(Ok(reply)) => Some(Ok(reply.into_inner())),
            Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => Some(Err(format!("{addr}: {}", status.message()))),
            Ok(Err(status)) => {
                tracing::debug!(addr, error = %status.message(), "raft bootstrap: server not reachable");
                None
            }
            Err(_) => None,
        }
    });
    let (mut replies, mut refusals) = (Vec::new(), Vec::new());
    for outcome in futures::future::join_all(calls).await.into_iter().flatten() {
        match outcome {
            Ok(reply) if reply.node_id != shared.id => replies.push(reply),
            Ok(_) => {}
            Err(refusal) => refusals.push(refusal),
        }
    }
    (replies, refusals)
}

async fn request_join(shared: &Shared, via: &str) -> Result<(), String> {
    let request = JoinRequest { node_id: shared.id, addr: shared.addr.clone(), forwarded: false };
    let mut client = shared.pool.client(via).map_err(|e| format!("joining via {via}: {e}"))?;
    match tokio::time::timeout(shared.apply_timeout, client.join(request)).await {
        Ok(Ok(reply)) => match reply.into_inner() {
            Ok(()) => {
                tracing::info!(node_id = shared.id, via, "joined the raft cluster");
                Ok(())
            }
            Err(refusal) => Err(format!("joining via {via}: {refusal}")),
        },
        Ok(Err(status)) => Err(format!("joining via {via}: {}", status.message())),
        Err(_) => Err(format!("joining via {via}: timed out")),
    }
}
