//! Client-side garbage collection of terminal allocs, as Nomad's client GC (`client/gc.go`):
//! - every `gc_interval`, and whenever an alloc becomes terminal, terminal allocs are destroyed
//!   oldest first while the alloc dir's file system is over `gc_disk_usage_threshold` or
//!   `gc_inode_usage_threshold` percent used, or more than `gc_max_allocs` allocs are kept;
//! - before new allocs start, terminal ones are destroyed until the new ones fit under
//!   `gc_max_allocs` and their ephemeral disk fits in what the file system has left (less the
//!   node's reserved disk);
//! - on request (`/v1/client/gc`, `/v1/client/allocation/<id>/gc`), one or every terminal alloc.
//!
//! At most `gc_parallel_destroys` destroys run at once, whatever asked for them. A destroy runs
//! the alloc runner's destroy hooks (the alloc dir is removed beneath the alloc root, CSI and
//! network state released) and removes the alloc from the local state. The runner stays known
//! until the servers drop the alloc, so its status is still reported; it no longer counts
//! toward `gc_max_allocs`.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::Allocation;
use tokio::sync::Semaphore;

use super::allocrunner::AllocRunner;
use super::http::host_stats::{DiskUsage, disk_usage};
use super::taskrunner::lock;
use super::{Client, ClientInner};

const MIB: u64 = 1024 * 1024;

/// `client { gc_* }`.
#[derive(Debug, Clone, PartialEq)]
pub struct GcConfig {
    /// How often usage is checked (`gc_interval`).
    pub interval: Duration,
    /// Percent of the alloc dir's file system in use above which terminal allocs go.
    pub disk_usage_threshold: f64,
    /// Percent of its inodes in use above which terminal allocs go.
    pub inode_usage_threshold: f64,
    /// Most allocs kept, running or terminal (`gc_max_allocs`).
    pub max_allocs: usize,
    /// Most destroys at once (`gc_parallel_destroys`).
    pub parallel_destroys: usize,
}

impl Default for GcConfig {
    /// Nomad's defaults.
    fn default() -> GcConfig {
        GcConfig {
            interval: Duration::from_secs(60),
            disk_usage_threshold: 80.0,
            inode_usage_threshold: 70.0,
            max_allocs: 50,
            parallel_destroys: 2,
        }
    }
}

impl GcConfig {
    /// A dev agent's: Nomad's `-dev` checks every 10 minutes and only a nearly full disk.
    pub fn dev() -> GcConfig {
        GcConfig { interval: Duration::from_secs(600), disk_usage_threshold: 99.0, inode_usage_threshold: 99.0, ..GcConfig::default() }
    }
}

/// The GC's settings and its destroy slots.
pub(super) struct Collector {
    config: GcConfig,
    /// `client { reserved { disk } }`, bytes: never handed to new allocs.
    reserved_disk: u64,
    destroys: Semaphore,
}

impl Collector {
    pub(super) fn new(config: GcConfig, reserved_disk_mb: i64) -> Collector {
        let destroys = Semaphore::new(config.parallel_destroys.max(1));
        Collector { config, reserved_disk: (reserved_disk_mb.max(0) as u64).saturating_mul(MIB), destroys }
    }
}

/// Why an alloc was not collected.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum GcError {
    /// This client does not run it.
    #[error("Unknown allocation \"{0}\"")]
    UnknownAlloc(String),
    /// Some task of it still runs (or its stop hooks do).
    #[error("alloc {0:?} is not terminal: only allocs whose tasks have all finished are garbage collected")]
    NotTerminal(String),
}

/// Collects one terminal alloc. Collecting one twice is harmless.
pub async fn collect(client: &Client, alloc_id: &str) -> Result<(), GcError> {
    let runner = client.alloc_runner(alloc_id).ok_or_else(|| GcError::UnknownAlloc(alloc_id.to_string()))?;
    if !runner.tasks_finished() {
        return Err(GcError::NotTerminal(alloc_id.to_string()));
    }
    client.inner.gc_destroy(&runner, "forced collection").await;
    Ok(())
}

/// Collects every terminal alloc; returns their IDs, sorted.
pub async fn collect_all(client: &Client) -> Vec<String> {
    let inner = &client.inner;
    let runners = inner.terminal_allocs();
    futures::future::join_all(runners.iter().map(|r| inner.gc_destroy(r, "forced full node collection"))).await;
    let mut ids: Vec<String> = runners.iter().map(|r| r.id().to_string()).collect();
    ids.sort();
    ids
}

