//! `network`: the group network's namespace (Nomad's `network_hook.go`). Prerun creates it and,
//! when it is new, configures it; the status (interface, address, DNS) is kept in the hook's
//! state, so the restarted agent reports it again without a second CNI ADD. Postrun, once every
//! task is dead, undoes the configuration and removes the namespace.

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::Allocation;

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, PostrunHook, PrerunHook};
use crate::client::network::{AllocNetworkStatus, Mode, NetworkManager};
use crate::client::state::HookState;

/// The hook's state key holding the status JSON.
pub const STATUS_KEY: &str = "status";

/// See the module docs.
pub struct NetworkHook {
    manager: Arc<dyn NetworkManager>,
}

impl NetworkHook {
    /// A hook using `manager`.
    pub fn new(manager: Arc<dyn NetworkManager>) -> NetworkHook {
        NetworkHook { manager }
    }

    fn cleanup(&self, alloc: &Allocation) -> Result<(), AllocHookError> {
        if let Err(e) = blocking(|| self.manager.teardown(&alloc.id)) {
            tracing::error!(alloc = %alloc.id, error = %e, "failed to cleanup network for allocation, resources may have leaked");
        }
        blocking(|| self.manager.destroy(alloc)).map_err(AllocHookError)
    }
}

/// The status a hook state holds.
pub fn status_of(state: &HookState) -> Option<AllocNetworkStatus> {
    state.data.get(STATUS_KEY).and_then(|s| serde_json::from_str(s).ok())
}

/// Runs `f` (which execs plugins and may sleep between tries) without stalling the runtime's
/// other tasks on this worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl AllocHook for NetworkHook {
    fn name(&self) -> &'static str {
        "network"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

impl PrerunHook for NetworkHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> futures::future::BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        Box::pin(std::future::ready(self.prerun_now(req)))
    }
}

impl NetworkHook {
    fn prerun_now(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        let mode = Mode::of_alloc(req.alloc).map_err(AllocHookError)?;
        if mode == Mode::Host {
            return Ok(None);
        }
        let id = &req.alloc.id;
        let created =
            blocking(|| self.manager.create(req.alloc)).map_err(|e| AllocHookError(format!("failed to create network for alloc: {e}")))?;
        // An existing namespace with a recorded setup is the one this agent made before it
        // restarted: no second ADD. One without (a crash mid-setup) is configured now.
        let restored = if created { None } else { self.manager.restored(id) };
        let status = match restored {
            Some(status) => {
                tracing::info!(alloc_id = %id, address = %status.address, "the alloc's network namespace exists: restored its status, no CNI ADD");
                Some(status)
            }
            None => blocking(|| self.manager.setup(req.alloc, mode))
                .map_err(|e| AllocHookError(format!("failed to configure networking for alloc: {e}")))?,
        };
        let mut data = BTreeMap::new();
        if let Some(status) = status {
            data.insert(STATUS_KEY.to_string(), serde_json::to_string(&status).unwrap_or_default());
        }
        Ok(Some(HookState { done: true, data }))
    }
}

impl PostrunHook for NetworkHook {
    fn postrun(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        if Mode::of_alloc(req.alloc).is_ok_and(|m| m == Mode::Host) {
            return Ok(());
        }
        self.cleanup(req.alloc)
    }
}

impl DestroyHook for NetworkHook {
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        // Postrun did this already when the alloc ran here; idempotent.
        if Mode::of_alloc(req.alloc).is_ok_and(|m| m == Mode::Host) {
            return Ok(());
        }
        self.cleanup(req.alloc)
    }
}
