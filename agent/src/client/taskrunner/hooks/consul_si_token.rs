//! `consul_si_token`: a Consul Service Identity token for a Connect task (Nomad's `sids_hook.go`).
//!
//! Given only to Connect tasks (`Task::uses_connect`) of an agent whose `consul {}` block has a
//! token, Nomad's only sign that Consul ACLs are on. Before each start it reuses
//! `secrets/si_token` when the file is there (the same token after an agent or task restart),
//! else asks the servers (`Node.DeriveSIToken`) with Nomad's backoff (at once, then 100 ms, then
//! attempt × 5 s up to 3 min, for at most 5 min; only "no server could answer" is retried: an
//! answer that refuses fails the task) and writes the token, mode 0440, through `fs_beneath`
//! (never through a symlink the task planted). Connect native tasks then get it as
//! `CONSUL_HTTP_TOKEN` (`read_token`, used by the task runner's environment).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{AsyncPrestartHook, HookError, HookRequest, PrestartResponse, TaskHook};
use crate::fs_beneath::{Beneath, FsError, Links};

/// The hook's name (part of the on-disk hook state format).
pub const NAME: &str = "consul_si_token";
/// The token's file in the task's secrets dir (`sidsTokenFile`).
pub const TOKEN_FILE: &str = "si_token";
/// `sidsTokenFilePerms`.
pub const TOKEN_MODE: u32 = 0o440;
/// Longest token file read back (a Consul secret is a 36-byte UUID).
const MAX_TOKEN_BYTES: u64 = 4096;

/// Why the servers gave no token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeriveError {
    /// No server could answer: trying again may work.
    Unreachable(String),
    /// A server answered with a refusal or an error (Nomad's server-side errors): not retried.
    Refused(String),
}

/// How the client asks the servers for SI tokens (`Node.DeriveSIToken`), as a narrow seam.
pub trait SiTokenDeriver: Send + Sync {
    /// Tokens (secrets) by task for `tasks` of alloc `alloc_id`.
    fn derive(&self, alloc_id: String, tasks: Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, String>, DeriveError>>;
}

/// Nomad's derivation timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// `sidsBackoffBaseline` (5 s): the wait before attempt n ≥ 2 is n × this.
    pub baseline: Duration,
    /// `sidsBackoffLimit` (3 min).
    pub limit: Duration,
    /// `sidsDerivationTimeout` (5 min) for all attempts.
    pub timeout: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { baseline: Duration::from_secs(5), limit: Duration::from_secs(180), timeout: Duration::from_secs(300) }
    }
}

impl Backoff {
    /// The wait before attempt `attempt` (`computeBackoff`).
    pub fn before(&self, attempt: u32) -> Duration {
        match attempt {
            0 => Duration::ZERO,
            1 => Duration::from_millis(100),
            n => self.baseline.saturating_mul(n).min(self.limit),
        }
    }
}

/// See the module docs.
pub struct ConsulSiTokenHook {
    deriver: Arc<dyn SiTokenDeriver>,
    alloc_id: String,
    task: String,
    /// `<alloc_dir>` (trusted; the task dir beneath it is not).
    alloc_dir: PathBuf,
    backoff: Backoff,
}

impl ConsulSiTokenHook {
    /// The hook for `task` of alloc `alloc_id`, whose alloc dir is `alloc_dir`.
    pub fn new(deriver: Arc<dyn SiTokenDeriver>, alloc_id: &str, task: &str, alloc_dir: PathBuf, backoff: Backoff) -> ConsulSiTokenHook {
        ConsulSiTokenHook { deriver, alloc_id: alloc_id.to_string(), task: task.to_string(), alloc_dir, backoff }
    }

    fn task_dir(&self) -> Result<Beneath, FsError> {
        Beneath::open(&self.alloc_dir)?.open_dir(Path::new(&self.task), Links::Refuse)
    }

