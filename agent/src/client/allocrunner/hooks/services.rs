//! `services`: registers the alloc's Nomad-native services (`provider = "nomad"`) with the
//! servers, and removes them, as Nomad's `group_service_hook` and the task runner's
//! `service_hook` do.
//!
//! - Group services are registered from prerun on, as long as the alloc runs.
//! - Task services are registered while their task is `running`, removed when it stops
//!   (`ServiceRegistration.DeleteByID`), and registered again after a restart.
//! - Prekill (the alloc stops) removes everything (`DeleteByAlloc`) and waits for that first
//!   attempt, so this hook sits before `shutdown_delay`: services are gone first, then the delay
//!   lets traffic drain. Postrun and destroy remove everything too (idempotent).
//!
//! Task services are handled here rather than in a task-runner hook because task hooks are
//! synchronous, local and per run, while registering is network I/O that must outlive a failed
//! call: one background worker per alloc watches the task states this alloc hook already gets
//! (`HookEnv::task_states`), computes the registrations wanted now ([`build`]) and brings the
//! servers there. A restored agent gets the same behaviour for free: the restored task states say
//! which tasks run, and Upsert is idempotent.
//!
//! A failed call never fails the alloc: the worker logs it (with the service names) and tries
//! again after a backoff of 1 s doubling to 30 s, or at once when another call to the servers
//! gets an answer (a client coming back from a partition), until it succeeds, the alloc stops
//! or the agent shuts down. An agent shutdown leaves registrations in place (the tasks keep
//! running). The hook's persisted state only records that registrations may exist, so a
//! restored alloc also removes task services of tasks that stopped while the agent was away.
//! A heartbeat answered `initializing` (a node coming back, perhaps from `down`, whose
//! registrations the servers deleted) makes every worker register its services again.
//!
//! Consul services (`provider = "consul"`, the default) follow the same task states: the worker
//! hands what the alloc wants now ([`build_consul`]) to the agent's Consul sync
//! (`client/consul/sync.rs`), which makes the calls, retries and reconciles; at the stop it
//! drops the alloc from the sync and waits (at most 10 s) for the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_proto::alloc::task_state;
use nomad_proto::{Allocation, Node, ServiceRegistration, TaskState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{AllocHook, AllocHookError, AllocHookRequest, DestroyHook, HookEnv, PostrunHook, PrekillHook, PrerunHook, UpdateHook};
use crate::client::consul::services::{build_consul, has_consul_services};
use crate::client::consul::sync::ConsulServices;
use crate::client::services::{RegistrarError, ServiceRegistrar, Which, build, has_nomad_services};
use crate::client::state::HookState;

/// First retry delay after a failed call.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest retry delay.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Longest prekill waits for the first Consul sync pass after the alloc's services were dropped.
const CONSUL_DEREGISTER_WAIT: Duration = Duration::from_secs(10);

/// The node as last registered.
pub type NodeFn = Arc<dyn Fn() -> Arc<Node> + Send + Sync>;

/// See the module docs.
pub struct ServicesHook {
    registrar: Arc<dyn ServiceRegistrar>,
    consul: Option<Arc<ConsulServices>>,
    node: NodeFn,
    region: String,
    task_states: watch::Receiver<BTreeMap<String, TaskState>>,
    shutdown: CancellationToken,
    worker: Mutex<Option<WorkerHandle>>,
    prerun_ran: std::sync::atomic::AtomicBool,
}

/// The hook's side of a running worker.
struct WorkerHandle {
    alloc: watch::Sender<Arc<Allocation>>,
    stopping: watch::Sender<bool>,
    /// Deregistration attempts made since the stop; closed when the worker ends.
    stop_attempts: watch::Receiver<u64>,
}

impl ServicesHook {
    /// A hook registering through `env.registrar`.
    pub fn new(env: &HookEnv) -> ServicesHook {
        ServicesHook {
            registrar: env.registrar.clone(),
            consul: env.consul.clone(),
            node: env.node.clone(),
            region: env.region.clone(),
            task_states: env.task_states.clone(),
            shutdown: env.shutdown.clone(),
            worker: Mutex::new(None),
            prerun_ran: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the alloc has services this hook registers.
    fn has_services(&self, alloc: &Allocation) -> bool {
        has_nomad_services(alloc) || (self.consul.is_some() && has_consul_services(alloc))
    }

    /// Starts the worker for `alloc` unless one runs. `may_exist`: registrations from an
    /// earlier run may be on the servers.
    fn start(&self, alloc: &Allocation, may_exist: bool, stopping: bool) {
        let mut slot = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return;
        }
        let (alloc_tx, alloc_rx) = watch::channel(Arc::new(alloc.clone()));
        let (stopping_tx, stopping_rx) = watch::channel(stopping);
        let (attempts_tx, attempts_rx) = watch::channel(0);
        let maybe: BTreeMap<String, String> = if may_exist && has_nomad_services(alloc) {
            build(alloc, &(self.node)(), &self.region, Which::All)
                .registrations
                .into_values()
                .map(|r| (r.id, r.namespace))
                .chain(std::iter::once((String::new(), String::new())))
                .collect()
        } else {
            BTreeMap::new()
        };
        let worker = Worker {
            registrar: self.registrar.clone(),
            consul: self.consul.clone(),
            consul_removed: false,
            node: self.node.clone(),
            region: self.region.clone(),
            alloc_id: alloc.id.clone(),
            alloc: alloc_rx,
            stopping: stopping_rx,
            task_states: self.task_states.clone(),
            resyncs: self.registrar.resyncs(),
            shutdown: self.shutdown.clone(),
            attempts: attempts_tx,
            registered: BTreeMap::new(),
            // The empty ID stands for "anything else of this alloc" until a DeleteByAlloc ran.
            maybe,
            reported: BTreeSet::new(),
        };
        tokio::spawn(worker.run());
        *slot = Some(WorkerHandle { alloc: alloc_tx, stopping: stopping_tx, stop_attempts: attempts_rx });
    }

    /// Tells the worker the alloc stops; returns the attempts receiver to wait on, with the
    /// count before the stop.
    fn stop(&self, req: &AllocHookRequest<'_>) -> Option<(watch::Receiver<u64>, u64)> {
        {
            let slot = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = slot.as_ref() {
                let rx = w.stop_attempts.clone();
                let before = *rx.borrow();
                w.stopping.send_replace(true);
                return Some((rx, before));
            }
        }
        // No worker in this process: registrations exist only if an earlier run made some.
        if req.previous.is_some() {
            self.start(req.alloc, true, true);
            let slot = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            return slot.as_ref().map(|w| (w.stop_attempts.clone(), 0));
        }
        None
    }
}

impl AllocHook for ServicesHook {
    fn name(&self) -> &'static str {
        "services"
    }
    fn prerun(&self) -> Option<&dyn PrerunHook> {
        Some(self)
    }
    fn prekill(&self) -> Option<&dyn PrekillHook> {
        Some(self)
    }
    fn update(&self) -> Option<&dyn UpdateHook> {
        Some(self)
    }
    fn postrun(&self) -> Option<&dyn PostrunHook> {
        Some(self)
    }
    fn destroy(&self) -> Option<&dyn DestroyHook> {
        Some(self)
    }
}

impl PrerunHook for ServicesHook {
    fn prerun<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<Option<HookState>, AllocHookError>> {
        Box::pin(std::future::ready(self.prerun_now(req)))
    }
}

impl ServicesHook {
    fn prerun_now(&self, req: &AllocHookRequest<'_>) -> Result<Option<HookState>, AllocHookError> {
        self.prerun_ran.store(true, std::sync::atomic::Ordering::SeqCst);
        if !self.has_services(req.alloc) {
            return Ok(None);
        }
        self.start(req.alloc, req.previous.is_some(), false);
        Ok(Some(HookState { done: false, data: BTreeMap::from([("registered".to_string(), "true".to_string())]) }))
    }
}

impl PrekillHook for ServicesHook {
    fn prekill<'a>(&'a self, req: &'a AllocHookRequest<'a>) -> BoxFuture<'a, Result<(), AllocHookError>> {
        let waiting = self.stop(req);
        let shutdown = self.shutdown.clone();
        Box::pin(async move {
            // Wait for the first deregistration attempt (a failed one goes on in the background).
            if let Some((mut rx, before)) = waiting {
                tokio::select! {
                    _ = rx.wait_for(|n| *n > before) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
            Ok(())
        })
    }
}

impl UpdateHook for ServicesHook {
    fn update(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        {
            let slot = self.worker.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = slot.as_ref() {
                w.alloc.send_replace(Arc::new(req.alloc.clone()));
                return Ok(());
            }
        }
        // An in-place update that brings the alloc's first Nomad services.
        if self.prerun_ran.load(std::sync::atomic::Ordering::SeqCst) && !req.alloc.terminal() && self.has_services(req.alloc) {
            self.start(req.alloc, false, false);
        }
        Ok(())
    }
}

impl PostrunHook for ServicesHook {
    fn postrun(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop(req);
        Ok(())
    }
}

impl DestroyHook for ServicesHook {
    fn destroy(&self, req: &AllocHookRequest<'_>) -> Result<(), AllocHookError> {
        self.stop(req);
        Ok(())
    }
}

/// The background worker of one alloc: brings the servers' registrations to what the alloc
/// wants now.
struct Worker {
    registrar: Arc<dyn ServiceRegistrar>,
    /// The Consul sync this alloc's Consul services go to (it makes the calls and retries).
    consul: Option<Arc<ConsulServices>>,
    /// The alloc's Consul services were dropped from the sync.
    consul_removed: bool,
    node: NodeFn,
    region: String,
    alloc_id: String,
    alloc: watch::Receiver<Arc<Allocation>>,
    stopping: watch::Receiver<bool>,
    task_states: watch::Receiver<BTreeMap<String, TaskState>>,
    /// Changes when the servers may have dropped the registrations: register everything again.
    resyncs: watch::Receiver<u64>,
    shutdown: CancellationToken,
    attempts: watch::Sender<u64>,
    /// What the servers are known to hold.
    registered: BTreeMap<String, ServiceRegistration>,
    /// IDs (and namespaces) the servers may hold: calls that failed, or an earlier run's.
    maybe: BTreeMap<String, String>,
    /// Build errors already logged.
    reported: BTreeSet<String>,
}

/// A failed call and the services it was about.
struct Failed {
    services: Vec<String>,
    error: RegistrarError,
}

impl Worker {
    async fn run(mut self) {
        let mut backoff = Duration::ZERO;
        loop {
            let stopping = *self.stopping.borrow_and_update();
            let result = if stopping { self.deregister_all().await } else { self.reconcile().await };
            if stopping {
                self.attempts.send_modify(|n| *n += 1);
            }
            let wait = match result {
                Ok(()) if stopping => return,
                Ok(()) => {
                    backoff = Duration::ZERO;
                    None
                }
                Err(f) => {
                    backoff = (backoff * 2).clamp(RETRY_MIN, RETRY_MAX);
                    tracing::warn!(
                        alloc_id = %self.alloc_id,
                        services = ?f.services,
                        error = %f.error,
                        retry_in = ?backoff,
                        "{} services failed",
                        if stopping { "deregistering" } else { "registering" }
                    );
                    Some(backoff)
                }
            };
            let mut answers = self.registrar.answers();
            let retry = async {
                match wait {
                    Some(d) => {
                        tokio::select! {
                            _ = tokio::time::sleep(d) => {}
                            Ok(()) = answers.changed() => {}
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = retry => {}
                r = self.stopping.changed() => if r.is_err() { return },
                r = self.alloc.changed(), if !stopping => if r.is_err() { return },
                r = self.task_states.changed(), if !stopping => if r.is_err() { return },
                Ok(()) = self.resyncs.changed(), if !stopping => {
                    // Known registrations become "maybe": the wanted ones are upserted again.
                    for (id, r) in std::mem::take(&mut self.registered) {
                        self.maybe.insert(id, r.namespace);
                    }
                }
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Removes everything of the alloc, if anything may be registered.
    async fn deregister_all(&mut self) -> Result<(), Failed> {
        if let Some(consul) = self.consul.clone().filter(|_| !self.consul_removed) {
            self.consul_removed = true;
            let passes = consul.remove(&self.alloc_id);
            tokio::select! {
                _ = consul.wait_pass_after(passes, CONSUL_DEREGISTER_WAIT) => {}
                _ = self.shutdown.cancelled() => {}
            }
        }
        if self.registered.is_empty() && self.maybe.is_empty() {
            return Ok(());
        }
        let services: Vec<String> = self.registered.values().map(|r| r.service_name.clone()).collect();
        self.registrar.delete_by_alloc(self.alloc_id.clone()).await.map_err(|error| Failed { services, error })?;
        self.registered.clear();
        self.maybe.clear();
        Ok(())
    }

    /// Registers what the alloc wants now (group services, services of running tasks) and
    /// removes the rest.
    async fn reconcile(&mut self) -> Result<(), Failed> {
        let alloc = self.alloc.borrow_and_update().clone();
        let states = self.task_states.borrow_and_update().clone();
        let running: Vec<&str> = states.iter().filter(|(_, s)| s.state == task_state::RUNNING).map(|(n, _)| n.as_str()).collect();
        let node = (self.node)();
        if let Some(consul) = &self.consul {
            let built = build_consul(&alloc, &node, &self.region, "", Which::Running(&running));
            for e in built.errors {
                if self.reported.insert(e.clone()) {
                    tracing::error!(alloc_id = %self.alloc_id, error = %e, "consul service not registered");
                }
            }
            consul.set(&self.alloc_id, built.registrations);
        }
        let built = build(&alloc, &node, &self.region, Which::Running(&running));
        for e in built.errors {
            if self.reported.insert(e.clone()) {
                tracing::error!(alloc_id = %self.alloc_id, error = %e, "service not registered");
            }
        }
        let wanted = built.registrations;

        // New and changed ones first, so a renamed service is never absent.
        let changed: Vec<ServiceRegistration> = wanted.values().filter(|r| self.registered.get(&r.id) != Some(*r)).cloned().collect();
        if !changed.is_empty() {
            for r in &changed {
                self.maybe.insert(r.id.clone(), r.namespace.clone());
            }
            let services = changed.iter().map(|r| r.service_name.clone()).collect();
            self.registrar.upsert(changed.clone()).await.map_err(|error| Failed { services, error })?;
            for r in changed {
                self.maybe.remove(&r.id);
                self.registered.insert(r.id.clone(), r);
            }
        }

        let stale: Vec<(String, String, String)> = self
            .registered
            .values()
            .map(|r| (r.id.clone(), r.namespace.clone(), r.service_name.clone()))
            .chain(self.maybe.iter().filter(|(id, _)| !id.is_empty()).map(|(id, ns)| (id.clone(), ns.clone(), id.clone())))
            .filter(|(id, _, _)| !wanted.contains_key(id))
            .collect();
        for (id, namespace, name) in stale {
            self.registrar.delete_by_id(namespace, id.clone()).await.map_err(|error| Failed { services: vec![name], error })?;
            self.registered.remove(&id);
            self.maybe.remove(&id);
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests;
