//! `nomad-rs job promote [-group g] [-detach] [-verbose] <job>` (promote the job's newest
//! deployment, then follow the eval) and `nomad-rs job deployments [-latest] [-all] [-json]
//! [-verbose] <job>` (Nomad's `command/job_promote.go`, `command/job_deployments.go`).

use clap::Args;
use nomad_proto::Deployment;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::deployment::{format_deployment, print_list};
use crate::cli::format::json_text;
use crate::cli::monitor::detach_or_follow;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `job promote`.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// Promote only these groups' canaries (repeatable); all groups without it.
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// Return right after the promotion, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// Flags of `job deployments`.
#[derive(Debug, Args)]
pub struct DeploymentsArgs {
    /// Only the newest deployment, in full.
    #[arg(long)]
    pub latest: bool,
    /// Include deployments of earlier jobs with the same ID.
    #[arg(long)]
    pub all: bool,
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct UpdateResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// The job's newest deployment; `what` starts the error message.
async fn latest(ctx: &Ctx, job_id: &str, q: &Query, what: &str) -> Result<Option<Deployment>, Failure> {
    Ok(ctx
        .client
        .get::<Option<Deployment>>(&format!("/v1/job/{}/deployment", encode_path(job_id)), q)
        .await
        .map_err(|e| Failure::new(format!("{what}: {e}")))?
        .value)
}

/// Runs `job promote`.
pub async fn promote(api: &ApiFlags, args: PromoteArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let q = Query::new().param("namespace", job.namespace.clone());
    let Some(d) = latest(&ctx, &job.id, &q, "Error retrieving deployment").await? else {
        return Err(Failure::new(format!("Job {:?} has no deployment to promote", job.id)));
    };
    let body = serde_json::json!({"DeploymentID": d.id, "All": args.groups.is_empty(), "Groups": args.groups});
    let u: UpdateResponse = ctx
        .client
        .put(&format!("/v1/deployment/promote/{}", encode_path(&d.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("Error promoting deployment {:?} for job {:?}: {e}", d.id, job.id)))?
        .value;
    detach_or_follow(&ctx.client, &u.eval_id, args.detach, args.verbose).await
}

/// Runs `job deployments`.
pub async fn deployments(api: &ApiFlags, args: DeploymentsArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let mut q = Query::new().param("namespace", job.namespace.clone());
    if args.latest {
        let d = latest(&ctx, &job.id, &q, "Error retrieving deployments").await?;
        match (&d, args.json) {
            (_, true) => println!("{}", json_text(&d)),
            (Some(d), false) => println!("{}", format_deployment(d, args.verbose)),
            (None, false) => println!("No deployment found"),
        }
        return Ok(exit::OK);
    }
    if args.all {
        q = q.param("all", "true");
    }
    let list: Vec<Deployment> = ctx
        .client
        .get(&format!("/v1/job/{}/deployments", encode_path(&job.id)), &q)
        .await
        .map_err(|e| Failure::new(format!("Error retrieving deployments: {e}")))?
        .value;
    print_list(&list, args.json, args.verbose)
}
