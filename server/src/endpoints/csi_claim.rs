//! `CSIVolume.Claim` and `CSIVolume.Unpublish`: the node RPCs that take and release claims
//! (`nomad/csi_endpoint.go`).
//!
//! A node claims and releases only for its own allocs. The release is the servers' one walk
//! (`super::csi_release`), with the calling client's report as the node step (it unpublished
//! before calling); the controller step goes to a controller through `ClientCsi`.

use nomad_proto::csi::{CsiVolumeClaimMode, CsiVolumeClaimState};
use nomad_proto::rpc::{CsiVolumeClaimRequest, CsiVolumeClaimResponse, CsiVolumeUnpublishRequest, GenericResponse};

use super::csi_release::ReleaseBy;
use super::{EndpointError, Endpoints};

/// Nomad's `ErrUnknownAllocationPrefix`.
const UNKNOWN_ALLOCATION: &str = "Unknown allocation";

fn namespace_or_default(ns: &str) -> String {
    if ns.is_empty() { "default".into() } else { ns.to_string() }
}

impl Endpoints {
    /// A client claims a volume for one of its allocs, or releases a claim (`CSIVolume.Claim`).
    /// The claim rules (`crate::csi::claim`) answer with Nomad's texts; the client retries on
    /// "volume max claims reached".
    pub async fn csi_volume_claim(&self, req: CsiVolumeClaimRequest) -> Result<CsiVolumeClaimResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        if req.volume_id.is_empty() {
            return Err(EndpointError::BadRequest("missing volume ID".into()));
        }
        let namespace = namespace_or_default(&req.namespace);
        let is_new_claim = req.claim != CsiVolumeClaimMode::Gc && req.state == CsiVolumeClaimState::Taken;
        match snap.alloc(&req.allocation_id) {
            Some(a) if a.node_id != node.id => {
                return Err(EndpointError::PermissionDenied(format!("alloc {} is not on node {}", a.id, node.id)));
            }
            Some(a) if is_new_claim && a.terminal() => {
                return Err(EndpointError::Invalid(format!("allocation {} is terminal and cannot claim a volume", a.id)));
            }
            Some(_) => {}
            None if is_new_claim => return Err(EndpointError::NotFound(format!("{UNKNOWN_ALLOCATION}: {}", req.allocation_id))),
            None => {}
        }
        let stored = snap
            .csi_volume(&namespace, &req.volume_id)
            .ok_or_else(|| EndpointError::NotFound(format!("volume not found: {}", req.volume_id)))?;
        if is_new_claim {
            let vol = snap.csi_volume_with_plugin(stored);
            let attaches = snap.csi_plugin(&vol.plugin_id).is_some_and(|p| p.supports_attach_detach());
            if vol.controller_required && attaches {
                return Err(EndpointError::Unsupported(format!(
                    "controller publish: volume {:?} of plugin {:?} must be published by a controller, and controller publish is not supported by nomad-rs yet",
                    vol.id, vol.plugin_id
                )));
            }
        }
        let mut claim = req.to_claim();
        // A claim is always the caller's own (Nomad fills a missing node ID from the alloc).
        claim.node_id = node.id.to_string();
        let index = self.write_claim(&namespace, &req.volume_id, claim).await?;
        let volume = is_new_claim.then(|| {
            let snap = self.store.snapshot();
            snap.csi_volume(&namespace, &req.volume_id).map(|v| snap.csi_volume_with_plugin(v))
        });
        Ok(CsiVolumeClaimResponse { publish_context: Default::default(), volume: volume.flatten(), index })
    }

    /// A client reports that it unpublished an alloc's volume (`CSIVolume.Unpublish`); the claim
    /// is walked on from the state it arrives in to `ready-to-free`, each step checkpointed
    /// (`Endpoints::csi_release_claim`).
    pub async fn csi_volume_unpublish(&self, req: CsiVolumeUnpublishRequest) -> Result<GenericResponse, EndpointError> {
        let snap = self.store.snapshot();
        let node = self.authenticate_node(&snap, &req.node_id, &req.secret_id)?;
        if req.volume_id.is_empty() {
            return Err(EndpointError::BadRequest("missing volume ID".into()));
        }
        let Some(mut claim) = req.claim else { return Err(EndpointError::BadRequest("missing volume claim".into())) };
        let namespace = namespace_or_default(&req.namespace);
        if snap.csi_volume(&namespace, &req.volume_id).is_none() {
            return Err(EndpointError::NotFound("no such volume".into()));
        }
        if !claim.node_id.is_empty() && claim.node_id != node.id.as_str() {
            return Err(EndpointError::PermissionDenied(format!("claim of node {} is not node {}'s to release", claim.node_id, node.id)));
        }
        if let Some(a) = snap.alloc(&claim.allocation_id).filter(|a| a.node_id != node.id) {
            return Err(EndpointError::PermissionDenied(format!("alloc {} is not on node {}", a.id, node.id)));
        }
        claim.node_id = node.id.to_string();
        let index = self.csi_release_claim(&namespace, &req.volume_id, claim, ReleaseBy::ClaimNode).await?;
        Ok(GenericResponse { index })
    }
}

