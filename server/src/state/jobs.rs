//! The jobs and job summary tables.

use std::sync::Arc;

use nomad_proto::{Job, JobStatus, JobSummary, JobType, NamespacedId, TaskGroupSummary};

use super::{State, Table, Txn, TxnError, Watch};

impl State {
    /// One job.
    pub fn job(&self, namespace: &str, id: &str) -> Option<&Arc<Job>> {
        self.jobs.get(&NamespacedId::new(namespace, id))
    }

    /// Every job, ordered by namespace then ID.
    pub fn jobs(&self) -> impl Iterator<Item = &Arc<Job>> {
        self.jobs.values()
    }

    /// Jobs in `namespace` (`None`: all namespaces) whose ID starts with `prefix`.
    pub fn jobs_by_prefix<'a>(&'a self, namespace: Option<&'a str>, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Job>> + 'a {
        self.jobs.values().filter(move |j| namespace.is_none_or(|ns| j.namespace == ns) && j.id.starts_with(prefix))
    }

    /// Jobs of one scheduler type.
    pub fn jobs_by_type(&self, t: JobType) -> impl Iterator<Item = &Arc<Job>> {
        self.jobs.values().filter(move |j| j.job_type == t)
    }

    /// A job's summary.
    pub fn job_summary(&self, namespace: &str, id: &str) -> Option<&Arc<JobSummary>> {
        self.job_summaries.get(&NamespacedId::new(namespace, id))
    }
}

/// A job's status from its allocs and evals (Nomad's `getJobStatus`).
pub fn job_status(state: &State, job: &Job) -> JobStatus {
    if job.job_type == JobType::System || job.is_periodic_or_parameterized() {
        return if job.stop { JobStatus::Dead } else { JobStatus::Running };
    }
    let key = job.namespaced_id();
    let mut has_alloc = false;
    for a in state.allocs_of_job_key(&key) {
        has_alloc = true;
        if !a.terminal() {
            return JobStatus::Running;
        }
    }
    let mut has_eval = false;
    for e in state.evals_of_job_key(&key) {
        if !e.status.is_terminal() {
            return JobStatus::Pending;
        }
        has_eval = true;
    }
    if has_eval || has_alloc { JobStatus::Dead } else { JobStatus::Pending }
}

