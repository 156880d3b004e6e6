//! Registration and heartbeats.
//!
//! The client registers first (retrying until a server accepts), then heartbeats
//! (`Node.UpdateStatus` with status `ready`) every TTL the server hands back. The first
//! heartbeat follows a random 0-10 s stagger (none in dev mode). Failed heartbeats are retried
//! on Nomad's schedule ([`retry_interval`]). "Node not found" (the servers lost the node)
//! registers again; so does a change of the node's fingerprint, after a short delay that lets
//! several changes coalesce. Heartbeats keep their own schedule while a re-registration waits
//! (as Nomad's separate node-update watcher): with TTLs of a few seconds, a node that stopped
//! heartbeating for the 5-10 s delay would be marked down on every change (a CSI plugin's
//! registration is one). A heartbeat answered with `initializing` (a node coming back after
//! missed heartbeats) hands every alloc's current state to the syncer again: the servers make the
//! node `ready` only once such an update has landed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nomad_proto::rpc::{NodeRegisterRequest, NodeUpdateResponse, NodeUpdateStatusRequest};
use nomad_proto::{NodeStatus, Timestamp};
use rand::Rng;
use tokio::time::Instant;

use super::ClientInner;
use super::servers::RpcError;

/// Base of the retry interval before the first successful heartbeat or without a leader.
pub const REGISTER_RETRY: Duration = Duration::from_secs(15);
/// Retry interval in dev mode.
pub const DEV_RETRY: Duration = Duration::from_secs(1);
/// Longest random wait before the first heartbeat.
pub const INITIAL_HEARTBEAT_STAGGER: Duration = Duration::from_secs(10);
/// Base of the delay before re-registering a changed node.
pub const NODE_UPDATE_DELAY: Duration = Duration::from_secs(5);

/// A uniform random duration in `[0, d)`.
pub fn stagger(d: Duration) -> Duration {
    if d.is_zero() {
        return Duration::ZERO;
    }
    d.mul_f64(rand::rng().random::<f64>())
}

/// `base + [0, base)`, or 1 s in dev mode.
pub fn retry_base(base: Duration, dev: bool) -> Duration {
    if dev { DEV_RETRY } else { base + stagger(base) }
}

/// What the heartbeat retry depends on.
#[derive(Debug, Clone, Copy)]
pub struct RetryInput {
    /// A heartbeat has succeeded before.
    pub have_heartbeated: bool,
    /// The failure was "no cluster leader".
    pub no_leader: bool,
    /// Time left until the server's deadline (negative: missed by that much).
    pub left: f64,
    /// Dev mode.
    pub dev: bool,
}

/// How long to wait before retrying a failed heartbeat, as Nomad's client does:
/// - never heartbeated, or no leader: 15-30 s (the new leader gives everyone a long TTL);
/// - deadline just passed: 1-2 s;
/// - otherwise a random share of the time left (the absolute miss when more than 30 s late),
///   at least 1-2 s and at most 25-30 s.
///
/// `sample` is a uniform random number in `[0, 1)`.
pub fn retry_interval(input: RetryInput, sample: f64) -> Duration {
    if input.dev {
        return DEV_RETRY;
    }
    let secs = Duration::from_secs_f64;
    if !input.have_heartbeated || input.no_leader {
        return REGISTER_RETRY + REGISTER_RETRY.mul_f64(sample);
    }
    let mut left = input.left;
    if left < -30.0 {
        left = -left;
    } else if left < 0.0 {
        return secs(1.0 + sample);
    }
    let share = left * sample;
    if share < 1.0 {
        secs(1.0 + sample)
    } else if share > 30.0 {
        secs(25.0 + 5.0 * sample)
    } else {
        secs(share)
    }
}

