//! Client-side garbage collection of terminal allocs, on request (`/v1/client/gc` and
//! `/v1/client/allocation/<id>/gc`), as Nomad's client GC does for one alloc or for all
//! terminal ones: the alloc runner's destroy hooks run (the alloc dir is removed beneath the
//! alloc root, CSI and network state released) and the alloc leaves the local state. The
//! runner stays known until the servers drop the alloc, so its status is still reported.

use super::Client;

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
    runner.destroy().await;
    Ok(())
}

/// Collects every terminal alloc; returns their IDs, sorted.
pub async fn collect_all(client: &Client) -> Vec<String> {
    let mut ids: Vec<String> =
        client.alloc_ids().into_iter().filter(|id| client.alloc_runner(id).is_some_and(|r| r.tasks_finished())).collect();
    ids.sort();
    let runners: Vec<_> = ids.iter().filter_map(|id| client.alloc_runner(id)).collect();
    futures::future::join_all(runners.iter().map(|r| r.destroy())).await;
    ids
}
