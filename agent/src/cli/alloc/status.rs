//! `nomad-rs alloc status [-json] [-verbose] [-short] <id prefix>`.

use clap::Args;
use nomad_proto::{Allocation, TaskState};

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{Style, format_time, kv, limit, mib, now_nanos, or_none, relative_time, table_with_header};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix, tables};

/// Flags of `alloc status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Full IDs and every task event.
    #[arg(long)]
    pub verbose: bool,
    /// Only the allocation's details and task states.
    #[arg(long)]
    pub short: bool,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
}

/// Runs `alloc status`.
pub async fn run(api: &ApiFlags, args: StatusArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    show(&ctx, &args.alloc, args.verbose, args.json, args.short).await
}

/// Shows one allocation (also `nomad-rs status <alloc prefix>`).
pub async fn show(ctx: &Ctx, id_prefix: &str, verbose: bool, json: bool, short: bool) -> CmdResult {
    let stub = prefix::alloc(ctx, id_prefix).await?;
    let path = format!("/v1/allocation/{}", encode_path(&stub.id));
    if json {
        return ctx.print_json(&path, &Query::new(), "Error querying allocation").await;
    }
    let alloc = ctx
        .client
        .get::<Allocation>(&path, &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying allocation: {e}")))?
        .value;
    // Usage comes from the client running the alloc; without it the table shows what was asked.
    let stats = if alloc.client_status == nomad_proto::ClientStatus::Running && !short {
        let path = format!("/v1/client/allocation/{}/stats", encode_path(&alloc.id));
        ctx.client.get_json(&path, &Query::new()).await.ok().map(|a| a.value)
    } else {
        None
    };
    // Nomad service check results, from the client too; nothing shown when there are none.
    let checks = if short {
        None
    } else {
        let path = format!("/v1/client/allocation/{}/checks", encode_path(&alloc.id));
        ctx.client.get_json(&path, &Query::new()).await.ok().map(|a| a.value)
    };
    println!("{}", render_all(&alloc, verbose, short, now_nanos(), &ctx.style, stats.as_ref(), checks.as_ref()));
    Ok(exit::OK)
}

/// Nomad's `formatAllocNomadServiceChecks`: one row per check result, sorted; `None` when there
/// are none.
pub fn nomad_service_checks(results: &serde_json::Value) -> Option<String> {
    let map = results.as_object().filter(|m| !m.is_empty())?;
    let text = |v: &serde_json::Value, key: &str| v.get(key).and_then(|s| s.as_str()).unwrap_or_default().to_string();
    let mut rows: Vec<Vec<String>> = map
        .values()
        .map(|r| {
            let task = text(r, "Task");
            let task = if task.is_empty() { "(group)".to_string() } else { task };
            vec![text(r, "Service"), task, text(r, "Check"), text(r, "Mode"), text(r, "Status")]
        })
        .collect();
    rows.sort();
    Some(format!("Nomad Service Checks:\n{}", table_with_header(&["Service", "Task", "Name", "Mode", "Status"], rows)))
}

/// The whole `alloc status` output.
pub fn render(a: &Allocation, verbose: bool, short: bool, now: i64, style: &Style) -> String {
    render_with_usage(a, verbose, short, now, style, None)
}

/// `alloc status` with the tasks' usage (`/v1/client/allocation/<id>/stats`) when known.
pub fn render_with_usage(a: &Allocation, verbose: bool, short: bool, now: i64, style: &Style, stats: Option<&serde_json::Value>) -> String {
    render_all(a, verbose, short, now, style, stats, None)
}

/// `alloc status` with the usage and the Nomad service check results
/// (`/v1/client/allocation/<id>/checks`) when known.
pub fn render_all(
    a: &Allocation,
    verbose: bool,
    short: bool,
    now: i64,
    style: &Style,
    stats: Option<&serde_json::Value>,
    checks: Option<&serde_json::Value>,
) -> String {
    let len = if verbose { usize::MAX } else { 8 };
    let mut out = vec![details(a, len, verbose, now)];
    if let Some(m) = a.metrics.as_ref().filter(|m| verbose && m.nodes_evaluated > 0) {
        out.push(style.section("Placement Metrics"));
        let mut lines =
            vec![format!("Nodes evaluated: {}, filtered: {}, exhausted: {}", m.nodes_evaluated, m.nodes_filtered, m.nodes_exhausted)];
        lines.extend(tables::alloc_metrics(m, "  "));
        out.push(lines.join("\n"));
    }
    // After the alloc's details, before the tasks, as Nomad prints it.
    if let Some(section) = checks.and_then(nomad_service_checks) {
        out.push(format!("\n{section}"));
    }
    let states = a.task_states.clone().unwrap_or_default();
    let mut names = super::task_names(a);
    for n in states.keys() {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    for name in names {
        let state = states.get(&name).cloned().unwrap_or_default();
        let shown = if state.state.is_empty() { "pending" } else { state.state.as_str() };
        out.push(style.section(&format!("Task {name:?} is {shown:?}")));
        let usage = stats.map(|s| &s["Tasks"][&name]["ResourceUsage"]).filter(|u| !u.is_null() && state.state == "running");
        out.push(task_block(a, &name, &state, verbose, short, usage));
    }
    out.join("\n")
}

fn details(a: &Allocation, len: usize, verbose: bool, now: i64) -> String {
    let time = |ns: i64| if verbose { format_time(ns) } else { relative_time(ns, now) };
    let mut pairs = vec![
        ("ID", limit(&a.id, len).to_string()),
        ("Eval ID", limit(&a.eval_id, len).to_string()),
        ("Name", a.name.clone()),
        ("Node ID", limit(&a.node_id, len).to_string()),
        ("Node Name", a.node_name.clone()),
        ("Job ID", a.job_id.clone()),
        ("Job Version", a.job.as_ref().map(|j| j.version).unwrap_or_default().to_string()),
        ("Client Status", a.client_status.as_str().to_string()),
        ("Client Description", or_none(&a.client_description)),
        ("Desired Status", a.desired_status.as_str().to_string()),
        ("Desired Description", or_none(&a.desired_description)),
        ("Created", time(a.create_time)),
        ("Modified", time(a.modify_time)),
    ];
    if !a.deployment_id.is_empty() {
        pairs.push(("Deployment ID", limit(&a.deployment_id, len).to_string()));
    }
    if !a.previous_allocation.is_empty() {
        pairs.push(("Replacement Alloc ID", limit(&a.previous_allocation, len).to_string()));
    }
    if !a.next_allocation.is_empty() {
        pairs.push(("Replaced By Alloc ID", limit(&a.next_allocation, len).to_string()));
    }
    if !a.followup_eval_id.is_empty() {
        pairs.push(("Reschedule Eval", limit(&a.followup_eval_id, len).to_string()));
    }
    kv(&pairs)
}

fn task_block(a: &Allocation, task: &str, state: &TaskState, verbose: bool, short: bool, usage: Option<&serde_json::Value>) -> String {
    let mut out = Vec::new();
    if !short {
        out.push("Task Resources:".to_string());
        out.push(task_resources(a, task, usage));
        out.push(String::new());
    }
    out.push("Task Events:".to_string());
    let restart = if state.last_restart.is_zero() { "N/A".to_string() } else { format_time(state.last_restart.unix_nanos()) };
    out.push(kv(&[
        ("Started At", format_time(state.started_at.unix_nanos())),
        ("Finished At", format_time(state.finished_at.unix_nanos())),
        ("Total Restarts", state.restarts.to_string()),
        ("Last Restart", restart),
    ]));
    out.push(String::new());
    out.push("Recent Events:".to_string());
    let rows = tables::event_rows(&state.events, if verbose { usize::MAX } else { 10 });
    out.push(table_with_header(&["Time", "Type", "Description"], rows));
    out.join("\n")
}

/// go-humanize's `IBytes`: one decimal under 10, none above.
pub fn ibytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / 1024f64.ln()).floor().min(5.0) as i32;
    let v = n as f64 / 1024f64.powi(e);
    if v < 10.0 { format!("{:.1} {}", v, UNITS[e as usize]) } else { format!("{:.0} {}", v, UNITS[e as usize]) }
}

