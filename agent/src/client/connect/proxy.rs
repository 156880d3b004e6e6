//! What an Envoy task of a Connect sidecar or gateway is started with, computed from the alloc
//! alone (Nomad's `envoy_bootstrap_hook.go`): the group service it stands for, its proxy ID in
//! Consul, the admin and ready listener addresses (`buildEnvoyBind`) with the variables that
//! export them, and the address Envoy reaches Consul's gRPC (xDS) port at.
//!
//! Pure functions, so the `envoy_bootstrap` hook and the task runner's environment agree, and a
//! restarted agent computes the same variables for the Envoy it reattaches to.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;

use nomad_proto::job::task_kind;
use nomad_proto::{Allocation, Service, Task, TaskGroup};

use super::bootstrap::ProxyKind;
use crate::client::network::Mode;
use crate::client::services::{group_task_name, registration_id};
use crate::client::taskrunner::env::clean_env_key;
use crate::client::taskrunner::interpolate::Interpolator;

/// First admin listener port in bridge mode (Consul's default), plus the task's index.
pub const ADMIN_BASE_PORT: u16 = 19000;
/// First ready listener port in bridge mode, plus the task's index.
pub const READY_BASE_PORT: u16 = 19100;
/// The admin listener's address (Nomad's choice: not a port any app on 127.0.0.1 holds).
pub const ADMIN_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The ready listener's address.
pub const READY_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Prefix of the variable naming the admin listener (`NOMAD_ENVOY_ADMIN_ADDR_<service>`).
pub const ADMIN_ENV_PREFIX: &str = "NOMAD_ENVOY_ADMIN_ADDR_";
/// Prefix of the variable naming the ready listener.
pub const READY_ENV_PREFIX: &str = "NOMAD_ENVOY_READY_ADDR_";
/// A task variable that overrides where Envoy finds Consul's gRPC port.
pub const GRPC_ADDR_ENV: &str = "CONSUL_GRPC_ADDR";
/// Consul's gRPC port as a host-network Envoy finds it.
pub const GRPC_DEFAULT_ADDRESS: &str = "127.0.0.1:8502";
/// The unix socket, relative to the alloc dir, proxied to Consul's gRPC port for tasks in a
/// group network namespace (`allocdir.AllocGRPCSocket`). Relative, as Nomad passes it: an exec
/// task (chrooted in its task dir, `/alloc` bound) and a container (cwd `/`) both resolve it.
pub const ALLOC_GRPC_SOCKET: &str = "alloc/tmp/consul_grpc.sock";
/// The unix socket proxied to Consul's HTTP API, for Connect native tasks in bridge mode.
pub const ALLOC_HTTP_SOCKET: &str = "alloc/tmp/consul_http.sock";

/// The proxy a Connect task runs as, from its `kind` (`None` for any other task, and for
/// `connect-native`, which runs no Envoy).
pub fn task_proxy_kind(task: &Task) -> Option<ProxyKind> {
    if !task.uses_connect_sidecar() {
        return None;
    }
    match task.kind_name() {
        task_kind::CONNECT_PROXY => Some(ProxyKind::Sidecar),
        task_kind::CONNECT_INGRESS => Some(ProxyKind::Ingress),
        task_kind::CONNECT_TERMINATING => Some(ProxyKind::Terminating),
        task_kind::CONNECT_MESH => Some(ProxyKind::Mesh),
        _ => None,
    }
}

/// What the service's `connect` block makes of it: a sidecar, a gateway of some kind, or
/// neither (Nomad's `HasSidecar`, `IsIngress`, ... in that order).
pub fn service_proxy_kind(service: &Service) -> Option<ProxyKind> {
    let connect = service.connect.as_ref()?;
    if connect.sidecar_service.is_some() {
        return Some(ProxyKind::Sidecar);
    }
    let gateway = connect.gateway.as_ref()?;
    if gateway.ingress.is_some() {
        Some(ProxyKind::Ingress)
    } else if gateway.terminating.is_some() {
        Some(ProxyKind::Terminating)
    } else if gateway.mesh.is_some() {
        Some(ProxyKind::Mesh)
    } else {
        None
    }
}

/// Consul's name for a gateway kind (`-gateway`'s service kind), `None` for a sidecar.
pub fn gateway_kind_name(kind: ProxyKind) -> Option<&'static str> {
    match kind {
        ProxyKind::Sidecar => None,
        ProxyKind::Ingress => Some("ingress-gateway"),
        ProxyKind::Terminating => Some("terminating-gateway"),
        ProxyKind::Mesh => Some("mesh-gateway"),
    }
}

/// The alloc's task group.
pub fn group(alloc: &Allocation) -> Option<&TaskGroup> {
    alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group))
}

/// The group service a Connect proxy task stands for (named by its kind), with its name and
/// port label interpolated as the task sees them. Nomad's messages when there is none.
pub fn lookup_service(alloc: &Allocation, task: &Task, interp: &Interpolator<'_>) -> Result<Service, String> {
    let wanted = task.kind_value();
    if wanted.is_empty() {
        return Err("envoy must be configured with a service name".into());
    }
    let found = group(alloc).into_iter().flat_map(|g| g.services.iter()).find_map(|s| {
        let name = interp.replace(&s.name);
        (name == wanted).then(|| Service { name, port_label: interp.replace(&s.port_label), ..s.clone() })
    });
    found.ok_or_else(|| {
        if task.kind_name() == task_kind::CONNECT_PROXY {
            "connect proxy sidecar task exists but no services configured with a sidecar".to_string()
        } else {
            "connect gateway task exists but no service associated".to_string()
        }
    })
}