#[cfg(test)]
mod tests {
    use nomad_proto::csi::{
        CsiControllerInfo, CsiInfo, CsiNodeInfo, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability,
        CsiVolumeClaim,
    };
    use nomad_proto::{Allocation, ClientStatus, Node};

    use super::*;
    use crate::consensus::Consensus;
    use crate::fsm::Command;
    use crate::testing::{TestServer, job, node};

    /// A node running the `hostpath` plugin; `controller`: also a controller that attaches.
    async fn plugin_node(ts: &TestServer, id: &str, controller: bool) -> Node {
        let mut n = node(id);
        let info = CsiInfo { plugin_id: "hostpath".into(), healthy: true, alloc_id: format!("plugin-{id}"), ..CsiInfo::default() };
        n.csi_node_plugins.insert(
            "hostpath".into(),
            CsiInfo { node_info: Some(CsiNodeInfo { id: format!("ext-{id}"), ..CsiNodeInfo::default() }), ..info.clone() },
        );
        if controller {
            let caps = CsiControllerInfo { supports_attach_detach: true, ..CsiControllerInfo::default() };
            n.csi_controller_plugins
                .insert("hostpath".into(), CsiInfo { requires_controller_plugin: true, controller_info: Some(caps), ..info });
        }
        ts.register_node(n).await
    }

    async fn register_volume(ts: &TestServer, id: &str) {
        register_volume_with(ts, id, CsiVolumeAccessMode::SingleNodeWriter).await
    }

    async fn register_volume_with(ts: &TestServer, id: &str, access_mode: CsiVolumeAccessMode) {
        let vol = CsiVolume {
            id: id.into(),
            namespace: "default".into(),
            plugin_id: "hostpath".into(),
            requested_capabilities: vec![CsiVolumeCapability { access_mode, attachment_mode: CsiVolumeAttachmentMode::FileSystem }],
            ..CsiVolume::default()
        };
        ts.consensus.apply(Command::CsiVolumeRegister { volumes: vec![vol] }).await.unwrap();
    }