    async fn derive(&self) -> Result<String, HookError> {
        let attempts = async {
            let mut attempt = 0u32;
            loop {
                tokio::time::sleep(self.backoff.before(attempt)).await;
                match self.deriver.derive(self.alloc_id.clone(), vec![self.task.clone()]).await {
                    Ok(mut tokens) => {
                        return tokens.remove(&self.task).ok_or_else(|| "response does not include token for task".to_string());
                    }
                    Err(DeriveError::Refused(e)) => return Err(e),
                    Err(DeriveError::Unreachable(e)) => {
                        tracing::warn!(alloc_id = %self.alloc_id, task = %self.task, attempt, error = %e, "failed attempt to derive SI token");
                    }
                }
                attempt = attempt.saturating_add(1);
            }
        };
        let result = match tokio::time::timeout(self.backoff.timeout, attempts).await {
            Ok(r) => r,
            Err(_) => Err(format!("no server answered within {:?}", self.backoff.timeout)),
        };
        result.map_err(|e| {
            tracing::error!(alloc_id = %self.alloc_id, task = %self.task, error = %e, "failed to derive SI token");
            HookError::fatal(format!("failed to derive SI token: {e}"))
        })
    }
}

/// The token in `secrets/si_token` of the task dir, if the file is there: read beneath the dir,
/// never through a symlink, at most 4 KiB.
pub fn read_token(task_dir: &Beneath) -> Result<Option<String>, FsError> {
    let rel = Path::new("secrets").join(TOKEN_FILE);
    let file = match task_dir.read(&rel, Links::Refuse) {
        Ok(f) => f,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut token = String::new();
    file.take(MAX_TOKEN_BYTES).read_to_string(&mut token).map_err(|source| FsError::Io {
        op: "read",
        base: task_dir.path().to_path_buf(),
        path: rel,
        source,
    })?;
    Ok(Some(token))
}

fn write_token(task_dir: &Beneath, token: &str) -> Result<(), String> {
    let rel = Path::new("secrets").join(TOKEN_FILE);
    let mut f = task_dir.write(&rel, TOKEN_MODE, Links::Refuse).map_err(|e| e.to_string())?;
    // Exactly 0440 whatever the umask (on the fd, not the path).
    f.set_permissions(std::fs::Permissions::from_mode(TOKEN_MODE)).map_err(|e| e.to_string())?;
    f.write_all(token.as_bytes()).map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())
}

impl TaskHook for ConsulSiTokenHook {
    fn name(&self) -> &'static str {
        NAME
    }
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        Some(self)
    }
}

impl AsyncPrestartHook for ConsulSiTokenHook {
    fn prestart<'a>(&'a self, _req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move {
            let failed = |e: FsError| HookError::recoverable(format!("failed to recover SI token: {e}"));
            let task_dir = self.task_dir().map_err(failed)?;
            // Not marked done: every start looks for the file, so a secrets dir that lost it
            // (a tmpfs after a reboot) gets a new token instead of none.
            if read_token(&task_dir).map_err(failed)?.is_some_and(|t| !t.is_empty()) {
                return Ok(PrestartResponse::default());
            }
            let token = self.derive().await?;
            write_token(&task_dir, &token).map_err(|e| HookError::recoverable(format!("failed to write SI token: {e}")))?;
            tracing::info!(alloc_id = %self.alloc_id, task = %self.task, "derived SI token");
            Ok(PrestartResponse::default())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::sync::Mutex;

    use super::*;

    /// Answers from a script, recording the calls.
    struct Scripted {
        answers: Mutex<Vec<Result<BTreeMap<String, String>, DeriveError>>>,
        calls: Mutex<Vec<(String, Vec<String>)>>,
    }

    impl Scripted {
        fn new(mut answers: Vec<Result<BTreeMap<String, String>, DeriveError>>) -> Arc<Scripted> {
            answers.reverse();
            Arc::new(Scripted { answers: Mutex::new(answers), calls: Mutex::default() })
        }
        fn calls(&self) -> usize {
            self.calls.lock().unwrap().len()
        }
    }

    impl SiTokenDeriver for Scripted {
        fn derive(&self, alloc_id: String, tasks: Vec<String>) -> BoxFuture<'static, Result<BTreeMap<String, String>, DeriveError>> {
            self.calls.lock().unwrap().push((alloc_id, tasks));
            let next = self.answers.lock().unwrap().pop().unwrap_or(Err(DeriveError::Unreachable("script ended".into())));
            Box::pin(async move { next })
        }
    }

