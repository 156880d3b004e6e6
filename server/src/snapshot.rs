//! Operator snapshots (`/v1/operator/snapshot`, `nomad-rs operator snapshot save|restore|inspect`).
//!
//! An archive is laid out as Nomad's (`helper/snapshot`): a gzipped tar holding `meta.json`
//! (the snapshot's ID, index, term, version and size), `state.bin` (the state in the format Raft
//! snapshots use, [`crate::state::State::to_bytes`]: not Nomad's bytes) and `SHA256SUMS` (the
//! SHA-256 of the other two, as `sha256sum` prints them). Reading checks every sum and refuses
//! an archive whose files, sums or compressed stream do not add up, so a damaged file is never
//! restored. Every part has a size limit, checked before it is read into memory.

use std::io::Read;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest archive `PUT /v1/operator/snapshot` takes: the limit of every request body, so a
/// follower can hand a restore to the leader.
pub const MAX_ARCHIVE_BYTES: usize = crate::http::util::MAX_BODY_BYTES;

/// The largest `state.bin` a restore takes. The restore travels to every server as one Raft log
/// entry (the state as a JSON string), which must fit a message between servers
/// (`MAX_MESSAGE_BYTES`, 256 MiB) with room for its escaping.
pub const MAX_STATE_BYTES: u64 = 160 * 1024 * 1024;

/// The largest `meta.json` or `SHA256SUMS` read.
const MAX_SMALL_FILE_BYTES: u64 = 64 * 1024;

/// `meta.json`'s format version.
pub const SNAPSHOT_VERSION: u64 = 1;

const META: &str = "meta.json";
const STATE: &str = "state.bin";
const SUMS: &str = "SHA256SUMS";

/// `meta.json`: hashicorp/raft's `SnapshotMeta` fields that mean something here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SnapshotMeta {
    /// Format version.
    pub version: u64,
    /// `<term>-<index>-<unix millis>`, as hashicorp/raft names snapshots.
    #[serde(rename = "ID")]
    pub id: String,
    /// Raft index of the last change the state holds.
    pub index: u64,
    /// Raft term of the leader that saved it.
    pub term: u64,
    /// Bytes of `state.bin`.
    pub size: u64,
}

impl SnapshotMeta {
    /// The meta of a state saved at `index` in `term` at `unix_millis`.
    pub fn new(index: u64, term: u64, unix_millis: i64, size: u64) -> SnapshotMeta {
        SnapshotMeta { version: SNAPSHOT_VERSION, id: format!("{term}-{index}-{unix_millis}"), index, term, size }
    }
}

/// Why an archive was refused. The texts follow Nomad's (`failed to read snapshot file: ...`).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Not gzip, or a broken compressed stream.
    #[error("failed to decompress snapshot: {0}")]
    Decompress(String),
    /// The tar layout, a file's size or a checksum is wrong.
    #[error("failed to read snapshot file: {0}")]
    Read(String),
    /// Writing the archive failed.
    #[error("failed to write snapshot file: {0}")]
    Write(String),
}

/// A verified archive: its meta and its state bytes.
#[derive(Debug)]
pub struct Archive {
    /// `meta.json`.
    pub meta: SnapshotMeta,
    /// `state.bin`.
    pub state: Vec<u8>,
}

/// Writes the archive of `state` (the bytes of [`crate::state::State::to_bytes`]).
pub fn write_archive(meta: &SnapshotMeta, state: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    let write_err = |e: std::io::Error| ArchiveError::Write(e.to_string());
    let mut meta_json = serde_json::to_vec(meta).map_err(|e| ArchiveError::Write(format!("failed to encode snapshot metadata: {e}")))?;
    meta_json.push(b'\n');
    let sums = format!("{}  {META}\n{}  {STATE}\n", hex_sha256(&meta_json), hex_sha256(state));
    let mtime = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default()));
    for (name, bytes) in [(META, meta_json.as_slice()), (STATE, state), (SUMS, sums.as_bytes())] {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o600);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, bytes).map_err(write_err)?;
    }
    let gz = tar.into_inner().map_err(write_err)?;
    gz.finish().map_err(write_err)
}

