//! `docker`: tasks as containers of a Docker Engine, spoken to over its unix socket (bollard,
//! API version negotiated with the Engine). Docker supervises the container, so there is no
//! executor: the handle keeps the container ID and the agent follows the container's log stream
//! into the alloc's rotated log files, resuming after a restart where it left off.
//!
//! `config.rs` task and plugin config · `container.rs` the create body and container calls ·
//! `exec.rs` commands in a container (script checks, `alloc exec`) · `images.rs`
//! local/load/pull and image GC · `logs.rs` log following · `network.rs` the infra container
//! of a group network · `fingerprint.rs` · `reaper.rs` dangling containers.

pub mod config;
pub mod container;
pub mod exec;
pub mod fingerprint;
pub mod images;
pub mod logs;
pub mod network;
pub mod reaper;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use futures::StreamExt;
use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use nomad_proto::{DriverInfo, Timestamp};
use tokio_util::sync::CancellationToken;

use super::{
    Driver, DriverError, DriverState, ExecOutput, ExecSession, ExitResult, LogConfig, ProcessRef, Recovered, SHARED_DIR, TaskConfig,
    TaskHandle, TaskStatus,
};
use crate::fs_beneath::Links;
pub use config::DockerOptions;
use container::{engine_error, status_of};
use images::Images;
use logs::LogTarget;

const NAME: &str = "docker";
/// Nomad's default `image_pull_timeout`.
const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long an exit waits for the last log lines to be written.
const LOG_DRAIN: Duration = Duration::from_secs(5);
/// How long destroy waits for a killed container.
const DESTROY_WAIT: Duration = Duration::from_secs(10);
/// How long a SIGKILLed exit waits for a late OOM or removal event. A busy Engine records the
/// OOM event seconds after the exit (2 s was too short on a loaded CI machine); a removal ends
/// the wait early.
const OOM_EVENT_GRACE: Duration = Duration::from_secs(5);
/// How long a fingerprint waits for the Engine's answers.
const FINGERPRINT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a `load` tarball name.
const MAX_LOAD_NAME: usize = 4096;

/// A client of the Engine at `socket`, speaking its API version.
async fn connect(socket: &str) -> Result<Docker, DriverError> {
    let unreachable = |e: bollard::errors::Error| DriverError::Docker(format!("no Docker Engine answers at {socket}: {e}"));
    let docker = Docker::connect_with_unix(socket, 120, bollard::API_DEFAULT_VERSION).map_err(unreachable)?;
    docker.negotiate_version().await.map_err(unreachable)
}

struct Follower {
    cancel: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

/// The docker driver.
pub struct DockerDriver {
    options: DockerOptions,
    client: tokio::sync::Mutex<Option<Docker>>,
    ever_detected: AtomicBool,
    reaper_started: AtomicBool,
    /// Containers of tasks this agent runs, and infra containers it made (the reaper leaves
    /// them alone).
    tracked: Arc<Mutex<BTreeSet<String>>>,
    /// Container → the image it holds a reference on.
    image_users: Mutex<HashMap<String, String>>,
    followers: Mutex<HashMap<String, Follower>>,
    images: Arc<Images>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The exit a stopped container reports.
fn exit_of(c: &ContainerInspectResponse) -> ExitResult {
    let state = c.state.clone().unwrap_or_default();
    let oom = state.oom_killed.unwrap_or(false);
    let finished_at = state
        .finished_at
        .as_deref()
        .and_then(|t| Timestamp::parse_rfc3339(t).ok())
        .filter(|t| t.unix_secs() > 0)
        .unwrap_or_else(Timestamp::now);
    let err = if oom { Some("OOM Killed".to_string()) } else { state.error.filter(|e| !e.is_empty()) };
    ExitResult { exit_code: state.exit_code.unwrap_or(-1) as i32, signal: 0, oom_killed: oom, finished_at, err, log_bytes_dropped: 0 }
}

/// What a task whose container was removed behind the agent's back reports.
fn removed_message(container_id: &str) -> String {
    format!("container {container_id} was removed outside Nomad")
}

fn running(c: &ContainerInspectResponse) -> bool {
    c.state.as_ref().and_then(|s| s.running).unwrap_or(false)
}

fn process_ref(c: &ContainerInspectResponse) -> ProcessRef {
    let pid = c.state.as_ref().and_then(|s| s.pid).unwrap_or(0) as i32;
    if pid > 0 { ProcessRef::of(pid).unwrap_or(ProcessRef { pid, start_time: 0 }) } else { ProcessRef { pid: 0, start_time: 0 } }
}

struct HandleParts<'a> {
    container_id: &'a str,
    image_id: &'a str,
    target: LogTarget,
}

fn parts(handle: &TaskHandle) -> Result<HandleParts<'_>, DriverError> {
    handle.check_driver(NAME)?;
    match &handle.driver_state {
        DriverState::Docker { container_id, image_id, alloc_dir, log_max_files, log_max_file_size } => Ok(HandleParts {
            container_id,
            image_id,
            target: LogTarget {
                alloc_dir: alloc_dir.clone(),
                task_name: handle.task_name.clone(),
                state_dir: handle.state_dir.clone(),
                logs: LogConfig { max_files: *log_max_files, max_file_size: *log_max_file_size },
            },
        }),
        other => Err(DriverError::Docker(format!("handle has no container: {other:?}"))),
    }
}