    async fn place_alloc(ts: &TestServer, node_id: &str, status: ClientStatus) -> Allocation {
        let mut j = job("web", 1);
        j.canonicalize();
        let idx = ts.store.snapshot().index + 1;
        ts.store.write(idx, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
        let a = Allocation {
            id: nomad_proto::new_id(),
            namespace: "default".into(),
            job_id: "web".into(),
            job: ts.store.snapshot().job("default", "web").cloned(),
            task_group: "web".into(),
            name: "web.web[0]".into(),
            node_id: node_id.into(),
            client_status: status,
            ..Allocation::default()
        };
        ts.store.write(idx + 1, |tx| Ok(tx.upsert_allocs_from_plan(vec![a.clone()]))).unwrap();
        a
    }

    fn claim_req(n: &Node, alloc: &str, vol: &str) -> CsiVolumeClaimRequest {
        CsiVolumeClaimRequest {
            volume_id: vol.into(),
            allocation_id: alloc.into(),
            node_id: n.id.clone(),
            secret_id: n.secret_id.clone(),
            claim: CsiVolumeClaimMode::Write,
            access_mode: CsiVolumeAccessMode::SingleNodeWriter,
            attachment_mode: CsiVolumeAttachmentMode::FileSystem,
            state: CsiVolumeClaimState::Taken,
            ..CsiVolumeClaimRequest::default()
        }
    }

    fn unpublish_req(n: &Node, alloc: &str, vol: &str, state: CsiVolumeClaimState) -> CsiVolumeUnpublishRequest {
        CsiVolumeUnpublishRequest {
            volume_id: vol.into(),
            claim: Some(CsiVolumeClaim {
                allocation_id: alloc.into(),
                node_id: n.id.clone(),
                mode: CsiVolumeClaimMode::Write,
                access_mode: CsiVolumeAccessMode::SingleNodeWriter,
                attachment_mode: CsiVolumeAttachmentMode::FileSystem,
                state,
                ..CsiVolumeClaim::default()
            }),
            node_id: n.id.clone(),
            secret_id: n.secret_id.clone(),
            ..CsiVolumeUnpublishRequest::default()
        }
    }

    fn stored(ts: &TestServer, vol: &str) -> CsiVolume {
        (**ts.store.snapshot().csi_volume("default", vol).unwrap()).clone()
    }

    #[tokio::test]
    async fn claim_is_the_nodes_own_for_its_own_live_allocs() {
        let ts = TestServer::new();
        let n1 = plugin_node(&ts, "n1", false).await;
        let n2 = plugin_node(&ts, "n2", false).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "n1", ClientStatus::Running).await;

        let mut wrong = claim_req(&n1, &a.id, "vol");
        wrong.secret_id = "not-the-secret".into();
        let e = ts.endpoints.csi_volume_claim(wrong).await.unwrap_err();
        assert!(matches!(e, EndpointError::PermissionDenied(_)), "{e:?}");
        let e = ts.endpoints.csi_volume_claim(claim_req(&n2, &a.id, "vol")).await.unwrap_err();
        assert_eq!(e, EndpointError::PermissionDenied(format!("alloc {} is not on node n2", a.id)));
        let e = ts.endpoints.csi_volume_claim(claim_req(&n1, "ghost", "vol")).await.unwrap_err();
        assert_eq!(e, EndpointError::NotFound("Unknown allocation: ghost".into()));
        let e = ts.endpoints.csi_volume_claim(claim_req(&n1, &a.id, "nope")).await.unwrap_err();
        assert_eq!(e, EndpointError::NotFound("volume not found: nope".into()));
        let done = place_alloc(&ts, "n1", ClientStatus::Complete).await;
        assert!(matches!(ts.endpoints.csi_volume_claim(claim_req(&n1, &done.id, "vol")).await, Err(EndpointError::Invalid(_))));
        assert!(!stored(&ts, "vol").in_use(), "nothing refused was written");

        let r = ts.endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap();
        let vol = r.volume.expect("a new claim answers with the volume");
        assert!(vol.write_allocs.contains(&a.id));
        assert!(stored(&ts, "vol").write_claims[&a.id].node_id == "n1");
        // A second writer on single-node-writer: the text the client retries on.
        let b = place_alloc(&ts, "n1", ClientStatus::Pending).await;
        let e = ts.endpoints.csi_volume_claim(claim_req(&n1, &b.id, "vol")).await.unwrap_err();
        assert_eq!(e, EndpointError::Invalid("volume max claims reached".into()));
    }

