//! What a node has left: its capacity and the resources its allocs hold.

use nomad_proto::Node;

use super::ports::PortSet;
use crate::state::Load;

/// A node's schedulable capacity: offered minus reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Capacity {
    pub(crate) cpu: i64,
    pub(crate) memory: i64,
    pub(crate) disk: i64,
}

impl Capacity {
    pub(crate) fn of(node: &Node) -> Capacity {
        // The same offer the plan applier checks against.
        let u = crate::plan_apply::node_capacity(node);
        Capacity { cpu: u.cpu, memory: u.memory_mb, disk: u.disk_mb }
    }
}

/// Resources held on a node by the allocs the plan would leave there,
/// plus counts of the eval's job allocs (for anti-affinity and distinct hosts).
/// The sums are `Load`'s exact `i128`s.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeUsage {
    pub(crate) cpu: i128,
    pub(crate) memory: i128,
    pub(crate) disk: i128,
    pub(crate) cores: Vec<u16>,
    pub(crate) ports: PortSet,
    /// The `DimensionExhausted` key when the node cannot take ports at all:
    /// its current allocs collide, or its reserved ports do not parse.
    pub(crate) collision: Option<&'static str>,
    /// Allocs of the eval's job on the node.
    pub(crate) job_allocs: u32,
    /// The same, per group of the current job version (by group index).
    pub(crate) group_allocs: Vec<u32>,
}

impl NodeUsage {
    /// An empty usage with the node's reserved ports.
    pub(crate) fn new(node: &Node, groups: usize) -> NodeUsage {
        let (ports, collision) = match PortSet::for_node(node) {
            Ok(p) => (p, None),
            Err(_) => (PortSet::default(), Some("network: invalid node")),
        };
        NodeUsage { ports, collision, group_allocs: vec![0; groups], ..NodeUsage::default() }
    }

    /// What `load` holds on the node (ports through the node's reserved ones, so a port held
    /// twice or reserved marks a collision).
    pub(crate) fn from_load(node: &Node, load: &Load, groups: usize) -> NodeUsage {
        let mut u = NodeUsage::new(node, groups);
        u.cpu = load.cpu;
        u.memory = load.memory_mb;
        u.disk = load.disk_mb;
        u.cores = load.cores.clone();
        u.add_ports(load.ports.iter().copied());
        u
    }

    fn add_ports(&mut self, ports: impl Iterator<Item = i64>) {
        for p in ports.filter(|p| *p > 0) {
            if !self.ports.insert(p) && self.collision.is_none() {
                self.collision = Some("network: port collision");
            }
        }
    }
}
