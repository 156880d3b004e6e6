//! The plan under construction and the cluster as it would look once applied.
//!
//! Placement decisions read node usage "as proposed": the snapshot's allocs
//! minus those the plan stops, plus those it places. Usage is computed
//! lazily per node and dropped whenever the plan touches that node, so one
//! eval never over-commits a node. Changes to the job's allocs are also
//! journaled so distinct-property and spread counts follow the plan
//! incrementally instead of rescanning it for every placement.

use std::sync::Arc;

use nomad_proto::alloc::ALLOC_LOST_DESC;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Node, Plan};

use super::fast_hash::{FastMap, FastSet};
use super::usage::NodeUsage;
use crate::state::{AllocHold, State};

/// One change in where the eval's job has allocs.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) node_id: String,
    pub(crate) group: String,
    /// +1: an alloc now counts there; -1: it no longer does.
    pub(crate) delta: i64,
}

/// The plan being built plus the derived per-node view.
pub(crate) struct Proposed<'a> {
    state: &'a State,
    job_id: String,
    namespace: String,
    groups: Vec<String>,
    plan: Plan,
    /// Stopped alloc ID → whether its stop was journaled.
    stopped: FastMap<String, bool>,
    /// IDs of existing allocs rewritten by the plan (in place, unknown, reconnect).
    upserted: FastSet<String>,
    journal: Vec<Change>,
    /// Keyed by the node's address in the snapshot (stable for its lifetime):
    /// cheaper than hashing and comparing node IDs on every visit.
    usage: FastMap<usize, NodeUsage>,
    /// The job's unfinished allocs in the snapshot by node, built on first use.
    job_allocs_by_node: Option<FastMap<&'a str, Vec<&'a Allocation>>>,
}

impl<'a> Proposed<'a> {
    /// An empty plan for the job `namespace/job_id` whose current groups are `groups`.
    pub(crate) fn new(state: &'a State, plan: Plan, namespace: &str, job_id: &str, groups: Vec<String>) -> Proposed<'a> {
        Proposed {
            state,
            job_id: job_id.to_string(),
            namespace: namespace.to_string(),
            groups,
            plan,
            stopped: FastMap::default(),
            upserted: FastSet::default(),
            journal: Vec::new(),
            usage: FastMap::default(),
            job_allocs_by_node: None,
        }
    }

    pub(crate) fn state(&self) -> &'a State {
        self.state
    }

    pub(crate) fn into_plan(self) -> Plan {
        self.plan
    }

    /// Changes to the job's allocs, in order.
    pub(crate) fn journal(&self) -> &[Change] {
        &self.journal
    }

    fn is_job_alloc(&self, a: &Allocation) -> bool {
        a.job_id == self.job_id && a.namespace == self.namespace
    }

    /// Stops `alloc` (Nomad's `AppendStoppedAlloc`). The plan carries only the
    /// fields the applier reads. A second stop of the same alloc replaces the first.
    pub(crate) fn append_stop(
        &mut self,
        alloc: &Allocation,
        description: &str,
        client_status: Option<ClientStatus>,
        followup_eval_id: &str,
    ) {
        let status = client_status.unwrap_or(alloc.client_status);
        let stop = Allocation {
            id: alloc.id.clone(),
            namespace: alloc.namespace.clone(),
            eval_id: alloc.eval_id.clone(),
            name: alloc.name.clone(),
            node_id: alloc.node_id.clone(),
            node_name: alloc.node_name.clone(),
            job_id: alloc.job_id.clone(),
            task_group: alloc.task_group.clone(),
            desired_status: DesiredStatus::Stop,
            desired_description: description.to_string(),
            client_status: status,
            client_description: if status == ClientStatus::Lost { ALLOC_LOST_DESC.to_string() } else { alloc.client_description.clone() },
            followup_eval_id: followup_eval_id.to_string(),
            create_index: alloc.create_index,
            modify_index: alloc.modify_index,
            ..Allocation::default()
        };
        let entries = self.plan.node_update.entry(alloc.node_id.clone()).or_insert_with(|| Vec::with_capacity(1));
        if let Some(existing) = entries.iter_mut().find(|a| a.id == alloc.id) {
            *existing = stop;
            return;
        }
        entries.push(stop);
        // Property counts consider live (non-terminal) allocs of the job.
        let counted = !alloc.terminal() && self.is_job_alloc(alloc);
        self.stopped.insert(alloc.id.clone(), counted);
        if counted {
            self.journal.push(Change { node_id: alloc.node_id.clone(), group: alloc.task_group.clone(), delta: -1 });
        }
        self.invalidate(&alloc.node_id);
    }

    /// Takes back a stop (the replacement it made room for did not fit).
    pub(crate) fn pop_stop(&mut self, alloc: &Allocation) {
        let Some(entries) = self.plan.node_update.get_mut(&alloc.node_id) else { return };
        let Some(pos) = entries.iter().position(|a| a.id == alloc.id) else { return };
        entries.remove(pos);
        if entries.is_empty() {
            self.plan.node_update.remove(&alloc.node_id);
        }
        if self.stopped.remove(&alloc.id) == Some(true) {
            self.journal.push(Change { node_id: alloc.node_id.clone(), group: alloc.task_group.clone(), delta: 1 });
        }
        self.invalidate(&alloc.node_id);
    }

