//! The per-node diff of a system job: which required names to place on a
//! node, which of its allocs to stop, update, migrate, mark lost, mark
//! unknown or reconnect (Nomad's `diffSystemAllocsForNode`).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use nomad_proto::alloc::ALLOC_UNKNOWN_DESC;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Job, JobType, NodeStatus, Timestamp};

use crate::scheduler::alloc_sets::TaintedNodes;
use crate::scheduler::reschedule::ran_successfully;

/// One required or existing alloc name on one node.
pub(super) struct Tuple<'a> {
    pub(super) name: String,
    pub(super) group: Option<usize>,
    pub(super) node_id: String,
    pub(super) alloc: Option<Cow<'a, Allocation>>,
}

#[derive(Default)]
pub(super) struct Diff<'a> {
    pub(super) place: Vec<Tuple<'a>>,
    pub(super) update: Vec<Tuple<'a>>,
    pub(super) migrate: Vec<Tuple<'a>>,
    pub(super) stop: Vec<Tuple<'a>>,
    pub(super) ignore: Vec<Tuple<'a>>,
    pub(super) lost: Vec<Tuple<'a>>,
    pub(super) disconnecting: Vec<Tuple<'a>>,
    pub(super) reconnecting: Vec<Tuple<'a>>,
    /// Running on a node that no longer meets the job's constraints.
    pub(super) infeasible: Vec<Tuple<'a>>,
}

struct DiffInputs<'a, 'i> {
    pub(super) job: &'i Job,
    pub(super) sysbatch: bool,
    pub(super) required: &'i BTreeMap<String, usize>,
    pub(super) eligible: &'i HashSet<&'a str>,
    pub(super) not_ready: &'i HashSet<&'a str>,
    pub(super) tainted: &'i TaintedNodes<'a>,
    pub(super) terminal: &'i BTreeMap<(&'a str, &'a str), &'a Allocation>,
    pub(super) now: Timestamp,
}

fn supports_disconnect(a: &Allocation) -> bool {
    a.job.as_ref().and_then(|j| j.lookup_task_group(&a.task_group)).is_some_and(|g| g.supports_disconnected_clients())
}

fn tuple<'a>(name: &str, group: Option<usize>, node_id: &str, alloc: Option<Cow<'a, Allocation>>) -> Tuple<'a> {
    Tuple { name: name.to_string(), group, node_id: node_id.to_string(), alloc }
}

