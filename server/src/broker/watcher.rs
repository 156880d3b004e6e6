//! Turns state changes into broker and blocked-eval work, on the leader.
//!
//! Waits for the evals or nodes table to move, diffs the new snapshot with
//! the last one it saw, and:
//! - enqueues evals that are `pending`, tracks evals that are `blocked`, and
//!   untracks a job's blocked eval when a later eval of the job completed
//!   with everything placed;
//! - unblocks evals when a node became schedulable (registered ready, became
//!   ready, eligible, undrained, or changed class or resources) or when a
//!   client reported allocs finished (a node's `LastAllocUpdateIndex` moves
//!   with every client alloc update).

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::{EvalStatus, Evaluation, Node, Timestamp};

use super::{BlockEffects, BlockedEvals, EvalBroker, EvalWriter};
use crate::state::{State, StateStore, Table};

/// The leader's state-change watcher.
pub struct ChangeWatcher {
    store: Arc<StateStore>,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    writer: EvalWriter,
}

impl ChangeWatcher {
    /// A watcher feeding `broker` and `blocked`, writing through `writer`.
    pub fn new(store: Arc<StateStore>, broker: Arc<EvalBroker>, blocked: Arc<BlockedEvals>, writer: EvalWriter) -> ChangeWatcher {
        ChangeWatcher { store, broker, blocked, writer }
    }

    /// Loads every non-terminal eval of `state` (leadership won): pending
    /// ones into the broker, blocked ones into the tracker.
    pub fn restore(&self, state: &State) {
        let mut evals: Vec<Arc<Evaluation>> = state.evals().filter(|e| !e.status.is_terminal()).cloned().collect();
        evals.sort_by_key(|e| e.modify_index);
        let mut effects = BlockEffects::default();
        for e in evals {
            match e.status {
                EvalStatus::Pending => self.broker.enqueue(e),
                EvalStatus::Blocked => effects.extend(self.blocked.block(e)),
                _ => {}
            }
        }
        self.write(effects);
    }

    /// Restores from the current state, then follows changes until the task is dropped.
    pub async fn run(self, failed_unblock_interval: Duration) {
        let mut last = self.store.snapshot();
        self.restore(&last);
        let mut retry_failed = tokio::time::interval_at(tokio::time::Instant::now() + failed_unblock_interval, failed_unblock_interval);
        loop {
            let seen = last.max_index(WATCHED);
            tokio::select! {
                _ = self.store.wait_for_change(WATCHED, seen, Duration::from_secs(3600)) => {
                    let now = self.store.snapshot();
                    self.apply_changes(&last, &now);
                    last = now;
                }
                _ = retry_failed.tick() => {
                    let unblock = self.blocked.unblock_failed();
                    self.write(BlockEffects { unblock, cancel: Vec::new() });
                }
            }
        }
    }

    /// Handles everything that changed from `old` to `new`.
    pub fn apply_changes(&self, old: &State, new: &State) {
        let (pending, effects) = diff_changes(&self.blocked, old, new);
        for e in pending {
            self.broker.enqueue(e);
        }
        self.write(effects);
    }

    fn write(&self, effects: BlockEffects) {
        self.writer.submit(effect_writes(effects, Timestamp::now().unix_nanos()));
    }
}

/// The tables whose changes the watcher follows.
const WATCHED: &[Table] = &[Table::Evals, Table::Nodes, Table::CsiVolumes];

/// What the leader makes of the changes from `old` to `new`, without doing
/// it: the pending evals to enqueue (in index order) and the blocked-eval
/// effects to write. The watcher task runs this on every change; in-process
/// tests that drive every step themselves call it directly.
pub fn diff_changes(blocked: &BlockedEvals, old: &State, new: &State) -> (Vec<Arc<Evaluation>>, BlockEffects) {
    let mut effects = BlockEffects::default();
    // Capacity first, so blocked evals below see the newest unblock indexes.
    for (before, node) in new.nodes_changed_since(old) {
        if let Some(index) = capacity_appeared(before.as_deref(), &node, new) {
            effects.unblock.extend(blocked.unblock(&node.computed_class, index));
        }
    }
    // A freed CSI claim may let a job blocked on the volume place.
    for (namespace, index) in new.csi_claims_freed_since(old) {
        effects.unblock.extend(blocked.unblock_namespace(&namespace, index));
    }
    let mut evals = new.evals_changed_since(old);
    evals.sort_by_key(|e| e.modify_index);
    let mut pending = Vec::new();
    for e in evals {
        match e.status {
            EvalStatus::Pending => pending.push(e),
            EvalStatus::Blocked => effects.extend(blocked.block(e)),
            EvalStatus::Complete if e.failed_tg_allocs.is_empty() => {
                if let Some(b) = blocked.untrack(&e.namespaced_job_id(), e.modify_index) {
                    effects.cancel.push((b, format!("evaluation {:?} successful", e.id)));
                }
            }
            _ => {}
        }
    }
    (pending, effects)
}

/// The eval writes for blocked-eval effects, stamped `now_ns`: unblocked
/// evals go back to `pending` (triggered by `queued-allocs`), canceled ones
/// say why.
pub fn effect_writes(effects: BlockEffects, now_ns: i64) -> Vec<Evaluation> {
    let mut evals = Vec::with_capacity(effects.unblock.len() + effects.cancel.len());
    for e in effects.unblock {
        let mut e = (*e).clone();
        e.status = EvalStatus::Pending;
        e.status_description.clear();
        e.triggered_by = trigger::QUEUED_ALLOCS.to_string();
        e.modify_time = now_ns.max(e.create_time + 1);
        evals.push(e);
    }
    for (e, why) in effects.cancel {
        let mut e = (*e).clone();
        e.status = EvalStatus::Canceled;
        e.status_description = why;
        e.modify_time = now_ns.max(e.create_time + 1);
        evals.push(e);
    }
    evals
}

/// The Raft index at which `node` may offer new room, if it does.
fn capacity_appeared(before: Option<&Node>, node: &Node, state: &State) -> Option<u64> {
    let became_schedulable = node.is_ready_for_placement()
        && before.is_none_or(|b| {
            !b.is_ready_for_placement() || b.computed_class != node.computed_class || b.node_resources != node.node_resources
        });
    if became_schedulable {
        return Some(node.modify_index.max(node.last_alloc_update_index));
    }
    // A client alloc update landed; did it finish any alloc?
    let since = before.map_or(0, |b| b.last_alloc_update_index);
    if node.last_alloc_update_index > since && state.allocs_by_node(&node.id).any(|a| a.modify_index > since && a.client_terminal()) {
        return Some(node.last_alloc_update_index);
    }
    None
}
