//! Reconciler table tests: one per bucket and per disconnect/reconnect case
//! of the reference §3.

use std::collections::BTreeMap;
use std::sync::Arc;

use nomad_proto::alloc::{
    ALLOC_JOB_STOPPED_DESC, ALLOC_LOST_DESC, ALLOC_MIGRATING_DESC, ALLOC_NOT_NEEDED_DESC, ALLOC_RECONNECTED_DESC, ALLOC_RESCHEDULED_DESC,
    ALLOC_UNKNOWN_DESC, NodeScoreMeta, RescheduleEvent, RescheduleTracker, TaskState,
};
use nomad_proto::eval::trigger;
use nomad_proto::job::UpdateStrategy;
use nomad_proto::plan::DesiredUpdates;
use nomad_proto::{
    AllocMetric, Allocation, ClientStatus, Deployment, DesiredStatus, Evaluation, Job, JobType, Node, NodeStatus, ReschedulePolicy,
    TaskGroup, Timestamp,
};

use super::{ReconcileResults, Reconciler, UpdateKind};
use crate::scheduler::alloc_sets::TaintedNodes;
use crate::scheduler::ids::IdSource;
use crate::scheduler::updates::destructive_change;
use crate::testing;

const S: i64 = 1_000_000_000;
const NOW: Timestamp = Timestamp(1_700_000_000 * S);
const EVAL: &str = "eval-1";

fn job_with(count: i64, f: impl FnOnce(&mut Job)) -> Arc<Job> {
    let mut j = testing::job("web", count);
    f(&mut j);
    j.canonicalize();
    j.create_index = 1;
    j.job_modify_index = 1;
    j.modify_index = 1;
    Arc::new(j)
}

fn job(count: i64) -> Arc<Job> {
    job_with(count, |_| {})
}

fn disconnect_job(count: i64, secs: i64) -> Arc<Job> {
    job_with(count, |j| j.task_groups[0].max_client_disconnect = Some(secs * S))
}

/// A newer version of `job` (a destructive change when `destructive`).
fn bump(job: &Job, destructive: bool) -> Arc<Job> {
    let mut j = job.clone();
    j.version += 1;
    j.job_modify_index += 10;
    if destructive {
        j.task_groups[0].tasks[0].env.insert("V".into(), j.version.to_string());
    } else {
        // Restart policies apply on the client: not destructive.
        j.task_groups[0].tasks[0].restart_policy.as_mut().unwrap().attempts += 1;
    }
    Arc::new(j)
}

fn alloc(job: &Arc<Job>, i: u64, node: &str, status: ClientStatus) -> Allocation {
    Allocation {
        id: format!("a{i}-{node}"),
        namespace: "default".into(),
        name: format!("web.web[{i}]"),
        node_id: node.into(),
        job_id: "web".into(),
        job: Some(job.clone()),
        task_group: "web".into(),
        client_status: status,
        create_index: 10 + i,
        modify_time: NOW.unix_nanos(),
        ..Allocation::default()
    }
}

fn node(id: &str, status: NodeStatus) -> Node {
    Node { status, ..testing::node(id) }
}

/// Everything the reconciler decided, owned.
#[derive(Debug, Default)]
struct Summary {
    place: Vec<(String, Option<String>, bool, bool)>,
    destructive: Vec<(String, String)>,
    inplace: Vec<String>,
    stop: Vec<(String, Option<ClientStatus>, &'static str, String)>,
    attribute: BTreeMap<String, Allocation>,
    disconnect: BTreeMap<String, Allocation>,
    reconnect: BTreeMap<String, Allocation>,
    desired: BTreeMap<String, DesiredUpdates>,
    followups: Vec<Evaluation>,
    rolling: Option<Timestamp>,
    deployment: Option<Deployment>,
    deployment_updates: Vec<(String, String, String)>,
    deployment_id: Option<String>,
    /// Names placed as canaries.
    canaries: Vec<String>,
    /// Names placed with the previous alloc's (older) job version.
    downgrades: Vec<String>,
}

impl Summary {
    fn stop_of(&self, id: &str) -> Option<&(String, Option<ClientStatus>, &'static str, String)> {
        self.stop.iter().find(|s| s.0 == id)
    }

