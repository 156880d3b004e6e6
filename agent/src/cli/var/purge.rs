//! `nomad-rs var purge [-check-index N] <path>`: `DELETE /v1/var/<path>[?cas=N]`.

use clap::Args;

use super::{CheckIndexError, cas_conflict, conflict_of, go_quote, parse_check_index, refuse_wildcard, var_url};
use crate::cli::api::{ApiFlags, Query};
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Flags and argument of `var purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete only if the variable's modify index on the server is this.
    #[arg(long = "check-index", value_name = "INDEX")]
    pub check_index: Option<String>,
    /// The variable's path.
    #[arg(value_name = "PATH")]
    pub path: String,
}

/// Runs `var purge`.
pub async fn run(api: &ApiFlags, a: PurgeArgs) -> CmdResult {
    let check_str = a.check_index.clone().unwrap_or_default();
    let check_index = parse_check_index(&check_str).map_err(|e| match e {
        CheckIndexError::Range => Failure::new(format!("Invalid -check-index value {check_str:?}: out of range for uint64")),
        CheckIndexError::Syntax => Failure::new(format!("Invalid -check-index value {check_str:?}: not parsable as uint64")),
    })?;
    refuse_wildcard(api)?;
    let ctx = Ctx::new(api)?;
    let q = match check_index {
        Some(ci) => Query::new().param("cas", ci.to_string()),
        None => Query::new(),
    };
    if let Err(e) = ctx.client.delete::<serde_json::Value>(&var_url(&a.path), &q).await {
        return Err(match (conflict_of(&e), check_index) {
            (Some(current), Some(ci)) => cas_conflict(ci, &current),
            _ => Failure::new(format!("Error purging variable: {e}")),
        });
    }
    println!("Successfully purged variable {}!", go_quote(&a.path));
    Ok(exit::OK)
}
