//! `nomad-rs volume register <file>`: `PUT /v1/volume/csi/<id>` (`command/volume_register.go`).

use clap::Args;
use nomad_proto::csi::CsiVolumeRegisterRequest;

use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::safe;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// The long help.
pub const LONG_ABOUT: &str = "Creates or updates a volume in Nomad. The volume must exist on the remote storage provider before it can \
                        be used by a task.\n\nIf the supplied path is \"-\" the volume file is read from stdin. Otherwise, it is \
                        read from the file at the supplied path. The file is HCL or JSON in Nomad's volume specification format \
                        (type = \"csi\").";

/// Arguments of `volume register`.
#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The volume specification file, or `-` for stdin.
    #[arg(value_name = "INPUT")]
    pub file: String,
}

/// Runs `volume register`.
pub async fn run(api: &ApiFlags, args: RegisterArgs) -> CmdResult {
    let vol = super::load_spec(&args.file)?;
    let ctx = Ctx::new(api)?;
    let id = vol.id.clone();
    let body = CsiVolumeRegisterRequest { volumes: vec![vol] };
    ctx.client
        .put::<serde_json::Value>(&super::volume_path(&id), &Query::new(), &body)
        .await
        .map_err(|e| Failure::new(format!("Error registering volume: {e}")))?;
    println!("Volume \"{}\" registered", safe(&id));
    Ok(exit::OK)
}
