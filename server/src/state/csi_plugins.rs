//! The CSI plugins table, keyed by plugin ID (plugins are global, not namespaced).
//!
//! Plugins are never written directly: every node register (and removal) brings them in line
//! with the node's fingerprints (`crate::csi::plugin`), as Nomad's `upsertNodeTxn` and
//! `DeleteNode` do.

use std::sync::Arc;

use nomad_proto::csi::CsiPlugin;
use nomad_proto::{AllocStubFields, Node};

use super::{Change, State, Table, Txn, Watch};
use crate::csi::plugin::{PluginWrite, writes_for_node, writes_for_node_removal};

impl State {
    /// Every plugin, ordered by ID.
    pub fn csi_plugins(&self) -> impl Iterator<Item = &Arc<CsiPlugin>> {
        self.csi_plugins.values()
    }

    /// One plugin.
    pub fn csi_plugin(&self, id: &str) -> Option<&Arc<CsiPlugin>> {
        self.csi_plugins.get(id)
    }

    /// A copy of the plugin with the stubs of its allocs (`CSIPluginDenormalize`), newest
    /// first, only those in `namespace` (`None`: all), as Nomad's `CSIPlugin.Get` shows them.
    pub fn csi_plugin_denormalized(&self, plug: &CsiPlugin, namespace: Option<&str>) -> CsiPlugin {
        let mut p = plug.clone();
        let ids: std::collections::BTreeSet<&str> =
            plug.controllers.values().chain(plug.nodes.values()).map(|i| i.alloc_id.as_str()).collect();
        let mut allocs: Vec<_> = ids
            .into_iter()
            .filter_map(|id| self.alloc(id))
            .filter(|a| namespace.is_none_or(|ns| a.namespace == ns))
            .map(|a| a.stub(AllocStubFields::default()))
            .collect();
        allocs.sort_by_key(|a| std::cmp::Reverse(a.modify_index));
        p.allocations = allocs;
        p
    }
}

impl Txn<'_> {
    /// Applies plugin writes. Every node register rewrites the plugins the node reports; only
    /// those whose instances or health changed are recorded for the event stream.
    fn apply_plugin_writes(&mut self, writes: Vec<PluginWrite>) {
        for w in writes {
            let id = match w {
                PluginWrite::Upsert(p) => {
                    let id = p.id.clone();
                    let p = Arc::new(*p);
                    let changed = self.state.csi_plugins.get(&id).is_none_or(|old| !same_instances(old, &p));
                    self.state.csi_plugins.insert(id.clone(), p.clone());
                    if changed {
                        self.record(Change::CsiPlugin(p));
                    }
                    id
                }
                PluginWrite::Delete(id) => {
                    if let Some(old) = self.state.csi_plugins.remove(&id) {
                        // Deleted because no instance is left: shown as such.
                        let mut last = (*old).clone();
                        last.controllers.clear();
                        last.nodes.clear();
                        last.controllers_healthy = 0;
                        last.nodes_healthy = 0;
                        last.modify_index = self.index;
                        self.record(Change::CsiPluginDeleted(Arc::new(last)));
                    }
                    id
                }
            };
            self.touch(Table::CsiPlugins);
            self.touch_key(Watch::CsiPlugin(id));
        }
    }

    /// Brings the plugins in line with a node's CSI fingerprints.
    pub(super) fn upsert_csi_plugins_for_node(&mut self, node: &Node) {
        let writes = writes_for_node(&self.state.csi_plugins, node, self.index);
        self.apply_plugin_writes(writes);
    }

    /// Takes a removed node out of every plugin.
    pub(super) fn delete_node_csi_plugins(&mut self, node_id: &str) {
        let writes = writes_for_node_removal(&self.state.csi_plugins, node_id, self.index);
        self.apply_plugin_writes(writes);
    }
}

/// Whether two versions of a plugin have the same instances, health and identity: what differs
/// is only the index and the instances' fingerprint times, which every node register renews.
fn same_instances(a: &CsiPlugin, b: &CsiPlugin) -> bool {
    let normal = |p: &CsiPlugin| {
        let mut p = p.clone();
        p.modify_index = 0;
        for i in p.controllers.values_mut().chain(p.nodes.values_mut()) {
            i.update_time = Default::default();
        }
        p
    };
    normal(a) == normal(b)
}
