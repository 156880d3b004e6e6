//! Admission limits: how large a job or a node registration may be.
//!
//! Nomad 1.6 caps almost none of these; a server that accepts any size does
//! work (and, in the scheduler, allocates memory) in proportion to a number a
//! caller chose. Each limit here is checked before that work starts: the
//! structural counts of a job before it is canonicalized (canonicalizing fills
//! defaults into every group and task), its encoded size once it is.
//!
//! | what | limit |
//! |---|---|
//! | total `count` over a job's groups | `job_max_count` (server option, default [`DEFAULT_JOB_MAX_COUNT`]) |
//! | task groups per job | [`MAX_TASK_GROUPS`] |
//! | tasks per group | [`MAX_TASKS_PER_GROUP`] |
//! | services per group or task, checks per service | [`MAX_SERVICES`], [`MAX_CHECKS_PER_SERVICE`] |
//! | constraints, affinities, spreads per job, group or task (each) | [`MAX_PLACEMENT_RULES`] |
//! | targets per spread | [`MAX_SPREAD_TARGETS`] |
//! | networks per group or task, ports per network | [`MAX_NETWORKS`], [`MAX_PORTS_PER_NETWORK`] |
//! | volumes per group, volume mounts, templates, artifacts per task | [`MAX_VOLUMES`] each |
//! | meta entries, key bytes, value bytes, total bytes per map | [`MAX_META_ENTRIES`], [`MAX_META_KEY_BYTES`], [`MAX_META_VALUE_BYTES`], [`MAX_META_TOTAL_BYTES`] |
//! | encoded job (JSON, canonicalized) | [`MAX_JOB_ENCODED_BYTES`] |
//! | node attributes, drivers, host volumes, links | [`MAX_NODE_ATTRIBUTES`], [`MAX_NODE_DRIVERS`], [`MAX_VOLUMES`], [`MAX_META_ENTRIES`] |
//! | CSI volumes per register request; a volume's strings, lists and maps | [`MAX_CSI_VOLUMES_PER_REQUEST`], [`MAX_CSI_VOLUME_STRING_BYTES`], [`MAX_CSI_VOLUME_LIST`], [`MAX_META_ENTRIES`] |
//!
//! Resource values (CPU, memory, disk) are bounded by [`MAX_RESOURCE_VALUE`] in validation.

use std::collections::BTreeMap;

use crate::job::{Job, Task, TaskGroup};
use crate::node::Node;
use crate::resources::NetworkResource;
use crate::service::Service;

/// Default `job_max_count`: the most allocs one job may ask for over all its groups.
///
/// The same default as Nomad's `job_max_count` (added in later Nomad versions). Measured with
/// `server/examples/bench_count_memory.rs`: a plan that places every alloc costs the
/// scheduler about 6.5 KB of heap per alloc (about 320 MB at this limit), one where nothing
/// fits about 180 bytes per count.
pub const DEFAULT_JOB_MAX_COUNT: i64 = 50_000;
/// Task groups in one job.
pub const MAX_TASK_GROUPS: usize = 1_000;
/// Tasks in one group.
pub const MAX_TASKS_PER_GROUP: usize = 100;
/// Services of one group or one task.
pub const MAX_SERVICES: usize = 100;
/// Checks of one service.
pub const MAX_CHECKS_PER_SERVICE: usize = 100;
/// Constraints, affinities and spreads (each) of one job, group or task.
pub const MAX_PLACEMENT_RULES: usize = 100;
/// Targets of one spread.
pub const MAX_SPREAD_TARGETS: usize = 100;
/// Networks of one group or one task.
pub const MAX_NETWORKS: usize = 10;
/// Ports (reserved and dynamic together) of one network.
pub const MAX_PORTS_PER_NETWORK: usize = 256;
/// Volumes of a group; also volume mounts, templates and artifacts of a task, and host volumes
/// of a node.
pub const MAX_VOLUMES: usize = 100;
/// Entries of one meta map (job, group, task, service, node), and links of a node.
pub const MAX_META_ENTRIES: usize = 1_000;
/// Bytes of one meta key.
pub const MAX_META_KEY_BYTES: usize = 256;
/// Bytes of one meta value.
pub const MAX_META_VALUE_BYTES: usize = 64 * 1024;
/// Bytes of all keys and values of one meta map.
pub const MAX_META_TOTAL_BYTES: usize = 512 * 1024;
/// Bytes of a canonicalized job encoded as JSON (what Raft stores and every server keeps).
pub const MAX_JOB_ENCODED_BYTES: usize = 4 * 1024 * 1024;
/// Attributes of one node (a fingerprint gives a few hundred).
pub const MAX_NODE_ATTRIBUTES: usize = 4_096;
/// Drivers of one node.
pub const MAX_NODE_DRIVERS: usize = 256;
/// Events a registering node may carry.
pub const MAX_NODE_EVENTS: usize = crate::node::MAX_RETAINED_NODE_EVENTS;

