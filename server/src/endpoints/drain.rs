//! `Node.UpdateDrain`, `Node.Deregister` (purge) and `Node.Evaluate`.

use std::collections::BTreeMap;

use nomad_proto::node::{DrainStrategy, event_subsystem};
use nomad_proto::{NodeEvent, SchedulingEligibility, Timestamp};
use serde::{Deserialize, Serialize};

use super::node_evals::create_node_evals;
use super::{EndpointError, Endpoints};
use crate::fsm::Command;

/// `DrainSpec` of a drain request.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainSpec {
    /// ns: < 0 force now, 0 no deadline, > 0 force after this long.
    pub deadline: i64,
    /// Leave system allocs running.
    pub ignore_system_jobs: bool,
}

/// Body of `PUT /v1/node/<id>/drain` (`api.NodeUpdateDrainRequest`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct DrainRequest {
    /// Node (defaults to the URL's).
    #[serde(rename = "NodeID")]
    pub node_id: String,
    /// The drain; `null` cancels it.
    pub drain_spec: Option<DrainSpec>,
    /// Make the node eligible when cancelling.
    pub mark_eligible: bool,
    /// Metadata recorded on `LastDrain`.
    pub meta: BTreeMap<String, String>,
}

/// Reply to drain, purge and evaluate (`NodeDrainUpdateResponse` / `NodeUpdateResponse`).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct NodeWriteResponse {
    /// Node modify index.
    pub node_modify_index: u64,
    /// Evals created.
    #[serde(rename = "EvalIDs")]
    pub eval_ids: Vec<String>,
    /// Index of the eval write.
    pub eval_create_index: u64,
    /// Index of the write.
    pub index: u64,
}

impl Endpoints {
    /// Sets, updates or cancels a node's drain.
    pub async fn node_update_drain(&self, node_id: &str, req: DrainRequest) -> Result<NodeWriteResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = snap.node(node_id).ok_or_else(|| EndpointError::NotFound("node not found".into()))?.clone();
        let now = self.now();
        let drain = req.drain_spec.as_ref().map(|spec| DrainStrategy {
            deadline: spec.deadline,
            ignore_system_jobs: spec.ignore_system_jobs,
            force_deadline: match spec.deadline {
                d if d < 0 => now,
                0 => Timestamp::ZERO,
                d => now.add_nanos(d),
            },
            started_at: node.drain_strategy.as_ref().map(|d| d.started_at).unwrap_or(now),
        });
        let message = match (&node.drain_strategy, &drain) {
            (None, Some(_)) => Some("Node drain strategy set"),
            (Some(_), Some(_)) => Some("Node drain strategy updated"),
            (Some(_), None) => Some("Node drain disabled"),
            (None, None) => None,
        };
        let mut meta = req.meta.clone();
        meta.retain(|k, _| !k.is_empty());
        let event = message.map(|m| NodeEvent {
            message: m.into(),
            subsystem: event_subsystem::DRAIN.into(),
            timestamp: now,
            details: meta,
            ..NodeEvent::default()
        });
        let becomes_eligible = drain.is_none() && req.mark_eligible && node.scheduling_eligibility == SchedulingEligibility::Ineligible;
        if event.is_none() && !becomes_eligible {
            return Ok(NodeWriteResponse { node_modify_index: node.modify_index, index: snap.index, ..Default::default() });
        }
        let evals = if becomes_eligible { create_node_evals(&snap, &node, snap.index + 1, now) } else { Vec::new() };
        let eval_ids: Vec<String> = evals.iter().map(|e| e.id.clone()).collect();
        let index = self
            .consensus
            .apply(Command::NodeUpdateDrain { node_id: node_id.to_string(), drain, mark_eligible: req.mark_eligible, event, evals, now })
            .await?;
        Ok(NodeWriteResponse { node_modify_index: index, eval_create_index: if eval_ids.is_empty() { 0 } else { index }, eval_ids, index })
    }

    /// Removes a node (`nomad node purge`); its jobs get evals so their allocs are replaced.
    pub async fn node_deregister(&self, node_id: &str) -> Result<NodeWriteResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = snap.node(node_id).ok_or_else(|| EndpointError::NotFound("node not found".into()))?.clone();
        let evals = create_node_evals(&snap, &node, snap.index + 1, self.now());
        let eval_ids: Vec<String> = evals.iter().map(|e| e.id.clone()).collect();
        let index = self.consensus.apply(Command::NodeDeregister { node_ids: vec![node_id.to_string()], evals }).await?;
        self.heartbeats.remove(node_id);
        Ok(NodeWriteResponse { node_modify_index: index, eval_create_index: if eval_ids.is_empty() { 0 } else { index }, eval_ids, index })
    }

    /// Creates node evals on demand (`nomad node eval`).
    pub async fn node_evaluate(&self, node_id: &str) -> Result<NodeWriteResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = snap.node(node_id).ok_or_else(|| EndpointError::NotFound("node not found".into()))?.clone();
        let evals = create_node_evals(&snap, &node, node.modify_index, self.now());
        if evals.is_empty() {
            return Ok(NodeWriteResponse { node_modify_index: node.modify_index, index: snap.index, ..Default::default() });
        }
        let eval_ids: Vec<String> = evals.iter().map(|e| e.id.clone()).collect();
        let index = self.consensus.apply(Command::EvalUpsert { evals }).await?;
        Ok(NodeWriteResponse { node_modify_index: node.modify_index, eval_ids, eval_create_index: index, index })
    }
}
