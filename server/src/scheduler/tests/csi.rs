//! CSI volume feasibility: Nomad's `CSIVolumeChecker` reasons, each against the real FSM.

use nomad_proto::csi::{
    CsiInfo, CsiNodeInfo, CsiTopology, CsiVolume, CsiVolumeAccessMode, CsiVolumeAttachmentMode, CsiVolumeCapability, CsiVolumeClaim,
    CsiVolumeClaimMode, CsiVolumeClaimState,
};
use nomad_proto::volume::VolumeRequest;
use nomad_proto::{Job, Node};

use super::*;
use crate::fsm::Command;

/// A ready node running the `hostpath` node plugin.
fn plugin_node(id: &str, healthy: bool, max_volumes: i64) -> Node {
    let mut n = crate::testing::node(id);
    let info = CsiNodeInfo { id: format!("ext-{id}"), max_volumes, ..CsiNodeInfo::default() };
    n.csi_node_plugins.insert(
        "hostpath".into(),
        CsiInfo { plugin_id: "hostpath".into(), healthy, alloc_id: format!("plugin-{id}"), node_info: Some(info), ..CsiInfo::default() },
    );
    n
}

fn volume(id: &str, modes: &[CsiVolumeAccessMode]) -> CsiVolume {
    CsiVolume {
        id: id.into(),
        namespace: "default".into(),
        plugin_id: "hostpath".into(),
        requested_capabilities: modes
            .iter()
            .map(|m| CsiVolumeCapability { access_mode: *m, attachment_mode: CsiVolumeAttachmentMode::FileSystem })
            .collect(),
        ..CsiVolume::default()
    }
}

/// A service job whose group mounts `source` (`per_alloc`, `read_only` as given).
fn csi_job(id: &str, count: i64, source: &str, per_alloc: bool, read_only: bool) -> Job {
    let mut job = service_job(id, count);
    job.task_groups[0].volumes.insert(
        "data".into(),
        VolumeRequest {
            name: "data".into(),
            volume_type: "csi".into(),
            source: source.into(),
            read_only,
            per_alloc,
            access_mode: "single-node-writer".into(),
            attachment_mode: "file-system".into(),
            ..VolumeRequest::default()
        },
    );
    job
}

fn register_volume(h: &mut Harness, vol: CsiVolume) {
    h.apply(Command::CsiVolumeRegister { volumes: vec![vol] });
}

fn write_claim(h: &mut Harness, vol: &str, alloc: &Allocation) {
    let claim = CsiVolumeClaim {
        allocation_id: alloc.id.clone(),
        node_id: alloc.node_id.clone(),
        mode: CsiVolumeClaimMode::Write,
        access_mode: CsiVolumeAccessMode::SingleNodeWriter,
        attachment_mode: CsiVolumeAttachmentMode::FileSystem,
        state: CsiVolumeClaimState::Taken,
        ..CsiVolumeClaim::default()
    };
    h.apply(Command::CsiVolumeClaim { namespace: "default".into(), volume_id: vol.into(), claim });
}

/// How often `reason` filtered a node for group `web` in the outcome.
fn filtered(out: &ScheduleOutcome, reason: &str) -> i64 {
    out.eval_update.failed_tg_allocs.get("web").and_then(|m| m.constraint_filtered.get(reason)).copied().unwrap_or(0)
}

#[test]
fn a_missing_volume_blocks_the_group_and_per_alloc_sources_take_the_index() {
    let mut h = Harness::new();
    h.add_node(plugin_node("n1", true, 0));
    h.register_job(csi_job("web", 1, "vol", false, false));
    let out = h.run_job("web");
    assert!(placed(&out).is_empty());
    assert_eq!(filtered(&out, "missing CSI Volume vol"), 1);
    assert_eq!(out.new_evals.len(), 1, "a blocked eval waits for the volume");

    // `per_alloc`: alloc web.web[0] needs `vol[0]`, and `vol` itself is not enough.
    register_volume(&mut h, volume("vol", &[CsiVolumeAccessMode::SingleNodeWriter]));
    h.register_job(csi_job("web", 1, "vol", true, false));
    let out = h.run_job("web");
    assert_eq!(filtered(&out, "missing CSI Volume vol[0]"), 1);
    register_volume(&mut h, volume("vol[0]", &[CsiVolumeAccessMode::SingleNodeWriter]));
    let out = h.run_job("web");
    assert_eq!(placed(&out).len(), 1, "{:?}", out.eval_update.failed_tg_allocs);
}

