//! The templates of one task: render, watch, write, react.
//!
//! One tokio task per task runs [`TemplateManager`]'s loop: it renders every template against the
//! [`Store`], starts a watcher for each dependency a render used, and renders again whenever an
//! answer changes. A template is written only when nothing it uses is missing, and only when its
//! content differs from the file's. Until every template has rendered once, the task waits
//! (the hook awaits [`TemplateManager::first_render`]) and a `Missing: …` event says what for;
//! after that, a changed template applies its change mode, once per batch: restart wins over
//! signals and scripts, and the action waits a random splay first.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use nomad_proto::TaskEvent;
use nomad_proto::job::{Template, template_change_mode};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::render::{Compiled, RenderContext, Rendered};
use super::{Answer, Dependency, Store, TemplateConfig, TemplateSource, Wait, missing_message};
use crate::client::taskrunner::events;
use crate::fs_beneath::{Beneath, Links};

/// Most bytes a template's `source` file or a `file` dependency may have.
const MAX_FILE: u64 = 16 * 1024 * 1024;
/// How often files are read again (consul-template's file query period).
const FILE_POLL: Duration = Duration::from_secs(2);
/// The `Missing:` event is emitted at most this often.
const MISSING_EVENT_PERIOD: Duration = Duration::from_secs(3);

/// What the manager does to the task.
pub trait TemplateControl: Send + Sync {
    /// Records an event.
    fn emit_event(&self, event: TaskEvent);
    /// Kills the task for good, failing it.
    fn kill_failed(&self, event: TaskEvent);
    /// Restarts the running task (not counted as a failure).
    fn restart(&self, event: TaskEvent);
    /// Sends `signal` to the running task.
    fn signal(&self, signal: nix::sys::signal::Signal) -> BoxFuture<'_, Result<(), String>>;
    /// Runs a command in the running task: its exit code.
    fn exec(&self, command: String, args: Vec<String>, timeout: Duration) -> BoxFuture<'_, Result<i32, String>>;
}

/// What the manager is built from.
pub struct ManagerConfig {
    /// The task's templates.
    pub templates: Vec<Template>,
    /// The alloc dir on the host.
    pub alloc_dir: PathBuf,
    /// The task's name (its dir in the alloc dir).
    pub task: String,
    /// The job's namespace.
    pub namespace: String,
    /// The task env (`env`, and `${...}` in paths).
    pub env: Arc<BTreeMap<String, String>>,
    /// The client's `template {}`.
    pub client: TemplateConfig,
    /// Where data comes from.
    pub source: Arc<dyn TemplateSource>,
    /// The task is already running (the agent restarted): a change found by the first render
    /// applies the change modes.
    pub running: bool,
}

/// Where the first render stands.
#[derive(Debug, Clone, PartialEq)]
pub enum FirstRender {
    /// Waiting for data.
    Pending,
    /// Every template was written; the variables of `env = true` templates.
    Done(BTreeMap<String, String>),
    /// A template cannot render.
    Failed(String),
}

/// See the module docs.
pub struct TemplateManager {
    first: watch::Receiver<FirstRender>,
    env: watch::Receiver<BTreeMap<String, String>>,
    stop: CancellationToken,
}

impl Drop for TemplateManager {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TemplateManager {
    /// Starts the loop.
    pub fn start(config: ManagerConfig, control: Arc<dyn TemplateControl>) -> TemplateManager {
        let (first_tx, first) = watch::channel(FirstRender::Pending);
        let (env_tx, env) = watch::channel(BTreeMap::new());
        let stop = CancellationToken::new();
        let runner = Runner { config, control, first: first_tx, env: env_tx, stop: stop.clone() };
        tokio::spawn(runner.run());
        TemplateManager { first, env, stop }
    }

    /// Waits for the first render: the env of `env = true` templates, or why it failed.
    pub async fn first_render(&self) -> Result<BTreeMap<String, String>, String> {
        let mut rx = self.first.clone();
        let state = rx.wait_for(|s| *s != FirstRender::Pending).await.map_err(|_| "the template manager stopped".to_string())?.clone();
        match state {
            FirstRender::Done(env) => Ok(env),
            FirstRender::Failed(e) => Err(e),
            FirstRender::Pending => Err("the template manager stopped".into()),
        }
    }

