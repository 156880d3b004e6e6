//! The SI token revoker (leader only): revokes in Consul the Service Identity tokens of allocs
//! that are finished or gone, or whose node is down or gone, then forgets their accessors.
//!
//! ```text
//!  state: si_token_accessors ──▶ orphaned? (alloc client-terminal or missing, node down or missing)
//!        ▲                              │ due (not backing off)
//!        │                              ▼
//!        │             ConsulAcl::revoke_token (≤ 64 at once; "Cannot find token" = revoked)
//!        │                 │ revoked                       │ failed
//!        │                 ▼                               ▼
//!        └── AccessorPurger::purge (one command)    retry after 1 s, 2 s, 4 s ... ≤ 5 min
//! ```
//!
//! It keeps no list of its own beyond the backoff of failed attempts: what to revoke is read
//! from the state each pass, and an accessor leaves the state only once Consul confirmed the
//! token is gone. So the three moments Nomad revokes at (an alloc update that makes it
//! terminal, a node going down, and leadership won with allocs that died meanwhile) are all
//! one rule, a failed revocation is retried until it succeeds, and a new leader carries on
//! where the last one stopped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use super::ConsulAcl;
use crate::consensus::{ApplyError, BoxFuture, Consensus};
use crate::fsm::Command;
use crate::state::{SiTokenAccessor, State, StateStore, Table};

/// Consul's answer to deleting a token it does not have; counts as revoked.
pub const TOKEN_NOT_FOUND: &str = "Cannot find token to delete";

/// The one write the revoker makes.
pub trait AccessorPurger: Send + Sync + 'static {
    /// Forgets accessors whose tokens are revoked.
    fn purge(&self, accessor_ids: Vec<String>) -> BoxFuture<'_, Result<u64, ApplyError>>;
}

/// [`AccessorPurger`] through consensus (the leader's).
pub struct ConsensusPurger(pub Arc<dyn Consensus>);

impl AccessorPurger for ConsensusPurger {
    fn purge(&self, accessor_ids: Vec<String>) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.0.apply(Command::SiTokenAccessorsDeregister { accessor_ids })
    }
}

/// Revoker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RevokerConfig {
    /// Passes are at least this far apart, so a burst of alloc updates costs one pass.
    pub min_interval: Duration,
    /// Wait after an accessor's first failed revocation; doubled after each further failure.
    pub backoff_base: Duration,
    /// Longest wait between attempts (Nomad retries every `siTokenRevocationInterval`, 5 min).
    pub backoff_max: Duration,
    /// Most revocations in one pass (`maxConsulRevocationBatchSize`).
    pub max_batch: usize,
    /// Revocations in flight at once (`siTokenMaxParallelRevokes`).
    pub max_parallel: usize,
}

