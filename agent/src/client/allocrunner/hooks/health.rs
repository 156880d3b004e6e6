//! `health`: for an alloc in a deployment, or a service alloc being judged for migrations
//! (`migrate` settings), decides whether it is healthy and reports it as the alloc's
//! `DeploymentStatus`, as Nomad's `allochealth.Tracker` does:
//! - every task that must keep running (main tasks and sidecars) has been running for
//!   `min_healthy_time`;
//! - with `health_check = "checks"` (the default) and Consul checks in the alloc's services,
//!   every one of those checks is registered in Consul and has been passing for
//!   `min_healthy_time` too (Nomad's `evaluateConsulChecks`): `on_update = "ignore_warnings"`
//!   lets a check pass while `warning`, `"ignore"` leaves its status out (it must still be
//!   registered), `"require_healthy"` needs `passing`. Statuses come from the agent's
//!   [`CheckWatcher`] (`/v1/agent/checks`);
//! - with `health_check = "checks"` and no Consul checks in the group, its Nomad checks
//!   (`client/checks/`, the store polled every 500 ms, Nomad's `watchNomadEvents`): every one
//!   `success` for `min_healthy_time` too; a readiness check's `failure` passes, `pending` never
//!   does. A group with Consul checks is judged by those alone, as Nomad does;
//! - unhealthy when a task fails or `healthy_deadline` passes first.
//!
//! `task_states` judges tasks only; `manual` reports nothing.
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

use super::{AllocHook, AllocHookError, AllocHookRequest, HookEnv, NodeFn, PostrunHook, PrerunHook};
use crate::client::checks::{CheckResults, NomadCheck, alloc_checks, nomad_checks_pass};
use crate::client::consul::checks::{CheckWatcher, Statuses};
use crate::client::consul::services::{build_consul, is_consul};
use crate::client::services::Which;
use crate::client::state::HookState;

/// Health timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Running this long counts as healthy.
    pub min_healthy_time: Duration,
    /// Not healthy by then counts as unhealthy.
    pub healthy_deadline: Duration,
    /// `health_check = "checks"`: the alloc's Consul checks count too.
    pub use_checks: bool,
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
        // `min_healthy_time = 0` in an update block means healthy as soon as running.
        let at_least_zero = |v: i64, default: u64| if v >= 0 { Duration::from_nanos(v as u64) } else { Duration::from_secs(default) };
        if alloc.deployment_id.is_empty() {
            if job.job_type != nomad_proto::JobType::Service {
                return None;
            }
            let migrate = group.migrate.clone().unwrap_or_default();
            return Some(HealthConfig {
                min_healthy_time: ns(migrate.min_healthy_time, 10),
                healthy_deadline: ns(migrate.healthy_deadline, 300),
                use_checks: uses_checks(&migrate.health_check),
            });
        }
        let update = group.update.as_ref().or(job.update.as_ref());
        if update.is_some_and(|u| u.health_check == "manual") {
            return None;
        }
        Some(HealthConfig {
            min_healthy_time: update.map_or(Duration::from_secs(10), |u| at_least_zero(u.min_healthy_time, 10)),
            healthy_deadline: ns(update.map_or(0, |u| u.healthy_deadline), 300),
            use_checks: uses_checks(update.map_or("", |u| u.health_check.as_str())),
        })
    }
}

/// `checks` is Nomad's default for both `update` and `migrate`.
fn uses_checks(health_check: &str) -> bool {
    matches!(health_check, "" | "checks")
}

/// Nomad's `evaluateConsulChecks`: every expected check (ID to its `on_update`) is in Consul,
/// and each is `passing`, or `warning` under `ignore_warnings`, or anything under `ignore`.
pub fn consul_checks_pass(expected: &BTreeMap<String, String>, statuses: &BTreeMap<String, String>) -> bool {
    expected.iter().all(|(id, on_update)| match statuses.get(id).map(String::as_str) {
        None => false,
        Some("warning") => matches!(on_update.as_str(), "ignore_warnings" | "ignore"),
        Some("critical") => on_update == "ignore",
        Some(_) => true,
    })
}

/// When the required tasks last all started running, and the checks last all started passing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Clocks {
    pub running_since: Option<Instant>,
    pub passing_since: Option<Instant>,
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

