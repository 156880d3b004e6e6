//! The Connect half of a Consul registration, as Nomad 1.6's `command/agent/consul/connect.go`
//! builds it (`newConnect`, `newConnectGateway`) and `serviceRegs` completes it:
//!
//! - a sidecar: `Connect.SidecarService` with the host port of the `connect-proxy-<service>`
//!   port (or `sidecar_service.port`), its `Proxy` (local service address and port as
//!   configured, `Config` with `bind_address` `0.0.0.0`, `bind_port` the port's `to` inside the
//!   network namespace and Nomad's `envoy_stats_tags`, upstreams, expose paths) and its two
//!   checks, "Connect Sidecar Aliasing <service ID>" and, unless `disable_default_tcp_check`,
//!   "Connect Sidecar Listening". Consul's agent expands it into `<ID>-sidecar-proxy`;
//! - Connect native: `Connect.Native`;
//! - a gateway: `Kind` (`ingress-gateway`, `terminating-gateway`, `mesh-gateway`) and
//!   `Proxy.Config` from `gateway.proxy`, the allocated ports filled into its bind addresses.
//!
//! Every lookup is the alloc's: its one group network and its allocated ports, by label.

use std::collections::BTreeMap;

use nomad_proto::service::{ConsulConnect, ConsulProxy, ConsulSidecarService, ConsulUpstream};
use nomad_proto::{Allocation, Node};
use serde_json::{Value, json};

use super::super::{
    ConnectProxyConfig, ExposeConfig, ExposePath, MeshGatewayConfig, ServiceCheck, ServiceConnect, ServiceRegistration, Upstream,
};
use super::join_host_port;
use crate::client::services::node_address;
use crate::client::taskrunner::env::ports;
use crate::client::taskrunner::interpolate::Interpolator;

/// Nomad's `structs.ConnectProxyPrefix` (the sidecar's default port label and task kind).
pub const CONNECT_PROXY_PREFIX: &str = "connect-proxy";
/// Nomad's `structs.ConnectTerminatingPrefix`.
pub const CONNECT_TERMINATING_PREFIX: &str = "connect-terminating";
/// Nomad's `structs.ConnectMeshPrefix`.
pub const CONNECT_MESH_PREFIX: &str = "connect-mesh";

/// What a `connect {}` block adds to a registration.
#[derive(Debug, Default)]
pub(super) struct ConnectParts {
    pub kind: &'static str,
    pub connect: Option<ServiceConnect>,
    pub proxy: Option<ConnectProxyConfig>,
}

/// One allocated port: host value, value inside the network namespace, host IP.
#[derive(Debug, Clone)]
struct PortMapping {
    value: i64,
    to: i64,
    host_ip: String,
}

/// The Connect parts of service `name` (interpolated) with ID `service_id` and port label
/// `port_label` (interpolated). The error is Nomad's, without the service it is about.
pub(super) fn connect_parts(
    alloc: &Allocation,
    node: &Node,
    interp: &Interpolator<'_>,
    service_id: &str,
    name: &str,
    port_label: &str,
    c: &ConsulConnect,
) -> Result<ConnectParts, String> {
    if let Some(gateway) = &c.gateway {
        let kind = if gateway.ingress.is_some() {
            "ingress-gateway"
        } else if gateway.terminating.is_some() {
            "terminating-gateway"
        } else if gateway.mesh.is_some() {
            "mesh-gateway"
        } else {
            ""
        };
        let proxy = gateway_proxy(alloc, interp, kind, name, port_label, gateway.proxy.as_ref());
        return Ok(ConnectParts { kind, connect: None, proxy: Some(proxy) });
    }
    if c.native {
        return Ok(ConnectParts { connect: Some(ServiceConnect { native: true, sidecar_service: None }), ..ConnectParts::default() });
    }
    let Some(sidecar) = &c.sidecar_service else {
        return Err(format!("Connect configuration empty for service {name}"));
    };
    let registration = sidecar_registration(alloc, node, interp, service_id, name, sidecar)?;
    Ok(ConnectParts {
        connect: Some(ServiceConnect { native: false, sidecar_service: Some(Box::new(registration)) }),
        ..ConnectParts::default()
    })
}

