//! Task templates (`template {}`): consul-template's model, on our own runner.
//!
//! - [`render`]: one template compiled with `gotmpl` (Go's text/template semantics) and the
//!   consul-template functions ([`funcs`]). Each data function (`nomadVar`, `nomadService`,
//!   `file`, ...) names a [`Dependency`]; what the [`Store`] has not answered yet is *missing*
//!   and yields a zero value, and a render with anything missing writes nothing.
//! - [`source`]: how a dependency is fetched. Nomad data comes from the agent's own HTTP router,
//!   in process, with the task's workload identity (as Nomad's in-memory listener does), by
//!   blocking queries; files are polled.
//! - [`manager`]: one per task. Renders every template, watches what they used, writes changed
//!   files beneath the task's dirs, and applies the change modes (restart, signal, script, noop)
//!   through a narrow [`TemplateControl`] handle on the task runner.
//!
//! The task runner's `template` hook ([`crate::client::taskrunner::hooks::template`]) starts the
//! manager and blocks the task until the first render.

mod consul;
pub mod funcs;
pub mod manager;
pub mod methods;
pub mod render;
mod sockaddr;
pub mod source;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;

pub use manager::{ManagerConfig, TemplateControl, TemplateManager};
pub use source::{ConsulSource, RouterSource, TaskSources, TemplateSource};

/// The client's `template {}` block.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateConfig {
    /// Functions a template may not call (`function_denylist`).
    pub function_denylist: Vec<String>,
    /// Let destinations, sources and `file` reach outside the task's dirs.
    pub disable_file_sandbox: bool,
    /// How long one blocking query waits (`block_query_wait`).
    pub block_query_wait: Duration,
    /// Quiescence for re-renders of templates without their own `wait`.
    pub wait: Wait,
    /// Bounds a template's own `wait` is clamped to.
    pub wait_bounds: Option<Wait>,
    /// Retries of a failing Nomad fetch: the first wait, and the most between two.
    pub nomad_retry: (Duration, Duration),
}

impl Default for TemplateConfig {
    fn default() -> Self {
        TemplateConfig {
            function_denylist: vec!["plugin".into(), "writeToFile".into()],
            disable_file_sandbox: false,
            block_query_wait: Duration::from_secs(300),
            wait: Wait { min: Duration::from_secs(5), max: Duration::from_secs(240) },
            wait_bounds: None,
            nomad_retry: (Duration::from_millis(250), Duration::from_secs(60)),
        }
    }
}

/// A quiescence window: re-render once the data was stable for `min`, and at the latest `max`
/// after the first change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Stable for this long.
    pub min: Duration,
    /// At the latest.
    pub max: Duration,
}

/// What a template reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dependency {
    /// `nomadVar`, `nomadVarExists`: one variable.
    NomadVar { path: String, namespace: String },
    /// `nomadVarList`, `nomadVarListSafe`: variables under a prefix.
    NomadVarList { prefix: String, namespace: String },
    /// `nomadService`: the registrations of one service.
    NomadService { name: String, tag: String, namespace: String },
    /// `nomadServices`: every service of a namespace.
    NomadServices { namespace: String },
    /// `file`: a file, relative to the task dir (or absolute without the sandbox).
    File { path: PathBuf },
    /// `key` (`block`: waits until the key exists), `keyExists`, `keyOrDefault`: one Consul
    /// KV key of datacenter `dc` (empty: the agent's).
    ConsulKey { key: String, dc: String, block: bool },
    /// `ls`, `tree`, `safeLs`, `safeTree`: the Consul KV keys under a prefix.
    ConsulKeys { prefix: String, dc: String },
    /// `service`: a service's instances from Consul's health API, kept by `filters`
    /// (statuses, or `any`; `passing` is asked of Consul).
    ConsulService { name: String, tag: String, dc: String, near: String, filters: Vec<String> },
    /// `services`: Consul's catalog of services.
    ConsulServices { dc: String },
}

impl Dependency {
    /// Whether Consul answers it.
    pub fn is_consul(&self) -> bool {
        matches!(
            self,
            Dependency::ConsulKey { .. }
                | Dependency::ConsulKeys { .. }
                | Dependency::ConsulService { .. }
                | Dependency::ConsulServices { .. }
        )
    }
}

/// `name@dc`, or `name` when `dc` is empty.
fn at_dc(name: &str, dc: &str) -> String {
    if dc.is_empty() { name.to_string() } else { format!("{name}@{dc}") }
}

