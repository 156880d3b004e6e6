//! Consul service registrations (`provider = "consul"`, the default): what an alloc registers
//! with its local Consul agent, built as Nomad's `ServiceClient.serviceRegs`/`checkRegs` build it
//! (`command/agent/consul/service_client.go`).
//!
//! - Service ID `_nomad-task-<alloc>-<task|group-<group>>-<name>-<port label>`, the same as
//!   Nomad-native services ([`registration_id`]).
//! - Check ID `_nomad-check-<hash>`, where the hash is Nomad's `ServiceCheck.Hash(serviceID)`
//!   ([`check_hash`]): the same IDs as a Nomad client would register, so a node switching between
//!   the two keeps its checks.
//! - Name, tags, meta (plus `external-source = nomad`), address, port label, tagged addresses and
//!   the check fields interpolated with the alloc's (or task's) environment, as Nomad's
//!   `taskenv.InterpolateServices` does; an unpromoted canary registers `canary_tags` and
//!   `canary_meta` instead of `tags` and `meta` when the service has them. Promotion updates
//!   the alloc, and the services hook registers it again with the ordinary ones.
//! - Address and port from `address_mode` ([`get_address`]); checks default to the host address
//!   unless the service has a custom address.
//! - http, tcp and grpc checks are registered for Consul to run; script checks as TTL checks
//!   (TTL = interval + 31 s, Nomad's `ttlCheckBuffer`) that the task runner feeds by running the
//!   script in the task ([`task_checks`] lists them with their IDs; `client/consul/checks.rs`
//!   runs them).
//! - Connect sidecars, native services and gateways (`services/connect.rs`). A service that
//!   cannot be built is skipped with an error (never registered half).
//! - Each check's `on_update`, by check ID ([`BuiltConsul::on_update`]), for the alloc's health.

use std::collections::BTreeMap;

use nomad_proto::service::{Service, ServiceCheck as JobCheck};
use nomad_proto::{Allocation, Node, Task};

use super::{ServiceAddress, ServiceCheck, ServiceRegistration};
use crate::cli::format::go_duration;
use crate::client::services::{Which, env_for, get_address, group_task_name, registration_id, service_tags};
use crate::client::taskrunner::interpolate::Interpolator;
use connect::{ConnectParts, connect_parts};

/// The prefix of every check ID Nomad's client registers.
pub const CHECK_ID_PREFIX: &str = "_nomad-check-";
/// The prefix of everything Nomad's client owns in Consul (`_nomad-task-`, `_nomad-check-`, and
/// the agent's own `_nomad-client-`/`_nomad-server-` services, which the reconcile leaves alone).
pub const NOMAD_PREFIX: &str = "_nomad-";

/// Is this service registered in Consul (an empty provider means Consul)?
pub fn is_consul(s: &Service) -> bool {
    s.provider.is_empty() || s.provider == "consul"
}

/// Does the alloc have any Consul service (group or task)?
pub fn has_consul_services(alloc: &Allocation) -> bool {
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return false };
    group.services.iter().chain(group.tasks.iter().flat_map(|t| t.services.iter())).any(is_consul)
}

/// Nomad's `ServiceCheck.Hash(serviceID)` (one definition, in proto: the servers' mutator
/// names exposed-check ports with it too).
pub fn check_hash(service_id: &str, c: &JobCheck) -> String {
    c.hash(service_id)
}

/// The check ID Nomad registers: `_nomad-check-<hash>`.
pub fn check_id(service_id: &str, c: &JobCheck) -> String {
    format!("{CHECK_ID_PREFIX}{}", check_hash(service_id, c))
}

/// The Consul registrations an alloc wants now, and the services that could not be built.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BuiltConsul {
    /// Registrations by service ID.
    pub registrations: BTreeMap<String, ServiceRegistration>,
    /// Every registered check's `on_update` by check ID (Nomad's `CheckOnUpdate`).
    pub on_update: BTreeMap<String, String>,
    /// One message per service skipped (it names the service and what is wrong).
    pub errors: Vec<String>,
}

