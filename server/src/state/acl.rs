//! The ACL tables: policies (by name), tokens (by AccessorID, with a SecretID index), roles (by
//! ID), and the index of the one-time bootstrap (Nomad's `acl_token_bootstrap`).

use std::sync::Arc;

use crate::acl::{AclPolicy, AclRole, AclToken};

use super::{State, Table, Txn, TxnError};

impl State {
    /// Every policy, by name.
    pub fn acl_policies(&self) -> impl Iterator<Item = &Arc<AclPolicy>> {
        self.acl_policies.values()
    }

    /// One policy.
    pub fn acl_policy(&self, name: &str) -> Option<&Arc<AclPolicy>> {
        self.acl_policies.get(name)
    }

    /// Every token, by AccessorID.
    pub fn acl_tokens(&self) -> impl Iterator<Item = &Arc<AclToken>> {
        self.acl_tokens.values()
    }

    /// One token by AccessorID.
    pub fn acl_token(&self, accessor_id: &str) -> Option<&Arc<AclToken>> {
        self.acl_tokens.get(accessor_id)
    }

    /// One token by SecretID.
    pub fn acl_token_by_secret(&self, secret_id: &str) -> Option<&Arc<AclToken>> {
        self.acl_tokens_by_secret.get(secret_id).and_then(|a| self.acl_tokens.get(a))
    }

    /// Every role, by ID.
    pub fn acl_roles(&self) -> impl Iterator<Item = &Arc<AclRole>> {
        self.acl_roles.values()
    }

    /// One role by ID.
    pub fn acl_role(&self, id: &str) -> Option<&Arc<AclRole>> {
        self.acl_roles.get(id)
    }

    /// One role by name.
    pub fn acl_role_by_name(&self, name: &str) -> Option<&Arc<AclRole>> {
        self.acl_roles.values().find(|r| r.name == name)
    }

    /// The Raft index of the ACL bootstrap; 0 before it.
    pub fn acl_bootstrap_index(&self) -> u64 {
        self.acl_bootstrap_index
    }
}

impl Txn<'_> {
    /// Inserts or replaces policies (create index kept, hash recomputed).
    pub fn upsert_acl_policies(&mut self, policies: &[AclPolicy]) {
        for p in policies {
            let mut p = p.clone();
            p.create_index = self.state.acl_policies.get(&p.name).map_or(self.index, |old| old.create_index);
            p.modify_index = self.index;
            p.set_hash();
            self.state.acl_policies.insert(p.name.clone(), Arc::new(p));
        }
        self.touch(Table::AclPolicies);
    }

    /// Removes policies; a missing one is an error (nothing is removed then).
    pub fn delete_acl_policies(&mut self, names: &[String]) -> Result<(), TxnError> {
        for n in names {
            if self.state.acl_policies.remove(n).is_none() {
                return Err(TxnError(format!("ACL policy not found: {n}")));
            }
        }
        self.touch(Table::AclPolicies);
        Ok(())
    }

    /// Inserts or replaces tokens (create index and create time kept, hash recomputed).
    pub fn upsert_acl_tokens(&mut self, tokens: &[AclToken]) {
        for t in tokens {
            let mut t = t.clone();
            if let Some(old) = self.state.acl_tokens.get(&t.accessor_id).cloned() {
                t.create_index = old.create_index;
                t.create_time = old.create_time;
                self.state.acl_tokens_by_secret.remove(&old.secret_id);
            } else {
                t.create_index = self.index;
            }
            t.modify_index = self.index;
            t.set_hash();
            self.state.acl_tokens_by_secret.insert(t.secret_id.clone(), t.accessor_id.clone());
            self.state.acl_tokens.insert(t.accessor_id.clone(), Arc::new(t));
        }
        self.touch(Table::AclTokens);
    }

    /// Removes tokens by AccessorID; a missing one is an error.
    pub fn delete_acl_tokens(&mut self, accessor_ids: &[String]) -> Result<(), TxnError> {
        for a in accessor_ids {
            let Some(old) = self.state.acl_tokens.remove(a) else { return Err(TxnError(format!("ACL token not found: {a}"))) };
            self.state.acl_tokens_by_secret.remove(&old.secret_id);
        }
        self.touch(Table::AclTokens);
        Ok(())
    }

    /// Stores the bootstrap token once; again only with the current bootstrap index as
    /// `reset_index`. The bootstrap index becomes this write's.
    pub fn bootstrap_acl_token(&mut self, token: &AclToken, reset_index: u64) -> Result<(), TxnError> {
        let done = self.state.acl_bootstrap_index;
        if done != 0 && reset_index != done {
            return Err(TxnError(format!("ACL bootstrap already done (reset index: {done})")));
        }
        self.upsert_acl_tokens(std::slice::from_ref(token));
        self.state.acl_bootstrap_index = self.index;
        Ok(())
    }

    /// Inserts or replaces roles; names are unique.
    pub fn upsert_acl_roles(&mut self, roles: &[AclRole]) -> Result<(), TxnError> {
        for r in roles {
            if self.state.acl_roles.values().any(|o| o.name == r.name && o.id != r.id) {
                return Err(TxnError(format!("ACL role with name {} already exists", r.name)));
            }
            let mut r = r.clone();
            r.create_index = self.state.acl_roles.get(&r.id).map_or(self.index, |old| old.create_index);
            r.modify_index = self.index;
            r.set_hash();
            self.state.acl_roles.insert(r.id.clone(), Arc::new(r));
        }
        self.touch(Table::AclRoles);
        Ok(())
    }

    /// Removes roles by ID (and their links on tokens); a missing one is an error.
    pub fn delete_acl_roles(&mut self, ids: &[String]) -> Result<(), TxnError> {
        for id in ids {
            if self.state.acl_roles.remove(id).is_none() {
                return Err(TxnError(format!("ACL role not found: {id}")));
            }
        }
        let linked: Vec<AclToken> = self
            .state
            .acl_tokens
            .values()
            .filter(|t| t.roles.iter().any(|l| ids.contains(&l.id)))
            .map(|t| {
                let mut t = (**t).clone();
                t.roles.retain(|l| !ids.contains(&l.id));
                t
            })
            .collect();
        if !linked.is_empty() {
            self.upsert_acl_tokens(&linked);
        }
        self.touch(Table::AclRoles);
        Ok(())
    }
}