/// Largest CPU (MHz), memory or disk (MiB) value a task may ask for or a node may offer or
/// reserve: 2^32, a host with 4 PiB of memory or 4.3 million GHz of CPU.
///
/// Why this bound: any sum of fewer than 2^31 such values fits in an `i64`. Every sum the
/// servers form stays below that: the tasks of one group (at most [`MAX_TASKS_PER_GROUP`]),
/// the allocs on one node (each asks at least 1 MHz and 10 MiB, so at most 2^32 / 10 fit one
/// node's memory), a node's capacity minus its reserve, and any total over fewer than 2^31
/// nodes.
pub const MAX_RESOURCE_VALUE: i64 = 1 << 32;

/// The limits a server is configured with (`server { job_max_count }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// Most allocs one job may ask for over all its groups (`job_max_count`).
    pub max_count: i64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits { max_count: DEFAULT_JOB_MAX_COUNT }
    }
}

/// A job or node over one of the limits. Messages name the object, the field and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// One group asks for more allocs than `job_max_count`.
    #[error("task group {group:?} count {count} is greater than job_max_count ({max})")]
    GroupCount {
        /// Group name.
        group: String,
        /// Its count.
        count: i64,
        /// The server's `job_max_count`.
        max: i64,
    },
    /// One group asks for more canaries than `job_max_count`.
    #[error("task group {group:?} update canary {canary} is greater than job_max_count ({max})")]
    GroupCanaries {
        /// Group name.
        group: String,
        /// Its canaries.
        canary: i64,
        /// The server's `job_max_count`.
        max: i64,
    },
    /// The groups together ask for more allocs than `job_max_count`.
    #[error("total count of the job's task groups ({total}) is greater than job_max_count ({max})")]
    TotalCount {
        /// Sum of the groups' counts.
        total: i128,
        /// The server's `job_max_count`.
        max: i64,
    },
    /// A list or map has more entries than allowed.
    #[error("{owner} has {count} {items}, more than the limit of {max}")]
    TooMany {
        /// What holds the list (`job "web"`, `task group "api"`).
        owner: String,
        /// What is counted (`task groups`, `constraints`).
        items: &'static str,
        /// How many there are.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A meta key, value or map is too long.
    #[error("{owner} {what} is {size} bytes, more than the limit of {max}")]
    TooLong {
        /// What holds it.
        owner: String,
        /// What is measured (`meta key "k"`, `meta`).
        what: String,
        /// Its size in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// The job encodes to more bytes than allowed.
    #[error("job {job:?} is {size} bytes encoded, more than the limit of {max}")]
    JobTooLarge {
        /// Job ID.
        job: String,
        /// Encoded size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

fn count(owner: impl FnOnce() -> String, items: &'static str, count: usize, max: usize) -> Result<(), LimitError> {
    if count > max { Err(LimitError::TooMany { owner: owner(), items, count, max }) } else { Ok(()) }
}

/// Checks one meta-like map (`meta`, `links`, attributes): entries, key and value lengths, total.
pub fn check_meta(owner: impl Fn() -> String, what: &str, meta: &BTreeMap<String, String>, max_entries: usize) -> Result<(), LimitError> {
    if meta.len() > max_entries {
        return Err(LimitError::TooMany { owner: format!("{} {what}", owner()), items: "entries", count: meta.len(), max: max_entries });
    }
    let mut total = 0usize;
    for (k, v) in meta {
        if k.len() > MAX_META_KEY_BYTES {
            return Err(LimitError::TooLong {
                owner: owner(),
                what: format!("{what} key {:?}", short(k)),
                size: k.len(),
                max: MAX_META_KEY_BYTES,
            });
        }
        if v.len() > MAX_META_VALUE_BYTES {
            return Err(LimitError::TooLong {
                owner: owner(),
                what: format!("{what} value of {k:?}"),
                size: v.len(),
                max: MAX_META_VALUE_BYTES,
            });
        }
        total += k.len() + v.len();
    }
    if total > MAX_META_TOTAL_BYTES {
        return Err(LimitError::TooLong { owner: owner(), what: what.to_string(), size: total, max: MAX_META_TOTAL_BYTES });
    }
    Ok(())
}

/// The start of a long key, for a message that must not echo the whole of it.
fn short(s: &str) -> String {
    match s.char_indices().nth(32) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn check_placement(owner: &dyn Fn() -> String, constraints: usize, affinities: usize, spreads: usize) -> Result<(), LimitError> {
    count(owner, "constraints", constraints, MAX_PLACEMENT_RULES)?;
    count(owner, "affinities", affinities, MAX_PLACEMENT_RULES)?;
    count(owner, "spreads", spreads, MAX_PLACEMENT_RULES)
}

fn check_networks(owner: &dyn Fn() -> String, networks: &[NetworkResource]) -> Result<(), LimitError> {
    count(owner, "networks", networks.len(), MAX_NETWORKS)?;
    for n in networks {
        count(owner, "ports in one network", n.reserved_ports.len() + n.dynamic_ports.len(), MAX_PORTS_PER_NETWORK)?;
    }
    Ok(())
}

fn check_services(owner: &dyn Fn() -> String, services: &[Service]) -> Result<(), LimitError> {
    count(owner, "services", services.len(), MAX_SERVICES)?;
    for s in services {
        let service_owner = || format!("service {:?} of {}", short(&s.name), owner());
        count(service_owner, "checks", s.checks.len(), MAX_CHECKS_PER_SERVICE)?;
        check_meta(service_owner, "meta", &s.meta, MAX_META_ENTRIES)?;
    }
    Ok(())
}

impl Job {
    /// Checks the job's counts and sizes against `limits`, before anything is done with it.
    /// Cheap: it looks at list lengths and meta sizes only.
    pub fn check_limits(&self, limits: &JobLimits) -> Result<(), LimitError> {
        let job_owner = || format!("job {:?}", short(&self.id));
        count(job_owner, "task groups", self.task_groups.len(), MAX_TASK_GROUPS)?;
        check_placement(&job_owner, self.constraints.len(), self.affinities.len(), self.spreads.len())?;
        check_meta(job_owner, "meta", &self.meta, MAX_META_ENTRIES)?;
        for s in &self.spreads {
            count(job_owner, "targets in one spread", s.spread_target.len(), MAX_SPREAD_TARGETS)?;
        }
        let mut total: i128 = 0;
        for g in &self.task_groups {
            if g.count > limits.max_count {
                return Err(LimitError::GroupCount { group: short(&g.name), count: g.count, max: limits.max_count });
            }
            // Canaries run beside the count until they are promoted.
            let canary = g.update.as_ref().or(self.update.as_ref()).map_or(0, |u| u.canary);
            if canary > limits.max_count {
                return Err(LimitError::GroupCanaries { group: short(&g.name), canary, max: limits.max_count });
            }
            // Negative counts are refused by validation; they do not lower the total here.
            total += i128::from(g.count.max(0)) + i128::from(canary.max(0));
            check_group(g)?;
        }
        if total > i128::from(limits.max_count) {
            return Err(LimitError::TotalCount { total, max: limits.max_count });
        }
        Ok(())
    }

    /// Checks the size of the job as it will be stored (call it once canonicalized).
    pub fn check_encoded_size(&self) -> Result<(), LimitError> {
        let size = encoded_len(self);
        if size > MAX_JOB_ENCODED_BYTES {
            return Err(LimitError::JobTooLarge { job: short(&self.id), size, max: MAX_JOB_ENCODED_BYTES });
        }
        Ok(())
    }
}

fn check_group(g: &TaskGroup) -> Result<(), LimitError> {
    let owner = || format!("task group {:?}", short(&g.name));
    count(owner, "tasks", g.tasks.len(), MAX_TASKS_PER_GROUP)?;
    check_placement(&owner, g.constraints.len(), g.affinities.len(), g.spreads.len())?;
    for s in &g.spreads {
        count(owner, "targets in one spread", s.spread_target.len(), MAX_SPREAD_TARGETS)?;
    }
    check_meta(owner, "meta", &g.meta, MAX_META_ENTRIES)?;
    check_networks(&owner, &g.networks)?;
    check_services(&owner, &g.services)?;
    count(owner, "volumes", g.volumes.len(), MAX_VOLUMES)?;
    for t in &g.tasks {
        check_task(g, t)?;
    }
    Ok(())
}

fn check_task(g: &TaskGroup, t: &Task) -> Result<(), LimitError> {
    let owner = || format!("task {:?} in group {:?}", short(&t.name), short(&g.name));
    check_placement(&owner, t.constraints.len(), t.affinities.len(), 0)?;
    check_meta(owner, "meta", &t.meta, MAX_META_ENTRIES)?;
    check_networks(&owner, &t.resources.networks)?;
    check_services(&owner, &t.services)?;
    count(owner, "volume mounts", t.volume_mounts.len(), MAX_VOLUMES)?;
    count(owner, "templates", t.templates.len(), MAX_VOLUMES)?;
    count(owner, "artifacts", t.artifacts.len(), MAX_VOLUMES)?;
    count(owner, "devices", t.resources.devices.len(), MAX_VOLUMES)
}

/// Bytes `value` encodes to as JSON, without keeping the encoding.
fn encoded_len<T: serde::Serialize>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    // Serializing domain types to JSON cannot fail (string keys, no non-finite floats).
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

impl Node {
    /// Checks a registering node's counts and sizes.
    pub fn check_limits(&self) -> Result<(), LimitError> {
        let owner = || format!("node {:?}", short(&self.id));
        check_meta(owner, "attributes", &self.attributes, MAX_NODE_ATTRIBUTES)?;
        check_meta(owner, "meta", &self.meta, MAX_META_ENTRIES)?;
        check_meta(owner, "links", &self.links, MAX_META_ENTRIES)?;
        count(owner, "drivers", self.drivers.len(), MAX_NODE_DRIVERS)?;
        for (name, d) in &self.drivers {
            check_meta(
                || format!("driver {:?} of node {:?}", short(name), short(&self.id)),
                "attributes",
                &d.attributes,
                MAX_META_ENTRIES,
            )?;
        }
        count(owner, "host volumes", self.host_volumes.len(), MAX_VOLUMES)?;
        count(owner, "host networks", self.host_networks.len(), MAX_VOLUMES)?;
        count(owner, "CSI controller plugins", self.csi_controller_plugins.len(), MAX_VOLUMES)?;
        count(owner, "CSI node plugins", self.csi_node_plugins.len(), MAX_VOLUMES)?;
        count(owner, "events", self.events.len(), MAX_NODE_EVENTS)?;
        if let Some(r) = &self.node_resources {
            check_networks(&owner, &r.networks)?;
            count(owner, "host network interfaces", r.node_networks.len(), MAX_VOLUMES)?;
            count(owner, "device groups", r.devices.len(), MAX_VOLUMES)?;
            count(owner, "reservable CPU cores", r.cpu.reservable_cpu_cores.len(), usize::from(u16::MAX) + 1)?;
        }
        if let Some(r) = &self.reserved_resources {
            count(owner, "reserved CPU cores", r.cpu.reserved_cpu_cores.len(), usize::from(u16::MAX) + 1)?;
        }
        Ok(())
    }
}

/// Volumes in one register request.
pub const MAX_CSI_VOLUMES_PER_REQUEST: usize = 100;
/// Capabilities, topologies (required and preferred each) and mount flags of one CSI volume.
pub const MAX_CSI_VOLUME_LIST: usize = 100;
/// Bytes of one CSI volume's ID, name, external, plugin, clone or snapshot ID, or mount flag.
pub const MAX_CSI_VOLUME_STRING_BYTES: usize = 1024;

impl crate::csi::CsiVolume {
    /// Checks a volume being registered: its strings, lists and maps (`Parameters`, `Context`,
    /// `Secrets`, topology segments) before any work in proportion to them.
    pub fn check_limits(&self) -> Result<(), LimitError> {
        let owner = || format!("volume {:?}", short(&self.id));
        let strings = [
            ("ID", &self.id),
            ("Name", &self.name),
            ("ExternalID", &self.external_id),
            ("Namespace", &self.namespace),
            ("PluginID", &self.plugin_id),
            ("CloneID", &self.clone_id),
            ("SnapshotID", &self.snapshot_id),
        ];
        for (what, v) in strings {
            if v.len() > MAX_CSI_VOLUME_STRING_BYTES {
                return Err(LimitError::TooLong { owner: owner(), what: what.into(), size: v.len(), max: MAX_CSI_VOLUME_STRING_BYTES });
            }
        }
        check_meta(owner, "parameters", &self.parameters, MAX_META_ENTRIES)?;
        check_meta(owner, "context", &self.context, MAX_META_ENTRIES)?;
        check_meta(owner, "secrets", &self.secrets, MAX_META_ENTRIES)?;
        count(owner, "capabilities", self.requested_capabilities.len(), MAX_CSI_VOLUME_LIST)?;
        count(owner, "topologies", self.topologies.len(), MAX_CSI_VOLUME_LIST)?;
        let mut segments: Vec<&crate::csi::CsiTopology> = self.topologies.iter().collect();
        if let Some(r) = &self.requested_topologies {
            count(owner, "required topologies", r.required.len(), MAX_CSI_VOLUME_LIST)?;
            count(owner, "preferred topologies", r.preferred.len(), MAX_CSI_VOLUME_LIST)?;
            segments.extend(r.required.iter().chain(&r.preferred));
        }
        for t in segments {
            check_meta(owner, "topology segments", &t.segments, MAX_META_ENTRIES)?;
        }
        if let Some(m) = &self.mount_options {
            count(owner, "mount flags", m.mount_flags.len(), MAX_CSI_VOLUME_LIST)?;
            for f in m.mount_flags.iter().chain(std::iter::once(&m.fs_type)) {
                if f.len() > MAX_CSI_VOLUME_STRING_BYTES {
                    return Err(LimitError::TooLong {
                        owner: owner(),
                        what: "mount option".into(),
                        size: f.len(),
                        max: MAX_CSI_VOLUME_STRING_BYTES,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Constraint, Spread};

    fn job(groups: usize, count: i64) -> Job {
        Job {
            id: "j".into(),
            task_groups: (0..groups)
                .map(|i| TaskGroup { name: format!("g{i}"), count, tasks: vec![Task::default()], ..TaskGroup::default() })
                .collect(),
            ..Job::default()
        }
    }

    #[test]
    fn a_huge_count_names_the_group_the_value_and_the_option() {
        let e = job(1, 1 << 31).check_limits(&JobLimits::default()).unwrap_err();
        assert_eq!(e.to_string(), "task group \"g0\" count 2147483648 is greater than job_max_count (50000)");
        // The configured limit is the one enforced and named.
        assert!(job(1, 11).check_limits(&JobLimits { max_count: 10 }).unwrap_err().to_string().contains("job_max_count (10)"));
        job(1, 10).check_limits(&JobLimits { max_count: 10 }).unwrap();
    }

    #[test]
    fn canaries_count_toward_job_max_count() {
        let mut j = job(1, 10);
        j.update = Some(crate::job::UpdateStrategy { canary: 1 << 40, ..crate::job::UpdateStrategy::default_service() });
        let e = j.check_limits(&JobLimits::default()).unwrap_err();
        assert_eq!(e.to_string(), "task group \"g0\" update canary 1099511627776 is greater than job_max_count (50000)");
        j.update = None;
        j.task_groups[0].update = Some(crate::job::UpdateStrategy { canary: 5, ..crate::job::UpdateStrategy::default_service() });
        assert_eq!(j.check_limits(&JobLimits { max_count: 14 }).unwrap_err(), LimitError::TotalCount { total: 15, max: 14 });
        j.check_limits(&JobLimits { max_count: 15 }).unwrap();
    }

    #[test]
    fn counts_add_up_over_groups_without_overflowing() {
        let e = job(3, 20_000).check_limits(&JobLimits::default()).unwrap_err();
        assert_eq!(e, LimitError::TotalCount { total: 60_000, max: 50_000 });
        // Per-group maximum counts over many groups neither wrap nor pass.
        let e = job(900, i64::MAX).check_limits(&JobLimits { max_count: i64::MAX }).unwrap_err();
        assert!(matches!(e, LimitError::TotalCount { .. }), "{e}");
        job(2, 25_000).check_limits(&JobLimits::default()).unwrap();
    }

    #[test]
    fn list_lengths_are_bounded_at_every_level() {
        let e = job(MAX_TASK_GROUPS + 1, 0).check_limits(&JobLimits::default()).unwrap_err();
        assert_eq!(e.to_string(), "job \"j\" has 1001 task groups, more than the limit of 1000");
        let mut j = job(1, 1);
        j.task_groups[0].tasks = vec![Task::default(); MAX_TASKS_PER_GROUP + 1];
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("task group \"g0\" has 101 tasks"));
        let mut j = job(1, 1);
        j.task_groups[0].tasks[0].constraints = vec![Constraint::default(); MAX_PLACEMENT_RULES + 1];
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("has 101 constraints"));
        let mut j = job(1, 1);
        j.spreads = vec![Spread { spread_target: vec![Default::default(); MAX_SPREAD_TARGETS + 1], ..Spread::default() }];
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("targets in one spread"));
        let mut j = job(1, 1);
        j.task_groups[0].services = vec![Service { checks: vec![Default::default(); MAX_CHECKS_PER_SERVICE + 1], ..Service::default() }];
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("has 101 checks"));
    }

    #[test]
    fn meta_sizes_are_bounded() {
        let mut j = job(1, 1);
        j.meta.insert("k".repeat(MAX_META_KEY_BYTES + 1), "v".into());
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("meta key \"kkkk"), "key length");
        let mut j = job(1, 1);
        j.task_groups[0].tasks[0].meta.insert("k".into(), "v".repeat(MAX_META_VALUE_BYTES + 1));
        let e = j.check_limits(&JobLimits::default()).unwrap_err().to_string();
        assert!(e.starts_with("task \"\" in group \"g0\" meta value of \"k\" is 65537 bytes"), "{e}");
        let mut j = job(1, 1);
        for i in 0..16 {
            j.meta.insert(format!("k{i}"), "v".repeat(MAX_META_VALUE_BYTES - 8));
        }
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("job \"j\" meta is"), "total size");
        let mut j = job(1, 1);
        j.meta = (0..=MAX_META_ENTRIES).map(|i| (i.to_string(), String::new())).collect();
        assert!(j.check_limits(&JobLimits::default()).unwrap_err().to_string().contains("meta has 1001 entries"));
    }

    #[test]
    fn the_encoded_size_is_bounded() {
        let mut j = job(1, 1);
        j.check_encoded_size().unwrap();
        j.task_groups[0].tasks[0].env.insert("BIG".into(), "x".repeat(MAX_JOB_ENCODED_BYTES));
        let e = j.check_encoded_size().unwrap_err();
        assert!(matches!(e, LimitError::JobTooLarge { size, .. } if size > MAX_JOB_ENCODED_BYTES), "{e}");
    }
}
