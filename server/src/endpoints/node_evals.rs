//! Evals created when a node changes (`createNodeEvals`, `shouldCreateNodeEval`).

use std::collections::BTreeSet;

use nomad_proto::eval::trigger;
use nomad_proto::{EvalStatus, Evaluation, JobType, NamespacedId, Node, NodeStatus, Timestamp};

use crate::state::State;

/// One eval per (namespace, job) with allocs on the node (terminal ones
/// included), plus one per `system` job whose pool and datacenters include
/// the node. Deduplicated on namespace and job ID together, so same-named
/// jobs in two namespaces both get one.
pub fn create_node_evals(state: &State, node: &Node, node_index: u64, now: Timestamp) -> Vec<Evaluation> {
    let mut seen: BTreeSet<NamespacedId> = BTreeSet::new();
    let mut evals = Vec::new();
    let mut push = |ns: &str, job_id: &str, priority: i64, eval_type: JobType, job_modify_index: u64| {
        if seen.insert(NamespacedId::new(ns, job_id)) {
            evals.push(Evaluation {
                id: nomad_proto::new_id(),
                namespace: ns.to_string(),
                priority,
                eval_type,
                triggered_by: trigger::NODE_UPDATE.to_string(),
                job_id: job_id.to_string(),
                job_modify_index,
                node_id: node.id.clone(),
                node_modify_index: node_index,
                status: EvalStatus::Pending,
                create_time: now.unix_nanos(),
                modify_time: now.unix_nanos(),
                ..Evaluation::default()
            });
        }
    };
    for alloc in state.allocs_by_node(&node.id) {
        let (priority, eval_type, jmi) = match &alloc.job {
            Some(j) => (j.priority, j.job_type, j.job_modify_index),
            None => (nomad_proto::job::DEFAULT_JOB_PRIORITY, JobType::Service, 0),
        };
        push(&alloc.namespace, &alloc.job_id, priority, eval_type, jmi);
    }
    for job in state.jobs_by_type(JobType::System) {
        if node.in_pool(&job.node_pool) && node.in_any_datacenter(&job.datacenters) {
            push(&job.namespace, &job.id, job.priority, job.job_type, job.job_modify_index);
        }
    }
    evals
}

/// A status change that needs node evals: init→ready, down→ready, and any
/// change into or out of `disconnected`.
pub fn status_transition_requires_eval(new: NodeStatus, old: NodeStatus) -> bool {
    (new == NodeStatus::Ready && matches!(old, NodeStatus::Initializing | NodeStatus::Down))
        || (old == NodeStatus::Disconnected && new != NodeStatus::Disconnected)
        || (old != NodeStatus::Disconnected && new == NodeStatus::Disconnected)
}

