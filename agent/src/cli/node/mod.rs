//! `nomad-rs node ...`: status, drain, eligibility.

pub mod drain;
pub mod eligibility;
pub mod status;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::api::{ApiFlags, Query};
use super::{CmdResult, Ctx, Failure, prefix};

/// `nomad-rs node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The node command.
    #[command(subcommand)]
    pub command: NodeCommand,
}

/// Node commands.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List nodes, or show one node's details and allocations.
    Status(status::StatusArgs),
    /// Start or stop draining a node's allocations.
    Drain(drain::DrainArgs),
    /// Allow or forbid new placements on a node.
    Eligibility(eligibility::EligibilityArgs),
}

/// Runs a node command.
pub async fn run(a: NodeArgs) -> CmdResult {
    match a.command {
        NodeCommand::Status(s) => status::run(&a.api, s).await,
        NodeCommand::Drain(d) => drain::run(&a.api, d).await,
        NodeCommand::Eligibility(e) => eligibility::run(&a.api, e).await,
    }
}

/// The ID of the node the local agent runs as a client (`stats.client.node_id` of `/v1/agent/self`).
pub async fn self_node_id(ctx: &Ctx) -> Result<String, Failure> {
    let me = ctx
        .client
        .get_json("/v1/agent/self", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying agent info: {e}")))?
        .value;
    me.pointer("/stats/client/node_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Failure::new("The agent at this address is not running a client, so -self names no node; pass a node ID"))
}

/// Resolves `-self` or an ID prefix to a full node ID.
pub async fn node_id(ctx: &Ctx, self_: bool, id: Option<&str>) -> Result<String, Failure> {
    match (self_, id) {
        (true, None) => self_node_id(ctx).await,
        (true, Some(_)) => Err(Failure::new("Give either -self or a node ID, not both")),
        (false, Some(p)) => Ok(prefix::node(ctx, p).await?.id),
        (false, None) => Err(Failure::new("This command takes a node ID (or -self)")),
    }
}