impl DockerDriver {
    /// A driver with the plugin's options; it connects on first use.
    pub fn new(options: DockerOptions) -> DockerDriver {
        DockerDriver {
            options,
            client: tokio::sync::Mutex::new(None),
            ever_detected: AtomicBool::new(false),
            reaper_started: AtomicBool::new(false),
            tracked: Arc::default(),
            image_users: Mutex::default(),
            followers: Mutex::default(),
            images: Images::new(),
        }
    }

    /// Stops following logs and waits for the followers to finish: what an agent that goes away
    /// leaves behind (the containers keep running; a restarted agent resumes their logs).
    pub async fn shutdown(&self) {
        let followers: Vec<Follower> = lock(&self.followers).drain().map(|(_, f)| f).collect();
        for f in followers {
            f.cancel.cancel();
            let _ = f.done.await;
        }
    }

    /// The image reference counts (tests).
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// A client speaking the Engine's API version; made once the Engine answers.
    async fn client(&self) -> Result<Docker, DriverError> {
        let mut client = self.client.lock().await;
        if let Some(c) = client.as_ref() {
            return Ok(c.clone());
        }
        let docker = connect(&self.options.socket).await?;
        *client = Some(docker.clone());
        Ok(docker)
    }

    /// The image's ID: present locally (unless `force_pull` or `latest`), loaded from the task's
    /// tarball, or pulled.
    async fn ensure_image(&self, docker: &Docker, task: &TaskConfig, cfg: &config::TaskConfig, image: &str) -> Result<String, DriverError> {
        if !cfg.force_pull
            && !image.ends_with(":latest")
            && let Some(id) = Images::local_id(docker, image).await?
        {
            return Ok(id);
        }
        if let Some(load) = &cfg.load {
            if load.len() > MAX_LOAD_NAME || Path::new(load).is_absolute() {
                return Err(DriverError::InvalidConfig {
                    driver: NAME,
                    reason: format!("load: {load:?} must be a path under the task's local dir"),
                });
            }
            let tarball = task.open_task_dir()?.open_dir(Path::new("local"), Links::Refuse)?.read(Path::new(load), Links::Refuse)?;
            Images::load(docker, tarball).await?;
            return Images::local_id(docker, image)
                .await?
                .ok_or_else(|| DriverError::ImageUnavailable(format!("image {image} is not in the loaded tarball {load}")));
        }
        let timeout = cfg.image_pull_timeout.unwrap_or(DEFAULT_PULL_TIMEOUT);
        self.images.pull(docker, image, timeout, self.options.pull_activity_timeout).await?;
        Images::local_id(docker, image)
            .await?
            .ok_or_else(|| DriverError::ImageUnavailable(images::not_found_message(image, "pulled but not found")))
    }

    /// The host dirs bound into the container, resolved beneath the alloc dir without symlinks.
    fn task_dirs(task: &TaskConfig) -> Result<container::TaskDirs, DriverError> {
        let alloc_dir = task.open_alloc_dir()?;
        let task_dir = PathBuf::from(&task.task_name);
        let mut resolved = Vec::new();
        for (relative, mode) in [(PathBuf::from(SHARED_DIR), 0o777), (task_dir.join("local"), 0o777), (task_dir.join("secrets"), 0o700)] {
            let dir = match alloc_dir.open_dir(&relative, Links::Refuse) {
                Err(e) if e.is_not_found() => alloc_dir.create_dir_all(&relative, mode)?,
                other => other?,
            };
            resolved.push(dir.real_path()?);
        }
        let [alloc, local, secrets]: [PathBuf; 3] = resolved.try_into().map_err(|_| DriverError::Docker("task dirs".into()))?;
        Ok(container::TaskDirs { alloc, local, secrets })
    }

