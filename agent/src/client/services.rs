//! Nomad-native service registrations (`provider = "nomad"`): what an alloc registers, and the
//! calls that register it.
//!
//! [`build`] turns an alloc (its group services, and the services of the tasks that run) into
//! `ServiceRegistration`s, as Nomad's client does (`serviceregistration/nsd`):
//! - only services whose provider is `nomad` (an empty provider means Consul, left alone);
//! - ID `_nomad-task-<alloc>-<task>-<service>-<port label>`, where the task is
//!   `group-<group>` for group services;
//! - name, tags, port label and address interpolated with the alloc's environment
//!   (`${NOMAD_*}`, `${attr.*}`, `${meta.*}`; the task's for task services);
//! - address and port with `address_mode` `auto`/`host`: a port label names one of the alloc's
//!   ports (its host IP and host port); a number is used as is, with the node's address; no
//!   port means the node's address and port 0; `address` replaces the address. A label that
//!   names nothing skips that service with an error (see [`Built::errors`]).
//!
//! [`ServiceRegistrar`] is what the alloc hook (`allocrunner/hooks/services.rs`) calls;
//! [`RpcRegistrar`] makes the `ServiceRegistration.*` RPCs through the client's server list,
//! authenticated by the node's SecretID.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nomad_proto::rpc::{ServiceRegistrationDeleteByIdRequest, ServiceRegistrationDeleteRequest, ServiceRegistrationUpsertRequest};
use nomad_proto::service::SERVICE_PROVIDER_NOMAD;
use nomad_proto::{Allocation, Node, Service, ServiceRegistration, Task};
use tokio::sync::watch;
use tonic::Code;

use super::servers::{RpcError, Servers};
use super::taskrunner::env::{EnvInput, TaskDirs, build_env, ports};
use super::taskrunner::interpolate::Interpolator;

/// The prefix of every registration ID Nomad's client makes.
pub const ID_PREFIX: &str = "_nomad-task-";

/// How long one registration call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The ID of a registration: `_nomad-task-<alloc>-<task>-<service>-<port label>`.
pub fn registration_id(alloc_id: &str, task: &str, service: &str, port_label: &str) -> String {
    format!("{ID_PREFIX}{alloc_id}-{task}-{service}-{port_label}")
}

/// The task part of a group service's ID.
pub fn group_task_name(group: &str) -> String {
    format!("group-{group}")
}

/// The registrations an alloc wants now, and the services that could not be built.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Built {
    /// Registrations by ID.
    pub registrations: BTreeMap<String, ServiceRegistration>,
    /// One message per service skipped (it names the service and what is wrong).
    pub errors: Vec<String>,
}

/// Which services to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which<'a> {
    /// Every Nomad service of the alloc: the group's and every task's (what may be registered).
    All,
    /// The group's services and those of the tasks named (the running ones).
    Running(&'a [&'a str]),
}

/// Does the alloc have any Nomad-native service (group or task)?
pub fn has_nomad_services(alloc: &Allocation) -> bool {
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return false };
    group.services.iter().chain(group.tasks.iter().flat_map(|t| t.services.iter())).any(is_nomad)
}

fn is_nomad(s: &Service) -> bool {
    s.provider == SERVICE_PROVIDER_NOMAD
}

/// The node's address: its fingerprinted IP, else the host of its HTTP address.
pub fn node_address(node: &Node) -> String {
    if let Some(ip) = node.attributes.get("unique.network.ip-address").filter(|ip| !ip.is_empty()) {
        return ip.clone();
    }
    match node.http_addr.rsplit_once(':') {
        Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => node.http_addr.clone(),
    }
}

/// The registrations of `alloc` on `node`: group services always, task services of the tasks
/// `which` selects.
pub fn build(alloc: &Allocation, node: &Node, region: &str, which: Which<'_>) -> Built {
    let mut out = Built::default();
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return out };
    let group_services: Vec<&Service> = group.services.iter().filter(|s| is_nomad(s)).collect();
    if !group_services.is_empty() {
        // The group's environment: the alloc's, without a task.
        let mut env = env_for(alloc, &Task::default(), node, region);
        env.remove("NOMAD_TASK_NAME");
        let task = group_task_name(&group.name);
        for s in group_services {
            add(&mut out, alloc, node, region, &env, &task, s, "");
        }
    }
    for t in &group.tasks {
        let selected = match which {
            Which::All => true,
            Which::Running(names) => names.contains(&t.name.as_str()),
        };
        let services: Vec<&Service> = t.services.iter().filter(|s| is_nomad(s)).collect();
        if !selected || services.is_empty() {
            continue;
        }
        let env = env_for(alloc, t, node, region);
        for s in services {
            add(&mut out, alloc, node, region, &env, &t.name, s, &t.name);
        }
    }
    out
}

