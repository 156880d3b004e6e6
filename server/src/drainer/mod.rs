//! The node drainer (leader only): moves allocs off draining nodes and ends
//! each drain when nothing that must leave is left.
//!
//! ```text
//!  state (snapshot) ──▶ decide(state, draining nodes, now) ──▶ DrainWriter::migrate(transitions + node-drain evals)
//!        ▲                          (pure, decide.rs)      └─▶ DrainWriter::drains_complete(nodes + events)
//!        └── wait: a change to nodes / allocs / jobs, or the next force deadline
//! ```
//!
//! The drainer holds no drain progress of its own: each pass re-reads the
//! state, where an alloc's `DesiredTransition.Migrate` says it was asked to
//! move and its `DeploymentStatus` says whether its client judged it healthy.
//! So a new leader continues a drain where the last one stopped, and a
//! pass that fails is simply done again. The only thing remembered is the
//! set of draining nodes, kept current by diffing snapshots, so a cluster
//! without drains pays nothing per alloc change.
//!
//! It writes through [`DrainWriter`], two commands wide; the leader gives it
//! one backed by consensus, tests give it whatever they like.

mod decide;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::eval::trigger;
use nomad_proto::node::event_subsystem;
use nomad_proto::{DesiredTransition, EvalStatus, Evaluation, NamespacedId, NodeEvent, Timestamp};

pub use decide::{DrainActions, decide};

use crate::consensus::{ApplyError, BoxFuture, Consensus};
use crate::fsm::{Command, DrainComplete};
use crate::state::{State, StateStore, Table};

/// Nomad's event message when a drain ends.
pub const DRAIN_COMPLETE: &str = "Node drain complete";
/// Event detail set (to "true") when the force deadline ended the drain.
pub const DETAIL_DEADLINE_REACHED: &str = "deadline_reached";

/// The writes the drainer makes.
pub trait DrainWriter: Send + Sync + 'static {
    /// Marks allocs for migration and creates their evals, in one write.
    fn migrate(&self, transitions: BTreeMap<String, DesiredTransition>, evals: Vec<Evaluation>) -> BoxFuture<'_, Result<u64, ApplyError>>;
    /// Ends the drains of these nodes.
    fn drains_complete(&self, nodes: Vec<DrainComplete>, now: Timestamp) -> BoxFuture<'_, Result<u64, ApplyError>>;
}

/// [`DrainWriter`] through consensus (the leader's).
pub struct ConsensusDrainWriter(pub Arc<dyn Consensus>);

impl DrainWriter for ConsensusDrainWriter {
    fn migrate(&self, transitions: BTreeMap<String, DesiredTransition>, evals: Vec<Evaluation>) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.0.apply(Command::AllocDesiredTransition { transitions, evals })
    }

    fn drains_complete(&self, nodes: Vec<DrainComplete>, now: Timestamp) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.0.apply(Command::NodeDrainComplete { nodes, now })
    }
}

/// Drainer settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainerConfig {
    /// Passes are at least this far apart, so a burst of alloc updates costs one pass.
    pub min_interval: Duration,
    /// Wait after a failed write before trying again.
    pub retry_delay: Duration,
    /// Most alloc transitions in one write.
    pub max_per_write: usize,
}

impl Default for DrainerConfig {
    fn default() -> Self {
        DrainerConfig { min_interval: Duration::from_millis(50), retry_delay: Duration::from_secs(1), max_per_write: 1000 }
    }
}

/// The drainer of one term of leadership; [`Drainer::run`] until dropped.
pub struct Drainer {
    store: Arc<StateStore>,
    writer: Arc<dyn DrainWriter>,
    config: DrainerConfig,
    /// Nodes with a drain strategy, as of `seen`.
    draining: BTreeSet<String>,
    seen: Option<State>,
}

impl Drainer {
    /// A drainer reading `store` and writing through `writer`.
    pub fn new(store: Arc<StateStore>, writer: Arc<dyn DrainWriter>, config: DrainerConfig) -> Drainer {
        Drainer { store, writer, config, draining: BTreeSet::new(), seen: None }
    }