    fn hold(&self, container_id: &str, image_id: &str) {
        lock(&self.tracked).insert(container_id.to_string());
        if !image_id.is_empty() && lock(&self.image_users).insert(container_id.to_string(), image_id.to_string()).is_none() {
            self.images.acquire(image_id);
        }
    }

    fn let_go(&self, docker: &Docker, container_id: &str) {
        lock(&self.tracked).remove(container_id);
        if let Some(image_id) = lock(&self.image_users).remove(container_id)
            && self.options.gc_image
        {
            self.images.release(docker, &image_id, self.options.image_delay);
        }
    }

    fn start_follower(&self, docker: &Docker, container_id: &str, target: LogTarget) {
        if self.options.disable_log_collection {
            return;
        }
        let mut followers = lock(&self.followers);
        if followers.get(container_id).is_some_and(|f| !f.done.is_finished()) {
            return;
        }
        let cancel = CancellationToken::new();
        let done = tokio::spawn(logs::follow(docker.clone(), container_id.to_string(), target, cancel.clone()));
        followers.insert(container_id.to_string(), Follower { cancel, done });
    }

    /// Lets the follower write what is left, up to [`LOG_DRAIN`].
    async fn drain_follower(&self, container_id: &str) {
        let follower = lock(&self.followers).remove(container_id);
        if let Some(f) = follower
            && tokio::time::timeout(LOG_DRAIN, f.done).await.is_err()
        {
            f.cancel.cancel();
        }
    }

    fn cancel_follower(&self, container_id: &str) {
        if let Some(f) = lock(&self.followers).remove(container_id) {
            f.cancel.cancel();
        }
    }

