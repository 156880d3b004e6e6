//! The restart tracker: given how a task ended, restart it (after how long), leave it dead, or
//! fail it, by the task's `restart` policy.
//!
//! Nomad's rules:
//! - attempts are counted within a window of `interval` that starts when the tracker is created
//!   and restarts once it has passed;
//! - within the allowed attempts the task restarts after `delay` plus up to 25% jitter;
//! - past them, mode `fail` fails the task and mode `delay` waits for the window to end;
//! - a successful exit (code 0, no signal) of a batch or sysbatch task, a non-sidecar prestart
//!   or poststart task, or a poststop task is not restarted and not a failure;
//! - `attempts = 0` never restarts;
//! - a start error that is not recoverable fails the task at once;
//! - a restart asked for by a user restarts at once and does not count;
//! - a killed task is never restarted.
//!
//! Pure: the caller passes the clock and the jitter, so tests are exact.

use std::time::{Duration, Instant};

use nomad_proto::job::{JobType, RESTART_MODE_DELAY, lifecycle_hook};
use nomad_proto::{RestartPolicy, TaskLifecycle};

use crate::client::driver::ExitResult;

/// Share of the delay added at most as jitter.
const JITTER: f64 = 0.25;

/// Why a task within its policy is restarted.
pub const REASON_WITHIN_POLICY: &str = "Restart within policy";
/// Why a task past its attempts in mode `delay` waits.
pub const REASON_DELAY: &str = "Exceeded allowed attempts, applying a delay";
/// Why a task with `attempts = 0` is not restarted.
pub const REASON_NO_RESTARTS: &str = "Policy allows no restarts";
/// Why a task whose start error cannot be retried is not restarted.
pub const REASON_UNRECOVERABLE: &str = "Error was unrecoverable";
/// Why a task that succeeded and need not run again is not restarted.
pub const REASON_SUCCESS: &str = "Restart unnecessary as task terminated successfully";

/// What to do with a task that stopped running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start it again after `delay`.
    Restart {
        /// Wait before starting.
        delay: Duration,
        /// Why (empty for a user's restart).
        reason: String,
    },
    /// Leave it dead and failed.
    Fail {
        /// Why.
        reason: String,
    },
    /// Leave it dead; it finished.
    Done {
        /// Why.
        reason: String,
    },
    /// It was killed: leave it dead.
    Killed,
}

/// The policy in durations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Restarts allowed per window.
    pub attempts: u32,
    /// The window.
    pub interval: Duration,
    /// Wait before a restart.
    pub delay: Duration,
    /// Past the attempts: wait for the next window instead of failing.
    pub delay_mode: bool,
}

impl Policy {
    /// From the job's policy (nanosecond fields; negatives count as zero).
    pub fn from_job(p: &RestartPolicy) -> Policy {
        let ns = |v: i64| Duration::from_nanos(v.max(0) as u64);
        Policy {
            attempts: p.attempts.clamp(0, i64::from(u32::MAX)) as u32,
            interval: ns(p.interval),
            delay: ns(p.delay),
            delay_mode: p.mode == RESTART_MODE_DELAY,
        }
    }
}

/// Tracks one task's restarts.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    policy: Policy,
    restart_on_success: bool,
    count: u32,
    window_start: Instant,
}

impl RestartTracker {
    /// A tracker for a task of a job of `job_type` with the given lifecycle, created at `now`.
    pub fn new(policy: Policy, job_type: JobType, lifecycle: Option<&TaskLifecycle>, now: Instant) -> RestartTracker {
        let mut restart_on_success = !matches!(job_type, JobType::Batch | JobType::Sysbatch);
        if let Some(l) = lifecycle {
            match l.hook.as_str() {
                lifecycle_hook::PRESTART | lifecycle_hook::POSTSTART => restart_on_success = l.sidecar,
                lifecycle_hook::POSTSTOP => restart_on_success = false,
                _ => {}
            }
        }
        RestartTracker { policy, restart_on_success, count: 0, window_start: now }
    }

    /// Failures counted in the current window.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The task exited with `exit`. `jitter` is a sample in `[0, 1)`.
    pub fn exited(&mut self, exit: &ExitResult, now: Instant, jitter: f64) -> Decision {
        self.decide(Some(exit.successful()), now, jitter)
    }