impl Default for RevokerConfig {
    fn default() -> Self {
        RevokerConfig {
            min_interval: Duration::from_millis(50),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            max_batch: 1000,
            max_parallel: 64,
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Accessors revoked and purged.
    pub revoked: Vec<String>,
    /// Accessors whose revocation failed this pass.
    pub failed: Vec<String>,
}

/// The revoker of one term of leadership; [`Revoker::run`] until dropped.
pub struct Revoker {
    store: Arc<StateStore>,
    acl: Arc<dyn ConsulAcl>,
    purger: Arc<dyn AccessorPurger>,
    config: RevokerConfig,
    /// Per accessor that failed: failures so far and when to try again.
    backoff: HashMap<String, (u32, Instant)>,
}

impl Revoker {
    /// A revoker reading `store`, revoking through `acl` and forgetting through `purger`.
    pub fn new(store: Arc<StateStore>, acl: Arc<dyn ConsulAcl>, purger: Arc<dyn AccessorPurger>, config: RevokerConfig) -> Revoker {
        Revoker { store, acl, purger, config, backoff: HashMap::new() }
    }

    /// Runs passes until the task is dropped.
    pub async fn run(mut self) {
        loop {
            let started = Instant::now();
            let snap = self.store.snapshot();
            let outcome = self.pass(&snap).await;
            if !outcome.revoked.is_empty() {
                // Our own write changed the state: look again (rate-limited).
                tokio::time::sleep_until(started + self.config.min_interval).await;
                continue;
            }
            let wait = self.backoff.values().map(|(_, at)| at.saturating_duration_since(Instant::now())).min();
            let wait = wait.unwrap_or(Duration::from_secs(3600));
            // Without accessors nothing but a new accessor can give work: alloc and node
            // changes wake the revoker only while there are tokens to watch.
            let tables: &[Table] = if snap.si_token_accessors().next().is_none() {
                &[Table::SiTokenAccessors]
            } else {
                &[Table::SiTokenAccessors, Table::Allocs, Table::Nodes]
            };
            self.store.wait_for_change(tables, snap.index, wait).await;
            tokio::time::sleep_until(started + self.config.min_interval).await;
        }
    }

    fn next_try(&self, failures: u32) -> Instant {
        let factor = 1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX);
        let delay = self.config.backoff_base.saturating_mul(factor).min(self.config.backoff_max);
        Instant::now() + delay
    }

    /// One pass over `snap`: revoke what is orphaned and due, purge what was revoked.
    pub async fn pass(&mut self, snap: &State) -> PassOutcome {
        let now = Instant::now();
        self.backoff.retain(|id, _| snap.si_token_accessor(id).is_some());
        let due: Vec<Arc<SiTokenAccessor>> = snap
            .si_token_accessors()
            .filter(|a| snap.si_token_is_orphaned(a))
            .filter(|a| self.backoff.get(&a.accessor_id).is_none_or(|(_, at)| *at <= now))
            .take(self.config.max_batch.max(1))
            .cloned()
            .collect();
        if due.is_empty() {
            return PassOutcome::default();
        }
        let acl = self.acl.clone();
        let results: Vec<(Arc<SiTokenAccessor>, Result<(), super::ConsulCallError>)> = futures::stream::iter(due)
            .map(|a| {
                let acl = acl.clone();
                async move {
                    let r = acl.revoke_token(&a.consul_namespace, &a.accessor_id).await;
                    (a, r)
                }
            })
            .buffer_unordered(self.config.max_parallel.max(1))
            .collect()
            .await;
        let mut outcome = PassOutcome::default();
        for (a, r) in results {
            match r {
                Ok(()) => outcome.revoked.push(a.accessor_id.clone()),
                Err(e) if e.message.contains(TOKEN_NOT_FOUND) => outcome.revoked.push(a.accessor_id.clone()),
                Err(e) => {
                    let failures = self.backoff.get(&a.accessor_id).map_or(0, |(f, _)| *f) + 1;
                    tracing::warn!(
                        alloc_id = %a.alloc_id, node_id = %a.node_id, task = %a.task_name, failures, error = %e,
                        "failed to revoke SI token accessor; will retry"
                    );
                    self.backoff.insert(a.accessor_id.clone(), (failures, self.next_try(failures)));
                    outcome.failed.push(a.accessor_id.clone());
                }
            }
        }
        outcome.revoked.sort();
        if !outcome.revoked.is_empty() {
            tracing::info!(accessors = outcome.revoked.len(), "revoked SI tokens of dead allocs");
            if let Err(e) = self.purger.purge(outcome.revoked.clone()).await {
                // Revoked in Consul but still stored: the next try finds the token gone, which
                // counts as revoked, and purges again.
                tracing::warn!(error = %e, "failed to purge revoked SI token accessors; will retry");
                for id in std::mem::take(&mut outcome.revoked) {
                    let failures = self.backoff.get(&id).map_or(0, |(f, _)| *f) + 1;
                    let at = self.next_try(failures);
                    self.backoff.insert(id.clone(), (failures, at));
                    outcome.failed.push(id);
                }
            }
        }
        outcome
    }
}
