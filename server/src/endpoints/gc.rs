//! Garbage collection (Nomad's core jobs in `nomad/core_sched.go`): what is finished, and has
//! been for longer than its threshold, goes, in Nomad's order. `PUT /v1/system/gc` runs every
//! collector with every threshold at "now" (Nomad's forced GC); the leader runs them every
//! `job_gc_interval` with the configured thresholds (`leader/core_gc.rs`).
//!
//! - **Jobs**: a stopped job, or a batch job that is dead, whose evals and allocs are all
//!   finished, is purged with them (a periodic or parameterized parent only when stopped), once
//!   nothing about it changed for `job_gc_threshold`.
//! - **Evals**: a finished eval whose allocs are all finished goes with those allocs, unless its
//!   job is a batch job still registered and not stopped (its finished allocs are what keep the
//!   scheduler from running them again); after `eval_gc_threshold` (`batch_eval_gc_threshold`
//!   for a batch job's).
//! - **Deployments**: a finished deployment (failed, successful or cancelled) none of whose
//!   allocs is still live goes after `deployment_gc_threshold`.
//! - **Nodes**: a down node with no alloc left that is not finished is removed after
//!   `node_gc_threshold`.
//!
//! Allocs leave only with their eval, so the clients see them vanish from their alloc lists
//! and destroy what they still keep, as Nomad's clients do.
//!
//! Nomad measures age with its time table (Raft index → time); nomad-rs reads the times the
//! objects carry: an eval's and an alloc's modify time, a job's submit time, a node's last
//! status change, and for a deployment the newest modify time of its allocs (or the submit time
//! of the job version it rolled out, when it placed none).

use std::time::Duration;

use nomad_proto::{Evaluation, JobStatus, JobType, NodeStatus, Timestamp};

use super::{EndpointError, Endpoints};
use crate::consensus::Consensus;
use crate::fsm::Command;
use crate::state::{State, StateStore, job_status};

/// The GC thresholds and how often the leader runs it (`server { job_gc_interval,
/// job_gc_threshold, eval_gc_threshold, batch_eval_gc_threshold, deployment_gc_threshold,
/// node_gc_threshold }`, with Nomad's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct GcConfig {
    /// How often the leader collects (Nomad: 5m).
    pub interval: Duration,
    /// Jobs (Nomad: 4h).
    pub job_threshold: Duration,
    /// Evals of service and system jobs (Nomad: 1h).
    pub eval_threshold: Duration,
    /// Evals of batch jobs (Nomad: 24h).
    pub batch_eval_threshold: Duration,
    /// Deployments (Nomad: 1h).
    pub deployment_threshold: Duration,
    /// Down nodes (Nomad: 24h).
    pub node_threshold: Duration,
}

impl Default for GcConfig {
    fn default() -> Self {
        let hours = |h: u64| Duration::from_secs(h * 3600);
        GcConfig {
            interval: Duration::from_secs(300),
            job_threshold: hours(4),
            eval_threshold: hours(1),
            batch_eval_threshold: hours(24),
            deployment_threshold: hours(1),
            node_threshold: hours(24),
        }
    }
}

/// What may go: objects whose last change was at or before these times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GcCutoffs {
    /// Jobs.
    pub job: i64,
    /// Evals of service and system jobs.
    pub eval: i64,
    /// Evals of batch jobs.
    pub batch_eval: i64,
    /// Deployments.
    pub deployment: i64,
    /// Down nodes (unix nanoseconds, compared with the node's last status change).
    pub node: i64,
}

impl GcCutoffs {
    /// Everything finished, whatever its age (the forced GC).
    pub fn all(now: Timestamp) -> GcCutoffs {
        let n = now.unix_nanos();
        GcCutoffs { job: n, eval: n, batch_eval: n, deployment: n, node: n }
    }

    /// What is older than the thresholds of `config` at `now`.
    pub fn at(now: Timestamp, config: &GcConfig) -> GcCutoffs {
        let before = |d: Duration| now.unix_nanos().saturating_sub(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        GcCutoffs {
            job: before(config.job_threshold),
            eval: before(config.eval_threshold),
            batch_eval: before(config.batch_eval_threshold),
            deployment: before(config.deployment_threshold),
            node: before(config.node_threshold),
        }
    }
}

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
    /// `System.ReconcileJobSummaries`: every job's summary recomputed from its allocs.
    pub async fn reconcile_summaries(&self) -> Result<u64, EndpointError> {
        Ok(self.consensus.apply(Command::ReconcileJobSummaries).await?)
    }

    /// Runs every collector now, whatever the age of what is finished.
    pub async fn force_gc(&self) -> Result<GcReport, EndpointError> {
        collect_garbage(&self.store, self.consensus.as_ref(), GcCutoffs::all(self.now())).await
    }
}

