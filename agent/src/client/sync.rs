//! The alloc syncer: client-side alloc states go to the servers in batches.
//!
//! Runners hand over a stripped alloc (ID, NodeID, ClientStatus, ClientDescription, TaskStates,
//! DeploymentStatus, NetworkStatus) on every change; the newest per alloc wins. Every 200 ms the
//! pending batch goes out in one `Node.UpdateAlloc`. A failed batch is put back, except for the
//! allocs that have a newer state by then, and retried after a backoff (5-10 s; 1 s in dev
//! mode), or as soon as another call (the heartbeat that brings a returning node back) gets an
//! answer. Nothing is sent before the first successful alloc pull, so a restarted client never
//! reports on allocs before it knows what the servers want of them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nomad_proto::Allocation;
use nomad_proto::rpc::AllocUpdateRequest;
use tokio::sync::mpsc;

use super::ClientInner;
use super::heartbeat::retry_base;

/// Base of the retry interval after a failed sync.
pub const SYNC_RETRY: Duration = Duration::from_secs(5);

/// The fields a client reports about an alloc.
pub fn strip(a: Allocation) -> Allocation {
    a.into_client_update()
}

/// Updates waiting to be sent: the newest per alloc.
#[derive(Debug, Default)]
pub struct Pending {
    updates: BTreeMap<String, Allocation>,
}

impl Pending {
    /// Records an alloc's newest state.
    pub fn push(&mut self, a: Allocation) {
        self.updates.insert(a.id.clone(), strip(a));
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.updates.is_empty()
    }

    /// Number of allocs waiting.
    pub fn len(&self) -> usize {
        self.updates.len()
    }

    /// Takes everything waiting, as one batch.
    pub fn take(&mut self) -> Vec<Allocation> {
        std::mem::take(&mut self.updates).into_values().collect()
    }

    /// Puts a failed batch back, except where a newer state arrived meanwhile.
    pub fn put_back(&mut self, batch: Vec<Allocation>) {
        for a in batch {
            self.updates.entry(a.id.clone()).or_insert(a);
        }
    }
}

/// How long to wait for the servers to take a batch.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl ClientInner {
    /// Batches and sends alloc updates until the agent shuts down.
    pub(super) async fn sync_allocs(self: Arc<Self>, mut rx: mpsc::UnboundedReceiver<Allocation>) {
        let mut pending = Pending::default();
        let mut next = tokio::time::Instant::now() + self.config.sync_interval;
        // Set while backing off after a failed batch: the next answered call ends the backoff.
        let mut backoff: Option<tokio::sync::watch::Receiver<u64>> = None;
        loop {
            let answered = async {
                match backoff.as_mut() {
                    Some(r) => r.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                update = rx.recv() => match update {
                    Some(a) => { pending.push(a); continue }
                    None => return,
                },
                _ = tokio::time::sleep_until(next) => {}
                true = answered => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
            backoff = None;
            self.stats.sync_ticks.fetch_add(1, Ordering::Relaxed);
            self.stats.sync_pending.store(pending.len() as u64, Ordering::Relaxed);
            next = tokio::time::Instant::now() + self.config.sync_interval;
            if pending.is_empty() || !*self.servers_contacted.borrow() {
                continue;
            }
            let batch = pending.take();
            let req = AllocUpdateRequest { alloc: batch.clone(), evals: Vec::new(), secret_id: self.identity.secret_id.clone() };
            match self.servers.node(CALL_TIMEOUT, |mut c| async move { c.update_alloc(req).await }).await {
                Ok(_) => {
                    self.stats.alloc_updates_sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    self.stats.sync_pending.store(pending.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    let wait = retry_base(SYNC_RETRY, self.config.dev_mode);
                    tracing::warn!(error = %e, retry_in = ?wait, allocs = batch.len(), "syncing alloc states failed");
                    pending.put_back(batch);
                    next = tokio::time::Instant::now() + wait;
                    // Refused while the servers count the node away, or unreachable: the next
                    // answered call (the heartbeat that brings the node back) ends the wait.
                    backoff = Some(self.servers.answers());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::ClientStatus;

    use super::*;

    fn a(id: &str, status: ClientStatus) -> Allocation {
        Allocation { id: id.into(), client_status: status, desired_description: "server field".into(), ..Allocation::default() }
    }

    #[test]
    fn newest_wins_and_a_failed_batch_never_overwrites_newer_states() {
        let mut p = Pending::default();
        p.push(a("x", ClientStatus::Pending));
        p.push(a("x", ClientStatus::Running));
        p.push(a("y", ClientStatus::Running));
        let batch = p.take();
        assert!(p.is_empty());
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0].client_status, ClientStatus::Running);
        assert!(batch[0].desired_description.is_empty(), "stripped to the client's fields");
        // x moved on while the batch was in flight; the batch failed.
        p.push(a("x", ClientStatus::Complete));
        p.put_back(batch);
        let again = p.take();
        let x = again.iter().find(|u| u.id == "x").unwrap();
        assert_eq!(x.client_status, ClientStatus::Complete, "the newer state survives");
        assert!(again.iter().any(|u| u.id == "y"), "the rest is retried");
    }
}
