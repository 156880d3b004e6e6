//! The Variables table (encrypted items, by namespace and path) and the root keys that encrypt
//! them (wrapped; see `keyring`).

use std::sync::Arc;

use nomad_proto::NamespacedId;
use nomad_proto::variables::{VariableMetadata, root_key_state};
use serde::{Deserialize, Serialize};

use super::{Change, State, Table, Txn, TxnError};
use crate::keyring::{EncryptedVariable, StoredRootKey};

/// A variable write as the FSM applies it (Nomad's `VarOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum VarOp {
    /// Create or replace.
    Set,
    /// Create or replace if the stored variable's modify index is this (0: only if absent).
    Cas(u64),
    /// Remove (absent is fine).
    Delete,
    /// Remove if the stored variable's modify index is this.
    DeleteCas(u64),
}

/// How a refused check-and-set starts (the endpoint answers 409 with the current variable).
pub const CAS_CONFLICT: &str = "cas conflict";

impl State {
    /// One variable.
    pub fn variable(&self, namespace: &str, path: &str) -> Option<&Arc<EncryptedVariable>> {
        self.variables.get(&NamespacedId::new(namespace, path))
    }

    /// The variables of `namespace` (every namespace for `*`) whose path starts with `prefix`, by
    /// namespace and path.
    pub fn variables_with_prefix<'a>(
        &'a self,
        namespace: &'a str,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a Arc<EncryptedVariable>> + 'a {
        let range: Box<dyn Iterator<Item = (&NamespacedId, &Arc<EncryptedVariable>)>> = if namespace == "*" {
            Box::new(self.variables.iter())
        } else {
            Box::new(self.variables.range(NamespacedId::new(namespace, prefix)..).take_while(move |(k, _)| k.namespace == namespace))
        };
        range.map(|(_, v)| v).filter(move |v| v.meta.path.starts_with(prefix))
    }

    /// How many variables the root key `key_id` encrypted.
    pub fn variables_using_key(&self, key_id: &str) -> usize {
        self.variables.values().filter(|v| v.key_id == key_id).count()
    }

    /// Every root key, by KeyID.
    pub fn root_keys(&self) -> impl Iterator<Item = &Arc<StoredRootKey>> {
        self.root_keys.values()
    }

    /// One root key.
    pub fn root_key(&self, key_id: &str) -> Option<&Arc<StoredRootKey>> {
        self.root_keys.get(key_id)
    }

    /// The key that encrypts new writes and signs identities.
    pub fn active_root_key(&self) -> Option<&Arc<StoredRootKey>> {
        self.root_keys.values().find(|k| crate::keyring::is_active(&k.meta))
    }
}

impl Txn<'_> {
    /// Applies one variable write; a check-and-set that does not hold is refused with
    /// [`CAS_CONFLICT`] (nothing changes). Create index and time are kept on update.
    pub fn apply_variable(&mut self, op: VarOp, var: &EncryptedVariable, now: i64) -> Result<(), TxnError> {
        let key = NamespacedId::new(&var.meta.namespace, &var.meta.path);
        let current = self.state.variables.get(&key).cloned();
        let expect = match op {
            VarOp::Cas(i) | VarOp::DeleteCas(i) => Some(i),
            VarOp::Set | VarOp::Delete => None,
        };
        if let Some(expect) = expect {
            let have = current.as_ref().map_or(0, |c| c.meta.modify_index);
            if have != expect {
                return Err(TxnError(format!("{CAS_CONFLICT}: the variable's modify index is {have}, not {expect}")));
            }
        }
        match op {
            VarOp::Set | VarOp::Cas(_) => {
                let mut v = var.clone();
                let (create_index, create_time) = current.as_ref().map_or((self.index, now), |c| (c.meta.create_index, c.meta.create_time));
                v.meta = VariableMetadata { create_index, create_time, modify_index: self.index, modify_time: now, ..v.meta };
                let meta = Arc::new(v.meta.clone());
                self.state.variables.insert(key, Arc::new(v));
                self.record(Change::Variable(meta));
            }
            VarOp::Delete | VarOp::DeleteCas(_) => {
                let Some(old) = self.state.variables.remove(&key) else { return Ok(()) };
                self.record(Change::VariableDeleted(Arc::new(old.meta.clone())));
            }
        }
        self.touch(Table::Variables);
        Ok(())
    }

    /// Inserts or replaces a root key (create index kept). A key stored active demotes the
    /// active one to inactive: there is one active key at a time.
    pub fn upsert_root_key(&mut self, key: &StoredRootKey) {
        let mut key = key.clone();
        if crate::keyring::is_active(&key.meta) {
            let demoted: Vec<Arc<StoredRootKey>> = self
                .state
                .root_keys
                .values()
                .filter(|k| k.meta.key_id != key.meta.key_id && crate::keyring::is_active(&k.meta))
                .cloned()
                .collect();
            for old in demoted {
                let mut old = (*old).clone();
                old.meta.state = root_key_state::INACTIVE.into();
                old.meta.modify_index = self.index;
                self.state.root_keys.insert(old.meta.key_id.clone(), Arc::new(old));
            }
        }
        key.meta.create_index = self.state.root_keys.get(&key.meta.key_id).map_or(self.index, |old| old.meta.create_index);
        key.meta.modify_index = self.index;
        self.state.root_keys.insert(key.meta.key_id.clone(), Arc::new(key));
        self.touch(Table::RootKeys);
    }

    /// Changes a root key's state (`inactive` or `rekeying`; activating goes through
    /// [`Txn::upsert_root_key`]).
    pub fn set_root_key_state(&mut self, key_id: &str, state: &str) -> Result<(), TxnError> {
        let Some(old) = self.state.root_keys.get(key_id).cloned() else { return Err(TxnError(format!("root key {key_id} not found"))) };
        if crate::keyring::is_active(&old.meta) {
            return Err(TxnError("active root key cannot be changed: rotate first".into()));
        }
        let mut k = (*old).clone();
        k.meta.state = state.into();
        k.meta.modify_index = self.index;
        self.state.root_keys.insert(key_id.to_string(), Arc::new(k));
        self.touch(Table::RootKeys);
        Ok(())
    }

    /// Removes a root key that is not active and encrypts no variable.
    pub fn delete_root_key(&mut self, key_id: &str) -> Result<(), TxnError> {
        let Some(old) = self.state.root_keys.get(key_id) else { return Err(TxnError(format!("root key {key_id} not found"))) };
        if crate::keyring::is_active(&old.meta) {
            return Err(TxnError("active root key cannot be deleted - call rotate first".into()));
        }
        let used = self.state.variables_using_key(key_id);
        if used > 0 {
            return Err(TxnError(format!(
                "root key {key_id} still encrypts {used} variable(s): rotate with -full to re-encrypt them first"
            )));
        }
        self.state.root_keys.remove(key_id);
        self.touch(Table::RootKeys);
        Ok(())
    }
}
