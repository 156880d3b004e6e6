//! Whether a job update can be applied to a running alloc in place or needs
//! a new alloc (Nomad's `tasksUpdated`). Anything that changes what runs or
//! where it may run is destructive; counts, constraints, restart and
//! reschedule policies, services without Connect, and the like are not
//! (constraints are re-checked by the in-place fit on the alloc's node).

use std::collections::BTreeMap;

use nomad_proto::service::Service;
use nomad_proto::{Affinity, Job, NetworkResource, Spread, TaskGroup};

/// An in-place update keeps the ports, networks and devices the alloc already holds: only its
/// cpu and memory are placed again.
pub(crate) fn keep_held_networks(existing: &nomad_proto::Allocation, resources: &mut nomad_proto::AllocatedResources) {
    let Some(old) = &existing.allocated_resources else { return };
    for (task, r) in resources.tasks.iter_mut() {
        let prev = old.tasks.get(task);
        r.networks = prev.map(|p| p.networks.clone()).unwrap_or_default();
        r.devices = prev.map(|p| p.devices.clone()).unwrap_or_default();
    }
    resources.shared.networks = old.shared.networks.clone();
    resources.shared.ports = old.shared.ports.clone();
}

/// The first destructive difference for `group` between two job versions, if any.
pub(crate) fn destructive_change(new: &Job, old: &Job, group: &str) -> Option<&'static str> {
    let (Some(a), Some(b)) = (new.lookup_task_group(group), old.lookup_task_group(group)) else {
        return Some("task group");
    };
    if a.tasks.len() != b.tasks.len() {
        return Some("number of tasks");
    }
    if a.ephemeral_disk != b.ephemeral_disk {
        return Some("ephemeral disk");
    }
    if networks_differ(&a.networks, &b.networks) {
        return Some("network");
    }
    if affinities(new, a) != affinities(old, b) {
        return Some("affinities");
    }
    if spreads(new, a) != spreads(old, b) {
        return Some("spreads");
    }
    if consul_namespace(a) != consul_namespace(b) {
        return Some("consul namespace");
    }
    if connect_services(&a.services) != connect_services(&b.services) {
        return Some("connect service");
    }
    if a.volumes != b.volumes {
        return Some("volume request");
    }
    for at in &a.tasks {
        let Some(bt) = b.lookup_task(&at.name) else { return Some("task deleted") };
        let differs = at.driver != bt.driver
            || at.user != bt.user
            || at.config != bt.config
            || at.env != bt.env
            || at.artifacts != bt.artifacts
            || at.vault != bt.vault
            || at.templates != bt.templates
            || at.csi_plugin_config != bt.csi_plugin_config
            || at.volume_mounts != bt.volume_mounts
            || at.identity != bt.identity
            || at.log_config.disabled != bt.log_config.disabled;
        if differs {
            return Some("task");
        }
        if combined_meta(new, a, &at.name) != combined_meta(old, b, &bt.name) {
            return Some("task meta");
        }
        if networks_differ(&at.resources.networks, &bt.resources.networks) {
            return Some("task network");
        }
        let (ra, rb) = (&at.resources, &bt.resources);
        if ra.cpu != rb.cpu
            || ra.cores != rb.cores
            || ra.memory_mb != rb.memory_mb
            || ra.memory_max_mb != rb.memory_max_mb
            || ra.devices != rb.devices
        {
            return Some("task resources");
        }
    }
    None
}

/// Compares networks ignoring the values of dynamic ports.
fn networks_differ(a: &[NetworkResource], b: &[NetworkResource]) -> bool {
    a.len() != b.len()
        || a.iter().zip(b).any(|(x, y)| {
            let ports = |n: &NetworkResource| {
                let fixed = n.reserved_ports.iter().map(|p| (p.label.clone(), p.value, p.to, p.host_network.clone()));
                let dynamic = n.dynamic_ports.iter().map(|p| (p.label.clone(), -1, p.to, p.host_network.clone()));
                fixed.chain(dynamic).collect::<Vec<_>>()
            };
            x.mode != y.mode || x.mbits != y.mbits || x.hostname != y.hostname || x.dns != y.dns || ports(x) != ports(y)
        })
}

fn affinities<'j>(job: &'j Job, tg: &'j TaskGroup) -> Vec<&'j Affinity> {
    job.affinities.iter().chain(&tg.affinities).chain(tg.tasks.iter().flat_map(|t| t.affinities.iter())).collect()
}

fn spreads<'j>(job: &'j Job, tg: &'j TaskGroup) -> Vec<&'j Spread> {
    job.spreads.iter().chain(&tg.spreads).collect()
}

fn consul_namespace(tg: &TaskGroup) -> Option<&serde_json::Value> {
    tg.consul.as_ref().and_then(|c| c.get("Namespace"))
}

fn connect_services(services: &[Service]) -> Vec<(&str, &nomad_proto::service::ConsulConnect)> {
    services.iter().filter_map(|s| s.connect.as_ref().map(|c| (s.name.as_str(), c))).collect()
}

/// Job, group and task meta merged (task wins).
fn combined_meta<'j>(job: &'j Job, tg: &'j TaskGroup, task: &str) -> BTreeMap<&'j str, &'j str> {
    let mut m = BTreeMap::new();
    let task_meta = tg.lookup_task(task).map(|t| &t.meta);
    for src in [Some(&job.meta), Some(&tg.meta), task_meta].into_iter().flatten() {
        for (k, v) in src {
            m.insert(k.as_str(), v.as_str());
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn count_and_constraints_are_not_destructive_but_config_is() {
        let old = testing::job("web", 2);
        let mut new = old.clone();
        new.task_groups[0].count = 5;
        new.constraints.push(nomad_proto::Constraint {
            l_target: "${attr.kernel.name}".into(),
            r_target: "linux".into(),
            operand: "=".into(),
        });
        new.task_groups[0].tasks[0].services.push(Service { name: "web".into(), ..Service::default() });
        assert_eq!(destructive_change(&new, &old, "web"), None);
        new.task_groups[0].tasks[0].env.insert("A".into(), "1".into());
        assert_eq!(destructive_change(&new, &old, "web"), Some("task"));
    }

    #[test]
    fn dynamic_port_values_are_ignored() {
        let mut old = testing::job("web", 1);
        old.task_groups[0].networks = vec![NetworkResource {
            dynamic_ports: vec![nomad_proto::Port { label: "http".into(), value: 25000, ..Default::default() }],
            ..Default::default()
        }];
        let mut new = old.clone();
        new.task_groups[0].networks[0].dynamic_ports[0].value = 0;
        assert_eq!(destructive_change(&new, &old, "web"), None);
        new.task_groups[0].networks[0].dynamic_ports[0].label = "admin".into();
        assert_eq!(destructive_change(&new, &old, "web"), Some("network"));
        let mut more_mem = old.clone();
        more_mem.task_groups[0].tasks[0].resources.memory_mb += 1;
        assert_eq!(destructive_change(&more_mem, &old, "web"), Some("task resources"));
    }
}