/// Runs every collector with `cutoffs`, writing through `consensus`.
pub async fn collect_garbage(store: &StateStore, consensus: &dyn Consensus, cutoffs: GcCutoffs) -> Result<GcReport, EndpointError> {
    let mut report = GcReport::default();
    let now = Timestamp::now();
    // Jobs first: what a purged job leaves is deleted with it.
    let snap = store.snapshot();
    for (ns, id, evals, allocs) in collectable_jobs(&snap, cutoffs.job) {
        consensus.apply(Command::JobDeregister { namespace: ns.clone(), job_id: id.clone(), purge: true, eval: None, now }).await?;
        report.evals += evals.len();
        report.allocs += allocs.len();
        delete(consensus, evals, allocs).await?;
        report.jobs.push(format!("{ns}/{id}"));
    }
    let snap = store.snapshot();
    let (evals, allocs) = collectable_evals(&snap, &cutoffs);
    report.evals += evals.len();
    report.allocs += allocs.len();
    delete(consensus, evals, allocs).await?;
    let snap = store.snapshot();
    let deployments: Vec<String> = snap
        .deployments()
        .filter(|d| !d.active() && snap.allocs_by_deployment(d).all(|a| a.terminal()))
        .filter(|d| {
            let placed = snap.allocs_by_deployment(d).map(|a| a.modify_time).max();
            let last =
                placed.unwrap_or_else(|| snap.job_version(&d.namespace, &d.job_id, d.job_version).map_or(i64::MIN, |j| j.submit_time));
            last <= cutoffs.deployment
        })
        .map(|d| d.id.clone())
        .collect();
    for ids in deployments.chunks(MAX_IDS_PER_ENTRY) {
        consensus.apply(Command::DeploymentDelete { deployment_ids: ids.to_vec() }).await?;
        report.deployments += ids.len();
    }
    let snap = store.snapshot();
    let node_cutoff_secs = cutoffs.node.div_euclid(1_000_000_000);
    let nodes: Vec<String> = snap
        .nodes()
        .filter(|n| {
            n.status == NodeStatus::Down && n.status_updated_at <= node_cutoff_secs && snap.allocs_by_node(&n.id).all(|a| a.terminal())
        })
        .map(|n| n.id.clone())
        .collect();
    if !nodes.is_empty() {
        consensus.apply(Command::NodeDeregister { node_ids: nodes.clone(), evals: Vec::new() }).await?;
        report.nodes = nodes;
    }
    Ok(report)
}

async fn delete(consensus: &dyn Consensus, mut evals: Vec<String>, mut allocs: Vec<String>) -> Result<(), EndpointError> {
    while !evals.is_empty() || !allocs.is_empty() {
        let eval_ids: Vec<String> = evals.drain(..evals.len().min(MAX_IDS_PER_ENTRY)).collect();
        let alloc_ids: Vec<String> = allocs.drain(..allocs.len().min(MAX_IDS_PER_ENTRY)).collect();
        consensus.apply(Command::EvalDelete { eval_ids, alloc_ids }).await?;
    }
    Ok(())
}

/// Jobs to purge, each with its evals and allocs.
fn collectable_jobs(state: &State, cutoff: i64) -> Vec<(String, String, Vec<String>, Vec<String>)> {
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
        let last = evals.iter().map(|e| e.modify_time).chain(allocs.iter().map(|a| a.modify_time)).fold(job.submit_time, i64::max);
        if evals.iter().all(|e| e.status.is_terminal()) && allocs.iter().all(|a| a.terminal()) && last <= cutoff {
            let eval_ids = evals.iter().map(|e| e.id.clone()).collect();
            let alloc_ids = allocs.iter().map(|a| a.id.clone()).collect();
            out.push((job.namespace.clone(), job.id.clone(), eval_ids, alloc_ids));
        }
    }
    out
}

/// Finished evals whose allocs are all finished, and those allocs, all past their cutoff.
fn collectable_evals(state: &State, cutoffs: &GcCutoffs) -> (Vec<String>, Vec<String>) {
    let (mut evals, mut allocs) = (Vec::new(), Vec::new());
    for eval in state.evals().filter(|e| e.status.is_terminal()) {
        let live_batch = state.job(&eval.namespace, &eval.job_id).is_some_and(|j| {
            matches!(j.job_type, JobType::Batch | JobType::Sysbatch) && !j.stop && job_status(state, j) != JobStatus::Dead
        });
        if live_batch {
            continue;
        }
        let cutoff = if matches!(eval.eval_type, JobType::Batch | JobType::Sysbatch) { cutoffs.batch_eval } else { cutoffs.eval };
        let mine: Vec<_> = state.allocs_by_job(&eval.namespace, &eval.job_id).filter(|a| a.eval_id == eval.id).collect();
        let last = mine.iter().map(|a| a.modify_time).fold(eval.modify_time, i64::max);
        if mine.iter().all(|a| a.terminal()) && last <= cutoff {
            evals.push(eval.id.clone());
            allocs.extend(mine.iter().map(|a| a.id.clone()));
        }
    }
    (evals, allocs)
}

#[cfg(test)]
#[path = "gc_tests.rs"]
mod tests;
