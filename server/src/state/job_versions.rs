//! The job versions and periodic launches tables.
//!
//! Every write of a job records it as a version, newest first; a job keeps
//! [`JOB_TRACKED_VERSIONS`] of them, and the newest stable one is kept even when it would drop
//! out, so a deployment can always revert to it. Nomad does the same (`upsertJobVersion`).

use std::sync::Arc;

use nomad_proto::{Job, NamespacedId};
use serde::{Deserialize, Serialize};

use super::{State, Table, Txn, TxnError, Watch};

/// How many versions of a job are kept (Nomad's `JobTrackedVersions`, a constant there too).
pub const JOB_TRACKED_VERSIONS: usize = 6;

/// A periodic job's last launch, in Nomad's `PeriodicLaunch` shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PeriodicLaunch {
    /// The periodic job.
    #[serde(rename = "ID")]
    pub id: String,
    /// Its namespace.
    pub namespace: String,
    /// The last launch (Unix nanoseconds); the job's registration time before the first.
    pub launch: i64,
    /// Raft index of the first record.
    pub create_index: u64,
    /// Raft index of the last.
    pub modify_index: u64,
}

impl State {
    /// A job's tracked versions, newest first (empty for an unknown job).
    pub fn job_versions(&self, namespace: &str, id: &str) -> &[Arc<Job>] {
        self.job_versions.get(&NamespacedId::new(namespace, id)).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// One tracked version of a job.
    pub fn job_version(&self, namespace: &str, id: &str, version: u64) -> Option<&Arc<Job>> {
        self.job_versions(namespace, id).iter().find(|j| j.version == version)
    }

    /// A periodic job's last launch.
    pub fn periodic_launch(&self, namespace: &str, id: &str) -> Option<&Arc<PeriodicLaunch>> {
        self.periodic_launches.get(&NamespacedId::new(namespace, id))
    }
}

impl Txn<'_> {
    /// Records `job` as its version: replaces an entry of the same version, or adds it first and
    /// drops the oldest beyond [`JOB_TRACKED_VERSIONS`] (keeping the newest stable one).
    pub(super) fn record_job_version(&mut self, job: &Arc<Job>) {
        let key = job.namespaced_id();
        let mut versions: Vec<Arc<Job>> = self.state.job_versions.get(&key).map(|v| (**v).clone()).unwrap_or_default();
        match versions.iter().position(|v| v.version == job.version) {
            Some(i) => versions[i] = job.clone(),
            None => {
                versions.insert(0, job.clone());
                versions.sort_by_key(|v| std::cmp::Reverse(v.version));
            }
        }
        if versions.len() > JOB_TRACKED_VERSIONS {
            let keep = JOB_TRACKED_VERSIONS;
            // The newest stable version sitting just past the kept set trades places with the
            // oldest kept one, which then goes instead.
            if versions.iter().position(|v| v.stable) == Some(keep) {
                versions.swap(keep - 1, keep);
            }
            versions.truncate(keep);
        }
        self.state.job_versions.insert(key, Arc::new(versions));
        self.touch(Table::JobVersions);
    }

    /// Removes a purged job's versions and launch record.
    pub(super) fn delete_job_history(&mut self, key: &NamespacedId) {
        if self.state.job_versions.remove(key).is_some() {
            self.touch(Table::JobVersions);
        }
        if self.state.periodic_launches.remove(key).is_some() {
            self.touch(Table::PeriodicLaunches);
        }
    }

    /// Marks one version of a job stable or not (Nomad's `UpdateJobStability`): the version
    /// entry, and the current job when it is that version. A version no longer tracked is
    /// not an error (it may have been pruned since the request was checked).
    pub fn set_job_stability(&mut self, namespace: &str, id: &str, version: u64, stable: bool) -> Result<(), TxnError> {
        let key = NamespacedId::new(namespace, id);
        let Some(old) = self.state.job_version(namespace, id, version).cloned() else { return Ok(()) };
        if old.stable == stable {
            return Ok(());
        }
        let current = self.state.jobs.get(&key).cloned();
        let mut updated = (*old).clone();
        updated.stable = stable;
        updated.modify_index = self.index;
        let updated = Arc::new(updated);
        if let Some(cur) = current.filter(|c| c.version == version) {
            let mut j = (*cur).clone();
            j.stable = stable;
            j.modify_index = self.index;
            let j = Arc::new(j);
            self.state.jobs.insert(key.clone(), j.clone());
            self.touch(Table::Jobs);
            self.touch_key(Watch::Job(Watch::job_key(namespace, id)));
            self.record(super::Change::Job(j.clone()));
            self.record_job_version(&j);
        } else {
            self.record_job_version(&updated);
        }
        Ok(())
    }

    /// Records a periodic job's launch (or, with its registration time, that it is tracked).
    pub fn record_periodic_launch(&mut self, namespace: &str, id: &str, launch: i64) {
        let key = NamespacedId::new(namespace, id);
        let create_index = self.state.periodic_launches.get(&key).map_or(self.index, |l| l.create_index);
        let record =
            PeriodicLaunch { id: id.to_string(), namespace: namespace.to_string(), launch, create_index, modify_index: self.index };
        self.state.periodic_launches.insert(key, Arc::new(record));
        self.touch(Table::PeriodicLaunches);
    }
}
