//! What the allocs on a node hold, summed once per version of the node's alloc set.
//!
//! The scheduler looks at `log2(nodes)` candidate nodes for every placement and the plan
//! applier re-checks every node a plan touches; both used to walk every alloc on each node
//! they looked at, a pointer chase per alloc that dominated a 10,000-node burst. The per-node
//! index now carries a [`NodeLoad`] computed on first use and shared by every snapshot (and
//! every eval) that sees the same allocs on that node; changing the node's allocs starts a
//! fresh, empty one. Callers adjust the sum for the few allocs their plan touches.
//!
//! Stored allocs are not re-validated (state may predate the admission bounds, or be
//! written by a buggy or hostile client's server), so no sum may wrap: an alloc's hold is
//! summed saturating and never negative, and a node's sums are `i128`, exact for any
//! number of such holds, so adding and removing stay inverse and a load is never negative.

use std::sync::{Arc, OnceLock};

use imbl::OrdMap;
use nomad_proto::Allocation;

/// What one alloc holds on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocHold {
    /// CPU shares in MHz.
    pub cpu: i64,
    /// Memory in MiB.
    pub memory_mb: i64,
    /// Disk in MiB.
    pub disk_mb: i64,
    /// Host ports, sorted, each once.
    pub ports: Vec<i64>,
    /// Reserved cores, sorted.
    pub cores: Vec<u16>,
}

impl AllocHold {
    /// What `a` holds: its allocated resources, else its group's asks (allocs written before
    /// resources were recorded). Ports are the group's (`Shared.Ports`, else the shared
    /// networks of older allocs) and the tasks' networks'; an alloc listing the same port in
    /// two places holds it once.
    pub fn of(a: &Allocation) -> AllocHold {
        let Some(r) = &a.allocated_resources else {
            let Some(tg) = a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)) else {
                return AllocHold::default();
            };
            return AllocHold {
                cpu: saturating_sum(tg.tasks.iter().map(|t| t.resources.cpu)),
                memory_mb: saturating_sum(tg.tasks.iter().map(|t| t.resources.memory_mb)),
                disk_mb: tg.ephemeral_disk.size_mb.max(0),
                ..AllocHold::default()
            };
        };
        let mut hold = AllocHold {
            cpu: saturating_sum(r.tasks.values().map(|t| t.cpu.cpu_shares)),
            memory_mb: saturating_sum(r.tasks.values().map(|t| t.memory.memory_mb)),
            disk_mb: r.shared.disk_mb.max(0),
            ..AllocHold::default()
        };
        let net_ports =
            |n: &nomad_proto::NetworkResource| n.reserved_ports.iter().chain(&n.dynamic_ports).map(|p| p.value).collect::<Vec<_>>();
        for t in r.tasks.values() {
            hold.cores.extend_from_slice(&t.cpu.reserved_cores);
            t.networks.iter().for_each(|n| hold.ports.extend(net_ports(n)));
        }
        if r.shared.ports.is_empty() {
            r.shared.networks.iter().for_each(|n| hold.ports.extend(net_ports(n)));
        } else {
            hold.ports.extend(r.shared.ports.iter().map(|p| p.value));
        }
        hold.ports.retain(|p| *p > 0);
        hold.ports.sort_unstable();
        hold.ports.dedup();
        hold.cores.sort_unstable();
        hold
    }
}

/// The sum of untrusted values, each counted as at least 0, saturating at `i64::MAX`.
pub fn saturating_sum(values: impl IntoIterator<Item = i64>) -> i64 {
    values.into_iter().fold(0i64, |sum, v| sum.saturating_add(v.max(0)))
}

/// A sum of [`AllocHold`]s. Ports and cores are multisets: two allocs holding the same port
/// is a collision the caller reports. The sums are `i128`: exact over any number of holds
/// (each at most `i64::MAX`), so they never wrap and removing a hold undoes adding it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Load {
    /// CPU shares in MHz.
    pub cpu: i128,
    /// Memory in MiB.
    pub memory_mb: i128,
    /// Disk in MiB.
    pub disk_mb: i128,
    /// Host ports held, sorted; a port held twice appears twice.
    pub ports: Vec<i64>,
    /// Reserved cores held, sorted; likewise.
    pub cores: Vec<u16>,
}

impl Load {
    /// Adds what an alloc holds.
    pub fn add(&mut self, h: &AllocHold) {
        self.cpu += i128::from(h.cpu);
        self.memory_mb += i128::from(h.memory_mb);
        self.disk_mb += i128::from(h.disk_mb);
        for p in &h.ports {
            let at = self.ports.partition_point(|x| x <= p);
            self.ports.insert(at, *p);
        }
        for c in &h.cores {
            let at = self.cores.partition_point(|x| x <= c);
            self.cores.insert(at, *c);
        }
    }

