//! The release of a claim (`CSIVolume.Unpublish`), as decisions without I/O.
//!
//! ```text
//!  taken ─(alloc done)─▶ unpublishing ─node detach─▶ node-detached ─controller detach─▶
//!        controller-detached ─release─▶ ready-to-free (the claim is removed from the volume)
//! ```
//!
//! Every arrow is checkpointed through Raft (the claim, with its new state, is applied as a
//! release and kept in `PastClaims`) before the next one is tried, so a failure anywhere leaves
//! the last state reached in the volume and whoever resends the stored claim (the client, the
//! volume watcher, the claim GC, `volume detach`) resumes at [`next_step`] of that state.

use nomad_proto::csi::{CsiPlugin, CsiVolume, CsiVolumeAccessMode, CsiVolumeClaim, CsiVolumeClaimState};
use nomad_proto::{Allocation, Node, NodeStatus};

/// One step of the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnpublishStep {
    /// Unpublish (and unstage) on the claim's node, through its node plugin.
    NodeDetach,
    /// Unpublish through a controller plugin.
    ControllerDetach,
    /// Free the claim (checkpoint `ready-to-free`).
    Release,
}

/// The step a claim in `state` runs next (Nomad's jump at the top of `Unpublish`): a claim
/// still `taken` or `unpublishing` starts at the node, `node-detached` goes on at the
/// controller, `controller-detached` and `ready-to-free` only need the release written.
pub fn next_step(state: CsiVolumeClaimState) -> UnpublishStep {
    match state {
        CsiVolumeClaimState::Taken | CsiVolumeClaimState::Unpublishing => UnpublishStep::NodeDetach,
        CsiVolumeClaimState::NodeDetached => UnpublishStep::ControllerDetach,
        CsiVolumeClaimState::ControllerDetached | CsiVolumeClaimState::ReadyToFree => UnpublishStep::Release,
    }
}

/// The state to checkpoint once `step` succeeded.
pub fn state_after(step: UnpublishStep) -> CsiVolumeClaimState {
    match step {
        UnpublishStep::NodeDetach => CsiVolumeClaimState::NodeDetached,
        UnpublishStep::ControllerDetach => CsiVolumeClaimState::ControllerDetached,
        UnpublishStep::Release => CsiVolumeClaimState::ReadyToFree,
    }
}

/// What the node step does (`nodeUnpublishVolume`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeDetachPlan {
    /// The claim's node is gone or down: nothing can be asked of it; the step counts as done.
    NodeGone,
    /// Ask the node to detach these claims (possibly none: a claim without an access mode was
    /// never mounted), then checkpoint `node-detached` if every one succeeded.
    Detach(Vec<CsiVolumeClaim>),
}

/// Decides the node step. `node` is the claim's node as the state has it. A claim with an
/// alloc detaches that alloc's mount; one without (`volume detach`, GC) detaches every past
/// claim on its node.
pub fn plan_node_detach(vol: &CsiVolume, claim: &CsiVolumeClaim, node: Option<&Node>) -> NodeDetachPlan {
    if !claim.node_id.is_empty() && node.is_none_or(|n| n.status == NodeStatus::Down) {
        return NodeDetachPlan::NodeGone;
    }
    let mounted = |c: &&CsiVolumeClaim| c.access_mode != CsiVolumeAccessMode::Unknown;
    if !claim.allocation_id.is_empty() {
        return NodeDetachPlan::Detach(std::iter::once(claim).filter(mounted).cloned().collect());
    }
    NodeDetachPlan::Detach(vol.past_claims.values().filter(|c| c.node_id == claim.node_id).filter(mounted).cloned().collect())
}

/// What the controller step does (`controllerUnpublishVolume`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerDetachPlan {
    /// The volume needs no controller, or its controller cannot attach and detach.
    NotNeeded,
    /// Another live alloc on the same node still holds a claim: the volume stays attached to
    /// the node, and this claim is released without a controller call.
    StillUsedOnNode {
        /// That alloc.
        alloc_id: String,
    },
    /// Ask a controller to unpublish the volume from this node.
    Detach {
        /// The provider's ID of the node.
        external_node_id: String,
    },
}