    fn placed_names(&self) -> Vec<&str> {
        self.place.iter().map(|p| p.0.as_str()).collect()
    }
}

/// Replacements and fresh names in the order the scheduler places them.
fn in_placement_order(res: &ReconcileResults<'_>) -> Vec<(String, Option<String>, bool, bool)> {
    let mut out = Vec::new();
    for i in 0..=res.place.len() {
        for f in res.fresh.iter().filter(|f| f.before == i) {
            out.extend(f.names().into_iter().map(|n| (n, None, false, false)));
        }
        if let Some(p) = res.place.get(i) {
            out.push((p.name.clone(), p.previous.map(|a| a.id.clone()), p.reschedule, p.lost));
        }
    }
    out
}

fn reconcile_at(job: Option<&Job>, allocs: &[Allocation], tainted: &[Node], now: Timestamp, batch: bool) -> Summary {
    reconcile_full(job, allocs, tainted, now, batch, None)
}

fn reconcile_full(
    job: Option<&Job>,
    allocs: &[Allocation],
    tainted: &[Node],
    now: Timestamp,
    batch: bool,
    deployment: Option<&Deployment>,
) -> Summary {
    let refs: Vec<&Allocation> = allocs.iter().collect();
    let mut tainted_map = TaintedNodes::new();
    for n in tainted {
        tainted_map.insert(n.id.as_str(), if n.status == NodeStatus::Initializing && n.name == "missing" { None } else { Some(n) });
    }
    let current = job.cloned();
    let mut update_fn = |a: &Allocation, tg: &TaskGroup| {
        let (Some(new), Some(old)) = (current.as_ref(), a.job.as_deref()) else { return UpdateKind::Ignore };
        if old.job_modify_index == new.job_modify_index {
            UpdateKind::Ignore
        } else if destructive_change(new, old, &tg.name).is_some() {
            UpdateKind::Destructive
        } else {
            UpdateKind::InPlace(Box::new(a.clone()))
        }
    };
    let ids = IdSource::new(EVAL, 1);
    let mut r = Reconciler {
        job,
        job_id: "web",
        batch,
        tainted: &tainted_map,
        eval_id: EVAL,
        eval_priority: 50,
        now,
        ids: &ids,
        update_fn: &mut update_fn,
        deployment,
    };
    let res = r.compute(&refs);
    Summary {
        place: in_placement_order(&res),
        destructive: res.destructive_update.iter().map(|d| (d.name.clone(), d.stop.id.clone())).collect(),
        inplace: res.inplace_update.iter().map(|a| a.id.clone()).collect(),
        stop: res.stop.iter().map(|s| (s.alloc.id.clone(), s.client_status, s.description, s.followup_eval_id.clone())).collect(),
        attribute: res.attribute_updates.clone(),
        disconnect: res.disconnect_updates.clone(),
        reconnect: res.reconnect_updates.clone(),
        desired: res.desired_tg_updates.clone(),
        followups: res.followup_evals.clone(),
        rolling: res.rolling_wait_until,
        deployment: res.deployment.clone(),
        deployment_updates: res
            .deployment_updates
            .iter()
            .map(|u| (u.deployment_id.clone(), u.status.clone(), u.status_description.clone()))
            .collect(),
        deployment_id: res.deployment_id.clone(),
        canaries: res.place.iter().filter(|p| p.canary).map(|p| p.name.clone()).collect(),
        downgrades: res.place.iter().filter(|p| p.downgrade).map(|p| p.name.clone()).collect(),
    }
}

fn reconcile(job: &Job, allocs: &[Allocation], tainted: &[Node]) -> Summary {
    reconcile_at(Some(job), allocs, tainted, NOW, job.job_type == JobType::Batch)
}

fn running(job: &Arc<Job>, n: u64) -> Vec<Allocation> {
    (0..n).map(|i| alloc(job, i, &format!("n{i}"), ClientStatus::Running)).collect()
}

// ---- counts ---------------------------------------------------------------

#[test]
fn new_job_places_count_allocs_named_by_index() {
    let j = job(3);
    let s = reconcile(&j, &[], &[]);
    assert_eq!(s.placed_names(), vec!["web.web[0]", "web.web[1]", "web.web[2]"]);
    assert_eq!(s.desired["web"].place, 3);
    assert!(s.stop.is_empty());
}

#[test]
fn unchanged_job_is_ignored() {
    let j = job(2);
    let s = reconcile(&j, &running(&j, 2), &[]);
    assert!(s.place.is_empty() && s.stop.is_empty());
    assert_eq!(s.desired["web"].ignore, 2);
}

#[test]
fn count_down_stops_the_highest_indexes() {
    let j = job(5);
    let allocs = running(&j, 5);
    let smaller = job(3);
    let s = reconcile(&smaller, &allocs, &[]);
    let mut stopped: Vec<&str> = s.stop.iter().map(|x| x.0.as_str()).collect();
    stopped.sort();
    assert_eq!(stopped, vec!["a3-n3", "a4-n4"]);
    assert!(s.stop.iter().all(|x| x.2 == ALLOC_NOT_NEEDED_DESC));
    assert_eq!(s.desired["web"].stop, 2);
}

#[test]
fn count_up_reuses_free_indexes() {
    let j = job(4);
    let allocs = vec![alloc(&j, 0, "n0", ClientStatus::Running), alloc(&j, 2, "n2", ClientStatus::Running)];
    let s = reconcile(&j, &allocs, &[]);
    assert_eq!(s.placed_names(), vec!["web.web[1]", "web.web[3]"]);
}

#[test]
fn removed_group_is_stopped() {
    let j = job(1);
    let mut other = alloc(&j, 0, "n0", ClientStatus::Running);
    other.task_group = "gone".into();
    other.name = "web.gone[0]".into();
    let s = reconcile(&j, &[other], &[]);
    assert_eq!(s.stop.len(), 1);
    assert_eq!(s.desired["gone"].stop, 1);
    assert_eq!(s.place.len(), 1, "the current group is still placed");
}

// ---- job updates ----------------------------------------------------------

#[test]
fn non_destructive_change_updates_in_place() {
    let j = job(2);
    let allocs = running(&j, 2);
    let s = reconcile(&bump(&j, false), &allocs, &[]);
    assert_eq!(s.inplace.len(), 2);
    assert!(s.destructive.is_empty() && s.place.is_empty() && s.stop.is_empty());
    assert_eq!(s.desired["web"].in_place_update, 2);
}

#[test]
fn destructive_change_replaces_all_without_update_strategy() {
    let j = job_with(3, |j| j.job_type = JobType::Batch);
    let allocs = running(&j, 3);
    let s = reconcile(&bump(&j, true), &allocs, &[]);
    assert_eq!(s.destructive.len(), 3);
    assert_eq!(s.desired["web"].destructive_update, 3);
    assert_eq!(s.rolling, None);
}

#[test]
fn destructive_updates_roll_max_parallel_at_a_time_in_a_new_deployment() {
    let j = job_with(3, |j| j.update = Some(UpdateStrategy { max_parallel: 1, ..UpdateStrategy::default_service() }));
    let allocs = running(&j, 3);
    let s = reconcile(&bump(&j, true), &allocs, &[]);
    assert_eq!(s.destructive.len(), 1);
    assert_eq!(s.destructive[0].0, "web.web[0]", "lowest index first");
    assert_eq!(s.desired["web"].ignore, 2);
    assert_eq!(s.rolling, None, "the deployment watcher evaluates again as health arrives");
    let d = s.deployment.expect("a deployment for the new version");
    assert_eq!((d.job_version, d.status.as_str()), (1, "running"));
    assert_eq!(d.task_groups["web"].desired_total, 3);
    assert_eq!(d.task_groups["web"].progress_deadline, 600 * S);
    assert_eq!(s.deployment_id.as_deref(), Some(d.id.as_str()), "new allocs join it");
}

#[test]
fn a_successful_deployment_is_done_and_a_replacement_of_the_same_version_starts_none() {
    let j = job_with(2, |j| j.update = Some(UpdateStrategy { max_parallel: 1, ..UpdateStrategy::default_service() }));
    let mut allocs = running(&j, 2);
    allocs[1].client_status = ClientStatus::Failed;
    let done = Deployment { status: "successful".into(), ..Deployment::new("d0".into(), &j, 50) };
    let s = reconcile_full(Some(&j), &allocs, &[], NOW, false, Some(&done));
    assert_eq!(s.followups.len(), 1, "the failed alloc is rescheduled: {s:?}");
    assert!(s.deployment.is_none() && s.deployment_updates.is_empty() && s.deployment_id.is_none(), "{s:?}");
}

/// A deployment of `job` in which `allocs` were placed (health as given).
fn deployed(job: &Job, allocs: &mut [Allocation], health: &[Option<bool>]) -> Deployment {
    let mut d = Deployment::new("d1".into(), job, 50);
    d.task_groups.insert("web".into(), nomad_proto::DeploymentState { desired_total: 3, ..Default::default() });
    for (a, h) in allocs.iter_mut().zip(health) {
        a.deployment_id = d.id.clone();
        a.job = Some(Arc::new(job.clone()));
        a.deployment_status = Some(serde_json::json!({ "Healthy": h }));
        if *h == Some(true) {
            d.task_groups.get_mut("web").unwrap().healthy_allocs += 1;
        }
    }
    d
}

#[test]
fn a_deployment_waits_for_health_before_the_next_batch_and_stops_on_an_unhealthy_alloc() {
    let j = job_with(3, |j| j.update = Some(UpdateStrategy { max_parallel: 1, ..UpdateStrategy::default_service() }));
    let v2 = bump(&j, true);
    let mut allocs = running(&j, 3);
    // web[0] replaced by a new-version alloc whose health is not known yet: nothing more.
    let d = deployed(&v2, &mut allocs[..1], &[None]);
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert!(s.destructive.is_empty() && s.deployment.is_none() && s.deployment_updates.is_empty(), "{s:?}");
    assert_eq!(s.deployment_id.as_deref(), Some("d1"));
    // Healthy: the next one goes.
    let d = deployed(&v2, &mut allocs[..1], &[Some(true)]);
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.destructive.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(), ["web.web[1]"]);
    // Unhealthy: nothing goes.
    let d = deployed(&v2, &mut allocs[..1], &[Some(false)]);
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert!(s.destructive.is_empty());
    // Paused or failed: nothing goes either, though health is fine.
    for status in ["paused", "failed"] {
        let mut d = deployed(&v2, &mut allocs[..1], &[Some(true)]);
        d.status = status.into();
        let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
        assert!(s.destructive.is_empty(), "{status}");
    }
}