/// The Consul registrations of `alloc` on `node`: group services always, task services of the
/// tasks `which` selects. `namespace` is the agent's `consul.namespace` (Enterprise).
pub fn build_consul(alloc: &Allocation, node: &Node, region: &str, namespace: &str, which: Which<'_>) -> BuiltConsul {
    let mut out = BuiltConsul::default();
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return out };
    let group_services: Vec<&Service> = group.services.iter().filter(|s| is_consul(s)).collect();
    if !group_services.is_empty() {
        let mut env = env_for(alloc, &Task::default(), node, region);
        env.remove("NOMAD_TASK_NAME");
        let id_task = group_task_name(&group.name);
        for s in group_services {
            add(&mut out, alloc, node, region, namespace, &env, &id_task, "", s);
        }
    }
    for t in &group.tasks {
        let selected = match which {
            Which::All => true,
            Which::Running(names) => names.contains(&t.name.as_str()),
        };
        let services: Vec<&Service> = t.services.iter().filter(|s| is_consul(s)).collect();
        if !selected || services.is_empty() {
            continue;
        }
        let env = env_for(alloc, t, node, region);
        for s in services {
            add(&mut out, alloc, node, region, namespace, &env, &t.name, &t.name, s);
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn add(
    out: &mut BuiltConsul,
    alloc: &Allocation,
    node: &Node,
    region: &str,
    namespace: &str,
    env: &BTreeMap<String, String>,
    id_task: &str,
    task: &str,
    s: &Service,
) {
    let interp = Interpolator { env, node, region };
    let name = interp.replace(&s.name);
    match registration(alloc, node, namespace, &interp, id_task, task, s, &name) {
        Ok((reg, on_update)) => {
            out.on_update.extend(on_update);
            out.registrations.insert(reg.id.clone(), reg);
        }
        Err(e) => out.errors.push(format!("service {name:?}: {e}")),
    }
}

#[allow(clippy::too_many_arguments)]
fn registration(
    alloc: &Allocation,
    node: &Node,
    namespace: &str,
    interp: &Interpolator<'_>,
    id_task: &str,
    task: &str,
    s: &Service,
    name: &str,
) -> Result<(ServiceRegistration, Vec<(String, String)>), String> {
    let port_label = interp.replace(&s.port_label);
    let custom = interp.replace(&s.address);
    let mode = if s.address_mode.is_empty() { "auto" } else { s.address_mode.as_str() };
    let (address, port) = get_address(alloc, node, task, mode, &port_label, &custom).map_err(|e| format!("unable to get address: {e}"))?;
    let id = registration_id(&alloc.id, id_task, name, &port_label);
    let connect = match &s.connect {
        None => ConnectParts::default(),
        Some(c) => connect_parts(alloc, node, interp, &id, name, &port_label, c)
            .map_err(|e| format!("invalid Consul Connect configuration: {e}"))?,
    };

    let canary = nomad_proto::deployment::alloc_is_canary(alloc);
    let meta_src = if canary && !s.canary_meta.is_empty() { &s.canary_meta } else { &s.meta };
    let mut meta: BTreeMap<String, String> = meta_src.iter().map(|(k, v)| (k.clone(), interp.replace(v))).collect();
    meta.insert("external-source".into(), "nomad".into());
    let mut tagged_addresses = BTreeMap::new();
    for (k, v) in &s.tagged_addresses {
        tagged_addresses.insert(k.clone(), parse_tagged_address(&interp.replace(v), port)?);
    }

    let mut checks = Vec::with_capacity(s.checks.len());
    let mut on_update = Vec::with_capacity(s.checks.len());
    for c in &s.checks {
        let c = interpolate_check(interp, c);
        let registered = check(alloc, node, task, &id, s, &port_label, &custom, &c).map_err(|e| format!("check {:?}: {e}", c.name))?;
        on_update.push((registered.check_id.clone(), c.on_update.clone()));
        checks.push(registered);
    }
    let reg = ServiceRegistration {
        kind: connect.kind.to_string(),
        id,
        name: name.to_string(),
        tags: service_tags(alloc, s).iter().map(|t| interp.replace(t)).collect(),
        port,
        address,
        tagged_addresses,
        enable_tag_override: s.enable_tag_override,
        meta,
        checks,
        proxy: connect.proxy,
        connect: connect.connect,
        namespace: namespace.to_string(),
    };
    Ok((reg, on_update))
}

/// The check fields Nomad interpolates (`taskenv.InterpolateServices`).
fn interpolate_check(interp: &Interpolator<'_>, c: &JobCheck) -> JobCheck {
    let mut c = c.clone();
    for f in [
        &mut c.name,
        &mut c.command,
        &mut c.path,
        &mut c.protocol,
        &mut c.port_label,
        &mut c.initial_status,
        &mut c.method,
        &mut c.grpc_service,
    ] {
        *f = interp.replace(f);
    }
    for a in &mut c.args {
        *a = interp.replace(a);
    }
    for values in c.header.values_mut() {
        for v in values {
            *v = interp.replace(v);
        }
    }
    c
}

/// One check of a service (Nomad's `checkRegs` + `createCheckReg`).
#[allow(clippy::too_many_arguments)]
fn check(
    alloc: &Allocation,
    node: &Node,
    task: &str,
    service_id: &str,
    s: &Service,
    service_port_label: &str,
    custom: &str,
    c: &JobCheck,
) -> Result<ServiceCheck, String> {
    let mut out = ServiceCheck {
        check_id: check_id(service_id, c),
        name: c.name.clone(),
        interval: go_duration(c.interval),
        timeout: go_duration(c.timeout),
        status: c.initial_status.clone(),
        success_before_passing: c.success_before_passing,
        failures_before_critical: c.failures_before_critical,
        ..ServiceCheck::default()
    };
    if c.check_type == "script" {
        // Consul refuses a TTL with an interval; the client reports the script's results.
        out.ttl = go_duration(script_ttl(c.interval).as_nanos() as i64);
        out.interval.clear();
        out.timeout.clear();
        return Ok(out);
    }
    let label = if c.port_label.is_empty() { service_port_label } else { c.port_label.as_str() };
    // A check follows a custom service address; otherwise it probes the host's.
    let mode = match c.address_mode.as_str() {
        "" if !s.address.is_empty() => "auto",
        "" => "host",
        m => m,
    };
    let (host, port) = get_address(alloc, node, task, mode, label, custom).map_err(|e| format!("error getting address: {e}"))?;
    let host_port = join_host_port(&host, port);
    if port == 0 && matches!(c.check_type.as_str(), "http" | "tcp" | "grpc") {
        return Err(format!("{} checks require an address", c.check_type));
    }
    match c.check_type.as_str() {
        "http" => {
            let scheme = if c.protocol.is_empty() { "http" } else { c.protocol.as_str() };
            out.http = http_check_url(scheme, &host_port, &c.path)?;
            out.tls_skip_verify = c.tls_skip_verify;
            out.tls_server_name = c.tls_server_name.clone();
            out.method = c.method.clone();
            out.header = c.header.clone();
            out.body = c.body.clone();
        }
        "tcp" => out.tcp = host_port,
        "grpc" => {
            out.grpc = format!("{host_port}/{}", c.grpc_service);
            out.grpc_use_tls = c.grpc_use_tls;
            out.tls_skip_verify = c.tls_skip_verify;
            out.tls_server_name = c.tls_server_name.clone();
        }
        other => return Err(format!("check type {other:?} not valid")),
    }
    Ok(out)
}

/// Nomad's `ttlCheckBuffer`: how much later than its interval a script check may report.
pub const TTL_CHECK_BUFFER: std::time::Duration = std::time::Duration::from_secs(31);

/// The TTL a script check is registered with: its interval plus [`TTL_CHECK_BUFFER`].
pub fn script_ttl(interval_ns: i64) -> std::time::Duration {
    std::time::Duration::from_nanos(interval_ns.max(0) as u64) + TTL_CHECK_BUFFER
}

/// What a task's run does for one of its Consul checks: a script to run and report, and/or a
/// `check_restart` to watch.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCheck {
    /// The check ID registered in Consul.
    pub check_id: String,
    /// The check's name (for events and logs).
    pub name: String,
    /// For a script check: the command and args, interpolated with the task's environment.
    pub script: Option<(String, Vec<String>)>,
    /// Interval and timeout.
    pub interval: std::time::Duration,
    pub timeout: std::time::Duration,
    /// `check_restart` with `limit > 0` (Nomad's `TriggersRestarts`).
    pub restart: Option<nomad_proto::service::CheckRestart>,
}

/// The Consul checks the runs of `task` are responsible for: the checks of its own services,
/// and of group services when the check (or, without a check `task`, its service) names the task
/// (Nomad's `scriptCheckHook.associated`). Only script checks and checks with a
/// `check_restart` limit are listed. IDs are computed exactly as [`build_consul`] registers them.
pub fn task_checks(alloc: &Allocation, node: &Node, region: &str, task: &Task) -> Vec<TaskCheck> {
    let mut out = Vec::new();
    let Some(group) = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group)) else { return out };
    let task_env = env_for(alloc, task, node, region);
    let task_interp = Interpolator { env: &task_env, node, region };
    let mut group_env = env_for(alloc, &Task::default(), node, region);
    group_env.remove("NOMAD_TASK_NAME");
    let group_interp = Interpolator { env: &group_env, node, region };
    let group_id_task = group_task_name(&group.name);
    let own = task.services.iter().filter(|s| is_consul(s)).map(|s| (s, &task_interp, task.name.as_str()));
    let grouped = group.services.iter().filter(|s| is_consul(s)).map(|s| (s, &group_interp, group_id_task.as_str()));
    for (s, interp, id_task) in own.chain(grouped) {
        let is_group = id_task != task.name;
        let name = interp.replace(&s.name);
        let port_label = interp.replace(&s.port_label);
        let service_id = registration_id(&alloc.id, id_task, &name, &port_label);
        for c in &s.checks {
            if is_group && !(c.task_name == task.name || (c.task_name.is_empty() && s.task_name == task.name)) {
                continue;
            }
            let restart = c.check_restart.clone().filter(|r| r.limit > 0);
            if c.check_type != "script" && restart.is_none() {
                continue;
            }
            let registered = interpolate_check(interp, c);
            let script = (c.check_type == "script")
                .then(|| (task_interp.replace(&c.command), c.args.iter().map(|a| task_interp.replace(a)).collect()));
            let ns = |v: i64| std::time::Duration::from_nanos(v.max(0) as u64);
            out.push(TaskCheck {
                check_id: check_id(&service_id, &registered),
                name: registered.name.clone(),
                script,
                interval: ns(c.interval),
                timeout: ns(c.timeout),
                restart,
            });
        }
    }
    out
}

