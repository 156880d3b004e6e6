//! The CSI plugins table, keyed by plugin ID (plugins are global, not namespaced).
//!
//! Plugins are never written directly: every node register (and removal) brings them in line
//! with the node's fingerprints (`crate::csi::plugin`), as Nomad's `upsertNodeTxn` and
//! `DeleteNode` do.

use std::sync::Arc;

use nomad_proto::csi::CsiPlugin;
use nomad_proto::{AllocStubFields, Node};

use super::{State, Table, Txn, Watch};
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
    fn apply_plugin_writes(&mut self, writes: Vec<PluginWrite>) {
        for w in writes {
            let id = match w {
                PluginWrite::Upsert(p) => {
                    let id = p.id.clone();
                    self.state.csi_plugins.insert(id.clone(), Arc::new(*p));
                    id
                }
                PluginWrite::Delete(id) => {
                    self.state.csi_plugins.remove(&id);
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
