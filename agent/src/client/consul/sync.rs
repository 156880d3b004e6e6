//! The Consul service sync: one loop per agent bringing the local Consul agent to what the
//! live allocs want, as Nomad's `ServiceClient.Run`/`sync` do.
//!
//! Allocs say what they want ([`ConsulServices::set`], from the `services` alloc hook, which
//! builds the registrations with [`super::services::build_consul`]) or that they want nothing
//! any more ([`ConsulServices::remove`]). No call is made there: the loop makes them. Each pass:
//! 1. reads `/v1/agent/services`, registers every wanted service that is missing or differs
//!    (kind, port, address, name, tag override, meta, tagged addresses, tags as a set; Consul's
//!    own `lan_ipv4`/`wan_ipv4`/... tagged addresses are not a difference);
//! 2. deregisters every `_nomad-task-` service no live alloc wants (anything else, including the
//!    agent's own `_nomad-client-`/`_nomad-server-` services, is left alone);
//!    `<ID>-sidecar-proxy` is the sidecar Consul's agent made from a registration's
//!    `Connect.SidecarService`: it is never drift or an orphan while its parent is wanted or
//!    still registered, it is removed just before its parent (as Nomad does), and one whose
//!    parent is gone and unwanted is removed like any unwanted service. A wanted service whose
//!    sidecar is missing, or whose sidecar's tags or upstreams differ, is registered again;
//! 3. reads `/v1/agent/checks`: registers again the service of a wanted check that is missing,
//!    and deregisters every `_nomad-check-` check of a `_nomad-task-` service that nothing wants.
//!
//! A pass runs at once when an alloc's wants change, every `period` (30 s, Nomad's
//! `periodicInterval`) so what was deleted behind our back or lost by a restarted Consul comes
//! back, and after a failure with a backoff of 1 s × failures up to 30 s. Consul being
//! unreachable only delays the pass: no alloc or task is failed for it.
//!
//! For `probation` after the start (a minute, as Nomad's `deregisterProbationPeriod`) unknown
//! Nomad entries are kept, unless an alloc of this agent removed them: restored allocs may not
//! have said what they want yet, and their services must not flap.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::services::CHECK_ID_PREFIX;
use super::{AgentService, ConsulApi, ConsulError, ServiceAddress, ServiceRegistration, Upstream};
use crate::client::services::ID_PREFIX;

/// What Consul's agent appends to a service ID for the sidecar it registers beside it.
pub const SIDECAR_SUFFIX: &str = "-sidecar-proxy";

/// Nomad's `periodicInterval`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// Nomad's `deregisterProbationPeriod`.
pub const DEREGISTER_PROBATION: Duration = Duration::from_secs(60);
/// Nomad's `retryInterval` (multiplied by the consecutive failures).
const RETRY_STEP: Duration = Duration::from_secs(1);
/// Nomad's `maxRetryInterval`.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Tagged addresses Consul adds by itself to a registration that has none of them.
const CONSUL_TAGGED_ADDRESSES: [&str; 4] = ["lan_ipv4", "wan_ipv4", "lan_ipv6", "wan_ipv6"];

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub registered: usize,
    pub deregistered_services: usize,
    pub deregistered_checks: usize,
}

#[derive(Default)]
struct Wanted {
    /// Service registrations by alloc, then by service ID.
    by_alloc: BTreeMap<String, BTreeMap<String, ServiceRegistration>>,
    /// Service IDs an alloc of this agent stopped wanting: removed even in probation.
    removed: BTreeSet<String>,
    /// The agent's own services (`auto_advertise`), by role, then by service ID.
    agent: BTreeMap<&'static str, BTreeMap<String, ServiceRegistration>>,
}

/// See the module docs.
pub struct ConsulServices {
    api: Arc<dyn ConsulApi>,
    wanted: Mutex<Wanted>,
    kick: Notify,
    /// Passes finished (successful or not).
    passes: watch::Sender<u64>,
    /// Successful passes.
    synced: watch::Sender<u64>,
    period: Duration,
    probation_until: Instant,
}

impl ConsulServices {
    /// A sync against `api`; call [`ConsulServices::run`] to start it.
    pub fn new(api: Arc<dyn ConsulApi>, period: Duration, probation: Duration) -> Arc<ConsulServices> {
        Arc::new(ConsulServices {
            api,
            wanted: Mutex::new(Wanted::default()),
            kick: Notify::new(),
            passes: watch::channel(0).0,
            synced: watch::channel(0).0,
            period,
            probation_until: Instant::now() + probation,
        })
    }

