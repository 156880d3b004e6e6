//! `nomad-rs volume delete [-secret k=v]... <id>`: `DELETE /v1/volume/csi/<id>/delete`
//! (`command/volume_delete.go`); the secrets travel in `X-Nomad-CSI-Secrets`.
//!
//! The servers ask a controller of the volume's plugin to delete it, then deregister it.

use clap::Args;

use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::safe;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// The long help.
pub const LONG_ABOUT: &str = "Delete a volume from an external storage provider. The volume must still be registered with Nomad in \
                        order to be deleted. Deleting will fail if the volume is still in use by an allocation or in the \
                        process of being unpublished. If the volume no longer exists, this command will silently return \
                        without an error (Nomad 1.6's servers, and nomad-rs's, answer \"volume not found\" instead).";

/// Arguments of `volume delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Secrets to pass to the plugin, `key=value`; repeatable.
    #[arg(long = "secret", value_name = "KEY=VALUE")]
    pub secrets: Vec<String>,
    /// The volume's ID.
    #[arg(value_name = "VOL_ID")]
    pub id: String,
}

/// Runs `volume delete`.
pub async fn run(api: &ApiFlags, args: DeleteArgs) -> CmdResult {
    let mut pairs = Vec::with_capacity(args.secrets.len());
    for kv in &args.secrets {
        if !kv.contains('=') {
            return Err(Failure::new("Secret must be in the format: -secret key=value"));
        }
        pairs.push(kv.as_str());
    }
    let ctx = Ctx::new(api)?;
    let mut q = Query::new();
    if !pairs.is_empty() {
        q = q.header("X-Nomad-CSI-Secrets", pairs.join(","));
    }
    let path = format!("{}/delete", super::volume_path(&args.id));
    ctx.client.delete::<serde_json::Value>(&path, &q).await.map_err(|e| Failure::new(format!("Error deleting volume: {e}")))?;
    println!("Successfully deleted volume \"{}\"!", safe(&args.id));
    Ok(exit::OK)
}
