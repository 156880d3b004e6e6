//! `service` blocks: checks, `check_restart`, and Consul Connect
//! (`sidecar_service`, `proxy`, `upstreams`, `sidecar_task`, `gateway`).

use std::collections::BTreeMap;

use hcl::Value;
use hcl::edit::structure::Structure;
use serde_json::json;

use crate::service::{
    CheckRestart, ConsulConnect, ConsulGateway, ConsulLinkedService, ConsulProxy, ConsulSidecarService, ConsulTerminatingConfigEntry,
    ConsulUpstream, Service, ServiceCheck, SidecarTask,
};

use super::error::{DResult, Diag, ErrorKind};
use super::eval::{as_string, start_of};
use super::reader::Reader;
use super::task::{log_config, resources};

/// Decodes a group or task `service` block.
pub(crate) fn service(r: &Reader<'_>) -> DResult<Service> {
    let mut s = Service::default();
    r.set_string("name", &mut s.name)?;
    r.set_string("port", &mut s.port_label)?;
    r.set_strings("tags", &mut s.tags)?;
    r.set_strings("canary_tags", &mut s.canary_tags)?;
    r.set_bool("enable_tag_override", &mut s.enable_tag_override)?;
    r.set_string("address_mode", &mut s.address_mode)?;
    r.set_string("address", &mut s.address)?;
    r.set_string("task", &mut s.task_name)?;
    r.set_string("on_update", &mut s.on_update)?;
    r.set_string("provider", &mut s.provider)?;
    r.set_string_map("meta", &mut s.meta)?;
    r.set_string_map("canary_meta", &mut s.canary_meta)?;
    r.set_string_map("tagged_addresses", &mut s.tagged_addresses)?;
    let service_restart = match r.block("check_restart")? {
        Some(b) => Some(CheckRestartOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    for c in r.blocks("check", 0)? {
        s.checks.push(check(&r.child(&c)?, service_restart.as_ref())?);
    }
    if let Some(c) = r.block("connect")? {
        s.connect = Some(connect(&r.child(&c)?)?);
    }
    r.finish()?;
    Ok(s)
}

/// Decodes a `check` block; `service_restart` is the service's
/// `check_restart`, which the check's own one refines (Nomad's merge).
fn check(r: &Reader<'_>, service_restart: Option<&CheckRestartOverrides>) -> DResult<ServiceCheck> {
    let mut c = ServiceCheck::default();
    r.set_string("name", &mut c.name)?;
    r.set_string("type", &mut c.check_type)?;
    r.set_string("command", &mut c.command)?;
    r.set_strings("args", &mut c.args)?;
    r.set_string("path", &mut c.path)?;
    r.set_string("protocol", &mut c.protocol)?;
    r.set_string("port", &mut c.port_label)?;
    r.set_bool("expose", &mut c.expose)?;
    r.set_string("address_mode", &mut c.address_mode)?;
    r.set_duration("interval", &mut c.interval)?;
    r.set_duration("timeout", &mut c.timeout)?;
    r.set_string("initial_status", &mut c.initial_status)?;
    r.set_bool("tls_skip_verify", &mut c.tls_skip_verify)?;
    r.set_string("tls_server_name", &mut c.tls_server_name)?;
    r.set_string("method", &mut c.method)?;
    r.set_string("body", &mut c.body)?;
    r.set_string("grpc_service", &mut c.grpc_service)?;
    r.set_bool("grpc_use_tls", &mut c.grpc_use_tls)?;
    r.set_string("task", &mut c.task_name)?;
    r.set_int("success_before_passing", &mut c.success_before_passing)?;
    r.set_int("failures_before_critical", &mut c.failures_before_critical)?;
    r.set_string("on_update", &mut c.on_update)?;
    // Accepted for compatibility; our check type has no field for it.
    let _advertise = r.string("advertise")?;
    if let Some(h) = r.block("header")? {
        c.header = header(&r.child(&h)?)?;
    }
    let own_restart = match r.block("check_restart")? {
        Some(b) => Some(CheckRestartOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    r.finish()?;
    if service_restart.is_some() || own_restart.is_some() {
        let mut restart = CheckRestart::default();
        for o in [service_restart, own_restart.as_ref()].into_iter().flatten() {
            o.apply(&mut restart);
        }
        c.check_restart = Some(restart);
    }
    Ok(c)
}

/// `header { Name = ["value", ...] }`: each header maps to a list of values.
fn header(r: &Reader<'_>) -> DResult<BTreeMap<String, Vec<String>>> {
    let mut out = BTreeMap::new();
    for s in r.body().iter() {
        let Structure::Attribute(a) = s else {
            return Err(Diag::new(
                ErrorKind::Structure,
                r.offset_of(s),
                format!("only Name = [\"value\"] pairs are allowed in {}", r.context()),
            ));
        };
        let name = a.key.as_str();
        let at = start_of(&a.value);
        let values = match r.eval(&a.value)? {
            Value::Array(items) => items
                .iter()
                .map(|v| as_string(v).ok_or_else(|| r.type_mismatch(name, at, "a list of strings", v)))
                .collect::<DResult<Vec<_>>>()?,
            other => return Err(r.type_mismatch(name, at, "a list of strings", &other)),
        };
        out.insert(name.to_string(), values);
    }
    Ok(out)
}

/// The keys a `check_restart` block sets.
#[derive(Debug, Clone, Default)]
struct CheckRestartOverrides {
    limit: Option<i64>,
    grace: Option<i64>,
    ignore_warnings: Option<bool>,
}

impl CheckRestartOverrides {
    fn read(r: &Reader<'_>) -> DResult<CheckRestartOverrides> {
        let o = CheckRestartOverrides { limit: r.int("limit")?, grace: r.duration("grace")?, ignore_warnings: r.bool("ignore_warnings")? };
        r.finish()?;
        Ok(o)
    }

    /// Nomad's `api.CheckRestart.Merge`: the check's positive limit, given grace and true
    /// ignore_warnings win over the service's.
    fn apply(&self, c: &mut CheckRestart) {
        if let Some(v) = self.limit.filter(|v| *v > 0) {
            c.limit = v;
        }
        if let Some(v) = self.grace {
            c.grace = v;
        }
        if self.ignore_warnings == Some(true) {
            c.ignore_warnings = true;
        }
    }
}

fn connect(r: &Reader<'_>) -> DResult<ConsulConnect> {
    let mut c = ConsulConnect::default();
    r.set_bool("native", &mut c.native)?;
    if let Some(b) = r.block("sidecar_service")? {
        c.sidecar_service = Some(sidecar_service(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("sidecar_task")? {
        c.sidecar_task = Some(sidecar_task(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("gateway")? {
        c.gateway = Some(gateway(&r.child(&b)?)?);
    }
    r.finish()?;
    Ok(c)
}

fn sidecar_service(r: &Reader<'_>) -> DResult<ConsulSidecarService> {
    let mut s = ConsulSidecarService::default();
    r.set_strings("tags", &mut s.tags)?;
    r.set_string("port", &mut s.port)?;
    r.set_bool("disable_default_tcp_check", &mut s.disable_default_tcp_check)?;
    r.set_string_map("meta", &mut s.meta)?;
    if let Some(b) = r.block("proxy")? {
        s.proxy = Some(proxy(&r.child(&b)?)?);
    }
    r.finish()?;
    Ok(s)
}

fn proxy(r: &Reader<'_>) -> DResult<ConsulProxy> {
    let mut p = ConsulProxy::default();
    r.set_string("local_service_address", &mut p.local_service_address)?;
    r.set_int("local_service_port", &mut p.local_service_port)?;
    for u in r.blocks("upstreams", 0)? {
        p.upstreams.push(upstream(&r.child(&u)?)?);
    }
    if let Some(b) = r.block("expose")? {
        let e = r.child(&b)?;
        let mut paths = Vec::new();
        for path in e.blocks("path", 0)? {
            let pr = e.child(&path)?;
            paths.push(json!({
                "Path": pr.string("path")?.unwrap_or_default(),
                "Protocol": pr.string("protocol")?.unwrap_or_default(),
                "LocalPathPort": pr.int("local_path_port")?.unwrap_or_default(),
                "ListenerPort": pr.string("listener_port")?.unwrap_or_default(),
            }));
            pr.finish()?;
        }
        e.finish()?;
        p.expose = Some(json!({ "Paths": paths }));
    }
    if let Some(config) = r.free_form("config")? {
        p.config = config;
    }
    r.finish()?;
    Ok(p)
}

fn upstream(r: &Reader<'_>) -> DResult<ConsulUpstream> {
    let mut u = ConsulUpstream::default();
    r.set_string("destination_name", &mut u.destination_name)?;
    r.set_string("destination_namespace", &mut u.destination_namespace)?;
    r.set_int("local_bind_port", &mut u.local_bind_port)?;
    r.set_string("datacenter", &mut u.datacenter)?;
    r.set_string("local_bind_address", &mut u.local_bind_address)?;
    if let Some(b) = r.block("mesh_gateway")? {
        let m = r.child(&b)?;
        u.mesh_gateway = Some(json!({ "Mode": m.string("mode")?.unwrap_or_default() }));
        m.finish()?;
    }
    if let Some(config) = r.free_form("config")? {
        u.config = config;
    }
    r.finish()?;
    Ok(u)
}

fn sidecar_task(r: &Reader<'_>) -> DResult<SidecarTask> {
    let mut t = SidecarTask::default();
    r.set_string("name", &mut t.name)?;
    r.set_string("driver", &mut t.driver)?;
    r.set_string("user", &mut t.user)?;
    r.set_string("kill_signal", &mut t.kill_signal)?;
    r.set_string_map("env", &mut t.env)?;
    r.set_string_map("meta", &mut t.meta)?;
    t.kill_timeout = r.duration("kill_timeout")?;
    t.shutdown_delay = r.duration("shutdown_delay")?;
    if let Some(config) = r.free_form("config")? {
        t.config = config;
    }
    if let Some(b) = r.block("resources")? {
        t.resources = Some(resources(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("logs")? {
        t.log_config = Some(log_config(&r.child(&b)?)?);
    }
    r.finish()?;
    Ok(t)
}

fn gateway(r: &Reader<'_>) -> DResult<ConsulGateway> {
    let mut g = ConsulGateway::default();
    if let Some(b) = r.block("proxy")? {
        g.proxy = Some(gateway_proxy(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("ingress")? {
        g.ingress = Some(ingress(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("terminating")? {
        let t = r.child(&b)?;
        let mut entry = ConsulTerminatingConfigEntry::default();
        for s in t.blocks("service", 0)? {
            let sr = t.child(&s)?;
            let mut linked = ConsulLinkedService::default();
            sr.set_string("name", &mut linked.name)?;
            sr.set_string("ca_file", &mut linked.ca_file)?;
            sr.set_string("cert_file", &mut linked.cert_file)?;
            sr.set_string("key_file", &mut linked.key_file)?;
            sr.set_string("sni", &mut linked.sni)?;
            sr.finish()?;
            entry.services.push(linked);
        }
        t.finish()?;
        g.terminating = Some(entry);
    }
    if let Some(b) = r.block("mesh")? {
        r.child(&b)?.finish()?;
        g.mesh = Some(json!({}));
    }
    r.finish()?;
    Ok(g)
}

/// The gateway's Envoy settings, kept as Nomad's JSON shape.
fn gateway_proxy(r: &Reader<'_>) -> DResult<serde_json::Value> {
    let mut bind_addresses = serde_json::Map::new();
    for b in r.blocks("envoy_gateway_bind_addresses", 1)? {
        let a = r.child(&b)?;
        bind_addresses.insert(
            b.label().to_string(),
            json!({ "Address": a.string("address")?.unwrap_or_default(), "Port": a.int("port")?.unwrap_or_default() }),
        );
        a.finish()?;
    }
    let value = json!({
        "ConnectTimeout": r.duration("connect_timeout")?,
        "EnvoyGatewayBindTaggedAddresses": r.bool("envoy_gateway_bind_tagged_addresses")?.unwrap_or_default(),
        "EnvoyGatewayBindAddresses": bind_addresses,
        "EnvoyGatewayNoDefaultBind": r.bool("envoy_gateway_no_default_bind")?.unwrap_or_default(),
        "EnvoyDNSDiscoveryType": r.string("envoy_dns_discovery_type")?.unwrap_or_default(),
        "Config": r.free_form("config")?.unwrap_or_default(),
    });
    r.finish()?;
    Ok(value)
}

/// An ingress gateway's config entry, kept as Nomad's JSON shape.
fn ingress(r: &Reader<'_>) -> DResult<serde_json::Value> {
    let tls = match r.block("tls")? {
        None => serde_json::Value::Null,
        Some(b) => {
            let t = r.child(&b)?;
            let v = json!({
                "Enabled": t.bool("enabled")?.unwrap_or_default(),
                "TLSMinVersion": t.string("tls_min_version")?.unwrap_or_default(),
                "TLSMaxVersion": t.string("tls_max_version")?.unwrap_or_default(),
                "CipherSuites": t.strings("cipher_suites")?.unwrap_or_default(),
            });
            t.finish()?;
            v
        }
    };
    let mut listeners = Vec::new();
    for l in r.blocks("listener", 0)? {
        let lr = r.child(&l)?;
        let mut services = Vec::new();
        for s in lr.blocks("service", 0)? {
            let sr = lr.child(&s)?;
            services.push(json!({ "Name": sr.string("name")?.unwrap_or_default(), "Hosts": sr.strings("hosts")?.unwrap_or_default() }));
            sr.finish()?;
        }
        listeners.push(json!({
            "Port": lr.int("port")?.unwrap_or_default(),
            "Protocol": lr.string("protocol")?.unwrap_or_default(),
            "Services": services,
        }));
        lr.finish()?;
    }
    r.finish()?;
    Ok(json!({ "TLS": tls, "Listeners": listeners }))
}