#[test]
fn a_deployment_succeeds_when_every_alloc_is_healthy_and_is_cancelled_by_a_newer_version_or_a_stop() {
    let j = job_with(3, |j| j.update = Some(UpdateStrategy { max_parallel: 1, ..UpdateStrategy::default_service() }));
    let v2 = bump(&j, true);
    let mut allocs = running(&v2, 3);
    let d = deployed(&v2, &mut allocs, &[Some(true), Some(true), None]);
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert!(s.deployment_updates.is_empty(), "one is not healthy yet");
    let d = deployed(&v2, &mut allocs, &[Some(true), Some(true), Some(true)]);
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.deployment_updates, [("d1".to_string(), "successful".to_string(), "Deployment completed successfully".to_string())]);

    let v3 = bump(&v2, true);
    let s = reconcile_full(Some(&v3), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.deployment_updates[0].1, "cancelled");
    assert_eq!(s.deployment_updates[0].2, "Cancelled due to newer version of job");
    assert!(s.deployment.as_ref().is_some_and(|n| n.id != "d1" && n.job_version == v3.version), "and a new one starts");

    let mut stopped = (*v2).clone();
    stopped.stop = true;
    let s = reconcile_full(Some(&stopped), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.deployment_updates, [("d1".to_string(), "cancelled".to_string(), "Cancelled because job is stopped".to_string())]);
}

// ---- canaries -----------------------------------------------------------------

fn canary_job(auto_promote: bool) -> Arc<Job> {
    job_with(3, |j| j.update = Some(UpdateStrategy { max_parallel: 1, canary: 1, auto_promote, ..UpdateStrategy::default_service() }))
}

/// `job`'s canary `c0` named `web.web[0]` in deployment `d`, health as given.
fn canary(job: &Arc<Job>, d: &mut Deployment, healthy: Option<bool>) -> Allocation {
    let mut c = alloc(job, 0, "n9", ClientStatus::Running);
    c.id = "c0".into();
    c.deployment_id = d.id.clone();
    c.deployment_status = Some(serde_json::json!({ "Healthy": healthy, "Canary": !d.task_groups["web"].promoted }));
    let g = d.task_groups.get_mut("web").unwrap();
    g.placed_canaries = vec!["c0".into()];
    g.healthy_allocs = i64::from(healthy == Some(true));
    c
}

