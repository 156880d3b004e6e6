//! Renderings of API objects that several commands share: list tables for
//! jobs, nodes, allocations and evaluations, placement-failure metrics, and
//! task event descriptions.

use nomad_proto::alloc::TaskEvent;
use nomad_proto::{AllocListStub, AllocMetric, Evaluation, JobListStub, NodeListStub};

use super::format::{format_time, go_duration, limit, relative_time, safe, table_with_header};

/// `service`, `batch/periodic`, `batch/parameterized`.
pub fn job_type_string(j: &JobListStub) -> String {
    let mut t = j.job_type.as_str().to_string();
    if j.periodic {
        t.push_str("/periodic");
    }
    if j.parameterized_job {
        t.push_str("/parameterized");
    }
    t
}

/// `running`, or `dead (stopped)` for a stopped job.
pub fn job_status_string(status: &str, stop: bool) -> String {
    if stop { format!("{status} (stopped)") } else { status.to_string() }
}

/// The job list (`job status` without an ID); a Namespace column when jobs span namespaces.
pub fn jobs(list: &[JobListStub]) -> String {
    let multi_ns = list.iter().any(|j| j.namespace != list[0].namespace);
    let mut header = vec!["ID"];
    if multi_ns {
        header.push("Namespace");
    }
    header.extend(["Type", "Priority", "Status", "Submit Date"]);
    let rows = list
        .iter()
        .map(|j| {
            let mut r = vec![j.id.clone()];
            if multi_ns {
                r.push(j.namespace.clone());
            }
            r.extend([
                job_type_string(j),
                j.priority.to_string(),
                job_status_string(j.status.as_str(), j.stop),
                format_time(j.submit_time),
            ]);
            r
        })
        .collect();
    table_with_header(&header, rows)
}

/// The node list (`node status`).
pub fn nodes(list: &[NodeListStub], len: usize, verbose: bool) -> String {
    let rows = list
        .iter()
        .map(|n| {
            let mut r = vec![
                limit(&n.id, len).to_string(),
                n.node_pool.clone(),
                n.datacenter.clone(),
                n.name.clone(),
                if n.node_class.is_empty() { "<none>".into() } else { n.node_class.clone() },
            ];
            if verbose {
                r.push(n.address.clone());
                r.push(n.version.clone());
            }
            r.extend([n.drain.to_string(), n.scheduling_eligibility.as_str().to_string(), n.status.as_str().to_string()]);
            r
        })
        .collect();
    let header: &[&str] = if verbose {
        &["ID", "Node Pool", "DC", "Name", "Class", "Address", "Version", "Drain", "Eligibility", "Status"]
    } else {
        &["ID", "Node Pool", "DC", "Name", "Class", "Drain", "Eligibility", "Status"]
    };
    table_with_header(header, rows)
}

/// An allocation table (job status, node status, eval status); `No allocations placed` when empty.
pub fn allocs(list: &[AllocListStub], len: usize, verbose: bool, now: i64) -> String {
    if list.is_empty() {
        return "No allocations placed".to_string();
    }
    let mut sorted: Vec<&AllocListStub> = list.iter().collect();
    sorted.sort_by(|a, b| b.create_index.cmp(&a.create_index).then_with(|| a.id.cmp(&b.id)));
    let rows = sorted
        .iter()
        .map(|a| {
            let mut r = vec![limit(&a.id, len).to_string()];
            if verbose {
                r.push(limit(&a.eval_id, len).to_string());
            }
            r.extend([
                limit(&a.node_id, len).to_string(),
                a.task_group.clone(),
                a.job_version.to_string(),
                a.desired_status.as_str().to_string(),
                a.client_status.as_str().to_string(),
                relative_time(a.create_time, now),
                relative_time(a.modify_time, now),
            ]);
            r
        })
        .collect();
    let header: &[&str] = if verbose {
        &["ID", "Eval ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"]
    } else {
        &["ID", "Node ID", "Task Group", "Version", "Desired", "Status", "Created", "Modified"]
    };
    table_with_header(header, rows)
}

