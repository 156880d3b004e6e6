//! `Node.UpdateEligibility`: operators take a node in or out of scheduling.

use nomad_proto::node::event_subsystem;
use nomad_proto::{NodeEvent, SchedulingEligibility};

use super::node_evals::create_node_evals;
use super::{EndpointError, Endpoints, NodeWriteResponse};
use crate::fsm::Command;

impl Endpoints {
    /// `Node.UpdateEligibility`. No change writes nothing; becoming eligible creates node evals.
    pub async fn node_update_eligibility(&self, node_id: &str, eligibility: &str) -> Result<NodeWriteResponse, EndpointError> {
        let eligibility = match eligibility {
            "eligible" => SchedulingEligibility::Eligible,
            "ineligible" => SchedulingEligibility::Ineligible,
            other => return Err(EndpointError::BadRequest(format!("invalid scheduling eligibility {other:?}"))),
        };
        let snap = self.store.snapshot();
        let node = snap.node(node_id).ok_or_else(|| EndpointError::NotFound("node not found".into()))?.clone();
        if node.drain_strategy.is_some() && eligibility == SchedulingEligibility::Eligible {
            return Err(EndpointError::BadRequest("can not set node's scheduling eligibility to eligible while it is draining".into()));
        }
        if node.scheduling_eligibility == eligibility {
            return Ok(NodeWriteResponse { node_modify_index: node.modify_index, index: snap.index, ..Default::default() });
        }
        let now = self.now();
        let evals =
            if eligibility == SchedulingEligibility::Eligible { create_node_evals(&snap, &node, snap.index + 1, now) } else { Vec::new() };
        let eval_ids: Vec<String> = evals.iter().map(|e| e.id.clone()).collect();
        let message = match eligibility {
            SchedulingEligibility::Eligible => "Node marked as eligible for scheduling",
            SchedulingEligibility::Ineligible => "Node marked as ineligible for scheduling",
        };
        let event =
            NodeEvent { message: message.into(), subsystem: event_subsystem::SCHEDULER.into(), timestamp: now, ..NodeEvent::default() };
        let index = self
            .consensus
            .apply(Command::NodeUpdateEligibility { node_id: node_id.to_string(), eligibility, event: Some(event), evals, now })
            .await?;
        Ok(NodeWriteResponse { node_modify_index: index, eval_create_index: if eval_ids.is_empty() { 0 } else { index }, eval_ids, index })
    }
}