#[test]
fn a_destructive_change_places_canaries_first_and_replaces_the_rest_only_after_promotion() {
    let v1 = canary_job(false);
    let v2 = bump(&v1, true);
    let old = running(&v1, 3);

    // First: one canary beside the three old allocs, under the name it will replace.
    let s = reconcile(&v2, &old, &[]);
    assert_eq!(s.canaries, ["web.web[0]"]);
    assert!(s.destructive.is_empty() && s.stop.is_empty(), "{s:?}");
    assert_eq!((s.desired["web"].canary, s.desired["web"].ignore), (1, 3));
    let mut d = s.deployment.clone().expect("a deployment");
    assert_eq!((d.task_groups["web"].desired_canaries, d.task_groups["web"].desired_total), (1, 3));
    assert_eq!(d.status_description, "Deployment is running but requires manual promotion");

    // Placed, then healthy: nothing more happens until it is promoted.
    for health in [None, Some(true)] {
        let mut allocs = old.clone();
        allocs.push(canary(&v2, &mut d, health));
        let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
        assert!(s.place.is_empty() && s.destructive.is_empty() && s.stop.is_empty(), "{health:?}: {s:?}");
        assert!(s.deployment_updates.is_empty(), "not complete while it waits for promotion");
    }

    // Promoted: the old alloc under the canary's name stops, the rest roll max_parallel at a time.
    d.task_groups.get_mut("web").unwrap().promoted = true;
    let mut allocs = old.clone();
    allocs.push(canary(&v2, &mut d, Some(true)));
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.stop.iter().map(|s| (s.0.as_str(), s.2)).collect::<Vec<_>>(), [("a0-n0", "alloc not needed due to job update")]);
    assert_eq!(s.destructive, [("web.web[1]".to_string(), "a1-n1".to_string())]);
    assert!(s.canaries.is_empty());
}

#[test]
fn auto_promote_is_said_in_the_description_of_the_new_deployment() {
    let v1 = canary_job(true);
    let s = reconcile(&bump(&v1, true), &running(&v1, 3), &[]);
    assert_eq!(s.deployment.unwrap().status_description, "Deployment is running pending automatic promotion");
}

#[test]
fn canaries_of_a_failed_or_replaced_deployment_are_stopped() {
    let v1 = canary_job(false);
    let v2 = bump(&v1, true);
    let mut d = reconcile(&v2, &running(&v1, 3), &[]).deployment.unwrap();
    let mut allocs = running(&v1, 3);
    allocs.push(canary(&v2, &mut d, Some(false)));

    d.status = "failed".into();
    let s = reconcile_full(Some(&v2), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.stop_of("c0").map(|s| s.2), Some("alloc not needed due to job update"), "{s:?}");
    assert!(s.place.is_empty() && s.destructive.is_empty(), "a failed deployment places nothing: {s:?}");

    // A newer version while canarying: its canary goes, the new version places its own.
    d.status = "running".into();
    let v3 = bump(&v2, true);
    let s = reconcile_full(Some(&v3), &allocs, &[], NOW, false, Some(&d));
    assert_eq!(s.deployment_updates[0].2, "Cancelled due to newer version of job");
    assert_eq!(s.stop_of("c0").map(|s| s.2), Some("alloc not needed due to job update"));
    assert_eq!(s.canaries, ["web.web[0]"]);

    // A canary whose task failed is stopped, not rescheduled; one already stopped is left be.
    allocs.last_mut().unwrap().client_status = ClientStatus::Failed;
    let s = reconcile_full(Some(&v3), &allocs, &[], NOW, false, Some(&d));
    assert!(s.stop_of("c0").is_some() && s.followups.is_empty(), "{s:?}");
    allocs.last_mut().unwrap().desired_status = nomad_proto::DesiredStatus::Stop;
    let s = reconcile_full(Some(&v3), &allocs, &[], NOW, false, Some(&d));
    assert!(s.stop_of("c0").is_none(), "{s:?}");
}

#[test]
fn an_old_alloc_lost_while_canarying_is_replaced_with_its_own_version() {
    let v1 = canary_job(false);
    let v2 = bump(&v1, true);
    let mut d = reconcile(&v2, &running(&v1, 3), &[]).deployment.unwrap();
    let mut allocs = running(&v1, 3);
    allocs.push(canary(&v2, &mut d, None));
    let s = reconcile_full(Some(&v2), &allocs, &[node("n1", NodeStatus::Down)], NOW, false, Some(&d));
    assert_eq!(s.stop_of("a1-n1").map(|s| s.1), Some(Some(ClientStatus::Lost)));
    assert_eq!(s.downgrades, ["web.web[1]"], "{s:?}");
    assert!(s.canaries.is_empty() && s.destructive.is_empty());
}

// ---- stop -------------------------------------------------------------------

#[test]
fn stopped_job_stops_every_live_alloc() {
    let j = job(3);
    let mut allocs = running(&j, 3);
    allocs[2].node_id = "down".into();
    allocs[2].id = "a2-down".into();
    let mut done = alloc(&j, 7, "n0", ClientStatus::Complete);
    done.desired_status = DesiredStatus::Stop;
    allocs.push(done);
    let mut stopped = (*j).clone();
    stopped.stop = true;
    let s = reconcile(&stopped, &allocs, &[node("down", NodeStatus::Down)]);
    assert_eq!(s.stop.len(), 3, "the finished alloc is left alone");
    assert_eq!(s.stop_of("a0-n0").unwrap().2, ALLOC_JOB_STOPPED_DESC);
    let lost = s.stop_of("a2-down").unwrap();
    assert_eq!((lost.1, lost.2), (Some(ClientStatus::Lost), ALLOC_LOST_DESC));
    assert!(s.place.is_empty());
    assert_eq!(s.desired["web"].stop, 3);
}