pub(crate) fn env_for(alloc: &Allocation, task: &Task, node: &Node, region: &str) -> BTreeMap<String, String> {
    let dirs = TaskDirs::isolated();
    build_env(&EnvInput { alloc, task, node, region, dirs: &dirs, host_env: None })
}

#[allow(clippy::too_many_arguments)]
fn add(
    out: &mut Built,
    alloc: &Allocation,
    node: &Node,
    region: &str,
    env: &BTreeMap<String, String>,
    id_task: &str,
    s: &Service,
    task: &str,
) {
    let interp = Interpolator { env, node, region };
    let name = interp.replace(&s.name);
    let port_label = interp.replace(&s.port_label);
    let address = match resolve_address(alloc, node, task, &s.address_mode, &port_label) {
        Ok(a) => a,
        Err(e) => {
            out.errors.push(format!("service {name:?}: {e}"));
            return;
        }
    };
    let (mut host, port) = address;
    if !s.address.is_empty() {
        host = interp.replace(&s.address);
    }
    let reg = ServiceRegistration {
        id: registration_id(&alloc.id, id_task, &name, &port_label),
        service_name: name,
        namespace: if alloc.namespace.is_empty() { "default".into() } else { alloc.namespace.clone() },
        node_id: node.id.clone(),
        datacenter: node.datacenter.clone(),
        job_id: alloc.job_id.clone(),
        alloc_id: alloc.id.clone(),
        tags: service_tags(alloc, s).iter().map(|t| interp.replace(t)).collect(),
        address: host,
        port,
        create_index: 0,
        modify_index: 0,
    };
    out.registrations.insert(reg.id.clone(), reg);
}

/// The tags a service registers with: its `canary_tags` while the alloc is an unpromoted
/// canary (if it has any), else its `tags` (Nomad's service clients choose so).
pub(crate) fn service_tags<'s>(alloc: &Allocation, s: &'s Service) -> &'s [String] {
    if nomad_proto::deployment::alloc_is_canary(alloc) && !s.canary_tags.is_empty() { &s.canary_tags } else { &s.tags }
}

/// Address and port of a service in `auto`/`host` mode.
fn resolve_address(alloc: &Allocation, node: &Node, task: &str, mode: &str, label: &str) -> Result<(String, i64), String> {
    match mode {
        "" | "auto" | "host" => {}
        other => return Err(format!("address_mode {other:?} is not supported for Nomad services by this client")),
    }
    if label.is_empty() {
        return Ok((node_address(node), 0));
    }
    if let Some(p) = ports(alloc, task).into_iter().find(|p| p.label == label) {
        let ip = if p.host_ip.is_empty() { node_address(node) } else { p.host_ip };
        return Ok((ip, p.value));
    }
    match label.parse::<i64>() {
        Ok(n) if n > 0 => Ok((node_address(node), n)),
        Ok(_) => Err(format!("invalid port {label:?}: port must be >0")),
        Err(_) => Err(format!("invalid port {label:?}: port label not found")),
    }
}

