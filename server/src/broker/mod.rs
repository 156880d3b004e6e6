//! Leader-only bookkeeping of evaluations: which to run next, which wait for
//! capacity, and the writes that keep their stored status honest.
//!
//! ```text
//!  state (evals, nodes) ──diff──▶ ChangeWatcher ──pending──▶ EvalBroker ──dequeue──▶ workers
//!                                      │                        │ ack/nack
//!                                      └──blocked──▶ BlockedEvals│
//!                                             │ unblock / cancel │ delivery limit, superseded
//!                                             ▼                  ▼
//!                                        EvalWriter (batched EvalUpsert through consensus)
//! ```
//!
//! New evals are noticed by diffing state snapshots, not by a hook in the
//! FSM: the FSM stays pure, every writer (endpoints, plan applier, replays
//! after a leader change) is covered the same way, and bursts of writes
//! coalesce into one diff. Unblocking is a write (the eval goes back to
//! `pending`, triggered by `queued-allocs`), so a new leader finds it in
//! state and the watcher enqueues it like any other pending eval.

mod blocked;
mod eval_broker;
mod eval_writer;
mod failed;
mod watcher;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use blocked::{BlockEffects, BlockedEvals, BlockedStats};
pub use eval_broker::{BrokerError, BrokerStats, Delivery, EvalBroker};
pub use eval_writer::{EvalWriter, MAX_EVALS_PER_WRITE};
pub use failed::reap_failed_evals;
pub use watcher::{ChangeWatcher, diff_changes, effect_writes};

/// Eval broker settings (Nomad's `eval_nack_timeout`, `eval_delivery_limit`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerConfig {
    /// An unacknowledged delivery is taken back after this long.
    pub nack_timeout: Duration,
    /// Deliveries before an eval is marked `failed`.
    pub delivery_limit: u32,
    /// Wait before redelivering an eval nacked once.
    pub initial_nack_delay: Duration,
    /// Wait per further nack (compounding) before redelivering.
    pub subsequent_nack_delay: Duration,
    /// Least wait of the follow-up eval created for a failed eval.
    pub failed_followup_baseline: Duration,
    /// Random extra wait (up to this) of that follow-up.
    pub failed_followup_range: Duration,
    /// How often blocked evals created by plan failures are retried.
    pub failed_unblock_interval: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            nack_timeout: Duration::from_secs(60),
            delivery_limit: 3,
            initial_nack_delay: Duration::from_secs(1),
            subsequent_nack_delay: Duration::from_secs(20),
            failed_followup_baseline: Duration::from_secs(60),
            failed_followup_range: Duration::from_secs(300),
            failed_unblock_interval: Duration::from_secs(60),
        }
    }
}

/// Status description of evals superseded while they waited behind another eval of their job.
pub const CANCELED_SUPERSEDED: &str = "canceled after more recent eval was processed";