/// Judges the alloc at `now`. `required` are the tasks that must be running; `checks` is
/// whether the Consul checks pass now (`None` when they do not count); `clocks` are updated in
/// place. Checks only count as passing while the tasks run (a restarted task's checks start
/// over, as Nomad resets them with the task health).
pub fn evaluate(
    states: &BTreeMap<String, TaskState>,
    required: &BTreeSet<String>,
    checks: Option<bool>,
    clocks: &mut Clocks,
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
        clocks.running_since = None;
    } else if clocks.running_since.is_none() {
        clocks.running_since = Some(now);
    }
    if !all_running || checks == Some(false) {
        clocks.passing_since = None;
    } else if clocks.passing_since.is_none() {
        clocks.passing_since = Some(now);
    }
    // The clock that counts: the tasks', and the checks' when they count.
    let since = match checks {
        None => clocks.running_since,
        Some(_) => clocks.passing_since,
    };
    if let Some(since) = since
        && now >= since + cfg.min_healthy_time
    {
        return Verdict::Healthy;
    }
    if now >= deadline {
        return Verdict::Unhealthy;
    }
    let recheck = since.map_or(deadline, |since| (since + cfg.min_healthy_time).min(deadline));
    Verdict::Pending { recheck }
}

/// The Consul checks an alloc's health waits for, by ID with their `on_update`; `None` when it
/// has none (or they do not count). A service that cannot be registered leaves the checks
/// unsatisfiable: an empty ID no status ever matches.
fn expected_checks(alloc: &Allocation, node: &nomad_proto::Node, region: &str) -> Option<BTreeMap<String, String>> {
    let group = alloc.job.as_ref()?.lookup_task_group(&alloc.task_group)?;
    let count: usize = group
        .services
        .iter()
        .chain(group.tasks.iter().flat_map(|t| t.services.iter()))
        .filter(|s| is_consul(s))
        .map(|s| s.checks.len())
        .sum();
    if count == 0 {
        return None;
    }
    let built = build_consul(alloc, node, region, "", Which::All);
    let mut expected = built.on_update;
    if !built.errors.is_empty() {
        expected.insert(String::new(), "require_healthy".into());
    }
    Some(expected)
}

/// Nomad's poll period of the check store for health.
const NOMAD_CHECKS_POLL: Duration = Duration::from_millis(500);

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
    consul_checks: Option<Arc<CheckWatcher>>,
    nomad_checks: Option<Arc<dyn CheckResults>>,
    node: NodeFn,
    region: String,
}

