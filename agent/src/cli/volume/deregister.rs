//! `nomad-rs volume deregister [-force] <id>`: `DELETE /v1/volume/csi/<id>?force=`
//! (`command/volume_deregister.go`).

use clap::Args;

use crate::cli::api::ApiFlags;
use crate::cli::format::safe;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// The long help.
pub const LONG_ABOUT: &str = "Remove an unused volume from Nomad. The ID may be a prefix of the volume's ID.";

/// Arguments of `volume deregister`.
#[derive(Debug, Args)]
pub struct DeregisterArgs {
    /// Force deregistration of the volume and immediately drop claims for terminal allocations. Returns an
    /// error if the volume has running allocations. This does not detach the volume from client nodes. Asks
    /// for confirmation on stdin: an exact "y".
    #[arg(long)]
    pub force: bool,
    /// The volume's ID or a prefix of it.
    #[arg(value_name = "ID")]
    pub id: String,
}

/// Runs `volume deregister`.
pub async fn run(api: &ApiFlags, args: DeregisterArgs) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let vol = super::resolve(&ctx, &args.id).await?;
    if args.force {
        let question = format!("Are you sure you want to force deregister volume \"{}\"? [y/N] ", safe(&vol.id));
        if let Some(code) = crate::cli::ask_exact_yes(&question, "Cancelling volume deregister")? {
            return Ok(code);
        }
    }
    let q = super::in_namespace(&vol.namespace).param("force", args.force.to_string());
    ctx.client
        .delete::<serde_json::Value>(&super::volume_path(&vol.id), &q)
        .await
        .map_err(|e| Failure::new(format!("Error deregistering volume: {e}")))?;
    println!("Successfully deregistered volume \"{}\"!", safe(&vol.id));
    Ok(exit::OK)
}