    fn wanted(&self) -> MutexGuard<'_, Wanted> {
        self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `alloc_id` wants registered now (replacing what it wanted before).
    pub fn set(&self, alloc_id: &str, regs: BTreeMap<String, ServiceRegistration>) {
        let mut w = self.wanted();
        let before = w.by_alloc.get(alloc_id);
        if before == Some(&regs) || (before.is_none() && regs.is_empty()) {
            return;
        }
        if let Some(old) = before {
            let gone: Vec<String> = old.keys().filter(|id| !regs.contains_key(*id)).cloned().collect();
            w.removed.extend(gone);
        }
        for id in regs.keys() {
            w.removed.remove(id);
        }
        if regs.is_empty() {
            w.by_alloc.remove(alloc_id);
        } else {
            w.by_alloc.insert(alloc_id.to_string(), regs);
        }
        drop(w);
        self.kick.notify_one();
    }

    /// The agent's own services for `role` ("client" or "server"; see `agent_services`). They
    /// are registered like an alloc's, but never removed by a pass (as Nomad's sync leaves
    /// agent services alone); [`ConsulServices::deregister_agent`] removes them.
    pub fn set_agent(&self, role: &'static str, regs: Vec<ServiceRegistration>) {
        let regs: BTreeMap<String, ServiceRegistration> = regs.into_iter().map(|r| (r.id.clone(), r)).collect();
        let mut w = self.wanted();
        if w.agent.get(role) == Some(&regs) {
            return;
        }
        w.agent.insert(role, regs);
        drop(w);
        self.kick.notify_one();
    }

    /// Removes the agent's own services from Consul (the agent is shutting down), as Nomad's
    /// `ServiceClient.Shutdown` does. Best effort: errors are logged.
    pub async fn deregister_agent(&self) {
        let ids: Vec<String> = std::mem::take(&mut self.wanted().agent).into_values().flat_map(BTreeMap::into_keys).collect();
        for id in ids {
            if let Err(e) = self.api.service_deregister(&id).await
                && e.status() != Some(404)
            {
                tracing::warn!(service_id = %id, error = %e, "deregistering the agent's service from Consul failed");
            }
        }
    }

    /// `alloc_id` wants nothing any more. Returns the pass count to wait beyond
    /// ([`ConsulServices::wait_pass_after`]) for the first attempt to remove its services.
    pub fn remove(&self, alloc_id: &str) -> u64 {
        let before = *self.passes.borrow();
        let mut w = self.wanted();
        if let Some(old) = w.by_alloc.remove(alloc_id) {
            w.removed.extend(old.into_keys());
        }
        drop(w);
        self.kick.notify_one();
        before
    }