    /// The task failed to start.
    pub fn start_failed(&mut self, recoverable: bool, now: Instant, jitter: f64) -> Decision {
        if !recoverable && self.policy.attempts > 0 {
            // Still counts, as Nomad's does, so the window stays right.
            self.enter_window(now);
            self.count += 1;
            return Decision::Fail { reason: REASON_UNRECOVERABLE.into() };
        }
        self.decide(None, now, jitter)
    }

    /// A restart asked for as a failure (an unhealthy check's `check_restart`): counted and
    /// decided as a failed exit, as Nomad's `SetRestartTriggered(failure = true)`.
    pub fn restart_failed(&mut self, now: Instant, jitter: f64) -> Decision {
        self.decide(Some(false), now, jitter)
    }

    /// A user asked for a restart: at once, not counted.
    pub fn restart_requested(&self) -> Decision {
        Decision::Restart { delay: Duration::ZERO, reason: String::new() }
    }

    fn enter_window(&mut self, now: Instant) {
        if now > self.window_start + self.policy.interval {
            self.count = 0;
            self.window_start = now;
        }
    }

    /// `success` is `Some(exit was successful)` for an exit, `None` for a start error.
    fn decide(&mut self, success: Option<bool>, now: Instant, jitter: f64) -> Decision {
        let succeeded = success == Some(true);
        if self.policy.attempts == 0 {
            if succeeded && !self.restart_on_success {
                return Decision::Done { reason: REASON_NO_RESTARTS.into() };
            }
            return Decision::Fail { reason: REASON_NO_RESTARTS.into() };
        }
        self.enter_window(now);
        self.count += 1;
        if succeeded && !self.restart_on_success {
            return Decision::Done { reason: REASON_SUCCESS.into() };
        }
        if self.count > self.policy.attempts {
            if self.policy.delay_mode {
                let end = self.window_start + self.policy.interval;
                return Decision::Restart { delay: end.saturating_duration_since(now), reason: REASON_DELAY.into() };
            }
            return Decision::Fail {
                reason: format!(
                    "Exceeded allowed attempts {} in interval {} and mode is \"fail\"",
                    self.policy.attempts,
                    go_duration(self.policy.interval)
                ),
            };
        }
        let jitter = self.policy.delay.mul_f64(JITTER * jitter.clamp(0.0, 1.0));
        Decision::Restart { delay: self.policy.delay + jitter, reason: REASON_WITHIN_POLICY.into() }
    }
}

