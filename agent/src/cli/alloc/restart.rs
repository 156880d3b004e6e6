//! `nomad-rs alloc restart [-task t | -all-tasks] <id> [task]`:
//! `PUT /v1/client/allocation/<id>/restart` with `{TaskName, AllTasks}`.

use clap::Args;
use serde_json::json;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `alloc restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// Restart only this task.
    #[arg(long, value_name = "TASK", conflicts_with = "all_tasks")]
    pub task: Option<String>,
    /// Restart every task, including ones that already finished.
    #[arg(long = "all-tasks")]
    pub all_tasks: bool,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
    /// Task name (same as -task).
    #[arg(value_name = "TASK")]
    pub task_arg: Option<String>,
}

/// Runs `alloc restart`.
pub async fn run(api: &ApiFlags, args: RestartArgs) -> CmdResult {
    let task = match (&args.task, &args.task_arg) {
        (Some(a), Some(b)) if a != b => return Err(Failure::new("Give the task once: either -task or as an argument")),
        (a, b) => a.clone().or_else(|| b.clone()),
    };
    if task.is_some() && args.all_tasks {
        return Err(Failure::new("-all-tasks cannot be combined with a task name"));
    }
    let ctx = Ctx::new(api)?;
    let alloc = prefix::full_alloc(&ctx, &args.alloc).await?;
    if let Some(t) = &task {
        super::pick_task(&alloc, Some(t))?;
    }
    let path = format!("/v1/client/allocation/{}/restart", encode_path(&alloc.id));
    let body = json!({ "TaskName": task.unwrap_or_default(), "AllTasks": args.all_tasks });
    ctx.client.put::<serde_json::Value>(&path, &Query::new(), &body).await.map_err(|e| {
        if e.is_unsupported_route() {
            Failure::new(format!("Failed to restart allocation: this agent does not serve allocation restarts yet (PUT {path}: {e}); point -address at a nomad-rs client agent that does"))
        } else {
            Failure::new(format!("Failed to restart allocation: {e}"))
        }
    })?;
    Ok(exit::OK)
}
