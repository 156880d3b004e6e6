//! Waiting for a condition: poll it, fail with what was awaited once a deadline passes.
//!
//! The async forms use tokio's clock, so they also work in tests with paused time (each poll
//! advances the virtual clock by the poll interval only).

use std::fmt;
use std::time::{Duration, Instant};

/// How long any condition may take before a test fails: generous, for a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Between two polls of an async condition.
const POLL: Duration = Duration::from_millis(5);

/// Polls `condition` until it holds; panics after [`DEADLINE`] naming `what`.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    wait_for(what, || condition().then_some(())).await
}

/// Polls `f` until it returns `Some`; panics after [`DEADLINE`] naming `what`.
pub async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {DEADLINE:?} waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// A condition that did not hold in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// What was awaited.
    pub what: String,
    /// How long.
    pub timeout: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "timed out after {:?} waiting for {}", self.timeout, self.what)
    }
}

impl std::error::Error for TimedOut {}

/// Polls `f` on this thread (10 ms, backing off to 200 ms) until it returns `Some` or `timeout`
/// passes: for tests that drive other processes without a runtime.
pub fn wait_for_blocking<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T, TimedOut> {
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(10);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(TimedOut { what: what.to_string(), timeout });
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wait_for_returns_the_value_once_there() {
        let mut polls = 0;
        let v = wait_for("the third poll", || {
            polls += 1;
            (polls == 3).then_some("ready")
        })
        .await;
        assert_eq!((v, polls), ("ready", 3));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 30s waiting for something that never happens")]
    async fn wait_until_fails_after_the_deadline() {
        wait_until("something that never happens", || false).await;
    }

    #[test]
    fn the_blocking_form_says_what_it_waited_for() {
        let e = wait_for_blocking("nothing", Duration::from_millis(30), || None::<()>).unwrap_err();
        assert_eq!(e.to_string(), "timed out after 30ms waiting for nothing");
        let mut n = 0;
        assert_eq!(
            wait_for_blocking("n", DEADLINE, || {
                n += 1;
                (n > 2).then_some(n)
            }),
            Ok(3)
        );
    }
}
