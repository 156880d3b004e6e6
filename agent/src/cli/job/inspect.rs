//! `nomad-rs job inspect [-json] <id>`: the registered job as `{"Job": ...}` JSON.

use clap::Args;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `job inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Print JSON (the default and only format; accepted for Nomad compatibility).
    #[arg(long)]
    pub json: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// Runs `job inspect`.
pub async fn run(api: &ApiFlags, args: InspectArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let stub = prefix::job(&ctx, &args.job).await?;
    let job = ctx
        .client
        .get_json(&format!("/v1/job/{}", encode_path(&stub.id)), &Query::new().param("namespace", stub.namespace.clone()))
        .await
        .map_err(|e| Failure::new(format!("Error inspecting job: {e}")))?
        .value;
    let wrapped = serde_json::json!({ "Job": job });
    println!("{}", crate::cli::format::safe_json(&serde_json::to_string_pretty(&wrapped).unwrap_or_default()));
    Ok(exit::OK)
}
