//! `dispatch_payload`: writes a dispatched job's payload (snappy-compressed, base64 in the job,
//! as Nomad stores it) to the file the task's `dispatch_payload { file = "..." }` names, under
//! its `local/` dir, through `fs_beneath` (never through a symlink). Done once.

use std::io::Write;
use std::path::{Component, Path};

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};
use crate::fs_beneath::{FsError, Links};

/// See the module docs.
pub struct DispatchPayloadHook;

impl TaskHook for DispatchPayloadHook {
    fn name(&self) -> &'static str {
        "dispatch_payload"
    }
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        Some(self)
    }
}

impl PrestartHook for DispatchPayloadHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        let file = req
            .task
            .dispatch_payload
            .as_ref()
            .and_then(|d| d.get("File").or_else(|| d.get("file")))
            .and_then(|f| f.as_str())
            .unwrap_or_default();
        let payload = req.alloc.job.as_ref().and_then(|j| j.payload.clone()).unwrap_or_default();
        if file.is_empty() || payload.is_empty() {
            return Ok(PrestartResponse { done: true, ..PrestartResponse::default() });
        }
        let compressed = crate::client::base64::decode(&payload).map_err(|e| HookError::fatal(format!("dispatch payload: {e}")))?;
        let bytes = decompress(&compressed).map_err(|e| HookError::fatal(format!("dispatch payload: {e}")))?;
        let rel = Path::new("local").join(file);
        if file.is_empty() || Path::new(file).is_absolute() || Path::new(file).components().any(|c| c == Component::ParentDir) {
            return Err(HookError::fatal(format!("dispatch payload file {file:?} escapes the task's local dir")));
        }
        // Inside the task dir, which the task can write: nothing through a symlink.
        let failed = |e: FsError| HookError::recoverable(format!("dispatch payload: {e}"));
        let task_dir = req.config.open_task_dir().map_err(failed)?;
        if let Some(parent) = rel.parent() {
            match task_dir.open_dir(parent, Links::Refuse) {
                Ok(_) => {}
                Err(e) if e.is_not_found() => drop(task_dir.create_dir_all(parent, 0o755).map_err(failed)?),
                Err(e) => return Err(failed(e)),
            }
        }
        let mut out = task_dir.write(&rel, 0o644, Links::Refuse).map_err(failed)?;
        out.write_all(&bytes).map_err(|e| HookError::recoverable(format!("write dispatch payload {}: {e}", rel.display())))?;
        Ok(PrestartResponse { done: true, ..PrestartResponse::default() })
    }
}

/// The servers refuse payloads over this (Nomad's `DispatchPayloadSizeLimit`); a job claiming
/// more is not decompressed.
const PAYLOAD_LIMIT: usize = 16 * 1024;

fn decompress(compressed: &[u8]) -> Result<Vec<u8>, String> {
    let len = snap::raw::decompress_len(compressed).map_err(|e| format!("not snappy-compressed: {e}"))?;
    if len > PAYLOAD_LIMIT {
        return Err(format!("{len} bytes once decompressed, more than the {PAYLOAD_LIMIT} a dispatch may carry"));
    }
    snap::raw::Decoder::new().decompress_vec(compressed).map_err(|e| format!("not snappy-compressed: {e}"))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::Arc;

    use super::*;

    /// A payload as the servers store it.
    fn stored(raw: &[u8]) -> Option<String> {
        use base64::Engine;
        Some(base64::engine::general_purpose::STANDARD.encode(snap::raw::Encoder::new().compress_vec(raw).unwrap()))
    }

    #[test]
    fn payloads_are_decompressed_within_the_limit() {
        let raw = vec![b'a'; PAYLOAD_LIMIT];
        assert_eq!(decompress(&snap::raw::Encoder::new().compress_vec(&raw).unwrap()).unwrap(), raw);
        let too_big = snap::raw::Encoder::new().compress_vec(&vec![b'a'; PAYLOAD_LIMIT + 1]).unwrap();
        assert!(decompress(&too_big).unwrap_err().contains("16385 bytes"));
        assert!(decompress(b"hi").unwrap_err().contains("not snappy"));
    }

    #[test]
    fn the_payload_lands_in_local() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        fs::create_dir_all(config.local_dir()).unwrap();
        let job = nomad_proto::Job { payload: stored(b"hi"), ..Default::default() };
        let alloc = nomad_proto::Allocation { job: Some(Arc::new(job)), ..Default::default() };
        let task = nomad_proto::Task { dispatch_payload: Some(serde_json::json!({"File": "in/p.txt"})), ..Default::default() };
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        assert!(PrestartHook::prestart(&DispatchPayloadHook, &req).unwrap().done);
        assert_eq!(fs::read(config.local_dir().join("in/p.txt")).unwrap(), b"hi");
        for escape in ["../x", "/etc/x", "in/../../x"] {
            let bad = nomad_proto::Task { dispatch_payload: Some(serde_json::json!({"File": escape})), ..Default::default() };
            let req = HookRequest { task: &bad, ..req };
            let err = PrestartHook::prestart(&DispatchPayloadHook, &req).unwrap_err();
            assert!(!err.recoverable && err.message.contains("escapes"), "{escape}: {}", err.message);
        }
    }

    #[test]
    fn the_payload_is_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let victim = host.path().join("p.txt");
        fs::write(&victim, b"host file").unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        fs::create_dir_all(config.local_dir()).unwrap();
        std::os::unix::fs::symlink(host.path(), config.local_dir().join("in")).unwrap();
        std::os::unix::fs::symlink(&victim, config.local_dir().join("p.txt")).unwrap();
        let job = nomad_proto::Job { payload: stored(b"hi"), ..Default::default() };
        let alloc = nomad_proto::Allocation { job: Some(Arc::new(job)), ..Default::default() };
        for file in ["in/p.txt", "p.txt"] {
            let task = nomad_proto::Task { dispatch_payload: Some(serde_json::json!({"File": file})), ..Default::default() };
            let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
            let err = PrestartHook::prestart(&DispatchPayloadHook, &req).unwrap_err();
            assert!(err.message.contains("symlink"), "{file}: {}", err.message);
        }
        assert_eq!(fs::read(&victim).unwrap(), b"host file");
    }
}