/// Diffs one node's live allocs against the required names.
fn diff_node<'a>(inp: &DiffInputs<'a, '_>, node_id: &'a str, allocs: &[&'a Allocation], out: &mut Diff<'a>) {
    let mut existing = BTreeSet::new();
    for &a in allocs {
        existing.insert(a.name.as_str());
        let Some(&group) = inp.required.get(&a.name) else {
            out.stop.push(tuple(&a.name, None, node_id, Some(Cow::Borrowed(a))));
            continue;
        };
        let t = |a: Cow<'a, Allocation>| tuple(&a.name.clone(), Some(group), node_id, Some(a));
        let supports = supports_disconnect(a);
        let mut reconnect = false;
        let mut expired = false;
        if supports && matches!(a.client_status, ClientStatus::Unknown | ClientStatus::Running) {
            reconnect = a.needs_to_reconnect();
            expired = reconnect && a.expired(inp.now);
        }
        if !a.terminal() && a.desired_transition.should_migrate() {
            out.migrate.push(t(Cow::Borrowed(a)));
            continue;
        }
        if inp.sysbatch && a.terminal() {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        if supports && expired {
            out.lost.push(t(Cow::Borrowed(a)));
            continue;
        }
        if supports && a.client_status == ClientStatus::Unknown && a.desired_status == DesiredStatus::Run {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        let tainted = inp.tainted.get(a.node_id.as_str());
        if supports && tainted.is_none() && reconnect {
            let mut copy = a.clone();
            copy.append_state(a.client_status, inp.now);
            out.reconnecting.push(t(Cow::Owned(copy)));
            continue;
        }
        if let Some(node) = tainted {
            if a.job_type() == JobType::Sysbatch && ran_successfully(a) {
                out.ignore.push(t(Cow::Borrowed(a)));
                continue;
            }
            if node.is_some_and(|n| n.status == NodeStatus::Disconnected) && supports && a.client_status == ClientStatus::Running {
                let mut copy = a.clone();
                copy.client_status = ClientStatus::Unknown;
                copy.append_state(ClientStatus::Unknown, inp.now);
                copy.client_description = ALLOC_UNKNOWN_DESC.to_string();
                out.disconnecting.push(t(Cow::Owned(copy)));
                continue;
            }
            if !a.terminal() && node.is_none_or(|n| n.status == NodeStatus::Down) {
                out.lost.push(t(Cow::Borrowed(a)));
            } else {
                out.ignore.push(t(Cow::Borrowed(a)));
            }
            continue;
        }
        if inp.not_ready.contains(node_id) {
            out.ignore.push(t(Cow::Borrowed(a)));
            continue;
        }
        if !inp.eligible.contains(node_id) {
            out.stop.push(t(Cow::Borrowed(a)));
            continue;
        }
        if a.job.as_ref().is_some_and(|j| j.job_modify_index != inp.job.job_modify_index) {
            out.update.push(t(Cow::Borrowed(a)));
            continue;
        }
        out.ignore.push(t(Cow::Borrowed(a)));
    }

    for (name, &group) in inp.required {
        if existing.contains(name.as_str()) {
            continue;
        }
        let terminal = inp.terminal.get(&(node_id, name.as_str())).copied();
        if inp.sysbatch
            && let Some(term) = terminal
        {
            let changed = term.job.as_ref().is_some_and(|j| j.job_modify_index != inp.job.job_modify_index);
            let t = tuple(name, Some(group), node_id, Some(Cow::Borrowed(term)));
            if changed {
                out.update.push(t)
            } else {
                out.ignore.push(t)
            }
            continue;
        }
        if inp.tainted.contains_key(node_id) || !inp.eligible.contains(node_id) {
            continue;
        }
        out.place.push(tuple(name, Some(group), node_id, terminal.map(Cow::Borrowed)));
    }
}

/// Diffs every node that has allocs of the job or is eligible for it.
/// `job` is `None` or stopped when everything should go.
pub(super) fn diff_cluster<'a>(
    job: Option<&Job>,
    sysbatch: bool,
    allocs: &[&'a Allocation],
    eligible: &HashSet<&'a str>,
    not_ready: &HashSet<&'a str>,
    tainted: &TaintedNodes<'a>,
    now: Timestamp,
) -> Diff<'a> {
    let mut required = BTreeMap::new();
    if let Some(j) = job.filter(|j| !j.stop) {
        // System allocs are named after the job's name, as in Nomad.
        let prefix = if j.name.is_empty() { &j.id } else { &j.name };
        for (gi, tg) in j.task_groups.iter().enumerate() {
            for i in 0..tg.count.max(0) {
                required.insert(format!("{prefix}.{}[{i}]", tg.name), gi);
            }
        }
    }
    // The newest terminal alloc per (node, name).
    let mut terminal: BTreeMap<(&str, &str), &Allocation> = BTreeMap::new();
    let mut by_node: BTreeMap<&str, Vec<&Allocation>> = BTreeMap::new();
    for &a in allocs {
        if a.terminal() {
            let key = (a.node_id.as_str(), a.name.as_str());
            if terminal.get(&key).is_none_or(|t| t.create_index < a.create_index) {
                terminal.insert(key, a);
            }
        } else {
            by_node.entry(a.node_id.as_str()).or_default().push(a);
        }
    }
    for id in eligible {
        by_node.entry(id).or_default();
    }
    let fallback = Job::default();
    let inputs =
        DiffInputs { job: job.unwrap_or(&fallback), sysbatch, required: &required, eligible, not_ready, tainted, terminal: &terminal, now };
    let mut diff = Diff::default();
    for (node_id, node_allocs) in &by_node {
        diff_node(&inputs, node_id, node_allocs, &mut diff);
    }
    diff
}