    #[tokio::test]
    async fn a_volume_needing_controller_publish_is_refused_before_it_is_claimed() {
        let ts = TestServer::new();
        let n1 = plugin_node(&ts, "n1", true).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "n1", ClientStatus::Pending).await;
        let e = ts.endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap_err();
        let EndpointError::Unsupported(m) = e else { panic!("{e:?}") };
        assert!(m.contains("controller publish is not supported by nomad-rs yet"), "{m}");
        assert!(!stored(&ts, "vol").in_use());
    }

    #[tokio::test]
    async fn unpublish_frees_the_claim_from_every_checkpointed_state() {
        for state in [
            CsiVolumeClaimState::Taken,
            CsiVolumeClaimState::Unpublishing,
            CsiVolumeClaimState::NodeDetached,
            CsiVolumeClaimState::ControllerDetached,
            CsiVolumeClaimState::ReadyToFree,
        ] {
            let ts = TestServer::new();
            let n1 = plugin_node(&ts, "n1", false).await;
            let n2 = plugin_node(&ts, "n2", false).await;
            register_volume(&ts, "vol").await;
            let a = place_alloc(&ts, "n1", ClientStatus::Running).await;
            ts.endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap();
            // An earlier, interrupted release left this checkpoint.
            if !matches!(state, CsiVolumeClaimState::Taken | CsiVolumeClaimState::ReadyToFree) {
                let mut c = stored(&ts, "vol").write_claims[&a.id].clone();
                c.state = state;
                ts.consensus
                    .apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim: c })
                    .await
                    .unwrap();
            }
            // Another node cannot release it.
            let e = ts.endpoints.csi_volume_unpublish(unpublish_req(&n2, &a.id, "vol", state)).await.unwrap_err();
            assert!(matches!(e, EndpointError::PermissionDenied(_)), "{state:?}: {e:?}");
            let mut wrong = unpublish_req(&n1, &a.id, "vol", state);
            wrong.secret_id = "x".into();
            assert!(matches!(ts.endpoints.csi_volume_unpublish(wrong).await, Err(EndpointError::PermissionDenied(_))));
            assert!(stored(&ts, "vol").in_use(), "{state:?}: refused calls change nothing");

            ts.endpoints.csi_volume_unpublish(unpublish_req(&n1, &a.id, "vol", state)).await.unwrap();
            let vol = stored(&ts, "vol");
            assert!(!vol.in_use() && vol.past_claims.is_empty(), "{state:?}: {vol:?}");
            assert_eq!(vol.access_mode, CsiVolumeAccessMode::Unknown, "{state:?}");
        }
    }

    #[tokio::test]
    async fn unpublish_stops_at_node_detached_when_the_controller_fails_and_resumes_there() {
        let calls = crate::testing::RecordingClientCsi::new();
        let ts = TestServer::new().with_client_csi(calls.clone());
        let n1 = plugin_node(&ts, "n1", true).await;
        let idx = ts.store.snapshot().index + 1;
        ts.store.write(idx, |tx| tx.update_node_status("n1", nomad_proto::NodeStatus::Ready, None, 0).map(|_| ())).unwrap();
        let multi = CsiVolumeAccessMode::MultiNodeMultiWriter;
        register_volume_with(&ts, "vol", multi).await;
        let a = place_alloc(&ts, "n1", ClientStatus::Complete).await;
        // Taken by a path that did the controller publish.
        let mut claim = claim_req(&n1, &a.id, "vol").to_claim();
        claim.access_mode = multi;
        ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim }).await.unwrap();
        calls.fail("n1", crate::csi::ClientCallError::Failed("rpc error: code = Internal desc = controller down".into()), None);
        for state in [CsiVolumeClaimState::Unpublishing, CsiVolumeClaimState::NodeDetached] {
            let e = ts.endpoints.csi_volume_unpublish(unpublish_req(&n1, &a.id, "vol", state)).await.unwrap_err();
            let EndpointError::Internal(m) = e else { panic!("{e:?}") };
            assert!(m.starts_with("could not detach from controller: controller detach volume: rpc error"), "{m}");
            let vol = stored(&ts, "vol");
            assert_eq!(vol.past_claims[&a.id].state, CsiVolumeClaimState::NodeDetached, "checkpointed, not freed");
            assert!(vol.write_allocs.contains(&a.id));
        }
        // The client's report is the node step: only controller calls were made.
        assert!(calls.calls().iter().all(|c| matches!(c, crate::testing::CsiCall::ControllerDetach { .. })), "{:?}", calls.calls());
        let tried = calls.calls().len();
        // With the volume held by a second live alloc on the node, no controller call is needed.
        let b = place_alloc(&ts, "n1", ClientStatus::Running).await;
        let mut claim = claim_req(&n1, &b.id, "vol").to_claim();
        claim.mode = CsiVolumeClaimMode::Read;
        claim.access_mode = multi;
        ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim }).await.unwrap();
        ts.endpoints.csi_volume_unpublish(unpublish_req(&n1, &a.id, "vol", CsiVolumeClaimState::NodeDetached)).await.unwrap();
        let vol = stored(&ts, "vol");
        assert!(!vol.write_allocs.contains(&a.id) && !vol.past_claims.contains_key(&a.id));
        assert!(vol.read_allocs.contains(&b.id));
        assert_eq!(calls.calls().len(), tried, "no controller call while b uses the volume on n1");

        // b ends and its client reports: the controller (back now) unpublishes from n1.
        calls.heal("n1");
        let mut report = unpublish_req(&n1, &b.id, "vol", CsiVolumeClaimState::Unpublishing);
        report.claim.as_mut().unwrap().mode = CsiVolumeClaimMode::Read;
        ts.endpoints.csi_volume_unpublish(report).await.unwrap();
        assert!(!stored(&ts, "vol").in_use());
        assert_eq!(
            calls.calls().last(),
            Some(&crate::testing::CsiCall::ControllerDetach {
                controller_node_id: "n1".into(),
                volume_id: "vol".into(),
                client_csi_node_id: "ext-n1".into()
            })
        );
    }
}
