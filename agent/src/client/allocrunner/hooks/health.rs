//! `health`: for an alloc in a deployment, or a service alloc being judged for migrations
//! (`migrate` settings), decides from its task states whether it is healthy and reports it as
//! the alloc's `DeploymentStatus`, as Nomad's `task_states` health check does:
//! healthy once every task that must keep running (main tasks and sidecars) has been running
//! for `min_healthy_time`; unhealthy when a task fails or `healthy_deadline` passes first.
//! Service checks are not run by this client, so `health_check = "checks"` is judged on task
//! states too; `manual` reports nothing.
//!
//! Prerun starts the watcher; it ends with its verdict, or when the alloc stops or is
//! destroyed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_proto::alloc::task_state;
use nomad_proto::job::lifecycle_hook;
use nomad_proto::{Allocation, TaskState, Timestamp};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, HookEnv, PostrunHook, PrerunHook};
use crate::client::state::HookState;

/// Health timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Running this long counts as healthy.
    pub min_healthy_time: Duration,
    /// Not healthy by then counts as unhealthy.
    pub healthy_deadline: Duration,
}

impl HealthConfig {
    /// For an alloc in a deployment: its group's (else job's) `update` settings, or Nomad's
    /// defaults; `None` when its health is set manually. For a service alloc outside a
    /// deployment: its group's `migrate` settings, so a drain learns when replacements are up
    /// (Nomad's client does the same). `None` for other allocs.
    pub fn for_alloc(alloc: &Allocation) -> Option<HealthConfig> {
        let job = alloc.job.as_ref()?;
        let group = job.lookup_task_group(&alloc.task_group)?;
        let ns = |v: i64, default: u64| if v > 0 { Duration::from_nanos(v as u64) } else { Duration::from_secs(default) };
        if alloc.deployment_id.is_empty() {
            if job.job_type != nomad_proto::JobType::Service {
                return None;
            }
            let migrate = group.migrate.clone().unwrap_or_default();
            return Some(HealthConfig {
                min_healthy_time: ns(migrate.min_healthy_time, 10),
                healthy_deadline: ns(migrate.healthy_deadline, 300),
            });
        }
        let update = group.update.as_ref().or(job.update.as_ref());
        if update.is_some_and(|u| u.health_check == "manual") {
            return None;
        }
        Some(HealthConfig {
            min_healthy_time: ns(update.map_or(0, |u| u.min_healthy_time), 10),
            healthy_deadline: ns(update.map_or(0, |u| u.healthy_deadline), 300),
        })
    }
}

/// Where the evaluation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not decided; look again at `recheck` (or when a task state changes).
    Pending {
        /// When time alone could change the verdict.
        recheck: Instant,
    },
    /// Healthy.
    Healthy,
    /// Unhealthy.
    Unhealthy,
}

/// Judges the alloc at `now`. `required` are the tasks that must be running; `running_since`
/// is when they last all were (updated in place).
pub fn evaluate(
    states: &BTreeMap<String, TaskState>,
    required: &BTreeSet<String>,
    running_since: &mut Option<Instant>,
    started: Instant,
    now: Instant,
    cfg: HealthConfig,
) -> Verdict {
    if states.values().any(|s| s.failed) {
        return Verdict::Unhealthy;
    }
    let deadline = started + cfg.healthy_deadline;
    let all_running = !required.is_empty() && required.iter().all(|t| states.get(t).is_some_and(|s| s.state == task_state::RUNNING));
    if !all_running {
        *running_since = None;
    } else if running_since.is_none() {
        *running_since = Some(now);
    }
    if let Some(since) = *running_since
        && now >= since + cfg.min_healthy_time
    {
        return Verdict::Healthy;
    }
    if now >= deadline {
        return Verdict::Unhealthy;
    }
    let recheck = running_since.map_or(deadline, |since| (since + cfg.min_healthy_time).min(deadline));
    Verdict::Pending { recheck }
}

/// Tasks that must keep running: main tasks and sidecars.
fn required_tasks(alloc: &Allocation) -> BTreeSet<String> {
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return BTreeSet::new() };
    group
        .tasks
        .iter()
        .filter(|t| match &t.lifecycle {
            None => true,
            Some(l) => l.sidecar && l.hook != lifecycle_hook::POSTSTOP,
        })
        .map(|t| t.name.clone())
        .collect()
}

/// The JSON `DeploymentStatus` Nomad reports.
pub fn deployment_status(healthy: bool) -> serde_json::Value {
    serde_json::json!({ "Healthy": healthy, "Timestamp": Timestamp::now(), "Canary": false, "ModifyIndex": 0 })
}

/// See the module docs.
pub struct HealthHook {
    task_states: watch::Receiver<BTreeMap<String, TaskState>>,
    report: Arc<dyn Fn(serde_json::Value) + Send + Sync>,
    cancel: CancellationToken,
    watcher: Mutex<Option<CancellationToken>>,
}