#[test]
fn purged_job_stops_everything_too() {
    let j = job(2);
    let s = reconcile_at(None, &running(&j, 2), &[], NOW, false);
    assert_eq!(s.stop.len(), 2);
    assert!(s.place.is_empty());
}

// ---- rescheduling -------------------------------------------------------

fn failed(job: &Arc<Job>, i: u64, failed_at: Timestamp) -> Allocation {
    let mut a = alloc(job, i, &format!("n{i}"), ClientStatus::Failed);
    let mut states = BTreeMap::new();
    states.insert("server".to_string(), TaskState { state: "dead".into(), failed: true, finished_at: failed_at, ..TaskState::default() });
    a.task_states = Some(states);
    a
}

fn policy_job(delay_fn: &str, delay: i64, attempts: i64, unlimited: bool) -> Arc<Job> {
    job_with(1, |j| {
        j.task_groups[0].reschedule_policy = Some(ReschedulePolicy {
            attempts,
            interval: 3600 * S,
            delay: delay * S,
            delay_function: delay_fn.into(),
            max_delay: 600 * S,
            unlimited,
        });
    })
}

#[test]
fn failed_alloc_past_its_delay_is_rescheduled_now() {
    let j = policy_job("constant", 5, 0, true);
    let a = failed(&j, 0, NOW.add_nanos(-10 * S));
    let s = reconcile(&j, &[a], &[]);
    assert_eq!(s.place.len(), 1);
    assert_eq!(s.place[0], ("web.web[0]".into(), Some("a0-n0".into()), true, false));
    assert_eq!(s.stop_of("a0-n0").unwrap().2, ALLOC_RESCHEDULED_DESC);
    assert!(s.followups.is_empty());
}

#[test]
fn failed_alloc_within_its_delay_gets_a_followup_eval() {
    for (function, events, want_delay) in [("constant", vec![], 5), ("exponential", vec![5, 10], 20), ("fibonacci", vec![5, 5, 10], 15)] {
        let j = policy_job(function, 5, 0, true);
        let mut a = failed(&j, 0, NOW);
        if !events.is_empty() {
            let events = events
                .iter()
                .map(|d| RescheduleEvent { reschedule_time: NOW.unix_nanos() - 100 * S, delay: d * S, ..RescheduleEvent::default() })
                .collect();
            a.reschedule_tracker = Some(RescheduleTracker { events });
        }
        let s = reconcile(&j, &[a], &[]);
        assert!(s.place.is_empty(), "{function}");
        assert!(s.stop.is_empty(), "{function}");
        assert_eq!(s.followups.len(), 1, "{function}");
        let e = &s.followups[0];
        assert_eq!(e.triggered_by, trigger::RETRY_FAILED_ALLOC);
        assert_eq!(e.wait_until, NOW.add_nanos(want_delay * S), "{function}");
        assert_eq!(s.attribute["a0-n0"].followup_eval_id, e.id, "{function}");
    }
}

#[test]
fn followup_evals_batch_allocs_within_five_seconds() {
    let j = policy_job("constant", 30, 0, true);
    let j3 = Arc::new(Job { task_groups: vec![TaskGroup { count: 3, ..j.task_groups[0].clone() }], ..(*j).clone() });
    let allocs = vec![failed(&j3, 0, NOW), failed(&j3, 1, NOW.add_nanos(2 * S)), failed(&j3, 2, NOW.add_nanos(20 * S))];
    let s = reconcile(&j3, &allocs, &[]);
    assert_eq!(s.followups.len(), 2);
    assert_eq!(s.attribute["a0-n0"].followup_eval_id, s.attribute["a1-n1"].followup_eval_id);
    assert_ne!(s.attribute["a0-n0"].followup_eval_id, s.attribute["a2-n2"].followup_eval_id);
}

#[test]
fn the_followup_eval_itself_reschedules_now() {
    let j = policy_job("constant", 30, 0, true);
    let mut a = failed(&j, 0, NOW);
    a.followup_eval_id = EVAL.into();
    let s = reconcile(&j, &[a], &[]);
    assert_eq!(s.place.len(), 1);
    assert!(s.followups.is_empty());
}

#[test]
fn attempts_exhausted_leaves_the_failed_alloc() {
    let j = policy_job("constant", 5, 1, false);
    let mut a = failed(&j, 0, NOW.add_nanos(-60 * S));
    a.reschedule_tracker = Some(RescheduleTracker {
        events: vec![RescheduleEvent { reschedule_time: NOW.unix_nanos() - 120 * S, delay: 5 * S, ..Default::default() }],
    });
    let s = reconcile(&j, &[a], &[]);
    assert!(s.place.is_empty() && s.stop.is_empty() && s.followups.is_empty());
}

#[test]
fn batch_alloc_that_completed_is_not_rerun() {
    let j = job_with(1, |j| j.job_type = JobType::Batch);
    let mut a = alloc(&j, 0, "n0", ClientStatus::Complete);
    let mut states = BTreeMap::new();
    states.insert("server".to_string(), TaskState { state: "dead".into(), ..TaskState::default() });
    a.task_states = Some(states);
    let s = reconcile(&j, &[a], &[]);
    assert!(s.place.is_empty() && s.stop.is_empty());
}

#[test]
fn service_alloc_that_completed_is_replaced() {
    let j = job(1);
    let a = alloc(&j, 0, "n0", ClientStatus::Complete);
    let s = reconcile(&j, &[a], &[]);
    assert_eq!(s.placed_names(), vec!["web.web[0]"]);
}

