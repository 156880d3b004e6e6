//! What a running task does for its Consul checks: script checks run in the task and reported
//! as TTL updates (Nomad's `script_check_hook.go` and `tasklet.go`), and `check_restart`, which
//! restarts the task when a check stays unhealthy (Nomad's `serviceregistration/watcher.go`).
//!
//! Both live for one run of the task: the task runner starts [`run_task_checks`] when the task
//! runs (started or reattached to) and cancels it when the run ends, so nothing runs for a
//! stopped task, and `grace` counts from each (re)start.
//!
//! - **Script checks**: run at once, then every `interval`, through the task's driver
//!   (`Driver::exec_task`, at most `timeout`); exit 0 is `passing`, 1 `warning`, anything else
//!   (or an exec error, or a timeout: "context deadline exceeded") `critical`, with the last
//!   4 KiB of output ([`script_result`]). Each result goes to
//!   `PUT /v1/agent/check/update/<check id>`, retried once after 1 s (Nomad's backoff of
//!   1 s × 4^attempt up to 3 s); a Consul that cannot be reached only loses that result, the
//!   next run reports again.
//! - **check_restart**: one [`CheckWatcher`] per source of statuses polls it every second
//!   while any check is watched and publishes the statuses: Consul's `/v1/agent/checks` for
//!   Consul checks, the client's own check store for Nomad checks (Nomad's
//!   `UniversalCheckWatcher` with its two `CheckStatusGetter`s). Each watched check has a
//!   [`Restarter`] fed every poll: after `grace`, `critical` and Nomad's `failure` and `pending`
//!   (and `warning`, unless `ignore_warnings`) are unhealthy; the task is restarted once it has been unhealthy for
//!   `interval × (limit − 1)` (so `limit` consecutive unhealthy polls at the check's interval),
//!   with a `Restart Signaled` event `healthcheck: check "<name>" unhealthy`, counted as a
//!   failure by the restart policy; the run's other watches end with it. A check Consul does not
//!   list (not registered yet, or Consul lost it) is no observation; neither is a failed poll.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::services::TaskCheck;
use super::{CheckStatus, ConsulApi};
use crate::client::driver::{Driver, DriverError, ExecOutput, TaskHandle};

/// Nomad's check watcher poll period.
pub const POLL_PERIOD: Duration = Duration::from_secs(1);
/// Nomad's `updateTTLBackoffBaseline`.
const TTL_RETRY_BASE: Duration = Duration::from_secs(1);
/// Nomad's `updateTTLBackoffLimit`.
const TTL_RETRY_LIMIT: Duration = Duration::from_secs(3);

/// Check statuses by check ID, as Consul lists them (or the Nomad check store).
pub type Statuses = Arc<BTreeMap<String, String>>;

/// Where a [`CheckWatcher`] reads statuses (Nomad's `CheckStatusGetter`).
pub trait StatusGetter: Send + Sync {
    /// Every check's status by ID; an error is logged and the poll skipped.
    fn get(&self) -> futures::future::BoxFuture<'_, Result<Statuses, String>>;
}

/// Consul's agent checks.
struct ConsulStatuses(Arc<dyn ConsulApi>);

impl StatusGetter for ConsulStatuses {
    fn get(&self) -> futures::future::BoxFuture<'_, Result<Statuses, String>> {
        Box::pin(async move {
            let checks = self.0.checks().await.map_err(|e| e.to_string())?;
            Ok(Arc::new(checks.into_iter().map(|(id, c)| (id, c.status)).collect()))
        })
    }
}

/// The Consul status and output of one script run (Nomad's `newScriptCheckCallback`).
pub fn script_result(result: &Result<ExecOutput, DriverError>) -> (CheckStatus, String) {
    match result {
        Ok(out) => {
            let status = match out.exit_code {
                0 => CheckStatus::Passing,
                1 => CheckStatus::Warning,
                _ => CheckStatus::Critical,
            };
            (status, String::from_utf8_lossy(&out.output).into_owned())
        }
        // Go's context.DeadlineExceeded, which is what Nomad reports.
        Err(DriverError::ExecTimedOut(_)) => (CheckStatus::Critical, "context deadline exceeded".to_string()),
        Err(e) => (CheckStatus::Critical, e.to_string()),
    }
}