/// Go's `net.JoinHostPort`: IPv6 hosts in brackets.
pub(crate) fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// The check URL: `path` resolved against `<scheme>://<host:port>` as Go's
/// `url.ResolveReference` does for the paths a check has (absolute or relative, with a query).
pub(crate) fn http_check_url(scheme: &str, host_port: &str, path: &str) -> Result<String, String> {
    if path.contains("://") {
        // An absolute URL replaces the base, as ResolveReference does.
        return Ok(path.to_string());
    }
    if path.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!("invalid check path {path:?}"));
    }
    let path = if path.is_empty() || path.starts_with('?') || path.starts_with('#') {
        format!("/{path}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok(format!("{scheme}://{host_port}{path}"))
}

/// Nomad's `parseAddress`: `ip` or `ip:port` (the service's port when none is given).
fn parse_tagged_address(raw: &str, port: i64) -> Result<ServiceAddress, String> {
    let not_ip = || format!("error parsing address {raw:?}: not an IP address");
    if raw.parse::<std::net::IpAddr>().is_ok() {
        return Ok(ServiceAddress { address: raw.to_string(), port });
    }
    match raw.parse::<std::net::SocketAddr>() {
        Ok(sa) => Ok(ServiceAddress { address: sa.ip().to_string(), port: i64::from(sa.port()) }),
        Err(_) => {
            // A host name with a port is what Go's SplitHostPort accepts too.
            let (host, p) = raw.rsplit_once(':').ok_or_else(not_ip)?;
            let p: i64 = p.parse().map_err(|_| format!("error parsing port {p:?}"))?;
            if host.is_empty() || host.contains(':') {
                return Err(not_ip());
            }
            Ok(ServiceAddress { address: host.to_string(), port: p })
        }
    }
}

mod connect;
#[cfg(test)]
mod tests;
