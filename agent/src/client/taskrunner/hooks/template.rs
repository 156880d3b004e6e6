//! `template`: renders the task's templates before it starts and keeps them current while it
//! runs (Nomad's `template_hook.go`; the work is in [`crate::client::template`]).
//!
//! - Prestart starts the task's [`TemplateManager`] and waits for its first render, with no
//!   timeout (as Nomad): a `Missing: …` event says what it waits for. The variables of
//!   `env = true` templates go into the hook's state, from which the task runner adds them to
//!   the task's environment. A restart of the task does not render again (the manager lives
//!   on) unless the restart policy says `render_templates`.
//! - The manager reads Nomad data with the task's workload identity, which the hook asks the
//!   servers for (Nomad signs one for every task) and keeps in its state.
//! - After an agent restart the task runs on without a prestart: poststart starts the manager
//!   again, and a template whose content changed meanwhile applies its change mode.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;

use super::consul_si_token::{Backoff, SiTokenDeriver};
use super::identity::sign_identity;
use super::{AsyncPrestartHook, HookError, HookRequest, PoststartHook, PrestartResponse, StopHook, TaskHook};
use crate::client::state::HookState;
use crate::client::task_api::TaskApi;
use crate::client::taskrunner::events;
use crate::client::template::{ConsulSource, ManagerConfig, RouterSource, TaskSources, TemplateConfig, TemplateControl, TemplateManager};
use crate::consul::ConsulQuery;

/// The hook's name (part of the on-disk hook state format).
pub const NAME: &str = "template";
/// Where the hook keeps the task's workload identity.
const TOKEN_KEY: &str = "token";
/// The prefix of the env variables in the hook's state.
const ENV_PREFIX: &str = "env:";

/// The variables of the task's `env = true` templates, from the hook's state.
pub fn env_of(state: Option<&HookState>) -> impl Iterator<Item = (&str, &str)> {
    state.into_iter().flat_map(|s| s.data.iter()).filter_map(|(k, v)| k.strip_prefix(ENV_PREFIX).map(|k| (k, v.as_str())))
}

/// What the hook needs from the client.
#[derive(Clone)]
pub struct TemplateDeps {
    /// Signs the task's workload identity.
    pub signer: Arc<dyn SiTokenDeriver>,
    /// How signing retries.
    pub backoff: Backoff,
    /// The agent's router, which the templates read through.
    pub api: Arc<TaskApi>,
    /// The client's `template {}`.
    pub config: TemplateConfig,
    /// The agent's own environment, masked from templates.
    pub host_env: Arc<BTreeMap<String, String>>,
    /// The agent's Consul, for `key`, `service` and the other Consul functions.
    pub consul: Option<Arc<dyn ConsulQuery>>,
}

/// See the module docs.
pub struct TemplateHook {
    deps: TemplateDeps,
    alloc_id: String,
    task: String,
    alloc_dir: PathBuf,
    control: Weak<dyn TemplateControl>,
    manager: Mutex<Option<TemplateManager>>,
}

/// The control handed to the manager: the task runner, while it exists.
struct Control(Weak<dyn TemplateControl>);

impl TemplateControl for Control {
    fn emit_event(&self, event: nomad_proto::TaskEvent) {
        if let Some(c) = self.0.upgrade() {
            c.emit_event(event);
        }
    }
    fn kill_failed(&self, event: nomad_proto::TaskEvent) {
        if let Some(c) = self.0.upgrade() {
            c.kill_failed(event);
        }
    }
    fn restart(&self, event: nomad_proto::TaskEvent) {
        if let Some(c) = self.0.upgrade() {
            c.restart(event);
        }
    }
    fn signal(&self, signal: nix::sys::signal::Signal) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(c) => c.signal(signal).await,
                None => Err("the task is gone".into()),
            }
        })
    }
    fn exec(&self, command: String, args: Vec<String>, timeout: std::time::Duration) -> BoxFuture<'_, Result<i32, String>> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(c) => c.exec(command, args, timeout).await,
                None => Err("the task is gone".into()),
            }
        })
    }
}

