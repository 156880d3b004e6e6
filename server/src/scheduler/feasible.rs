//! Node feasibility: can this node run this group at all, resources aside?
//!
//! Job constraints, then per group: drivers, constraints (group and task),
//! host volumes, devices and networks. Results are memoized per computed
//! node class (Nomad's `EvalEligibility`) unless a constraint reads a
//! per-node value (`${node.unique.*}`, `${attr.unique.*}`, `${meta.unique.*}`),
//! which "escapes" the class.

use std::collections::BTreeMap;

use nomad_proto::resources::NodeDeviceResource;
use nomad_proto::{Job, Node, TaskGroup};

use super::constraint::{self, CompiledConstraint, DISTINCT_HOSTS};
use super::fast_hash::FastMap;
use super::metrics::filter_node;

/// Filter reasons Nomad reports.
pub(crate) mod reason {
    pub(crate) const CLASS_INELIGIBLE: &str = "computed class ineligible";
    pub(crate) const DRIVERS: &str = "missing drivers";
    pub(crate) const HOST_VOLUMES: &str = "missing compatible host volumes";
    pub(crate) const DEVICES: &str = "missing devices";
    pub(crate) const NETWORK: &str = "missing network";
}

/// True when a `distinct_hosts` constraint is on (it defaults to true).
pub(crate) fn has_distinct_hosts(constraints: &[nomad_proto::Constraint]) -> bool {
    constraints
        .iter()
        .find(|c| c.operand == DISTINCT_HOSTS)
        .is_some_and(|c| c.r_target.is_empty() || parse_go_bool(&c.r_target) != Some(false))
}

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

struct HostVolumeAsk {
    request: nomad_proto::volume::VolumeRequest,
}

struct DeviceAsk {
    /// `type`, `vendor/type` or `vendor/type/name`.
    parts: Vec<String>,
    count: u64,
}

/// What a group needs from a node, compiled once per eval.
struct GroupChecks {
    drivers: Vec<String>,
    constraints: Vec<CompiledConstraint>,
    host_volumes: Vec<HostVolumeAsk>,
    devices: Vec<DeviceAsk>,
    network_mode: String,
    host_networks: Vec<(String, String)>,
    /// Results cannot be memoized per class.
    escaped: bool,
}