    /// Takes away what an alloc that was added holds (never below 0, whatever is removed).
    pub fn remove(&mut self, h: &AllocHold) {
        self.cpu = (self.cpu - i128::from(h.cpu)).max(0);
        self.memory_mb = (self.memory_mb - i128::from(h.memory_mb)).max(0);
        self.disk_mb = (self.disk_mb - i128::from(h.disk_mb)).max(0);
        for p in &h.ports {
            if let Ok(at) = self.ports.binary_search(p) {
                self.ports.remove(at);
            }
        }
        for c in &h.cores {
            if let Ok(at) = self.cores.binary_search(c) {
                self.cores.remove(at);
            }
        }
    }

    /// The first port held twice.
    pub fn repeated_port(&self) -> Option<i64> {
        self.ports.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
    }

    /// Whether a core is held twice.
    pub fn repeated_core(&self) -> bool {
        self.cores.windows(2).any(|w| w[0] == w[1])
    }
}

/// The sums over a node's allocs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeLoad {
    /// Allocs whose client has not finished them (`!client_terminal()`): what the scheduler
    /// counts, including allocs told to stop that may still be running.
    pub placed: Load,
    /// Allocs neither side has finished (`!terminal()`): what the plan applier counts.
    pub live: Load,
}

impl NodeLoad {
    /// Sums `allocs`.
    pub fn of<'a>(allocs: impl IntoIterator<Item = &'a Arc<Allocation>>) -> NodeLoad {
        let mut load = NodeLoad::default();
        allocs.into_iter().for_each(|a| load.account(a, Load::add));
        load
    }

    /// Adds `a` to (or removes it from) the sums that count it.
    fn account(&mut self, a: &Allocation, op: fn(&mut Load, &AllocHold)) {
        if a.client_terminal() {
            return;
        }
        let hold = AllocHold::of(a);
        op(&mut self.placed, &hold);
        if !a.terminal() {
            op(&mut self.live, &hold);
        }
    }
}

/// The allocs on one node, by ID, and their [`NodeLoad`] once someone asked for it.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeAllocs {
    allocs: OrdMap<super::Key, Arc<Allocation>>,
    /// Shared by the clones of this version (snapshots); replaced on every change.
    load: Arc<OnceLock<NodeLoad>>,
}