/// Address and port of a service or check the way Nomad's `serviceregistration.GetAddress`
/// resolves them, for `auto`, `host` and `alloc` (`driver` needs a driver network, which no
/// driver here reports; admission refuses it). `custom` is the service's `address`.
pub(crate) fn get_address(
    alloc: &Allocation,
    node: &Node,
    task: &str,
    mode: &str,
    label: &str,
    custom: &str,
) -> Result<(String, i64), String> {
    let mapping = || ports(alloc, task).into_iter().find(|p| p.label == label);
    match mode {
        "" | "auto" if !custom.is_empty() => {
            if label.is_empty() {
                return Ok((custom.to_string(), 0));
            }
            if let Some(p) = mapping() {
                return Ok((custom.to_string(), p.value));
            }
            label
                .parse::<i64>()
                .map(|n| (custom.to_string(), n))
                .map_err(|_| format!("invalid port: {label:?}: not a valid port mapping or numeric port"))
        }
        "" | "auto" | "host" => {
            if !custom.is_empty() {
                return Err("cannot use custom advertise address with \"host\" address mode".to_string());
            }
            if label.is_empty() {
                return Ok((node_address(node), 0));
            }
            if let Some(p) = mapping() {
                let ip = if p.host_ip.is_empty() { node_address(node) } else { p.host_ip };
                return Ok((ip, p.value));
            }
            match label.parse::<i64>() {
                Ok(n) if n > 0 => Ok((node_address(node), n)),
                Ok(_) => Err(format!("invalid port: {label:?}: port must be >0")),
                Err(_) => Err(format!("invalid port {label:?}: port label not found")),
            }
        }
        "alloc" => {
            if !custom.is_empty() {
                return Err("cannot use custom advertise address with \"alloc\" address mode".to_string());
            }
            let address = alloc
                .network_status
                .as_ref()
                .and_then(|s| s.get("Address"))
                .and_then(|a| a.as_str())
                .filter(|a| !a.is_empty())
                .ok_or_else(|| "cannot use address_mode=\"alloc\": no allocation network status reported".to_string())?
                .to_string();
            if label.is_empty() {
                return Ok((address, 0));
            }
            if let Some(p) = mapping() {
                return Ok((address, if p.to > 0 { p.to } else { p.value }));
            }
            match label.parse::<i64>() {
                Ok(n) if n > 0 => Ok((address, n)),
                Ok(_) => Err(format!("invalid port: {label:?}: port must be >0")),
                Err(_) => {
                    Err(format!("invalid port label {label:?}: port labels in alloc address_mode must be numeric or a valid alloc port"))
                }
            }
        }
        other => Err(format!("address_mode {other:?} is not supported by this client")),
    }
}

/// Why a registration call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegistrarError(pub String);

/// Registers and removes service registrations with the servers.
pub trait ServiceRegistrar: Send + Sync {
    /// Inserts or updates registrations (idempotent).
    fn upsert(&self, regs: Vec<ServiceRegistration>) -> BoxFuture<'static, Result<(), RegistrarError>>;
    /// Removes one registration; one the servers do not have counts as removed.
    fn delete_by_id(&self, namespace: String, id: String) -> BoxFuture<'static, Result<(), RegistrarError>>;
    /// Removes every registration of an alloc.
    fn delete_by_alloc(&self, alloc_id: String) -> BoxFuture<'static, Result<(), RegistrarError>>;
    /// Changes whenever some call to the servers gets an answer: a retry waiting out a backoff
    /// may go at once.
    fn answers(&self) -> watch::Receiver<u64>;
    /// Says the servers may have dropped this node's registrations (it was `down`: the servers
    /// delete a down node's services, and a node coming back may keep its allocs).
    fn resync(&self) {}
    /// Changes after every [`ServiceRegistrar::resync`]: every alloc registers its services again.
    fn resyncs(&self) -> watch::Receiver<u64> {
        watch::channel(0).1
    }
}

/// The real registrar: `ServiceRegistration.*` RPCs through the client's servers.
pub struct RpcRegistrar {
    servers: Arc<Servers>,
    node_id: String,
    secret_id: String,
    resyncs: watch::Sender<u64>,
}

impl RpcRegistrar {
    /// Calls as node `node_id` with its secret.
    pub fn new(servers: Arc<Servers>, node_id: &str, secret_id: &str) -> RpcRegistrar {
        RpcRegistrar { servers, node_id: node_id.to_string(), secret_id: secret_id.to_string(), resyncs: watch::channel(0).0 }
    }
}

fn rpc_error(e: RpcError) -> RegistrarError {
    RegistrarError(e.to_string())
}

