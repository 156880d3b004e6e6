//! `nomad-rs system gc`: `PUT /v1/system/gc`, a forced garbage collection of finished jobs,
//! evals, allocs and down nodes; `nomad-rs system reconcile summaries`:
//! `PUT /v1/system/reconcile/summaries`. Both print nothing on success, as Nomad.

use clap::{Args, Subcommand};

use super::api::{ApiFlags, Query};
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs system`.
#[derive(Debug, Args)]
pub struct SystemArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The system command.
    #[command(subcommand)]
    pub command: SystemCommand,
}

/// System commands.
#[derive(Debug, Subcommand)]
pub enum SystemCommand {
    /// Garbage-collect finished jobs, evaluations, allocations and down nodes now.
    Gc,
    /// Reconcile cluster state.
    #[command(subcommand)]
    Reconcile(ReconcileCommand),
}

/// `nomad-rs system reconcile`.
#[derive(Debug, Subcommand)]
pub enum ReconcileCommand {
    /// Recompute every job's summary from its allocations.
    Summaries,
}

/// Runs a system command.
pub async fn run(a: SystemArgs) -> CmdResult {
    match a.command {
        SystemCommand::Gc => {
            let ctx = Ctx::new(&a.api)?;
            ctx.client
                .put::<serde_json::Value>("/v1/system/gc", &Query::new(), &serde_json::Value::Null)
                .await
                .map_err(|e| Failure::new(format!("Error running system garbage-collection: {e}")))?;
            Ok(exit::OK)
        }
        SystemCommand::Reconcile(ReconcileCommand::Summaries) => {
            let ctx = Ctx::new(&a.api)?;
            ctx.client
                .put::<serde_json::Value>("/v1/system/reconcile/summaries", &Query::new(), &serde_json::Value::Null)
                .await
                .map_err(|e| Failure::new(format!("Error running system summary reconciliation: {e}")))?;
            Ok(exit::OK)
        }
    }
}
