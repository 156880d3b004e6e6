//! `nomad-rs job periodic force [-detach] [-verbose] <job>`: launch a periodic job now, then
//! follow the child's eval.

use clap::{Args, Subcommand};
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::safe;
use crate::cli::monitor::follow_eval;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// `job periodic` commands.
#[derive(Debug, Subcommand)]
pub enum PeriodicCommand {
    /// Launch a periodic job now, whatever its schedule and prohibit_overlap say.
    Force(ForceArgs),
}

/// Flags of `job periodic force`.
#[derive(Debug, Args)]
pub struct ForceArgs {
    /// Return right after the launch, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// The periodic job, by ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct ForceResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// Runs a `job periodic` command.
pub async fn run(api: &ApiFlags, cmd: PeriodicCommand) -> CmdResult {
    let PeriodicCommand::Force(args) = cmd;
    let ctx = Ctx::new(api)?;
    let prefix = args.job.trim();
    let job = prefix::job(&ctx, prefix).await.map_err(|e| {
        if e.message.starts_with("No job(s)") { Failure::new(format!("No periodic job(s) with prefix or ID {prefix:?} found")) } else { e }
    })?;
    let q = Query::new().param("namespace", job.namespace.clone());
    let resp: ForceResponse = ctx
        .client
        .put(&format!("/v1/job/{}/periodic/force", encode_path(&job.id)), &q, &serde_json::json!({}))
        .await
        .map_err(|e| Failure::new(format!("Error forcing periodic job {:?}: {e}", job.id)))?
        .value;
    if args.detach {
        println!("Force periodic successful");
        println!("Evaluation ID: {}", safe(&resp.eval_id));
        return Ok(exit::OK);
    }
    follow_eval(&ctx.client, &resp.eval_id, args.verbose, "the evaluation").await
}