impl Txn<'_> {
    /// Inserts or updates a job. The version and `JobModifyIndex` move only
    /// when the spec changed; the summary gains the job's groups.
    pub fn upsert_job(&mut self, mut job: Job) -> Result<Arc<Job>, TxnError> {
        let index = self.index;
        let key = job.namespaced_id();
        if self.state.namespace(&job.namespace).is_none() {
            return Err(TxnError(format!("job {:?} is in nonexistent namespace {:?}", job.id, job.namespace)));
        }
        // Before the spec comparison: an unchanged policy keeps its ID and indexes.
        let old = self.state.jobs.get(&key).cloned();
        self.assign_scaling_policies(&mut job, old.as_deref());
        match self.state.jobs.get(&key) {
            Some(existing) => {
                job.create_index = existing.create_index;
                if existing.spec_changed(&job) {
                    // A new version is stable only if submitted so (a revert copies the flag).
                    job.version = existing.version + 1;
                    job.job_modify_index = index;
                } else {
                    job.version = existing.version;
                    job.job_modify_index = existing.job_modify_index;
                    job.submit_time = existing.submit_time;
                    job.stable = existing.stable;
                }
            }
            None => {
                job.create_index = index;
                job.job_modify_index = index;
                job.version = 0;
            }
        }
        job.modify_index = index;
        job.status = job_status(self.state, &job);
        job.status_description.clear();
        let job = Arc::new(job);
        self.state.jobs.insert(key.clone(), job.clone());
        self.touch(Table::Jobs);
        self.touch_key(Watch::Job(Watch::job_key(&key.namespace, &key.id)));
        self.record(super::Change::Job(job.clone()));
        self.record_job_version(&job);
        self.ensure_summary(&job);
        Ok(job)
    }

    fn ensure_summary(&mut self, job: &Job) {
        let key = job.namespaced_id();
        let mut summary = self.state.job_summaries.get(&key).map(|s| (**s).clone()).unwrap_or_else(|| JobSummary {
            job_id: job.id.clone(),
            namespace: job.namespace.clone(),
            create_index: self.index,
            ..JobSummary::default()
        });
        let mut changed = summary.create_index == self.index;
        for g in &job.task_groups {
            if !summary.summary.contains_key(&g.name) {
                summary.summary.insert(g.name.clone(), TaskGroupSummary::default());
                changed = true;
            }
        }
        if changed {
            summary.modify_index = self.index;
            self.touch_key(Watch::JobSummary(Watch::job_key(&key.namespace, &key.id)));
            self.state.job_summaries.insert(key, Arc::new(summary));
            self.touch(Table::JobSummary);
        }
    }

    /// Recomputes every job's summary from its allocs (Nomad's `ReconcileJobSummaries`): each
    /// group counts the allocs of this instance of the job (same create index) by client
    /// status. Queued counts are kept: they come from the scheduler, not from allocs. Only
    /// summaries that differ are written.
    pub fn reconcile_job_summaries(&mut self) {
        let jobs: Vec<Arc<Job>> = self.state.jobs.values().cloned().collect();
        for job in jobs {
            let key = job.namespaced_id();
            let old = self.state.job_summaries.get(&key).cloned();
            let mut summary = JobSummary {
                job_id: job.id.clone(),
                namespace: job.namespace.clone(),
                create_index: job.create_index,
                children: old.as_ref().map(|o| o.children.clone()).unwrap_or_default(),
                ..JobSummary::default()
            };
            for g in &job.task_groups {
                let queued = old.as_ref().and_then(|o| o.summary.get(&g.name)).map_or(0, |s| s.queued);
                summary.summary.insert(g.name.clone(), TaskGroupSummary { queued, ..TaskGroupSummary::default() });
            }
            for a in self.state.allocs_of_job_key(&key) {
                if a.job.as_ref().is_some_and(|j| j.create_index != job.create_index) {
                    continue;
                }
                if let Some(s) = summary.summary.get_mut(&a.task_group) {
                    *s.counter(a.client_status) += 1;
                }
            }
            let same = old.as_ref().is_some_and(|o| o.summary == summary.summary && o.children == summary.children);
            if !same {
                summary.modify_index = self.index;
                self.state.job_summaries.insert(key.clone(), Arc::new(summary));
                self.touch(Table::JobSummary);
                self.touch_key(Watch::JobSummary(Watch::job_key(&key.namespace, &key.id)));
            }
        }
    }

    /// Applies `f` to a job's summary (no-op when the job has none).
    pub(crate) fn update_summary(&mut self, key: &NamespacedId, f: impl FnOnce(&mut JobSummary)) {
        if let Some(s) = self.state.job_summaries.get(key) {
            let mut s = (**s).clone();
            f(&mut s);
            s.modify_index = self.index;
            self.state.job_summaries.insert(key.clone(), Arc::new(s));
            self.touch(Table::JobSummary);
            self.touch_key(Watch::JobSummary(Watch::job_key(&key.namespace, &key.id)));
        }
    }

    /// Removes a job and its summary (purge). Its allocs and evals stay until GC.
    pub fn delete_job(&mut self, namespace: &str, id: &str) -> Result<(), TxnError> {
        let key = NamespacedId::new(namespace, id);
        let Some(job) = self.state.jobs.remove(&key) else {
            return Err(TxnError(format!("job not found: {id}")));
        };
        self.delete_job_scaling(&job);
        self.state.job_summaries.remove(&key);
        self.delete_job_history(&key);
        self.touch(Table::Jobs);
        self.touch(Table::JobSummary);
        self.touch_key(Watch::Job(Watch::job_key(namespace, id)));
        self.touch_key(Watch::JobSummary(Watch::job_key(namespace, id)));
        Ok(())
    }

    /// Recomputes a job's status after its allocs or evals changed.
    pub fn refresh_job_status(&mut self, key: &NamespacedId) {
        let Some(job) = self.state.jobs.get(key) else { return };
        let status = job_status(self.state, job);
        if status != job.status {
            let mut j = (**job).clone();
            j.status = status;
            j.modify_index = self.index;
            let j = Arc::new(j);
            self.state.jobs.insert(key.clone(), j.clone());
            self.touch(Table::Jobs);
            self.touch_key(Watch::Job(Watch::job_key(&key.namespace, &key.id)));
            // The version entry follows, so the two keep sharing one copy of the job.
            self.record_job_version(&j);
            self.record(super::Change::Job(j));
        }
    }
}
