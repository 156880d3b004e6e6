//! `nomad-rs job revert [-detach] [-verbose] <job> <version>`: `PUT /v1/job/<id>/revert`, then
//! follow the new eval as `job run` does.

use clap::Args;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::monitor::detach_or_follow;
use crate::cli::{CmdResult, Ctx, Failure, prefix};

/// Flags of `job revert`.
#[derive(Debug, Args)]
pub struct RevertArgs {
    /// Return right after the request, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// The version to go back to.
    #[arg(value_name = "VERSION")]
    pub version: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct RevertResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// Runs `job revert`.
pub async fn run(api: &ApiFlags, args: RevertArgs) -> CmdResult {
    let version: u64 = args.version.parse().map_err(|e| Failure::new(format!("Failed to parse job-version flag: {e}")))?;
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let body = serde_json::json!({"JobID": job.id, "JobVersion": version});
    let q = Query::new().param("namespace", job.namespace.clone());
    let resp: RevertResponse = ctx
        .client
        .put(&format!("/v1/job/{}/revert", encode_path(&job.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("Error retrieving job versions: {e}")))?
        .value;
    // A periodic or parameterized job gets no eval.
    detach_or_follow(&ctx.client, &resp.eval_id, args.detach, args.verbose).await
}
