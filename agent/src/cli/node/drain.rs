//! `nomad-rs node drain -enable|-disable [-deadline d] [-force] [-no-deadline]
//! [-ignore-system] [-keep-ineligible] [-yes] [-detach] [-monitor] <id>`.
//!
//! `PUT /v1/node/<id>/drain` with `{NodeID, DrainSpec: {Deadline,
//! IgnoreSystemJobs} | null, MarkEligible}`; then, unless `-detach`, watch
//! the node's allocations until the drain is done and only what may stay
//! (system allocations with `-ignore-system`) is left.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, JobType, Node};
use serde_json::json;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{format_time, limit, now_nanos, parse_go_duration};
use crate::cli::{CmdResult, Ctx, Failure, confirm, exit};

/// Nomad's default drain deadline.
const DEFAULT_DEADLINE: &str = "1h";
/// How long one blocking read of the node's allocations may wait.
const BLOCK_WAIT: Duration = Duration::from_secs(5);

/// Flags of `node drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Start draining.
    #[arg(long, conflicts_with = "disable")]
    pub enable: bool,
    /// Stop draining.
    #[arg(long)]
    pub disable: bool,
    /// How long allocations may take to migrate before they are stopped (default 1h).
    #[arg(long, value_name = "DURATION", conflicts_with_all = ["force", "no_deadline"])]
    pub deadline: Option<String>,
    /// Stop every allocation at once.
    #[arg(long, conflicts_with = "no_deadline")]
    pub force: bool,
    /// Migrate without ever forcing.
    #[arg(long = "no-deadline")]
    pub no_deadline: bool,
    /// Leave system job allocations running.
    #[arg(long = "ignore-system")]
    pub ignore_system: bool,
    /// With -disable: keep the node ineligible for new placements.
    #[arg(long = "keep-ineligible")]
    pub keep_ineligible: bool,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Return once the drain is set, without watching it.
    #[arg(long)]
    pub detach: bool,
    /// Only watch a drain already in progress.
    #[arg(long, conflicts_with_all = ["enable", "disable", "detach"])]
    pub monitor: bool,
    /// The node of the local agent.
    #[arg(long = "self")]
    pub self_: bool,
    /// Node ID or prefix.
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
}

/// The drain request body for these flags.
pub fn request_body(node_id: &str, args: &DrainArgs) -> Result<serde_json::Value, Failure> {
    if args.disable {
        return Ok(json!({ "NodeID": node_id, "DrainSpec": null, "MarkEligible": !args.keep_ineligible, "Meta": null }));
    }
    let deadline = if args.force {
        -1
    } else if args.no_deadline {
        0
    } else {
        let d = args.deadline.as_deref().unwrap_or(DEFAULT_DEADLINE);
        let ns = parse_go_duration(d).map_err(|e| Failure::new(format!("Error parsing -deadline: {e}")))?;
        if ns <= 0 {
            return Err(Failure::new("A -deadline must be positive; use -force to stop allocations at once or -no-deadline"));
        }
        ns
    };
    Ok(json!({
        "NodeID": node_id,
        "DrainSpec": { "Deadline": deadline, "IgnoreSystemJobs": args.ignore_system },
        "MarkEligible": false,
        "Meta": null,
    }))
}

/// Runs `node drain`.
pub async fn run(api: &ApiFlags, args: DrainArgs) -> CmdResult {
    if !args.enable && !args.disable && !args.monitor {
        return Err(Failure::new("Give -enable, -disable or -monitor"));
    }
    if args.keep_ineligible && !args.disable {
        return Err(Failure::new("-keep-ineligible only applies with -disable"));
    }
    let ctx = Ctx::new(api)?;
    let id = super::node_id(&ctx, args.self_, args.node.as_deref()).await?;
    if args.monitor {
        return watch(&ctx, &id, args.ignore_system).await;
    }
    if !args.yes {
        let verb = if args.enable { "enable" } else { "disable" };
        match confirm(&format!("Are you sure you want to {verb} drain mode for node {id:?}?"))? {
            Some(true) => {}
            Some(false) => {
                println!("Canceling drain strategy change");
                return Ok(exit::OK);
            }
            None => return Err(Failure::new(format!("Refusing to {verb} drain mode for node {id:?} without confirmation; pass -yes"))),
        }
    }
    let body = request_body(&id, &args)?;
    let path = format!("/v1/node/{}/drain", encode_path(&id));
    ctx.client.put::<serde_json::Value>(&path, &Query::new(), &body).await.map_err(|e| {
        if e.is_unsupported_route() {
            Failure::new(format!("Error updating drain specification: this server does not support node drain yet (PUT {path}: {e}); upgrade the nomad-rs servers"))
        } else {
            Failure::new(format!("Error updating drain specification: {e}"))
        }
    })?;
    if args.disable {
        println!("Node {id:?} drain strategy unset");
        return Ok(exit::OK);
    }
    if args.detach {
        println!("Node {id:?} drain strategy set");
        return Ok(exit::OK);
    }
    let interrupt = crate::cli::interrupted();
    println!("{}: Ctrl-C to stop monitoring: will not cancel the node drain", format_time(now_nanos()));
    println!("{}: Node {id:?} drain strategy set", format_time(now_nanos()));
    tokio::select! {
        r = watch(&ctx, &id, args.ignore_system) => r,
        _ = interrupt => {
            println!("\n==> Monitoring interrupted; the drain carries on. Watch it again with `nomad-rs node drain -monitor {id}`");
            Ok(exit::INTERRUPTED)
        }
    }
}