/// One watched check's `check_restart` rule (Nomad's `restarter`). Pure: the caller passes the
/// clock.
#[derive(Debug, Clone)]
pub struct Restarter {
    grace_until: Instant,
    /// `interval × (limit − 1)`.
    time_limit: Duration,
    ignore_warnings: bool,
    unhealthy_since: Option<Instant>,
}

impl Restarter {
    /// A rule for a check with `interval`, `limit`, `grace` and `ignore_warnings`, watched from
    /// `now` (the task's start).
    pub fn new(now: Instant, interval: Duration, limit: u32, grace: Duration, ignore_warnings: bool) -> Restarter {
        Restarter {
            grace_until: now + grace,
            time_limit: interval.saturating_mul(limit.saturating_sub(1)),
            ignore_warnings,
            unhealthy_since: None,
        }
    }

    /// One observation of the check's status; true when the task must restart now.
    pub fn observe(&mut self, now: Instant, status: &str) -> bool {
        let unhealthy = match status {
            // Consul's, and Nomad's for its own checks.
            "critical" | "failure" | "pending" => true,
            "warning" => !self.ignore_warnings,
            _ => false,
        };
        if !unhealthy {
            self.unhealthy_since = None;
            return false;
        }
        if now < self.grace_until {
            return false;
        }
        let since = *self.unhealthy_since.get_or_insert(now);
        now >= since + self.time_limit
    }
}

/// Polls a source of statuses every [`POLL_PERIOD`] while anything watches (see the module docs).
pub struct CheckWatcher {
    getter: Arc<dyn StatusGetter>,
    api: Option<Arc<dyn ConsulApi>>,
    statuses: watch::Sender<Statuses>,
    kick: Notify,
    period: Duration,
}

impl CheckWatcher {
    /// A watcher over Consul's `api`; call [`CheckWatcher::run`] to start it.
    pub fn new(api: Arc<dyn ConsulApi>, period: Duration) -> Arc<CheckWatcher> {
        let getter = Arc::new(ConsulStatuses(api.clone()));
        Arc::new(CheckWatcher { getter, api: Some(api), statuses: watch::channel(Statuses::default()).0, kick: Notify::new(), period })
    }

    /// A watcher over another source (the Nomad check store).
    pub fn with_getter(getter: Arc<dyn StatusGetter>, period: Duration) -> Arc<CheckWatcher> {
        Arc::new(CheckWatcher { getter, api: None, statuses: watch::channel(Statuses::default()).0, kick: Notify::new(), period })
    }

    /// The Consul API (script checks report through it); `None` for the Nomad check store.
    pub fn api(&self) -> Option<&Arc<dyn ConsulApi>> {
        self.api.as_ref()
    }

    /// Statuses from the next poll on (polling runs while a receiver exists).
    pub fn subscribe(&self) -> watch::Receiver<Statuses> {
        let mut rx = self.statuses.subscribe();
        rx.mark_unchanged();
        self.kick.notify_one();
        rx
    }

    /// Polls until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            if self.statuses.receiver_count() == 0 {
                tokio::select! {
                    _ = self.kick.notified() => {}
                    _ = shutdown.cancelled() => return,
                }
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.period) => {}
                _ = shutdown.cancelled() => return,
            }
            match self.getter.get().await {
                Ok(statuses) => {
                    if failing {
                        tracing::info!("check statuses are available again");
                    }
                    failing = false;
                    self.statuses.send_replace(statuses);
                }
                Err(e) => {
                    if !failing {
                        tracing::error!(error = %e, "failed to retrieve check statuses");
                    }
                    failing = true;
                }
            }
        }
    }
}

