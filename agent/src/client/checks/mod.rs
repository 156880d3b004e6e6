//! Nomad service checks (`provider = "nomad"`): the client runs them itself, as Nomad's
//! `checks_hook` and `serviceregistration/checks` do. Results never reach the servers.
//!
//! - [`NomadCheck`]: one check to run, from the alloc's job ([`alloc_checks`]: group and task
//!   services with provider nomad), identified by Nomad's MD5 check ID
//!   (`ServiceCheck::nomad_check_id`), so an alloc update diffs by ID and a restarted agent finds
//!   its results again.
//! - [`probe`]: one run of a check. TCP: a dial (`success` "nomad: tcp ok"). HTTP (hyper, http or
//!   https against the host's roots): 200 is `success` "nomad: http ok", another code below 400
//!   `success` and from 400 `failure`, both with the first 3 KiB of the body as output; the code
//!   is always recorded; errors are `failure` "nomad: <error>". The address is resolved at each
//!   run as the services hook resolves it (`address_mode` host, alloc or auto, the port by label
//!   from the alloc's ports).
//! - [`store::CheckStore`]: the results, in memory, persisted to the client's local state only
//!   when a check's status changes, restored at agent start; `pending` never overwrites a result.
//!   [`CheckResults`] is all its readers (the HTTP route, deployment health, check_restart) see.
//! - [`runner::AllocChecks`]: one observer per check of an alloc: the first run at interval/2,
//!   then one per interval; started from the `checks` alloc hook's prerun, diffed on updates,
//!   stopped (and the results purged) at prekill.

pub mod probe;
pub mod runner;
pub mod store;

use std::collections::BTreeMap;

use nomad_proto::Allocation;
use nomad_proto::service::SERVICE_PROVIDER_NOMAD;
use nomad_proto::service::ServiceCheck;
use serde::{Deserialize, Serialize};

pub use store::CheckStore;

/// The status of one check run (Nomad's `CheckStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// It passed.
    Success,
    /// It failed.
    Failure,
    /// It has not run yet.
    Pending,
}

impl CheckStatus {
    /// Nomad's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Success => "success",
            CheckStatus::Failure => "failure",
            CheckStatus::Pending => "pending",
        }
    }
}

/// Nomad's `CheckQueryResult`, in the shape `/v1/allocation/<id>/checks` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CheckQueryResult {
    /// The check ID.
    #[serde(rename = "ID")]
    pub id: String,
    /// `healthiness`, or `readiness` for `on_update = "ignore"`.
    pub mode: String,
    /// The outcome.
    pub status: CheckStatus,
    /// The HTTP status code (left out when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub status_code: u16,
    /// What the run said.
    pub output: String,
    /// When it ran, Unix seconds.
    pub timestamp: i64,
    /// The alloc's name (Nomad's choice for this field).
    pub group: String,
    /// The service's task (left out for a group service).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task: String,
    /// The service's name.
    pub service: String,
    /// The check's name.
    pub check: String,
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

/// The results of one alloc's checks, by check ID.
pub type AllocResults = BTreeMap<String, CheckQueryResult>;

/// What the readers of check results see.
pub trait CheckResults: Send + Sync {
    /// The results of an alloc's checks; `None` when it has none.
    fn alloc_results(&self, alloc_id: &str) -> Option<AllocResults>;
}

/// One Nomad check to run, with what its runs need from its service.
#[derive(Debug, Clone, PartialEq)]
pub struct NomadCheck {
    /// Nomad's check ID.
    pub id: String,
    /// The check as the job has it.
    pub check: ServiceCheck,
    /// The service's name.
    pub service: String,
    /// The service's task (empty for a group service without one).
    pub task: String,
    /// The service's `address`.
    pub custom_address: String,
    /// The service's port label (the check's default).
    pub service_port_label: String,
    /// The alloc's name.
    pub group: String,
}

impl NomadCheck {
    /// The result before any run (Nomad's `checks.Stub`).
    pub fn stub(&self, now: i64) -> CheckQueryResult {
        self.result(CheckStatus::Pending, 0, "nomad: waiting to run".into(), now)
    }

    /// A result of this check.
    pub fn result(&self, status: CheckStatus, status_code: u16, output: String, now: i64) -> CheckQueryResult {
        CheckQueryResult {
            id: self.id.clone(),
            mode: self.check.nomad_check_mode().to_string(),
            status,
            status_code,
            output,
            timestamp: now,
            group: self.group.clone(),
            task: self.task.clone(),
            service: self.service.clone(),
            check: self.check.name.clone(),
        }
    }
}

/// The Nomad checks of an alloc: every check of its group's and tasks' services with provider
/// nomad, by ID. A task service's checks belong to its task (as Nomad's servers set it).
pub fn alloc_checks(alloc: &Allocation) -> BTreeMap<String, NomadCheck> {
    let mut out = BTreeMap::new();
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return out };
    let group_services = group.services.iter().map(|s| (s, s.task_name.as_str()));
    let task_services = group.tasks.iter().flat_map(|t| t.services.iter().map(|s| (s, t.name.as_str())));
    for (s, task) in group_services.chain(task_services) {
        if s.provider != SERVICE_PROVIDER_NOMAD {
            continue;
        }
        for c in &s.checks {
            let id = c.nomad_check_id(&alloc.id, &alloc.task_group);
            let check = NomadCheck {
                id: id.clone(),
                check: c.clone(),
                service: s.name.clone(),
                task: task.to_string(),
                custom_address: s.address.clone(),
                service_port_label: s.port_label.clone(),
                group: alloc.name.clone(),
            };
            out.insert(id, check);
        }
    }
    out
}

/// Whether the alloc's group has any Consul service check (then Nomad checks do not count for
/// its health, as in Nomad's tracker).
pub fn has_consul_checks(alloc: &Allocation) -> bool {
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return false };
    group
        .services
        .iter()
        .chain(group.tasks.iter().flat_map(|t| t.services.iter()))
        .any(|s| s.provider != SERVICE_PROVIDER_NOMAD && !s.checks.is_empty())
}

/// Nomad's `evaluateNomadChecks` over an alloc's results: every expected check has a result,
/// and each is `success`, or `failure` of a readiness check; `pending` never passes.
pub fn nomad_checks_pass(expected: &BTreeMap<String, NomadCheck>, results: Option<&AllocResults>) -> bool {
    expected.keys().all(|id| match results.and_then(|r| r.get(id)) {
        None => false,
        Some(r) => match r.status {
            CheckStatus::Success => true,
            CheckStatus::Failure => r.mode == "readiness",
            CheckStatus::Pending => false,
        },
    })
}

/// The Nomad checks with a `check_restart` limit that restart runs of `task`: the checks of
/// its own services (group services cannot restart a task: admission refuses that).
pub fn task_restart_checks(alloc: &Allocation, task: &str) -> Vec<crate::client::consul::services::TaskCheck> {
    let ns = |v: i64| std::time::Duration::from_nanos(v.max(0) as u64);
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return Vec::new() };
    let Some(t) = group.lookup_task(task) else { return Vec::new() };
    t.services
        .iter()
        .filter(|s| s.provider == SERVICE_PROVIDER_NOMAD)
        .flat_map(|s| s.checks.iter())
        .filter_map(|c| {
            let restart = c.check_restart.clone().filter(|r| r.limit > 0)?;
            Some(crate::client::consul::services::TaskCheck {
                check_id: c.nomad_check_id(&alloc.id, &alloc.task_group),
                name: c.name.clone(),
                script: None,
                interval: ns(c.interval),
                timeout: ns(c.timeout),
                restart: Some(restart),
            })
        })
        .collect()
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
