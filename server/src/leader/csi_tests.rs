//! The volume watcher and the claim GC over a `TestServer` (`LocalConsensus`), with a recording
//! `ClientCsi`: claims whose client never reported are released by the servers.

use std::sync::Arc;
use std::time::Duration;

use nomad_proto::csi::{CsiVolumeAccessMode, CsiVolumeClaimState};
use nomad_proto::{Allocation, ClientStatus, NodeStatus};

use super::*;
use crate::consensus::Consensus;
use crate::csi::ClientCallError;
use crate::fsm::Command;
use crate::sim::{FirstReadyNode, start_leader};
use crate::test_support::eventually;
use crate::testing::csi::{claim_of, finish_lost, place_alloc, plugin_node, register, set_status, volume};
use crate::testing::{CsiCall, RecordingClientCsi, TestServer};

const MODE: CsiVolumeAccessMode = CsiVolumeAccessMode::MultiNodeMultiWriter;

/// A ready node n1 running the node plugin, and volume `vol` (no controller).
async fn server() -> (TestServer, Arc<RecordingClientCsi>) {
    let calls = RecordingClientCsi::new();
    let ts = TestServer::new().with_client_csi(calls.clone());
    plugin_node(&ts, "n1", true, false).await;
    set_status(&ts, "n1", NodeStatus::Ready);
    register(&ts, volume("vol", MODE)).await;
    (ts, calls)
}

/// An alloc on n1 holding a write claim on `vol`.
async fn claimed(ts: &TestServer) -> Allocation {
    let a = place_alloc(ts, "n1", ClientStatus::Running);
    let claim = claim_of(&a, MODE, CsiVolumeClaimState::Taken);
    ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim }).await.unwrap();
    a
}

fn freed(s: &crate::state::State) -> bool {
    s.csi_volume("default", "vol").is_some_and(|v| !v.in_use() && v.past_claims.is_empty())
}

fn fast() -> VolumeWatcherConfig {
    VolumeWatcherConfig { retry_min: Duration::from_millis(20), retry_max: Duration::from_millis(100), parallel: 4 }
}

#[tokio::test]
async fn the_claim_gc_marks_a_volume_whose_alloc_ended_unreported_and_the_watcher_releases_it() {
    let (ts, calls) = server().await;
    let a = claimed(&ts).await;
    let watcher = tokio::spawn(VolumeWatcher::new(Arc::new(ts.endpoints.clone()), fast()).run());
    // The watcher's first pass has run once it has reaped something: a write to the volume it
    // reacts to (a client's report that stopped at the node step, say).
    let other = claimed_elsewhere(&ts).await;
    calls
        .wait_for("the watcher is running", |c| {
            c.iter().any(|c| matches!(c, CsiCall::NodeDetach { alloc_id, .. } if *alloc_id == other.id))
        })
        .await;
    eventually(&ts, "the other claim released", |s| !s.csi_volume("default", "vol").unwrap().write_allocs.contains(&other.id)).await;

    finish_lost(&ts, &a);
    let before = ts.store.snapshot().csi_volume("default", "vol").unwrap().modify_index;
    assert!(ts.store.snapshot().csi_volume("default", "vol").unwrap().in_use(), "nothing released the claim yet");

    // The GC pass: only volumes created at or below the threshold index are looked at.
    let gc = ClaimGc::new(Arc::new(ts.endpoints.clone()), ClaimGcConfig::default());
    let created = ts.store.snapshot().csi_volume("default", "vol").unwrap().create_index;
    assert_eq!(gc.collect(created - 1).await, 0, "a volume newer than the threshold is left alone");
    assert_eq!(gc.collect(created).await, 1);

    let s = eventually(&ts, "the watcher released the claim", freed).await;
    assert!(s.csi_volume("default", "vol").unwrap().modify_index > before);
    // The servers asked the (live) node to unmount: its client never did.
    let want = CsiCall::NodeDetach { node_id: "n1".into(), alloc_id: a.id.clone(), external_id: "vol".into() };
    calls.wait_for("node detach", |c| c.contains(&want)).await;
    // Nothing left to collect.
    assert_eq!(gc.collect(u64::MAX).await, 0);
    watcher.abort();
}

/// A claim of a second alloc on n1 whose release stopped after the checkpoint (a past
/// claim in `unpublishing`, written to the volume).
async fn claimed_elsewhere(ts: &TestServer) -> Allocation {
    let a = claimed(ts).await;
    let mut claim = ts.store.snapshot().csi_volume("default", "vol").unwrap().write_claims[&a.id].clone();
    claim.state = CsiVolumeClaimState::Unpublishing;
    ts.consensus.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: "vol".into(), claim }).await.unwrap();
    a
}

#[tokio::test]
async fn a_failed_reap_is_retried_on_a_timer_until_the_plugin_is_back() {
    let (ts, calls) = server().await;
    let a = claimed(&ts).await;
    finish_lost(&ts, &a);
    calls.fail("n1", ClientCallError::Failed("rpc error: code = Unavailable desc = plugin restarting".into()), None);
    // A new term's first pass looks at every volume with past claims.
    let watcher = tokio::spawn(VolumeWatcher::new(Arc::new(ts.endpoints.clone()), fast()).run());
    calls.wait_for("the first try and a retry", |c| c.len() >= 2).await;
    let s = ts.store.snapshot();
    let vol = s.csi_volume("default", "vol").unwrap();
    assert!(vol.write_allocs.contains(&a.id), "still claimed");
    assert_eq!(vol.past_claims[&a.id].state, CsiVolumeClaimState::Unpublishing, "checkpointed where it failed");

    // The plugin comes back; no write to the volume happens, the timer retries.
    calls.heal("n1");
    eventually(&ts, "released on a retry", freed).await;
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_runs_the_claim_gc_and_the_watcher() {
    let (ts, calls) = server().await;
    let a = claimed(&ts).await;
    let config = LeaderConfig {
        num_schedulers: 1,
        evals_in_flight: 2,
        volume_watcher: fast(),
        csi_claim_gc: ClaimGcConfig { interval: Duration::from_millis(50), threshold: Duration::ZERO },
        ..LeaderConfig::default()
    };
    let (_leader, task) = start_leader(&ts, Arc::new(FirstReadyNode), config);
    // Whether the watcher's first pass or the GC's mark finds it, the leader releases it.
    finish_lost(&ts, &a);
    eventually(&ts, "released by the leader's GC and watcher", freed).await;
    assert_eq!(calls.calls().len(), 1);
    task.abort();
}