/// How long to wait for an answer to a register or heartbeat.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl ClientInner {
    async fn register_once(&self) -> Result<NodeUpdateResponse, RpcError> {
        let node = (*self.ctx.node()).clone();
        let region = self.config.region.clone();
        let resp = self.servers.node(CALL_TIMEOUT, |mut c| async move { c.register(NodeRegisterRequest { node, region }).await }).await?;
        // Later registrations send `ready`; the servers keep the status of a known node anyway.
        self.ctx.update_node(|n| {
            n.status = NodeStatus::Ready;
            true
        });
        self.servers.learn(&resp.leader_rpc_addr, &resp.servers);
        self.servers.learn_http(&resp.leader_http_addr);
        self.stats.registrations.fetch_add(1, Ordering::Relaxed);
        self.registered.send_modify(|n| *n += 1);
        tracing::info!(node_id = %self.identity.node_id, status = %resp.status, "node registered");
        Ok(resp)
    }

    /// Registers until a server accepts (or the agent shuts down: `None`).
    async fn register_until_accepted(&self) -> Option<NodeUpdateResponse> {
        loop {
            match self.register_once().await {
                Ok(resp) => return Some(resp),
                Err(e) => {
                    let wait = retry_base(REGISTER_RETRY, self.config.dev_mode);
                    tracing::warn!(error = %e, retry_in = ?wait, "registering the node failed");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.ctx.shutdown.cancelled() => return None,
                    }
                }
            }
        }
    }

    async fn heartbeat_once(&self) -> Result<NodeUpdateResponse, RpcError> {
        let req = NodeUpdateStatusRequest {
            node_id: self.identity.node_id.clone(),
            status: NodeStatus::Ready,
            node_event: None,
            updated_at: Timestamp::now().unix_secs(),
            secret_id: self.identity.secret_id.clone(),
        };
        let resp = self.servers.node(CALL_TIMEOUT, |mut c| async move { c.update_status(req).await }).await?;
        self.servers.learn(&resp.leader_rpc_addr, &resp.servers);
        self.servers.learn_http(&resp.leader_http_addr);
        self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
        Ok(resp)
    }

    /// Registers, then heartbeats until the agent shuts down.
    pub(super) async fn register_and_heartbeat(self: Arc<Self>) {
        let Some(first) = self.register_until_accepted().await else { return };
        let mut ttl = Duration::from_nanos(first.heartbeat_ttl.max(0) as u64);
        let mut have_heartbeated = false;
        let mut last_ok = Instant::now();
        let mut next = if self.config.dev_mode { Duration::ZERO } else { stagger(INITIAL_HEARTBEAT_STAGGER) };
        let mut heartbeat_at = Instant::now() + next;
        // When a changed node registers again; the heartbeats go on meanwhile.
        let mut register_at: Option<Instant> = None;
        loop {
            let register_due = async {
                match register_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(heartbeat_at) => {}
                _ = self.node_changed.notified(), if register_at.is_none() => {
                    let delay = if self.config.dev_mode { Duration::from_millis(500) } else { NODE_UPDATE_DELAY + stagger(NODE_UPDATE_DELAY) };
                    register_at = Some(Instant::now() + delay);
                    continue;
                }
                _ = register_due => {
                    register_at = None;
                    tracing::info!("node attributes changed; registering again");
                    if let Err(e) = self.register_once().await {
                        tracing::warn!(error = %e, "re-registering the changed node failed; the next heartbeat retries");
                        self.node_changed.notify_one();
                    }
                    continue;
                }
                _ = self.ctx.shutdown.cancelled() => return,
            }
            match self.heartbeat_once().await {
                Ok(resp) => {
                    if resp.status == NodeStatus::Initializing {
                        // The servers hold a returning node in `initializing` until its alloc
                        // states since it was cut off have landed. When nothing changed here
                        // (or the servers had not yet marked its allocs `unknown`) there would
                        // be nothing to send, and the node would stay initializing for good.
                        self.resend_alloc_states();
                        // A node that was `down` lost its service registrations on the servers;
                        // the allocs it keeps register theirs again (idempotent otherwise).
                        self.ctx.registrar.resync();
                    }
                    have_heartbeated = true;
                    last_ok = Instant::now();
                    ttl = Duration::from_nanos(resp.heartbeat_ttl.max(0) as u64);
                    // A TTL of 0 means no timer was set (the node is down): check back soon.
                    next = if ttl.is_zero() { DEV_RETRY } else { ttl };
                }
                Err(e) if e.is_node_not_found() => {
                    tracing::info!("the servers do not know this node; registering again");
                    if self.register_until_accepted().await.is_none() {
                        return;
                    }
                    next = if self.config.dev_mode { Duration::ZERO } else { stagger(INITIAL_HEARTBEAT_STAGGER) };
                }
                Err(e) => {
                    let left = (last_ok + ttl)
                        .checked_duration_since(Instant::now())
                        .map_or_else(|| -(Instant::now().duration_since(last_ok + ttl).as_secs_f64()), |d| d.as_secs_f64());
                    let input = RetryInput { have_heartbeated, no_leader: e.is_no_leader(), left, dev: self.config.dev_mode };
                    next = retry_interval(input, rand::rng().random::<f64>());
                    tracing::warn!(error = %e, retry_in = ?next, "heartbeat failed");
                }
            }
            heartbeat_at = Instant::now() + next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(have: bool, no_leader: bool, left: f64) -> RetryInput {
        RetryInput { have_heartbeated: have, no_leader, left, dev: false }
    }

    #[test]
    fn retry_intervals_follow_nomad() {
        let s = Duration::from_secs_f64;
        // Never heartbeated or no leader: 15-30 s.
        assert_eq!(retry_interval(input(false, false, 10.0), 0.0), s(15.0));
        assert_eq!(retry_interval(input(true, true, 10.0), 0.5), s(22.5));
        // Just missed: 1-2 s.
        assert_eq!(retry_interval(input(true, false, -3.0), 0.5), s(1.5));
        // A share of the time left, clamped.
        assert_eq!(retry_interval(input(true, false, 20.0), 0.5), s(10.0));
        assert_eq!(retry_interval(input(true, false, 20.0), 0.01), s(1.01), "below 1 s becomes 1-2 s");
        assert_eq!(retry_interval(input(true, false, 100.0), 0.9), s(29.5), "above 30 s becomes 25-30 s");
        // Missed by more than 30 s: the absolute miss is spread the same way.
        assert_eq!(retry_interval(input(true, false, -40.0), 0.5), s(20.0));
        // Dev mode: 1 s.
        assert_eq!(retry_interval(RetryInput { dev: true, ..input(false, false, 0.0) }, 0.9), DEV_RETRY);
    }

    #[test]
    fn staggers_stay_in_range() {
        for _ in 0..100 {
            let d = stagger(Duration::from_secs(10));
            assert!(d < Duration::from_secs(10));
            let r = retry_base(REGISTER_RETRY, false);
            assert!(r >= REGISTER_RETRY && r < 2 * REGISTER_RETRY);
        }
        assert_eq!(retry_base(REGISTER_RETRY, true), DEV_RETRY);
    }
}