/// What the task's checks need from its runner.
pub trait TaskRestarter: Send + Sync {
    /// Restart the task because of `check_name`, counted as a failure.
    fn restart_unhealthy(&self, check_name: &str);
}

/// Runs the script checks and `check_restart` watches of one run of a task until `stop`.
pub async fn run_task_checks(
    watcher: Arc<CheckWatcher>,
    driver: Arc<dyn Driver>,
    handle: TaskHandle,
    checks: Vec<TaskCheck>,
    restarter: Arc<dyn TaskRestarter>,
    stop: CancellationToken,
) {
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    if let Some(api) = watcher.api() {
        for c in checks.iter().filter(|c| c.script.is_some()) {
            set.spawn(run_script(api.clone(), driver.clone(), handle.clone(), c.clone(), stop.clone()));
        }
    }
    let mut rules: Vec<(String, String, Restarter)> = checks
        .iter()
        .filter_map(|c| {
            let r = c.restart.as_ref()?;
            let limit = u32::try_from(r.limit).unwrap_or(u32::MAX);
            let grace = Duration::from_nanos(r.grace.max(0) as u64);
            Some((c.check_id.clone(), c.name.clone(), Restarter::new(started, c.interval, limit, grace, r.ignore_warnings)))
        })
        .collect();
    if !rules.is_empty() {
        let mut rx = watcher.subscribe();
        let name = loop {
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break None },
                _ = stop.cancelled() => break None,
            }
            let statuses = rx.borrow_and_update().clone();
            let now = Instant::now();
            let mut triggered = None;
            for (id, name, rule) in rules.iter_mut() {
                if let Some(status) = statuses.get(id.as_str())
                    && rule.observe(now, status)
                    && triggered.is_none()
                {
                    triggered = Some(name.clone());
                }
            }
            if triggered.is_some() {
                break triggered;
            }
        };
        if let Some(name) = name {
            tracing::info!(alloc_id = %handle.alloc_id, task = %handle.task_name, check = %name, "restarting due to unhealthy check");
            restarter.restart_unhealthy(&name);
        }
    }
    stop.cancelled().await;
    set.shutdown().await;
}