/// The mode of the group's first network (Nomad reads `Networks[0].Mode`); a group without
/// one is host networking.
fn first_network_mode(alloc: &Allocation) -> &str {
    group(alloc).and_then(|g| g.networks.first()).map(|n| n.mode.as_str()).unwrap_or("host")
}

/// Whether the group networks in host mode (`host`, or no network mode at all).
pub fn host_networking(alloc: &Allocation) -> bool {
    matches!(first_network_mode(alloc), "host" | "")
}

/// `buildEnvoyBind`: in bridge mode (any mode but host) `base` plus the task's index in the
/// group, unique within the namespace; in host mode the port the group network gives the
/// service's port label (a static port's value; Nomad reads the job's network, where a dynamic
/// port is 0 and Envoy picks one).
pub fn envoy_bind(alloc: &Allocation, ip: Ipv4Addr, service: &Service, task_name: &str, base: u16) -> Result<SocketAddr, String> {
    let port = if host_networking(alloc) {
        let ports = group(alloc).into_iter().flat_map(|g| g.networks.iter()).flat_map(|n| n.reserved_ports.iter().chain(&n.dynamic_ports));
        ports.filter(|p| p.label == service.port_label).map(|p| p.value).next().unwrap_or(0)
    } else {
        let index = group(alloc).and_then(|g| g.tasks.iter().position(|t| t.name == task_name)).unwrap_or(0);
        i64::from(base) + index as i64
    };
    let port = u16::try_from(port).map_err(|_| format!("envoy listener port {port} for task {task_name:?} is out of range"))?;
    Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
}

/// The admin and ready listener addresses of a proxy task.
pub fn binds(alloc: &Allocation, service: &Service, task_name: &str) -> Result<(SocketAddr, SocketAddr), String> {
    Ok((
        envoy_bind(alloc, ADMIN_IP, service, task_name, ADMIN_BASE_PORT)?,
        envoy_bind(alloc, READY_IP, service, task_name, READY_BASE_PORT)?,
    ))
}

/// `NOMAD_ENVOY_ADMIN_ADDR_<service>` and `NOMAD_ENVOY_READY_ADDR_<service>` (the name
/// cleaned as every Nomad variable name is).
pub fn bind_env(service: &str, admin: SocketAddr, ready: SocketAddr) -> [(String, String); 2] {
    [
        (clean_env_key(&format!("{ADMIN_ENV_PREFIX}{service}")), admin.to_string()),
        (clean_env_key(&format!("{READY_ENV_PREFIX}{service}")), ready.to_string()),
    ]
}

/// The variables a proxy task gets besides the usual ones; none for other tasks, or when the
/// service cannot be found (the `envoy_bootstrap` hook reports that).
pub fn task_env(alloc: &Allocation, task: &Task, interp: &Interpolator<'_>) -> Vec<(String, String)> {
    if task_proxy_kind(task).is_none() {
        return Vec::new();
    }
    let Ok(service) = lookup_service(alloc, task, interp) else { return Vec::new() };
    match binds(alloc, &service, &task.name) {
        Ok((admin, ready)) => bind_env(&service.name, admin, ready).into(),
        Err(_) => Vec::new(),
    }
}

/// The proxy's service ID in Consul: the group service's registration ID
/// (`_nomad-task-<alloc>-group-<group>-<service>-<port label>`), plus `-sidecar-proxy` for a
/// sidecar (the ID Consul gives a `sidecar_service`); a gateway is registered under the ID itself.
pub fn proxy_id(alloc: &Allocation, service: &Service, kind: ProxyKind) -> String {
    let id = registration_id(&alloc.id, &group_task_name(&alloc.task_group), &service.name, &service.port_label);
    match kind {
        ProxyKind::Sidecar => format!("{id}-sidecar-proxy"),
        _ => id,
    }
}

/// Where Envoy reaches Consul's gRPC port: the task's `CONSUL_GRPC_ADDR`, else `127.0.0.1:8502`
/// on the host network, else the alloc's unix socket the `consul_grpc_socket` hook proxies.
/// `host_alloc_dir` is given for a task without a file system of its own (raw_exec), whose
/// working directory is its task dir, not one holding `alloc/`: it gets the socket's host path.
pub fn grpc_address(alloc: &Allocation, env: &std::collections::BTreeMap<String, String>, host_alloc_dir: Option<&Path>) -> String {
    if let Some(addr) = env.get(GRPC_ADDR_ENV).filter(|a| !a.is_empty()) {
        return addr.clone();
    }
    if host_networking(alloc) {
        return GRPC_DEFAULT_ADDRESS.to_string();
    }
    match host_alloc_dir {
        Some(dir) => format!("unix://{}", dir.join(ALLOC_GRPC_SOCKET).display()),
        None => format!("unix://{ALLOC_GRPC_SOCKET}"),
    }
}

/// Whether the group's first network is `bridge` (Nomad's `tgFirstNetworkIsBridge`, which the
/// socket hooks run for).
pub fn first_network_is_bridge(alloc: &Allocation) -> bool {
    matches!(Mode::parse(first_network_mode(alloc)), Ok(Mode::Bridge))
}

#[cfg(test)]
pub(crate) mod tests;
