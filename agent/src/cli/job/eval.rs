//! `nomad-rs job eval [-force-reschedule] [-detach] [-verbose] <id>`: `PUT /v1/job/<id>/evaluate`,
//! then follow the new eval as `job run` does.

use clap::Args;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{id_len, safe};
use crate::cli::monitor::follow_eval;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `job eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Reschedule the job's failed allocations now, even if their reschedule policy would wait.
    #[arg(long = "force-reschedule")]
    pub force_reschedule: bool,
    /// Return right after the request, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// What `PUT /v1/job/<id>/evaluate` answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct EvaluateResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// Runs `job eval`.
pub async fn run(api: &ApiFlags, args: EvalArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, &args.job).await?;
    let body = serde_json::json!({"JobID": job.id, "EvalOptions": {"ForceReschedule": args.force_reschedule}});
    let q = Query::new().param("namespace", job.namespace.clone());
    let resp: EvaluateResponse = ctx
        .client
        .put(&format!("/v1/job/{}/evaluate", encode_path(&job.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("Error evaluating job: {e}")))?
        .value;
    let len = id_len(args.verbose);
    if args.detach {
        println!("Created eval ID: \"{}\"", safe(&resp.eval_id[..len.min(resp.eval_id.len())]));
        return Ok(exit::OK);
    }
    follow_eval(&ctx.client, &resp.eval_id, args.verbose, "the evaluation").await
}