/// Decides the controller step. `vol` is denormalized (plugin health and past claims);
/// `alloc` looks allocs up in the state; `node` is the claim's node.
pub fn plan_controller_detach<'a>(
    vol: &CsiVolume,
    plugin: Option<&CsiPlugin>,
    claim: &CsiVolumeClaim,
    alloc: impl Fn(&str) -> Option<&'a Allocation>,
    node: Option<&Node>,
) -> Result<ControllerDetachPlan, String> {
    if !vol.controller_required {
        return Ok(ControllerDetachPlan::NotNeeded);
    }
    let plugin = plugin.ok_or_else(|| format!("no such plugin: {:?}", vol.plugin_id))?;
    if !plugin.supports_attach_detach() {
        return Ok(ControllerDetachPlan::NotNeeded);
    }
    for id in vol.read_allocs.iter().chain(&vol.write_allocs) {
        if let Some(a) = alloc(id)
            && a.id != claim.allocation_id
            && a.node_id == claim.node_id
            && !a.terminal()
        {
            return Ok(ControllerDetachPlan::StillUsedOnNode { alloc_id: a.id.clone() });
        }
    }
    let external_node_id = if claim.external_node_id.is_empty() {
        lookup_external_node_id(vol, claim, node).map_err(|e| format!("missing external node ID: {e}"))?
    } else {
        claim.external_node_id.clone()
    };
    Ok(ControllerDetachPlan::Detach { external_node_id })
}

