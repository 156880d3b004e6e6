//! Does a group fit on a node, and with which resources (Nomad's bin-pack step)?
//!
//! The check is numeric and allocation-free for groups without ports; the
//! `AllocatedResources` are only built for the node finally chosen.
//!
//! The asks come from a stored job, which is not re-validated: they are summed saturating
//! (a negative ask counts as 0) and compared with what the node holds in `i128`, so no sum
//! wraps and an impossible group never fits.

use std::collections::BTreeMap;

use nomad_proto::resources::{AllocatedCpuResources, AllocatedMemoryResources, AllocatedSharedResources, AllocatedTaskResources};
use nomad_proto::{AllocatedResources, Node, TaskGroup};
use rand::Rng;

use super::ports::{self, PortOffer};
use super::usage::{Capacity, NodeUsage};

/// A group's resource ask, summed once per eval (saturating, each ask at least 0).
#[derive(Debug, Clone)]
pub(crate) struct GroupAsk {
    /// MHz of tasks that do not reserve cores.
    cpu: i64,
    memory: i64,
    disk: i64,
    /// (task index, cores) for tasks reserving whole cores.
    cores: Vec<(usize, u16)>,
    needs_ports: bool,
}

impl GroupAsk {
    pub(crate) fn new(tg: &TaskGroup) -> GroupAsk {
        let mut ask = GroupAsk { cpu: 0, memory: 0, disk: tg.ephemeral_disk.size_mb.max(0), cores: Vec::new(), needs_ports: false };
        for (i, t) in tg.tasks.iter().enumerate() {
            if t.resources.cores > 0 {
                ask.cores.push((i, t.resources.cores.min(u16::MAX as i64) as u16));
            } else {
                ask.cpu = ask.cpu.saturating_add(t.resources.cpu.max(0));
            }
            ask.memory = ask.memory.saturating_add(t.resources.memory_mb.max(0));
            ask.needs_ports |= !t.resources.networks.is_empty();
        }
        ask.needs_ports |= !tg.networks.is_empty();
        ask
    }
}

/// A successful fit: what the node would hold and what the alloc gets.
#[derive(Debug, Clone)]
pub(crate) struct Fit {
    /// CPU and memory in use on the node with this alloc (for scoring).
    pub(crate) cpu_used: i128,
    pub(crate) memory_used: i128,
    group_offer: Option<PortOffer>,
    task_offers: Vec<(usize, PortOffer)>,
    /// (task index, cores, MHz they stand for).
    cores: Vec<(usize, Vec<u16>, i64)>,
}

/// Checks `tg` against the node's remaining room. The error is Nomad's
/// `DimensionExhausted` key (`cpu`, `memory`, `disk`, `cores`, `network: ...`).
pub(crate) fn fit(node: &Node, usage: &NodeUsage, tg: &TaskGroup, ask: &GroupAsk, rng: &mut impl Rng) -> Result<Fit, String> {
    if let Some(dimension) = usage.collision {
        return Err(dimension.into());
    }
    let mut fit = Fit {
        cpu_used: usage.cpu + i128::from(ask.cpu),
        memory_used: usage.memory + i128::from(ask.memory),
        group_offer: None,
        task_offers: Vec::new(),
        cores: Vec::new(),
    };
    if ask.needs_ports {
        let mut used = usage.ports.clone();
        let range = ports::dynamic_range(node);
        let ip = ports::node_host_ip(node);
        if let Some(net) = tg.networks.first() {
            let offer = ports::assign_ports(net, &mut used, range, &ip, rng).map_err(|e| format!("network: {e}"))?;
            fit.group_offer = Some(offer);
        }
        for (i, t) in tg.tasks.iter().enumerate() {
            if let Some(net) = t.resources.networks.first() {
                let offer = ports::assign_ports(net, &mut used, range, &ip, rng).map_err(|e| format!("network: {e}"))?;
                fit.task_offers.push((i, offer));
            }
        }
    }
    if !ask.cores.is_empty() {
        let cpu = node.node_resources.as_ref().map(|r| &r.cpu);
        let reservable = cpu.map(|c| c.reservable_cpu_cores.as_slice()).unwrap_or_default();
        let per_core = cpu.filter(|c| c.total_cpu_cores > 0).map_or(0, |c| c.cpu_shares.max(0) / i64::from(c.total_cpu_cores));
        let mut free: Vec<u16> = reservable.iter().copied().filter(|c| !usage.cores.contains(c)).collect();
        for (task, n) in &ask.cores {
            if free.len() < *n as usize {
                return Err("cores".into());
            }
            let taken: Vec<u16> = free.drain(..*n as usize).collect();
            let mhz = per_core.saturating_mul(i64::from(*n));
            fit.cpu_used += i128::from(mhz);
            fit.cores.push((*task, taken, mhz));
        }
    }
    let cap = Capacity::of(node);
    if fit.cpu_used > i128::from(cap.cpu) {
        return Err("cpu".into());
    }
    if fit.memory_used > i128::from(cap.memory) {
        return Err("memory".into());
    }
    if usage.disk + i128::from(ask.disk) > i128::from(cap.disk) {
        return Err("disk".into());
    }
    Ok(fit)
}

impl Fit {
    /// The resources of the alloc placed with this fit.
    pub(crate) fn into_resources(self, tg: &TaskGroup) -> AllocatedResources {
        let mut tasks = BTreeMap::new();
        let mut lifecycles = BTreeMap::new();
        for (i, t) in tg.tasks.iter().enumerate() {
            let mut r = AllocatedTaskResources {
                cpu: AllocatedCpuResources { cpu_shares: t.resources.cpu, reserved_cores: Vec::new() },
                // Memory oversubscription is off by default in Nomad, so MemoryMax is not granted.
                memory: AllocatedMemoryResources { memory_mb: t.resources.memory_mb, memory_max_mb: 0 },
                networks: Vec::new(),
                devices: Vec::new(),
            };
            if let Some((_, cores, mhz)) = self.cores.iter().find(|(task, _, _)| *task == i) {
                r.cpu.reserved_cores = cores.clone();
                r.cpu.cpu_shares = *mhz;
            }
            if let Some((_, offer)) = self.task_offers.iter().find(|(task, _)| *task == i) {
                r.networks = vec![offer.network.clone()];
            }
            tasks.insert(t.name.clone(), r);
            lifecycles.insert(t.name.clone(), t.lifecycle.clone());
        }
        let mut shared = AllocatedSharedResources { networks: Vec::new(), disk_mb: tg.ephemeral_disk.size_mb, ports: Vec::new() };
        if let Some(offer) = self.group_offer {
            shared.networks = vec![offer.network];
            shared.ports = offer.ports;
        }
        AllocatedResources { tasks, task_lifecycles: lifecycles, shared }
    }
}
