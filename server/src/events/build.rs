//! Building a batch from what a command wrote.

use nomad_proto::ApiNode;

use super::{Event, EventBatch, topic};
use crate::fsm::Command;
use crate::state::Change;

/// The event type Nomad gives every change of a command.
fn event_type(cmd: &Command) -> Option<&'static str> {
    Some(match cmd {
        Command::NodeRegister { .. } => "NodeRegistration",
        Command::NodeUpdateStatus { .. } => "NodeStreamEvent",
        Command::NodeDeregister { .. } => "NodeDeregistration",
        Command::NodeUpdateEligibility { .. } | Command::NodeUpdateDrain { .. } | Command::NodeDrainComplete { .. } => "NodeDrain",
        // A scale with a count registers the job again (the scaling event itself is not
        // published, as in Nomad).
        Command::JobRegister { .. } | Command::PeriodicLaunch { .. } | Command::JobScale { .. } => "JobRegistered",
        Command::JobDeregister { .. } => "JobDeregistered",
        Command::EvalUpsert { .. } => "EvaluationUpdated",
        Command::AllocClientUpdate { .. } => "AllocationUpdated",
        Command::AllocDesiredTransition { .. } => "AllocationUpdateDesiredStatus",
        Command::PlanApply(_) | Command::PlanApplyBatch(_) => "PlanResult",
        Command::ServiceRegistrationUpsert { .. } => "ServiceRegistration",
        Command::ServiceRegistrationDeleteByAlloc { .. } | Command::ServiceRegistrationDeleteById { .. } => "ServiceDeregistration",
        // The CSI topics (later Nomad's, not 1.6's): every claim change, from the first claim
        // through each release checkpoint to the reaping of past claims, is a `CSIVolumeClaim`.
        Command::CsiVolumeRegister { .. } => "CSIVolumeRegistered",
        Command::CsiVolumeDeregister { .. } => "CSIVolumeDeregistered",
        Command::CsiVolumeClaim { .. } => "CSIVolumeClaim",
        // The type is decided per change below (upserted or deleted).
        Command::VariableApply { .. } => "VariableUpserted",
        Command::DeploymentStatusUpdate { .. } => "DeploymentStatusUpdate",
        Command::DeploymentAllocHealth { .. } => "DeploymentAllocHealth",
        Command::DeploymentPromotion { .. } => "DeploymentPromotion",
        // Garbage collection and namespace changes emit nothing, as in Nomad.
        Command::EvalDelete { .. }
        | Command::DeploymentDelete { .. }
        | Command::NamespaceUpsert { .. }
        | Command::NamespaceDelete { .. }
        // Nor SI token bookkeeping or the cluster's metadata (no such topics in Nomad).
        | Command::SiTokenAccessorsRegister { .. }
        | Command::SiTokenAccessorsDeregister { .. }
        | Command::ClusterMetadata { .. }
        // ACL changes carry secrets; the ACL topics are not published (yet).
        | Command::AclPolicyUpsert { .. }
        | Command::AclPolicyDelete { .. }
        | Command::AclTokenUpsert { .. }
        | Command::AclTokenDelete { .. }
        | Command::AclTokenBootstrap { .. }
        | Command::AclRoleUpsert { .. }
        | Command::AclRoleDelete { .. }
        // Key material, even wrapped, stays off the stream.
        | Command::RootKeyUpsert { .. }
        | Command::RootKeySetState { .. }
        | Command::RootKeyDelete { .. }
        // Nor stability marks (Nomad's `JobStabilityRequestType` has no events), nor
        // recomputed summaries (no summary topic).
        | Command::JobStability { .. }
        | Command::ReconcileJobSummaries
        // No operator topic in Nomad's stream.
        | Command::SchedulerSetConfig { .. }
        // A restore replaces everything; subscribers see the new indexes on their next query.
        | Command::SnapshotRestore { .. } => return None,
    })
}

/// The batch for one applied command, or `None` when it emits nothing.
pub fn batch_for(index: u64, cmd: &Command, changes: &[Change]) -> Option<EventBatch> {
    let ty = event_type(cmd)?;
    let events: Vec<Event> = changes
        .iter()
        .map(|c| {
            let (topic, key, namespace, filter_keys, payload) = match c {
                Change::Job(j) => (topic::JOB, j.id.clone(), j.namespace.clone(), vec![], serde_json::json!({ "Job": j })),
                Change::Eval(e) => (
                    topic::EVALUATION,
                    e.id.clone(),
                    e.namespace.clone(),
                    vec![e.job_id.clone(), e.deployment_id.clone()],
                    serde_json::json!({ "Evaluation": e }),
                ),
                Change::Alloc(a) => {
                    // Nomad leaves the job out of alloc payloads.
                    let mut slim = (**a).clone();
                    slim.job = None;
                    (
                        topic::ALLOCATION,
                        a.id.clone(),
                        a.namespace.clone(),
                        vec![a.job_id.clone(), a.deployment_id.clone()],
                        serde_json::json!({ "Allocation": slim }),
                    )
                }
                Change::Node(n) | Change::NodeDeleted(n) => {
                    (topic::NODE, n.id.clone(), String::new(), vec![], serde_json::json!({ "Node": ApiNode::from(&**n) }))
                }
                Change::Service(r) | Change::ServiceDeleted(r) => (
                    topic::SERVICE,
                    r.id.clone(),
                    r.namespace.clone(),
                    vec![r.job_id.clone(), r.service_name.clone()],
                    serde_json::json!({ "Service": r }),
                ),
                // As `GET /v1/volume/csi/:id` shows it: never its secrets, claims or mount flags.
                Change::CsiVolume(v) | Change::CsiVolumeDeleted(v) => (
                    topic::CSI_VOLUME,
                    v.volume.id.clone(),
                    v.volume.namespace.clone(),
                    vec![],
                    serde_json::json!({ "CSIVolume": v.volume.to_api_value(&v.allocations) }),
                ),
                // Plugins are global; their alloc stubs are namespaced, so none are shown.
                Change::CsiPlugin(p) | Change::CsiPluginDeleted(p) => {
                    (topic::CSI_PLUGIN, p.id.clone(), String::new(), vec![], serde_json::json!({ "CSIPlugin": p }))
                }
                // Metadata only: the items never leave the servers this way.
                Change::Variable(v) | Change::VariableDeleted(v) => {
                    (topic::VARIABLES, v.path.clone(), v.namespace.clone(), vec![], serde_json::json!({ "Variable": v }))
                }
                Change::Deployment(d) => {
                    (topic::DEPLOYMENT, d.id.clone(), d.namespace.clone(), vec![d.job_id.clone()], serde_json::json!({ "Deployment": d }))
                }
            };
            // Service changes keep their own type whatever command made them (node down, alloc finished).
            let ty = match c {
                Change::Service(_) => "ServiceRegistration",
                Change::ServiceDeleted(_) => "ServiceDeregistration",
                Change::VariableDeleted(_) => "VariableDeleted",
                _ => ty,
            };
            Event { topic: topic.to_string(), event_type: ty.to_string(), key, namespace, filter_keys, index, payload }
        })
        .collect();
    (!events.is_empty()).then_some(EventBatch { index, events })
}