    /// Waits until a pass after `count` finished, at most `limit`.
    pub async fn wait_pass_after(&self, count: u64, limit: Duration) {
        let mut rx = self.passes.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|n| *n > count)).await;
    }

    /// Counts every finished pass, successful or not.
    pub fn passes(&self) -> watch::Receiver<u64> {
        self.passes.subscribe()
    }

    /// Counts the successful passes.
    pub fn synced(&self) -> watch::Receiver<u64> {
        self.synced.subscribe()
    }

    /// Runs passes until `shutdown` (which leaves every registration in place: tasks keep
    /// running while the agent is away).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            match self.sync_once().await {
                Ok(stats) => {
                    if failures > 0 {
                        tracing::info!("successfully updated services in Consul");
                    }
                    failures = 0;
                    if stats != SyncStats::default() {
                        tracing::debug!(?stats, "consul sync complete");
                    }
                    self.synced.send_modify(|n| *n += 1);
                }
                // An agent with no Consul services and no Consul (the common case without
                // Consul) only says so at debug level: nothing is lost, nothing waits.
                // The agent's own services alone do not make it louder: Nomad agents advertise by
                // default, with or without a Consul.
                Err(e) if self.wanted().by_alloc.values().all(BTreeMap::is_empty) => {
                    tracing::debug!(error = %e, "consul unreachable; no services to register");
                }
                Err(e) => {
                    if failures == 0 {
                        tracing::warn!(error = %e, "failed to update services in Consul");
                    } else if failures.is_multiple_of(10) {
                        tracing::error!(failures, error = %e, "still unable to update services in Consul");
                    }
                    failures += 1;
                }
            }
            self.passes.send_modify(|n| *n += 1);
            let wait = if failures == 0 { self.period } else { (RETRY_STEP * failures).min(RETRY_MAX) };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.kick.notified() => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }

    /// One pass (see the module docs).
    pub async fn sync_once(&self) -> Result<SyncStats, ConsulError> {
        let mut stats = SyncStats::default();
        let in_probation = Instant::now() < self.probation_until;
        let (wanted, removed) = {
            let w = self.wanted();
            let all: BTreeMap<String, ServiceRegistration> = w.by_alloc.values().chain(w.agent.values()).flat_map(|m| m.clone()).collect();
            (all, w.removed.clone())
        };
        let may_remove = |id: &str| !in_probation || removed.contains(id);

        let existing = self.api.services().await?;
        for (id, svc) in &existing {
            if wanted.contains_key(id) || !id.starts_with(ID_PREFIX) || !may_remove(id) {
                continue;
            }
            // Consul's sidecar of a service that is wanted, or that this pass removes with it.
            if let Some(parent) = id.strip_suffix(SIDECAR_SUFFIX)
                && (wanted.contains_key(parent) || existing.contains_key(parent))
            {
                continue;
            }
            // Its sidecar first, as Nomad does (Consul's agent would also take it with it).
            let sidecar = format!("{id}{SIDECAR_SUFFIX}");
            let gone = if existing.contains_key(&sidecar) { vec![sidecar.as_str(), id.as_str()] } else { vec![id.as_str()] };
            for gone in gone {
                match self.api.service_deregister(gone).await {
                    Err(e) if e.status() != Some(404) => return Err(e),
                    _ => stats.deregistered_services += 1,
                }
            }
            tracing::debug!(service_id = %id, service = %svc.service, "deregistered a service no alloc wants");
        }
        let mut registered = BTreeSet::new();
        for (id, reg) in &wanted {
            let sidecar = existing.get(&format!("{id}{SIDECAR_SUFFIX}"));
            if existing.get(id).is_some_and(|e| !different(reg, e, sidecar)) {
                continue;
            }
            self.api.service_register(reg).await?;
            registered.insert(id.clone());
            stats.registered += 1;
        }

        let checks = self.api.checks().await?;
        let wanted_checks: BTreeMap<&str, &str> =
            wanted.values().flat_map(|r| r.checks.iter().map(move |c| (c.check_id.as_str(), r.id.as_str()))).collect();
        for (check_id, service_id) in &wanted_checks {
            if !checks.contains_key(*check_id) && !registered.contains(*service_id) {
                // A check lost on its own comes back with its service's registration.
                self.api.service_register(&wanted[*service_id]).await?;
                registered.insert(service_id.to_string());
                stats.registered += 1;
            }
        }
        for (id, c) in &checks {
            if wanted_checks.contains_key(id.as_str())
                || !id.starts_with(CHECK_ID_PREFIX)
                || !c.service_id.starts_with(ID_PREFIX)
                || (in_probation && !removed.contains(&c.service_id) && !wanted.contains_key(&c.service_id))
            {
                continue;
            }
            match self.api.check_deregister(id).await {
                Err(e) if e.status() != Some(404) => return Err(e),
                _ => stats.deregistered_checks += 1,
            }
        }

        // What was removed is gone now (or was never there); removals since stay.
        self.wanted().removed.retain(|id| !removed.contains(id));
        Ok(stats)
    }
}

/// Nomad's `different`: does Consul's copy of a service (and of its sidecar) differ from what
/// is wanted?
fn different(wanted: &ServiceRegistration, existing: &AgentService, sidecar: Option<&AgentService>) -> bool {
    let mut tagged: BTreeMap<String, ServiceAddress> = existing.tagged_addresses.clone();
    for k in CONSUL_TAGGED_ADDRESSES {
        if !wanted.tagged_addresses.contains_key(k) {
            tagged.remove(k);
        }
    }
    let tags_differ = {
        let a: BTreeSet<&String> = wanted.tags.iter().collect();
        let b: BTreeSet<&String> = existing.tags.iter().collect();
        a != b
    };
    wanted.kind != existing.kind
        || wanted.id != existing.id
        || wanted.port != existing.port
        || wanted.address != existing.address
        || wanted.name != existing.service
        || wanted.enable_tag_override != existing.enable_tag_override
        || wanted.meta != existing.meta
        || wanted.tagged_addresses != tagged
        // With enable_tag_override, Consul's tags are the user's (Nomad's periodic sync).
        || (!wanted.enable_tag_override && tags_differ)
        || sidecar_different(wanted, sidecar)
}