    /// The env of `env = true` templates as last rendered.
    pub fn env(&self) -> BTreeMap<String, String> {
        self.env.borrow().clone()
    }

    /// The manager stopped (a template failed after the first render).
    pub fn stopped(&self) -> bool {
        self.stop.is_cancelled() || self.first.has_changed().is_err()
    }
}

/// One template and where it goes.
struct Entry {
    spec: Template,
    compiled: Compiled,
    /// Relative to the alloc dir (sandboxed), or absolute on the host (no sandbox).
    dest: Dest,
}

#[derive(Debug, Clone, PartialEq)]
enum Dest {
    Beneath(PathBuf),
    Host(PathBuf),
}

struct Runner {
    config: ManagerConfig,
    control: Arc<dyn TemplateControl>,
    first: watch::Sender<FirstRender>,
    env: watch::Sender<BTreeMap<String, String>>,
    stop: CancellationToken,
}

/// `${VAR}` in a template path, from the task env.
fn interpolate(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        match rest[start + 2..].find('}') {
            Some(end) => {
                let name = &rest[start + 2..start + 2 + end];
                out.push_str(env.get(name).map(String::as_str).unwrap_or_default());
                rest = &rest[start + 3 + end..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Where a template's destination lands, relative to the alloc dir: a relative path is
/// joined to the task dir, an absolute one is re-rooted under it; `..` may reach the alloc dir
/// but not above (Nomad's sandbox).
pub fn destination(task: &str, dest: &str) -> Result<PathBuf, String> {
    let rel = Path::new(dest.trim_start_matches('/'));
    let mut out = PathBuf::new();
    for c in Path::new(task).join(rel).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir if out.pop() => {}
            Component::ParentDir => return Err("template destination path escapes alloc directory".into()),
            _ => {}
        }
    }
    if out.as_os_str().is_empty() || out == Path::new(task) {
        return Err(format!("template destination {dest:?} names a directory, not a file"));
    }
    Ok(out)
}

/// Parses an env template (go-envparse's format): `KEY=value` lines, `#` comments, an optional
/// `export `, and single- or double-quoted values.
pub fn parse_env(content: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in content.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (key, value) = line.split_once('=').ok_or_else(|| format!("line {}: missing =", n + 1))?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("line {}: invalid key {key:?}", n + 1));
        }
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('"') {
            let inner = inner.strip_suffix('"').ok_or_else(|| format!("line {}: unterminated quoted value", n + 1))?;
            let mut v = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => v.push('\n'),
                        Some('t') => v.push('\t'),
                        Some('r') => v.push('\r'),
                        Some(o) => v.push(o),
                        None => return Err(format!("line {}: trailing backslash", n + 1)),
                    }
                } else {
                    v.push(c);
                }
            }
            v
        } else if let Some(inner) = value.strip_prefix('\'') {
            inner.strip_suffix('\'').ok_or_else(|| format!("line {}: unterminated quoted value", n + 1))?.to_string()
        } else {
            value.to_string()
        };
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

fn parse_perms(perms: &str) -> u32 {
    u32::from_str_radix(perms, 8).ok().filter(|p| *p <= 0o7777).unwrap_or(0o644)
}

impl Runner {
    fn alloc_dir(&self) -> Result<Beneath, String> {
        Beneath::open(&self.config.alloc_dir).map_err(|e| e.to_string())
    }

    fn task_dir_path(&self) -> PathBuf {
        self.config.alloc_dir.join(&self.config.task)
    }

