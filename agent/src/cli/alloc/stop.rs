//! `nomad-rs alloc stop [-detach] <id>`: stop an allocation and follow the eval that replaces it.

use clap::Args;
use serde::Deserialize;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{id_len, stdout_is_live_terminal};
use crate::cli::monitor::{Monitor, MonitorOptions};
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `alloc stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Return right after the request, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Skip the group's shutdown delay.
    #[arg(long = "no-shutdown-delay")]
    pub no_shutdown_delay: bool,
    /// Allocation ID or prefix.
    #[arg(value_name = "ALLOC")]
    pub alloc: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct StopResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
}

/// Runs `alloc stop`.
pub async fn run(api: &ApiFlags, args: StopArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let stub = prefix::alloc(&ctx, &args.alloc).await?;
    let q = Query::new().param("namespace", stub.namespace.clone()).param("no_shutdown_delay", args.no_shutdown_delay.to_string());
    let resp = ctx
        .client
        .write::<StopResponse>(http::Method::PUT, &format!("/v1/allocation/{}/stop", encode_path(&stub.id)), &q, None::<&()>)
        .await
        .map_err(|e| Failure::new(format!("Error stopping allocation: {e}")))?
        .value;
    if args.detach || resp.eval_id.is_empty() {
        println!("{}", crate::cli::format::safe(&resp.eval_id));
        return Ok(exit::OK);
    }
    let opts = MonitorOptions { id_len: id_len(args.verbose), wait_for_allocs: false, live: stdout_is_live_terminal() };
    let mut monitor = Monitor::new(&ctx.client, opts, Box::new(std::io::stdout()));
    let interrupt = crate::cli::interrupted();
    tokio::select! {
        r = monitor.run(&resp.eval_id) => r,
        _ = interrupt => Ok(exit::INTERRUPTED),
    }
}