    /// Adds a placement or a rewrite of an existing alloc (Nomad's `AppendAlloc`).
    pub(crate) fn append_alloc(&mut self, alloc: Allocation) {
        let existing = self.state.alloc(&alloc.id).is_some();
        if existing {
            self.upserted.insert(alloc.id.clone());
        } else if self.is_job_alloc(&alloc) {
            self.journal.push(Change { node_id: alloc.node_id.clone(), group: alloc.task_group.clone(), delta: 1 });
        }
        self.invalidate(&alloc.node_id);
        // Most nodes get one alloc per plan; allocs are large, so start small.
        let entries = self.plan.node_allocation.entry(alloc.node_id.clone()).or_insert_with(|| Vec::with_capacity(1));
        match entries.iter_mut().find(|a| a.id == alloc.id) {
            Some(e) => *e = alloc,
            None => entries.push(alloc),
        }
    }

    fn invalidate(&mut self, node_id: &str) {
        if let Some(n) = self.state.node(node_id) {
            self.usage.remove(&(Arc::as_ptr(n) as usize));
        }
    }

    /// What the node holds once the plan is applied. `node` must come from
    /// the snapshot this plan is built on.
    pub(crate) fn usage(&mut self, node: &Node) -> &NodeUsage {
        let key = node as *const Node as usize;
        if !self.usage.contains_key(&key) {
            let u = self.compute_usage(node);
            return self.usage.entry(key).or_insert(u);
        }
        &self.usage[&key]
    }

    /// The node's allocs as the plan leaves them: the node's summed load in the snapshot,
    /// minus the allocs the plan stops or rewrites there, plus what it places; and how many of
    /// them are the job's. Only the plan's entries for the node and the job's own allocs are
    /// walked, not every alloc on the node.
    fn compute_usage(&mut self, node: &Node) -> NodeUsage {
        let state = self.state;
        let mut load = state.node_load(&node.id).map(|l| l.placed.clone()).unwrap_or_default();
        let replaced = |a: &Allocation| self.stopped.contains_key(&a.id) || self.upserted.contains(&a.id);
        let planned = self.plan.node_update.get(&node.id).into_iter().chain(self.plan.node_allocation.get(&node.id)).flatten();
        let mut seen: Vec<&str> = Vec::new();
        for entry in planned {
            if let Some(stored) = state.alloc(&entry.id)
                && stored.node_id == node.id
                && !stored.client_terminal()
                && replaced(stored)
                && !seen.contains(&stored.id.as_str())
            {
                seen.push(&stored.id);
                load.remove(&AllocHold::of(stored));
            }
        }
        let mut job_allocs = 0;
        let mut group_allocs = vec![0u32; self.groups.len()];
        let mut count = |a: &Allocation| {
            job_allocs += 1;
            if let Some(g) = self.groups.iter().position(|g| *g == a.task_group) {
                group_allocs[g] += 1;
            }
        };
        let by_node = self.job_allocs_by_node.get_or_insert_with(|| {
            let mut m: FastMap<&'a str, Vec<&'a Allocation>> = FastMap::default();
            for a in state.allocs_by_job(&self.namespace, &self.job_id).filter(|a| !a.client_terminal()) {
                m.entry(a.node_id.as_str()).or_default().push(a);
            }
            m
        });
        for a in by_node.get(node.id.as_str()).into_iter().flatten() {
            if !replaced(a) {
                count(a);
            }
        }
        for a in self.plan.node_allocation.get(&node.id).into_iter().flatten() {
            if !a.client_terminal() {
                load.add(&AllocHold::of(a));
                if self.is_job_alloc(a) {
                    count(a);
                }
            }
        }
        let mut u = NodeUsage::from_load(node, &load, self.groups.len());
        u.job_allocs = job_allocs;
        u.group_allocs = group_allocs;
        #[cfg(test)]
        self.check_against_walk(node, &u);
        u
    }

    /// Tests: the usage equals a walk over every alloc on the node.
    #[cfg(test)]
    fn check_against_walk(&self, node: &Node, u: &NodeUsage) {
        let mut load = crate::state::Load::default();
        let (mut job_allocs, mut group_allocs) = (0, vec![0u32; self.groups.len()]);
        let stored = self.state.allocs_by_node(&node.id).map(|a| a.as_ref());
        let stored = stored.filter(|a| !a.client_terminal() && !self.stopped.contains_key(&a.id) && !self.upserted.contains(&a.id));
        let planned = self.plan.node_allocation.get(&node.id).into_iter().flatten().filter(|a| !a.client_terminal());
        for a in stored.chain(planned) {
            load.add(&AllocHold::of(a));
            if self.is_job_alloc(a) {
                job_allocs += 1;
                if let Some(g) = self.groups.iter().position(|g| *g == a.task_group) {
                    group_allocs[g] += 1;
                }
            }
        }
        let walked = NodeUsage::from_load(node, &load, self.groups.len());
        assert_eq!((u.cpu, u.memory, u.disk, &u.cores), (walked.cpu, walked.memory, walked.disk, &walked.cores), "node {}", node.id);
        assert_eq!((u.ports.used(), u.collision), (walked.ports.used(), walked.collision), "node {}", node.id);
        assert_eq!((u.job_allocs, &u.group_allocs), (job_allocs, &group_allocs), "node {}", node.id);
    }
}