    /// A template's text: `data`, or its `source` file (read beneath the alloc dir).
    fn text(&self, t: &Template) -> Result<String, String> {
        if !t.embedded_tmpl.is_empty() && !t.source_path.is_empty() {
            return Err("only one of source or data may be given".into());
        }
        if t.source_path.is_empty() {
            return Ok(t.embedded_tmpl.clone());
        }
        let source = interpolate(&t.source_path, &self.config.env);
        let bytes = if self.config.client.disable_file_sandbox && Path::new(&source).is_absolute() {
            read_limited(std::fs::File::open(&source).map_err(|e| format!("failed to read template source {source:?}: {e}"))?)?
        } else {
            let task_dir = self.task_dir_path();
            let rel = match Path::new(&source).strip_prefix(&task_dir) {
                Ok(rel) => rel.to_path_buf(),
                Err(_) => PathBuf::from(&source),
            };
            let rel = destination(&self.config.task, &rel.to_string_lossy())
                .map_err(|_| "template source path escapes alloc directory".to_string())?;
            let f = self.alloc_dir()?.read(&rel, Links::Beneath).map_err(|e| format!("failed to read template source {source:?}: {e}"))?;
            read_limited(f)?
        };
        String::from_utf8(bytes).map_err(|_| format!("template source {source:?} is not UTF-8"))
    }

    fn compile(&self, store: &Arc<Store>) -> Result<Vec<Entry>, String> {
        let ctx = RenderContext {
            store: store.clone(),
            namespace: self.config.namespace.clone(),
            env: self.config.env.clone(),
            denylist: self.config.client.function_denylist.clone(),
            task_dir: self.task_dir_path(),
            sandbox_disabled: self.config.client.disable_file_sandbox,
            consul: self.config.source.serves_consul(),
        };
        let mut out = Vec::new();
        for (i, t) in self.config.templates.iter().enumerate() {
            let dest_path = interpolate(&t.dest_path, &self.config.env);
            let dest = if self.config.client.disable_file_sandbox && Path::new(&dest_path).is_absolute() {
                Dest::Host(PathBuf::from(&dest_path))
            } else {
                let task_dir = self.task_dir_path();
                let p =
                    Path::new(&dest_path).strip_prefix(&task_dir).map(|r| r.to_string_lossy().into_owned()).unwrap_or(dest_path.clone());
                Dest::Beneath(destination(&self.config.task, &p)?)
            };
            let text = self.text(t)?;
            let name = format!("{}", i + 1);
            let compiled = Compiled::new(&name, &text, &t.left_delim, &t.right_delim, t.err_missing_key, &ctx)?;
            out.push(Entry { spec: t.clone(), compiled, dest });
        }
        Ok(out)
    }

    /// The quiescence window of re-renders: the smallest of the templates' own (clamped to
    /// the client's bounds) or the client's.
    fn wait(&self) -> Wait {
        let client = self.config.client.wait;
        self.config
            .templates
            .iter()
            .map(|t| match &t.wait {
                None => client,
                Some(w) => {
                    let d = |ns: Option<i64>, def: Duration| ns.map_or(def, |n| Duration::from_nanos(n.max(0) as u64));
                    let mut w = Wait { min: d(w.min, client.min), max: d(w.max, client.max) };
                    if let Some(b) = self.config.client.wait_bounds {
                        w.min = w.min.clamp(b.min, b.max.max(b.min));
                        w.max = w.max.clamp(b.min, b.max.max(b.min));
                    }
                    w
                }
            })
            .min_by_key(|w| w.min)
            .unwrap_or(client)
    }

