//! `network { mode hostname dns {} port "<label>" { static to host_network } }`, and
//! `reserved_ports "<label>" { static ... }`, the older spelling of a static port.

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
    let ports = r.blocks("port", 1)?;
    let reserved = r.blocks("reserved_ports", 1)?;
    // Nomad 1.6 replaces the reserved_ports blocks with the static `port` blocks whenever a
    // network has `port` blocks, dropping them without a word; refused rather than dropped.
    if let (Some(first), false) = (reserved.first(), ports.is_empty()) {
        return Err(Diag::new(
            ErrorKind::Structure,
            first.offset,
            format!(
                "reserved_ports \"{}\" in {} cannot be combined with port blocks (Nomad drops it); write it as port \"{}\" {{ static = ... }}",
                first.label(),
                r.context(),
                first.label()
            ),
        ));
    }
    for (kind, block) in ports.iter().map(|b| ("port", b)).chain(reserved.iter().map(|b| ("reserved_ports", b))) {
        let label = block.label().to_string();
        if n.reserved_ports.iter().chain(&n.dynamic_ports).any(|p| p.label == label) {
            return Err(Diag::new(ErrorKind::Structure, block.offset, format!("port \"{label}\" is defined twice in {}", r.context())));
        }
        let p = r.child(block)?;
        let mut decoded = Port { label, ..Port::default() };
        p.set_int("static", &mut decoded.value)?;
        p.set_int("to", &mut decoded.to)?;
        p.set_string("host_network", &mut decoded.host_network)?;
        p.finish()?;
        if kind == "reserved_ports" && decoded.value <= 0 {
            return Err(Diag::new(
                ErrorKind::InvalidValue,
                block.offset,
                format!("reserved_ports \"{}\" in {} needs static, the host port to reserve", decoded.label, r.context()),
            ));
        }
        if decoded.value > 0 {
            n.reserved_ports.push(decoded);
        } else {
            n.dynamic_ports.push(decoded);
        }
    }
    r.finish()?;
    Ok(n)
}