#[test]
fn the_node_must_run_the_plugin_healthy_with_room_under_max_volumes() {
    let mut h = Harness::new();
    h.add_node(crate::testing::node("bare"));
    h.add_node(plugin_node("sick", false, 0));
    register_volume(&mut h, volume("vol", &[CsiVolumeAccessMode::SingleNodeWriter]));
    h.register_job(csi_job("web", 1, "vol", false, false));
    let out = h.run_job("web");
    assert!(placed(&out).is_empty());
    assert_eq!(filtered(&out, "CSI plugin hostpath is missing from client bare"), 1);
    assert_eq!(filtered(&out, "CSI plugin hostpath is unhealthy on client sick"), 1);

    // A healthy node takes it.
    h.add_node(plugin_node("good", true, 1));
    let out = h.run_job("web");
    assert_eq!(placed(&out)[0].node_id, "good");
    h.commit(&out);

    // `good` allows one volume of the plugin, and `web` has it: another job's volume must wait.
    register_volume(&mut h, volume("other", &[CsiVolumeAccessMode::SingleNodeWriter]));
    let job = csi_job("two", 1, "other", false, false);
    h.register_job(job);
    let out = h.run_job("two");
    assert!(placed(&out).is_empty());
    assert_eq!(filtered(&out, "CSI plugin hostpath has the maximum number of volumes on client good"), 1);
}

#[test]
fn writer_claims_of_another_job_exhaust_the_volume_but_the_jobs_own_do_not() {
    let mut h = Harness::new();
    h.add_node(plugin_node("n1", true, 0));
    h.add_node(plugin_node("n2", true, 0));
    register_volume(&mut h, volume("vol", &[CsiVolumeAccessMode::SingleNodeWriter]));
    h.register_job(csi_job("first", 1, "vol", false, false));
    h.run_job("first");
    let first = h.live("first")[0].clone();
    write_claim(&mut h, "vol", &first);

    // Another writer is refused on every node.
    let second = csi_job("second", 1, "vol", false, false);
    h.register_job(second);
    let out = h.run_job("second");
    assert!(placed(&out).is_empty());
    assert_eq!(filtered(&out, "CSI volume vol has exhausted its available writer claims"), 2);

    // A reader is not a writer: single-node-writer takes it (the claim decides the rest).
    let reader = csi_job("reader", 1, "vol", false, true);
    h.register_job(reader);
    assert_eq!(placed(&h.run_job("reader")).len(), 1);

    // The claim's own job may place more (a replacement waits for the release on the client).
    h.register_job(csi_job("first", 2, "vol", false, false));
    let out = h.run_job("first");
    assert_eq!(placed(&out).len(), 1, "{:?}", out.eval_update.failed_tg_allocs);

    // Once the claiming alloc is garbage collected the claim still blocks, saying why.
    h.apply(Command::EvalDelete { eval_ids: vec![], alloc_ids: vec![first.id.clone()] });
    let out = h.run_job("second");
    let why = format!(
        "CSI volume vol has exhausted its available writer claims and is claimed by a garbage collected allocation {}; waiting for claim to be released",
        first.id
    );
    assert_eq!(filtered(&out, &why), 2, "{:?}", out.eval_update.failed_tg_allocs);
}

#[test]
fn read_only_volumes_refuse_writers_and_topologies_must_match() {
    let mut h = Harness::new();
    let mut n1 = plugin_node("n1", true, 0);
    n1.csi_node_plugins.get_mut("hostpath").unwrap().node_info.as_mut().unwrap().accessible_topology =
        Some(CsiTopology { segments: [("rack".to_string(), "r1".to_string())].into() });
    h.add_node(n1);
    h.add_node(plugin_node("n2", true, 0));
    register_volume(&mut h, volume("ro", &[CsiVolumeAccessMode::MultiNodeReader]));
    h.register_job(csi_job("web", 1, "ro", false, false));
    let out = h.run_job("web");
    assert_eq!(filtered(&out, "CSI volume ro is unschedulable or is read-only"), 2);
    h.register_job(csi_job("web", 1, "ro", false, true));
    assert_eq!(placed(&h.run_job("web")).len(), 1);

    // A volume in rack r1 is only for nodes whose plugin is there.
    let mut racked = volume("racked", &[CsiVolumeAccessMode::MultiNodeReader]);
    racked.topologies = vec![CsiTopology { segments: [("rack".to_string(), "r1".to_string())].into() }];
    register_volume(&mut h, racked);
    let job = csi_job("rack", 1, "racked", false, true);
    h.register_job(job);
    let out = h.run_job("rack");
    assert_eq!(placed(&out)[0].node_id, "n1");
    // In rack r2 it fits nowhere: n1 is in r1, n2 reports no topology.
    let mut r2 = volume("r2", &[CsiVolumeAccessMode::MultiNodeReader]);
    r2.topologies = vec![CsiTopology { segments: [("rack".to_string(), "r2".to_string())].into() }];
    register_volume(&mut h, r2);
    let job = csi_job("rack2", 1, "r2", false, true);
    h.register_job(job);
    let out = h.run_job("rack2");
    assert!(placed(&out).is_empty());
    assert_eq!(filtered(&out, "did not meet topology requirement"), 2);
}
