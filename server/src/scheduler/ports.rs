//! Host port accounting and assignment (Nomad's `NetworkIndex`, one address per node).
//!
//! Static ports must be free; dynamic ports are picked from the node's
//! dynamic range, first by random probing (cheap on sparse nodes), then by
//! scanning the free ports and picking one at random. Randomness comes from
//! the eval's seeded generator so a run can be replayed.

use nomad_proto::resources::AllocatedPortMapping;
use nomad_proto::{NetworkResource, Node, Port};
use rand::Rng;

/// Nomad's defaults for the dynamic port range.
pub(crate) const DEFAULT_MIN_DYNAMIC_PORT: i64 = 20000;
/// Upper end of the default dynamic range.
pub(crate) const DEFAULT_MAX_DYNAMIC_PORT: i64 = 32000;
const MAX_RAND_PORT_ATTEMPTS: usize = 20;
const MAX_VALID_PORT: i64 = 65536;

/// Host ports taken on a node: the node's reserved ranges plus allocs' ports.
#[derive(Debug, Clone, Default)]
pub(crate) struct PortSet {
    used: Vec<u16>,
    reserved: Vec<(u16, u16)>,
}

impl PortSet {
    /// A set holding the node's reserved ports (`22,80,8000-8100`).
    pub(crate) fn for_node(node: &Node) -> Result<PortSet, String> {
        let spec = node.reserved_resources.as_ref().map(|r| r.networks.reserved_host_ports.as_str()).unwrap_or("");
        let mut reserved = parse_port_ranges(spec)?;
        if let Some(nr) = &node.node_resources {
            for n in &nr.node_networks {
                for a in &n.addresses {
                    reserved.extend(parse_port_ranges(&a.reserved_ports)?);
                }
            }
        }
        Ok(PortSet { used: Vec::new(), reserved })
    }

    /// True when `port` is taken.
    pub(crate) fn contains(&self, port: i64) -> bool {
        let Ok(p) = u16::try_from(port) else { return true };
        self.used.binary_search(&p).is_ok() || self.reserved.iter().any(|(lo, hi)| (*lo..=*hi).contains(&p))
    }

    /// The ports taken by allocs (tests compare usages).
    #[cfg(test)]
    pub(crate) fn used(&self) -> &[u16] {
        &self.used
    }

    /// Marks `port` taken; false when it already was (a collision).
    pub(crate) fn insert(&mut self, port: i64) -> bool {
        if self.contains(port) {
            return false;
        }
        let p = port as u16;
        let pos = self.used.binary_search(&p).unwrap_or_else(|e| e);
        self.used.insert(pos, p);
        true
    }
}

/// Parses `22,80,8000-8100`.
pub(crate) fn parse_port_ranges(spec: &str) -> Result<Vec<(u16, u16)>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let parse = |s: &str| s.trim().parse::<u16>().map_err(|_| format!("invalid port {s:?} in {spec:?}"));
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (parse(lo)?, parse(hi)?);
                if lo > hi {
                    return Err(format!("invalid port range {part:?}"));
                }
                out.push((lo, hi));
            }
            None => {
                let p = parse(part)?;
                out.push((p, p));
            }
        }
    }
    Ok(out)
}

/// The address ports are bound on.
pub(crate) fn node_host_ip(node: &Node) -> String {
    if let Some(nr) = &node.node_resources {
        let host_nets = nr.node_networks.iter().filter(|n| n.mode.is_empty() || n.mode == "host");
        if let Some(a) = host_nets.flat_map(|n| n.addresses.iter()).next() {
            return a.address.clone();
        }
        if let Some(n) = nr.networks.iter().find(|n| !n.ip.is_empty()) {
            return n.ip.clone();
        }
    }
    node.attributes.get("unique.network.ip-address").cloned().unwrap_or_default()
}

/// The node's dynamic port range.
pub(crate) fn dynamic_range(node: &Node) -> (i64, i64) {
    let nr = node.node_resources.as_ref();
    let min = nr.map(|r| r.min_dynamic_port).filter(|p| *p > 0).unwrap_or(DEFAULT_MIN_DYNAMIC_PORT);
    let max = nr.map(|r| r.max_dynamic_port).filter(|p| *p > 0).unwrap_or(DEFAULT_MAX_DYNAMIC_PORT);
    // A misconfigured range must not make the scan below huge.
    (min.clamp(1, MAX_VALID_PORT - 1), max.clamp(1, MAX_VALID_PORT - 1))
}

/// What an assigned network ask gives the alloc.
#[derive(Debug, Clone)]
pub(crate) struct PortOffer {
    /// The flat list (`Shared.Ports`).
    pub(crate) ports: Vec<AllocatedPortMapping>,
    /// The ask with values filled in.
    pub(crate) network: NetworkResource,
}

