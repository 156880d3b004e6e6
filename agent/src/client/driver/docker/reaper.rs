//! Dangling containers: ours by label (this agent's alloc root), running, older than the
//! creation grace, and tracked by no task of this agent. Removed (or only logged on dry_run).
//!
//! An infra container is also kept while its alloc's network namespace is mounted under the
//! netns dir: a restarted agent does not make the namespaces of its running allocs again, so it
//! knows their infra containers only that way. One whose namespace is gone was orphaned (the
//! agent died between the two removals, or lost its state) and is reaped.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::ListContainersOptions;

use super::container::{self, ALLOC_ID_LABEL, ALLOC_ROOT_LABEL};
use super::network::infra_alloc_id;
use crate::client::network::netns::is_netns;

/// One pass: the IDs of the containers it removed (or would have, on `dry_run`).
pub async fn reap_once(docker: &Docker, scope: &Scope, grace: Duration, dry_run: bool) -> Result<Vec<String>, bollard::errors::Error> {
    let Scope { alloc_root, tracked, netns_dir } = scope;
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
        let infra_of = c.names.iter().flatten().find_map(|n| infra_alloc_id(n));
        if infra_of.is_some_and(|alloc_id| is_netns(&netns_dir.join(alloc_id))) {
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

/// What a pass looks at besides the Engine.
pub struct Scope {
    /// This agent's alloc root (the containers' label).
    pub alloc_root: String,
    /// Containers of tasks and infra containers this agent made or recovered.
    pub tracked: Arc<Mutex<BTreeSet<String>>>,
    /// Where the allocs' network namespaces are mounted.
    pub netns_dir: PathBuf,
}

/// Runs passes every `period`, the first after max(period, grace).
pub fn spawn(docker: Docker, scope: Scope, period: Duration, grace: Duration, dry_run: bool) {
    tokio::spawn(async move {
        tokio::time::sleep(period.max(grace)).await;
        loop {
            if let Err(e) = reap_once(&docker, &scope, grace, dry_run).await {
                tracing::debug!(error = %e, "dangling container pass skipped");
            }
            tokio::time::sleep(period).await;
        }
    });
}
