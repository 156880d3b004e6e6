//! The CSI volume claim GC (Nomad's core job `csi-volume-claim-gc`, `csiVolumeClaimGC` in
//! `nomad/core_sched.go`): every `csi_volume_claim_gc_interval` the leader marks each volume
//! older than `csi_volume_claim_gc_threshold` that has past claims (claims of allocs that
//! finished or were collected without their client reporting) with a claim that changes
//! nothing but the volume's index; the volume watcher wakes on that and releases them.
//!
//! nomad-rs has no core evals: the job is a leader loop, as the drainer and the heartbeat
//! timers are. "Older than the threshold" is judged as Nomad's time table does, by the Raft
//! index this leader saw at each pass: a volume whose create index is at or below the newest
//! index seen at least `threshold` ago. A new leader starts its table at its first index, so its
//! first collection comes a threshold after it won.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::NamespacedId;
use tokio::time::Instant;

use crate::consensus::BoxFuture;

/// Nomad's `CoreJobCSIVolumeClaimGC`.
pub const CORE_JOB_CSI_VOLUME_CLAIM_GC: &str = "csi-volume-claim-gc";

/// What the claim GC may do, and nothing else.
pub trait ClaimGcHandle: Send + Sync + 'static {
    /// The state's index now.
    fn index(&self) -> u64;
    /// The volumes created at or below `created_by` that have past claims once denormalized.
    fn volumes_to_collect(&self, created_by: u64) -> Vec<NamespacedId>;
    /// Writes a GC claim on the volume (no alloc, `unpublishing`): only its index changes.
    fn mark(&self, volume: &NamespacedId) -> BoxFuture<'_, Result<u64, String>>;
}

/// Claim GC settings (`server { csi_volume_claim_gc_interval, csi_volume_claim_gc_threshold }`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimGcConfig {
    /// How often it runs (Nomad: 5 min).
    pub interval: Duration,
    /// How old a volume must be (Nomad: 5 min).
    pub threshold: Duration,
}

impl Default for ClaimGcConfig {
    fn default() -> Self {
        ClaimGcConfig { interval: Duration::from_secs(300), threshold: Duration::from_secs(300) }
    }
}

/// The index at which this leader saw the state at each pass: Nomad's time table, kept only as
/// long as it can answer for `threshold`.
#[derive(Debug, Default)]
pub struct TimeTable {
    entries: VecDeque<(Instant, u64)>,
}

impl TimeTable {
    /// Records `index` as seen at `at`.
    pub fn witness(&mut self, at: Instant, index: u64) {
        self.entries.push_back((at, index));
    }

    /// The newest index seen at least `threshold` before `now` (0: none yet). Drops the entries
    /// no later question can need.
    pub fn index_before(&mut self, now: Instant, threshold: Duration) -> u64 {
        let old_enough = |at: Instant| at.checked_add(threshold).is_some_and(|t| t <= now);
        while self.entries.len() > 1 && old_enough(self.entries[1].0) {
            self.entries.pop_front();
        }
        match self.entries.front() {
            Some(&(at, index)) if old_enough(at) => index,
            _ => 0,
        }
    }
}

/// The claim GC of one term of leadership.
pub struct ClaimGc {
    handle: Arc<dyn ClaimGcHandle>,
    config: ClaimGcConfig,
}

impl ClaimGc {
    /// A GC over `handle`.
    pub fn new(handle: Arc<dyn ClaimGcHandle>, config: ClaimGcConfig) -> ClaimGc {
        ClaimGc { handle, config }
    }

    /// Runs until dropped (leadership lost).
    pub async fn run(self) {
        let mut table = TimeTable::default();
        table.witness(Instant::now(), self.handle.index());
        let interval = self.config.interval.max(Duration::from_millis(1));
        let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let now = Instant::now();
            table.witness(now, self.handle.index());
            self.collect(table.index_before(now, self.config.threshold)).await;
        }
    }

    /// One pass: marks every volume created at or below `created_by` that has past claims.
    pub async fn collect(&self, created_by: u64) -> usize {
        let volumes = self.handle.volumes_to_collect(created_by);
        tracing::trace!(job = CORE_JOB_CSI_VOLUME_CLAIM_GC, volumes = volumes.len(), "garbage collecting unclaimed CSI volume claims");
        let mut marked = 0;
        for v in &volumes {
            match self.handle.mark(v).await {
                Ok(_) => marked += 1,
                Err(e) => {
                    tracing::warn!(job = CORE_JOB_CSI_VOLUME_CLAIM_GC, volume_id = %v.id, namespace = %v.namespace, error = %e, "failed to mark volume for claim GC")
                }
            }
        }
        marked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_table_answers_with_the_newest_index_old_enough() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut table = TimeTable::default();
        table.witness(t0, 10);
        assert_eq!(table.index_before(t0 + s(299), s(300)), 0, "nothing is old enough yet");
        assert_eq!(table.index_before(t0 + s(300), s(300)), 10);
        table.witness(t0 + s(300), 20);
        table.witness(t0 + s(600), 30);
        assert_eq!(table.index_before(t0 + s(600), s(300)), 20);
        assert_eq!(table.index_before(t0 + s(900), s(300)), 30);
        assert_eq!(table.entries.len(), 1, "entries no question can need are dropped");
        // A zero threshold: everything up to now.
        table.witness(t0 + s(901), 40);
        assert_eq!(table.index_before(t0 + s(901), Duration::ZERO), 40);
    }
}
