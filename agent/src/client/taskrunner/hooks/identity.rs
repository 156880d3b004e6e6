//! `identity`: the workload identity of a task with an `identity { env, file }` block (Nomad's
//! `identity_hook.go`). The servers sign it (`Node.SignIdentities`, asked through the same seam
//! and with the same backoff as SI tokens); the hook keeps it in its persisted state, so a
//! restart of the task or the agent reuses it, writes it to `secrets/nomad_token` (0644, as
//! Nomad, through `fs_beneath`) when `file = true`, and the task runner puts it in the task's
//! environment as `NOMAD_TOKEN` when `env = true` ([`token_of`]). It also serves the task API
//! on `secrets/api.sock` ([`crate::client::task_api`]) from before the task starts (and again
//! after an agent restart, from poststart) until the task is dead for good.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::consul_si_token::{Backoff, DeriveError, SiTokenDeriver};
use super::{AsyncPrestartHook, HookError, HookRequest, PoststartHook, PrestartResponse, StopHook, TaskHook};
use crate::client::state::HookState;
use crate::client::task_api::TaskApi;
use crate::fs_beneath::{Beneath, Links};

/// The hook's name (part of the on-disk hook state format).
pub const NAME: &str = "identity";
/// Where the hook keeps the token in its state.
const TOKEN_KEY: &str = "token";
/// The token's file in the task's secrets dir (Nomad's `wiTokenFile`).
pub const TOKEN_FILE: &str = "nomad_token";
/// The file's mode.
const TOKEN_MODE: u32 = 0o644;

/// What a task's `identity` block asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdentityRequest {
    /// `NOMAD_TOKEN` in the environment.
    pub env: bool,
    /// `secrets/nomad_token`.
    pub file: bool,
}

impl IdentityRequest {
    /// The block of `task`, if it has one.
    pub fn of(task: &nomad_proto::Task) -> Option<IdentityRequest> {
        let v = task.identity.as_ref().filter(|v| !v.is_null())?;
        let flag = |k: &str| v.get(k).and_then(serde_json::Value::as_bool).unwrap_or(false);
        Some(IdentityRequest { env: flag("Env"), file: flag("File") })
    }
}

/// The token the hook holds for a task (its persisted state).
pub fn token_of(state: Option<&HookState>) -> Option<&str> {
    state.and_then(|s| s.data.get(TOKEN_KEY)).map(String::as_str).filter(|t| !t.is_empty())
}

/// Asks the servers for the workload identity of `task`, retrying an unreachable server with
/// `backoff` (a refusal is final).
pub async fn sign_identity(signer: &dyn SiTokenDeriver, backoff: Backoff, alloc_id: &str, task: &str) -> Result<String, HookError> {
    let attempts = async {
        let mut attempt = 0u32;
        loop {
            tokio::time::sleep(backoff.before(attempt)).await;
            match signer.derive(alloc_id.to_string(), vec![task.to_string()]).await {
                Ok(mut ids) => {
                    return ids.remove(task).ok_or_else(|| "response does not include an identity for the task".to_string());
                }
                Err(DeriveError::Refused(e)) => return Err(e),
                Err(DeriveError::Unreachable(e)) => {
                    tracing::warn!(alloc_id, task, attempt, error = %e, "failed attempt to get a workload identity");
                }
            }
            attempt = attempt.saturating_add(1);
        }
    };
    match tokio::time::timeout(backoff.timeout, attempts).await {
        Ok(r) => r,
        Err(_) => Err(format!("no server answered within {:?}", backoff.timeout)),
    }
    .map_err(|e| HookError::recoverable(format!("failed to get a workload identity: {e}")))
}

/// See the module docs.
pub struct IdentityHook {
    signer: Arc<dyn SiTokenDeriver>,
    alloc_id: String,
    task: String,
    alloc_dir: PathBuf,
    wants: IdentityRequest,
    backoff: Backoff,
    task_api: Arc<TaskApi>,
    /// Stops the task API socket's server, while one runs.
    serving: Mutex<Option<tokio_util::sync::CancellationToken>>,
}

