//! Forced garbage collection (`PUT /v1/system/gc`, Nomad's `System.GarbageCollect` running its
//! core jobs with every threshold at "now"): what is finished goes, in Nomad's order.
//!
//! - **Jobs**: a stopped job, or a batch job that is dead, whose evals and allocs are all
//!   finished, is purged with them (a periodic or parameterized parent only when stopped).
//! - **Evals**: a finished eval whose allocs are all finished goes with those allocs, unless its
//!   job is a batch job still registered and not stopped (its finished allocs are what keep the
//!   scheduler from running them again).
//! - **Deployments**: a finished deployment (failed, successful or cancelled) none of whose
//!   allocs is still live goes.
//! - **Nodes**: a down node with no alloc left that is not finished is removed.
//!
//! Allocs leave only with their eval, so the clients see them vanish from their alloc lists
//! and destroy what they still keep, as Nomad's clients do.

use nomad_proto::{Evaluation, JobStatus, JobType, NodeStatus};

use super::{EndpointError, Endpoints};
use crate::fsm::Command;
use crate::state::{State, job_status};

/// What one forced GC removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// Jobs purged (`namespace/id`).
    pub jobs: Vec<String>,
    /// Evals deleted.
    pub evals: usize,
    /// Allocs deleted.
    pub allocs: usize,
    /// Nodes removed.
    pub nodes: Vec<String>,
    /// Deployments deleted.
    pub deployments: usize,
}

/// Most evals and allocs one Raft entry deletes (Nomad's `maxIdsPerReap` is of this order).
const MAX_IDS_PER_ENTRY: usize = 4096;

impl Endpoints {
    /// Runs every collector now.
    pub async fn force_gc(&self) -> Result<GcReport, EndpointError> {
        let mut report = GcReport::default();
        let now = self.now();
        // Jobs first: what a purged job leaves is deleted with it.
        let snap = self.store.snapshot();
        for (ns, id, evals, allocs) in collectable_jobs(&snap) {
            self.consensus
                .apply(Command::JobDeregister { namespace: ns.clone(), job_id: id.clone(), purge: true, eval: None, now })
                .await?;
            report.evals += evals.len();
            report.allocs += allocs.len();
            self.delete(evals, allocs).await?;
            report.jobs.push(format!("{ns}/{id}"));
        }
        let snap = self.store.snapshot();
        let (evals, allocs) = collectable_evals(&snap);
        report.evals += evals.len();
        report.allocs += allocs.len();
        self.delete(evals, allocs).await?;
        let snap = self.store.snapshot();
        let deployments: Vec<String> = snap
            .deployments()
            .filter(|d| !d.active() && snap.allocs_by_deployment(d).all(|a| a.terminal()))
            .map(|d| d.id.clone())
            .collect();
        for ids in deployments.chunks(MAX_IDS_PER_ENTRY) {
            self.consensus.apply(Command::DeploymentDelete { deployment_ids: ids.to_vec() }).await?;
            report.deployments += ids.len();
        }
        let snap = self.store.snapshot();
        let nodes: Vec<String> = snap
            .nodes()
            .filter(|n| n.status == NodeStatus::Down && snap.allocs_by_node(&n.id).all(|a| a.terminal()))
            .map(|n| n.id.clone())
            .collect();
        if !nodes.is_empty() {
            self.consensus.apply(Command::NodeDeregister { node_ids: nodes.clone(), evals: Vec::new() }).await?;
            report.nodes = nodes;
        }
        Ok(report)
    }

    async fn delete(&self, mut evals: Vec<String>, mut allocs: Vec<String>) -> Result<(), EndpointError> {
        while !evals.is_empty() || !allocs.is_empty() {
            let eval_ids: Vec<String> = evals.drain(..evals.len().min(MAX_IDS_PER_ENTRY)).collect();
            let alloc_ids: Vec<String> = allocs.drain(..allocs.len().min(MAX_IDS_PER_ENTRY)).collect();
            self.consensus.apply(Command::EvalDelete { eval_ids, alloc_ids }).await?;
        }
        Ok(())
    }
}

/// Jobs to purge, each with its evals and allocs.
fn collectable_jobs(state: &State) -> Vec<(String, String, Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for job in state.jobs() {
        let parent = job.is_periodic_or_parameterized();
        // The status from the allocs and evals as they are now, not as last stored.
        let dead = job_status(state, job) == JobStatus::Dead;
        let eligible = job.stop || (!parent && matches!(job.job_type, JobType::Batch | JobType::Sysbatch) && dead);
        if !eligible {
            continue;
        }
        let evals: Vec<&Evaluation> = state.evals_by_job(&job.namespace, &job.id).map(|e| e.as_ref()).collect();
        let allocs: Vec<_> = state.allocs_by_job(&job.namespace, &job.id).collect();
        if evals.iter().all(|e| e.status.is_terminal()) && allocs.iter().all(|a| a.terminal()) {
            let eval_ids = evals.iter().map(|e| e.id.clone()).collect();
            let alloc_ids = allocs.iter().map(|a| a.id.clone()).collect();
            out.push((job.namespace.clone(), job.id.clone(), eval_ids, alloc_ids));
        }
    }
    out
}

/// Finished evals whose allocs are all finished, and those allocs.
fn collectable_evals(state: &State) -> (Vec<String>, Vec<String>) {
    let (mut evals, mut allocs) = (Vec::new(), Vec::new());
    for eval in state.evals().filter(|e| e.status.is_terminal()) {
        let live_batch = state.job(&eval.namespace, &eval.job_id).is_some_and(|j| {
            matches!(j.job_type, JobType::Batch | JobType::Sysbatch) && !j.stop && job_status(state, j) != JobStatus::Dead
        });
        if live_batch {
            continue;
        }
        let mine: Vec<_> = state.allocs_by_job(&eval.namespace, &eval.job_id).filter(|a| a.eval_id == eval.id).collect();
        if mine.iter().all(|a| a.terminal()) {
            evals.push(eval.id.clone());
            allocs.extend(mine.iter().map(|a| a.id.clone()));
        }
    }
    (evals, allocs)
}

#[cfg(test)]
#[path = "gc_tests.rs"]
mod tests;