impl TemplateHook {
    /// The hook for `task` of alloc `alloc_id`.
    pub fn new(deps: TemplateDeps, control: Weak<dyn TemplateControl>, alloc_id: &str, task: &str, alloc_dir: PathBuf) -> TemplateHook {
        TemplateHook { deps, alloc_id: alloc_id.into(), task: task.into(), alloc_dir, control, manager: Mutex::default() }
    }

    fn start_manager(&self, req: &HookRequest<'_>, token: String, running: bool) -> TemplateManager {
        // The task env without the agent's own variables (Nomad masks them from templates).
        let env: BTreeMap<String, String> =
            req.config.env.iter().filter(|(k, v)| self.deps.host_env.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
        let namespace = if req.alloc.namespace.is_empty() { "default".to_string() } else { req.alloc.namespace.clone() };
        let config = ManagerConfig {
            templates: req.task.templates.clone(),
            alloc_dir: self.alloc_dir.clone(),
            task: self.task.clone(),
            namespace,
            env: Arc::new(env),
            client: self.deps.config.clone(),
            source: Arc::new(TaskSources {
                nomad: RouterSource::new(self.deps.api.clone(), token, self.deps.config.block_query_wait),
                consul: self.deps.consul.clone().map(|c| ConsulSource::new(c, self.deps.config.block_query_wait)),
            }),
            running,
        };
        TemplateManager::start(config, Arc::new(Control(self.control.clone())))
    }

    async fn token(&self, previous: Option<&HookState>) -> Result<String, HookError> {
        match previous.and_then(|s| s.data.get(TOKEN_KEY)).filter(|t| !t.is_empty()) {
            Some(t) => Ok(t.clone()),
            None => sign_identity(self.deps.signer.as_ref(), self.deps.backoff, &self.alloc_id, &self.task).await,
        }
    }
}

impl TaskHook for TemplateHook {
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

fn response(token: String, env: BTreeMap<String, String>) -> PrestartResponse {
    let mut out = PrestartResponse::default();
    out.data.insert(TOKEN_KEY.into(), token);
    out.data.extend(env.into_iter().map(|(k, v)| (format!("{ENV_PREFIX}{k}"), v)));
    out
}

impl AsyncPrestartHook for TemplateHook {
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move {
            let token = self.token(req.previous).await?;
            let render_again = req.task.restart_policy.as_ref().is_some_and(|p| p.render_templates);
            {
                let manager = crate::client::taskrunner::lock(&self.manager);
                if let Some(m) = manager.as_ref().filter(|m| !m.stopped() && !render_again) {
                    // A restart: the manager kept the templates current.
                    return Ok(response(token, m.env()));
                }
            }
            let manager = self.start_manager(req, token.clone(), false);
            let first = manager.first_render().await;
            *crate::client::taskrunner::lock(&self.manager) = Some(manager);
            match first {
                Ok(env) => Ok(response(token, env)),
                Err(e) => {
                    *crate::client::taskrunner::lock(&self.manager) = None;
                    let mut err = HookError::fatal(format!("Template failed: {e}"));
                    err.event = Some(Box::new(events::template_failed(&e)));
                    Err(err)
                }
            }
        })
    }
}

impl PoststartHook for TemplateHook {
    /// After an agent restart the task runs on without a prestart: watch its templates again.
    fn poststart(&self, req: &HookRequest<'_>) -> Result<(), HookError> {
        let mut manager = crate::client::taskrunner::lock(&self.manager);
        if manager.is_some() {
            return Ok(());
        }
        let Some(token) = req.previous.and_then(|s| s.data.get(TOKEN_KEY)).filter(|t| !t.is_empty()).cloned() else {
            return Err(HookError::recoverable("no workload identity to render templates with"));
        };
        *manager = Some(self.start_manager(req, token, true));
        Ok(())
    }
}

impl StopHook for TemplateHook {
    fn stop(&self, _req: &HookRequest<'_>) -> Result<(), HookError> {
        crate::client::taskrunner::lock(&self.manager).take();
        Ok(())
    }
}