    async fn run(self) {
        let store = Arc::new(Store::default());
        let entries = match self.compile(&store) {
            Ok(e) => e,
            Err(e) => return self.fail(false, e),
        };
        let mut watchers: BTreeMap<Dependency, CancellationToken> = BTreeMap::new();
        let mut versions = store.subscribe();
        let mut first_done = false;
        let mut emitted: (Option<Instant>, String) = (None, String::new());
        let mut pending_missing: Option<String> = None;
        let quiet = self.wait();
        loop {
            versions.borrow_and_update();
            let mut missing: BTreeSet<Dependency> = BTreeSet::new();
            let mut changed: Vec<usize> = Vec::new();
            let mut used: BTreeSet<Dependency> = BTreeSet::new();
            let mut env = BTreeMap::new();
            for (i, e) in entries.iter().enumerate() {
                let rendered = e.compiled.render();
                used.extend(e.compiled.used());
                match rendered {
                    Ok(Rendered::Complete(content)) => {
                        match self.write(e, &content) {
                            Ok(true) => changed.push(i),
                            Ok(false) => {}
                            Err(err) => return self.fail(first_done, err),
                        }
                        if e.spec.envvars {
                            match parse_env(&content) {
                                Ok(vars) => env.extend(vars),
                                Err(err) => return self.fail(first_done, format!("Template failed to read environment variables: {err}")),
                            }
                        }
                    }
                    Ok(Rendered::Missing(m)) => missing.extend(m),
                    Err(err) => return self.fail(first_done, err),
                }
            }
            for dep in used {
                watchers.entry(dep.clone()).or_insert_with(|| self.watch(dep, store.clone()));
            }
            if missing.is_empty() {
                self.env.send_replace(env.clone());
                if !first_done {
                    first_done = true;
                    pending_missing = None;
                    self.first.send_replace(FirstRender::Done(env));
                    if self.config.running && !changed.is_empty() && !self.react(&entries, &changed).await {
                        return;
                    }
                } else if !changed.is_empty() && !self.react(&entries, &changed).await {
                    return;
                }
            } else if !first_done {
                let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
                let message = missing_message(&names);
                if message != emitted.1 {
                    pending_missing = Some(message);
                }
            }
            // Emit a changed Missing set now, or once the period since the last one is over.
            if let Some(message) = pending_missing.take() {
                let due = emitted.0.map_or(Instant::now(), |at| at + MISSING_EVENT_PERIOD);
                if Instant::now() >= due {
                    self.control.emit_event(events::template(&message));
                    emitted = (Some(Instant::now()), message);
                } else {
                    pending_missing = Some(message);
                }
            }
            let missing_due = pending_missing.as_ref().map(|_| emitted.0.map_or(Instant::now(), |at| at + MISSING_EVENT_PERIOD));
            tokio::select! {
                r = versions.changed() => if r.is_err() { return },
                _ = sleep_until_opt(missing_due) => continue,
                _ = self.stop.cancelled() => return,
            }
            if first_done && !quiet.min.is_zero() && !self.quiesce(&mut versions, quiet).await {
                return;
            }
        }
    }

    /// Waits until the answers were stable for `min`, or `max` passed. False when stopped.
    async fn quiesce(&self, versions: &mut watch::Receiver<u64>, wait: Wait) -> bool {
        let latest = tokio::time::Instant::now() + wait.max.max(wait.min);
        loop {
            tokio::select! {
                r = versions.changed() => if r.is_err() { return false },
                _ = tokio::time::sleep(wait.min) => return true,
                _ = tokio::time::sleep_until(latest) => return true,
                _ = self.stop.cancelled() => return false,
            }
        }
    }

    /// A render or write failed: before the first render the hook reports it; after, the task
    /// is killed and fails.
    fn fail(&self, started: bool, err: String) {
        tracing::warn!(task = %self.config.task, error = %err, "template failed");
        if started {
            self.control.kill_failed(events::template_failed(&err));
        } else {
            self.first.send_replace(FirstRender::Failed(err));
        }
        self.stop.cancel();
    }