// ---- nodes ------------------------------------------------------------------

#[test]
fn alloc_on_down_node_is_lost_and_replaced() {
    let j = job(1);
    let a = alloc(&j, 0, "n0", ClientStatus::Running);
    let s = reconcile(&j, &[a], &[node("n0", NodeStatus::Down)]);
    let stop = s.stop_of("a0-n0").unwrap();
    assert_eq!((stop.1, stop.2), (Some(ClientStatus::Lost), ALLOC_LOST_DESC));
    assert_eq!(s.place, vec![("web.web[0]".into(), Some("a0-n0".into()), false, true)]);
}

#[test]
fn alloc_on_missing_node_is_lost() {
    let j = job(1);
    let a = alloc(&j, 0, "gone", ClientStatus::Running);
    let missing = Node { id: "gone".into(), name: "missing".into(), status: NodeStatus::Initializing, ..Node::default() };
    let s = reconcile(&j, &[a], &[missing]);
    assert_eq!(s.stop_of("a0-gone").unwrap().1, Some(ClientStatus::Lost));
    assert_eq!(s.place.len(), 1);
}

#[test]
fn migrating_alloc_is_stopped_and_replaced() {
    let j = job(2);
    let mut allocs = running(&j, 2);
    allocs[1].desired_transition.migrate = Some(true);
    let mut draining = node("n1", NodeStatus::Ready);
    draining.drain_strategy = Some(Default::default());
    let s = reconcile(&j, &allocs, &[draining]);
    assert_eq!(s.stop_of("a1-n1").unwrap().2, ALLOC_MIGRATING_DESC);
    assert_eq!(s.place, vec![("web.web[1]".into(), Some("a1-n1".into()), false, false)]);
    assert_eq!(s.desired["web"].migrate, 1);
}

#[test]
fn draining_node_without_migrate_flag_is_left_alone() {
    let j = job(1);
    let mut draining = node("n0", NodeStatus::Ready);
    draining.drain_strategy = Some(Default::default());
    let s = reconcile(&j, &running(&j, 1), &[draining]);
    assert!(s.place.is_empty() && s.stop.is_empty());
}

#[test]
fn lost_with_stop_after_client_disconnect_waits() {
    let j = job_with(1, |j| j.task_groups[0].stop_after_client_disconnect = Some(30 * S));
    let a = alloc(&j, 0, "n0", ClientStatus::Running);
    let s = reconcile(&j, &[a], &[node("n0", NodeStatus::Down)]);
    assert!(s.place.is_empty(), "no replacement while the lost alloc may still be stopping");
    assert_eq!(s.followups.len(), 1);
    assert_eq!(s.followups[0].wait_until, NOW.add_nanos(30 * S + 5 * S), "delay plus the kill timeout");
    let stop = s.stop_of("a0-n0").unwrap();
    assert_eq!((stop.1, stop.3.as_str()), (Some(ClientStatus::Lost), s.followups[0].id.as_str()));
}

// ---- disconnect / reconnect (reference §3) --------------------------------

fn unknown(job: &Arc<Job>, i: u64, node: &str, since: Timestamp) -> Allocation {
    let mut a = alloc(job, i, node, ClientStatus::Unknown);
    a.append_state(ClientStatus::Unknown, since);
    a
}

fn scored(mut a: Allocation, score: f64) -> Allocation {
    a.metrics = Some(AllocMetric {
        score_meta_data: vec![NodeScoreMeta { node_id: a.node_id.clone(), norm_score: score, ..Default::default() }],
        ..Default::default()
    });
    a
}

#[test]
fn disconnecting_alloc_is_marked_unknown_and_replaced_once() {
    let j = disconnect_job(1, 60);
    let a = alloc(&j, 0, "n0", ClientStatus::Running);
    let s = reconcile(&j, &[a], &[node("n0", NodeStatus::Disconnected)]);
    let u = &s.disconnect["a0-n0"];
    assert_eq!(u.client_status, ClientStatus::Unknown);
    assert_eq!(u.client_description, ALLOC_UNKNOWN_DESC);
    assert!(u.needs_to_reconnect());
    assert_eq!(u.alloc_states.last().unwrap().time, NOW);
    assert_eq!(s.followups.len(), 1);
    let e = &s.followups[0];
    assert_eq!((e.triggered_by.as_str(), e.wait_until), (trigger::MAX_DISCONNECT_TIMEOUT, NOW.add_nanos(60 * S)));
    assert_eq!(u.followup_eval_id, e.id);
    assert_eq!(s.place, vec![("web.web[0]".into(), Some("a0-n0".into()), true, false)]);
    assert!(s.stop.is_empty(), "the original keeps running");
    assert_eq!(s.desired["web"].place, 1);
}

#[test]
fn disconnect_without_support_is_lost() {
    let j = job(1);
    let s = reconcile(&j, &[alloc(&j, 0, "n0", ClientStatus::Running)], &[node("n0", NodeStatus::Disconnected)]);
    assert_eq!(s.stop_of("a0-n0").unwrap().1, Some(ClientStatus::Lost));
    assert!(s.disconnect.is_empty());
    assert_eq!(s.place.len(), 1);
}

#[test]
fn pending_alloc_on_disconnected_node_is_lost() {
    let j = disconnect_job(1, 60);
    let s = reconcile(&j, &[alloc(&j, 0, "n0", ClientStatus::Pending)], &[node("n0", NodeStatus::Disconnected)]);
    assert_eq!(s.stop_of("a0-n0").unwrap().1, Some(ClientStatus::Lost));
    assert!(s.disconnect.is_empty());
}

