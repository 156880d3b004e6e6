//! The volume watcher (Nomad's `nomad/volumewatcher`): on the leader, releases the past claims
//! of every volume, so claims whose client never reported (a node that died, an alloc that was
//! lost or collected, a plugin that failed mid-unpublish) are freed by the servers.
//!
//! It sees the cluster only through [`VolumeWatchHandle`]: a wait for changes to the volumes
//! table, the volumes that have past claims (denormalized), and the release of one claim (the
//! servers' one walk, resuming from the stored claim's checkpoint). A volume is reaped when it
//! changed since it was last looked at (the claim GC writes a claim that changes nothing but
//! the volume's index, precisely to get here) and, after a failed reap, again on a timer with
//! backoff, so a plugin that comes back finishes the release without any other write. Reaps of
//! different volumes run side by side (at most [`VolumeWatcherConfig::parallel`]); one volume's
//! claims are released one after the other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::NamespacedId;
use nomad_proto::csi::{CsiVolume, CsiVolumeClaim};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::consensus::BoxFuture;

/// What the volume watcher may do, and nothing else.
pub trait VolumeWatchHandle: Send + Sync + 'static {
    /// Returns once the volumes table's index is above `index`, or after `wait`.
    fn wait_for_volumes(&self, index: u64, wait: Duration) -> BoxFuture<'_, ()>;
    /// Every volume with past claims, denormalized (finished or collected allocs' claims are
    /// past claims in `unpublishing`), and the volumes table's index they were read at.
    fn volumes_with_past_claims(&self) -> (Vec<CsiVolume>, u64);
    /// Releases one claim of a volume, resuming at the claim's checkpoint (`CSIVolume.Unpublish`
    /// as the servers run it).
    fn release(&self, namespace: &str, volume_id: &str, claim: CsiVolumeClaim) -> BoxFuture<'_, Result<(), String>>;
}

/// Watcher settings.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeWatcherConfig {
    /// First retry after a failed reap.
    pub retry_min: Duration,
    /// Longest wait between retries.
    pub retry_max: Duration,
    /// Volumes reaped at once.
    pub parallel: usize,
}

impl Default for VolumeWatcherConfig {
    fn default() -> Self {
        VolumeWatcherConfig { retry_min: Duration::from_secs(2), retry_max: Duration::from_secs(120), parallel: 16 }
    }
}

impl VolumeWatcherConfig {
    /// The wait before retry number `failures` (1 = after the first failure).
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.saturating_sub(1).min(31)).unwrap_or(u32::MAX);
        self.retry_min.saturating_mul(factor).min(self.retry_max)
    }
}

/// What the watcher remembers of one volume.
#[derive(Debug, Default)]
struct Tracked {
    /// The volume's index when it was last reaped (or seen finishing a reap): a higher one is a
    /// change to react to.
    seen_index: u64,
    /// A reap of it is running.
    running: bool,
    /// A reap just finished: take the volume's index (its own checkpoints) as seen.
    finished: bool,
    /// Failed reaps in a row.
    failures: u32,
    /// When to retry after a failure.
    retry_at: Option<Instant>,
}

/// The watcher of one term of leadership.
pub struct VolumeWatcher {
    handle: Arc<dyn VolumeWatchHandle>,
    config: VolumeWatcherConfig,
}

impl VolumeWatcher {
    /// A watcher over `handle`.
    pub fn new(handle: Arc<dyn VolumeWatchHandle>, config: VolumeWatcherConfig) -> VolumeWatcher {
        VolumeWatcher { handle, config }
    }

    /// Runs until dropped (leadership lost).
    pub async fn run(self) {
        let mut tracked: HashMap<NamespacedId, Tracked> = HashMap::new();
        let mut reaps: JoinSet<(NamespacedId, Result<(), String>)> = JoinSet::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(self.config.parallel.max(1)));
        // Volumes changed above this index are new work; 0: everything is, at the start of a term.
        let mut table_seen = 0u64;
        loop {
            let (volumes, index) = self.handle.volumes_with_past_claims();
            let now = Instant::now();
            let mut listed = std::collections::HashSet::new();
            for vol in volumes {
                let key = NamespacedId::new(&vol.namespace, &vol.id);
                listed.insert(key.clone());
                let t = tracked.entry(key.clone()).or_insert_with(|| Tracked { seen_index: table_seen, ..Tracked::default() });
                if t.running {
                    continue;
                }
                if std::mem::take(&mut t.finished) {
                    t.seen_index = vol.modify_index;
                }
                let changed = vol.modify_index > t.seen_index;
                let retry_due = t.retry_at.is_some_and(|at| at <= now);
                if !changed && !retry_due {
                    continue;
                }
                t.seen_index = vol.modify_index;
                t.running = true;
                let handle = self.handle.clone();
                let slots = slots.clone();
                reaps.spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let result = reap(&*handle, &vol).await;
                    (key, result)
                });
            }
            // Volumes without past claims left (freed, deleted) are forgotten.
            tracked.retain(|k, t| t.running || listed.contains(k));
            table_seen = index;

            let next_retry = tracked.values().filter(|t| !t.running).filter_map(|t| t.retry_at).min();
            let wait = next_retry.map_or(Duration::from_secs(3600), |at| at.saturating_duration_since(Instant::now()));
            tokio::select! {
                _ = self.handle.wait_for_volumes(index, wait) => {}
                Some(done) = reaps.join_next(), if !reaps.is_empty() => {
                    let Ok((key, result)) = done else { continue };
                    let Some(t) = tracked.get_mut(&key) else { continue };
                    t.running = false;
                    t.finished = true;
                    match result {
                        Ok(()) => {
                            t.failures = 0;
                            t.retry_at = None;
                        }
                        Err(e) => {
                            t.failures = t.failures.saturating_add(1);
                            let delay = self.config.backoff(t.failures);
                            t.retry_at = Some(Instant::now() + delay);
                            tracing::error!(volume_id = %key.id, namespace = %key.namespace, error = %e, retry_in = ?delay, "error releasing volume claims");
                        }
                    }
                }
            }
        }
    }
}

/// Releases every past claim of `vol` (`volumeReapImpl`), sending each as stored so its release
/// resumes from its checkpoint. Every claim is tried; the errors are joined.
async fn reap(handle: &dyn VolumeWatchHandle, vol: &CsiVolume) -> Result<(), String> {
    let mut errs = Vec::new();
    for claim in vol.past_claims.values() {
        if let Err(e) = handle.release(&vol.namespace, &vol.id, claim.clone()).await {
            errs.push(format!("alloc {}: {e}", claim.allocation_id));
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(errs.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = VolumeWatcherConfig { retry_min: Duration::from_secs(2), retry_max: Duration::from_secs(60), parallel: 1 };
        let waits: Vec<u64> = (1..=7).map(|n| c.backoff(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(c.backoff(u32::MAX), Duration::from_secs(60));
    }
}
