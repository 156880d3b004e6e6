//! `CSIVolume.Claim` and `CSIVolume.Unpublish`: the node RPCs that take and release claims
//! (`nomad/csi_endpoint.go`).
//!
//! A node claims and releases only for its own allocs. A new claim of a volume whose plugin's
//! controller attaches volumes is published by a controller (`ClientCSI.ControllerAttachVolume`
//! through `Endpoints::client_csi`, routed as `csi_controller` says) after the claim is
//! written, as Nomad does. The release is the servers' one walk (`super::csi_release`), with the
//! calling client's report as the node step (it unpublished before calling).

use nomad_proto::csi::{CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState};
use nomad_proto::rpc::{CsiVolumeClaimRequest, CsiVolumeClaimResponse, CsiVolumeUnpublishRequest, GenericResponse};

use std::collections::BTreeMap;

use nomad_proto::csi::CsiVolume;
use nomad_proto::rpc::client_csi::{ClientCsiControllerAttachRequest, CsiControllerQuery};

use super::csi_controller::{CSI_CLIENT_RETRYABLE, UNKNOWN_NODE};
use super::csi_release::ReleaseBy;
use super::{EndpointError, Endpoints};

/// Nomad's `ErrUnknownAllocationPrefix`.
const UNKNOWN_ALLOCATION: &str = "Unknown allocation";

fn namespace_or_default(ns: &str) -> String {
    if ns.is_empty() { "default".into() } else { ns.to_string() }
}

