//! Allocs whose node came back after a disconnect: keep the original or its
//! replacement, never both (reference §3 `reconcileReconnecting`).

use nomad_proto::alloc::{ALLOC_NOT_NEEDED_DESC, ALLOC_RECONNECTED_DESC, ALLOC_RESCHEDULED_DESC};
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Job};

use super::{Run, StopRequest};
use crate::scheduler::alloc_sets::AllocSet;

/// (version, create index) of the job an alloc runs, the current job when unknown.
fn job_key(a: &Allocation, current: &Job) -> (u64, u64) {
    let j = a.job.as_deref().unwrap_or(current);
    (j.version, j.create_index)
}

fn runs_older_job(a: &Allocation, current: &Job) -> bool {
    let (v, c) = job_key(a, current);
    v < current.version || c < current.create_index
}

fn wants_transition(a: &Allocation) -> bool {
    let t = &a.desired_transition;
    t.should_migrate() || t.should_reschedule() || t.should_force_reschedule()
}

/// Which of an original and one of its replacements to keep. Not symmetric:
/// the original wins ties.
pub(crate) fn pick_reconnecting<'a>(original: &'a Allocation, replacement: &'a Allocation, current: &Job) -> &'a Allocation {
    let (ov, oc) = job_key(original, current);
    let (rv, rc) = job_key(replacement, current);
    if rv > ov || rc > oc {
        return replacement;
    }
    let score = |a: &Allocation| a.metrics.as_ref().and_then(|m| m.max_norm_score());
    let better = match (score(original), score(replacement)) {
        (None, Some(_)) => true,
        (Some(o), Some(r)) => r > o,
        _ => false,
    };
    let keeps_running = replacement.client_status == ClientStatus::Running || original.client_status != ClientStatus::Running;
    if better && keeps_running { replacement } else { original }
}

impl<'a> Run<'a, '_, '_> {
    fn stop_with(&mut self, stop: &mut AllocSet<'a>, a: &'a Allocation, client_status: Option<ClientStatus>, description: &'static str) {
        stop.insert(a.id.as_str(), a);
        self.results.stop.push(StopRequest { alloc: a, client_status, description, followup_eval_id: String::new() });
    }

    /// Splits reconnecting allocs into (reconnect, stop); `stop` may also hold
    /// replacements that lost to their original.
    pub(super) fn reconcile_reconnecting(
        &mut self,
        job: &Job,
        reconnecting: &AllocSet<'a>,
        all: &AllocSet<'a>,
    ) -> (AllocSet<'a>, AllocSet<'a>) {
        let mut stop = AllocSet::new();
        for &r in reconnecting.values() {
            if !r.server_terminal() && r.client_status == ClientStatus::Failed {
                self.stop_with(&mut stop, r, Some(ClientStatus::Failed), ALLOC_RESCHEDULED_DESC);
                continue;
            }
            if r.desired_status != DesiredStatus::Run || wants_transition(r) || runs_older_job(r, job) {
                self.stop_with(&mut stop, r, None, ALLOC_NOT_NEEDED_DESC);
                continue;
            }
            for &x in all.values() {
                let is_replacement = x.id != r.id && x.name == r.name && x.create_index > r.create_index;
                if !is_replacement || x.server_terminal() {
                    continue;
                }
                if std::ptr::eq(pick_reconnecting(r, x, job), x) {
                    if !stop.contains_key(r.id.as_str()) {
                        self.stop_with(&mut stop, r, None, ALLOC_NOT_NEEDED_DESC);
                    }
                } else {
                    self.stop_with(&mut stop, x, None, ALLOC_RECONNECTED_DESC);
                }
            }
        }
        let reconnect = reconnecting.iter().filter(|(id, _)| !stop.contains_key(**id)).map(|(k, v)| (*k, *v)).collect();
        (reconnect, stop)
    }

    /// Records the reconnect: a `running` AllocState after the `unknown` one,
    /// so later evals skip the reconnect logic.
    pub(super) fn compute_reconnecting(&mut self, job: &Job, reconnect: &AllocSet<'a>) {
        for &a in reconnect.values() {
            if wants_transition(a)
                || runs_older_job(a, job)
                || a.desired_status != DesiredStatus::Run
                || a.client_status != ClientStatus::Running
            {
                continue;
            }
            let mut updated = a.clone();
            updated.append_state(a.client_status, self.inputs.now);
            self.results.reconnect_updates.insert(updated.id.clone(), updated);
        }
    }
}
