//! What changed between two states, for leader-only watchers.
//!
//! Tables share structure between versions, so comparing a newer state with
//! an older one visits only the parts a write replaced: the cost follows the
//! number of changes, not the table size. Watchers use this instead of hooks
//! in the FSM, which stays pure.

use std::sync::Arc;

use imbl::ordmap::DiffItem;
use nomad_proto::{Evaluation, Node};

use super::State;

impl State {
    /// Evals added or changed since `older`, in no particular order. Removals are left out.
    pub fn evals_changed_since(&self, older: &State) -> Vec<Arc<Evaluation>> {
        older
            .evals
            .diff(&self.evals)
            .filter_map(|d| match d {
                DiffItem::Add(_, e) => Some(e.clone()),
                DiffItem::Update { new: (_, e), .. } => Some(e.clone()),
                DiffItem::Remove(..) => None,
            })
            .collect()
    }

    /// Nodes added or changed since `older`, each with its previous version. Removals are left out.
    pub fn nodes_changed_since(&self, older: &State) -> Vec<(Option<Arc<Node>>, Arc<Node>)> {
        older
            .nodes
            .diff(&self.nodes)
            .filter_map(|d| match d {
                DiffItem::Add(_, n) => Some((None, n.clone())),
                DiffItem::Update { old: (_, o), new: (_, n) } => Some((Some(o.clone()), n.clone())),
                DiffItem::Remove(..) => None,
            })
            .collect()
    }

    /// Volumes that hold fewer claims than in `older` (a claim was freed), as (namespace, the
    /// volume's modify index). Removed volumes are left out.
    pub fn csi_claims_freed_since(&self, older: &State) -> Vec<(String, u64)> {
        let claims = |v: &nomad_proto::csi::CsiVolume| v.read_claims.len() + v.write_claims.len() + v.past_claims.len();
        older
            .csi_volumes
            .diff(&self.csi_volumes)
            .filter_map(|d| match d {
                DiffItem::Update { old: (_, o), new: (_, n) } if claims(n) < claims(o) => Some((n.namespace.clone(), n.modify_index)),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::EvalStatus;

    use crate::state::StateStore;

    use super::*;

    #[test]
    fn only_added_and_changed_rows_are_reported() {
        let store = StateStore::new();
        let eval = |id: &str, status| Evaluation {
            id: id.into(),
            namespace: "default".into(),
            job_id: "j".into(),
            status,
            ..Evaluation::default()
        };
        store
            .write(1, |tx| {
                tx.upsert_evals((0..500).map(|i| eval(&format!("e{i:03}"), EvalStatus::Pending)).collect());
                tx.upsert_node(Node { id: "n1".into(), ..Node::default() }, nomad_proto::Timestamp::ZERO);
                Ok(())
            })
            .unwrap();
        let before = store.snapshot();
        store
            .write(2, |tx| {
                tx.upsert_evals(vec![eval("e007", EvalStatus::Complete), eval("new", EvalStatus::Blocked)]);
                tx.delete_evals(&["e100".to_string()]);
                tx.upsert_node(Node { id: "n2".into(), ..Node::default() }, nomad_proto::Timestamp::ZERO);
                Ok(())
            })
            .unwrap();
        let after = store.snapshot();
        let mut changed: Vec<_> = after.evals_changed_since(&before).iter().map(|e| (e.id.clone(), e.status)).collect();
        changed.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(changed, vec![("e007".to_string(), EvalStatus::Complete), ("new".to_string(), EvalStatus::Blocked)]);
        let nodes = after.nodes_changed_since(&before);
        assert_eq!(nodes.len(), 1);
        assert!(nodes[0].0.is_none() && nodes[0].1.id == "n2");
        assert!(after.evals_changed_since(&after).is_empty());
    }
}
