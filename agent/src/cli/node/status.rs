//! `nomad-rs node status [-self] [-verbose] [-json] [<id prefix>]`.

use clap::Args;
use nomad_proto::{AllocStubFields, Allocation, Node, NodeListStub};

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{format_time, go_duration, kv, mib, now_nanos, or_none, table_with_header};
use crate::cli::{CmdResult, Ctx, Failure, exit, tables};

/// Flags of `node status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The node of the local agent.
    #[arg(long = "self")]
    pub self_: bool,
    /// Full IDs, addresses, attributes and meta.
    #[arg(long)]
    pub verbose: bool,
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Node ID or prefix; none lists all nodes.
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
}

/// Runs `node status`.
pub async fn run(api: &ApiFlags, args: StatusArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    if !args.self_ && args.node.is_none() {
        return list(&ctx, &args).await;
    }
    let id = super::node_id(&ctx, args.self_, args.node.as_deref()).await?;
    show(&ctx, &id, args.verbose, args.json).await
}

async fn list(ctx: &Ctx, args: &StatusArgs) -> CmdResult {
    if args.json {
        return ctx.print_json("/v1/nodes", &Query::new(), "Error querying node status").await;
    }
    let nodes = ctx
        .client
        .get::<Vec<NodeListStub>>("/v1/nodes", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying node status: {e}")))?
        .value;
    if nodes.is_empty() {
        println!("No nodes registered");
    } else {
        println!("{}", tables::nodes(&nodes, ctx.id_len(args.verbose), args.verbose));
    }
    Ok(exit::OK)
}

/// Shows one node (also `nomad-rs status <node prefix>`).
pub async fn show(ctx: &Ctx, id: &str, verbose: bool, json: bool) -> CmdResult {
    let path = format!("/v1/node/{}", encode_path(id));
    if json {
        return ctx.print_json(&path, &Query::new(), "Error querying node info").await;
    }
    let node =
        ctx.client.get::<Node>(&path, &Query::new()).await.map_err(|e| Failure::new(format!("Error querying node info: {e}")))?.value;
    let allocs = ctx
        .client
        .get::<Vec<Allocation>>(&format!("{path}/allocations"), &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying node allocations: {e}")))?
        .value;
    let len = ctx.id_len(verbose);
    println!("{}", details(&node, verbose));

    println!("{}", ctx.style.section("Node Events"));
    let mut events: Vec<_> = node.events.iter().collect();
    events.sort_by_key(|e| std::cmp::Reverse(e.timestamp));
    let rows = events
        .iter()
        .take(if verbose { usize::MAX } else { 10 })
        .map(|e| vec![format_time(e.timestamp.unix_nanos()), e.subsystem.clone(), e.message.clone()])
        .collect();
    println!("{}", table_with_header(&["Time", "Subsystem", "Message"], rows));

    println!("{}", ctx.style.section("Allocated Resources"));
    println!("{}", allocated_resources(&node, &allocs));

    if verbose {
        println!("{}", ctx.style.section("Attributes"));
        println!("{}", kv(&node.attributes.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>()));
        if !node.meta.is_empty() {
            println!("{}", ctx.style.section("Meta"));
            println!("{}", kv(&node.meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>()));
        }
    }

    println!("{}", ctx.style.section("Allocations"));
    let stubs: Vec<_> = allocs.iter().map(|a| a.stub(AllocStubFields::default())).collect();
    println!("{}", tables::allocs(&stubs, len, verbose, now_nanos()));
    Ok(exit::OK)
}

/// The node's key/value block.
pub fn details(node: &Node, verbose: bool) -> String {
    let drain = match &node.drain_strategy {
        None => "false".to_string(),
        Some(d) if d.deadline < 0 => "true; force drain".to_string(),
        Some(d) if d.deadline == 0 => "true; no deadline".to_string(),
        Some(d) => {
            let mut s = format!("true; {} deadline = {}", format_time(d.force_deadline.unix_nanos()), go_duration(d.deadline));
            if d.ignore_system_jobs {
                s.push_str("; ignoring system jobs");
            }
            s
        }
    };
    let mut drivers: Vec<&str> = node.drivers.iter().filter(|(_, d)| d.detected && d.healthy).map(|(n, _)| n.as_str()).collect();
    drivers.sort_unstable();
    let volumes: Vec<&str> = node.host_volumes.keys().map(String::as_str).collect();
    let mut pairs = vec![
        ("ID", node.id.clone()),
        ("Name", node.name.clone()),
        ("Node Pool", or_none(&node.node_pool)),
        ("Class", or_none(&node.node_class)),
        ("DC", node.datacenter.clone()),
        ("Drain", drain),
        ("Eligibility", node.scheduling_eligibility.as_str().to_string()),
        ("Status", node.status.as_str().to_string()),
        ("Host Volumes", or_none(&volumes.join(","))),
        ("Driver Status", or_none(&drivers.join(","))),
    ];
    if let Some(last) = &node.last_drain {
        pairs.insert(6, ("Last Drain", format!("{} (updated {})", last.status, format_time(last.updated_at.unix_nanos()))));
    }
    if verbose {
        pairs.insert(5, ("HTTP Addr", or_none(&node.http_addr)));
        if let Some(v) = node.attributes.get("nomad.version") {
            pairs.push(("Version", v.clone()));
        }
    }
    kv(&pairs)
}

/// `CPU / Memory / Disk` used by the node's live allocations out of what it offers.
pub fn allocated_resources(node: &Node, allocs: &[Allocation]) -> String {
    let (mut cpu, mut mem, mut disk) = (0i64, 0i64, 0i64);
    for a in allocs.iter().filter(|a| !a.terminal()) {
        if let Some(r) = &a.allocated_resources {
            for t in r.tasks.values() {
                cpu += t.cpu.cpu_shares;
                mem += t.memory.memory_mb;
            }
            disk += r.shared.disk_mb;
        }
    }
    let (mut tcpu, mut tmem, mut tdisk) = (0, 0, 0);
    if let Some(r) = &node.node_resources {
        tcpu = r.cpu.cpu_shares;
        tmem = r.memory.memory_mb;
        tdisk = r.disk.disk_mb;
    }
    if let Some(r) = &node.reserved_resources {
        tcpu -= r.cpu.cpu_shares;
        tmem -= r.memory.memory_mb;
        tdisk -= r.disk.disk_mb;
    }
    table_with_header(
        &["CPU", "Memory", "Disk"],
        vec![vec![format!("{cpu}/{tcpu} MHz"), format!("{}/{}", mib(mem), mib(tmem)), format!("{}/{}", mib(disk), mib(tdisk))]],
    )
}

#[cfg(test)]
mod tests {
    use nomad_proto::node::DrainStrategy;
    use nomad_proto::resources::{AllocatedResources, AllocatedTaskResources};

    use super::*;

    #[test]
    fn allocated_resources_count_only_live_allocs() {
        let node = nomad_server::testing::node("n1");
        let mut tasks = std::collections::BTreeMap::new();
        let mut t = AllocatedTaskResources::default();
        t.cpu.cpu_shares = 500;
        t.memory.memory_mb = 256;
        tasks.insert("t".to_string(), t);
        let res = AllocatedResources { tasks, ..AllocatedResources::default() };
        let live = Allocation { allocated_resources: Some(res.clone()), ..Allocation::default() };
        let dead =
            Allocation { allocated_resources: Some(res), client_status: nomad_proto::ClientStatus::Complete, ..Allocation::default() };
        let out = allocated_resources(&node, &[live, dead]);
        assert_eq!(out, "CPU           Memory         Disk\n500/4000 MHz  256 MiB/8 GiB  0 MiB/97.7 GiB");
    }

    #[test]
    fn details_describe_a_drain() {
        let mut node = nomad_server::testing::node("n1");
        assert!(details(&node, false).contains("Drain         = false"));
        node.drain_strategy = Some(DrainStrategy { deadline: -1, ..DrainStrategy::default() });
        assert!(details(&node, false).contains("true; force drain"));
        assert!(details(&node, false).contains("Driver Status = raw_exec"));
    }
}
