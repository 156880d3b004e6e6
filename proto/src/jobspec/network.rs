//! `network { mode hostname dns {} port "<label>" { static to host_network } }`.

use crate::resources::{DnsConfig, NetworkResource, Port};

use super::error::{DResult, Diag, ErrorKind};
use super::reader::Reader;

/// Decodes a group or task `network` block. A port with `static > 0` is a
/// reserved port with that host value; any other port is dynamic (Nomad's
/// `normalizeNetworkPorts`).
pub(crate) fn network(r: &Reader<'_>) -> DResult<NetworkResource> {
    let mut n = NetworkResource::default();
    r.set_string("mode", &mut n.mode)?;
    r.set_string("hostname", &mut n.hostname)?;
    r.set_string("device", &mut n.device)?;
    r.set_string("cidr", &mut n.cidr)?;
    r.set_string("ip", &mut n.ip)?;
    r.set_int("mbits", &mut n.mbits)?;
    if let Some(dns) = r.block("dns")? {
        let d = r.child(&dns)?;
        let mut config = DnsConfig::default();
        d.set_strings("servers", &mut config.servers)?;
        d.set_strings("searches", &mut config.searches)?;
        d.set_strings("options", &mut config.options)?;
        d.finish()?;
        n.dns = Some(config);
    }
    for port in r.blocks("port", 1)? {
        let label = port.label().to_string();
        if n.reserved_ports.iter().chain(&n.dynamic_ports).any(|p| p.label == label) {
            return Err(Diag::new(ErrorKind::Structure, port.offset, format!("port \"{label}\" is defined twice in {}", r.context())));
        }
        let p = r.child(&port)?;
        let mut decoded = Port { label, ..Port::default() };
        p.set_int("static", &mut decoded.value)?;
        p.set_int("to", &mut decoded.to)?;
        p.set_string("host_network", &mut decoded.host_network)?;
        p.finish()?;
        if decoded.value > 0 {
            n.reserved_ports.push(decoded);
        } else {
            n.dynamic_ports.push(decoded);
        }
    }
    r.finish()?;
    Ok(n)
}