impl HealthHook {
    /// A hook reading and reporting through `env`.
    pub fn new(env: HookEnv) -> HealthHook {
        HealthHook { task_states: env.task_states, report: env.deployment_status, cancel: env.cancel, watcher: Mutex::new(None) }
    }
}

impl AllocHook for HealthHook {
    fn name(&self) -> &'static str {
        "health"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
}

impl PrerunHook for HealthHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> futures::future::BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        Box::pin(std::future::ready(self.prerun_now(req)))
    }
}

impl HealthHook {
    fn prerun_now(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        let Some(cfg) = HealthConfig::for_alloc(req.alloc) else { return Ok(None) };
        let already = req.alloc.deployment_status.as_ref().and_then(|d| d.get("Healthy")).is_some_and(|h| !h.is_null());
        if already {
            return Ok(None);
        }
        let stop = self.cancel.child_token();
        *self.watcher.lock().unwrap_or_else(|e| e.into_inner()) = Some(stop.clone());
        let required = required_tasks(req.alloc);
        let mut rx = self.task_states.clone();
        let report = self.report.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut running_since = None;
            loop {
                let states = rx.borrow_and_update().clone();
                let verdict = evaluate(&states, &required, &mut running_since, started, Instant::now(), cfg);
                let recheck = match verdict {
                    Verdict::Healthy => return report(deployment_status(true)),
                    Verdict::Unhealthy => return report(deployment_status(false)),
                    Verdict::Pending { recheck } => recheck,
                };
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = tokio::time::sleep_until(recheck) => {}
                }
            }
        });
        Ok(None)
    }
}

impl PostrunHook for HealthHook {
    fn postrun(&self, _req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        if let Some(stop) = self.watcher.lock().unwrap_or_else(|e| e.into_inner()).take() {
            stop.cancel();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(s: &str, failed: bool) -> TaskState {
        TaskState { state: s.into(), failed, ..TaskState::default() }
    }

    #[test]
    fn healthy_after_min_time_running_unhealthy_on_failure_or_deadline() {
        let cfg = HealthConfig { min_healthy_time: Duration::from_secs(10), healthy_deadline: Duration::from_secs(60) };
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let required = BTreeSet::from(["web".to_string()]);
        let mut since = None;
        let mut states = BTreeMap::from([("web".to_string(), state("pending", false)), ("init".to_string(), state("dead", false))]);
        assert_eq!(evaluate(&states, &required, &mut since, t0, t0, cfg), Verdict::Pending { recheck: t0 + 60 * s });
        states.insert("web".into(), state("running", false));
        assert_eq!(evaluate(&states, &required, &mut since, t0, t0 + 5 * s, cfg), Verdict::Pending { recheck: t0 + 15 * s });
        // A restart resets the clock.
        states.insert("web".into(), state("pending", false));
        evaluate(&states, &required, &mut since, t0, t0 + 8 * s, cfg);
        states.insert("web".into(), state("running", false));
        assert!(matches!(evaluate(&states, &required, &mut since, t0, t0 + 9 * s, cfg), Verdict::Pending { .. }));
        assert_eq!(evaluate(&states, &required, &mut since, t0, t0 + 19 * s, cfg), Verdict::Healthy);

        let mut since = None;
        assert_eq!(evaluate(&states, &required, &mut since, t0, t0 + 61 * s, cfg), Verdict::Unhealthy, "deadline passed first");
        states.insert("init".into(), state("dead", true));
        assert_eq!(evaluate(&states, &required, &mut None, t0, t0, cfg), Verdict::Unhealthy);
    }

    #[test]
    fn deployments_use_update_settings_and_other_service_allocs_use_migrate() {
        let mut a = Allocation::default();
        assert_eq!(HealthConfig::for_alloc(&a), None, "no job, nothing to judge");
        a.task_group = "g".into();
        let group = nomad_proto::TaskGroup {
            name: "g".into(),
            migrate: Some(nomad_proto::job::MigrateStrategy { min_healthy_time: 2_000_000_000, ..Default::default() }),
            ..Default::default()
        };
        let job = |job_type| Arc::new(nomad_proto::Job { job_type, task_groups: vec![group.clone()], ..Default::default() });
        a.job = Some(job(nomad_proto::JobType::Service));
        assert_eq!(
            HealthConfig::for_alloc(&a),
            Some(HealthConfig { min_healthy_time: Duration::from_secs(2), healthy_deadline: Duration::from_secs(300) }),
            "outside a deployment a service alloc is judged by its migrate settings"
        );
        a.job = Some(job(nomad_proto::JobType::Batch));
        assert_eq!(HealthConfig::for_alloc(&a), None, "batch allocs are never migrated, so never judged");
        a.deployment_id = "d".into();
        a.job = Some(job(nomad_proto::JobType::Service));
        assert_eq!(
            HealthConfig::for_alloc(&a),
            Some(HealthConfig { min_healthy_time: Duration::from_secs(10), healthy_deadline: Duration::from_secs(300) }),
            "in a deployment: the update defaults"
        );
    }
}