    fn token(t: &str) -> Result<BTreeMap<String, String>, DeriveError> {
        Ok(BTreeMap::from([("sidecar".to_string(), t.to_string())]))
    }

    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sidecar/secrets")).unwrap();
        let alloc_dir = dir.path().to_path_buf();
        (dir, alloc_dir)
    }

    /// Runs the hook's prestart with a request it does not read.
    async fn prestart(hook: &ConsulSiTokenHook) -> Result<PrestartResponse, HookError> {
        let (alloc, task, config) =
            (nomad_proto::Allocation::default(), nomad_proto::Task::default(), super::super::tests_support::config());
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        AsyncPrestartHook::prestart(hook, &req).await
    }

    fn fast() -> Backoff {
        Backoff { baseline: Duration::from_millis(5), limit: Duration::from_millis(20), timeout: Duration::from_secs(20) }
    }

    #[test]
    fn nomads_backoff_schedule() {
        let b = Backoff::default();
        let waits: Vec<u64> = (0..6).map(|a| b.before(a).as_millis() as u64).collect();
        assert_eq!(waits, [0, 100, 10_000, 15_000, 20_000, 25_000]);
        assert_eq!(b.before(100), Duration::from_secs(180), "capped at 3 min");
        assert_eq!(b.timeout, Duration::from_secs(300));
    }

    #[tokio::test]
    async fn derives_once_writes_0440_and_reuses_the_file_after() {
        let (_d, alloc_dir) = fixture();
        let servers = Scripted::new(vec![Err(DeriveError::Unreachable("no servers known".into())), token("secret-1")]);
        let hook = ConsulSiTokenHook::new(servers.clone(), "a1", "sidecar", alloc_dir.clone(), fast());
        prestart(&hook).await.unwrap();
        let path = alloc_dir.join("sidecar/secrets/si_token");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret-1");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o440);
        assert_eq!(*servers.calls.lock().unwrap(), vec![("a1".to_string(), vec!["sidecar".to_string()]); 2], "retried once");

        // A restart (of the task, or of the agent: a new hook) finds the file: no new token.
        let again = ConsulSiTokenHook::new(servers.clone(), "a1", "sidecar", alloc_dir.clone(), fast());
        prestart(&again).await.unwrap();
        assert_eq!(servers.calls(), 2);
        assert_eq!(read_token(&Beneath::open(&alloc_dir.join("sidecar")).unwrap()).unwrap().as_deref(), Some("secret-1"));
    }

    #[tokio::test]
    async fn a_refusal_fails_the_task_at_once() {
        let (_d, alloc_dir) = fixture();
        let servers = Scripted::new(vec![Err(DeriveError::Refused(
            "Requested Consul Service Identity tokens for tasks that are not Connect enabled: sidecar".into(),
        ))]);
        let hook = ConsulSiTokenHook::new(servers.clone(), "a1", "sidecar", alloc_dir.clone(), fast());
        let err = prestart(&hook).await.unwrap_err();
        assert!(!err.recoverable);
        assert_eq!(
            err.message,
            "failed to derive SI token: Requested Consul Service Identity tokens for tasks that are not Connect enabled: sidecar"
        );
        assert_eq!(servers.calls(), 1);
        assert!(!alloc_dir.join("sidecar/secrets/si_token").exists());
    }

    #[tokio::test]
    async fn a_planted_symlink_is_refused_not_followed() {
        let (_d, alloc_dir) = fixture();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"host file").unwrap();
        std::os::unix::fs::symlink(&victim, alloc_dir.join("sidecar/secrets/si_token")).unwrap();
        let servers = Scripted::new(vec![token("secret-1")]);
        let hook = ConsulSiTokenHook::new(servers.clone(), "a1", "sidecar", alloc_dir.clone(), fast());
        assert!(prestart(&hook).await.is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"host file", "never written through");
        assert_eq!(servers.calls(), 0, "nothing asked for a dir the agent cannot trust");
    }

    #[tokio::test]
    async fn servers_unreachable_for_the_whole_timeout_fail_the_task() {
        let (_d, alloc_dir) = fixture();
        let servers = Scripted::new(vec![]);
        let backoff =
            Backoff { baseline: Duration::from_millis(10), limit: Duration::from_millis(30), timeout: Duration::from_millis(400) };
        let hook = ConsulSiTokenHook::new(servers.clone(), "a1", "sidecar", alloc_dir, backoff);
        let err = prestart(&hook).await.unwrap_err();
        assert_eq!(err.message, "failed to derive SI token: no server answered within 400ms");
        assert!(!err.recoverable);
        assert!(servers.calls() >= 3, "retried until the timeout: {}", servers.calls());
    }
}
