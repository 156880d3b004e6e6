//! The release walk from every checkpointed state, against a recording `ClientCsi`.

use std::sync::Arc;

use nomad_proto::csi::{
    CsiControllerInfo, CsiInfo, CsiVolume, CsiVolumeAccessMode, CsiVolumeClaim, CsiVolumeClaimMode, CsiVolumeClaimState,
};
use nomad_proto::{Allocation, ClientStatus, NodeStatus};

use super::*;
use crate::csi::ClientCallError;
use crate::endpoints::CSI_CLIENT_RETRYABLE;
use crate::testing::csi::{claim_of, finish_lost, place_alloc, plugin_node, register, set_status, stored, volume};
use crate::testing::{CsiCall, CsiRequest, RecordingClientCsi, TestServer, node};

const MODE: CsiVolumeAccessMode = CsiVolumeAccessMode::MultiNodeMultiWriter;

/// A server whose client calls go to a recording fake, with `n1` and `n2` running the node
/// plugin and `controllers` running a healthy attach/detach controller (all ready).
async fn server(controllers: &[&str]) -> (TestServer, Arc<RecordingClientCsi>) {
    let calls = RecordingClientCsi::new();
    let ts = TestServer::new().with_client_csi(calls.clone());
    for id in ["n1", "n2"] {
        plugin_node(&ts, id, true, false).await;
        set_status(&ts, id, NodeStatus::Ready);
    }
    for id in controllers {
        plugin_node(&ts, id, false, true).await;
        set_status(&ts, id, NodeStatus::Ready);
    }
    register_volume(&ts, !controllers.is_empty()).await;
    (ts, calls)
}

async fn register_volume(ts: &TestServer, controller_required: bool) {
    register(ts, CsiVolume { external_id: "ext-vol".into(), controller_required, ..volume("vol", MODE) }).await;
}

/// A claim taken by `alloc` (as the claim RPC writes it), then finished.
async fn claimed(ts: &TestServer, node_id: &str) -> Allocation {
    let a = place_alloc(ts, node_id, ClientStatus::Running);
    ts.endpoints.write_claim("default", "vol", claim_of(&a, MODE, CsiVolumeClaimState::Taken)).await.unwrap();
    a
}

fn node_detach(node: &str, a: &Allocation) -> CsiCall {
    CsiCall::NodeDetach { node_id: node.into(), alloc_id: a.id.clone(), external_id: "ext-vol".into() }
}

fn controller_detach(controller: &str, from: &str) -> CsiCall {
    CsiCall::ControllerDetach {
        controller_node_id: controller.into(),
        volume_id: "ext-vol".into(),
        client_csi_node_id: format!("ext-{from}"),
    }
}

async fn release(ts: &TestServer, claim: CsiVolumeClaim, by: ReleaseBy) -> Result<u64, EndpointError> {
    ts.endpoints.csi_release_claim("default", "vol", claim, by).await
}

fn assert_freed(ts: &TestServer, what: &str) {
    let vol = stored(ts, "vol");
    assert!(!vol.in_use() && vol.past_claims.is_empty(), "{what}: {vol:?}");
}

#[tokio::test]
async fn a_server_release_resumes_at_each_checkpoint_with_only_the_calls_left() {
    use CsiVolumeClaimState::*;
    for (state, node_call, controller_call) in [
        (Taken, true, true),
        (Unpublishing, true, true),
        (NodeDetached, false, true),
        (ControllerDetached, false, false),
        (ReadyToFree, false, false),
    ] {
        let (ts, calls) = server(&["c1"]).await;
        let a = claimed(&ts, "n1").await;
        finish_lost(&ts, &a);
        release(&ts, claim_of(&a, MODE, state), ReleaseBy::Server).await.unwrap();
        let mut want = Vec::new();
        if node_call {
            want.push(node_detach("n1", &a));
        }
        if controller_call {
            want.push(controller_detach("c1", "n1"));
        }
        assert_eq!(calls.calls(), want, "from {}", state.name());
        for r in calls.requests() {
            if let CsiRequest::NodeDetach(r) = r {
                // The client's staging path has the namespace.
                assert_eq!((r.namespace.as_str(), r.volume_id.as_str()), ("default", "vol"));
            }
        }
        assert_freed(&ts, state.name());
    }
}