/// Allocations that matched a prefix, with the job they belong to.
pub fn alloc_candidates(list: &[AllocListStub], len: usize, now: i64) -> String {
    let rows = list
        .iter()
        .map(|a| {
            vec![
                limit(&a.id, len).to_string(),
                limit(&a.eval_id, len).to_string(),
                a.job_id.clone(),
                a.task_group.clone(),
                a.desired_status.as_str().to_string(),
                a.client_status.as_str().to_string(),
                relative_time(a.create_time, now),
            ]
        })
        .collect();
    table_with_header(&["ID", "Eval ID", "Job ID", "Task Group", "Desired", "Status", "Created"], rows)
}

/// "true" when an eval failed to place something.
pub fn eval_failures(e: &Evaluation) -> String {
    (!e.failed_tg_allocs.is_empty()).to_string()
}

/// An evaluation table.
pub fn evals(list: &[Evaluation], len: usize) -> String {
    let rows = list
        .iter()
        .map(|e| {
            vec![
                limit(&e.id, len).to_string(),
                e.priority.to_string(),
                e.triggered_by.clone(),
                e.job_id.clone(),
                e.status.as_str().to_string(),
                eval_failures(e),
            ]
        })
        .collect();
    table_with_header(&["ID", "Priority", "Triggered By", "Job ID", "Status", "Placement Failures"], rows)
}

/// Why placements failed, one `* ...` line each, every line starting with `prefix`.
pub fn alloc_metrics(m: &AllocMetric, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    if m.nodes_evaluated == 0 {
        out.push(format!("{prefix}* No nodes were eligible for evaluation"));
    }
    for (dc, available) in &m.nodes_available {
        if *available == 0 {
            out.push(format!("{prefix}* No nodes are available in datacenter \"{dc}\""));
        }
    }
    for (class, n) in &m.class_filtered {
        out.push(format!("{prefix}* Class \"{class}\": {n} nodes excluded by filter"));
    }
    for (c, n) in &m.constraint_filtered {
        out.push(format!("{prefix}* Constraint \"{c}\": {n} nodes excluded by filter"));
    }
    if m.nodes_exhausted > 0 {
        out.push(format!("{prefix}* Resources exhausted on {} nodes", m.nodes_exhausted));
    }
    for (class, n) in &m.class_exhausted {
        out.push(format!("{prefix}* Class \"{class}\" exhausted on {n} nodes"));
    }
    for (dim, n) in &m.dimension_exhausted {
        out.push(format!("{prefix}* Dimension \"{dim}\" exhausted on {n} nodes"));
    }
    for q in &m.quota_exhausted {
        out.push(format!("{prefix}* Quota limit hit \"{q}\""));
    }
    // Names of datacenters, classes and constraints come from the servers: print them safe.
    out.into_iter().map(|l| safe(&l).into_owned()).collect()
}

/// The failed-placement block of one task group: a header and the metrics.
pub fn failed_group(group: &str, m: &AllocMetric, indent: &str) -> Vec<String> {
    let n = m.coalesced_failures + 1;
    let noun = if n == 1 { "allocation" } else { "allocations" };
    let mut out = vec![format!("{indent}Task Group \"{}\" (failed to place {n} {noun}):", safe(group))];
    out.extend(alloc_metrics(m, &format!("{indent}  ")));
    out
}

/// A human description of a task event (its display message, or one built from its fields).
pub fn describe_event(e: &TaskEvent) -> String {
    if !e.display_message.is_empty() {
        return e.display_message.clone();
    }
    use nomad_proto::alloc::task_event as t;
    let built = match e.event_type.as_str() {
        t::RECEIVED => "Task received by client".to_string(),
        t::TASK_SETUP => {
            if e.message.is_empty() {
                "Building Task Directory".to_string()
            } else {
                e.message.clone()
            }
        }
        t::STARTED => "Task started by client".to_string(),
        t::TERMINATED => {
            let mut s = format!("Exit Code: {}", e.exit_code);
            if e.signal != 0 {
                s.push_str(&format!(", Signal: {}", e.signal));
            }
            if !e.message.is_empty() {
                s.push_str(&format!(", Exit Message: {:?}", e.message));
            }
            s
        }
        t::RESTARTING => {
            let mut s = format!("Task restarting in {}", go_duration(e.start_delay));
            if !e.restart_reason.is_empty() {
                s = format!("{} - {s}", e.restart_reason);
            }
            s
        }
        t::NOT_RESTARTING => {
            if e.restart_reason.is_empty() {
                "Error was unrecoverable".to_string()
            } else {
                e.restart_reason.clone()
            }
        }
        t::KILLING => format!("Sent interrupt. Waiting {} before force killing", go_duration(e.kill_timeout)),
        t::KILLED => "Task successfully killed".to_string(),
        t::DRIVER_FAILURE => {
            if e.driver_error.is_empty() {
                "Failure from driver".to_string()
            } else {
                format!("Failed to start task: {}", e.driver_error)
            }
        }
        t::SETUP_FAILURE => format!("Task setup failed: {}", e.message),
        t::SIBLING_FAILED => "Task's sibling failed".to_string(),
        t::RESTART_SIGNAL => "User requested task to restart".to_string(),
        t::DOWNLOADING_ARTIFACTS => "Client is downloading artifacts".to_string(),
        t::ARTIFACT_DOWNLOAD_FAILED => {
            if e.download_error.is_empty() {
                "Failed to download artifacts".to_string()
            } else {
                e.download_error.clone()
            }
        }
        _ => String::new(),
    };
    if built.is_empty() { e.message.clone() } else { built }
}

