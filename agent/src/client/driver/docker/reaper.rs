//! Dangling containers: ours by label (this agent's alloc root), running, older than the
//! creation grace, and tracked by no task of this agent. Removed (or only logged on dry_run).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::ListContainersOptions;

use super::container::{self, ALLOC_ID_LABEL, ALLOC_ROOT_LABEL};

/// One pass: the IDs of the containers it removed (or would have, on `dry_run`).
pub async fn reap_once(
    docker: &Docker,
    alloc_root: &str,
    tracked: &Mutex<BTreeSet<String>>,
    grace: Duration,
    dry_run: bool,
) -> Result<Vec<String>, bollard::errors::Error> {
    let filters: HashMap<String, Vec<String>> =
        [("label".to_string(), vec![ALLOC_ID_LABEL.to_string(), format!("{ALLOC_ROOT_LABEL}={alloc_root}")])].into();
    let running = docker.list_containers(Some(ListContainersOptions { all: false, filters: Some(filters), ..Default::default() })).await?;
    let now = nomad_proto::Timestamp::now().unix_secs();
    let mut reaped = Vec::new();
    for c in running {
        let Some(id) = c.id else { continue };
        let age = now - c.created.unwrap_or(now);
        if age < grace.as_secs() as i64 || tracked.lock().unwrap_or_else(|p| p.into_inner()).contains(&id) {
            continue;
        }
        if dry_run {
            tracing::info!(container = %id, "dangling docker container (dry run: kept)");
        } else {
            tracing::info!(container = %id, "removing a dangling docker container");
            if let Err(e) = container::remove(docker, &id).await {
                tracing::warn!(container = %id, error = %e, "removing a dangling docker container");
                continue;
            }
        }
        reaped.push(id);
    }
    Ok(reaped)
}

/// Runs passes every `period`, the first after max(period, grace).
pub fn spawn(docker: Docker, alloc_root: String, tracked: Arc<Mutex<BTreeSet<String>>>, period: Duration, grace: Duration, dry_run: bool) {
    tokio::spawn(async move {
        tokio::time::sleep(period.max(grace)).await;
        loop {
            if let Err(e) = reap_once(&docker, &alloc_root, &tracked, grace, dry_run).await {
                tracing::debug!(error = %e, "dangling container pass skipped");
            }
            tokio::time::sleep(period).await;
        }
    });
}