impl NodeAllocs {
    pub(crate) fn insert(&mut self, id: super::Key, alloc: Arc<Allocation>) {
        let replaced = self.allocs.insert(id, alloc.clone());
        self.changed(replaced.as_deref(), Some(&alloc));
    }

    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(removed) = self.allocs.remove(id) {
            self.changed(Some(&removed), None);
        }
    }

    /// A new version: its load follows from the old one when that was computed (one alloc
    /// changes per write, and the plan applier asks for the node it just wrote), else it is
    /// computed when first asked for.
    fn changed(&mut self, old: Option<&Allocation>, new: Option<&Allocation>) {
        let Some(mut load) = self.load.get().cloned() else {
            self.load = Arc::default();
            return;
        };
        if let Some(a) = old {
            load.account(a, Load::remove);
        }
        if let Some(a) = new {
            load.account(a, Load::add);
        }
        self.load = Arc::new(OnceLock::from(load));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.allocs.is_empty()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Allocation>> {
        self.allocs.values()
    }

    pub(crate) fn load(&self) -> &NodeLoad {
        self.load.get_or_init(|| NodeLoad::of(self.allocs.values()))
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::resources::{AllocatedCpuResources, AllocatedMemoryResources, AllocatedPortMapping, AllocatedTaskResources};
    use nomad_proto::{AllocatedResources, ClientStatus, DesiredStatus, NetworkResource, Port};

    use super::*;

    fn alloc(id: &str, cpu: i64, ports: &[i64]) -> Allocation {
        let mut r = AllocatedResources::default();
        r.tasks.insert(
            "t".into(),
            AllocatedTaskResources {
                cpu: AllocatedCpuResources { cpu_shares: cpu, ..Default::default() },
                memory: AllocatedMemoryResources { memory_mb: 2 * cpu, ..Default::default() },
                ..Default::default()
            },
        );
        r.shared.ports = ports.iter().map(|p| AllocatedPortMapping { label: "p".into(), value: *p, ..Default::default() }).collect();
        Allocation { id: id.into(), node_id: "n1".into(), allocated_resources: Some(r), ..Allocation::default() }
    }

    #[test]
    fn a_port_listed_as_group_port_and_in_the_shared_network_is_held_once() {
        let mut a = alloc("a", 100, &[20001]);
        let r = a.allocated_resources.as_mut().unwrap();
        r.shared.networks.push(NetworkResource {
            dynamic_ports: vec![Port { label: "p".into(), value: 20001, ..Default::default() }],
            ..Default::default()
        });
        r.tasks.get_mut("t").unwrap().networks.push(NetworkResource {
            reserved_ports: vec![Port { label: "admin".into(), value: 8080, ..Default::default() }],
            ..Default::default()
        });
        assert_eq!(AllocHold::of(&a).ports, vec![8080, 20001]);
    }

    #[test]
    fn the_load_counts_unfinished_allocs_and_collisions_survive_removal_of_one_holder() {
        let running = Arc::new(alloc("a", 100, &[8080]));
        let stopping = Arc::new(Allocation { desired_status: DesiredStatus::Stop, ..alloc("b", 200, &[8080]) });
        let done = Arc::new(Allocation { client_status: ClientStatus::Complete, ..alloc("c", 400, &[9090]) });
        let load = NodeLoad::of([&running, &stopping, &done]);
        assert_eq!((load.placed.cpu, load.placed.memory_mb), (300, 600));
        assert_eq!(load.placed.repeated_port(), Some(8080));
        assert_eq!((load.live.cpu, load.live.ports.clone()), (100, vec![8080]));

        let mut placed = load.placed.clone();
        placed.remove(&AllocHold::of(&stopping));
        assert_eq!(placed, load.live, "removing one holder of a port keeps the other's");
        placed.add(&AllocHold::of(&running));
        assert_eq!(placed.repeated_port(), Some(8080));
    }

    #[test]
    fn a_changed_alloc_set_gets_a_fresh_load_and_older_copies_keep_theirs() {
        let mut v1 = NodeAllocs::default();
        v1.insert("a".into(), Arc::new(alloc("a", 100, &[])));
        assert_eq!(v1.load().placed.cpu, 100);
        let snapshot = v1.clone();
        v1.insert("b".into(), Arc::new(alloc("b", 50, &[])));
        assert_eq!(v1.load().placed.cpu, 150);
        assert_eq!(snapshot.load().placed.cpu, 100);
        v1.remove("a");
        v1.remove("missing");
        assert_eq!(v1.load().placed.cpu, 50);
        let stopped = Allocation { desired_status: DesiredStatus::Stop, ..alloc("b", 50, &[]) };
        v1.insert("b".into(), Arc::new(stopped));
        assert_eq!((v1.load().placed.cpu, v1.load().live.cpu), (50, 0));
    }

    /// Issue 20: two tasks asking 5e18 MHz each wrapped the node's sum negative.
    #[test]
    fn holds_past_i64_saturate_and_the_load_is_exact_and_never_negative() {
        let mut huge = alloc("huge", 1, &[]);
        let r = huge.allocated_resources.as_mut().unwrap();
        let task = |cpu: i64, memory_mb: i64| AllocatedTaskResources {
            cpu: AllocatedCpuResources { cpu_shares: cpu, ..Default::default() },
            memory: AllocatedMemoryResources { memory_mb, ..Default::default() },
            ..Default::default()
        };
        r.tasks.insert("t".into(), task(5_000_000_000_000_000_000, 100));
        r.tasks.insert("t2".into(), task(5_000_000_000_000_000_000, -7));
        let hold = AllocHold::of(&huge);
        assert_eq!(hold.cpu, i64::MAX, "5e18 + 5e18 saturates instead of wrapping negative");
        assert_eq!(hold.memory_mb, 100, "a negative ask counts as 0");

        let mut node = NodeAllocs::default();
        let _ = node.load();
        node.insert("huge".into(), Arc::new(huge.clone()));
        node.insert("huge2".into(), Arc::new(Allocation { id: "huge2".into(), ..huge.clone() }));
        assert_eq!(node.load().placed.cpu, 2 * i128::from(i64::MAX), "sums are exact past i64");
        node.remove("huge");
        assert_eq!(node.load().placed.cpu, i128::from(i64::MAX));
        node.remove("huge2");
        assert_eq!(*node.load(), NodeLoad::default());

        let mut load = Load::default();
        load.remove(&AllocHold::of(&alloc("never-added", 100, &[])));
        assert_eq!((load.cpu, load.memory_mb, load.disk_mb), (0, 0, 0), "never negative");
    }

    #[test]
    fn a_load_kept_up_to_date_write_by_write_equals_one_summed_from_scratch() {
        let mut node = NodeAllocs::default();
        let _ = node.load();
        let versions = [
            alloc("a", 100, &[8080]),
            alloc("b", 200, &[9090]),
            Allocation { desired_status: DesiredStatus::Stop, ..alloc("a", 100, &[8080]) },
            Allocation { client_status: ClientStatus::Complete, ..alloc("b", 200, &[9090]) },
            alloc("c", 300, &[8080]),
        ];
        for a in versions {
            node.insert(a.id.as_str().into(), Arc::new(a));
            assert_eq!(*node.load(), NodeLoad::of(node.values()));
        }
        node.remove("c");
        assert_eq!(*node.load(), NodeLoad::of(node.values()));
    }
}