    /// Applies the change modes of the `changed` templates. False when the task was killed.
    async fn react(&self, entries: &[Entry], changed: &[usize]) -> bool {
        let acting: Vec<&Template> =
            changed.iter().map(|i| &entries[*i].spec).filter(|t| t.change_mode != template_change_mode::NOOP).collect();
        if acting.is_empty() {
            return true;
        }
        let splay = acting.iter().map(|t| t.splay.max(0) as u64).max().unwrap_or(0);
        if splay > 0 {
            let wait = Duration::from_nanos(rand::random::<u64>() % splay);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.stop.cancelled() => return false,
            }
        }
        if acting.iter().any(|t| t.change_mode == template_change_mode::RESTART) {
            self.control.restart(events::restart_signaled("Template with change_mode restart re-rendered"));
            return true;
        }
        let signals: BTreeSet<&str> =
            acting.iter().filter(|t| t.change_mode == template_change_mode::SIGNAL).map(|t| t.change_signal.as_str()).collect();
        for name in signals {
            let signal = match crate::client::driver::signal_named(name) {
                Ok(s) => s,
                Err(e) => {
                    self.control.kill_failed(events::template_failed(&format!("failed to send signal {name}: {e}")));
                    return false;
                }
            };
            self.control.emit_event(events::template_signaling(name));
            if let Err(e) = self.control.signal(signal).await {
                self.control.kill_failed(events::template_failed(&format!("failed to send signals [{name}]: {e}")));
                return false;
            }
        }
        for t in acting.iter().filter(|t| t.change_mode == template_change_mode::SCRIPT) {
            let Some(script) = &t.change_script else { continue };
            let timeout = Duration::from_nanos(script.timeout.max(0) as u64);
            let result = self.control.exec(script.command.clone(), script.args.clone(), timeout).await;
            let failure = match result {
                Ok(0) => {
                    self.control.emit_event(events::hook_message(&format!(
                        "Template successfully ran script from {} with exit code: 0",
                        script.command
                    )));
                    continue;
                }
                Ok(code) => format!(
                    "Template ran script {} with arguments {:?} on change but it exited with code code: {code}",
                    script.command, script.args
                ),
                Err(e) => format!(
                    "Template failed to run script {} with arguments {:?} because task driver doesn't support the exec operation: {e}",
                    script.command, script.args
                ),
            };
            self.control.emit_event(events::hook_failed("template", &failure, script.fail_on_error));
            if script.fail_on_error {
                self.control.kill_failed(events::template_failed("Template script failed, task is being killed"));
                return false;
            }
        }
        true
    }

    /// Writes a rendered template unless the file already holds it. True when written.
    fn write(&self, e: &Entry, content: &str) -> Result<bool, String> {
        let mode = parse_perms(&e.spec.perms);
        let owner = (e.spec.uid.filter(|u| *u >= 0), e.spec.gid.filter(|g| *g >= 0));
        match &e.dest {
            Dest::Host(path) => write_host(path, content, mode, owner),
            Dest::Beneath(rel) => {
                let alloc = self.alloc_dir()?;
                let parent_rel = rel.parent().filter(|p| !p.as_os_str().is_empty());
                let parent = match parent_rel {
                    None => alloc,
                    Some(p) => match alloc.open_dir(p, Links::Refuse) {
                        Ok(d) => d,
                        Err(err) if err.is_not_found() => {
                            alloc.create_dir_all(p, 0o755).map_err(|e| format!("failed to create template directory: {e}"))?
                        }
                        Err(err) => return Err(format!("failed to open template directory: {err}")),
                    },
                };
                let name = Path::new(rel.file_name().ok_or("template destination has no file name")?);
                if let Ok(f) = parent.read(name, Links::Refuse)
                    && unchanged(&f, content, mode, owner)
                {
                    return Ok(false);
                }
                let tmp = PathBuf::from(format!(".{}.nomad-rs-tmp", name.to_string_lossy()));
                let mut f = parent.write(&tmp, mode, Links::Refuse).map_err(|e| format!("failed to write template: {e}"))?;
                let done = f
                    .set_permissions(std::fs::Permissions::from_mode(mode))
                    .and_then(|()| chown(&f, owner))
                    .and_then(|()| f.write_all(content.as_bytes()))
                    .and_then(|()| f.sync_all());
                if let Err(err) = done {
                    let _ = parent.remove_file(&tmp);
                    return Err(format!("failed to write template {}: {err}", rel.display()));
                }
                parent.rename(&tmp, &parent, name).map_err(|e| format!("failed to write template {}: {e}", rel.display()))?;
                Ok(true)
            }
        }
    }

    /// A watcher for one dependency, until the manager stops.
    fn watch(&self, dep: Dependency, store: Arc<Store>) -> CancellationToken {
        let stop = self.stop.child_token();
        let token = stop.clone();
        let source = self.config.source.clone();
        let (first_backoff, max_backoff) = self.config.client.nomad_retry;
        let file_base = match &dep {
            Dependency::File { path } if path.is_relative() => Some(self.task_dir_path()),
            _ => None,
        };
        tokio::spawn(async move {
            let mut index = 0u64;
            let mut failures = 0u32;
            loop {
                let started = Instant::now();
                let fetched = match &dep {
                    Dependency::File { path } => {
                        if index > 0 {
                            tokio::select! {
                                _ = tokio::time::sleep(FILE_POLL) => {}
                                _ = stop.cancelled() => return,
                            }
                        }
                        read_file_dep(file_base.as_deref(), path).map(|a| (a, index + 1))
                    }
                    _ => tokio::select! {
                        r = source.fetch(&dep, index) => r,
                        _ = stop.cancelled() => return,
                    },
                };
                match fetched {
                    Ok((answer, new_index)) => {
                        failures = 0;
                        store.set(dep.clone(), answer);
                        // An index that did not move back-to-back means the source does not block: pace it.
                        if new_index <= index && started.elapsed() < Duration::from_millis(50) {
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                                _ = stop.cancelled() => return,
                            }
                        }
                        index = if new_index < index { 0 } else { new_index };
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let backoff = first_backoff.saturating_mul(1 << failures.min(16)).min(max_backoff);
                        tracing::warn!(dependency = %dep, error = %e, retry_in = ?backoff, "template dependency fetch failed");
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.cancelled() => return,
                        }
                    }
                }
            }
        });
        token
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// A `file` dependency's content: `None` while the file does not exist.
fn read_file_dep(base: Option<&Path>, path: &Path) -> Result<Answer, String> {
    let file = match base {
        Some(base) => Beneath::open(base).and_then(|d| d.read(path, Links::Beneath)).map_err(|e| (e.is_not_found(), e.to_string())),
        None => std::fs::File::open(path).map_err(|e| (e.kind() == std::io::ErrorKind::NotFound, e.to_string())),
    };
    match file {
        Ok(f) => {
            let bytes = read_limited(f)?;
            Ok(Some(serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())))
        }
        Err((true, _)) => Ok(None),
        Err((false, e)) => Err(e),
    }
}

