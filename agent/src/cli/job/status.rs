//! `nomad-rs job status [<id prefix>]`: the job list, or one job's details,
//! summary, placement failures and allocations.

use clap::Args;
use nomad_proto::{AllocListStub, EvalStatus, Evaluation, Job, JobListStub, JobSummary};

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{duration_top_two, format_time, kv, now_nanos, table_with_header};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix, tables};

/// Flags of `job status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Full IDs, evaluations, and the Eval ID column.
    #[arg(long)]
    pub verbose: bool,
    /// Also show the job's evaluations.
    #[arg(long)]
    pub evals: bool,
    /// Include allocations of earlier jobs with the same ID.
    #[arg(long = "all-allocs")]
    pub all_allocs: bool,
    /// Only the job's details, no allocations.
    #[arg(long)]
    pub short: bool,
    /// A job ID or ID prefix; none lists all jobs.
    #[arg(value_name = "JOB")]
    pub job: Option<String>,
}

/// Runs `job status`.
pub async fn run(api: &ApiFlags, args: StatusArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    match &args.job {
        None => list(&ctx, args.json).await,
        Some(p) => show(&ctx, &args, p).await,
    }
}

/// Prints the job list (also `nomad-rs status` without arguments).
pub async fn list(ctx: &Ctx, json: bool) -> CmdResult {
    if json {
        return ctx.print_json("/v1/jobs", &Query::new(), "Error querying jobs").await;
    }
    let jobs = ctx
        .client
        .get::<Vec<JobListStub>>("/v1/jobs", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying jobs: {e}")))?
        .value;
    if jobs.is_empty() {
        println!("No running jobs");
    } else {
        println!("{}", tables::jobs(&jobs));
    }
    Ok(exit::OK)
}

/// Shows one job, found by ID prefix.
pub async fn show(ctx: &Ctx, args: &StatusArgs, job_prefix: &str) -> CmdResult {
    let stub = prefix::job(ctx, job_prefix).await?;
    let ns_q = || Query::new().param("namespace", stub.namespace.clone());
    let path = format!("/v1/job/{}", encode_path(&stub.id));
    if args.json {
        return ctx.print_json(&path, &ns_q(), "Error querying job").await;
    }
    let job = ctx.client.get::<Job>(&path, &ns_q()).await.map_err(|e| Failure::new(format!("Error querying job: {e}")))?.value;
    println!("{}", details(&job, now_nanos()));
    if args.short {
        return Ok(exit::OK);
    }
    if job.is_periodic_or_parameterized() {
        return show_children(ctx, &job, &path, &ns_q()).await;
    }

    let summary = ctx.client.get::<JobSummary>(&format!("{path}/summary"), &ns_q()).await;
    let allocs = ctx
        .client
        .get::<Vec<AllocListStub>>(&format!("{path}/allocations"), &ns_q().param("all", args.all_allocs.to_string()))
        .await
        .map_err(|e| Failure::new(format!("Error querying job allocations: {e}")))?
        .value;
    let evals = ctx
        .client
        .get::<Vec<Evaluation>>(&format!("{path}/evaluations"), &ns_q())
        .await
        .map_err(|e| Failure::new(format!("Error querying job evaluations: {e}")))?
        .value;

    match summary {
        Ok(s) => {
            println!("{}", ctx.style.section("Summary"));
            println!("{}", summary_table(&s.value));
        }
        Err(e) => return Err(Failure::new(format!("Error querying job summary: {e}"))),
    }
    let len = ctx.id_len(args.verbose);
    if args.verbose || args.evals {
        println!("{}", ctx.style.section("Evaluations"));
        println!("{}", tables::evals(&evals, len));
    }
    if let Some(failed) = latest_blocked_failure(&evals) {
        println!("{}", ctx.style.section("Placement Failure"));
        for (i, (group, m)) in failed.failed_tg_allocs.iter().enumerate() {
            if i > 0 {
                println!();
            }
            for l in tables::failed_group(group, m, "") {
                println!("{l}");
            }
        }
    }
    println!("{}", ctx.style.section("Allocations"));
    println!("{}", tables::allocs(&allocs, len, args.verbose, now_nanos()));
    Ok(exit::OK)
}

/// A periodic or parameterized job: its dispatch settings, its children's summary and its
/// children (Nomad's `outputPeriodicInfo` and `outputParameterizedInfo`), no allocations.
async fn show_children(ctx: &Ctx, job: &Job, path: &str, q: &Query) -> CmdResult {
    let parameterized = job.is_parameterized();
    if let Some(p) = job.parameterized_job.as_ref().filter(|_| parameterized) {
        println!("{}", ctx.style.section("Parameterized Job"));
        println!(
            "{}",
            kv(&[
                ("Payload", p.payload.clone()),
                ("Required Metadata", p.meta_required.join(", ")),
                ("Optional Metadata", p.meta_optional.join(", ")),
            ])
        );
    }
    let summary = ctx
        .client
        .get::<JobSummary>(&format!("{path}/summary"), q)
        .await
        .map_err(|e| Failure::new(format!("Error querying job summary: {e}")))?
        .value;
    println!("{}", ctx.style.section("Children Job Summary"));
    let c = &summary.children;
    println!(
        "{}",
        table_with_header(&["Pending", "Running", "Dead"], vec![vec![c.pending.to_string(), c.running.to_string(), c.dead.to_string()]])
    );
    let suffix = if parameterized { "/dispatch-" } else { "/periodic-" };
    let children = ctx
        .client
        .get::<Vec<JobListStub>>("/v1/jobs", &q.clone().prefix(&format!("{}{suffix}", job.id)))
        .await
        .map_err(|e| Failure::new(format!("Error querying job: {e}")))?
        .value;
    let rows: Vec<Vec<String>> =
        children.iter().filter(|c| c.parent_id == job.id).map(|c| vec![c.id.clone(), c.status.as_str().to_string()]).collect();
    if rows.is_empty() {
        let what = if parameterized { "No dispatched instances of parameterized job found" } else { "No instances of periodic job found" };
        println!("\n{what}");
        return Ok(exit::OK);
    }
    println!("{}", ctx.style.section(if parameterized { "Dispatched Jobs" } else { "Previously Launched Jobs" }));
    println!("{}", table_with_header(&["ID", "Status"], rows));
    Ok(exit::OK)
}

/// The job's key/value block; a periodic job's next launch is worked out from `now`, as
/// Nomad's CLI does.
pub fn details(job: &Job, now: i64) -> String {
    let mut pairs = vec![
        ("ID", job.id.clone()),
        ("Name", job.name.clone()),
        ("Submit Date", format_time(job.submit_time)),
        ("Type", job.job_type.as_str().to_string()),
        ("Priority", job.priority.to_string()),
        ("Datacenters", job.datacenters.join(",")),
        ("Namespace", job.namespace.clone()),
        ("Node Pool", job.node_pool.clone()),
        ("Status", tables::job_status_string(job.status.as_str(), job.stop)),
        ("Periodic", job.periodic.is_some().to_string()),
        ("Parameterized", job.is_parameterized().to_string()),
    ];
    if let Some(p) = job.periodic.as_ref().filter(|_| !job.is_parameterized()) {
        let next = if job.stop {
            Some("none (job stopped)".to_string())
        } else {
            nomad_server::leader::periodic::next_launch(p, now).ok().flatten().map(|next| {
                let ahead = u64::try_from((next - now) / 1_000_000_000).unwrap_or(0);
                format!("{} ({} from now)", format_time(next), duration_top_two(ahead))
            })
        };
        if let Some(next) = next {
            pairs.push(("Next Periodic Launch", next));
        }
    }
    if job.version > 0 {
        pairs.insert(2, ("Version", job.version.to_string()));
    }
    kv(&pairs)
}

/// The per-group summary table.
pub fn summary_table(s: &JobSummary) -> String {
    let rows = s
        .summary
        .iter()
        .map(|(g, t)| {
            vec![
                g.clone(),
                t.queued.to_string(),
                t.starting.to_string(),
                t.running.to_string(),
                t.failed.to_string(),
                t.complete.to_string(),
                t.lost.to_string(),
                t.unknown.to_string(),
            ]
        })
        .collect();
    table_with_header(&["Task Group", "Queued", "Starting", "Running", "Failed", "Complete", "Lost", "Unknown"], rows)
}

/// The newest eval with placement failures, shown while a blocked eval waits for capacity.
fn latest_blocked_failure(evals: &[Evaluation]) -> Option<&Evaluation> {
    if !evals.iter().any(|e| e.status == EvalStatus::Blocked) {
        return None;
    }
    evals.iter().filter(|e| !e.failed_tg_allocs.is_empty()).max_by_key(|e| e.create_index)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nomad_proto::TaskGroupSummary;

    use super::*;

    #[test]
    fn the_summary_lists_every_count_per_group() {
        let s = JobSummary {
            summary: BTreeMap::from([("web".to_string(), TaskGroupSummary { running: 2, queued: 1, ..TaskGroupSummary::default() })]),
            ..JobSummary::default()
        };
        assert_eq!(
            summary_table(&s),
            "Task Group  Queued  Starting  Running  Failed  Complete  Lost  Unknown\nweb         1       0         2        0       0         0     0"
        );
    }

    #[test]
    fn details_show_the_job_fields() {
        let job = Job { id: "web".into(), name: "web".into(), datacenters: vec!["dc1".into(), "dc2".into()], stop: true, ..Job::default() };
        let d = details(&job, 0);
        assert!(d.contains("ID            = web"), "{d}");
        assert!(d.contains("Datacenters   = dc1,dc2"));
        assert!(d.contains("Status        = pending (stopped)"));
    }

    #[test]
    fn placement_failures_show_only_while_an_eval_is_blocked() {
        let mut failed = Evaluation { id: "a".into(), create_index: 5, ..Evaluation::default() };
        failed.failed_tg_allocs.insert("g".into(), Default::default());
        assert!(latest_blocked_failure(std::slice::from_ref(&failed)).is_none());
        let blocked = Evaluation { id: "b".into(), status: EvalStatus::Blocked, ..Evaluation::default() };
        assert_eq!(latest_blocked_failure(&[failed, blocked]).map(|e| e.id.as_str()), Some("a"));
    }
}
