//! The namespaces table.

use std::sync::Arc;

use nomad_proto::Namespace;

use super::{Table, Txn, TxnError};

impl Txn<'_> {
    /// Inserts or updates a namespace.
    pub fn upsert_namespace(&mut self, mut ns: Namespace) {
        ns.create_index = self.state.namespaces.get(&ns.name).map_or(self.index, |old| old.create_index);
        ns.modify_index = self.index;
        self.state.namespaces.insert(ns.name.clone(), Arc::new(ns));
        self.touch(Table::Namespaces);
    }

    /// Removes a namespace that holds no jobs. `default` cannot be removed.
    pub fn delete_namespace(&mut self, name: &str) -> Result<(), TxnError> {
        if name == nomad_proto::job::DEFAULT_NAMESPACE {
            return Err(TxnError("default namespace can not be deleted".into()));
        }
        if self.state.jobs().any(|j| j.namespace == name) {
            return Err(TxnError(format!("namespace {name:?} has non-terminal jobs")));
        }
        if self.state.variables_with_prefix(name, "").next().is_some() {
            return Err(TxnError(format!(
                "namespace {name:?} contains at least one variable. All variables in namespace must be deleted before it can be deleted"
            )));
        }
        if self.state.namespaces.remove(name).is_none() {
            return Err(TxnError(format!("namespace {name:?} not found")));
        }
        self.touch(Table::Namespaces);
        Ok(())
    }
}