impl IdentityHook {
    /// The hook for `task` of alloc `alloc_id`.
    pub fn new(
        signer: Arc<dyn SiTokenDeriver>,
        task_api: Arc<TaskApi>,
        alloc_id: &str,
        task: &str,
        alloc_dir: PathBuf,
        wants: IdentityRequest,
        backoff: Backoff,
    ) -> IdentityHook {
        IdentityHook {
            signer,
            alloc_id: alloc_id.into(),
            task: task.into(),
            alloc_dir,
            wants,
            backoff,
            task_api,
            serving: Mutex::default(),
        }
    }

    fn task_dir(&self) -> Result<Beneath, String> {
        Beneath::open(&self.alloc_dir).and_then(|d| d.open_dir(Path::new(&self.task), Links::Refuse)).map_err(|e| e.to_string())
    }

    /// Serves the task API socket unless it already is.
    fn ensure_serving(&self) -> Result<(), String> {
        let mut serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        if serving.as_ref().is_some_and(|s| !s.is_cancelled()) {
            return Ok(());
        }
        let stop = tokio_util::sync::CancellationToken::new();
        self.task_api.serve(&self.task_dir()?, stop.clone())?;
        *serving = Some(stop);
        Ok(())
    }

    async fn sign(&self) -> Result<String, HookError> {
        sign_identity(self.signer.as_ref(), self.backoff, &self.alloc_id, &self.task).await
    }

    fn write_file(&self, token: &str) -> Result<(), String> {
        let task_dir = self.task_dir()?;
        let rel = Path::new("secrets").join(TOKEN_FILE);
        let mut f = task_dir.write(&rel, TOKEN_MODE, Links::Refuse).map_err(|e| e.to_string())?;
        f.set_permissions(std::fs::Permissions::from_mode(TOKEN_MODE)).map_err(|e| e.to_string())?;
        f.write_all(token.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| e.to_string())
    }
}

impl TaskHook for IdentityHook {
    fn name(&self) -> &'static str {
        NAME
    }
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        Some(self)
    }
    fn poststart(&self) -> Option<&dyn PoststartHook> {
        Some(self)
    }
    fn stop(&self) -> Option<&dyn StopHook> {
        Some(self)
    }
}

impl PoststartHook for IdentityHook {
    /// After an agent restart the task runs on without a prestart: serve its socket again.
    fn poststart(&self, _req: &HookRequest<'_>) -> Result<(), HookError> {
        self.ensure_serving().map_err(|e| HookError::recoverable(format!("failed to serve the task API: {e}")))
    }
}

impl StopHook for IdentityHook {
    fn stop(&self, _req: &HookRequest<'_>) -> Result<(), HookError> {
        if let Some(stop) = self.serving.lock().unwrap_or_else(|e| e.into_inner()).take() {
            stop.cancel();
        }
        let secrets = self.task_dir().and_then(|d| d.open_dir(Path::new("secrets"), Links::Refuse).map_err(|e| e.to_string()));
        match secrets.map(|s| s.remove_file(Path::new(crate::client::task_api::SOCKET))) {
            Ok(Err(e)) if !e.is_not_found() => Err(HookError::recoverable(format!("failed to remove the task API socket: {e}"))),
            _ => Ok(()),
        }
    }
}

impl AsyncPrestartHook for IdentityHook {
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move {
            // Not marked done: every start rewrites the file (a tmpfs secrets dir loses it on a reboot).
            let token = match token_of(req.previous) {
                Some(t) => t.to_string(),
                None => self.sign().await?,
            };
            if self.wants.file {
                self.write_file(&token).map_err(|e| HookError::recoverable(format!("failed to write the workload identity: {e}")))?;
            }
            self.ensure_serving().map_err(|e| HookError::recoverable(format!("failed to serve the task API: {e}")))?;
            let mut out = PrestartResponse::default();
            out.data.insert(TOKEN_KEY.into(), token);
            Ok(out)
        })
    }
}