/// One script check: run at once, then every interval, until `stop`.
async fn run_script(api: Arc<dyn ConsulApi>, driver: Arc<dyn Driver>, handle: TaskHandle, check: TaskCheck, stop: CancellationToken) {
    let Some((command, args)) = check.script.clone() else { return };
    let mut last_update_ok = true;
    loop {
        let result = tokio::select! {
            r = driver.exec_task(&handle, &command, &args, check.timeout) => r,
            _ = stop.cancelled() => return,
        };
        if let Err(e) = &result {
            tracing::warn!(alloc_id = %handle.alloc_id, task = %handle.task_name, check = %check.name, error = %e, "script check did not run");
        }
        let (status, output) = script_result(&result);
        let mut attempt = 0u32;
        let updated = loop {
            match api.check_update(&check.check_id, status, &output).await {
                Ok(()) => break Ok(()),
                Err(e) => {
                    let backoff = TTL_RETRY_BASE * 4u32.saturating_pow(attempt);
                    if backoff > TTL_RETRY_LIMIT {
                        break Err(e);
                    }
                    attempt += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.cancelled() => return,
                    }
                }
            }
        };
        match updated {
            Err(e) if last_update_ok => {
                last_update_ok = false;
                tracing::warn!(alloc_id = %handle.alloc_id, check = %check.name, error = %e, "updating check failed");
            }
            Err(e) => tracing::debug!(alloc_id = %handle.alloc_id, check = %check.name, error = %e, "updating check still failing"),
            Ok(()) if !last_update_ok => {
                last_update_ok = true;
                tracing::info!(alloc_id = %handle.alloc_id, check = %check.name, "updating check succeeded");
            }
            Ok(()) => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(check.interval.max(Duration::from_millis(100))) => {}
            _ = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn script_exit_codes_map_to_consul_statuses() {
        let out = |code: i32| Ok(ExecOutput { output: b"out".to_vec(), exit_code: code });
        assert_eq!(script_result(&out(0)), (CheckStatus::Passing, "out".into()));
        assert_eq!(script_result(&out(1)), (CheckStatus::Warning, "out".into()));
        for code in [2, 127, 128 + 9, -1] {
            assert_eq!(script_result(&out(code)).0, CheckStatus::Critical, "exit {code}");
        }
        assert_eq!(script_result(&Err(DriverError::ExecTimedOut(S))), (CheckStatus::Critical, "context deadline exceeded".into()));
        let (status, output) = script_result(&Err(DriverError::ExecFailed("task \"web\" is not running".into())));
        assert_eq!((status, output.as_str()), (CheckStatus::Critical, "exec in the task: task \"web\" is not running"));
        assert_eq!(super::super::services::script_ttl(10_000_000_000), Duration::from_secs(41));
    }

    #[test]
    fn restarts_after_limit_unhealthy_polls_and_never_in_grace() {
        let t0 = Instant::now();
        // limit 3 at a 1s interval: unhealthy for 2s (three polls) restarts.
        let mut r = Restarter::new(t0, S, 3, 5 * S, false);
        for i in 0..5 {
            assert!(!r.observe(t0 + S * i, "critical"), "grace: poll {i}");
        }
        assert!(!r.observe(t0 + 5 * S, "critical"), "first unhealthy poll after grace");
        assert!(!r.observe(t0 + 6 * S, "critical"), "second");
        assert!(r.observe(t0 + 7 * S, "critical"), "third restarts");

        // A passing poll in between starts the count again.
        let mut r = Restarter::new(t0, S, 3, Duration::ZERO, false);
        assert!(!r.observe(t0, "critical"));
        assert!(!r.observe(t0 + S, "critical"));
        assert!(!r.observe(t0 + 2 * S, "passing"));
        assert!(!r.observe(t0 + 3 * S, "critical"));
        assert!(!r.observe(t0 + 4 * S, "critical"));
        assert!(r.observe(t0 + 5 * S, "critical"));

        // limit 1: the first unhealthy poll after grace.
        let mut r = Restarter::new(t0, 10 * S, 1, 2 * S, false);
        assert!(!r.observe(t0 + S, "critical"));
        assert!(r.observe(t0 + 2 * S, "critical"));
    }

    #[test]
    fn nomad_failure_and_pending_are_unhealthy_and_success_is_not() {
        let t0 = Instant::now();
        let mut r = Restarter::new(t0, S, 2, Duration::ZERO, false);
        assert!(!r.observe(t0, "pending"));
        assert!(r.observe(t0 + S, "failure"), "pending then failure: two unhealthy polls");
        let mut r = Restarter::new(t0, S, 2, Duration::ZERO, false);
        assert!(!r.observe(t0, "failure"));
        assert!(!r.observe(t0 + S, "success"), "success resets the count");
        assert!(!r.observe(t0 + 2 * S, "failure"));
        assert!(r.observe(t0 + 3 * S, "failure"));
    }

    #[test]
    fn warnings_count_unless_ignored() {
        let t0 = Instant::now();
        let mut strict = Restarter::new(t0, S, 2, Duration::ZERO, false);
        assert!(!strict.observe(t0, "warning"));
        assert!(strict.observe(t0 + S, "warning"));
        let mut lenient = Restarter::new(t0, S, 2, Duration::ZERO, true);
        for i in 0..5 {
            assert!(!lenient.observe(t0 + S * i, "warning"));
        }
        // A warning is healthy for it: it resets a critical streak.
        assert!(!lenient.observe(t0 + 5 * S, "critical"));
        assert!(!lenient.observe(t0 + 6 * S, "warning"));
        assert!(!lenient.observe(t0 + 7 * S, "critical"));
        assert!(lenient.observe(t0 + 8 * S, "critical"));
    }
}