impl ServiceRegistrar for RpcRegistrar {
    fn upsert(&self, regs: Vec<ServiceRegistration>) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let servers = self.servers.clone();
        let req = ServiceRegistrationUpsertRequest { services: regs, node_id: self.node_id.clone(), secret_id: self.secret_id.clone() };
        Box::pin(
            async move { servers.services(CALL_TIMEOUT, |mut c| async move { c.upsert(req).await }).await.map(|_| ()).map_err(rpc_error) },
        )
    }

    fn delete_by_id(&self, namespace: String, id: String) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let servers = self.servers.clone();
        let req = ServiceRegistrationDeleteByIdRequest { id, namespace, node_id: self.node_id.clone(), secret_id: self.secret_id.clone() };
        Box::pin(async move {
            match servers.services(CALL_TIMEOUT, |mut c| async move { c.delete_by_id(req).await }).await {
                Ok(_) => Ok(()),
                Err(RpcError::Status { status, .. }) if status.code() == Code::NotFound => Ok(()),
                Err(e) => Err(rpc_error(e)),
            }
        })
    }

    fn delete_by_alloc(&self, alloc_id: String) -> BoxFuture<'static, Result<(), RegistrarError>> {
        let servers = self.servers.clone();
        let req = ServiceRegistrationDeleteRequest {
            alloc_ids: vec![alloc_id],
            node_id: self.node_id.clone(),
            secret_id: self.secret_id.clone(),
        };
        Box::pin(async move {
            servers.services(CALL_TIMEOUT, |mut c| async move { c.delete_by_alloc(req).await }).await.map(|_| ()).map_err(rpc_error)
        })
    }

    fn answers(&self) -> watch::Receiver<u64> {
        self.servers.answers()
    }

    fn resync(&self) {
        self.resyncs.send_modify(|n| *n += 1);
    }

    fn resyncs(&self) -> watch::Receiver<u64> {
        self.resyncs.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources, AllocatedSharedResources};
    use nomad_proto::{Job, TaskGroup};

    use super::*;

    fn svc(name: &str, port: &str, provider: &str) -> Service {
        Service {
            name: name.into(),
            port_label: port.into(),
            provider: provider.into(),
            address_mode: "auto".into(),
            tags: vec!["idx-${NOMAD_ALLOC_INDEX}".into(), "${attr.kernel.name}".into(), "rack-${meta.rack}".into()],
            ..Service::default()
        }
    }

    fn fixture(group_services: Vec<Service>, task_services: Vec<Service>) -> (Allocation, Node) {
        let job = Job {
            id: "web".into(),
            name: "web".into(),
            task_groups: vec![TaskGroup {
                name: "front".into(),
                services: group_services,
                tasks: vec![
                    Task { name: "server".into(), services: task_services, ..Task::default() },
                    Task { name: "other".into(), ..Task::default() },
                ],
                ..TaskGroup::default()
            }],
            ..Job::default()
        };
        let alloc = Allocation {
            id: "a1b2".into(),
            name: "web.front[3]".into(),
            namespace: "default".into(),
            job_id: "web".into(),
            task_group: "front".into(),
            job: Some(Arc::new(job)),
            allocated_resources: Some(AllocatedResources {
                shared: AllocatedSharedResources {
                    ports: vec![AllocatedPortMapping { label: "http".into(), value: 23456, to: 0, host_ip: "10.1.2.3".into() }],
                    ..AllocatedSharedResources::default()
                },
                ..AllocatedResources::default()
            }),
            ..Allocation::default()
        };
        let mut node = Node { id: "node-1".into(), datacenter: "dc2".into(), ..Node::default() };
        node.attributes.insert("unique.network.ip-address".into(), "10.9.9.9".into());
        node.attributes.insert("kernel.name".into(), "linux".into());
        node.meta.insert("rack".into(), "r7".into());
        (alloc, node)
    }

    #[test]
    fn a_canary_registers_its_canary_tags_until_promoted() {
        let mut s = svc("api", "http", "nomad");
        s.canary_tags = vec!["canary-${NOMAD_ALLOC_INDEX}".into()];
        let (mut alloc, node) = fixture(vec![s], vec![]);
        alloc.deployment_status = Some(serde_json::json!({"Healthy": null, "Canary": true}));
        let built = build(&alloc, &node, "global", Which::All);
        assert_eq!(built.registrations.values().next().unwrap().tags, ["canary-3"]);
        alloc.deployment_status = Some(serde_json::json!({"Healthy": true, "Canary": false}));
        let built = build(&alloc, &node, "global", Which::All);
        assert_eq!(built.registrations.values().next().unwrap().tags, ["idx-3", "linux", "rack-r7"]);
    }

    #[test]
    fn group_and_task_services_get_nomads_ids_fields_and_interpolation() {
        let (alloc, node) =
            fixture(vec![svc("${NOMAD_JOB_NAME}-api", "http", "nomad")], vec![svc("srv-${NOMAD_TASK_NAME}", "http", "nomad")]);
        let built = build(&alloc, &node, "global", Which::Running(&["server"]));
        assert!(built.errors.is_empty(), "{:?}", built.errors);
        let ids: Vec<&str> = built.registrations.keys().map(String::as_str).collect();
        assert_eq!(ids, ["_nomad-task-a1b2-group-front-web-api-http", "_nomad-task-a1b2-server-srv-server-http"]);
        let g = &built.registrations["_nomad-task-a1b2-group-front-web-api-http"];
        assert_eq!(
            *g,
            ServiceRegistration {
                id: "_nomad-task-a1b2-group-front-web-api-http".into(),
                service_name: "web-api".into(),
                namespace: "default".into(),
                node_id: "node-1".into(),
                datacenter: "dc2".into(),
                job_id: "web".into(),
                alloc_id: "a1b2".into(),
                tags: vec!["idx-3".into(), "linux".into(), "rack-r7".into()],
                address: "10.1.2.3".into(),
                port: 23456,
                create_index: 0,
                modify_index: 0,
            }
        );
        let t = &built.registrations["_nomad-task-a1b2-server-srv-server-http"];
        assert_eq!((t.service_name.as_str(), t.address.as_str(), t.port), ("srv-server", "10.1.2.3", 23456));

        // A task that is not running has no registration; the group's stays.
        let built = build(&alloc, &node, "global", Which::Running(&[]));
        assert_eq!(built.registrations.keys().collect::<Vec<_>>(), ["_nomad-task-a1b2-group-front-web-api-http"]);
        // All: what may be registered.
        assert_eq!(build(&alloc, &node, "global", Which::All).registrations.len(), 2);
    }

    #[test]
    fn port_labels_numbers_no_port_and_custom_addresses() {
        let mut custom = svc("custom", "http", "nomad");
        custom.address = "${meta.rack}.example.com".into();
        let (alloc, node) = fixture(vec![svc("num", "8080", "nomad"), svc("noport", "", "nomad"), custom], vec![]);
        let built = build(&alloc, &node, "global", Which::All);
        assert!(built.errors.is_empty(), "{:?}", built.errors);
        let get = |name: &str| built.registrations.values().find(|r| r.service_name == name).unwrap().clone();
        assert_eq!((get("num").address, get("num").port), ("10.9.9.9".to_string(), 8080), "a number is used with the node's address");
        assert_eq!(get("num").id, "_nomad-task-a1b2-group-front-num-8080");
        assert_eq!((get("noport").address, get("noport").port), ("10.9.9.9".to_string(), 0));
        assert_eq!(get("noport").id, "_nomad-task-a1b2-group-front-noport-");
        assert_eq!((get("custom").address, get("custom").port), ("r7.example.com".to_string(), 23456), "address overrides, port stays");
    }

    #[test]
    fn a_missing_label_skips_only_that_service_and_consul_services_are_left_alone() {
        let (alloc, node) = fixture(
            vec![svc("bad", "grpc", "nomad"), svc("zero", "0", "nomad"), svc("good", "http", "nomad"), svc("consul-one", "http", "consul")],
            vec![svc("empty-provider", "http", "")],
        );
        let built = build(&alloc, &node, "global", Which::All);
        let names: Vec<&str> = built.registrations.values().map(|r| r.service_name.as_str()).collect();
        assert_eq!(names, ["good"]);
        assert_eq!(built.errors.len(), 2, "{:?}", built.errors);
        assert!(built.errors[0].contains("\"bad\"") && built.errors[0].contains("port label not found"), "{:?}", built.errors);
        assert!(built.errors[1].contains("\"zero\"") && built.errors[1].contains("must be >0"), "{:?}", built.errors);
        assert!(has_nomad_services(&alloc));
        let (consul_only, _) = fixture(vec![svc("c", "http", "consul")], vec![svc("e", "http", "")]);
        assert!(!has_nomad_services(&consul_only));
        assert!(build(&consul_only, &node, "global", Which::All).registrations.is_empty());
    }

    #[test]
    fn driver_and_alloc_address_modes_are_reported_not_guessed() {
        let mut s = svc("d", "http", "nomad");
        s.address_mode = "driver".into();
        let (alloc, node) = fixture(vec![s], vec![]);
        let built = build(&alloc, &node, "global", Which::All);
        assert!(built.registrations.is_empty());
        assert!(built.errors[0].contains("address_mode \"driver\""), "{:?}", built.errors);
    }

    #[test]
    fn node_address_falls_back_to_the_http_address() {
        let mut n = Node { http_addr: "192.168.1.4:4646".into(), ..Node::default() };
        assert_eq!(node_address(&n), "192.168.1.4");
        n.http_addr = "[::1]:4646".into();
        assert_eq!(node_address(&n), "::1");
        n.attributes.insert("unique.network.ip-address".into(), "10.0.0.1".into());
        assert_eq!(node_address(&n), "10.0.0.1");
    }
}
