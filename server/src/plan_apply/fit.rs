//! Does a set of allocs fit on a node: cpu, memory, disk, host ports, cores.

use std::collections::BTreeSet;

use nomad_proto::{Allocation, Node};

use crate::state::{AllocHold, Load};

/// Resources held, in Nomad's units (MHz, MiB, MiB).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// CPU shares in MHz.
    pub cpu: i64,
    /// Memory in MiB.
    pub memory_mb: i64,
    /// Disk in MiB.
    pub disk_mb: i64,
}

/// What an alloc holds: its allocated resources, else its group's asks
/// (allocs written before resources were recorded).
pub fn alloc_usage(a: &Allocation) -> Usage {
    let h = AllocHold::of(a);
    Usage { cpu: h.cpu, memory_mb: h.memory_mb, disk_mb: h.disk_mb }
}

/// What a node offers for allocs: its resources minus what it reserves (negative when it
/// reserves more than it has: nothing fits). Registration bounds both, but a stored node is
/// not re-validated: each side counts as at least 0, so the difference cannot overflow.
pub fn node_capacity(n: &Node) -> Usage {
    let Some(r) = &n.node_resources else { return Usage::default() };
    let reserved = n.reserved_resources.as_ref();
    let offer = |total: i64, held: Option<i64>| total.max(0) - held.unwrap_or(0).max(0);
    Usage {
        cpu: offer(r.cpu.cpu_shares, reserved.map(|x| x.cpu.cpu_shares)),
        memory_mb: offer(r.memory.memory_mb, reserved.map(|x| x.memory.memory_mb)),
        disk_mb: offer(r.disk.disk_mb, reserved.map(|x| x.disk.disk_mb)),
    }
}

/// Parses a reserved port list such as `22,80,8000-8100`; bad parts are skipped.
pub fn parse_port_list(spec: &str) -> BTreeSet<i64> {
    let mut ports = BTreeSet::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<i64>(), hi.trim().parse::<i64>())
                    && lo <= hi
                    && hi - lo <= 65_535
                {
                    ports.extend(lo..=hi);
                }
            }
            None => {
                if let Ok(p) = part.parse() {
                    ports.insert(p);
                }
            }
        }
    }
    ports
}

/// What fitting needs to know of one alloc, without the alloc.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Held {
    /// Resources and ports.
    pub hold: AllocHold,
    /// Finished (client or server side): holds nothing.
    pub terminal: bool,
}

impl Held {
    /// What `a` holds.
    pub fn of(a: &Allocation) -> Held {
        Held { hold: AllocHold::of(a), terminal: a.terminal() }
    }
}

/// Checks that `allocs` (the node's proposed non-terminal allocs) fit on
/// `node`. The error names the exhausted dimension, as Nomad does.
pub fn allocs_fit<'a>(node: &Node, allocs: impl IntoIterator<Item = &'a Allocation>) -> Result<(), String> {
    let mut load = Load::default();
    allocs.into_iter().for_each(|a| load.add(&AllocHold::of(a)));
    fits(node, &load)
}

/// Whether `load` fits on `node`: no port held twice or reserved by the node, no core held
/// twice, and cpu, memory and disk within what the node offers.
pub fn fits(node: &Node, load: &Load) -> Result<(), String> {
    if let Some(p) = load.repeated_port() {
        return Err(format!("network: port collision ({p})"));
    }
    let reserved = node.reserved_resources.as_ref().map(|r| r.networks.reserved_host_ports.as_str()).unwrap_or("");
    if !reserved.is_empty() && !load.ports.is_empty() {
        let reserved = parse_port_list(reserved);
        if let Some(p) = load.ports.iter().find(|p| reserved.contains(p)) {
            return Err(format!("network: port collision ({p})"));
        }
    }
    if load.repeated_core() {
        return Err("cores".to_string());
    }
    let capacity = node_capacity(node);
    if load.cpu > i128::from(capacity.cpu) {
        return Err("cpu".to_string());
    }
    if load.memory_mb > i128::from(capacity.memory_mb) {
        return Err("memory".to_string());
    }
    if load.disk_mb > i128::from(capacity.disk_mb) {
        return Err("disk".to_string());
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use nomad_proto::AllocatedResources;
    use nomad_proto::resources::{AllocatedCpuResources, AllocatedMemoryResources, AllocatedPortMapping, AllocatedTaskResources};

    use super::*;

    pub(crate) fn sized(cpu: i64, mem: i64, ports: &[i64]) -> Allocation {
        let mut r = AllocatedResources::default();
        r.tasks.insert(
            "t".into(),
            AllocatedTaskResources {
                cpu: AllocatedCpuResources { cpu_shares: cpu, ..Default::default() },
                memory: AllocatedMemoryResources { memory_mb: mem, ..Default::default() },
                ..Default::default()
            },
        );
        r.shared.ports = ports.iter().map(|p| AllocatedPortMapping { label: "p".into(), value: *p, ..Default::default() }).collect();
        Allocation { allocated_resources: Some(r), ..Allocation::default() }
    }

    #[test]
    fn every_dimension_is_checked() {
        let mut node = crate::testing::node("n1");
        node.reserved_resources = Some(nomad_proto::resources::NodeReservedResources {
            cpu: nomad_proto::resources::NodeReservedCpuResources { cpu_shares: 500, ..Default::default() },
            networks: nomad_proto::resources::NodeReservedNetworkResources { reserved_host_ports: "22, 8000-8002".into() },
            ..Default::default()
        });
        assert_eq!(allocs_fit(&node, [&sized(3500, 8192, &[80])]), Ok(()));
        assert_eq!(allocs_fit(&node, [&sized(3501, 1, &[])]), Err("cpu".into()));
        assert_eq!(allocs_fit(&node, [&sized(1, 4096, &[]), &sized(1, 4097, &[])]), Err("memory".into()));
        assert_eq!(allocs_fit(&node, [&sized(1, 1, &[8001])]), Err("network: port collision (8001)".into()));
        assert_eq!(allocs_fit(&node, [&sized(1, 1, &[9000]), &sized(1, 1, &[9000])]), Err("network: port collision (9000)".into()));
    }

    #[test]
    fn allocs_without_recorded_resources_count_their_group_asks() {
        let job = std::sync::Arc::new({
            let mut j = crate::testing::job("web", 1);
            j.canonicalize();
            j
        });
        let a = Allocation { job: Some(job), task_group: "web".into(), ..Allocation::default() };
        let u = alloc_usage(&a);
        assert_eq!((u.cpu, u.memory_mb), (100, 300));
    }
}