/// A duration the way Go prints it (`30m0s`, `15s`, `1h0m0s`, `250ms`).
pub fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return if d.is_zero() { "0s".into() } else { format!("{}ms", d.as_millis()) };
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let frac = d.subsec_millis();
    let s = if frac > 0 { format!("{s}.{frac:03}").trim_end_matches('0').to_string() } else { s.to_string() };
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn exit(code: i32) -> ExitResult {
        ExitResult { exit_code: code, ..ExitResult::default() }
    }

    fn policy(attempts: u32, interval_s: u64, delay_s: u64, delay_mode: bool) -> Policy {
        Policy { attempts, interval: Duration::from_secs(interval_s), delay: Duration::from_secs(delay_s), delay_mode }
    }

    fn restart(delay: Duration) -> Decision {
        Decision::Restart { delay, reason: REASON_WITHIN_POLICY.into() }
    }

    #[test]
    fn table() {
        let t0 = Instant::now();
        let prestart = TaskLifecycle { hook: "prestart".into(), sidecar: false };
        let prestart_sidecar = TaskLifecycle { hook: "prestart".into(), sidecar: true };
        let poststop = TaskLifecycle { hook: "poststop".into(), sidecar: false };
        struct Case {
            name: &'static str,
            policy: Policy,
            job: JobType,
            lifecycle: Option<TaskLifecycle>,
            // (seconds after t0, exit code) → expected
            steps: Vec<(u64, i32, Decision)>,
        }
        let fail =
            |n: u32, i: &str| Decision::Fail { reason: format!("Exceeded allowed attempts {n} in interval {i} and mode is \"fail\"") };
        let cases = vec![
            Case {
                name: "service failures restart until attempts are used, then fail",
                policy: policy(2, 60, 5, false),
                job: JobType::Service,
                lifecycle: None,
                steps: vec![(1, 1, restart(5 * S)), (2, 1, restart(5 * S)), (3, 1, fail(2, "1m0s"))],
            },
            Case {
                name: "a successful service exit is restarted too",
                policy: policy(1, 60, 0, false),
                job: JobType::Service,
                lifecycle: None,
                steps: vec![(1, 0, restart(Duration::ZERO)), (2, 0, fail(1, "1m0s"))],
            },
            Case {
                name: "a batch task that exits 0 is done, not failed",
                policy: policy(3, 60, 1, false),
                job: JobType::Batch,
                lifecycle: None,
                steps: vec![(1, 1, restart(S)), (2, 0, Decision::Done { reason: REASON_SUCCESS.into() })],
            },
            Case {
                name: "the window restarts after the interval",
                policy: policy(1, 10, 1, false),
                job: JobType::Service,
                lifecycle: None,
                steps: vec![(1, 1, restart(S)), (12, 1, restart(S)), (13, 1, fail(1, "10s"))],
            },
            Case {
                name: "delay mode waits for the window to end",
                policy: policy(1, 10, 1, true),
                job: JobType::Service,
                lifecycle: None,
                steps: vec![(1, 1, restart(S)), (4, 1, Decision::Restart { delay: 6 * S, reason: REASON_DELAY.into() })],
            },
            Case {
                name: "no attempts: a failure fails, a batch success is done",
                policy: policy(0, 10, 1, false),
                job: JobType::Batch,
                lifecycle: None,
                steps: vec![
                    (1, 0, Decision::Done { reason: REASON_NO_RESTARTS.into() }),
                    (2, 1, Decision::Fail { reason: REASON_NO_RESTARTS.into() }),
                ],
            },
            Case {
                name: "a prestart task that succeeded is done even in a service job",
                policy: policy(2, 60, 1, false),
                job: JobType::Service,
                lifecycle: Some(prestart),
                steps: vec![(1, 0, Decision::Done { reason: REASON_SUCCESS.into() })],
            },
            Case {
                name: "a prestart sidecar is restarted on success",
                policy: policy(2, 60, 1, false),
                job: JobType::Batch,
                lifecycle: Some(prestart_sidecar),
                steps: vec![(1, 0, restart(S))],
            },
            Case {
                name: "a poststop task is never restarted on success",
                policy: policy(2, 60, 1, false),
                job: JobType::Service,
                lifecycle: Some(poststop),
                steps: vec![(1, 0, Decision::Done { reason: REASON_SUCCESS.into() })],
            },
        ];
        for case in cases {
            let mut tracker = RestartTracker::new(case.policy.clone(), case.job, case.lifecycle.as_ref(), t0);
            for (i, (at, code, expected)) in case.steps.into_iter().enumerate() {
                let got = tracker.exited(&exit(code), t0 + Duration::from_secs(at), 0.0);
                assert_eq!(got, expected, "{}: step {i}", case.name);
            }
        }
    }

    #[test]
    fn jitter_adds_at_most_a_quarter_of_the_delay() {
        let t0 = Instant::now();
        let mut t = RestartTracker::new(policy(5, 60, 4, false), JobType::Service, None, t0);
        assert_eq!(t.exited(&exit(1), t0, 0.5), restart(Duration::from_millis(4500)));
        assert_eq!(t.exited(&exit(1), t0, 1.0), restart(5 * S));
    }

    #[test]
    fn start_errors_fail_at_once_unless_recoverable_and_user_restarts_do_not_count() {
        let t0 = Instant::now();
        let mut t = RestartTracker::new(policy(2, 60, 1, false), JobType::Service, None, t0);
        assert_eq!(t.restart_requested(), Decision::Restart { delay: Duration::ZERO, reason: String::new() });
        assert_eq!(t.count(), 0);
        assert_eq!(t.start_failed(true, t0, 0.0), restart(S));
        assert_eq!(t.start_failed(false, t0, 0.0), Decision::Fail { reason: REASON_UNRECOVERABLE.into() });
    }

    #[test]
    fn signals_are_failures_even_for_batch() {
        let t0 = Instant::now();
        let mut t = RestartTracker::new(policy(1, 60, 1, false), JobType::Batch, None, t0);
        let killed = ExitResult { signal: 9, ..ExitResult::default() };
        assert_eq!(t.exited(&killed, t0, 0.0), restart(S));
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(30 * 60 * S), "30m0s");
        assert_eq!(go_duration(24 * 3600 * S), "24h0m0s");
        assert_eq!(go_duration(15 * S), "15s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }
}
