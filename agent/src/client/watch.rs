//! The alloc watch: a blocking `Node.GetClientAllocs` tells which allocs the node has and their
//! `AllocModifyIndex`; the ones that are new or changed are pulled with `Alloc.GetAllocs`; the
//! result is diffed against the running alloc runners into removals, updates and additions.
//!
//! The first query is a consistent read (`MinQueryIndex` 0); each next one blocks until the
//! servers' index passes the last one seen. A failed query is retried after 30-60 s, or as soon
//! as another call (a heartbeat) gets an answer. After the first complete pass the client counts the
//! servers as contacted, and only then does the syncer send anything.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nomad_proto::Allocation;
use nomad_proto::rpc::{AllocsGetRequest, NodeSpecificRequest};

use super::ClientInner;
use super::heartbeat::{retry_base, stagger};

/// Base of the retry interval after a failed query.
pub const GET_ALLOC_RETRY: Duration = Duration::from_secs(30);

/// What changed between the runners and the servers' view.
#[derive(Debug, Default, PartialEq)]
pub struct Diff {
    /// Runners whose alloc the servers no longer have (garbage collected).
    pub removed: Vec<String>,
    /// Pulled allocs that have a runner.
    pub updated: Vec<Allocation>,
    /// Pulled allocs without a runner.
    pub added: Vec<Allocation>,
}

/// Alloc IDs to pull: new, or with a higher `AllocModifyIndex` than the runner's copy.
pub fn to_pull(known: &BTreeMap<String, u64>, server: &BTreeMap<String, u64>, invalid: &BTreeSet<String>) -> Vec<String> {
    server
        .iter()
        .filter(|(id, index)| !invalid.contains(*id) && known.get(*id).is_none_or(|k| *index > k))
        .map(|(id, _)| id.clone())
        .collect()
}

/// Sorts pulled allocs into updates and additions, and finds the runners to remove.
pub fn diff(known: &BTreeMap<String, u64>, server: &BTreeMap<String, u64>, pulled: Vec<Allocation>) -> Diff {
    let removed = known.keys().filter(|id| !server.contains_key(*id)).cloned().collect();
    let (updated, added) = pulled.into_iter().partition(|a| known.contains_key(&a.id));
    Diff { removed, updated, added }
}

/// Longest a blocking query may wait before the client gives up on it.
const QUERY_SLACK: Duration = Duration::from_secs(30);

impl ClientInner {
    /// Watches the node's allocs until the agent shuts down.
    pub(super) async fn watch_allocations(self: Arc<Self>) {
        let mut index = 0u64;
        // The servers answer "node not found" until the node has registered.
        let mut registered = self.registered.subscribe();
        tokio::select! {
            _ = registered.wait_for(|n| *n > 0) => {}
            _ = self.ctx.shutdown.cancelled() => return,
        }
        loop {
            let req = NodeSpecificRequest {
                node_id: self.identity.node_id.clone(),
                secret_id: self.identity.secret_id.clone(),
                min_query_index: index,
                max_query_time: self.config.max_query_time.as_nanos() as i64,
            };
            let timeout = self.config.max_query_time + QUERY_SLACK;
            let result = tokio::select! {
                r = self.servers.node(timeout, |mut c| async move { c.get_client_allocs(req).await }) => r,
                _ = self.ctx.shutdown.cancelled() => return,
            };
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let wait = retry_base(GET_ALLOC_RETRY, self.config.dev_mode);
                    tracing::warn!(error = %e, retry_in = ?wait, "watching allocs failed");
                    if e.is_node_not_found() {
                        // The heartbeat loop registers again; go on as soon as it has.
                        registered.borrow_and_update();
                        tokio::select! {
                            _ = registered.changed() => {}
                            _ = tokio::time::sleep(wait) => {}
                            _ = self.ctx.shutdown.cancelled() => return,
                        }
                    } else if !self.pause_unless_answered(wait).await {
                        return;
                    }
                    continue;
                }
            };
            if resp.index <= index && *self.servers_contacted.borrow() {
                continue;
            }
            let known = self.known_allocs();
            let invalid = self.invalid_allocs.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let pull = to_pull(&known, &resp.allocs, &invalid);
            let mut pulled = Vec::new();
            if !pull.is_empty() {
                let max_index = pull.iter().filter_map(|id| resp.allocs.get(id)).max().copied().unwrap_or(0);
                let req = AllocsGetRequest {
                    alloc_ids: pull.clone(),
                    node_id: self.identity.node_id.clone(),
                    secret_id: self.identity.secret_id.clone(),
                    min_query_index: max_index.saturating_sub(1),
                    max_query_time: self.config.max_query_time.as_nanos() as i64,
                };
                let got = tokio::select! {
                    r = self.servers.alloc(timeout, |mut c| async move { c.get_allocs(req).await }) => r,
                    _ = self.ctx.shutdown.cancelled() => return,
                };
                match got {
                    Ok(got) if got.allocs.len() == pull.len() => pulled = got.allocs,
                    Ok(got) => {
                        // A stale server: wait for it to catch up and ask again.
                        let wait = if self.config.dev_mode {
                            Duration::from_millis(200)
                        } else {
                            Duration::from_secs(2) + stagger(Duration::from_secs(2))
                        };
                        tracing::debug!(wanted = pull.len(), got = got.allocs.len(), "pulled fewer allocs than asked for");
                        if !self.pause(wait).await {
                            return;
                        }
                        continue;
                    }
                    Err(e) => {
                        let wait = retry_base(GET_ALLOC_RETRY, self.config.dev_mode);
                        tracing::warn!(error = %e, retry_in = ?wait, "pulling allocs failed");
                        if !self.pause_unless_answered(wait).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            self.stats.alloc_pulls.fetch_add(1, Ordering::Relaxed);
            index = resp.index;
            let d = diff(&known, &resp.allocs, pulled);
            self.run_allocs(d).await;
            self.servers_contacted.send_replace(true);
        }
    }

    /// Sleeps unless the agent shuts down first (`false`).
    async fn pause(&self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = self.ctx.shutdown.cancelled() => false,
        }
    }

    /// Like [`ClientInner::pause`], but ends early once another call gets an answer (the
    /// servers are reachable again after a partition).
    async fn pause_unless_answered(&self, d: Duration) -> bool {
        let mut answered = self.servers.answers();
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            r = answered.changed() => r.is_ok(),
            _ = self.ctx.shutdown.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
        list.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn pulls_new_and_changed_allocs_only() {
        let known = idx(&[("a", 5), ("b", 7)]);
        let server = idx(&[("a", 5), ("b", 9), ("c", 1), ("d", 2)]);
        let invalid = BTreeSet::from(["d".to_string()]);
        assert_eq!(to_pull(&known, &server, &invalid), ["b", "c"]);
    }

    #[test]
    fn diff_sorts_removals_updates_and_additions() {
        let known = idx(&[("a", 5), ("b", 7), ("gone", 3)]);
        let server = idx(&[("a", 5), ("b", 9), ("c", 1)]);
        let pulled = vec![Allocation { id: "b".into(), ..Allocation::default() }, Allocation { id: "c".into(), ..Allocation::default() }];
        let d = diff(&known, &server, pulled);
        assert_eq!(d.removed, ["gone"]);
        assert_eq!(d.updated.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["b"]);
        assert_eq!(d.added.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["c"]);
    }
}