impl ClientInner {
    /// Checks usage every `gc_interval` and when an alloc became terminal, until shutdown.
    pub(super) async fn collect_garbage(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.gc.config.interval) => {}
                _ = self.ctx.gc_trigger.notified() => {}
                _ = self.ctx.shutdown.cancelled() => return,
            }
            self.keep_usage_below_threshold().await;
        }
    }

    /// Destroys terminal allocs, oldest first, until no limit is exceeded or none is left.
    async fn keep_usage_below_threshold(&self) {
        let config = &self.gc.config;
        while !self.ctx.shutdown.is_cancelled() {
            let usage = match disk_usage(&self.ctx.alloc_root) {
                Ok(u) => u,
                Err(e) => {
                    tracing::error!(error = %e, "error garbage collecting allocations");
                    return;
                }
            };
            let live = self.live_allocs();
            let (reason, loud) = if usage.used_percent > config.disk_usage_threshold {
                (format!("disk usage of {:.0} is over gc threshold of {:.0}", usage.used_percent, config.disk_usage_threshold), true)
            } else if usage.inodes_used_percent > config.inode_usage_threshold {
                let (used, limit) = (usage.inodes_used_percent, config.inode_usage_threshold);
                (format!("inode usage of {used:.0} is over gc threshold of {limit:.0}"), true)
            } else if live > config.max_allocs {
                // Somewhat over is how a busy node runs: worth a warning only at twice the limit.
                (format!("number of allocations ({live}) is over the limit ({})", config.max_allocs), live >= config.max_allocs * 2)
            } else {
                return;
            };
            let Some(runner) = self.oldest_terminal() else {
                if loud {
                    tracing::warn!(reason, "garbage collection skipped because no terminal allocations");
                } else {
                    tracing::info!(reason, "garbage collection skipped because no terminal allocations");
                }
                return;
            };
            self.gc_destroy(&runner, &reason).await;
        }
    }

    /// Destroys terminal allocs until `added` fit under `gc_max_allocs` and their ephemeral
    /// disk fits on the alloc dir's file system (Nomad's `MakeRoomFor`).
    pub(super) async fn make_room_for(&self, added: &[Allocation]) {
        if added.is_empty() {
            return;
        }
        let config = &self.gc.config;
        let max = config.max_allocs.saturating_sub(added.len());
        while self.live_allocs() > max && !self.ctx.shutdown.is_cancelled() {
            let Some(runner) = self.oldest_terminal() else { break };
            self.gc_destroy(&runner, &format!("new allocations and over max ({})", config.max_allocs)).await;
        }

        let wanted: u64 = added.iter().map(|a| a.allocated_resources.as_ref().map_or(0, |r| r.shared.disk_mb.max(0) as u64) * MIB).sum();
        let usage = disk_usage(&self.ctx.alloc_root).ok();
        if wanted == 0 || usage.is_some_and(|u| wanted < u.available.saturating_sub(self.gc.reserved_disk)) {
            return;
        }
        // Without usage figures, what the destroyed allocs asked for is taken as freed.
        let mut cleared = 0u64;
        let fits = |usage: Option<DiskUsage>, cleared: u64| match usage {
            Some(u) => u.available >= wanted,
            None => cleared >= wanted,
        };
        while !fits(disk_usage(&self.ctx.alloc_root).ok(), cleared) && !self.ctx.shutdown.is_cancelled() {
            let Some(runner) = self.oldest_terminal() else { break };
            let disk_mb = runner.disk_mb();
            self.gc_destroy(&runner, &format!("freeing {disk_mb} MB for new allocations")).await;
            cleared += disk_mb * MIB;
        }
    }

    /// Allocs not destroyed yet, running or terminal.
    fn live_allocs(&self) -> usize {
        lock(&self.allocs).values().filter(|r| !r.is_destroyed()).count()
    }

    /// Terminal allocs not destroyed yet, oldest first.
    fn terminal_allocs(&self) -> Vec<Arc<AllocRunner>> {
        let mut runners: Vec<Arc<AllocRunner>> =
            lock(&self.allocs).values().filter(|r| r.tasks_finished() && !r.is_destroyed()).cloned().collect();
        runners.sort_by_key(|r| r.finished_at());
        runners
    }

    fn oldest_terminal(&self) -> Option<Arc<AllocRunner>> {
        self.terminal_allocs().into_iter().next()
    }

    /// Destroys one alloc in one of the `gc_parallel_destroys` slots.
    async fn gc_destroy(&self, runner: &Arc<AllocRunner>, reason: &str) {
        tracing::info!(alloc_id = %runner.id(), reason, "garbage collecting allocation");
        let _slot = tokio::select! {
            s = self.gc.destroys.acquire() => s,
            _ = self.ctx.shutdown.cancelled() => return,
        };
        runner.destroy().await;
        tracing::debug!(alloc_id = %runner.id(), "alloc garbage collected");
    }
}