/// The storage provider's ID of the claim's node (`lookupExternalNodeID`): from another claim of
/// the volume on the same node (read, then write, then past claims), else from the node's
/// fingerprint of the volume's node plugin.
pub(crate) fn lookup_external_node_id(state: &crate::state::State, vol: &CsiVolume, claim: &CsiVolumeClaim) -> Result<String, String> {
    for claims in [&vol.read_claims, &vol.write_claims, &vol.past_claims] {
        if let Some(c) = claims.values().find(|c| c.node_id == claim.node_id && !c.external_node_id.is_empty()) {
            return Ok(c.external_node_id.clone());
        }
    }
    let node = state.node(&claim.node_id).ok_or_else(|| format!("{UNKNOWN_NODE}: {}", claim.node_id))?;
    match node.csi_node_plugins.get(&vol.plugin_id).and_then(|p| p.node_info.as_ref()) {
        Some(info) => Ok(info.id.clone()),
        None => Err(format!(
            "failed to find storage provider info for client {:?}, node plugin {:?} is not running or has not fingerprinted on this client",
            node.id, vol.plugin_id
        )),
    }
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
        if snap.csi_volume(&namespace, &req.volume_id).is_none() {
            return Err(EndpointError::NotFound(format!("volume not found: {}", req.volume_id)));
        }
        let mut claim = req.to_claim();
        // A claim is always the caller's own (Nomad fills a missing node ID from the alloc).
        claim.node_id = node.id.to_string();
        let index = self.write_claim(&namespace, &req.volume_id, claim.clone()).await?;
        if !is_new_claim {
            return Ok(CsiVolumeClaimResponse { publish_context: Default::default(), volume: None, index });
        }
        // As Nomad: the claim is written first, then the controller publishes; a failure
        // leaves the claim, which the client's retry of the same claim finds in place.
        let (volume, publish_context) = self
            .controller_publish(&namespace, &req, claim)
            .await
            .map_err(|e| EndpointError::Invalid(format!("controller publish: {e}")))?;
        Ok(CsiVolumeClaimResponse { publish_context, volume: Some(volume), index })
    }

    /// `controllerPublishVolume`: for a volume whose plugin's controller attaches volumes, asks a
    /// controller to publish it to the claim's node; the volume (with its plugin's view) and the
    /// publish context for the reply.
    async fn controller_publish(
        &self,
        namespace: &str,
        req: &CsiVolumeClaimRequest,
        claim: CsiVolumeClaim,
    ) -> Result<(nomad_proto::csi::CsiVolume, BTreeMap<String, String>), String> {
        let snap = self.store.snapshot();
        let stored = snap.csi_volume(namespace, &req.volume_id).ok_or_else(|| format!("volume not found: {}", req.volume_id))?;
        let vol = snap.csi_volume_with_plugin(stored);
        if !vol.controller_required {
            return Ok((vol, BTreeMap::new()));
        }
        let plugin = snap.csi_plugin(&vol.plugin_id).ok_or_else(|| format!("plugin not found: {}", vol.plugin_id))?;
        // Some plugins have a controller for create and snapshots, but do not attach.
        if !plugin.supports_attach_detach() {
            return Ok((vol, BTreeMap::new()));
        }
        if snap.node(&claim.node_id).is_none() {
            return Err(format!("{UNKNOWN_NODE}: {}", claim.node_id));
        }
        let external_node_id = match req.external_node_id.as_str() {
            "" => lookup_external_node_id(&snap, &vol, &claim).map_err(|e| format!("missing external node ID: {e}"))?,
            id => id.to_string(),
        };
        let attach = ClientCsiControllerAttachRequest {
            controller: CsiControllerQuery { controller_node_id: String::new(), plugin_id: plugin.id.clone() },
            volume_id: vol.remote_id().to_string(),
            client_csi_node_id: external_node_id,
            attachment_mode: req.attachment_mode,
            access_mode: req.access_mode,
            mount_options: vol.mount_options.clone(),
            read_only: req.claim == CsiVolumeClaimMode::Read,
            secrets: vol.secrets.clone(),
            volume_context: vol.context.clone(),
        };
        drop(snap);
        let published = self
            .call_controller(&attach.controller.plugin_id, |node_id| {
                let mut r = attach.clone();
                r.controller.controller_node_id = node_id;
                self.client_csi.controller_attach(r)
            })
            .await
            .map_err(|e| {
                let m = e.to_string();
                // The client's csi hook retries on this text: a volume still attached elsewhere
                // is detached by then.
                if m.contains("FailedPrecondition") { format!("{CSI_CLIENT_RETRYABLE}: {m}") } else { m }
            })?;
        Ok((vol, published.publish_context))
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
    use nomad_proto::csi::{CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeClaim};
    use nomad_proto::{ClientStatus, Node};

    use std::sync::Arc;

    use super::*;
    use crate::consensus::Consensus;
    use crate::csi::ClientCallError;
    use crate::fsm::Command;
    use crate::testing::csi::{self, place_alloc, ready, stored};
    use crate::testing::{CsiRequest, RecordingClientCsi, TestServer};

    /// A node running the `hostpath` plugin; `controller`: also a controller that attaches.
    async fn plugin_node(ts: &TestServer, id: &str, controller: bool) -> Node {
        csi::plugin_node(ts, id, true, controller).await
    }

    async fn register_volume(ts: &TestServer, id: &str) {
        csi::register(ts, csi::volume(id, CsiVolumeAccessMode::SingleNodeWriter)).await
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

    #[tokio::test]
    async fn claim_is_the_nodes_own_for_its_own_live_allocs() {
        let ts = TestServer::new();
        let n1 = plugin_node(&ts, "n1", false).await;
        let n2 = plugin_node(&ts, "n2", false).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "n1", ClientStatus::Running);

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
        let done = place_alloc(&ts, "n1", ClientStatus::Complete);
        assert!(matches!(ts.endpoints.csi_volume_claim(claim_req(&n1, &done.id, "vol")).await, Err(EndpointError::Invalid(_))));
        assert!(!stored(&ts, "vol").in_use(), "nothing refused was written");

        let r = ts.endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap();
        let vol = r.volume.expect("a new claim answers with the volume");
        assert!(vol.write_allocs.contains(&a.id));
        assert!(stored(&ts, "vol").write_claims[&a.id].node_id == "n1");
        // A second writer on single-node-writer: the text the client retries on.
        let b = place_alloc(&ts, "n1", ClientStatus::Pending);
        let e = ts.endpoints.csi_volume_claim(claim_req(&n1, &b.id, "vol")).await.unwrap_err();
        assert_eq!(e, EndpointError::Invalid("volume max claims reached".into()));
    }

    /// Endpoints of `ts` reaching clients through a recording fake.
    fn with_fake(ts: &TestServer) -> (Endpoints, Arc<RecordingClientCsi>) {
        let fake = RecordingClientCsi::new();
        (ts.endpoints.clone().with_client_csi(fake.clone()), fake)
    }

    fn attaches(fake: &RecordingClientCsi) -> Vec<ClientCsiControllerAttachRequest> {
        fake.requests().into_iter().filter_map(|s| if let CsiRequest::ControllerAttach(a) = s { Some(a) } else { None }).collect()
    }

    #[tokio::test]
    async fn a_new_claim_is_published_by_a_controller_and_answers_with_its_context() {
        let ts = TestServer::new();
        let n1 = plugin_node(&ts, "n1", true).await;
        ready(&ts, &n1).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "n1", ClientStatus::Pending);
        let (endpoints, fake) = with_fake(&ts);
        fake.set_publish_context(BTreeMap::from([("device".to_string(), "/dev/xvdb".to_string())]));

        let r = endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap();
        assert_eq!(r.publish_context["device"], "/dev/xvdb");
        assert!(r.volume.unwrap().write_allocs.contains(&a.id));
        let sent = attaches(&fake);
        assert_eq!(sent.len(), 1, "{sent:?}");
        let attach = &sent[0];
        assert_eq!(attach.controller, CsiControllerQuery { controller_node_id: "n1".into(), plugin_id: "hostpath".into() });
        assert_eq!(attach.volume_id, "vol", "the remote ID (no external ID: the volume's own)");
        assert_eq!(attach.client_csi_node_id, "ext-n1", "the node plugin's ID of the claiming node");
        assert_eq!(
            (attach.access_mode, attach.attachment_mode),
            (CsiVolumeAccessMode::SingleNodeWriter, CsiVolumeAttachmentMode::FileSystem)
        );
        assert!(!attach.read_only, "a write claim");
        assert!(stored(&ts, "vol").write_claims.contains_key(&a.id));

        // A claim that is not new (a release checkpoint) publishes nothing.
        let mut gc = claim_req(&n1, &a.id, "vol");
        gc.claim = CsiVolumeClaimMode::Gc;
        endpoints.csi_volume_claim(gc).await.unwrap();
        assert_eq!(attaches(&fake).len(), 1);
    }

    #[tokio::test]
    async fn a_controller_that_cannot_take_the_call_passes_it_to_the_next() {
        for cannot in [
            ClientCallError::NoPath { node_id: "x".into(), reason: "the node has no connection to this server".into() },
            ClientCallError::Failed(format!("CSI.ControllerAttachVolume: {CSI_CLIENT_RETRYABLE}: plugin not registered")),
            ClientCallError::Failed(format!("{UNKNOWN_NODE} \"x\"")),
        ] {
            let ts = TestServer::new();
            let c1 = plugin_node(&ts, "c1", true).await;
            let c2 = plugin_node(&ts, "c2", true).await;
            ready(&ts, &c1).await;
            ready(&ts, &c2).await;
            let n = plugin_node(&ts, "n", false).await;
            register_volume(&ts, "vol").await;
            let a = place_alloc(&ts, "n", ClientStatus::Pending);
            let (endpoints, fake) = with_fake(&ts);
            fake.fail_next(cannot.clone());
            endpoints.csi_volume_claim(claim_req(&n, &a.id, "vol")).await.unwrap();
            let sent = attaches(&fake);
            assert_eq!(sent.len(), 2, "{cannot:?}: {sent:?}");
            assert_ne!(sent[0].controller.controller_node_id, sent[1].controller.controller_node_id);
            assert!(sent.iter().all(|s| s.client_csi_node_id == "ext-n"), "published to the claiming node: {sent:?}");
        }
    }

    #[tokio::test]
    async fn a_failed_precondition_comes_back_retryable_and_a_timeout_is_not_passed_on() {
        let ts = TestServer::new();
        let c1 = plugin_node(&ts, "c1", true).await;
        let c2 = plugin_node(&ts, "c2", true).await;
        ready(&ts, &c1).await;
        ready(&ts, &c2).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "c1", ClientStatus::Pending);
        let (endpoints, fake) = with_fake(&ts);
        fake.fail_next(ClientCallError::Failed(
            "CSI.ControllerAttachVolume: volume \"vol\" is already published on another node: rpc error: code = FailedPrecondition desc = busy".into(),
        ));
        let e = endpoints.csi_volume_claim(claim_req(&c1, &a.id, "vol")).await.unwrap_err();
        let EndpointError::Invalid(m) = e else { panic!("{e:?}") };
        assert!(m.starts_with(&format!("controller publish: {CSI_CLIENT_RETRYABLE}: ")), "{m}");
        assert_eq!(attaches(&fake).len(), 1, "not a reason to try another controller");
        assert!(stored(&ts, "vol").write_claims.contains_key(&a.id), "the claim stays, as in Nomad: the client's retry finds it");

        fake.fail_next(ClientCallError::Timeout { node_id: "c1".into(), seconds: 135 });
        let e = endpoints.csi_volume_claim(claim_req(&c1, &a.id, "vol")).await.unwrap_err();
        assert!(e.to_string().contains("did not answer within 135s"), "{e}");
        assert_eq!(attaches(&fake).len(), 2, "one more try, on one controller only");
        // The client's retry goes through once the controller answers.
        endpoints.csi_volume_claim(claim_req(&c1, &a.id, "vol")).await.unwrap();
    }

    #[tokio::test]
    async fn without_a_ready_healthy_controller_the_claim_says_why() {
        let ts = TestServer::new();
        // Registered (initializing, not ready) with a healthy controller.
        let n1 = plugin_node(&ts, "n1", true).await;
        register_volume(&ts, "vol").await;
        let a = place_alloc(&ts, "n1", ClientStatus::Pending);
        let (endpoints, fake) = with_fake(&ts);
        let e = endpoints.csi_volume_claim(claim_req(&n1, &a.id, "vol")).await.unwrap_err().to_string();
        assert!(e.contains("failed to find clients running controller plugin \"hostpath\""), "{e}");
        assert!(e.contains("node \"n1\" for plugin instance \"plugin-n1\" is not ready"), "{e}");
        assert!(fake.requests().is_empty());
    }

    #[tokio::test]
    async fn the_external_node_id_comes_from_the_nodes_other_claims_first() {
        let ts = TestServer::new();
        let n1 = plugin_node(&ts, "n1", true).await;
        ready(&ts, &n1).await;
        let snap = ts.store.snapshot();
        let claim = CsiVolumeClaim { node_id: "n1".into(), ..CsiVolumeClaim::default() };
        let mut vol = CsiVolume { id: "vol".into(), plugin_id: "hostpath".into(), ..CsiVolume::default() };
        assert_eq!(lookup_external_node_id(&snap, &vol, &claim).unwrap(), "ext-n1", "the node plugin's fingerprint");
        let other = |ext: &str| CsiVolumeClaim { node_id: "n1".into(), external_node_id: ext.into(), ..CsiVolumeClaim::default() };
        vol.past_claims.insert("p".into(), other("from-past"));
        assert_eq!(lookup_external_node_id(&snap, &vol, &claim).unwrap(), "from-past");
        vol.write_claims.insert("w".into(), other("from-write"));
        assert_eq!(lookup_external_node_id(&snap, &vol, &claim).unwrap(), "from-write");
        vol.read_claims.insert("r".into(), other("from-read"));
        vol.read_claims.insert(
            "elsewhere".into(),
            CsiVolumeClaim { node_id: "n2".into(), external_node_id: "n2-ext".into(), ..CsiVolumeClaim::default() },
        );
        assert_eq!(lookup_external_node_id(&snap, &vol, &claim).unwrap(), "from-read");
        let ghost = CsiVolumeClaim { node_id: "ghost".into(), ..CsiVolumeClaim::default() };
        assert_eq!(lookup_external_node_id(&snap, &vol, &ghost).unwrap_err(), "Unknown node: ghost");
        let e = lookup_external_node_id(&snap, &CsiVolume { plugin_id: "other".into(), ..CsiVolume::default() }, &claim).unwrap_err();
        assert!(e.contains("node plugin \"other\" is not running or has not fingerprinted on this client"), "{e}");
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
            let a = place_alloc(&ts, "n1", ClientStatus::Running);
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
        csi::register(&ts, csi::volume("vol", multi)).await;
        let a = place_alloc(&ts, "n1", ClientStatus::Complete);
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
        let b = place_alloc(&ts, "n1", ClientStatus::Running);
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
