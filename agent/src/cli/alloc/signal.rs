//! `nomad-rs alloc signal [-s SIGNAL] [-task TASK] <alloc> [task]`:
//! `PUT /v1/client/allocation/<id>/signal` with `{Signal, Task}`; SIGKILL unless `-s` says
//! otherwise, every task when none is named (as Nomad's).

use clap::Args;
use serde_json::json;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `alloc signal`.
#[derive(Debug, Args)]
pub struct SignalArgs {
    /// The signal to send.
    #[arg(short = 's', value_name = "SIGNAL", default_value = "SIGKILL")]
    pub signal: String,
    /// Signal only this task.
    #[arg(long, value_name = "TASK")]
    pub task: Option<String>,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
    /// Task name (same as -task, which wins).
    #[arg(value_name = "TASK")]
    pub task_arg: Option<String>,
}

/// Runs `alloc signal`.
pub async fn run(api: &ApiFlags, args: SignalArgs) -> CmdResult {
    let task = args.task.clone().or_else(|| args.task_arg.clone());
    let ctx = Ctx::new(api)?;
    let alloc = prefix::full_alloc(&ctx, &args.alloc).await?;
    if let Some(t) = &task {
        super::pick_task(&alloc, Some(t))?;
    }
    let path = format!("/v1/client/allocation/{}/signal", encode_path(&alloc.id));
    let body = json!({ "Task": task.unwrap_or_default(), "Signal": args.signal });
    ctx.client
        .put::<serde_json::Value>(&path, &Query::new(), &body)
        .await
        .map_err(|e| Failure::new(format!("Error signalling allocation: {e}")))?;
    Ok(exit::OK)
}
