//! `nomad-rs operator snapshot save [-stale] [<file>]`, `restore <file>` and `inspect <file>`:
//! Nomad's commands over `/v1/operator/snapshot`. The archive is checked on both sides: `save`
//! verifies the `Digest` the server sent and the archive's own sums before it keeps the file,
//! `inspect` verifies the sums locally, and the server verifies again on restore.

use std::io::Read;
use std::path::Path;

use clap::{Args, Subcommand};
use nomad_server::snapshot::{MAX_ARCHIVE_BYTES, digest_header, read_archive};

use super::api::Query;
use super::format::kv;
use super::{CmdResult, Ctx, Failure, exit};

/// `operator snapshot` commands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a snapshot of the servers' state to a file.
    Save(SaveArgs),
    /// Restore the servers' state from a snapshot file.
    Restore(FileArg),
    /// Show what a snapshot file holds (ID, size, index, term, version).
    Inspect(FileArg),
}

/// Flags of `operator snapshot save`.
#[derive(Debug, Args)]
pub struct SaveArgs {
    /// Let any server answer, not only the leader (when there is no leader).
    #[arg(long)]
    pub stale: bool,
    /// Where to write it (default `nomad-state-<date>-<unix>.snap`).
    pub file: Option<String>,
}

/// One snapshot file.
#[derive(Debug, Args)]
pub struct FileArg {
    /// The snapshot file.
    pub file: String,
}

/// Runs an `operator snapshot` command; `ctx` is made only for the ones that call the API.
pub async fn run(ctx: impl FnOnce() -> Result<Ctx, Failure>, command: SnapshotCommand) -> CmdResult {
    match command {
        SnapshotCommand::Save(a) => save(&ctx()?, a).await,
        SnapshotCommand::Restore(a) => restore(&ctx()?, &a.file).await,
        SnapshotCommand::Inspect(a) => inspect(&a.file),
    }
}

/// Nomad's default name: `nomad-state-<YYYYMMDD>-<unix seconds>.snap` (its day is not padded).
fn default_file_name(unix: i64) -> String {
    let f = super::format::utc_fields(unix);
    format!("nomad-state-{:04}{:02}{}-{unix}.snap", f.year, f.month, f.day)
}

async fn save(ctx: &Ctx, a: SaveArgs) -> CmdResult {
    let file = a.file.unwrap_or_else(|| default_file_name(super::format::now_nanos() / 1_000_000_000));
    match std::fs::symlink_metadata(&file) {
        Ok(_) => return Err(Failure::new(format!("Destination file already exists: {file:?}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Failure::new(format!("Unexpected failure checking {file:?}: {e}"))),
    }
    let query = if a.stale { Query::new().param("stale", "true") } else { Query::new() };
    let (archive, headers) = ctx
        .client
        .get_bytes("/v1/operator/snapshot", &query)
        .await
        .map_err(|e| Failure::new(format!("Failed to get snapshot file: {e}")))?;
    if let Some(digest) = headers.get("digest").and_then(|v| v.to_str().ok())
        && digest != digest_header(&archive)
    {
        return Err(Failure::new(format!("Failed to get snapshot file: the download does not match its digest {digest:?}")));
    }
    read_archive(&archive).map_err(|e| Failure::new(format!("Failed to get snapshot file: {e}")))?;
    let temp = format!("{file}.tmp");
    write_new(Path::new(&temp), &archive).map_err(|e| Failure::new(format!("Failed to create file: {e}")))?;
    if let Err(e) = std::fs::rename(&temp, &file) {
        let _ = std::fs::remove_file(&temp);
        return Err(Failure::new(format!("Failed to finalize snapshot file: {e}")));
    }
    println!("State file written to {file}");
    Ok(exit::OK)
}

/// Writes a file that must not exist yet (never through a symlink someone left there).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Reads a snapshot file, refusing one over the limit a restore takes before reading it.
fn read_file(file: &str) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len > MAX_ARCHIVE_BYTES as u64 {
        return Err(format!("{file} is {len} bytes, over the {MAX_ARCHIVE_BYTES} a restore takes"));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(MAX_ARCHIVE_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() > MAX_ARCHIVE_BYTES {
        return Err(format!("{file} grew over the {MAX_ARCHIVE_BYTES} bytes a restore takes while it was read"));
    }
    Ok(bytes)
}

async fn restore(ctx: &Ctx, file: &str) -> CmdResult {
    let archive = read_file(file).map_err(|e| Failure::new(format!("Error opening snapshot file: {e}")))?;
    ctx.client
        .put_bytes("/v1/operator/snapshot", &Query::new(), archive)
        .await
        .map_err(|e| Failure::new(format!("Failed to get restore snapshot: {e}")))?;
    println!("Snapshot Restored");
    Ok(exit::OK)
}

fn inspect(file: &str) -> CmdResult {
    let archive = read_file(file).map_err(|e| Failure::new(format!("Error opening snapshot file: {e}")))?;
    let meta = read_archive(&archive).map_err(|e| Failure::new(format!("Error verifying snapshot: {e}")))?.meta;
    println!(
        "{}",
        kv(&[
            ("ID", meta.id),
            ("Size", meta.size.to_string()),
            ("Index", meta.index.to_string()),
            ("Term", meta.term.to_string()),
            ("Version", meta.version.to_string()),
        ])
    );
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_name_is_nomads() {
        // 2023-08-05T00:00:00Z: the day is not zero-padded, as in Nomad's format string.
        assert_eq!(default_file_name(1_691_193_600), "nomad-state-2023085-1691193600.snap");
    }
}
