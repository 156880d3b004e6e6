//! `nomad-rs job stop [-purge] [-yes] [-detach] <id>`: `DELETE /v1/job/<id>`,
//! then follow the deregistration eval.

use clap::Args;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::monitor::follow_eval;
use crate::cli::{CmdResult, Ctx, Failure, confirm, exit, prefix};

/// Flags of `job stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Remove the job from the servers, not just stop it.
    #[arg(long)]
    pub purge: bool,
    /// Do not ask for confirmation when the ID is only a prefix.
    #[arg(long, short = 'y')]
    pub yes: bool,
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

/// What `DELETE /v1/job/<id>` answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct DeregisterResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// Runs `job stop`.
pub async fn run(api: &ApiFlags, args: StopArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, &args.job).await?;
    if job.id != args.job && !args.yes {
        let question = format!("Are you sure you want to stop job \"{}\"?", job.id);
        match confirm(&question)? {
            Some(true) => {}
            Some(false) => {
                println!("Cancelling job stop");
                return Ok(exit::OK);
            }
            None => {
                return Err(Failure::new(format!(
                    "Refusing to stop job \"{}\": \"{}\" is only a prefix of its ID; give the full ID or pass -yes",
                    job.id, args.job
                )));
            }
        }
    }
    let q = Query::new().param("namespace", job.namespace.clone()).param("purge", args.purge.to_string());
    let resp = ctx
        .client
        .delete::<DeregisterResponse>(&format!("/v1/job/{}", encode_path(&job.id)), &q)
        .await
        .map_err(|e| Failure::new(format!("Error deregistering job: {e}")))?
        .value;
    if resp.eval_id.is_empty() {
        return Ok(exit::OK);
    }
    if args.detach {
        println!("{}", crate::cli::format::safe(&resp.eval_id));
        return Ok(exit::OK);
    }
    follow_eval(&ctx.client, &resp.eval_id, args.verbose, "the job stop").await
}