/// Assigns the ask's ports on top of `used`. On success the offered ports
/// are marked used (so a second ask in the same alloc cannot take them).
/// The error is the `DimensionExhausted` reason without the `network: ` prefix.
pub(crate) fn assign_ports(
    ask: &NetworkResource,
    used: &mut PortSet,
    range: (i64, i64),
    host_ip: &str,
    rng: &mut impl Rng,
) -> Result<PortOffer, String> {
    let mut offer = Vec::with_capacity(ask.reserved_ports.len() + ask.dynamic_ports.len());
    let mut network = ask.clone();
    network.ip = host_ip.to_string();
    for p in &ask.reserved_ports {
        if p.value < 0 || p.value >= MAX_VALID_PORT {
            return Err(format!("invalid port {} (out of range)", p.value));
        }
        if used.contains(p.value) || offer.iter().any(|o: &AllocatedPortMapping| o.value == p.value) {
            return Err(format!("reserved port collision {}={}", p.label, p.value));
        }
        offer.push(mapping(p, p.value, host_ip));
    }
    let statics: Vec<i64> = ask.reserved_ports.iter().map(|p| p.value).collect();
    for (i, p) in ask.dynamic_ports.iter().enumerate() {
        let taken = |v: i64, offer: &[AllocatedPortMapping]| used.contains(v) || statics.contains(&v) || offer.iter().any(|o| o.value == v);
        let value = pick_dynamic(range, rng, |v| taken(v, &offer)).ok_or_else(|| "dynamic port selection failed".to_string())?;
        let mut m = mapping(p, value, host_ip);
        if m.to == -1 {
            m.to = value;
        }
        network.dynamic_ports[i].value = value;
        offer.push(m);
    }
    for o in &offer {
        used.insert(o.value);
    }
    Ok(PortOffer { ports: offer, network })
}

fn mapping(p: &Port, value: i64, host_ip: &str) -> AllocatedPortMapping {
    AllocatedPortMapping { label: p.label.clone(), value, to: p.to, host_ip: host_ip.to_string() }
}

fn pick_dynamic(range: (i64, i64), rng: &mut impl Rng, taken: impl Fn(i64) -> bool) -> Option<i64> {
    let (min, max) = range;
    if min > max {
        return None;
    }
    for _ in 0..MAX_RAND_PORT_ATTEMPTS {
        let v = if max > min { rng.random_range(min..max) } else { min };
        if !taken(v) {
            return Some(v);
        }
    }
    let free: Vec<i64> = (min..=max).filter(|v| !taken(*v)).collect();
    if free.is_empty() { None } else { Some(free[rng.random_range(0..free.len())]) }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn port(label: &str, value: i64) -> Port {
        Port { label: label.into(), value, ..Port::default() }
    }

    #[test]
    fn reserved_ranges_parse_and_block() {
        let mut set = PortSet { used: vec![], reserved: parse_port_ranges("22, 80,8000-8002").unwrap() };
        assert!(set.contains(22) && set.contains(8001) && !set.contains(8003));
        assert!(!set.insert(80), "reserved port is a collision");
        assert!(set.insert(9000));
        assert!(!set.insert(9000));
        assert!(parse_port_ranges("10-5").is_err());
        assert!(parse_port_ranges("http").is_err());
    }

    #[test]
    fn static_collision_names_the_port() {
        let mut used = PortSet::default();
        used.insert(8080);
        let ask = NetworkResource { reserved_ports: vec![port("http", 8080)], ..NetworkResource::default() };
        let err = assign_ports(&ask, &mut used, (20000, 32000), "10.0.0.1", &mut StdRng::seed_from_u64(1)).unwrap_err();
        assert_eq!(err, "reserved port collision http=8080");
    }

    #[test]
    fn dynamic_ports_avoid_used_reserved_and_each_other() {
        let mut used = PortSet { used: vec![], reserved: vec![(20000, 20002)] };
        used.insert(20004);
        let ask = NetworkResource {
            reserved_ports: vec![port("admin", 20003)],
            dynamic_ports: vec![port("a", 0), port("b", 0), Port { label: "c".into(), to: -1, ..Port::default() }],
            ..NetworkResource::default()
        };
        let offer = assign_ports(&ask, &mut used, (20000, 20007), "10.0.0.1", &mut StdRng::seed_from_u64(7)).unwrap();
        let values: Vec<i64> = offer.ports.iter().map(|p| p.value).collect();
        assert_eq!(values[0], 20003);
        let mut dynamic: Vec<i64> = values[1..].to_vec();
        dynamic.sort();
        assert_eq!(dynamic, vec![20005, 20006, 20007]);
        assert_eq!(offer.ports[3].to, offer.ports[3].value, "to = -1 maps to the host port");
        assert!(offer.ports.iter().all(|p| p.host_ip == "10.0.0.1"));
        assert_eq!(offer.network.dynamic_ports.iter().filter(|p| p.value > 0).count(), 3);
        // The range is now full.
        let again = NetworkResource { dynamic_ports: vec![port("d", 0)], ..NetworkResource::default() };
        let err = assign_ports(&again, &mut used, (20000, 20007), "", &mut StdRng::seed_from_u64(7)).unwrap_err();
        assert_eq!(err, "dynamic port selection failed");
    }
}