/// Reads and verifies an archive: every file it holds is expected, within its limit and
/// matches its sum; nothing follows the tar in the compressed stream.
pub fn read_archive(archive: &[u8]) -> Result<Archive, ArchiveError> {
    let read_err = ArchiveError::Read;
    let gz = flate2::read::GzDecoder::new(archive);
    if gz.header().is_none() {
        return Err(ArchiveError::Decompress("not a gzip stream".into()));
    }
    let (mut meta, mut state, mut sums) = (None, None, None);
    let mut tar = tar::Archive::new(gz);
    let entries = tar.entries().map_err(|e| read_err(format!("failed reading snapshot: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_err(format!("failed reading snapshot: {e}")))?;
        let name = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&name).into_owned();
        let limit = match name.as_str() {
            META | SUMS => MAX_SMALL_FILE_BYTES,
            STATE => MAX_STATE_BYTES,
            _ => return Err(read_err(format!("unexpected file {name:?} in snapshot"))),
        };
        let size = entry.header().size().map_err(|e| read_err(format!("{name}: {e}")))?;
        if size > limit {
            return Err(read_err(format!("{name} is {size} bytes, over the limit of {limit}")));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        (&mut entry).take(limit).read_to_end(&mut bytes).map_err(|e| read_err(format!("failed to read {name}: {e}")))?;
        let slot = match name.as_str() {
            META => &mut meta,
            STATE => &mut state,
            _ => &mut sums,
        };
        if slot.replace(bytes).is_some() {
            return Err(read_err(format!("{name} appears twice in snapshot")));
        }
    }
    conclude(&mut tar.into_inner())?;
    let meta_bytes = meta.ok_or_else(|| read_err(integrity(format!("file missing for {META:?}"))))?;
    let state = state.ok_or_else(|| read_err(integrity(format!("file missing for {STATE:?}"))))?;
    verify_sums(sums.as_deref().unwrap_or_default(), &[(META, &meta_bytes), (STATE, &state)]).map_err(|e| read_err(integrity(e)))?;
    let meta: SnapshotMeta =
        serde_json::from_slice(&meta_bytes).map_err(|e| read_err(format!("failed to decode snapshot metadata: {e}")))?;
    if meta.size != state.len() as u64 {
        return Err(read_err(format!("{STATE} is {} bytes, its metadata says {}", state.len(), meta.size)));
    }
    Ok(Archive { meta, state })
}

fn integrity(e: String) -> String {
    format!("failed checking integrity of snapshot: {e}")
}

/// Reads what is left of the compressed stream after the tar: only its zero padding may
/// remain, and the stream must end cleanly (gzip's trailer checksum is checked at its end).
fn conclude(gz: &mut impl Read) -> Result<(), ArchiveError> {
    let mut rest = Vec::new();
    gz.take(MAX_SMALL_FILE_BYTES + 1).read_to_end(&mut rest).map_err(|e| ArchiveError::Decompress(e.to_string()))?;
    if rest.len() as u64 > MAX_SMALL_FILE_BYTES || rest.iter().any(|b| *b != 0) {
        return Err(ArchiveError::Read(format!("{} unread uncompressed bytes remain", rest.len())));
    }
    Ok(())
}

/// Checks a `SHA256SUMS` file against the files read: each line names one, every file is named.
fn verify_sums(sums: &[u8], files: &[(&str, &[u8])]) -> Result<(), String> {
    let text = std::str::from_utf8(sums).map_err(|_| "SHA256SUMS is not text".to_string())?;
    let mut seen = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (sum, name) = line.split_once("  ").ok_or_else(|| format!("malformed line {line:?}"))?;
        let (_, bytes) = files.iter().find(|(n, _)| *n == name).ok_or_else(|| format!("list missing hash for {name:?}"))?;
        if !sum.eq_ignore_ascii_case(&hex_sha256(bytes)) {
            return Err(format!("hash check failed for {name:?}"));
        }
        seen.push(name);
    }
    match files.iter().find(|(name, _)| !seen.contains(name)) {
        Some((name, _)) => Err(format!("file missing for {name:?}")),
        None => Ok(()),
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    Sha256::digest(bytes).iter().flat_map(|b| [HEX[usize::from(b >> 4)] as char, HEX[usize::from(b & 15)] as char]).collect()
}

/// The `Digest` header of a saved archive (`sha-256=<base64>`), which Nomad's API client checks.
pub fn digest_header(archive: &[u8]) -> String {
    use base64::Engine as _;
    format!("sha-256={}", base64::engine::general_purpose::STANDARD.encode(Sha256::digest(archive)))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn sample() -> (SnapshotMeta, Vec<u8>) {
        let state = br#"{"version":1,"index":7}"#.to_vec();
        (SnapshotMeta::new(7, 2, 1_700_000_000_000, state.len() as u64), state)
    }

    /// Rebuilds an archive from (name, bytes) pairs, for damaged layouts.
    fn archive_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (name, bytes) in files {
            let mut header = tar::Header::new_ustar();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o600);
            tar.append_data(&mut header, name, *bytes).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn an_archive_reads_back_as_written() {
        let (meta, state) = sample();
        let archive = write_archive(&meta, &state).unwrap();
        let read = read_archive(&archive).unwrap();
        assert_eq!(read.meta, meta);
        assert_eq!(read.meta.id, "2-7-1700000000000");
        assert_eq!(read.state, state);
        assert!(digest_header(&archive).starts_with("sha-256="));
    }

    #[test]
    fn a_changed_state_fails_its_checksum() {
        let (meta, state) = sample();
        let sums = format!("{}  meta.json\n{}  state.bin\n", hex_sha256(b"{}"), hex_sha256(&state));
        let mut meta_json = serde_json::to_vec(&meta).unwrap();
        meta_json.push(b'\n');
        let sums_ok = format!("{}  meta.json\n{}  state.bin\n", hex_sha256(&meta_json), hex_sha256(&state));
        let tampered = br#"{"version":1,"index":8}"#;
        let e = read_archive(&archive_of(&[("meta.json", &meta_json), ("state.bin", tampered), ("SHA256SUMS", sums_ok.as_bytes())]))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "failed to read snapshot file: failed checking integrity of snapshot: hash check failed for \"state.bin\"");
        let e = read_archive(&archive_of(&[("meta.json", &meta_json), ("state.bin", &state), ("SHA256SUMS", sums.as_bytes())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hash check failed for \"meta.json\""), "{e}");
        let e = read_archive(&archive_of(&[("meta.json", &meta_json), ("state.bin", &state)])).unwrap_err().to_string();
        assert!(e.contains("list missing hash") || e.contains("file missing for"), "{e}");
    }

    #[test]
    fn unexpected_files_missing_files_and_non_gzip_input_are_refused() {
        let (meta, state) = sample();
        let e = read_archive(&archive_of(&[("meta.json", b"{}"), ("extra.sh", b"x")])).unwrap_err().to_string();
        assert_eq!(e, "failed to read snapshot file: unexpected file \"extra.sh\" in snapshot");
        let e = read_archive(b"definitely not gzip").unwrap_err().to_string();
        assert!(e.starts_with("failed to decompress snapshot"), "{e}");
        let mut archive = write_archive(&meta, &state).unwrap();
        let mid = archive.len() / 2;
        archive[mid] ^= 0xff;
        assert!(read_archive(&archive).is_err(), "a flipped byte in the compressed stream is refused");
        archive.truncate(mid);
        assert!(read_archive(&archive).is_err(), "a truncated archive is refused");
    }

    #[test]
    fn a_state_over_the_limit_is_refused_from_its_header_before_it_is_read() {
        // A tar header that claims more than the limit: refused before any of it is read.
        let mut header = tar::Header::new_ustar();
        header.set_path("state.bin").unwrap();
        header.set_size(MAX_STATE_BYTES + 1);
        header.set_mode(0o600);
        header.set_cksum();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(header.as_bytes()).unwrap();
        let e = read_archive(&gz.finish().unwrap()).unwrap_err().to_string();
        assert!(e.contains(&format!("state.bin is {} bytes, over the limit of {MAX_STATE_BYTES}", MAX_STATE_BYTES + 1)), "{e}");
    }
}
