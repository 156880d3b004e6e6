//! The nodes table.

use std::sync::Arc;

use nomad_proto::node::{DrainStrategy, event_subsystem};
use nomad_proto::{Node, NodeEvent, NodeStatus, SchedulingEligibility, Timestamp};

use super::{State, Table, Txn, TxnError, Watch};

impl State {
    /// One node.
    pub fn node(&self, id: &str) -> Option<&Arc<Node>> {
        self.nodes.get(id)
    }

    /// Every node, ordered by ID.
    pub fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.values()
    }

    /// Nodes whose ID starts with `prefix`.
    pub fn nodes_by_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Arc<Node>> + 'a {
        self.nodes.range(prefix.to_string()..).map(|(_, n)| n).take_while(move |n| n.id.starts_with(prefix))
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

fn event(message: &str, subsystem: &str, now: Timestamp, index: u64) -> NodeEvent {
    NodeEvent {
        message: message.to_string(),
        subsystem: subsystem.to_string(),
        timestamp: now,
        create_index: index,
        ..NodeEvent::default()
    }
}

impl Txn<'_> {
    /// Inserts or updates a node (`Node.Register`). For a known node the
    /// stored status, eligibility, drain, last drain and events are kept, and
    /// the reconnect indexes never go backwards.
    pub fn upsert_node(&mut self, mut node: Node, now: Timestamp) -> Arc<Node> {
        let index = self.index;
        match self.state.nodes.get(&node.id) {
            Some(existing) => {
                node.create_index = existing.create_index;
                node.status = existing.status;
                node.scheduling_eligibility = existing.scheduling_eligibility;
                node.drain_strategy = existing.drain_strategy.clone();
                node.last_drain = existing.last_drain.clone();
                node.events = existing.events.clone();
                node.last_missed_heartbeat_index = node.last_missed_heartbeat_index.max(existing.last_missed_heartbeat_index);
                node.last_alloc_update_index = node.last_alloc_update_index.max(existing.last_alloc_update_index);
                if existing.status == NodeStatus::Down && node.status != NodeStatus::Down {
                    node.append_events([event("Node re-registered", event_subsystem::CLUSTER, now, index)]);
                }
            }
            None => {
                node.create_index = index;
                node.events = vec![event("Node registered", event_subsystem::CLUSTER, now, index)];
            }
        }
        node.modify_index = index;
        node.compute_class();
        let node = Arc::new(node);
        self.state.nodes.insert(node.id.clone(), node.clone());
        self.touch(Table::Nodes);
        self.touch_key(Watch::Node(node.id.clone()));
        self.record(super::Change::Node(node.clone()));
        self.upsert_csi_plugins_for_node(&node);
        node
    }

    /// Changes a stored node with `f`, records `event`, stamps the index and
    /// stores the result: the one path every node update takes.
    fn modify_node(
        &mut self,
        node_id: &str,
        event: Option<NodeEvent>,
        f: impl FnOnce(&mut Node) -> Result<(), TxnError>,
    ) -> Result<Arc<Node>, TxnError> {
        let index = self.index;
        let existing = self.state.nodes.get(node_id).ok_or_else(|| TxnError(format!("node not found: {node_id}")))?;
        let mut node = (**existing).clone();
        f(&mut node)?;
        if let Some(mut e) = event {
            e.create_index = index;
            node.append_events([e]);
        }
        node.modify_index = index;
        let node = Arc::new(node);
        self.state.nodes.insert(node.id.clone(), node.clone());
        self.touch(Table::Nodes);
        self.touch_key(Watch::Node(node.id.clone()));
        self.record(super::Change::Node(node.clone()));
        Ok(node)
    }

    /// Sets a node's status, recording the event. `LastMissedHeartbeatIndex`
    /// becomes this index when the node turns unresponsive and 0 when it
    /// turns ready.
    pub fn update_node_status(
        &mut self,
        node_id: &str,
        status: NodeStatus,
        event: Option<NodeEvent>,
        updated_at: i64,
    ) -> Result<Arc<Node>, TxnError> {
        let index = self.index;
        self.modify_node(node_id, event, |node| {
            if !node.status.is_unresponsive() && status.is_unresponsive() {
                node.last_missed_heartbeat_index = index;
            } else if status == NodeStatus::Ready && node.status != NodeStatus::Ready {
                node.last_missed_heartbeat_index = 0;
            }
            node.status = status;
            node.status_updated_at = updated_at;
            Ok(())
        })
    }

    /// Sets a node's eligibility.
    pub fn update_node_eligibility(
        &mut self,
        node_id: &str,
        eligibility: SchedulingEligibility,
        event: Option<NodeEvent>,
    ) -> Result<Arc<Node>, TxnError> {
        self.modify_node(node_id, event, |node| {
            if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
                return Err(TxnError("can not set node's scheduling eligibility to eligible while it is draining".into()));
            }
            node.scheduling_eligibility = eligibility;
            Ok(())
        })
    }

    /// Sets or clears a node's drain. A drain makes the node ineligible;
    /// clearing it makes it eligible only with `mark_eligible`.
    pub fn update_node_drain(
        &mut self,
        node_id: &str,
        drain: Option<DrainStrategy>,
        mark_eligible: bool,
        event: Option<NodeEvent>,
        now: Timestamp,
    ) -> Result<Arc<Node>, TxnError> {
        self.modify_node(node_id, event, |node| {
            match &drain {
                Some(_) => {
                    node.scheduling_eligibility = SchedulingEligibility::Ineligible;
                    let started = node.last_drain.as_ref().filter(|d| d.status == "draining").map(|d| d.started_at).unwrap_or(now);
                    node.last_drain = Some(nomad_proto::node::DrainMetadata {
                        started_at: started,
                        updated_at: now,
                        status: "draining".into(),
                        ..node.last_drain.clone().unwrap_or_default()
                    });
                }
                None => {
                    if mark_eligible {
                        node.scheduling_eligibility = SchedulingEligibility::Eligible;
                    }
                    let was_draining = node.drain_strategy.is_some();
                    if let Some(ld) = node.last_drain.as_mut().filter(|ld| ld.status == "draining" && was_draining) {
                        ld.status = "canceled".into();
                        ld.updated_at = now;
                    }
                }
            }
            node.drain_strategy = drain;
            Ok(())
        })
    }

    /// Ends a node's drain (the drainer found nothing left to move): the
    /// strategy is cleared, eligibility is left as it is (ineligible), and
    /// `LastDrain` becomes `complete`. A node that is gone or no longer
    /// draining (the operator cancelled it meanwhile) is left alone.
    pub fn complete_node_drain(&mut self, node_id: &str, mut event: NodeEvent, now: Timestamp) -> Option<Arc<Node>> {
        let index = self.index;
        let existing = self.state.nodes.get(node_id).filter(|n| n.drain_strategy.is_some())?;
        let mut node = (**existing).clone();
        node.drain_strategy = None;
        let mut last = node.last_drain.take().unwrap_or_default();
        last.status = "complete".into();
        last.updated_at = now;
        node.last_drain = Some(last);
        event.create_index = index;
        node.append_events([event]);
        node.modify_index = index;
        let node = Arc::new(node);
        self.state.nodes.insert(node.id.clone(), node.clone());
        self.touch(Table::Nodes);
        self.touch_key(Watch::Node(node.id.clone()));
        self.record(super::Change::Node(node.clone()));
        Some(node)
    }

    /// Removes a node.
    pub fn delete_node(&mut self, node_id: &str) -> Result<(), TxnError> {
        let Some(node) = self.state.nodes.remove(node_id) else {
            return Err(TxnError(format!("node not found: {node_id}")));
        };
        self.touch(Table::Nodes);
        self.touch_key(Watch::Node(node.id.clone()));
        self.delete_node_csi_plugins(&node.id);
        self.record(super::Change::NodeDeleted(node));
        Ok(())
    }

    /// Records that a node's client alloc update landed at this index.
    pub(super) fn mark_alloc_update(&mut self, node_id: &str) {
        let index = self.index;
        if let Some(existing) = self.state.nodes.get(node_id) {
            let mut node = (**existing).clone();
            node.last_alloc_update_index = index;
            // The table index moves (as in Nomad) but not the node's ModifyIndex: nothing users set changed.
            self.state.nodes.insert(node.id.clone(), Arc::new(node));
            self.touch(Table::Nodes);
            self.touch_key(Watch::Node(node_id.to_string()));
        }
    }
}