impl GroupChecks {
    fn new(tg: &TaskGroup) -> GroupChecks {
        let mut drivers: Vec<String> = tg.tasks.iter().map(|t| t.driver.clone()).filter(|d| !d.is_empty()).collect();
        drivers.sort();
        drivers.dedup();
        let all: Vec<&nomad_proto::Constraint> = tg.constraints.iter().chain(tg.tasks.iter().flat_map(|t| t.constraints.iter())).collect();
        let host_volumes: Vec<HostVolumeAsk> = tg
            .volumes
            .values()
            .filter(|v| v.volume_type == "host" || v.volume_type.is_empty())
            .map(|v| HostVolumeAsk { request: v.clone() })
            .collect();
        let devices = tg
            .tasks
            .iter()
            .flat_map(|t| t.resources.devices.iter())
            .map(|d| DeviceAsk { parts: d.name.split('/').map(str::to_string).collect(), count: d.count.max(1) })
            .collect();
        let net = tg.networks.first();
        let network_mode =
            net.map(|n| if n.mode.is_empty() { "host".to_string() } else { n.mode.clone() }).unwrap_or_else(|| "host".into());
        let host_networks = net
            .map(|n| {
                n.reserved_ports
                    .iter()
                    .chain(&n.dynamic_ports)
                    .filter(|p| !p.host_network.is_empty())
                    .map(|p| (p.host_network.clone(), p.label.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let escaped = all.iter().any(|c| constraint::escapes(c)) || host_volumes.iter().any(|v| v.request.per_alloc);
        GroupChecks {
            drivers,
            constraints: all.into_iter().map(CompiledConstraint::new).collect(),
            host_volumes,
            devices,
            network_mode,
            host_networks,
            escaped,
        }
    }

    /// Runs the checks; the error is the filter reason.
    fn check(&self, node: &Node, alloc_name: &str) -> Result<(), String> {
        if !self.drivers.iter().all(|d| has_driver(node, d)) {
            return Err(reason::DRIVERS.into());
        }
        if let Some(c) = self.constraints.iter().find(|c| !c.matches(node)) {
            return Err(c.display.clone());
        }
        if !self.host_volumes.iter().all(|v| has_host_volume(node, v, alloc_name)) {
            return Err(reason::HOST_VOLUMES.into());
        }
        if !self.devices.iter().all(|d| has_device(node, d)) {
            return Err(reason::DEVICES.into());
        }
        self.check_network(node)
    }

    fn check_network(&self, node: &Node) -> Result<(), String> {
        if self.network_mode == "none" {
            return Ok(());
        }
        let nets = node.node_resources.as_ref().map(|r| r.networks.as_slice()).unwrap_or_default();
        // Nodes that fingerprint no networks are taken to offer host networking only.
        let has_mode = if nets.is_empty() {
            self.network_mode == "host"
        } else {
            nets.iter().any(|n| (if n.mode.is_empty() { "host" } else { n.mode.as_str() }) == self.network_mode)
        };
        if !has_mode {
            return Err(reason::NETWORK.into());
        }
        for (alias, label) in &self.host_networks {
            let found =
                node.node_resources.iter().flat_map(|r| r.node_networks.iter()).flat_map(|n| n.addresses.iter()).any(|a| &a.alias == alias);
            if !found {
                return Err(format!("missing host network {alias:?} for port {label:?}"));
            }
        }
        Ok(())
    }
}

/// The driver is detected and healthy, or (older clients) `driver.<name>` is true.
pub(crate) fn has_driver(node: &Node, driver: &str) -> bool {
    match node.drivers.get(driver) {
        Some(info) => info.detected && info.healthy,
        None => node.attributes.get(&format!("driver.{driver}")).and_then(|v| parse_go_bool(v)).unwrap_or(false),
    }
}

fn has_host_volume(node: &Node, ask: &HostVolumeAsk, alloc_name: &str) -> bool {
    match node.host_volumes.get(ask.request.source_for(alloc_name).as_ref()) {
        Some(v) => !v.read_only || ask.request.read_only,
        None => false,
    }
}

fn has_device(node: &Node, ask: &DeviceAsk) -> bool {
    let groups = node.node_resources.iter().flat_map(|r| r.devices.iter());
    groups.filter(|g| device_matches(g, &ask.parts)).map(|g| g.instances.iter().filter(|i| i.healthy).count() as u64).sum::<u64>()
        >= ask.count
}

fn device_matches(g: &NodeDeviceResource, parts: &[String]) -> bool {
    match parts {
        [t] => &g.device_type == t,
        [v, t] => &g.vendor == v && &g.device_type == t,
        [v, t, n] => &g.vendor == v && &g.device_type == t && &g.name == n,
        _ => false,
    }
}

/// Node feasibility for one job, with per-class memoization.
pub(crate) struct Feasibility {
    job_constraints: Vec<CompiledConstraint>,
    job_escaped: bool,
    job_classes: FastMap<String, bool>,
    groups: Vec<GroupChecks>,
    group_classes: Vec<FastMap<String, bool>>,
    /// Per node (by address) and group: bit `2g` "known", bit `2g+1`
    /// "feasible". Saves hashing the class name on every revisit of a node.
    verdicts: FastMap<usize, u64>,
}

impl Feasibility {
    pub(crate) fn new(job: &Job) -> Feasibility {
        Feasibility {
            job_constraints: job.constraints.iter().map(CompiledConstraint::new).collect(),
            job_escaped: job.constraints.iter().any(constraint::escapes),
            job_classes: FastMap::default(),
            groups: job.task_groups.iter().map(GroupChecks::new).collect(),
            group_classes: vec![FastMap::default(); job.task_groups.len()],
            verdicts: FastMap::default(),
        }
    }

    /// True when `node` can run group `group`; otherwise the metric records why.
    pub(crate) fn check(&mut self, node: &Node, group: usize, alloc_name: &str, metric: &mut nomad_proto::AllocMetric) -> bool {
        // Only class-determined verdicts may be remembered per node.
        let cacheable = group < 32 && !node.computed_class.is_empty() && !self.job_escaped && !self.groups[group].escaped;
        let key = node as *const Node as usize;
        if cacheable
            && let Some(bits) = self.verdicts.get(&key)
            && bits & (1 << (2 * group)) != 0
        {
            let ok = bits & (1 << (2 * group + 1)) != 0;
            if !ok {
                // What the class memo would have said.
                filter_node(metric, node, reason::CLASS_INELIGIBLE);
            }
            return ok;
        }
        let ok = self.check_uncached(node, group, alloc_name, metric);
        if cacheable {
            *self.verdicts.entry(key).or_insert(0) |= (1 << (2 * group)) | (u64::from(ok) << (2 * group + 1));
        }
        ok
    }

    fn check_uncached(&mut self, node: &Node, group: usize, alloc_name: &str, metric: &mut nomad_proto::AllocMetric) -> bool {
        let class = node.computed_class.as_str();
        let memo = !class.is_empty();
        let job_memo = memo && !self.job_escaped;
        // Without job constraints there is nothing to remember per class.
        let job_checked =
            if self.job_constraints.is_empty() { Some(true) } else { self.job_classes.get(class).copied().filter(|_| job_memo) };
        match job_checked {
            Some(false) => {
                filter_node(metric, node, reason::CLASS_INELIGIBLE);
                return false;
            }
            Some(true) => {}
            None => {
                if let Some(c) = self.job_constraints.iter().find(|c| !c.matches(node)) {
                    filter_node(metric, node, &c.display);
                    if job_memo {
                        self.job_classes.insert(class.to_string(), false);
                    }
                    return false;
                }
                if job_memo {
                    self.job_classes.insert(class.to_string(), true);
                }
            }
        }
        let checks = &self.groups[group];
        let group_memo = memo && !checks.escaped;
        match self.group_classes[group].get(class).filter(|_| group_memo) {
            Some(false) => {
                filter_node(metric, node, reason::CLASS_INELIGIBLE);
                false
            }
            Some(true) => true,
            None => {
                let result = checks.check(node, alloc_name);
                if group_memo {
                    self.group_classes[group].insert(class.to_string(), result.is_ok());
                }
                match result {
                    Ok(()) => true,
                    Err(why) => {
                        filter_node(metric, node, &why);
                        false
                    }
                }
            }
        }
    }

    /// Some constraint reads per-node values, so class eligibility is incomplete.
    pub(crate) fn escaped(&self) -> bool {
        self.job_escaped || self.groups.iter().any(|g| g.escaped)
    }

    /// Classes seen and whether any group could use them (Nomad's `GetClasses`).
    pub(crate) fn class_eligibility(&self) -> BTreeMap<String, bool> {
        let mut out = BTreeMap::new();
        for classes in &self.group_classes {
            for (class, ok) in classes {
                if *ok {
                    out.insert(class.clone(), true);
                } else {
                    out.entry(class.clone()).or_insert(false);
                }
            }
        }
        for (class, ok) in &self.job_classes {
            if *ok {
                out.entry(class.clone()).or_insert(true);
            } else {
                out.insert(class.clone(), false);
            }
        }
        out
    }
}