/// Nomad's `connectSidecarDifferent`: the sidecar Consul made is missing, or its tags (the
/// parent's when the sidecar has none of its own; Consul's own under enable_tag_override) or
/// upstreams are not what is wanted.
fn sidecar_different(wanted: &ServiceRegistration, sidecar: Option<&AgentService>) -> bool {
    let Some(want) = wanted.connect.as_ref().and_then(|c| c.sidecar_service.as_deref()) else { return false };
    let Some(have) = sidecar else { return true };
    let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<String>>();
    let want_tags = if want.tags.is_empty() { &wanted.tags } else { &want.tags };
    if !wanted.enable_tag_override && set(want_tags) != set(&have.tags) {
        return true;
    }
    let want_up = want.proxy.as_ref().map(|p| p.upstreams.as_slice()).unwrap_or_default();
    let have_up = have.proxy.as_ref().map(|p| p.upstreams.as_slice()).unwrap_or_default();
    upstreams_different(want_up, have_up)
}

/// Nomad's `proxyUpstreamsDifferent`: the fields Nomad sets, in order.
fn upstreams_different(a: &[Upstream], b: &[Upstream]) -> bool {
    a.len() != b.len()
        || a.iter().zip(b).any(|(x, y)| {
            x.datacenter != y.datacenter
                || x.destination_name != y.destination_name
                || x.local_bind_address != y.local_bind_address
                || x.local_bind_port != y.local_bind_port
                || x.mesh_gateway.mode != y.mesh_gateway.mode
                || x.config != y.config
        })
}

