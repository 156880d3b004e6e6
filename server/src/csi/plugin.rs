//! Plugins from node fingerprints (`upsertCSIPluginsForNode`, `deleteNodeCSIPlugins` and
//! `CSIPlugin.AddPlugin`/`DeleteNodeForType` in Nomad).
//!
//! A plugin exists while some node runs an instance of it: a node's register adds or updates
//! its instances (`Node.CSIControllerPlugins`, `Node.CSINodePlugins`) and takes it out of the
//! plugins it no longer runs; a plugin left without instances is deleted. The health counts are
//! counted from the instances each time, so they cannot drift from them.

use std::sync::Arc;

use imbl::OrdMap;
use nomad_proto::Node;
use nomad_proto::csi::{CsiInfo, CsiPlugin};

/// One write to the plugins table.
#[derive(Debug, Clone, PartialEq)]
pub enum PluginWrite {
    /// Insert or replace.
    Upsert(Box<CsiPlugin>),
    /// Remove (no instance left).
    Delete(String),
}

/// Which side of a plugin an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Controller,
    Node,
}

fn instances(plug: &mut CsiPlugin, side: Side) -> &mut std::collections::BTreeMap<String, CsiInfo> {
    match side {
        Side::Controller => &mut plug.controllers,
        Side::Node => &mut plug.nodes,
    }
}

fn recount(plug: &mut CsiPlugin) {
    plug.controllers_healthy = plug.controllers.values().filter(|i| i.healthy).count() as i64;
    plug.nodes_healthy = plug.nodes.values().filter(|i| i.healthy).count() as i64;
}

/// No instance and no job expecting one (`IsEmpty`).
pub fn is_empty(plug: &CsiPlugin) -> bool {
    plug.controllers.is_empty() && plug.nodes.is_empty() && plug.controller_jobs.is_empty() && plug.node_jobs.is_empty()
}

/// The writes that bring `plugins` in line with `node`'s fingerprints, at Raft `index`.
///
/// An unhealthy instance does not create a plugin or an instance (it is the last fingerprint of
/// a plugin alloc that is stopping), but does update an instance that exists. A plugin loses the node's instance of a
/// side the node no longer reports.
pub fn writes_for_node(plugins: &OrdMap<String, Arc<CsiPlugin>>, node: &Node, index: u64) -> Vec<PluginWrite> {
    let mut changed: std::collections::BTreeMap<String, CsiPlugin> = std::collections::BTreeMap::new();
    let reported = [(Side::Controller, &node.csi_controller_plugins), (Side::Node, &node.csi_node_plugins)];
    for (side, infos) in reported {
        for (id, info) in infos {
            let plug = match changed.remove(id) {
                Some(p) => p,
                None => match plugins.get(id) {
                    Some(p) => (**p).clone(),
                    None if !info.healthy => continue,
                    None => CsiPlugin { id: id.clone(), create_index: index, ..CsiPlugin::default() },
                },
            };
            let mut plug = plug;
            plug.provider = info.provider.clone();
            plug.version = info.provider_version.clone();
            if side == Side::Controller {
                plug.controller_required = info.requires_controller_plugin;
            }
            let mut info = info.clone();
            if info.plugin_id.is_empty() {
                info.plugin_id = id.clone();
            }
            // As Nomad: an unhealthy instance replaces a known one, but is not added anew.
            let side_map = instances(&mut plug, side);
            if info.healthy || side_map.contains_key(&node.id) {
                side_map.insert(node.id.clone(), info);
            }
            changed.insert(id.clone(), plug);
        }
    }
    // Instances of this node the node no longer reports.
    for (id, plug) in plugins {
        for (side, infos) in reported {
            if infos.contains_key(id) {
                continue;
            }
            let holds = match side {
                Side::Controller => plug.controllers.contains_key(&node.id),
                Side::Node => plug.nodes.contains_key(&node.id),
            };
            if holds {
                let p = changed.entry(id.clone()).or_insert_with(|| (**plug).clone());
                instances(p, side).remove(&node.id);
            }
        }
    }
    finish(changed, index)
}

/// The writes that take a removed node out of every plugin it ran.
pub fn writes_for_node_removal(plugins: &OrdMap<String, Arc<CsiPlugin>>, node_id: &str, index: u64) -> Vec<PluginWrite> {
    let mut changed = std::collections::BTreeMap::new();
    for (id, plug) in plugins {
        if plug.controllers.contains_key(node_id) || plug.nodes.contains_key(node_id) {
            let mut p = (**plug).clone();
            p.controllers.remove(node_id);
            p.nodes.remove(node_id);
            changed.insert(id.clone(), p);
        }
    }
    finish(changed, index)
}