/// The provider's ID of the claim's node (`lookupExternalNodeID`): from any claim on that node
/// that recorded it (read, then write, then past claims), else from the node's fingerprint of
/// the volume's node plugin.
pub fn lookup_external_node_id(vol: &CsiVolume, claim: &CsiVolumeClaim, node: Option<&Node>) -> Result<String, String> {
    let recorded = vol
        .read_claims
        .values()
        .chain(vol.write_claims.values())
        .chain(vol.past_claims.values())
        .find(|c| c.node_id == claim.node_id && !c.external_node_id.is_empty());
    if let Some(c) = recorded {
        return Ok(c.external_node_id.clone());
    }
    let node = node.ok_or_else(|| format!("Unknown node: {}", claim.node_id))?;
    node.csi_node_plugins.get(&vol.plugin_id).and_then(|i| i.node_info.as_ref()).map(|n| n.id.clone()).ok_or_else(|| {
        format!(
            "failed to find storage provider info for client {:?}, node plugin {:?} is not running or has not fingerprinted on this client",
            node.id, vol.plugin_id
        )
    })
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiVolumeAttachmentMode, CsiVolumeClaimMode};
    use nomad_proto::{ClientStatus, DesiredStatus};

    use super::*;
    use crate::csi::claim::claim as apply_claim;

    const ALL_STATES: [CsiVolumeClaimState; 5] = [
        CsiVolumeClaimState::Taken,
        CsiVolumeClaimState::Unpublishing,
        CsiVolumeClaimState::NodeDetached,
        CsiVolumeClaimState::ControllerDetached,
        CsiVolumeClaimState::ReadyToFree,
    ];

    fn claimed_volume() -> CsiVolume {
        let mut vol = CsiVolume {
            id: "vol".into(),
            namespace: "default".into(),
            plugin_id: "p".into(),
            schedulable: true,
            controller_required: true,
            requested_capabilities: vec![nomad_proto::csi::CsiVolumeCapability {
                access_mode: CsiVolumeAccessMode::SingleNodeWriter,
                attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            }],
            ..CsiVolume::default()
        };
        apply_claim(&mut vol, taken_claim(), true).unwrap();
        vol
    }

    fn taken_claim() -> CsiVolumeClaim {
        CsiVolumeClaim {
            allocation_id: "a1".into(),
            node_id: "n1".into(),
            mode: CsiVolumeClaimMode::Write,
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            ..CsiVolumeClaim::default()
        }
    }

    /// Runs the release of `a1` the way the endpoint does: checkpoint the claim as received,
    /// then each step from [`next_step`], checkpointing after each; `fail_at` makes one step
    /// fail once (the run stops there, like an RPC error). Returns the steps that ran.
    fn run(vol: &mut CsiVolume, mut claim: CsiVolumeClaim, fail_at: Option<UnpublishStep>) -> Result<Vec<UnpublishStep>, UnpublishStep> {
        let mut ran = Vec::new();
        apply_claim(vol, claim.clone(), false).unwrap();
        let mut step = next_step(claim.state);
        loop {
            if fail_at == Some(step) {
                return Err(step);
            }
            ran.push(step);
            claim.state = state_after(step);
            apply_claim(vol, claim.clone(), false).unwrap();
            if step == UnpublishStep::Release {
                return Ok(ran);
            }
            step = next_step(claim.state);
        }
    }

    #[test]
    fn each_state_resumes_at_its_step() {
        use UnpublishStep::*;
        let want = [
            (CsiVolumeClaimState::Taken, vec![NodeDetach, ControllerDetach, Release]),
            (CsiVolumeClaimState::Unpublishing, vec![NodeDetach, ControllerDetach, Release]),
            (CsiVolumeClaimState::NodeDetached, vec![ControllerDetach, Release]),
            (CsiVolumeClaimState::ControllerDetached, vec![Release]),
            (CsiVolumeClaimState::ReadyToFree, vec![Release]),
        ];
        for (state, steps) in want {
            let mut vol = claimed_volume();
            // A claim arriving in `taken` state is the client's own unpublish request.
            let c = CsiVolumeClaim { state, ..taken_claim() };
            assert_eq!(run(&mut vol, c, None), Ok(steps), "from {}", state.name());
            assert!(!vol.in_use() && vol.past_claims.is_empty(), "from {}: the claim is freed", state.name());
        }
    }

    #[test]
    fn a_failure_at_any_step_leaves_a_checkpoint_that_resumes_there() {
        for start in ALL_STATES {
            for fail in [UnpublishStep::NodeDetach, UnpublishStep::ControllerDetach, UnpublishStep::Release] {
                let mut vol = claimed_volume();
                let c = CsiVolumeClaim { state: start, ..taken_claim() };
                match run(&mut vol, c, Some(fail)) {
                    Ok(_) => assert!(!vol.in_use(), "{} / {fail:?}: the failing step was never reached", start.name()),
                    // A claim sent as `ready-to-free` frees the volume in its first checkpoint,
                    // before any step could fail.
                    Err(_) if start == CsiVolumeClaimState::ReadyToFree => assert!(!vol.in_use() && vol.past_claims.is_empty()),
                    Err(at) => {
                        // Still claimed, with the last state reached kept as the checkpoint.
                        assert!(vol.write_allocs.contains("a1"), "{} / {fail:?}", start.name());
                        // A claim sent as `taken` is no checkpoint; for a finished alloc the
                        // volume's denormalization makes the `unpublishing` past claim instead.
                        let stored = vol.past_claims.get("a1").cloned().unwrap_or_else(|| {
                            assert_eq!((start, at), (CsiVolumeClaimState::Taken, UnpublishStep::NodeDetach));
                            CsiVolumeClaim { state: CsiVolumeClaimState::Unpublishing, ..taken_claim() }
                        });
                        assert_eq!(next_step(stored.state), at, "{} / {fail:?}: resumes at the failed step", start.name());
                        // The retry (watcher, GC, client) sends the stored claim and finishes.
                        let rest = run(&mut vol, stored, None).unwrap();
                        assert_eq!(rest[0], at);
                        assert!(!vol.in_use() && vol.past_claims.is_empty(), "{} / {fail:?}", start.name());
                    }
                }
            }
        }
    }

    fn node(id: &str, status: NodeStatus) -> Node {
        let mut n = Node { id: id.into(), status, ..Node::default() };
        n.csi_node_plugins.insert(
            "p".into(),
            CsiInfo {
                plugin_id: "p".into(),
                node_info: Some(CsiNodeInfo { id: "ext-n1".into(), ..Default::default() }),
                ..Default::default()
            },
        );
        n
    }

    #[test]
    fn node_step_skips_gone_nodes_and_detaches_past_claims_for_detach_requests() {
        let mut vol = claimed_volume();
        let c = taken_claim();
        assert_eq!(plan_node_detach(&vol, &c, None), NodeDetachPlan::NodeGone);
        assert_eq!(plan_node_detach(&vol, &c, Some(&node("n1", NodeStatus::Down))), NodeDetachPlan::NodeGone);
        assert_eq!(plan_node_detach(&vol, &c, Some(&node("n1", NodeStatus::Ready))), NodeDetachPlan::Detach(vec![c.clone()]));
        // Never mounted (no access mode): nothing to ask the node.
        let unmounted = CsiVolumeClaim { access_mode: CsiVolumeAccessMode::Unknown, ..c.clone() };
        assert_eq!(plan_node_detach(&vol, &unmounted, Some(&node("n1", NodeStatus::Ready))), NodeDetachPlan::Detach(vec![]));
        // `volume detach <vol> <node>`: a GC claim without alloc detaches every past claim there.
        let past = CsiVolumeClaim { state: CsiVolumeClaimState::Unpublishing, ..c.clone() };
        vol.past_claims.insert("a1".into(), past.clone());
        vol.past_claims.insert("elsewhere".into(), CsiVolumeClaim { node_id: "n2".into(), ..past.clone() });
        let detach = CsiVolumeClaim { node_id: "n1".into(), mode: CsiVolumeClaimMode::Gc, ..CsiVolumeClaim::default() };
        assert_eq!(plan_node_detach(&vol, &detach, Some(&node("n1", NodeStatus::Ready))), NodeDetachPlan::Detach(vec![past]));
    }

    #[test]
    fn controller_step_decisions() {
        let vol = claimed_volume();
        let c = taken_claim();
        let n1 = node("n1", NodeStatus::Ready);
        let no_allocs = |_: &str| -> Option<&Allocation> { None };
        let mut plugin = CsiPlugin { id: "p".into(), ..CsiPlugin::default() };
        assert_eq!(plan_controller_detach(&vol, None, &c, no_allocs, Some(&n1)), Err("no such plugin: \"p\"".into()));
        // A controller without PUBLISH_UNPUBLISH has nothing to undo.
        plugin.controllers.insert("n9".into(), CsiInfo { controller_info: Some(CsiControllerInfo::default()), ..Default::default() });
        assert_eq!(plan_controller_detach(&vol, Some(&plugin), &c, no_allocs, Some(&n1)), Ok(ControllerDetachPlan::NotNeeded));
        plugin.controllers.insert(
            "n9".into(),
            CsiInfo {
                controller_info: Some(CsiControllerInfo { supports_attach_detach: true, ..Default::default() }),
                ..Default::default()
            },
        );
        assert_eq!(
            plan_controller_detach(&vol, Some(&plugin), &c, no_allocs, Some(&n1)),
            Ok(ControllerDetachPlan::Detach { external_node_id: "ext-n1".into() })
        );
        // Recorded on a claim: no fingerprint needed.
        let mut recorded = vol.clone();
        recorded.write_claims.get_mut("a1").unwrap().external_node_id = "ext-claimed".into();
        assert_eq!(
            plan_controller_detach(&recorded, Some(&plugin), &c, no_allocs, None),
            Ok(ControllerDetachPlan::Detach { external_node_id: "ext-claimed".into() })
        );
        let e = plan_controller_detach(&vol, Some(&plugin), &c, no_allocs, None).unwrap_err();
        assert_eq!(e, "missing external node ID: Unknown node: n1");
        // Another live alloc on the node keeps the attachment.
        let mut shared = vol.clone();
        shared.read_allocs.insert("a2".into());
        let other = Allocation {
            id: "a2".into(),
            node_id: "n1".into(),
            desired_status: DesiredStatus::Run,
            client_status: ClientStatus::Running,
            ..Allocation::default()
        };
        let lookup = |id: &str| (id == "a2").then_some(&other);
        assert_eq!(
            plan_controller_detach(&shared, Some(&plugin), &c, lookup, Some(&n1)),
            Ok(ControllerDetachPlan::StillUsedOnNode { alloc_id: "a2".into() })
        );
        // Not when it is finished.
        let done = Allocation { client_status: ClientStatus::Complete, ..other.clone() };
        let lookup = |id: &str| (id == "a2").then_some(&done);
        assert!(matches!(plan_controller_detach(&shared, Some(&plugin), &c, lookup, Some(&n1)), Ok(ControllerDetachPlan::Detach { .. })));
        // Not required: nothing to do whatever the plugin.
        let local = CsiVolume { controller_required: false, ..vol };
        assert_eq!(plan_controller_detach(&local, None, &c, no_allocs, None), Ok(ControllerDetachPlan::NotNeeded));
    }
}
