//! `nomad-rs volume ...`: CSI volumes (`command/volume_*.go`).
//!
//! Every command is served by nomad-rs: `create` and `delete` through a controller of the
//! volume's plugin, `detach` for nodes that are down or already collected too.

pub mod create;
pub mod delete;
pub mod deregister;
pub mod detach;
pub mod register;
pub mod status;

use std::io::Read;

use clap::{Args, Subcommand};
use nomad_proto::csi::{CsiVolListStub, CsiVolume};
use nomad_proto::jobspec::volume::MAX_VOLUME_SPEC_BYTES;

use super::api::{ApiFlags, Query};
use super::format::table_with_header;
use super::{CmdResult, Ctx, Failure};

/// `nomad-rs volume`.
#[derive(Debug, Args)]
pub struct VolumeArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The volume command.
    #[command(subcommand)]
    pub command: VolumeCommand,
}

/// Volume commands.
#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create or update a volume from a specification file.
    #[command(long_about = register::LONG_ABOUT)]
    Register(register::RegisterArgs),
    /// Remove an unused volume.
    #[command(long_about = deregister::LONG_ABOUT)]
    Deregister(deregister::DeregisterArgs),
    /// List volumes, or show one volume's details and allocations.
    #[command(long_about = status::LONG_ABOUT)]
    Status(status::StatusArgs),
    /// Create an external volume and register it (the servers must support CSIVolume.Create).
    #[command(long_about = create::LONG_ABOUT)]
    Create(create::CreateArgs),
    /// Delete an external volume and deregister it (the servers must support CSIVolume.Delete).
    #[command(long_about = delete::LONG_ABOUT)]
    Delete(delete::DeleteArgs),
    /// Detach a volume from a client node.
    #[command(long_about = detach::LONG_ABOUT)]
    Detach(detach::DetachArgs),
}

/// Runs a volume command.
pub async fn run(a: VolumeArgs) -> CmdResult {
    match a.command {
        VolumeCommand::Register(r) => register::run(&a.api, r).await,
        VolumeCommand::Deregister(d) => deregister::run(&a.api, d).await,
        VolumeCommand::Status(s) => status::run(&a.api, s).await,
        VolumeCommand::Create(c) => create::run(&a.api, c).await,
        VolumeCommand::Delete(d) => delete::run(&a.api, d).await,
        VolumeCommand::Detach(d) => detach::run(&a.api, d).await,
    }
}

/// Reads and parses a volume specification: the file, or stdin for `-`. At most
/// [`MAX_VOLUME_SPEC_BYTES`] are read; a larger input is refused without reading the rest.
pub fn load_spec(file: &str) -> Result<CsiVolume, Failure> {
    let (name, bytes) = if file == "-" {
        ("<stdin>".to_string(), read_limited(std::io::stdin().lock()).map_err(|e| Failure::new(format!("Failed to read stdin: {e}")))?)
    } else {
        let f = std::fs::File::open(file).map_err(|e| Failure::new(format!("Failed to read file: {e}")))?;
        (file.to_string(), read_limited(f).map_err(|e| Failure::new(format!("Failed to read file: {e}")))?)
    };
    if bytes.len() > MAX_VOLUME_SPEC_BYTES {
        return Err(Failure::new(format!(
            "Error parsing the volume specification: {name}: the file is over {MAX_VOLUME_SPEC_BYTES} bytes, the most a volume specification may be"
        )));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| Failure::new(format!("Error parsing the volume specification: {name}: not UTF-8 text")))?;
    nomad_proto::jobspec::volume::parse(&text, &name).map_err(|e| Failure::new(format!("Error parsing the volume specification: {e}")))
}

/// Up to one byte more than the limit, so a larger input is seen as such.
fn read_limited(r: impl Read) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    r.take(MAX_VOLUME_SPEC_BYTES as u64 + 1).read_to_end(&mut out)?;
    Ok(out)
}

/// Nomad's volume list table (`csiFormatSortedVolumes`), sorted by ID.
pub fn volumes_table(vols: &mut [CsiVolListStub]) -> String {
    vols.sort_by(|a, b| a.id.cmp(&b.id).then_with(|| a.namespace.cmp(&b.namespace)));
    let rows = vols
        .iter()
        .map(|v| {
            vec![
                v.id.clone(),
                v.name.clone(),
                v.namespace.clone(),
                v.plugin_id.clone(),
                v.schedulable.to_string(),
                v.access_mode.as_str().to_string(),
            ]
        })
        .collect();
    table_with_header(&["ID", "Name", "Namespace", "Plugin ID", "Schedulable", "Access Mode"], rows)
}

/// The volumes whose ID starts with `prefix`, in the client's namespace (`-namespace '*'` for all).
pub async fn list(ctx: &Ctx, prefix: &str) -> Result<Vec<CsiVolListStub>, Failure> {
    let q = Query::new().param("type", "csi");
    let q = if prefix.is_empty() { q } else { q.prefix(prefix) };
    Ok(ctx
        .client
        .get::<Option<Vec<CsiVolListStub>>>("/v1/volumes", &q)
        .await
        .map_err(|e| Failure::new(format!("Error querying volumes: {e}")))?
        .value
        .unwrap_or_default())
}

/// The one volume `prefix` names, as Nomad resolves it: the only match, or the only one whose
/// ID equals the prefix (the same ID in two namespaces is ambiguous).
pub async fn resolve(ctx: &Ctx, prefix: &str) -> Result<CsiVolListStub, Failure> {
    let mut vols = list(ctx, prefix).await?;
    // A server that ignores `prefix=` still resolves correctly.
    vols.retain(|v| v.id.starts_with(prefix));
    if vols.is_empty() {
        return Err(Failure::new(format!("No volumes(s) with prefix or ID {prefix:?} found")));
    }
    if vols.len() == 1 {
        return Ok(vols.remove(0));
    }
    let exact: Vec<usize> = vols.iter().enumerate().filter(|(_, v)| v.id == prefix).map(|(i, _)| i).collect();
    if let [one] = exact.as_slice() {
        return Ok(vols.swap_remove(*one));
    }
    Err(Failure::new(format!("Prefix matched multiple volumes\n\n{}", volumes_table(&mut vols))))
}

/// The path of a volume's route (`/v1/volume/csi/<id>`).
pub fn volume_path(id: &str) -> String {
    format!("/v1/volume/csi/{}", super::api::encode_path(id))
}

/// A query in the volume's namespace.
pub fn in_namespace(namespace: &str) -> Query {
    Query::new().param("namespace", namespace.to_string())
}
