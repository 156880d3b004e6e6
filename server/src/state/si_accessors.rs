//! The Consul Service Identity token accessors table (Nomad's `si_token_accessors`), and the
//! cluster's metadata (its ID, which names every SI token).
//!
//! An accessor is stored once its token exists in Consul and is removed only once Consul
//! confirmed the token is gone, so the table is exactly the tokens the cluster still owes
//! Consul a revocation for (live allocs' tokens and dead allocs' tokens not yet revoked).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{State, Table, Txn};

/// One SI token the servers created (`structs.SITokenAccessor`). The secret is never stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SiTokenAccessor {
    /// Consul namespace the token lives in (empty: Consul's default).
    pub consul_namespace: String,
    /// Node the alloc runs on.
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// Alloc the token is for.
    #[serde(rename = "AllocID")]
    pub alloc_id: String,
    /// Consul's AccessorID of the token.
    #[serde(rename = "AccessorID")]
    pub accessor_id: String,
    /// Task the token is for.
    pub task_name: String,
    /// Raft index of the write that stored it.
    pub create_index: u64,
}

/// The cluster's identity (`structs.ClusterMetadata`), set once by the first leader that needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct ClusterMetadata {
    /// A UUID.
    #[serde(rename = "ClusterID")]
    pub cluster_id: String,
    /// Unix nanoseconds.
    pub create_time: i64,
}

impl State {
    /// Every stored SI token accessor, by AccessorID.
    pub fn si_token_accessors(&self) -> impl Iterator<Item = &Arc<SiTokenAccessor>> {
        self.si_accessors.values()
    }

    /// One accessor.
    pub fn si_token_accessor(&self, accessor_id: &str) -> Option<&Arc<SiTokenAccessor>> {
        self.si_accessors.get(accessor_id)
    }

    /// The accessors of one alloc's tokens.
    pub fn si_token_accessors_by_alloc<'a>(&'a self, alloc_id: &'a str) -> impl Iterator<Item = &'a Arc<SiTokenAccessor>> + 'a {
        self.si_accessors.values().filter(move |a| a.alloc_id == alloc_id)
    }

    /// The accessors of the tokens of allocs on one node.
    pub fn si_token_accessors_by_node<'a>(&'a self, node_id: &'a str) -> impl Iterator<Item = &'a Arc<SiTokenAccessor>> + 'a {
        self.si_accessors.values().filter(move |a| a.node_id == node_id)
    }

    /// The cluster's metadata, once set.
    pub fn cluster_metadata(&self) -> Option<&ClusterMetadata> {
        self.cluster.as_ref()
    }

    /// Whether the token behind `a` must be revoked: its alloc is gone or finished on its
    /// client, or its node is gone or down (Nomad's `revokeSITokenAccessorsOnRestore` rule).
    pub fn si_token_is_orphaned(&self, a: &SiTokenAccessor) -> bool {
        let alloc_dead = self.alloc(&a.alloc_id).is_none_or(|al| al.client_status.is_terminal());
        let node_dead = self.node(&a.node_id).is_none_or(|n| n.status == nomad_proto::NodeStatus::Down);
        alloc_dead || node_dead
    }
}

impl Txn<'_> {
    /// Stores accessors, stamped with this write's index.
    pub fn upsert_si_token_accessors(&mut self, accessors: &[SiTokenAccessor]) {
        for a in accessors {
            let mut a = a.clone();
            a.create_index = self.index;
            self.state.si_accessors.insert(a.accessor_id.clone(), Arc::new(a));
            self.touch(Table::SiTokenAccessors);
        }
    }

    /// Removes accessors whose tokens Consul no longer has. Unknown IDs are skipped.
    pub fn delete_si_token_accessors(&mut self, accessor_ids: &[String]) {
        for id in accessor_ids {
            if self.state.si_accessors.remove(id).is_some() {
                self.touch(Table::SiTokenAccessors);
            }
        }
    }

    /// Sets the cluster's metadata unless it is set already (the first write wins, so every
    /// server agrees on one ID whatever leaders raced to set it).
    pub fn set_cluster_metadata(&mut self, meta: &ClusterMetadata) {
        if self.state.cluster.as_ref().is_none_or(|m| m.cluster_id.is_empty()) {
            self.state.cluster = Some(meta.clone());
        }
    }
}
