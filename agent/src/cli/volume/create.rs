//! `nomad-rs volume create <file>`: `PUT /v1/volume/csi/<id>/create` (`command/volume_create.go`).
//!
//! The servers ask a controller of the volume's plugin to create it, then register it.

use clap::Args;
use nomad_proto::csi::CsiVolume;
use serde::{Deserialize, Serialize};

use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::safe;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// The long help.
pub const LONG_ABOUT: &str = "Creates a volume in an external storage provider and registers it in Nomad.\n\nIf the supplied path is \
                        \"-\" the volume file is read from stdin. Otherwise, it is read from the file at the supplied path.";

/// Arguments of `volume create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The volume specification file, or `-` for stdin.
    #[arg(value_name = "INPUT")]
    pub file: String,
}

/// `CSIVolumeCreateRequest`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct CreateRequest {
    volumes: Vec<CsiVolume>,
}

/// `CSIVolumeCreateResponse`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct CreateResponse {
    volumes: Vec<CsiVolume>,
}

/// Runs `volume create`.
pub async fn run(api: &ApiFlags, args: CreateArgs) -> CmdResult {
    let vol = super::load_spec(&args.file)?;
    let ctx = Ctx::new(api)?;
    let path = format!("{}/create", super::volume_path(&vol.id));
    let resp = ctx
        .client
        .put::<Option<CreateResponse>>(&path, &Query::new(), &CreateRequest { volumes: vec![vol] })
        .await
        .map_err(|e| Failure::new(format!("Error creating volume: {e}")))?
        .value
        .unwrap_or_default();
    for v in resp.volumes {
        println!("Created external volume {} with ID {}", safe(&v.external_id), safe(&v.id));
    }
    Ok(exit::OK)
}
