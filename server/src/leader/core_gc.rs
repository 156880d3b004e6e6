//! The leader's periodic garbage collection (Nomad's core jobs `job-gc`, `eval-gc`,
//! `deployment-gc` and `node-gc`): every `job_gc_interval` it collects what has been finished
//! for longer than its threshold (`endpoints/gc.rs` decides what), so the servers' state stays
//! bounded under a steady stream of short jobs. A failed pass is simply done again next time.

use std::sync::Arc;

use nomad_proto::Timestamp;

use crate::consensus::Consensus;
use crate::endpoints::{GcConfig, GcCutoffs, collect_garbage};
use crate::state::StateStore;

/// The periodic GC of one term of leadership.
pub struct CoreGc {
    store: Arc<StateStore>,
    consensus: Arc<dyn Consensus>,
    config: GcConfig,
}

impl CoreGc {
    /// A GC over the store, writing through consensus.
    pub fn new(store: Arc<StateStore>, consensus: Arc<dyn Consensus>, config: GcConfig) -> CoreGc {
        CoreGc { store, consensus, config }
    }

    /// Runs until dropped (leadership lost). The first pass is one interval after gaining
    /// leadership, as Nomad's core job timers.
    pub async fn run(self) {
        let mut ticks = super::periodic_ticks(self.config.interval);
        loop {
            ticks.tick().await;
            let cutoffs = GcCutoffs::at(Timestamp::now(), &self.config);
            match collect_garbage(&self.store, self.consensus.as_ref(), cutoffs).await {
                Ok(r) if r.jobs.is_empty() && r.evals == 0 && r.allocs == 0 && r.deployments == 0 && r.nodes.is_empty() => {}
                Ok(r) => tracing::debug!(
                    jobs = r.jobs.len(),
                    evals = r.evals,
                    allocs = r.allocs,
                    deployments = r.deployments,
                    nodes = r.nodes.len(),
                    "core GC"
                ),
                Err(e) => tracing::warn!(error = %e, "core GC failed; trying again next interval"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fsm::Command;
    use crate::testing::{TestServer, job};

    #[tokio::test]
    async fn the_leader_collects_a_finished_job_at_each_interval() {
        let ts = TestServer::new();
        let mut j = job("done", 1);
        j.namespace = "default".into();
        let now = Timestamp::now();
        ts.consensus.apply(Command::JobRegister { job: j, eval: None, now }).await.unwrap();
        let stop = Command::JobDeregister { namespace: "default".into(), job_id: "done".into(), purge: false, eval: None, now };
        ts.consensus.apply(stop).await.unwrap();
        let zero = Duration::ZERO;
        let config = GcConfig {
            interval: Duration::from_millis(20),
            job_threshold: zero,
            eval_threshold: zero,
            batch_eval_threshold: zero,
            deployment_threshold: zero,
            node_threshold: zero,
        };
        let consensus: Arc<dyn Consensus> = ts.consensus.clone();
        let gc = tokio::spawn(CoreGc::new(ts.store.clone(), consensus, config).run());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while ts.store.snapshot().job("default", "done").is_some() {
            assert!(tokio::time::Instant::now() < deadline, "the stopped job was never collected");
            ts.store.wait_for_change(&[crate::state::Table::Jobs], ts.store.snapshot().index, Duration::from_millis(100)).await;
        }
        gc.abort();
    }
}
