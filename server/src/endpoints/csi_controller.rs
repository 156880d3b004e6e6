//! Reaching a CSI plugin's controller (Nomad's `ClientCSI` routing, `nomad/client_csi_endpoint.go`,
//! and `serializedControllerRPC`, `nomad/csi_endpoint.go`).
//!
//! A controller RPC goes to a Ready node running a healthy controller instance of the plugin,
//! the candidates shuffled; a node that cannot take it (no path to it, no local controller:
//! `CSI client error (retryable)`, `Unknown node`) passes it on to the next. One controller RPC
//! per plugin is in flight at a time from this server, as Nomad keeps them (plugins in the wild
//! race when asked to attach two volumes to one host at once).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use nomad_proto::NodeStatus;
use rand::seq::SliceRandom as _;

use super::Endpoints;
use crate::csi::ClientCallError;
use crate::state::State;

/// Nomad's `ErrCSIClientRPCRetryable`: the caller may try again (another node, or later).
pub const CSI_CLIENT_RETRYABLE: &str = "CSI client error (retryable)";

/// Nomad's `ErrUnknownNodePrefix`.
pub const UNKNOWN_NODE: &str = "Unknown node";

/// One lock per plugin: the controller RPCs of a plugin go one at a time.
#[derive(Clone, Default)]
pub(crate) struct ControllerLocks(Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>);

impl ControllerLocks {
    fn of(&self, plugin_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Plugins nobody holds or waits for take no memory (plugin IDs come from requests).
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(plugin_id.to_string()).or_default().clone()
    }

    /// Waits for `plugin_id`'s turn; the turn ends when the guard drops.
    pub(crate) async fn turn(&self, plugin_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        self.of(plugin_id).lock_owned().await
    }
}

/// Whether a failed controller call may be passed on to the next controller node.
pub fn passes_on(e: &ClientCallError) -> bool {
    match e {
        ClientCallError::NoPath { .. } => true,
        ClientCallError::Failed(m) => m.contains(CSI_CLIENT_RETRYABLE) || m.contains(UNKNOWN_NODE),
        ClientCallError::Timeout { .. } => false,
    }
}

/// The nodes a controller RPC of `plugin_id` may go to (`clientIDsForController`): Ready nodes
/// with a healthy controller instance, in random order; or why there are none.
pub fn controller_nodes(state: &State, plugin_id: &str) -> Result<Vec<String>, String> {
    if plugin_id.is_empty() {
        return Err("missing plugin ID".into());
    }
    let plugin = state.csi_plugin(plugin_id).ok_or_else(|| format!("plugin missing: {plugin_id}"))?;
    if plugin.controllers.is_empty() {
        return Err(format!("failed to find instances of controller plugin {plugin_id:?}"));
    }
    let mut nodes = Vec::new();
    let mut why = Vec::new();
    for (node_id, controller) in &plugin.controllers {
        if !controller.healthy {
            why.push(format!("plugin instance {:?} is not healthy", controller.alloc_id));
            continue;
        }
        match state.node(node_id) {
            None => why.push(format!("cannot find node {node_id:?} for plugin instance {:?}", controller.alloc_id)),
            Some(n) if n.status != NodeStatus::Ready => {
                why.push(format!("node {node_id:?} for plugin instance {:?} is not ready", controller.alloc_id))
            }
            Some(_) => nodes.push(node_id.clone()),
        }
    }
    if nodes.is_empty() {
        return Err(format!("failed to find clients running controller plugin {plugin_id:?}: {}", why.join("; ")));
    }
    nodes.shuffle(&mut rand::rng());
    Ok(nodes)
}

impl Endpoints {
    /// Runs `call` against the controller nodes of `plugin_id` in turn (see the module docs)
    /// until one answers or fails in a way the next would too; one such run per plugin at a time.
    pub(crate) async fn call_controller<T, F, Fut>(&self, plugin_id: &str, mut call: F) -> Result<T, ClientCallError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<T, ClientCallError>>,
    {
        let _turn = self.controller_locks.turn(plugin_id).await;
        let nodes = controller_nodes(&self.store.snapshot(), plugin_id).map_err(ClientCallError::Failed)?;
        let mut last = None;
        for node_id in nodes {
            match call(node_id.clone()).await {
                Ok(v) => return Ok(v),
                Err(e) if passes_on(&e) => {
                    tracing::debug!(plugin_id, node_id, error = %e, "controller could not take the call; trying the next");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientCallError::Failed(format!("no controller of plugin {plugin_id:?} answered"))))
    }
}

#[cfg(test)]
mod tests {
    use super::ControllerLocks;

    #[tokio::test]
    async fn controller_calls_take_turns_per_plugin() {
        let calls = ControllerLocks::default();
        let first = calls.turn("p").await;
        // Another plugin is not held up.
        drop(calls.turn("q").await);
        let mut second = Box::pin(calls.turn("p"));
        assert!(futures::poll!(&mut second).is_pending(), "p's second caller waits for the first");
        drop(first);
        drop(second.await);
        let _r = calls.turn("r").await;
        assert_eq!(calls.0.lock().unwrap().keys().collect::<Vec<_>>(), ["r"], "unused plugins are forgotten");
    }
}