/// An alloc that must leave the node for the drain to be done.
fn must_leave(a: &Allocation, ignore_system: bool) -> bool {
    !(ignore_system && a.job_type() == JobType::System)
}

/// Messages for what changed on the node's allocations; updates `seen`.
pub fn drain_changes(seen: &mut BTreeMap<String, (bool, DesiredStatus, ClientStatus)>, allocs: &[Allocation]) -> Vec<String> {
    let mut out = Vec::new();
    for a in allocs {
        let id = limit(&a.id, 8);
        let now = (a.desired_transition.should_migrate(), a.desired_status, a.client_status);
        let prev = seen.insert(a.id.clone(), now);
        let (was_migrating, was_desired, was_client) = prev.unwrap_or((false, DesiredStatus::Run, a.client_status));
        if now.0 && !was_migrating {
            out.push(format!("Alloc {id:?} marked for migration"));
        }
        if a.desired_status != DesiredStatus::Run && was_desired == DesiredStatus::Run && !a.client_terminal() {
            out.push(format!("Alloc {id:?} draining"));
        }
        if prev.is_some() && was_client != a.client_status {
            out.push(format!("Alloc {id:?} status {} -> {}", was_client.as_str(), a.client_status.as_str()));
        }
    }
    out
}

/// The drain is done: the node has no drain strategy and every alloc that must leave has stopped.
pub fn drain_done(node: &Node, allocs: &[Allocation], ignore_system: bool) -> bool {
    node.drain_strategy.is_none() && allocs.iter().filter(|a| must_leave(a, ignore_system)).all(|a| a.client_terminal())
}

/// Allocations already stopped on the client when watching began: not news. One only told to
/// stop (desired stop, still running) is still to be watched until it has stopped, or the drain
/// would be reported done while it runs.
fn already_stopped(allocs: &[Allocation]) -> std::collections::BTreeSet<String> {
    allocs.iter().filter(|a| a.client_terminal()).map(|a| a.id.clone()).collect()
}

