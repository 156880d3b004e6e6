//! Follow-up evals with `WaitUntil`: delayed reschedules, lost allocs with
//! `stop_after_client_disconnect`, and `max_client_disconnect` timeouts.
//! Allocs due within 5 s of a batch's first time share its eval.

use std::collections::BTreeMap;

use nomad_proto::alloc::ALLOC_UNKNOWN_DESC;
use nomad_proto::eval::trigger;
use nomad_proto::{ClientStatus, EvalStatus, Evaluation, Job, Timestamp};

use super::Run;
use crate::scheduler::alloc_sets::{self, AllocSet, DelayedReschedule};
use crate::scheduler::{DISCONNECT_TIMEOUT_FOLLOWUP_DESC, RESCHEDULING_FOLLOWUP_DESC};

/// Allocs due within this window of a batch's first share its eval.
pub(crate) const BATCHED_FAILED_ALLOC_WINDOW_NS: i64 = 5_000_000_000;

impl<'a> Run<'a, '_, '_> {
    fn followup_eval(&self, job: &Job, triggered_by: &str, description: &str, wait_until: Timestamp) -> Evaluation {
        let now = self.inputs.now.unix_nanos();
        Evaluation {
            id: self.inputs.ids.next_id(),
            namespace: job.namespace.clone(),
            priority: self.inputs.eval_priority,
            eval_type: job.job_type,
            triggered_by: triggered_by.to_string(),
            job_id: job.id.clone(),
            job_modify_index: job.modify_index,
            status: EvalStatus::Pending,
            status_description: description.to_string(),
            wait_until,
            create_time: now,
            modify_time: now,
            ..Evaluation::default()
        }
    }

    /// Batches `delayed` by time into evals; returns alloc ID → eval ID.
    fn batch_evals(
        &mut self,
        job: &Job,
        delayed: &[DelayedReschedule<'a>],
        triggered_by: &str,
        description: &str,
    ) -> Vec<(DelayedReschedule<'a>, String)> {
        let mut sorted = delayed.to_vec();
        sorted.sort_by_key(|d| d.at);
        let mut out = Vec::with_capacity(sorted.len());
        let mut current: Option<(Timestamp, String)> = None;
        for d in sorted {
            let id = match &current {
                Some((start, id)) if d.at.unix_nanos() - start.unix_nanos() < BATCHED_FAILED_ALLOC_WINDOW_NS => id.clone(),
                _ => {
                    let eval = self.followup_eval(job, triggered_by, description, d.at);
                    let id = eval.id.clone();
                    self.results.followup_evals.push(eval);
                    current = Some((d.at, id.clone()));
                    id
                }
            };
            out.push((d, id));
        }
        out
    }

    /// Evals for allocs to replace later (failed with a delay, lost with
    /// `stop_after_client_disconnect`); returns alloc ID → eval ID.
    pub(super) fn create_delayed_evals(&mut self, job: &Job, delayed: &[DelayedReschedule<'a>]) -> BTreeMap<String, String> {
        self.batch_evals(job, delayed, trigger::RETRY_FAILED_ALLOC, RESCHEDULING_FOLLOWUP_DESC)
            .into_iter()
            .map(|(d, id)| (d.alloc.id.clone(), id))
            .collect()
    }

    /// Failed allocs to reschedule later get the follow-up eval's ID written on them.
    pub(super) fn create_reschedule_later_evals(&mut self, job: &Job, later: &[DelayedReschedule<'a>], all: &AllocSet<'a>) {
        for (alloc_id, eval_id) in self.create_delayed_evals(job, later) {
            if let Some(&a) = all.get(alloc_id.as_str()) {
                let mut updated = a.clone();
                updated.followup_eval_id = eval_id;
                self.results.attribute_updates.insert(alloc_id, updated);
            }
        }
    }

    /// Marks disconnecting allocs `unknown` and creates the
    /// `max-disconnect-timeout` evals that will find them expired.
    pub(super) fn create_timeout_later_evals(&mut self, job: &Job, disconnecting: &AllocSet<'a>) -> BTreeMap<String, String> {
        if disconnecting.is_empty() {
            return BTreeMap::new();
        }
        let delays = alloc_sets::delay_by_max_client_disconnect(disconnecting, self.inputs.now);
        // As Nomad: an alloc without a timeout window (0) spoils the whole batch.
        if delays.len() != disconnecting.len() {
            return BTreeMap::new();
        }
        let mut ids = BTreeMap::new();
        for (d, eval_id) in self.batch_evals(job, &delays, trigger::MAX_DISCONNECT_TIMEOUT, DISCONNECT_TIMEOUT_FOLLOWUP_DESC) {
            let mut updated = d.alloc.clone();
            updated.client_status = ClientStatus::Unknown;
            updated.append_state(ClientStatus::Unknown, self.inputs.now);
            updated.client_description = ALLOC_UNKNOWN_DESC.to_string();
            updated.followup_eval_id = eval_id.clone();
            ids.insert(updated.id.clone(), eval_id);
            self.results.disconnect_updates.insert(updated.id.clone(), updated);
        }
        ids
    }
}
