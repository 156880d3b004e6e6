//! `checks`: runs the alloc's Nomad service checks (`client/checks/`), as Nomad's
//! `checks_hook`: prerun starts one observer per check of the group's and tasks' Nomad services
//! (before any task starts; a check fails until its task listens), update diffs the checks by
//! ID, prekill stops them and purges their results. Postrun stops them too (every task is dead,
//! nothing answers any more) and keeps the results until destroy.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, HookEnv, PostrunHook, PrekillHook, PrerunHook, UpdateHook};
use crate::client::checks::CheckStore;
use crate::client::checks::runner::{AllocChecks, NetworkStatusFn, NodeFn};
use crate::client::state::HookState;

/// See the module docs.
pub struct ChecksHook {
    store: Option<Arc<CheckStore>>,
    node: NodeFn,
    network_status: NetworkStatusFn,
    cancel: CancellationToken,
    running: Mutex<Option<AllocChecks>>,
}

impl ChecksHook {
    /// A hook with the agent's check store (none: the hook does nothing).
    pub fn new(env: &HookEnv) -> ChecksHook {
        ChecksHook {
            store: env.nomad_checks.clone(),
            node: env.node.clone(),
            network_status: env.network_status.clone(),
            cancel: env.cancel.clone(),
            running: Mutex::new(None),
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<AllocChecks>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stop(&self) {
        if let Some(checks) = self.running().take() {
            checks.stop();
        }
    }
}

impl AllocHook for ChecksHook {
    fn name(&self) -> &'static str {
        "checks"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn update(&self) -> Option<&dyn UpdateHook> {
        Some(self)
    }
    fn prekill(&self) -> Option<&dyn PrekillHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

impl PrerunHook for ChecksHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        // Made even without checks now: an update may bring some.
        if let Some(store) = &self.store {
            let mut running = self.running();
            let checks = running.get_or_insert_with(|| {
                let alloc = Arc::new(req.alloc.clone());
                AllocChecks::new(alloc, store.clone(), self.node.clone(), self.network_status.clone(), self.cancel.child_token())
            });
            checks.sync(Arc::new(req.alloc.clone()));
        }
        // Never done: a restarted agent starts the observers again (results are restored).
        Box::pin(std::future::ready(Ok(None)))
    }
}

impl UpdateHook for ChecksHook {
    fn update(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        if let Some(checks) = self.running().as_ref() {
            checks.sync(Arc::new(req.alloc.clone()));
        }
        Ok(())
    }
}

impl PrekillHook for ChecksHook {
    fn prekill<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<(), AllocHookError>> {
        self.stop();
        if let Some(store) = &self.store {
            store.purge(&req.alloc.id);
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

impl PostrunHook for ChecksHook {
    fn postrun(&self, _req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop();
        Ok(())
    }
}

impl DestroyHook for ChecksHook {
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop();
        if let Some(store) = &self.store {
            store.purge(&req.alloc.id);
        }
        Ok(())
    }
}