fn task_resources(a: &Allocation, task: &str, usage: Option<&serde_json::Value>) -> String {
    let res = a.allocated_resources.as_ref();
    let t = res.and_then(|r| r.tasks.get(task));
    let cpu = t.map(|t| t.cpu.cpu_shares).unwrap_or_default();
    let mem = t.map(|t| t.memory.memory_mb).unwrap_or_default();
    let disk = res.map(|r| r.shared.disk_mb).unwrap_or_default();
    let mut addrs: Vec<String> =
        res.map(|r| r.shared.ports.iter().map(|p| format!("{}: {}:{}", p.label, p.host_ip, p.value)).collect()).unwrap_or_default();
    if addrs.is_empty() {
        for n in res.into_iter().flat_map(|r| r.shared.networks.iter()).chain(t.into_iter().flat_map(|t| t.networks.iter())) {
            for p in n.reserved_ports.iter().chain(n.dynamic_ports.iter()) {
                addrs.push(format!("{}: {}:{}", p.label, n.ip, p.value));
            }
        }
    }
    let addrs = if addrs.is_empty() { "<none>".to_string() } else { addrs.join(", ") };
    // As Nomad: used/asked, CPU in MHz (ticks of one core), memory as RSS (else usage).
    let (cpu, mem) = match usage {
        Some(u) => {
            let ticks = u["CpuStats"]["TotalTicks"].as_f64().unwrap_or(0.0).floor();
            let m = &u["MemoryStats"];
            let used = m["RSS"].as_u64().filter(|r| *r > 0).or_else(|| m["Usage"].as_u64()).unwrap_or(0);
            (format!("{ticks}/{cpu} MHz"), format!("{}/{}", ibytes(used), mib(mem)))
        }
        None => (format!("{cpu} MHz"), mib(mem)),
    };
    table_with_header(&["CPU", "Memory", "Disk", "Addresses"], vec![vec![cpu, mem, mib(disk), addrs]])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nomad_proto::TaskEvent;
    use nomad_proto::resources::{AllocatedPortMapping, AllocatedResources, AllocatedTaskResources};

    use super::*;

    #[test]
    fn tasks_show_resources_addresses_and_events() {
        let mut task = AllocatedTaskResources::default();
        task.cpu.cpu_shares = 100;
        task.memory.memory_mb = 300;
        let mut res = AllocatedResources { tasks: BTreeMap::from([("web".to_string(), task)]), ..AllocatedResources::default() };
        res.shared.disk_mb = 300;
        res.shared.ports.push(AllocatedPortMapping { label: "http".into(), value: 23456, to: 0, host_ip: "127.0.0.1".into() });
        let state = TaskState {
            state: "running".into(),
            events: vec![
                TaskEvent { event_type: "Received".into(), time: 1_000_000_000, ..TaskEvent::default() },
                TaskEvent { event_type: "Started".into(), time: 2_000_000_000, ..TaskEvent::default() },
            ],
            ..TaskState::default()
        };
        let a = Allocation {
            id: "0af996ed-aff4-8ddb-a566-e55ebf8969c9".into(),
            name: "web.web[0]".into(),
            client_status: nomad_proto::ClientStatus::Running,
            allocated_resources: Some(res),
            task_states: Some(BTreeMap::from([("web".to_string(), state)])),
            create_time: 1_000_000_000,
            ..Allocation::default()
        };
        let out = render(&a, false, false, 64_000_000_000, &Style::plain());
        assert!(out.starts_with("ID                  = 0af996ed\n"), "{out}");
        assert!(out.contains("Created             = 1m3s ago"), "{out}");
        assert!(out.contains("\nTask \"web\" is \"running\"\nTask Resources:\nCPU      Memory   Disk     Addresses\n100 MHz  300 MiB  300 MiB  http: 127.0.0.1:23456"), "{out}");
        let usage = serde_json::json!({"Tasks": {"web": {"ResourceUsage": {
            "CpuStats": {"TotalTicks": 42.7}, "MemoryStats": {"RSS": 1_258_291, "Usage": 2_000_000}
        }}}});
        let with = render_with_usage(&a, false, false, 64_000_000_000, &Style::plain(), Some(&usage));
        assert!(with.contains("42/100 MHz  1.2 MiB/300 MiB  300 MiB"), "{with}");
        assert_eq!((ibytes(5), ibytes(4096), ibytes(300 << 20)), ("5 B".to_string(), "4.0 KiB".to_string(), "300 MiB".to_string()));
        let checks = serde_json::json!({
            "b": {"ID": "b", "Mode": "healthiness", "Status": "success", "Output": "nomad: http ok", "Timestamp": 1, "Group": "web.web[0]",
                  "Task": "web", "Service": "web", "Check": "health"},
            "a": {"ID": "a", "Mode": "readiness", "Status": "pending", "Output": "nomad: waiting to run", "Timestamp": 1,
                  "Group": "web.web[0]", "Service": "api", "Check": "alive"}
        });
        let with = render_all(&a, false, false, 64_000_000_000, &Style::plain(), None, Some(&checks));
        let want = "\n\nNomad Service Checks:\nService  Task     Name    Mode         Status\napi      (group)  alive   readiness    pending\nweb      web      health  healthiness  success\n\nTask \"web\"";
        assert!(with.contains(want), "{with}");
        assert_eq!(nomad_service_checks(&serde_json::Value::Null), None, "no section without checks");
        let started = out.find("Task started by client").unwrap();
        let received = out.find("Task received by client").unwrap();
        assert!(started < received, "newest event first:\n{out}");
    }
}