/// The newest `max` events of a task, newest first, as table rows (Time, Type, Description).
pub fn event_rows(events: &[TaskEvent], max: usize) -> Vec<Vec<String>> {
    let mut ev: Vec<&TaskEvent> = events.iter().collect();
    ev.sort_by_key(|e| std::cmp::Reverse(e.time));
    ev.into_iter().take(max).map(|e| vec![format_time(e.time), e.event_type.clone(), describe_event(e)]).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn metrics_name_the_constraint_and_the_exhausted_dimension() {
        let mut m = AllocMetric { nodes_evaluated: 3, nodes_exhausted: 1, coalesced_failures: 2, ..AllocMetric::default() };
        m.constraint_filtered.insert("${attr.kernel.name} = windows".into(), 2);
        m.dimension_exhausted.insert("memory".into(), 1);
        m.nodes_available = BTreeMap::from([("dc1".to_string(), 3), ("dc9".to_string(), 0)]);
        let lines = failed_group("web", &m, "");
        assert_eq!(
            lines,
            vec![
                "Task Group \"web\" (failed to place 3 allocations):",
                "  * No nodes are available in datacenter \"dc9\"",
                "  * Constraint \"${attr.kernel.name} = windows\": 2 nodes excluded by filter",
                "  * Resources exhausted on 1 nodes",
                "  * Dimension \"memory\" exhausted on 1 nodes",
            ]
        );
        let mut hostile = AllocMetric { nodes_evaluated: 1, ..AllocMetric::default() };
        hostile.class_filtered.insert("gpu\u{1b}[2J".into(), 1);
        let lines = failed_group("g\nforged line", &hostile, "");
        assert_eq!(
            lines,
            vec![
                "Task Group \"g\\nforged line\" (failed to place 1 allocation):",
                "  * Class \"gpu\\u{1b}[2J\": 1 nodes excluded by filter"
            ]
        );
        let none = AllocMetric::default();
        assert_eq!(failed_group("g", &none, "  ")[0], "  Task Group \"g\" (failed to place 1 allocation):");
        assert_eq!(alloc_metrics(&none, "")[0], "* No nodes were eligible for evaluation");
    }

    #[test]
    fn task_events_describe_themselves() {
        let e = TaskEvent { event_type: "Terminated".into(), exit_code: 3, ..TaskEvent::default() };
        assert_eq!(describe_event(&e), "Exit Code: 3");
        let e = TaskEvent { event_type: "Driver Failure".into(), driver_error: "no such file".into(), ..TaskEvent::default() };
        assert_eq!(describe_event(&e), "Failed to start task: no such file");
        let e = TaskEvent { event_type: "Started".into(), display_message: "custom".into(), ..TaskEvent::default() };
        assert_eq!(describe_event(&e), "custom");
        let e = TaskEvent { event_type: "Mystery".into(), message: "m".into(), ..TaskEvent::default() };
        assert_eq!(describe_event(&e), "m");
        let rows = event_rows(
            &[
                TaskEvent { event_type: "Received".into(), time: 1, ..TaskEvent::default() },
                TaskEvent { event_type: "Started".into(), time: 3, ..TaskEvent::default() },
                TaskEvent { event_type: "Task Setup".into(), time: 2, ..TaskEvent::default() },
            ],
            2,
        );
        assert_eq!(rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>(), vec!["Started", "Task Setup"], "newest first, capped");
    }
}