    /// Waits until the container is not running; the inspect after, or `None` once it is gone.
    async fn wait_stopped(docker: &Docker, id: &str) -> Result<Option<ContainerInspectResponse>, DriverError> {
        loop {
            let mut wait = docker.wait_container(id, None);
            let waited = wait.next().await;
            match docker.inspect_container(id, None).await {
                Ok(c) if !running(&c) => return Ok(Some(c)),
                Ok(_) => {}
                Err(e) if status_of(&e) == Some(404) => return Ok(None),
                Err(e) => tracing::debug!(container = %id, error = %e, "inspect after wait"),
            }
            // Still running: the wait was cut (an Engine restart); wait again shortly.
            tracing::debug!(container = %id, ?waited, "container wait ended while it runs");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Why a SIGKILLed container (exit 137) died, from the Engine's event log: the Engine sets
    /// `OOMKilled` from an OOM event that can arrive after the exit (cgroup v1 notifications race
    /// the exit), and `docker rm -f` kills the container before it removes it, so the exit is
    /// seen before the container is gone. Waits briefly for a late event of either kind.
    async fn explain_sigkill(docker: &Docker, id: &str, started_at: Timestamp, mut exit: ExitResult) -> ExitResult {
        if exit.oom_killed || exit.exit_code != 137 {
            return exit;
        }
        let filters: HashMap<String, Vec<String>> =
            [("container".to_string(), vec![id.to_string()]), ("event".to_string(), vec!["oom".to_string(), "destroy".to_string()])].into();
        let until = Timestamp::now().unix_secs() + OOM_EVENT_GRACE.as_secs() as i64;
        let options = bollard::query_parameters::EventsOptions {
            since: Some((started_at.unix_secs() - 1).to_string()),
            until: Some(until.to_string()),
            filters: Some(filters),
        };
        let mut events = docker.events(Some(options));
        let (mut oom, mut removed) = (false, false);
        let _ = tokio::time::timeout(OOM_EVENT_GRACE * 2, async {
            while let Some(Ok(event)) = events.next().await {
                match event.action.as_deref() {
                    Some("oom") => oom = true,
                    Some("destroy") => removed = true,
                    _ => {}
                }
                // An OOM comes before the exit, a removal after it: either one decides.
                if oom || removed {
                    break;
                }
            }
        })
        .await;
        if oom {
            exit.oom_killed = true;
            exit.err = Some("OOM Killed".to_string());
        } else if removed {
            exit.err = Some(removed_message(id));
        }
        exit
    }

    async fn start_task(&self, task: &TaskConfig) -> Result<TaskHandle, DriverError> {
        let cfg: config::TaskConfig = task.parse_driver_config(NAME)?;
        let docker = self.client().await?;
        let image = container::normalize_image(&cfg.image);
        let dirs = Self::task_dirs(task)?;
        // In a group network the container joins the alloc's infra container.
        let infra = match (&task.netns, &cfg.network_mode) {
            (Some(_), None) => Some(self.infra_container(&docker, &task.alloc_id).await?.and_then(|c| c.id).ok_or_else(|| {
                DriverError::Docker(format!(
                    "the alloc's infra container {} is not running: its group network is gone",
                    network::infra_name(&task.alloc_id)
                ))
            })?),
            _ => None,
        };
        // Everything the task asks is checked before any image work.
        let body = container::create_body(task, &cfg, &self.options, &image, &dirs, infra.as_deref())?;
        let image_id = self.ensure_image(&docker, task, &cfg, &image).await?;
        let name = container::container_name(task);
        let (id, adopted) = container::create(&docker, &name, body).await?;
        lock(&self.tracked).insert(id.clone());
        if !adopted
            && let Err(e) = docker.start_container(&id, None).await
            && status_of(&e) != Some(304)
        {
            lock(&self.tracked).remove(&id);
            let _ = container::remove(&docker, &id).await;
            return Err(engine_error("start container", e));
        }
        let inspected = docker.inspect_container(&id, None).await.map_err(|e| engine_error("inspect container", e))?;
        self.hold(&id, &image_id);
        let handle = TaskHandle {
            driver: NAME.to_string(),
            alloc_id: task.alloc_id.clone(),
            task_name: task.task_name.clone(),
            executor: process_ref(&inspected),
            task: process_ref(&inspected),
            state_dir: task.state_dir.clone(),
            started_at: Timestamp::now(),
            driver_state: DriverState::Docker {
                container_id: id.clone(),
                image_id,
                alloc_dir: task.alloc_dir.clone(),
                log_max_files: task.logs.max_files,
                log_max_file_size: task.logs.max_file_size,
            },
        };
        std::fs::create_dir_all(&task.state_dir).map_err(|e| DriverError::io("create the task state dir", e))?;
        let target = parts(&handle)?.target;
        self.start_follower(&docker, &id, target);
        Ok(handle)
    }
}

impl Drop for DockerDriver {
    fn drop(&mut self) {
        for (_, f) in lock(&self.followers).drain() {
            f.cancel.cancel();
        }
    }
}

impl Driver for DockerDriver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn fingerprint(&self) -> BoxFuture<'_, DriverInfo> {
        Box::pin(async move {
            let ever_detected = self.ever_detected.load(Ordering::SeqCst);
            // A hung Engine must not hold the node's fingerprint (every driver's) for long.
            let answered = tokio::time::timeout(FINGERPRINT_TIMEOUT, async {
                let docker = self.client().await.ok();
                (fingerprint::fingerprint(docker.as_ref(), &self.options, ever_detected).await, docker)
            })
            .await;
            let (info, docker) = match answered {
                Ok(answered) => answered,
                Err(_) => (fingerprint::failed(ever_detected, &format!("no answer within {FINGERPRINT_TIMEOUT:?}")), None),
            };
            if info.healthy {
                self.ever_detected.store(true, Ordering::SeqCst);
                if let (Some(docker), Some(root)) = (docker, &self.options.alloc_root)
                    && self.options.dangling_enabled
                    && !self.reaper_started.swap(true, Ordering::SeqCst)
                {
                    let scope = reaper::Scope {
                        alloc_root: root.display().to_string(),
                        tracked: self.tracked.clone(),
                        netns_dir: PathBuf::from(crate::client::network::NETNS_DIR),
                    };
                    reaper::spawn(docker, scope, self.options.dangling_period, self.options.dangling_grace, self.options.dangling_dry_run);
                }
            }
            info
        })
    }

    /// What `docker stop` sends when the task names no `kill_signal`.
    fn default_kill_signal(&self) -> Signal {
        Signal::SIGTERM
    }

    fn validate_config(&self, task: &TaskConfig) -> Result<(), DriverError> {
        task.parse_driver_config::<config::TaskConfig>(NAME).map(drop)
    }

    fn start<'a>(&'a self, task: &'a TaskConfig) -> BoxFuture<'a, Result<TaskHandle, DriverError>> {
        Box::pin(self.start_task(task))
    }