#[tokio::test]
async fn the_claim_nodes_own_report_is_the_node_step() {
    let (ts, calls) = server(&["c1"]).await;
    let a = claimed(&ts, "n1").await;
    release(&ts, claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::ClaimNode).await.unwrap();
    assert_eq!(calls.calls(), vec![controller_detach("c1", "n1")], "no node call: the node unpublished before it called");
    assert_freed(&ts, "client report");
}

#[tokio::test]
async fn a_down_or_collected_node_gets_no_node_call() {
    let (ts, calls) = server(&[]).await;
    let a = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);
    set_status(&ts, "n1", NodeStatus::Down);
    release(&ts, claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls(), vec![], "node down: skipped");
    assert_freed(&ts, "node down");

    // Garbage collected (no such node): the same.
    let b = claimed(&ts, "n2").await;
    finish_lost(&ts, &b);
    let idx = ts.store.snapshot().index + 1;
    ts.store.write(idx, |tx| tx.delete_node("n2").map(|_| ())).unwrap();
    release(&ts, claim_of(&b, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls(), vec![]);
    assert_freed(&ts, "node gone");
}

#[tokio::test]
async fn a_live_node_is_asked_to_detach_unless_the_claim_was_never_mounted() {
    let (ts, calls) = server(&[]).await;
    let a = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);
    // "Unknown node" from the client: nothing is mounted there any more.
    calls.fail("n1", ClientCallError::Failed("node detach volume: Unknown node n1".into()), Some(1));
    release(&ts, claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls(), vec![node_detach("n1", &a)]);
    assert_freed(&ts, "unknown node");

    let b = claimed(&ts, "n1").await;
    finish_lost(&ts, &b);
    let unmounted = CsiVolumeClaim { access_mode: CsiVolumeAccessMode::Unknown, ..claim_of(&b, MODE, CsiVolumeClaimState::Unpublishing) };
    release(&ts, unmounted, ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls().len(), 1, "no access mode: released client-side, no call");
    assert_freed(&ts, "unmounted");
}

#[tokio::test]
async fn a_failure_leaves_the_checkpoint_and_a_resend_resumes_there() {
    let (ts, calls) = server(&["c1"]).await;
    let a = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);

    // The node plugin fails: the claim stays `unpublishing`.
    calls.fail("n1", ClientCallError::Failed("rpc error: code = Internal desc = plugin gone".into()), None);
    let e = release(&ts, claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await.unwrap_err();
    assert!(e.to_string().starts_with("could not detach from node: node detach volume: rpc error"), "{e}");
    let past = stored(&ts, "vol").past_claims[&a.id].clone();
    assert_eq!(past.state, CsiVolumeClaimState::Unpublishing);
    assert!(stored(&ts, "vol").write_allocs.contains(&a.id));

    // The node is back, the controller fails: the claim stays `node-detached`.
    calls.heal("n1");
    calls.fail("c1", ClientCallError::Failed("rpc error: code = Internal desc = controller gone".into()), None);
    let e = release(&ts, past, ReleaseBy::Server).await.unwrap_err();
    assert!(e.to_string().starts_with("could not detach from controller: controller detach volume: rpc error"), "{e}");
    let past = stored(&ts, "vol").past_claims[&a.id].clone();
    assert_eq!(past.state, CsiVolumeClaimState::NodeDetached);
    assert_eq!(past.external_node_id, "", "the external node ID is recorded only with a successful step");

    // The resend of the stored claim starts at the controller: no second node call.
    calls.heal("c1");
    let before = calls.calls().len();
    release(&ts, past, ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls()[before..], [controller_detach("c1", "n1")]);
    assert_freed(&ts, "resumed");
}

