//! `dispatch_payload`: writes a dispatched job's payload (base64 in the job) to the file the
//! task's `dispatch_payload { file = "..." }` names, under its `local/` dir. Done once.

use std::fs;

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};

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
        let bytes = crate::client::base64::decode(&payload).map_err(|e| HookError::fatal(format!("dispatch payload: {e}")))?;
        let local = req.config.local_dir();
        let path = local.join(file);
        if !path.starts_with(&local) || file.split('/').any(|p| p == "..") {
            return Err(HookError::fatal(format!("dispatch payload file {file:?} escapes the task's local dir")));
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| HookError::recoverable(format!("create {}: {e}", parent.display())))?;
        }
        fs::write(&path, bytes).map_err(|e| HookError::recoverable(format!("write {}: {e}", path.display())))?;
        Ok(PrestartResponse { done: true, ..PrestartResponse::default() })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_payload_lands_in_local() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::super::tests_support::config();
        config.alloc_dir = dir.path().to_path_buf();
        let job = nomad_proto::Job { payload: Some("aGk=".into()), ..Default::default() };
        let alloc = nomad_proto::Allocation { job: Some(Arc::new(job)), ..Default::default() };
        let task = nomad_proto::Task { dispatch_payload: Some(serde_json::json!({"File": "in/p.txt"})), ..Default::default() };
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        assert!(PrestartHook::prestart(&DispatchPayloadHook, &req).unwrap().done);
        assert_eq!(fs::read(config.local_dir().join("in/p.txt")).unwrap(), b"hi");
        let bad = nomad_proto::Task { dispatch_payload: Some(serde_json::json!({"File": "../x"})), ..Default::default() };
        let req = HookRequest { task: &bad, ..req };
        assert!(PrestartHook::prestart(&DispatchPayloadHook, &req).is_err());
    }
}