impl HealthHook {
    /// A hook reading and reporting through `env`.
    pub fn new(env: HookEnv) -> HealthHook {
        HealthHook {
            task_states: env.task_states,
            report: env.deployment_status,
            cancel: env.cancel,
            watcher: Mutex::new(None),
            consul_checks: env.consul_checks,
            nomad_checks: env.nomad_checks.map(|s| s as Arc<dyn CheckResults>),
            node: env.node,
            region: env.region,
        }
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
        let expected = if cfg.use_checks { expected_checks(req.alloc, &(self.node)(), &self.region) } else { None };
        // Without a Consul to ask, the checks never pass (Nomad keeps asking until the deadline).
        let mut statuses: Option<watch::Receiver<Statuses>> = expected.as_ref().and(self.consul_checks.as_ref()).map(|w| w.subscribe());
        // Nomad checks count only where no Consul check does.
        let nomad: Option<BTreeMap<String, NomadCheck>> =
            if cfg.use_checks && expected.is_none() { Some(alloc_checks(req.alloc)).filter(|c| !c.is_empty()) } else { None };
        let store = self.nomad_checks.clone();
        let alloc_id = req.alloc.id.clone();
        let mut rx = self.task_states.clone();
        let report = self.report.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut clocks = Clocks::default();
            loop {
                let states = rx.borrow_and_update().clone();
                let checks = match (&expected, &nomad) {
                    (Some(expected), _) => Some(statuses.as_mut().is_some_and(|s| consul_checks_pass(expected, &s.borrow_and_update()))),
                    (None, Some(nomad)) => Some(nomad_checks_pass(nomad, store.as_ref().and_then(|s| s.alloc_results(&alloc_id)).as_ref())),
                    (None, None) => None,
                };
                let verdict = evaluate(&states, &required, checks, &mut clocks, started, Instant::now(), cfg);
                let recheck = match verdict {
                    Verdict::Healthy => return report(deployment_status(true)),
                    Verdict::Unhealthy => return report(deployment_status(false)),
                    Verdict::Pending { recheck } => recheck,
                };
                let polled = async {
                    match statuses.as_mut() {
                        Some(s) => s.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                let mut watcher_gone = false;
                // The alloc can finish (postrun stops this watcher) before a look at the task
                // failure that finished it: a failure seen last still decides the verdict.
                let failed_at_end = |rx: &watch::Receiver<BTreeMap<String, TaskState>>| rx.borrow().values().any(|s| s.failed);
                tokio::select! {
                    biased;
                    changed = rx.changed() => if changed.is_err() {
                        if failed_at_end(&rx) {
                            report(deployment_status(false));
                        }
                        return;
                    },
                    _ = stop.cancelled() => {
                        if failed_at_end(&rx) {
                            report(deployment_status(false));
                        }
                        return;
                    }
                    ok = polled => watcher_gone = !ok,
                    _ = tokio::time::sleep(NOMAD_CHECKS_POLL), if nomad.is_some() => {}
                    _ = tokio::time::sleep_until(recheck) => {}
                }
                if watcher_gone {
                    statuses = None;
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
        let cfg = HealthConfig { min_healthy_time: Duration::from_secs(10), healthy_deadline: Duration::from_secs(60), use_checks: true };
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let required = BTreeSet::from(["web".to_string()]);
        let mut c = Clocks::default();
        let mut states = BTreeMap::from([("web".to_string(), state("pending", false)), ("init".to_string(), state("dead", false))]);
        assert_eq!(evaluate(&states, &required, None, &mut c, t0, t0, cfg), Verdict::Pending { recheck: t0 + 60 * s });
        states.insert("web".into(), state("running", false));
        assert_eq!(evaluate(&states, &required, None, &mut c, t0, t0 + 5 * s, cfg), Verdict::Pending { recheck: t0 + 15 * s });
        // A restart resets the clock.
        states.insert("web".into(), state("pending", false));
        evaluate(&states, &required, None, &mut c, t0, t0 + 8 * s, cfg);
        states.insert("web".into(), state("running", false));
        assert!(matches!(evaluate(&states, &required, None, &mut c, t0, t0 + 9 * s, cfg), Verdict::Pending { .. }));
        assert_eq!(evaluate(&states, &required, None, &mut c, t0, t0 + 19 * s, cfg), Verdict::Healthy);

        let mut c = Clocks::default();
        assert_eq!(evaluate(&states, &required, None, &mut c, t0, t0 + 61 * s, cfg), Verdict::Unhealthy, "deadline passed first");
        states.insert("init".into(), state("dead", true));
        assert_eq!(evaluate(&states, &required, None, &mut Clocks::default(), t0, t0, cfg), Verdict::Unhealthy);
    }

    #[test]
    fn consul_checks_must_pass_for_min_healthy_time_too() {
        let cfg = HealthConfig { min_healthy_time: Duration::from_secs(10), healthy_deadline: Duration::from_secs(60), use_checks: true };
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let required = BTreeSet::from(["web".to_string()]);
        let states = BTreeMap::from([("web".to_string(), state("running", false))]);
        let mut c = Clocks::default();
        // Running since t0, checks not passing yet: not healthy at t0+10s as task states alone would be.
        assert_eq!(evaluate(&states, &required, Some(false), &mut c, t0, t0, cfg), Verdict::Pending { recheck: t0 + 60 * s });
        assert_eq!(evaluate(&states, &required, Some(false), &mut c, t0, t0 + 12 * s, cfg), Verdict::Pending { recheck: t0 + 60 * s });
        // Passing from t0+12s: healthy at t0+22s, not before.
        assert_eq!(evaluate(&states, &required, Some(true), &mut c, t0, t0 + 12 * s, cfg), Verdict::Pending { recheck: t0 + 22 * s });
        // A check failing in between starts the wait over.
        evaluate(&states, &required, Some(false), &mut c, t0, t0 + 15 * s, cfg);
        assert_eq!(evaluate(&states, &required, Some(true), &mut c, t0, t0 + 16 * s, cfg), Verdict::Pending { recheck: t0 + 26 * s });
        assert_eq!(evaluate(&states, &required, Some(true), &mut c, t0, t0 + 26 * s, cfg), Verdict::Healthy);
        // Checks that never pass: unhealthy at the deadline.
        let mut c = Clocks::default();
        assert_eq!(evaluate(&states, &required, Some(false), &mut c, t0, t0 + 60 * s, cfg), Verdict::Unhealthy);
        // Passing checks count only while the tasks run.
        let pending = BTreeMap::from([("web".to_string(), state("pending", false))]);
        let mut c = Clocks::default();
        evaluate(&pending, &required, Some(true), &mut c, t0, t0, cfg);
        assert_eq!(c.passing_since, None);
    }

    #[test]
    fn on_update_decides_which_statuses_pass() {
        let expected = BTreeMap::from([
            ("strict".to_string(), "require_healthy".to_string()),
            ("lenient".to_string(), "ignore_warnings".to_string()),
            ("ignored".to_string(), "ignore".to_string()),
        ]);
        let statuses = |strict: &str, lenient: &str, ignored: Option<&str>| {
            let mut m = BTreeMap::from([("strict".to_string(), strict.to_string()), ("lenient".to_string(), lenient.to_string())]);
            if let Some(i) = ignored {
                m.insert("ignored".into(), i.into());
            }
            m
        };
        assert!(consul_checks_pass(&expected, &statuses("passing", "passing", Some("passing"))));
        assert!(
            consul_checks_pass(&expected, &statuses("passing", "warning", Some("critical"))),
            "warning under ignore_warnings, anything under ignore"
        );
        assert!(!consul_checks_pass(&expected, &statuses("warning", "passing", Some("passing"))), "require_healthy refuses warning");
        assert!(!consul_checks_pass(&expected, &statuses("passing", "critical", Some("passing"))), "ignore_warnings refuses critical");
        assert!(!consul_checks_pass(&expected, &statuses("passing", "passing", None)), "an ignored check must still be registered");
    }

    /// A task failure that ends the alloc at once: postrun stops the watcher in the same
    /// moment the failure arrives, and the verdict is still unhealthy (it was lost before, and
    /// a deployment with `progress_deadline = 0` waited forever).
    #[tokio::test]
    async fn a_failure_that_ends_the_alloc_is_reported_though_postrun_stops_the_watcher() {
        use crate::client::allocrunner::hooks::services::tests::{FakeRegistrar, env};
        for _ in 0..20 {
            let (tx, rx) = watch::channel(BTreeMap::from([("t".to_string(), state(task_state::PENDING, false))]));
            let mut hook_env = env(rx, Arc::new(FakeRegistrar::default()));
            let (verdict_tx, mut verdict) = watch::channel(None::<serde_json::Value>);
            hook_env.deployment_status = Arc::new(move |v| {
                verdict_tx.send_replace(Some(v));
            });
            let hook = HealthHook::new(hook_env);
            let group = nomad_proto::TaskGroup {
                name: "g".into(),
                tasks: vec![nomad_proto::Task { name: "t".into(), ..Default::default() }],
                update: Some(nomad_proto::job::UpdateStrategy::default_service()),
                ..Default::default()
            };
            let job = nomad_proto::Job { job_type: nomad_proto::JobType::Service, task_groups: vec![group], ..Default::default() };
            let alloc = Allocation { task_group: "g".into(), deployment_id: "d".into(), job: Some(Arc::new(job)), ..Default::default() };
            let req = AllocHookRequest { alloc: &alloc, alloc_dir: std::path::Path::new("/nonexistent"), previous: None };
            hook.prerun_now(&req).unwrap();
            tokio::task::yield_now().await;
            tx.send_replace(BTreeMap::from([("t".to_string(), state(task_state::DEAD, true))]));
            PostrunHook::postrun(&hook, &req).unwrap();
            let got =
                tokio::time::timeout(Duration::from_secs(10), verdict.wait_for(Option::is_some)).await.expect("a verdict").unwrap().clone();
            assert_eq!(got.unwrap()["Healthy"], false);
        }
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
            Some(HealthConfig { min_healthy_time: Duration::from_secs(2), healthy_deadline: Duration::from_secs(300), use_checks: true }),
            "outside a deployment a service alloc is judged by its migrate settings"
        );
        a.job = Some(job(nomad_proto::JobType::Batch));
        assert_eq!(HealthConfig::for_alloc(&a), None, "batch allocs are never migrated, so never judged");
        a.deployment_id = "d".into();
        a.job = Some(job(nomad_proto::JobType::Service));
        assert_eq!(
            HealthConfig::for_alloc(&a),
            Some(HealthConfig { min_healthy_time: Duration::from_secs(10), healthy_deadline: Duration::from_secs(300), use_checks: true }),
            "in a deployment: the update defaults"
        );
        let mut g = group.clone();
        g.update = Some(nomad_proto::job::UpdateStrategy { min_healthy_time: 0, ..nomad_proto::job::UpdateStrategy::default_service() });
        a.job = Some(Arc::new(nomad_proto::Job { task_groups: vec![g], ..Default::default() }));
        assert_eq!(HealthConfig::for_alloc(&a).map(|c| c.min_healthy_time), Some(Duration::ZERO), "min_healthy_time = 0 is kept");
    }
}