impl fmt::Display for Dependency {
    /// consul-template's names, as the `Missing:` event shows them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dependency::NomadVar { path, namespace } => write!(f, "nomad.var.block({path}@{namespace})"),
            Dependency::NomadVarList { prefix, namespace } => write!(f, "nomad.var.list({prefix}@{namespace})"),
            Dependency::NomadService { name, tag, .. } if tag.is_empty() => write!(f, "nomad.service({name})"),
            Dependency::NomadService { name, tag, .. } => write!(f, "nomad.service({tag}.{name})"),
            Dependency::NomadServices { namespace } => write!(f, "nomad.services(@{namespace})"),
            Dependency::File { path } => write!(f, "file({})", path.display()),
            Dependency::ConsulKey { key, dc, block: true } => write!(f, "kv.block({})", at_dc(key, dc)),
            Dependency::ConsulKey { key, dc, block: false } => write!(f, "kv.get({})", at_dc(key, dc)),
            Dependency::ConsulKeys { prefix, dc } => write!(f, "kv.list({})", at_dc(prefix, dc)),
            Dependency::ConsulService { name, tag, dc, near, filters } => {
                let mut s = if tag.is_empty() { name.clone() } else { format!("{tag}.{name}") };
                s = at_dc(&s, dc);
                if !near.is_empty() {
                    s = format!("{s}~{near}");
                }
                write!(f, "health.service({s}|{})", filters.join(","))
            }
            Dependency::ConsulServices { dc } if dc.is_empty() => write!(f, "catalog.services"),
            Dependency::ConsulServices { dc } => write!(f, "catalog.services(@{dc})"),
        }
    }
}

/// A dependency's last answer: `None` when what it names does not exist (a 404).
pub type Answer = Option<serde_json::Value>;

/// The answers the templates of one task render from. A dependency with no entry has not been
/// answered yet. Every change bumps a version the manager waits on.
#[derive(Debug)]
pub struct Store {
    answers: Mutex<BTreeMap<Dependency, Answer>>,
    version: watch::Sender<u64>,
}

impl Default for Store {
    fn default() -> Self {
        Store { answers: Mutex::default(), version: watch::channel(0).0 }
    }
}

impl Store {
    /// The answer for `dep`, if it has one.
    pub fn get(&self, dep: &Dependency) -> Option<Answer> {
        crate::client::taskrunner::lock(&self.answers).get(dep).cloned()
    }

    /// Records an answer; a different one than before bumps the version.
    pub fn set(&self, dep: Dependency, answer: Answer) {
        let changed = {
            let mut answers = crate::client::taskrunner::lock(&self.answers);
            match answers.get(&dep) {
                Some(old) if *old == answer => false,
                _ => {
                    answers.insert(dep, answer);
                    true
                }
            }
        };
        if changed {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Forgets every answer (a fresh render fetches everything again).
    pub fn clear(&self) {
        crate::client::taskrunner::lock(&self.answers).clear();
        self.version.send_modify(|v| *v += 1);
    }

    /// Changes of the answers.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

/// Nomad's `Missing:` message: sorted, the first three, then how many more.
pub fn missing_message(missing: &[String]) -> String {
    let mut names: Vec<&str> = missing.iter().map(String::as_str).collect();
    names.sort_unstable();
    const SHOWN: usize = 3;
    let shown = names.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN { format!("Missing: {shown}, and {} more", names.len() - SHOWN) } else { format!("Missing: {shown}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_message_shows_three_sorted_names_then_a_count() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(missing_message(&names(&["b", "a"])), "Missing: a, b");
        assert_eq!(missing_message(&names(&["e", "d", "c", "b", "a"])), "Missing: a, b, c, and 2 more");
    }

    #[test]
    fn the_store_bumps_its_version_only_on_a_different_answer() {
        let store = Store::default();
        let rx = store.subscribe();
        let dep = Dependency::NomadVar { path: "nomad/jobs/x".into(), namespace: "default".into() };
        assert_eq!(store.get(&dep), None, "not answered yet");
        store.set(dep.clone(), None);
        assert_eq!(store.get(&dep), Some(None), "answered: does not exist");
        assert_eq!(*rx.borrow(), 1);
        store.set(dep.clone(), None);
        assert_eq!(*rx.borrow(), 1, "the same answer is not a change");
        store.set(dep.clone(), Some(serde_json::json!({"a": 1})));
        assert_eq!(*rx.borrow(), 2);
        assert_eq!(dep.to_string(), "nomad.var.block(nomad/jobs/x@default)");
    }
}