/// Whether a (re-)registration needs node evals: the node went down, a new
/// node arrived ready, its status changed in a way that needs evals, or a
/// field feasibility depends on changed. Resources do not count: blocked
/// evals cover capacity.
pub fn should_create_node_eval(original: Option<&Node>, updated: &Node) -> bool {
    if updated.status == NodeStatus::Down {
        return true;
    }
    let Some(original) = original else {
        return status_transition_requires_eval(updated.status, NodeStatus::Initializing);
    };
    if status_transition_requires_eval(updated.status, original.status) {
        return true;
    }
    let devices = |n: &Node| n.node_resources.as_ref().map(|r| r.devices.clone()).unwrap_or_default();
    original.id != updated.id
        || original.datacenter != updated.datacenter
        || original.name != updated.name
        || original.node_class != updated.node_class
        || original.attributes != updated.attributes
        || original.meta != updated.meta
        || original.drivers != updated.drivers
        || original.host_volumes != updated.host_volumes
        || devices(original) != devices(updated)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::{Allocation, Job, TaskGroup};

    use super::*;
    use crate::state::StateStore;

    fn system_job(ns: &str, id: &str, dcs: &[&str]) -> Job {
        let mut j = Job {
            id: id.into(),
            namespace: ns.into(),
            job_type: JobType::System,
            datacenters: dcs.iter().map(|s| s.to_string()).collect(),
            task_groups: vec![TaskGroup { name: "g".into(), ..TaskGroup::default() }],
            ..Job::default()
        };
        j.canonicalize();
        j
    }

    #[test]
    fn evals_cover_jobs_with_allocs_and_matching_system_jobs_once_each() {
        let store = StateStore::new();
        let node = Node { id: "n1".into(), datacenter: "dc1".into(), node_pool: "default".into(), ..Node::default() };
        let mut service =
            Job { id: "web".into(), task_groups: vec![TaskGroup { name: "g".into(), ..TaskGroup::default() }], ..Job::default() };
        service.canonicalize();
        let sys = system_job("default", "logs", &["dc*"]);
        let elsewhere = system_job("default", "other-dc", &["dc2"]);
        store
            .write(1, |tx| {
                tx.upsert_job(service.clone())?;
                tx.upsert_job(sys.clone())?;
                tx.upsert_job(elsewhere.clone())?;
                let alloc = |id: &str, j: &Job| Allocation {
                    id: id.into(),
                    namespace: "default".into(),
                    job_id: j.id.clone(),
                    job: Some(Arc::new(j.clone())),
                    node_id: "n1".into(),
                    task_group: "g".into(),
                    ..Allocation::default()
                };
                tx.upsert_allocs_from_plan(vec![alloc("a1", &service), alloc("a2", &service), alloc("a3", &sys)]);
                Ok(())
            })
            .unwrap();
        let evals = create_node_evals(&store.snapshot(), &node, 7, Timestamp::ZERO);
        let mut jobs: Vec<_> = evals.iter().map(|e| (e.job_id.clone(), e.eval_type)).collect();
        jobs.sort();
        assert_eq!(jobs, vec![("logs".to_string(), JobType::System), ("web".to_string(), JobType::Service)]);
        assert!(evals.iter().all(|e| e.triggered_by == "node-update" && e.node_id == "n1" && e.node_modify_index == 7));
    }

    #[test]
    fn same_named_system_jobs_in_two_namespaces_both_get_evals() {
        let store = StateStore::new();
        store
            .write(1, |tx| {
                tx.upsert_namespace(nomad_proto::Namespace { name: "prod".into(), ..Default::default() });
                tx.upsert_job(system_job("default", "logs", &["dc1"]))?;
                tx.upsert_job(system_job("prod", "logs", &["dc1"]))?;
                Ok(())
            })
            .unwrap();
        let node = Node { id: "n1".into(), datacenter: "dc1".into(), node_pool: "default".into(), ..Node::default() };
        let evals = create_node_evals(&store.snapshot(), &node, 2, Timestamp::ZERO);
        let mut ns: Vec<_> = evals.iter().map(|e| e.namespace.clone()).collect();
        ns.sort();
        assert_eq!(ns, vec!["default", "prod"]);
    }

    #[test]
    fn register_evals_only_for_feasibility_relevant_changes() {
        let base = Node { id: "n1".into(), status: NodeStatus::Ready, ..Node::default() };
        assert!(!should_create_node_eval(Some(&base), &base.clone()));
        let mut meta = base.clone();
        meta.meta.insert("rack".into(), "r1".into());
        assert!(should_create_node_eval(Some(&base), &meta));
        let mut res = base.clone();
        res.node_resources = Some(Default::default());
        assert!(!should_create_node_eval(Some(&base), &res), "resources alone do not count");
        let new_init = Node { status: NodeStatus::Initializing, ..base.clone() };
        assert!(!should_create_node_eval(None, &new_init));
        assert!(should_create_node_eval(None, &base), "a new node arriving ready");
        let down = Node { status: NodeStatus::Down, ..base.clone() };
        assert!(should_create_node_eval(Some(&base), &down));
    }
}