    fn wait<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<ExitResult, DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            let stopped = Self::wait_stopped(&docker, p.container_id).await?;
            self.drain_follower(p.container_id).await;
            Ok(match stopped {
                Some(c) => Self::explain_sigkill(&docker, p.container_id, handle.started_at, exit_of(&c)).await,
                None => ExitResult::failed(removed_message(p.container_id)),
            })
        })
    }

    fn stop<'a>(&'a self, handle: &'a TaskHandle, signal: Signal, timeout: Duration) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            container::kill(&docker, p.container_id, signal.as_str()).await?;
            if tokio::time::timeout(timeout, Self::wait_stopped(&docker, p.container_id)).await.is_ok() {
                return Ok(());
            }
            container::kill(&docker, p.container_id, "SIGKILL").await?;
            match tokio::time::timeout(DESTROY_WAIT, Self::wait_stopped(&docker, p.container_id)).await {
                Ok(r) => r.map(drop),
                Err(_) => Err(DriverError::Docker(format!("container {} did not stop {DESTROY_WAIT:?} after SIGKILL", p.container_id))),
            }
        })
    }

    fn destroy<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            self.cancel_follower(p.container_id);
            match docker.inspect_container(p.container_id, None).await {
                Err(e) if status_of(&e) == Some(404) => {}
                Err(e) => return Err(engine_error("inspect container", e)),
                Ok(c) => {
                    if running(&c) {
                        container::kill(&docker, p.container_id, "SIGKILL").await?;
                        let _ = tokio::time::timeout(DESTROY_WAIT, Self::wait_stopped(&docker, p.container_id)).await;
                    }
                    if self.options.gc_container {
                        container::remove(&docker, p.container_id).await?;
                    }
                }
            }
            self.let_go(&docker, p.container_id);
            Ok(())
        })
    }

    fn recover<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<Recovered, DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            let c = match docker.inspect_container(p.container_id, None).await {
                Ok(c) => c,
                Err(e) if status_of(&e) == Some(404) => {
                    return Err(DriverError::Docker(format!(
                        "container {} no longer exists: it was removed outside Nomad",
                        p.container_id
                    )));
                }
                Err(e) => return Err(engine_error("inspect container", e)),
            };
            self.hold(p.container_id, p.image_id);
            self.start_follower(&docker, p.container_id, p.target);
            if !running(&c) {
                // Collect what it wrote while nobody followed, then report how it ended.
                self.drain_follower(p.container_id).await;
                return Ok(Recovered::Exited(Self::explain_sigkill(&docker, p.container_id, handle.started_at, exit_of(&c)).await));
            }
            let mut recovered = handle.clone();
            recovered.task = process_ref(&c);
            recovered.executor = recovered.task;
            Ok(Recovered::Running(recovered))
        })
    }

    fn inspect<'a>(&'a self, handle: &'a TaskHandle) -> BoxFuture<'a, Result<TaskStatus, DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            match docker.inspect_container(p.container_id, None).await {
                Ok(c) => {
                    let is_running = running(&c);
                    Ok(TaskStatus {
                        running: is_running,
                        pid: process_ref(&c).pid,
                        started_at: handle.started_at,
                        exit: (!is_running).then(|| exit_of(&c)),
                    })
                }
                Err(e) if status_of(&e) == Some(404) => Ok(TaskStatus {
                    running: false,
                    pid: 0,
                    started_at: handle.started_at,
                    exit: Some(ExitResult::failed(removed_message(p.container_id))),
                }),
                Err(e) => Err(engine_error("inspect container", e)),
            }
        })
    }

    fn signal<'a>(&'a self, handle: &'a TaskHandle, signal: Signal) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            container::kill(&docker, p.container_id, signal.as_str()).await
        })
    }

    fn exec_task<'a>(
        &'a self,
        handle: &'a TaskHandle,
        command: &'a str,
        args: &'a [String],
        timeout: Duration,
    ) -> BoxFuture<'a, Result<ExecOutput, DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            exec::run_bounded(&docker, p.container_id, &handle.task_name, command, args, timeout).await
        })
    }

    fn exec_streaming<'a>(
        &'a self,
        handle: &'a TaskHandle,
        command: &'a str,
        args: &'a [String],
        tty: bool,
        size: Option<(u16, u16)>,
    ) -> BoxFuture<'a, Result<ExecSession, DriverError>> {
        Box::pin(async move {
            let p = parts(handle)?;
            let docker = self.client().await?;
            exec::session(&docker, p.container_id, &handle.task_name, command, args, tty, size).await
        })
    }
}