/// Nomad's `connectSidecarRegistration`.
fn sidecar_registration(
    alloc: &Allocation,
    node: &Node,
    interp: &Interpolator<'_>,
    service_id: &str,
    name: &str,
    css: &ConsulSidecarService,
) -> Result<ServiceRegistration, String> {
    let label = match interp.replace(&css.port) {
        l if l.is_empty() => format!("{CONNECT_PROXY_PREFIX}-{name}"),
        l => l,
    };
    let mapping = connect_port(alloc, &label)?;
    let host_ip = if mapping.host_ip.is_empty() { node_address(node) } else { mapping.host_ip.clone() };
    let default_proxy = ConsulProxy::default();
    let proxy = css.proxy.as_ref().unwrap_or(&default_proxy);

    let mut checks = vec![ServiceCheck {
        name: format!("Connect Sidecar Aliasing {service_id}"),
        alias_service: service_id.to_string(),
        ..ServiceCheck::default()
    }];
    if !css.disable_default_tcp_check {
        checks.push(ServiceCheck {
            name: "Connect Sidecar Listening".into(),
            tcp: join_host_port(&host_ip, mapping.value),
            interval: "10s".into(),
            ..ServiceCheck::default()
        });
    }
    Ok(ServiceRegistration {
        tags: css.tags.iter().map(|t| interp.replace(t)).collect(),
        port: mapping.value,
        address: host_ip,
        // Nomad 1.6 sends the sidecar's meta as written (not interpolated).
        meta: css.meta.clone(),
        proxy: Some(sidecar_proxy(alloc, interp, proxy, mapping.to)?),
        checks,
        ..ServiceRegistration::default()
    })
}

/// Nomad's `connectSidecarProxy`: `bind_port` is the sidecar port inside the namespace.
fn sidecar_proxy(alloc: &Allocation, interp: &Interpolator<'_>, proxy: &ConsulProxy, bind_port: i64) -> Result<ConnectProxyConfig, String> {
    let mut config = interpolate_config(interp, &proxy.config);
    config.insert("bind_address".into(), json!("0.0.0.0"));
    config.insert("bind_port".into(), json!(bind_port));
    inject_stats_tags(&mut config, alloc);
    Ok(ConnectProxyConfig {
        local_service_address: interp.replace(&proxy.local_service_address),
        local_service_port: proxy.local_service_port,
        config,
        upstreams: proxy.upstreams.iter().map(|u| upstream(interp, u)).collect(),
        expose: expose(alloc, interp, proxy.expose.as_ref())?,
        ..ConnectProxyConfig::default()
    })
}

fn upstream(interp: &Interpolator<'_>, u: &ConsulUpstream) -> Upstream {
    // Nomad's connectMeshGateway: an unknown mode is Consul's default.
    let mode = u.mesh_gateway.as_ref().and_then(|m| m.get("Mode")).and_then(Value::as_str).unwrap_or_default();
    let mode = if matches!(mode, "local" | "remote" | "none") { mode.to_string() } else { String::new() };
    Upstream {
        destination_name: interp.replace(&u.destination_name),
        destination_namespace: u.destination_namespace.clone(),
        local_bind_port: u.local_bind_port,
        datacenter: interp.replace(&u.datacenter),
        local_bind_address: interp.replace(&u.local_bind_address),
        config: interpolate_config(interp, &u.config),
        mesh_gateway: MeshGatewayConfig { mode },
        ..Upstream::default()
    }
}

/// Nomad's `connectProxyExpose`: each path's listener port is the host value of its label.
fn expose(alloc: &Allocation, interp: &Interpolator<'_>, expose: Option<&Value>) -> Result<ExposeConfig, String> {
    let Some(expose) = expose else { return Ok(ExposeConfig::default()) };
    // The API's deprecated `Path` is the same list as `Paths`.
    let paths = expose.get("Paths").or_else(|| expose.get("Path")).and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::with_capacity(paths.len());
    for p in &paths {
        let text = |k: &str| interp.replace(p.get(k).and_then(Value::as_str).unwrap_or_default());
        let label = text("ListenerPort");
        let listener = network_port(alloc, &label).filter(|m| m.value != 0).ok_or_else(|| format!("No port of label {label:?} defined"))?;
        out.push(ExposePath {
            listener_port: listener.value,
            path: text("Path"),
            local_path_port: p.get("LocalPathPort").and_then(Value::as_i64).unwrap_or_default(),
            protocol: text("Protocol"),
            parsed_from_check: false,
        });
    }
    Ok(ExposeConfig { checks: false, paths: out })
}

/// Nomad's `injectNomadInfo`: `envoy_stats_tags` gets the alloc's identity (sorted, empty
/// values left out). Tags the user set are kept and only the missing Nomad ones are added,
/// which is what Nomad's code means to do (it only manages it for a Go `[]string`).
fn inject_stats_tags(config: &mut BTreeMap<String, Value>, alloc: &Allocation) {
    let defaults = [
        ("nomad.alloc_id=", alloc.id.as_str()),
        ("nomad.group=", alloc.task_group.as_str()),
        ("nomad.job=", alloc.job_id.as_str()),
        ("nomad.namespace=", alloc.namespace.as_str()),
    ];
    let existing: Option<Vec<String>> = config
        .get("envoy_stats_tags")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .and_then(|a| a.iter().map(|v| v.as_str().map(String::from)).collect());
    let tags = match existing {
        Some(mut tags) => {
            for (key, value) in defaults {
                if !tags.iter().any(|t| t.starts_with(key)) {
                    tags.push(format!("{key}{value}"));
                }
            }
            tags
        }
        None => defaults.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| format!("{k}{v}")).collect(),
    };
    config.insert("envoy_stats_tags".into(), json!(tags));
}