#[test]
fn unknown_alloc_is_ignored_while_away_and_not_replaced_again() {
    let j = disconnect_job(1, 60);
    let orig = unknown(&j, 0, "n0", NOW.add_nanos(-10 * S));
    let mut repl = alloc(&j, 0, "n1", ClientStatus::Running);
    repl.id = "repl".into();
    repl.create_index = 50;
    let s = reconcile(&j, &[orig, repl], &[node("n0", NodeStatus::Disconnected)]);
    assert!(s.place.is_empty() && s.stop.is_empty() && s.disconnect.is_empty());
    assert_eq!(s.desired["web"].ignore, 2);
}

#[test]
fn node_ready_but_alloc_still_unknown_is_ignored() {
    // The node came back but the client has not reported yet.
    let j = disconnect_job(1, 60);
    let orig = unknown(&j, 0, "n0", NOW.add_nanos(-10 * S));
    let mut repl = alloc(&j, 0, "n1", ClientStatus::Running);
    repl.id = "repl".into();
    repl.create_index = 50;
    let s = reconcile(&j, &[orig, repl], &[]);
    assert!(s.place.is_empty() && s.stop.is_empty() && s.reconnect.is_empty());
}

#[test]
fn node_still_disconnected_but_alloc_running_is_not_reconnected() {
    // The other order: the alloc reads running while the node is still disconnected.
    let j = disconnect_job(1, 60);
    let mut orig = alloc(&j, 0, "n0", ClientStatus::Running);
    orig.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    let s = reconcile(&j, &[orig], &[node("n0", NodeStatus::Disconnected)]);
    assert!(s.reconnect.is_empty());
    assert!(s.stop.is_empty(), "the original is never stopped while away");
    assert_eq!(s.disconnect["a0-n0"].client_status, ClientStatus::Unknown, "marked unknown again");
}

#[test]
fn an_alloc_disconnecting_again_before_its_reconnect_settled_keeps_its_one_replacement() {
    // Back and running (the reconnect not recorded yet), then away again: its replacement still runs.
    let j = disconnect_job(1, 60);
    let mut orig = alloc(&j, 0, "n0", ClientStatus::Running);
    orig.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    let s = reconcile(&j, &[orig, replacement(&j, ClientStatus::Running)], &[node("n0", NodeStatus::Disconnected)]);
    assert_eq!(s.disconnect["a0-n0"].client_status, ClientStatus::Unknown, "marked unknown again");
    assert!(s.place.is_empty(), "one replacement per disconnected alloc, not {:?}", s.place);
    assert!(s.stop.is_empty());
}

#[test]
fn a_lost_alloc_is_not_replaced_under_a_name_a_live_copy_carries() {
    // web[1]'s replacement lost a reconnect to the original, then its node went down;
    // web[0] has no copy left. The count is made up with web[0], not a second web[1].
    let j = disconnect_job(2, 60);
    let kept = alloc(&j, 1, "n0", ClientStatus::Running);
    let mut loser = alloc(&j, 1, "n1", ClientStatus::Unknown);
    loser.id = "loser".into();
    loser.create_index = 50;
    loser.desired_status = DesiredStatus::Stop;
    loser.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    let s = reconcile(&j, &[kept, loser], &[node("n1", NodeStatus::Down)]);
    assert_eq!(s.stop_of("loser").unwrap().1, Some(ClientStatus::Lost));
    assert_eq!(s.placed_names(), ["web.web[0]"]);
}

#[test]
fn expired_unknown_alloc_is_lost_and_replacement_kept() {
    let j = disconnect_job(1, 60);
    let orig = unknown(&j, 0, "n0", NOW.add_nanos(-61 * S));
    let mut repl = alloc(&j, 0, "n1", ClientStatus::Running);
    repl.id = "repl".into();
    repl.create_index = 50;
    let s = reconcile(&j, &[orig.clone(), repl], &[node("n0", NodeStatus::Disconnected)]);
    let stop = s.stop_of("a0-n0").unwrap();
    assert_eq!((stop.1, stop.2), (Some(ClientStatus::Lost), ALLOC_LOST_DESC));
    assert!(s.place.is_empty(), "the replacement already counts");
    // Without a replacement, one is placed.
    let s = reconcile(&j, &[orig], &[node("n0", NodeStatus::Disconnected)]);
    assert_eq!(s.place.len(), 1);
}

fn reconnect_case(orig: Allocation, repl: Allocation, job: &Job) -> Summary {
    reconcile(job, &[orig, repl], &[])
}

fn replacement(job: &Arc<Job>, status: ClientStatus) -> Allocation {
    let mut r = alloc(job, 0, "n1", status);
    r.id = "repl".into();
    r.create_index = 50;
    r.previous_allocation = "a0-n0".into();
    r
}

fn reconnected(job: &Arc<Job>) -> Allocation {
    let mut a = alloc(job, 0, "n0", ClientStatus::Running);
    a.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    a
}

#[test]
fn reconnect_with_equal_scores_keeps_the_original() {
    let j = disconnect_job(1, 60);
    let s = reconnect_case(scored(reconnected(&j), 0.5), scored(replacement(&j, ClientStatus::Running), 0.5), &j);
    let stop = s.stop_of("repl").unwrap();
    assert_eq!(stop.2, ALLOC_RECONNECTED_DESC);
    assert!(s.stop_of("a0-n0").is_none());
    let r = &s.reconnect["a0-n0"];
    assert_eq!(r.alloc_states.last().unwrap().value, "running", "running appended after unknown");
    assert!(!r.needs_to_reconnect());
    assert!(s.place.is_empty());
}