async fn watch(ctx: &Ctx, id: &str, ignore_system: bool) -> CmdResult {
    let path = format!("/v1/node/{}", encode_path(id));
    let mut seen = BTreeMap::new();
    let mut index = 0;
    let mut marked_all = false;
    // Allocations already stopped when watching began are not news.
    let mut old: Option<std::collections::BTreeSet<String>> = None;
    loop {
        let node =
            ctx.client.get::<Node>(&path, &Query::new()).await.map_err(|e| Failure::new(format!("Error monitoring node: {e}")))?.value;
        let allocs = ctx
            .client
            .get::<Vec<Allocation>>(&format!("{path}/allocations"), &Query::new().blocking(index, BLOCK_WAIT))
            .await
            .map_err(|e| Failure::new(format!("Error monitoring node allocations: {e}")))?;
        let old = old.get_or_insert_with(|| already_stopped(&allocs.value));
        let live: Vec<Allocation> = allocs.value.into_iter().filter(|a| !old.contains(&a.id)).collect();
        for m in drain_changes(&mut seen, &live) {
            println!("{}: {m}", format_time(now_nanos()));
        }
        if !marked_all && node.drain_strategy.is_none() {
            marked_all = true;
            if node.last_drain.as_ref().is_some_and(|d| d.status == "canceled") {
                println!("{}: Drain of node {id:?} was canceled", format_time(now_nanos()));
                return Ok(exit::ERROR);
            }
            println!("{}: Node {id:?} has marked all allocations for migration", format_time(now_nanos()));
        }
        if drain_done(&node, &live, ignore_system) {
            println!("{}: All allocations on node {id:?} have stopped", format_time(now_nanos()));
            return Ok(exit::OK);
        }
        if allocs.index <= index {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        index = allocs.index;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use clap::Parser;
    use nomad_proto::Job;
    use nomad_proto::node::DrainStrategy;

    use super::*;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        d: DrainArgs,
    }

    fn parse(args: &[&str]) -> DrainArgs {
        let argv = std::iter::once("t").chain(args.iter().copied()).map(std::ffi::OsString::from);
        T::try_parse_from(crate::cli::normalize_args(argv)).unwrap().d
    }

    #[test]
    fn flags_become_a_drain_spec() {
        let b = request_body("n1", &parse(&["-enable", "n1"])).unwrap();
        assert_eq!(b["DrainSpec"]["Deadline"], 3_600_000_000_000i64, "Nomad's default deadline is 1h");
        let b = request_body("n1", &parse(&["-enable", "-deadline", "90s", "-ignore-system", "n1"])).unwrap();
        assert_eq!(b["DrainSpec"], json!({"Deadline": 90_000_000_000i64, "IgnoreSystemJobs": true}));
        assert_eq!(request_body("n1", &parse(&["-enable", "-force", "n1"])).unwrap()["DrainSpec"]["Deadline"], -1);
        assert_eq!(request_body("n1", &parse(&["-enable", "-no-deadline", "n1"])).unwrap()["DrainSpec"]["Deadline"], 0);
        let off = request_body("n1", &parse(&["-disable", "n1"])).unwrap();
        assert_eq!(off["DrainSpec"], serde_json::Value::Null);
        assert_eq!(off["MarkEligible"], true);
        assert_eq!(request_body("n1", &parse(&["-disable", "-keep-ineligible", "n1"])).unwrap()["MarkEligible"], false);
        assert!(request_body("n1", &parse(&["-enable", "-deadline", "soon", "n1"])).is_err());
    }

    fn alloc(id: &str, job_type: JobType, client: ClientStatus) -> Allocation {
        let job = Job { job_type, ..Job::default() };
        Allocation { id: id.into(), job: Some(Arc::new(job)), client_status: client, ..Allocation::default() }
    }

    #[test]
    fn an_alloc_told_to_stop_but_still_running_is_watched_until_it_stops() {
        let mut stopping = alloc("stopping", JobType::Service, ClientStatus::Running);
        stopping.desired_status = DesiredStatus::Stop;
        let done = alloc("done", JobType::Service, ClientStatus::Complete);
        let old = already_stopped(&[stopping.clone(), done]);
        assert_eq!(old.into_iter().collect::<Vec<_>>(), vec!["done".to_string()]);
        let node = Node::default();
        assert!(!drain_done(&node, &[stopping], false), "a running alloc has not stopped");
    }

    #[test]
    fn a_drain_is_done_when_only_ignored_system_allocs_remain() {
        let mut node = Node { drain_strategy: Some(DrainStrategy::default()), ..Node::default() };
        let allocs = vec![alloc("svc", JobType::Service, ClientStatus::Complete), alloc("sys", JobType::System, ClientStatus::Running)];
        assert!(!drain_done(&node, &allocs, true), "the strategy is still set");
        node.drain_strategy = None;
        assert!(drain_done(&node, &allocs, true));
        assert!(!drain_done(&node, &allocs, false), "without -ignore-system the system alloc must stop too");
    }

    #[test]
    fn drain_progress_is_reported_once_per_change() {
        let mut seen = BTreeMap::new();
        let mut a = alloc("aaaaaaaa-1", JobType::Service, ClientStatus::Running);
        assert!(drain_changes(&mut seen, std::slice::from_ref(&a)).is_empty());
        a.desired_transition.migrate = Some(true);
        a.desired_status = DesiredStatus::Stop;
        assert_eq!(
            drain_changes(&mut seen, std::slice::from_ref(&a)),
            vec!["Alloc \"aaaaaaaa\" marked for migration", "Alloc \"aaaaaaaa\" draining"]
        );
        a.client_status = ClientStatus::Complete;
        assert_eq!(drain_changes(&mut seen, std::slice::from_ref(&a)), vec!["Alloc \"aaaaaaaa\" status running -> complete"]);
        assert!(drain_changes(&mut seen, &[a]).is_empty());
    }
}