/// Nomad's `newConnectGateway` plus `serviceRegs`' port fill-ins: the gateway's Envoy settings
/// as `Proxy.Config`; a bridge terminating gateway's `default` bind address gets the
/// `connect-terminating-<service>` port, a mesh gateway's `wan` the service's port and `lan`
/// the `connect-mesh-<service>-lan` port.
fn gateway_proxy(
    alloc: &Allocation,
    interp: &Interpolator<'_>,
    kind: &str,
    name: &str,
    port_label: &str,
    proxy: Option<&Value>,
) -> ConnectProxyConfig {
    let Some(p) = proxy else { return ConnectProxyConfig::default() };
    let allocated = |label: &str| ports(alloc, "").into_iter().find(|m| m.label == label).map(|m| m.value);
    let mut binds = serde_json::Map::new();
    for (k, v) in p.get("EnvoyGatewayBindAddresses").and_then(Value::as_object).into_iter().flatten() {
        let key = interp.replace(k);
        let address = interp.replace(v.get("Address").and_then(Value::as_str).unwrap_or_default());
        let mut port = v.get("Port").and_then(Value::as_i64).unwrap_or_default();
        let fill = match (kind, key.as_str()) {
            ("terminating-gateway", "default") => allocated(&format!("{CONNECT_TERMINATING_PREFIX}-{name}")),
            ("mesh-gateway", "wan") => allocated(port_label),
            ("mesh-gateway", "lan") => allocated(&format!("{CONNECT_MESH_PREFIX}-{name}-lan")),
            _ => None,
        };
        if let Some(v) = fill {
            port = v;
        }
        binds.insert(key, json!({"Address": address, "Port": port}));
    }
    let mut config = BTreeMap::new();
    if !binds.is_empty() {
        config.insert("envoy_gateway_bind_addresses".to_string(), Value::Object(binds));
    }
    if p.get("EnvoyGatewayNoDefaultBind").and_then(Value::as_bool) == Some(true) {
        config.insert("envoy_gateway_no_default_bind".into(), json!(true));
    }
    if p.get("EnvoyGatewayBindTaggedAddresses").and_then(Value::as_bool) == Some(true) {
        config.insert("envoy_gateway_bind_tagged_addresses".into(), json!(true));
    }
    if let Some(dns) = p.get("EnvoyDNSDiscoveryType").and_then(Value::as_str).filter(|s| !s.is_empty()) {
        config.insert("envoy_dns_discovery_type".into(), json!(dns));
    }
    if let Some(ns) = p.get("ConnectTimeout").and_then(Value::as_i64) {
        // Go's Duration.Milliseconds truncates.
        config.insert("connect_timeout_ms".into(), json!(ns / 1_000_000));
    }
    let user = p.get("Config").and_then(Value::as_object).map(|m| m.clone().into_iter().collect()).unwrap_or_default();
    config.extend(interpolate_config(interp, &user));
    ConnectProxyConfig { config, ..ConnectProxyConfig::default() }
}

/// Nomad's `interpolateMapStringInterface`: keys and top-level string values.
fn interpolate_config(interp: &Interpolator<'_>, config: &BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    config
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => Value::String(interp.replace(s)),
                other => other.clone(),
            };
            (interp.replace(k), v)
        })
        .collect()
}

/// Nomad's `connectPort`: the alloc's one network, the port by label among the allocated
/// ports, else among the network's.
fn connect_port(alloc: &Allocation, label: &str) -> Result<PortMapping, String> {
    let networks = group_networks(alloc);
    if networks.len() != 1 {
        return Err(format!("Connect only supported with exactly 1 network (found {})", networks.len()));
    }
    let allocated = alloc.allocated_resources.as_ref().and_then(|r| r.shared.ports.iter().find(|p| p.label == label));
    if let Some(p) = allocated {
        return Ok(PortMapping { value: p.value, to: p.to, host_ip: p.host_ip.clone() });
    }
    network_port(alloc, label).filter(|m| m.value > 0).ok_or_else(|| format!("No port of label {label:?} defined"))
}

/// Nomad's `Networks.Port` over the alloc's group networks (after the one-network check).
fn network_port(alloc: &Allocation, label: &str) -> Option<PortMapping> {
    let networks = group_networks(alloc);
    if networks.len() != 1 {
        return None;
    }
    networks.iter().find_map(|n| {
        n.reserved_ports.iter().chain(n.dynamic_ports.iter()).find(|p| p.label == label).map(|p| PortMapping {
            value: p.value,
            to: p.to,
            host_ip: n.ip.clone(),
        })
    })
}

fn group_networks(alloc: &Allocation) -> &[nomad_proto::resources::NetworkResource] {
    alloc.allocated_resources.as_ref().map(|r| r.shared.networks.as_slice()).unwrap_or_default()
}

#[cfg(test)]
mod tests;