fn read_limited(f: std::fs::File) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(format!("file is larger than {MAX_FILE} bytes"));
    }
    Ok(bytes)
}

fn unchanged(f: &std::fs::File, content: &str, mode: u32, owner: (Option<i64>, Option<i64>)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = f.metadata() else { return false };
    if meta.mode() & 0o7777 != mode
        || owner.0.is_some_and(|u| i64::from(meta.uid()) != u)
        || owner.1.is_some_and(|g| i64::from(meta.gid()) != g)
    {
        return false;
    }
    if meta.len() != content.len() as u64 {
        return false;
    }
    f.try_clone().map_err(|e| e.to_string()).and_then(read_limited).is_ok_and(|b| b == content.as_bytes())
}

fn chown(f: &std::fs::File, owner: (Option<i64>, Option<i64>)) -> std::io::Result<()> {
    if owner == (None, None) {
        return Ok(());
    }
    let uid = owner.0.map(|u| nix::unistd::Uid::from_raw(u as u32));
    let gid = owner.1.map(|g| nix::unistd::Gid::from_raw(g as u32));
    nix::unistd::fchown(f, uid, gid).map_err(std::io::Error::from)
}

/// Without the sandbox: an absolute destination on the host.
fn write_host(path: &Path, content: &str, mode: u32, owner: (Option<i64>, Option<i64>)) -> Result<bool, String> {
    if let Ok(f) = std::fs::File::open(path)
        && unchanged(&f, content, mode, owner)
    {
        return Ok(false);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("failed to create template directory: {e}"))?;
    }
    let tmp = path.with_file_name(format!(".{}.nomad-rs-tmp", path.file_name().unwrap_or_default().to_string_lossy()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        chown(&f, owner)?;
        f.write_all(content.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("failed to write template {}: {e}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