#[test]
fn better_scored_running_replacement_wins() {
    let j = disconnect_job(1, 60);
    let s = reconnect_case(scored(reconnected(&j), 0.5), scored(replacement(&j, ClientStatus::Running), 0.9), &j);
    assert_eq!(s.stop_of("a0-n0").unwrap().2, ALLOC_NOT_NEEDED_DESC);
    assert!(s.stop_of("repl").is_none());
    assert!(s.reconnect.is_empty());
    assert!(s.place.is_empty());
}

#[test]
fn better_scored_pending_replacement_loses_to_running_original() {
    let j = disconnect_job(1, 60);
    let s = reconnect_case(scored(reconnected(&j), 0.5), scored(replacement(&j, ClientStatus::Pending), 0.9), &j);
    assert_eq!(s.stop_of("repl").unwrap().2, ALLOC_RECONNECTED_DESC);
    assert!(s.reconnect.contains_key("a0-n0"));
}

#[test]
fn newer_replacement_wins_over_older_version_original() {
    let j = disconnect_job(1, 60);
    let orig = reconnected(&j);
    let newer = bump(&j, true);
    let mut repl = replacement(&newer, ClientStatus::Running);
    repl.job = Some(newer.clone());
    let s = reconnect_case(orig, repl, &newer);
    assert_eq!(s.stop_of("a0-n0").unwrap().2, ALLOC_NOT_NEEDED_DESC);
    assert!(s.stop_of("repl").is_none());
    assert!(s.reconnect.is_empty());
}

#[test]
fn older_version_reconnect_is_stopped_even_without_replacement() {
    let j = disconnect_job(1, 60);
    let newer = bump(&j, true);
    let s = reconcile(&newer, &[reconnected(&j)], &[]);
    assert_eq!(s.stop_of("a0-n0").unwrap().2, ALLOC_NOT_NEEDED_DESC);
    assert_eq!(s.placed_names(), vec!["web.web[0]"], "a current-version alloc is placed");
}

#[test]
fn failed_reconnect_is_stopped_and_replacement_kept() {
    let j = disconnect_job(1, 60);
    let mut orig = alloc(&j, 0, "n0", ClientStatus::Failed);
    orig.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    let s = reconnect_case(orig, replacement(&j, ClientStatus::Running), &j);
    let stop = s.stop_of("a0-n0").unwrap();
    assert_eq!((stop.1, stop.2), (Some(ClientStatus::Failed), ALLOC_RESCHEDULED_DESC));
    assert!(s.stop_of("repl").is_none());
    assert!(s.place.is_empty());
}

#[test]
fn reconnect_on_a_draining_node_after_expiry_is_lost() {
    let j = disconnect_job(1, 60);
    let mut draining = node("n0", NodeStatus::Ready);
    draining.drain_strategy = Some(Default::default());
    let mut a = alloc(&j, 0, "n0", ClientStatus::Running);
    a.client_status = ClientStatus::Unknown;
    a.append_state(ClientStatus::Unknown, NOW.add_nanos(-61 * S));
    let s = reconcile(&j, &[a.clone()], &[draining.clone()]);
    assert_eq!(s.stop_of("a0-n0").unwrap().1, Some(ClientStatus::Lost));
    // Within the window it reconnects (and is kept: no replacement exists).
    a.client_status = ClientStatus::Running;
    a.alloc_states.clear();
    a.append_state(ClientStatus::Unknown, NOW.add_nanos(-10 * S));
    let s = reconcile(&j, &[a], &[draining]);
    assert!(s.reconnect.contains_key("a0-n0"));
}

#[test]
fn several_replacements_all_lose_to_the_original() {
    let j = disconnect_job(1, 60);
    let mut second = replacement(&j, ClientStatus::Running);
    second.id = "repl2".into();
    second.create_index = 60;
    let allocs = vec![reconnected(&j), replacement(&j, ClientStatus::Running), second];
    let s = reconcile(&j, &allocs, &[]);
    assert_eq!(s.stop_of("repl").unwrap().2, ALLOC_RECONNECTED_DESC);
    assert_eq!(s.stop_of("repl2").unwrap().2, ALLOC_RECONNECTED_DESC);
    assert!(s.place.is_empty());
}

#[test]
fn forced_reschedule_ignores_exhausted_attempts() {
    let j = policy_job("constant", 5, 1, false);
    let mut a = failed(&j, 0, NOW.add_nanos(-60 * S));
    a.reschedule_tracker = Some(RescheduleTracker {
        events: vec![RescheduleEvent { reschedule_time: NOW.unix_nanos() - 120 * S, delay: 5 * S, ..Default::default() }],
    });
    a.desired_transition.force_reschedule = Some(true);
    let s = reconcile(&j, &[a], &[]);
    assert_eq!(s.place, vec![("web.web[0]".into(), Some("a0-n0".into()), true, false)]);
}

#[test]
fn failed_batch_alloc_uses_the_batch_policy() {
    let j = job_with(1, |j| j.job_type = JobType::Batch);
    assert_eq!(j.task_groups[0].reschedule_policy.as_ref().unwrap().attempts, 1);
    let s = reconcile(&j, &[failed(&j, 0, NOW.add_nanos(-10 * S))], &[]);
    assert_eq!(s.place.len(), 1, "first failure: rescheduled after 5 s");
    let mut again = failed(&j, 0, NOW.add_nanos(-10 * S));
    again.reschedule_tracker = Some(RescheduleTracker {
        events: vec![RescheduleEvent { reschedule_time: NOW.unix_nanos() - 60 * S, delay: 5 * S, ..Default::default() }],
    });
    let s = reconcile(&j, &[again], &[]);
    assert!(s.place.is_empty(), "one attempt per 24 h");
}
