//! `nomad-rs node eligibility -enable|-disable <id>`.

use clap::Args;
use serde_json::json;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Flags of `node eligibility`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["enable", "disable"])))]
pub struct EligibilityArgs {
    /// Let the scheduler place new allocations on the node.
    #[arg(long)]
    pub enable: bool,
    /// Keep new allocations off the node (running ones stay).
    #[arg(long)]
    pub disable: bool,
    /// The node of the local agent.
    #[arg(long = "self")]
    pub self_: bool,
    /// Node ID or prefix.
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
}

/// Runs `node eligibility`.
pub async fn run(api: &ApiFlags, args: EligibilityArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let id = super::node_id(&ctx, args.self_, args.node.as_deref()).await?;
    let eligibility = if args.enable { "eligible" } else { "ineligible" };
    ctx.client
        .put::<serde_json::Value>(
            &format!("/v1/node/{}/eligibility", encode_path(&id)),
            &Query::new(),
            &json!({"NodeID": id, "Eligibility": eligibility}),
        )
        .await
        .map_err(|e| Failure::new(format!("Error updating scheduling eligibility: {e}")))?;
    println!("Node {id:?} scheduling eligibility set: {eligibility} for scheduling");
    Ok(exit::OK)
}