    /// Runs passes until the task is dropped.
    pub async fn run(mut self) {
        loop {
            let started = tokio::time::Instant::now();
            let snap = self.store.snapshot();
            let now = Timestamp::now();
            let (actions, wrote) = match self.pass(&snap, now).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "node drainer: write failed; retrying");
                    tokio::time::sleep(self.config.retry_delay).await;
                    continue;
                }
            };
            if wrote {
                // Our own write changed the state: look again (rate-limited).
                tokio::time::sleep_until(started + self.config.min_interval).await;
                continue;
            }
            let tables: &[Table] = if self.draining.is_empty() { &[Table::Nodes] } else { &[Table::Nodes, Table::Allocs, Table::Jobs] };
            let wait = match actions.next_deadline {
                // Just past the deadline, so the next pass sees it reached.
                Some(at) => Duration::from_nanos((at.unix_nanos() - now.unix_nanos()).max(0) as u64) + Duration::from_millis(1),
                None => Duration::from_secs(3600),
            };
            self.store.wait_for_change(tables, snap.index, wait).await;
            tokio::time::sleep_until(started + self.config.min_interval).await;
        }
    }

    /// One pass over `snap`: decide, then write. Returns the decision and whether anything was written.
    pub async fn pass(&mut self, snap: &State, now: Timestamp) -> Result<(DrainActions, bool), ApplyError> {
        self.track(snap);
        let actions = decide(snap, self.draining.iter().map(String::as_str), now);
        let mut wrote = false;
        if !actions.migrate.is_empty() {
            let allocs: Vec<_> = actions.migrate.values().cloned().collect();
            for chunk in allocs.chunks(self.config.max_per_write.max(1)) {
                let transitions: BTreeMap<String, DesiredTransition> = chunk
                    .iter()
                    .map(|a| (a.id.clone(), DesiredTransition { migrate: Some(true), ..DesiredTransition::default() }))
                    .collect();
                let evals = drain_evals(chunk, now);
                tracing::info!(allocs = transitions.len(), evals = evals.len(), "node drainer: marking allocs for migration");
                self.writer.migrate(transitions, evals).await?;
                wrote = true;
            }
        }
        if !actions.complete.is_empty() {
            let nodes: Vec<DrainComplete> = actions
                .complete
                .iter()
                .map(|(id, forced)| DrainComplete { node_id: id.clone(), event: complete_event(*forced, now) })
                .collect();
            for (id, forced) in &actions.complete {
                tracing::info!(node_id = %id, deadline_reached = forced, "node drainer: drain complete");
            }
            self.writer.drains_complete(nodes, now).await?;
            wrote = true;
        }
        Ok((actions, wrote))
    }

    /// Brings the set of draining nodes up to `snap`, looking only at nodes
    /// that changed since the last pass.
    fn track(&mut self, snap: &State) {
        match &self.seen {
            None => {
                self.draining = snap.nodes().filter(|n| n.drain_strategy.is_some()).map(|n| n.id.clone()).collect();
            }
            Some(old) => {
                for (_, n) in snap.nodes_changed_since(old) {
                    if n.drain_strategy.is_some() {
                        self.draining.insert(n.id.clone());
                    } else {
                        self.draining.remove(&n.id);
                    }
                }
                self.draining.retain(|id| snap.node(id).is_some());
            }
        }
        self.seen = Some(snap.clone());
    }
}

/// One `node-drain` eval per job among `allocs`.
fn drain_evals(allocs: &[Arc<nomad_proto::Allocation>], now: Timestamp) -> Vec<Evaluation> {
    let mut seen = BTreeSet::new();
    let mut evals = Vec::new();
    for a in allocs {
        if !seen.insert(NamespacedId::new(&a.namespace, &a.job_id)) {
            continue;
        }
        let (priority, eval_type) = match a.job.as_deref() {
            Some(j) => (j.priority, j.job_type),
            None => (nomad_proto::job::DEFAULT_JOB_PRIORITY, a.job_type()),
        };
        evals.push(Evaluation {
            id: nomad_proto::new_id(),
            namespace: a.namespace.clone(),
            priority,
            eval_type,
            triggered_by: trigger::NODE_DRAIN.to_string(),
            job_id: a.job_id.clone(),
            status: EvalStatus::Pending,
            create_time: now.unix_nanos(),
            modify_time: now.unix_nanos(),
            ..Evaluation::default()
        });
    }
    evals
}

/// "Node drain complete", with `deadline_reached="true"` when the deadline forced it.
pub fn complete_event(forced: bool, now: Timestamp) -> NodeEvent {
    let mut details = BTreeMap::new();
    if forced {
        details.insert(DETAIL_DEADLINE_REACHED.to_string(), "true".to_string());
    }
    NodeEvent { message: DRAIN_COMPLETE.into(), subsystem: event_subsystem::DRAIN.into(), details, timestamp: now, create_index: 0 }
}

#[cfg(test)]
mod tests;