#[cfg(test)]
mod tests {
    use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};

    use super::*;
    use crate::client::consul::{ConnectProxyConfig, ConsulClient, ServiceCheck, ServiceConnect};
    use crate::config::consul::ConsulSettings;

    const PARENT: &str = "_nomad-task-a1-group-g-api-http";

    fn sync_against(standin: &ConsulStandIn, probation: Duration) -> (Arc<ConsulServices>, ConsulClient) {
        let settings = ConsulSettings { address: standin.addr().to_string(), timeout: Duration::from_secs(5), ..ConsulSettings::default() };
        (ConsulServices::new(Arc::new(ConsulClient::new(&settings)), SYNC_PERIOD, probation), ConsulClient::new(&settings))
    }

    /// A service with a sidecar, as `build_consul` makes one (sidecar tags `tags`).
    fn with_sidecar(tags: &[&str], upstream_port: i64) -> ServiceRegistration {
        let sidecar = ServiceRegistration {
            tags: tags.iter().map(|t| t.to_string()).collect(),
            port: 25001,
            address: "127.0.0.1".into(),
            proxy: Some(ConnectProxyConfig {
                upstreams: vec![Upstream { destination_name: "db".into(), local_bind_port: upstream_port, ..Upstream::default() }],
                ..ConnectProxyConfig::default()
            }),
            checks: vec![ServiceCheck {
                name: format!("Connect Sidecar Aliasing {PARENT}"),
                alias_service: PARENT.into(),
                ..Default::default()
            }],
            ..ServiceRegistration::default()
        };
        ServiceRegistration {
            id: PARENT.into(),
            name: "api".into(),
            tags: vec!["v1".into()],
            port: 23456,
            address: "127.0.0.1".into(),
            meta: BTreeMap::from([("external-source".into(), "nomad".into())]),
            connect: Some(ServiceConnect { native: false, sidecar_service: Some(Box::new(sidecar)) }),
            ..ServiceRegistration::default()
        }
    }

    fn one(reg: ServiceRegistration) -> BTreeMap<String, ServiceRegistration> {
        BTreeMap::from([(reg.id.clone(), reg)])
    }

    fn deregistrations(standin: &ConsulStandIn) -> Vec<String> {
        standin.calls_to("PUT", "/v1/agent/service/deregister/").iter().map(|c| c.path.rsplit('/').next().unwrap().to_string()).collect()
    }

    #[tokio::test]
    async fn consuls_sidecar_of_a_wanted_service_is_kept_and_goes_with_its_parent() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let (sync, api) = sync_against(&standin, Duration::ZERO);
        let sidecar = format!("{PARENT}{SIDECAR_SUFFIX}");
        sync.set("a1", one(with_sidecar(&[], 5432)));
        assert_eq!(sync.sync_once().await.unwrap().registered, 1);
        assert!(standin.has_service(&sidecar), "Consul made the sidecar");

        // The sidecar is neither drift nor an orphan: nothing happens.
        assert_eq!(sync.sync_once().await.unwrap(), SyncStats::default());
        assert!(deregistrations(&standin).is_empty());

        // Its tags or upstreams changed in the job: registered again; lost in Consul: likewise.
        sync.set("a1", one(with_sidecar(&["sc"], 5432)));
        assert_eq!(sync.sync_once().await.unwrap().registered, 1, "sidecar tags differ");
        assert_eq!(api.services().await.unwrap()[&sidecar].tags, ["sc"]);
        sync.set("a1", one(with_sidecar(&["sc"], 5433)));
        assert_eq!(sync.sync_once().await.unwrap().registered, 1, "upstreams differ");
        assert_eq!(sync.sync_once().await.unwrap(), SyncStats::default());
        api.service_deregister(&sidecar).await.unwrap();
        assert_eq!(sync.sync_once().await.unwrap().registered, 1, "the sidecar went missing");
        assert!(standin.has_service(&sidecar));

        // The alloc goes: the sidecar is removed first, then its parent.
        let before = deregistrations(&standin).len();
        sync.remove("a1");
        let stats = sync.sync_once().await.unwrap();
        assert_eq!(stats.deregistered_services, 2);
        assert_eq!(deregistrations(&standin)[before..], [sidecar.clone(), PARENT.to_string()]);
        assert!(api.services().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_orphaned_nomad_sidecar_is_removed_after_probation_and_foreign_ones_never() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let (sync, api) = sync_against(&standin, Duration::from_secs(3600));
        // A Nomad sidecar whose parent is gone (registered on its own), and someone else's.
        for id in [format!("{PARENT}{SIDECAR_SUFFIX}"), format!("web{SIDECAR_SUFFIX}")] {
            let orphan = ServiceRegistration {
                kind: "connect-proxy".into(),
                id: id.clone(),
                name: "api-sidecar-proxy".into(),
                port: 21000,
                proxy: Some(ConnectProxyConfig { destination_service_name: "api".into(), ..ConnectProxyConfig::default() }),
                ..ServiceRegistration::default()
            };
            api.service_register(&orphan).await.unwrap();
        }
        assert_eq!(sync.sync_once().await.unwrap(), SyncStats::default(), "kept during probation");
        let (sync, _) = sync_against(&standin, Duration::ZERO);
        assert_eq!(sync.sync_once().await.unwrap().deregistered_services, 1);
        let left: Vec<String> = api.services().await.unwrap().into_keys().collect();
        assert_eq!(left, [format!("web{SIDECAR_SUFFIX}")]);
    }

    #[test]
    fn consuls_own_tagged_addresses_and_tag_order_are_not_drift() {
        let wanted = ServiceRegistration {
            id: "_nomad-task-a-group-g-web-http".into(),
            name: "web".into(),
            tags: vec!["a".into(), "b".into()],
            address: "10.0.0.1".into(),
            port: 8080,
            meta: BTreeMap::from([("external-source".into(), "nomad".into())]),
            ..ServiceRegistration::default()
        };
        let mut existing = AgentService {
            id: wanted.id.clone(),
            service: "web".into(),
            tags: vec!["b".into(), "a".into()],
            address: "10.0.0.1".into(),
            port: 8080,
            meta: wanted.meta.clone(),
            tagged_addresses: BTreeMap::from([("lan_ipv4".into(), ServiceAddress { address: "10.0.0.1".into(), port: 8080 })]),
            ..AgentService::default()
        };
        assert!(!different(&wanted, &existing, None));
        existing.tags.push("extra".into());
        assert!(different(&wanted, &existing, None), "tags differ");
        let mut overriding = wanted.clone();
        overriding.enable_tag_override = true;
        existing.enable_tag_override = true;
        assert!(!different(&overriding, &existing, None), "with enable_tag_override Consul's tags win");
        existing.port = 9;
        assert!(different(&overriding, &existing, None), "port differs");
    }
}
