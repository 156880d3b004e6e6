//! `shutdown_delay`: when the alloc stops, waits the group's `shutdown_delay` before the tasks
//! get their kill signal (time for load balancers to drain), unless the stop asked for no delay
//! (`DesiredTransition.NoShutdownDelay`). An agent shutdown does not wait.

use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, PrekillHook};

/// See the module docs.
pub struct ShutdownDelayHook {
    cancel: CancellationToken,
}

impl ShutdownDelayHook {
    /// A hook whose wait ends early when `cancel` fires.
    pub fn new(cancel: CancellationToken) -> ShutdownDelayHook {
        ShutdownDelayHook { cancel }
    }

    /// The delay to wait for `alloc`.
    pub fn delay(alloc: &nomad_proto::Allocation) -> Duration {
        if alloc.desired_transition.no_shutdown_delay == Some(true) {
            return Duration::ZERO;
        }
        let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group));
        let ns = group.and_then(|g| g.shutdown_delay).unwrap_or(0);
        Duration::from_nanos(ns.max(0) as u64)
    }
}

impl AllocHook for ShutdownDelayHook {
    fn name(&self) -> &'static str {
        "shutdown_delay"
    }
    fn prekill(&self) -> Option<&dyn PrekillHook> {
        Some(self)
    }
}

impl PrekillHook for ShutdownDelayHook {
    fn prekill<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<(), AllocHookError>> {
        Box::pin(async move {
            let delay = Self::delay(req.alloc);
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.cancel.cancelled() => {}
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::{Allocation, Job, TaskGroup};

    use super::*;

    fn alloc(delay_ms: i64, no_delay: bool) -> Allocation {
        let job = Job {
            task_groups: vec![TaskGroup { name: "g".into(), shutdown_delay: Some(delay_ms * 1_000_000), ..TaskGroup::default() }],
            ..Job::default()
        };
        let mut a = Allocation { task_group: "g".into(), job: Some(Arc::new(job)), ..Allocation::default() };
        a.desired_transition.no_shutdown_delay = no_delay.then_some(true);
        a
    }

    #[tokio::test]
    async fn waits_the_group_delay_unless_told_not_to_or_cancelled() {
        let delay = Duration::from_millis(300);
        let hook = ShutdownDelayHook::new(CancellationToken::new());
        let a = alloc(300, false);
        let req = AllocHookRequest { alloc: &a, alloc_dir: std::path::Path::new("/x"), previous: None };
        let start = std::time::Instant::now();
        PrekillHook::prekill(&hook, &req).await.unwrap();
        assert!(start.elapsed() >= delay);

        let a = alloc(60_000, true);
        let req = AllocHookRequest { alloc: &a, alloc_dir: std::path::Path::new("/x"), previous: None };
        assert_eq!(ShutdownDelayHook::delay(&a), Duration::ZERO, "no_shutdown_delay skips it");
        let start = std::time::Instant::now();
        PrekillHook::prekill(&hook, &req).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(30));

        let cancel = CancellationToken::new();
        cancel.cancel();
        let hook = ShutdownDelayHook::new(cancel);
        let a = alloc(60_000, false);
        let req = AllocHookRequest { alloc: &a, alloc_dir: std::path::Path::new("/x"), previous: None };
        let start = std::time::Instant::now();
        PrekillHook::prekill(&hook, &req).await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(30), "an agent shutdown does not wait");
    }
}
