//! `nomad-rs job scale [-detach] [-verbose] <job> [<group>] <count>` and
//! `nomad-rs job scaling-events [-verbose] <job>`, as Nomad's.

use clap::Args;
use nomad_proto::scaling::{JobScaleStatus, ScalingEvent};
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{format_time, safe, table_with_header};
use crate::cli::monitor::detach_or_follow;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// The message the CLI's scaling requests carry (Nomad's).
const CLI_MESSAGE: &str = "submitted using the Nomad CLI";

/// Flags of `job scale`.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Return right after the request, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// `<job> [<group>] <count>`.
    #[arg(value_name = "JOB [GROUP] COUNT")]
    pub args: Vec<String>,
}

/// Flags of `job scaling-events`.
#[derive(Debug, Args)]
pub struct ScalingEventsArgs {
    /// Show each event's error flag, message and eval.
    #[arg(long)]
    pub verbose: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct ScaleResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
    warnings: String,
}

async fn scale_status(ctx: &Ctx, job: &nomad_proto::JobListStub, what: &str) -> Result<JobScaleStatus, Failure> {
    let q = Query::new().param("namespace", job.namespace.clone());
    Ok(ctx
        .client
        .get::<JobScaleStatus>(&format!("/v1/job/{}/scale", encode_path(&job.id)), &q)
        .await
        .map_err(|e| Failure::new(format!("{what}: {e}")))?
        .value)
}

/// The group to scale: the one named, or the job's only group (Nomad's `performGroupCheck`).
fn pick_group(status: &JobScaleStatus, named: Option<&str>) -> Result<String, Failure> {
    match named {
        None if status.task_groups.len() > 1 => Err(Failure::new("Group name required")),
        None => status.task_groups.keys().next().cloned().ok_or_else(|| Failure::new("Group  not found within job")),
        Some(g) if status.task_groups.contains_key(g) => Ok(g.to_string()),
        Some(g) => Err(Failure::new(format!("Group {} not found within job", safe(g)))),
    }
}

/// Runs `job scale`.
pub async fn run(api: &ApiFlags, args: ScaleArgs) -> CmdResult {
    let (job, group, count) = match args.args.as_slice() {
        [job, count] => (job, None, count),
        [job, group, count] => (job, Some(group.as_str()), count),
        _ => return Err(Failure::new("Command requires at least two arguments and no more than three")),
    };
    let count: i64 = count.parse().map_err(|e| Failure::new(format!("Failed to convert count string to int: {e}")))?;
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, job.trim()).await?;
    let status = scale_status(&ctx, &job, "Error querying job").await?;
    let group = pick_group(&status, group)?;
    let body = serde_json::json!({
        "Count": count,
        "Target": {"Group": group},
        "Message": CLI_MESSAGE,
        "Error": false,
    });
    let q = Query::new().param("namespace", job.namespace.clone());
    let resp: ScaleResponse = ctx
        .client
        .put(&format!("/v1/job/{}/scale", encode_path(&job.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("Error submitting scaling request: {e}")))?
        .value;
    if !resp.warnings.is_empty() {
        println!("{}\n", ctx.style.yellow(&format!("Job Warnings:\n{}", safe(&resp.warnings))));
    }
    // A periodic or parameterized job gets no eval: its children are launched with the count.
    detach_or_follow(&ctx.client, &resp.eval_id, args.detach, args.verbose).await
}

/// Runs `job scaling-events`: every group's events, newest first.
pub async fn run_events(api: &ApiFlags, args: ScalingEventsArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let status = scale_status(&ctx, &job, "Error listing scaling events").await?;
    let mut events: Vec<(&str, &ScalingEvent)> =
        status.task_groups.iter().flat_map(|(g, s)| s.events.iter().map(move |e| (g.as_str(), e))).collect();
    if events.is_empty() {
        println!("No events found");
        return Ok(exit::OK);
    }
    events.sort_by_key(|(_, e)| std::cmp::Reverse(e.time));
    let mut header = vec!["Task Group", "Count", "PrevCount"];
    if args.verbose {
        header.extend(["Error", "Message", "Eval ID"]);
    }
    header.push("Date");
    let rows = events
        .iter()
        .map(|(g, e)| {
            let mut row = vec![g.to_string(), e.count.map(|c| c.to_string()).unwrap_or_default(), e.previous_count.to_string()];
            if args.verbose {
                row.extend([e.error.to_string(), e.message.clone(), e.eval_id.clone().unwrap_or_default()]);
            }
            row.push(format_time(e.time));
            row
        })
        .collect();
    println!("{}", table_with_header(&header, rows));
    Ok(exit::OK)
}