#[tokio::test]
async fn a_controller_that_cannot_be_reached_is_passed_over_for_the_next() {
    let (ts, calls) = server(&["c1", "c2"]).await;
    // Neither an unhealthy controller nor one on a node that is not ready is asked.
    let mut sick = node("c3");
    let caps = CsiControllerInfo { supports_attach_detach: true, ..CsiControllerInfo::default() };
    sick.csi_controller_plugins.insert(
        "hostpath".into(),
        CsiInfo {
            plugin_id: "hostpath".into(),
            healthy: true,
            requires_controller_plugin: true,
            controller_info: Some(caps),
            ..CsiInfo::default()
        },
    );
    ts.register_node(sick).await; // registered, never ready
    let a = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);

    // Both fail in a way the next controller may not: both are tried, the claim stays.
    calls.fail("c1", ClientCallError::NoPath { node_id: "c1".into(), reason: "not connected".into() }, None);
    calls.fail("c2", ClientCallError::Failed(format!("{CSI_CLIENT_RETRYABLE}: no controller plugin")), None);
    let claim = claim_of(&a, MODE, CsiVolumeClaimState::NodeDetached);
    assert!(release(&ts, claim.clone(), ReleaseBy::Server).await.is_err());
    let mut asked: Vec<String> = calls.calls().iter().map(|c| c.target().to_string()).collect();
    asked.sort();
    assert_eq!(asked, ["c1", "c2"]);
    assert_eq!(stored(&ts, "vol").past_claims[&a.id].state, CsiVolumeClaimState::NodeDetached);

    // One comes back: whichever order the shuffle gives, the release finishes there.
    calls.heal("c2");
    release(&ts, claim.clone(), ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls().last(), Some(&controller_detach("c2", "n1")));
    assert_freed(&ts, "second controller");

    // A plain failure is not passed on.
    let b = claimed(&ts, "n1").await;
    finish_lost(&ts, &b);
    calls.heal("c1");
    calls.fail("c1", ClientCallError::Failed("rpc error: code = Internal desc = boom".into()), None);
    calls.fail("c2", ClientCallError::Failed("rpc error: code = Internal desc = boom".into()), None);
    let before = calls.calls().len();
    assert!(release(&ts, claim_of(&b, MODE, CsiVolumeClaimState::NodeDetached), ReleaseBy::Server).await.is_err());
    assert_eq!(calls.calls().len() - before, 1, "stopped at the first controller");
}

#[tokio::test]
async fn no_controller_call_while_another_live_alloc_on_the_node_holds_the_volume() {
    let (ts, calls) = server(&["c1"]).await;
    let a = claimed(&ts, "n1").await;
    let _b = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);
    release(&ts, claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await.unwrap();
    assert_eq!(calls.calls(), vec![node_detach("n1", &a)]);
    let vol = stored(&ts, "vol");
    assert!(!vol.write_allocs.contains(&a.id) && vol.write_allocs.len() == 1);
}

#[tokio::test]
async fn a_detach_claim_without_alloc_detaches_every_past_claim_on_its_node() {
    let (ts, calls) = server(&["c1"]).await;
    let a = claimed(&ts, "n1").await;
    let b = claimed(&ts, "n1").await;
    let c = claimed(&ts, "n2").await;
    for x in [&a, &b, &c] {
        finish_lost(&ts, x);
    }
    let detach = CsiVolumeClaim { node_id: "n1".into(), mode: CsiVolumeClaimMode::Gc, ..CsiVolumeClaim::default() };
    let before = stored(&ts, "vol").modify_index;
    let index = release(&ts, detach, ReleaseBy::Server).await.unwrap();
    let mut got = calls.calls();
    let controller = got.pop();
    got.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    let mut want = vec![node_detach("n1", &a), node_detach("n1", &b)];
    want.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
    assert_eq!(got, want, "both past claims on n1, none on n2");
    assert_eq!(controller, Some(controller_detach("c1", "n1")));
    // Nomad's detach claim only bumps the volume's index: the watcher frees the past claims.
    let vol = stored(&ts, "vol");
    assert!(vol.modify_index > before && index >= vol.modify_index);
    assert_eq!(vol.write_allocs.len(), 3);
}

#[tokio::test]
async fn a_claim_released_meanwhile_is_not_brought_back() {
    let (ts, calls) = server(&[]).await;
    let a = claimed(&ts, "n1").await;
    finish_lost(&ts, &a);
    let claim = claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing);
    release(&ts, claim.clone(), ReleaseBy::ClaimNode).await.unwrap();
    assert_freed(&ts, "client release");
    let index = ts.store.snapshot().index;
    release(&ts, claim.clone(), ReleaseBy::Server).await.unwrap();
    release(&ts, claim, ReleaseBy::ClaimNode).await.unwrap();
    assert_eq!(calls.calls(), vec![]);
    assert_eq!(ts.store.snapshot().index, index, "nothing written");
    assert_freed(&ts, "resent");
    let e =
        ts.endpoints.csi_release_claim("default", "nope", claim_of(&a, MODE, CsiVolumeClaimState::Unpublishing), ReleaseBy::Server).await;
    assert_eq!(e, Err(EndpointError::NotFound("no such volume".into())));
}