fn finish(changed: std::collections::BTreeMap<String, CsiPlugin>, index: u64) -> Vec<PluginWrite> {
    changed
        .into_iter()
        .map(|(id, mut p)| {
            recount(&mut p);
            if is_empty(&p) {
                PluginWrite::Delete(id)
            } else {
                p.modify_index = index;
                PluginWrite::Upsert(Box::new(p))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{CsiControllerInfo, CsiNodeInfo};

    use super::*;

    fn info(healthy: bool) -> CsiInfo {
        CsiInfo { healthy, provider: "hostpath".into(), provider_version: "1.2".into(), alloc_id: "alloc".into(), ..CsiInfo::default() }
    }

    fn monolith(node_id: &str, healthy: bool) -> Node {
        let mut n = Node { id: node_id.into(), ..Node::default() };
        n.csi_controller_plugins.insert(
            "p".into(),
            CsiInfo { requires_controller_plugin: true, controller_info: Some(CsiControllerInfo::default()), ..info(healthy) },
        );
        n.csi_node_plugins.insert("p".into(), CsiInfo { node_info: Some(CsiNodeInfo::default()), ..info(healthy) });
        n
    }

    fn apply(plugins: &mut OrdMap<String, Arc<CsiPlugin>>, writes: Vec<PluginWrite>) {
        for w in writes {
            match w {
                PluginWrite::Upsert(p) => {
                    plugins.insert(p.id.clone(), Arc::new(*p));
                }
                PluginWrite::Delete(id) => {
                    plugins.remove(&id);
                }
            }
        }
    }

    fn update(plugins: &mut OrdMap<String, Arc<CsiPlugin>>, node: &Node, index: u64) {
        let writes = writes_for_node(plugins, node, index);
        apply(plugins, writes);
    }

    #[test]
    fn fingerprints_build_plugins_with_health_counts() {
        let mut plugins = OrdMap::new();
        // An unhealthy first report creates nothing.
        assert!(writes_for_node(&plugins, &monolith("n1", false), 1).is_empty());
        update(&mut plugins, &monolith("n1", true), 2);
        update(&mut plugins, &monolith("n2", true), 3);
        let p = &plugins["p"];
        assert_eq!((p.controllers_healthy, p.nodes_healthy), (2, 2));
        assert!(p.controller_required);
        assert_eq!((p.provider.as_str(), p.version.as_str()), ("hostpath", "1.2"));
        assert_eq!((p.create_index, p.modify_index), (2, 3));
        assert_eq!(p.nodes["n1"].plugin_id, "p");
        // n2 turns unhealthy: still listed, no longer counted.
        update(&mut plugins, &monolith("n2", false), 4);
        let p = &plugins["p"];
        assert_eq!((p.controllers_healthy, p.nodes_healthy), (1, 1));
        assert_eq!(p.nodes.len(), 2);
        // Re-registering the same healthy fingerprint does not count twice.
        update(&mut plugins, &monolith("n1", true), 5);
        assert_eq!(plugins["p"].nodes_healthy, 1);
    }

    #[test]
    fn a_node_that_stops_reporting_a_side_leaves_it_and_empty_plugins_go() {
        let mut plugins = OrdMap::new();
        update(&mut plugins, &monolith("n1", true), 1);
        update(&mut plugins, &monolith("n2", true), 2);
        // n1 now runs only the node side.
        let mut node_only = monolith("n1", true);
        node_only.csi_controller_plugins.clear();
        update(&mut plugins, &node_only, 3);
        let p = &plugins["p"];
        assert!(!p.controllers.contains_key("n1") && p.nodes.contains_key("n1"));
        assert_eq!((p.controllers_healthy, p.nodes_healthy), (1, 2));
        // n1 reports nothing; n2 is removed: the plugin has no instance left and goes.
        update(&mut plugins, &Node { id: "n1".into(), ..Node::default() }, 4);
        assert_eq!(plugins["p"].nodes.len(), 1);
        let w = writes_for_node_removal(&plugins, "n2", 5);
        assert_eq!(w, vec![PluginWrite::Delete("p".into())]);
        apply(&mut plugins, w);
        assert!(plugins.is_empty());
        // Removing a node that runs nothing writes nothing.
        assert!(writes_for_node_removal(&plugins, "n3", 6).is_empty());
    }
}
