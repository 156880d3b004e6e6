//! The `artifacts` hook (Nomad's `artifactHook`): before each start, fetches the task's
//! artifacts, three at a time, and records each finished one (a hash of its source, options,
//! headers, mode and destination) in the hook's data, so a retry or an agent restart fetches
//! only what is missing. A failure is recoverable: the restart policy retries it.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use blake2::Digest;
use futures::StreamExt;
use futures::future::BoxFuture;
use nomad_proto::Node;
use nomad_proto::job::TaskArtifact;

use super::csi_plugin_supervisor::TaskControl;
use super::{AsyncPrestartHook, HookError, HookRequest, PrestartResponse, TaskHook};
use crate::client::artifact::source::{Mode, destination_beneath_alloc};
use crate::client::artifact::{ArtifactGetter, Request};
use crate::client::taskrunner::events;
use crate::client::taskrunner::interpolate::Interpolator;

/// The hook's name: the key of its persisted state (Nomad's).
pub const NAME: &str = "artifacts";
/// Downloads at once (Nomad's `maxConcurrency`).
const PARALLEL: usize = 3;

/// One artifact's fetch: its index, its hash, how it went.
type Outcome = (usize, String, Result<(), String>);

/// Fetches a task's artifacts.
pub struct ArtifactHook {
    getter: Arc<dyn ArtifactGetter>,
    control: Weak<dyn TaskControl>,
    node: Arc<dyn Fn() -> Arc<Node> + Send + Sync>,
    region: String,
}

impl ArtifactHook {
    /// A hook fetching through `getter`, recording its events on `control`'s task.
    pub fn new(
        getter: Arc<dyn ArtifactGetter>,
        control: Weak<dyn TaskControl>,
        node: Arc<dyn Fn() -> Arc<Node> + Send + Sync>,
        region: String,
    ) -> ArtifactHook {
        ArtifactHook { getter, control, node, region }
    }
}

impl TaskHook for ArtifactHook {
    fn name(&self) -> &'static str {
        NAME
    }
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        Some(self)
    }
}

/// Nomad's `TaskArtifact.Hash`: blake2b-256 over the source, the sorted options and headers,
/// the mode and the destination, base64 without padding.
pub fn artifact_hash(a: &TaskArtifact) -> String {
    let mut h = blake2::Blake2b::<blake2::digest::consts::U32>::new();
    h.update(a.getter_source.as_bytes());
    for map in [&a.getter_options, &a.getter_headers] {
        for (k, v) in map {
            h.update(k.as_bytes());
            h.update(v.as_bytes());
        }
    }
    h.update(a.getter_mode.as_bytes());
    h.update(a.relative_dest.as_bytes());
    crate::client::base64::encode(&h.finalize()).trim_end_matches('=').to_string()
}

impl ArtifactHook {
    /// The artifact with `${...}` resolved: source, option and header values with the task's
    /// environment, the destination with the client's paths (Nomad's `ClientPath`).
    fn resolve(&self, req: &HookRequest<'_>, node: &Node, a: &TaskArtifact) -> Result<Request, String> {
        let alloc_dir = &req.config.alloc_dir;
        let task = &req.task.name;
        let interp = Interpolator { env: &req.config.env, node, region: &self.region };
        let mut client_env = req.config.env.clone();
        let task_dir = alloc_dir.join(task);
        for (k, p) in [
            ("NOMAD_ALLOC_DIR", alloc_dir.join("alloc")),
            ("NOMAD_TASK_DIR", task_dir.join("local")),
            ("NOMAD_SECRETS_DIR", task_dir.join("secrets")),
        ] {
            client_env.insert(k.into(), p.display().to_string());
        }
        let client = Interpolator { env: &client_env, node, region: &self.region };
        let destination = destination_beneath_alloc(&client.replace(&a.relative_dest), alloc_dir, task)?;
        Ok(Request {
            source: interp.replace(&a.getter_source),
            options: a.getter_options.iter().map(|(k, v)| (k.clone(), interp.replace(v))).collect(),
            headers: a.getter_headers.iter().map(|(k, v)| (k.clone(), interp.replace(v))).collect(),
            mode: Mode::parse(&a.getter_mode)?,
            alloc_dir: alloc_dir.clone(),
            task: task.clone(),
            destination,
        })
    }
}

impl AsyncPrestartHook for ArtifactHook {
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move {
            let artifacts = &req.task.artifacts;
            if artifacts.is_empty() {
                return Ok(PrestartResponse { done: true, ..PrestartResponse::default() });
            }
            let previous = req.previous.map(|s| s.data.clone()).unwrap_or_default();
            if let Some(control) = self.control.upgrade() {
                control.emit_event(events::downloading_artifacts());
            }
            let node = (self.node)();
            let previous = &previous;
            let node = &node;
            let fetches: Vec<BoxFuture<'_, Outcome>> = artifacts
                .iter()
                .enumerate()
                .map(|(i, a)| -> BoxFuture<'_, Outcome> {
                    Box::pin(async move {
                        let hash = artifact_hash(a);
                        if previous.contains_key(&hash) {
                            return (i, hash, Ok(()));
                        }
                        let result = match self.resolve(req, node, a) {
                            Ok(r) => self.getter.get(&r).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = &result {
                            tracing::warn!(alloc_id = %req.alloc.id, task = %req.task.name, source = %a.getter_source, error = %e, "artifact download failed");
                        }
                        (i, hash, result)
                    })
                })
                .collect();
            let results: Vec<Outcome> = futures::stream::iter(fetches).buffer_unordered(PARALLEL).collect().await;
            let mut data = BTreeMap::new();
            let mut first_error: Option<(usize, String)> = None;
            for (i, hash, result) in results {
                match result {
                    Ok(()) => {
                        data.insert(hash, "1".to_string());
                    }
                    Err(e) if first_error.as_ref().is_none_or(|(j, _)| i < *j) => first_error = Some((i, e)),
                    Err(_) => {}
                }
            }
            if let Some((i, e)) = first_error {
                let message = format!("failed to download artifact {:?}: {e}", artifacts[i].getter_source);
                return Err(HookError {
                    event: Some(Box::new(events::artifact_download_failed(&message))),
                    data: Some(data),
                    ..HookError::recoverable(message)
                });
            }
            Ok(PrestartResponse { done: true, data, events: Vec::new() })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Mutex;

    use nomad_proto::{Allocation, Task, TaskEvent};

    use super::*;
    use crate::client::state::HookState;

    /// Fails the sources it is told to, records what it was asked.
    #[derive(Default)]
    struct FakeGetter {
        fail: Vec<String>,
        asked: Mutex<Vec<Request>>,
    }

    impl ArtifactGetter for FakeGetter {
        fn get<'a>(&'a self, req: &'a Request) -> BoxFuture<'a, Result<(), String>> {
            self.asked.lock().unwrap().push(req.clone());
            let fail = self.fail.contains(&req.source);
            Box::pin(async move { if fail { Err("bad response code: 500".into()) } else { Ok(()) } })
        }
    }

    #[derive(Default)]
    struct Events(Mutex<Vec<TaskEvent>>);

    impl TaskControl for Events {
        fn emit_event(&self, event: TaskEvent) {
            self.0.lock().unwrap().push(event);
        }
        fn kill_failed(&self, _: TaskEvent) {}
    }

    fn artifact(source: &str, dest: &str) -> TaskArtifact {
        TaskArtifact { getter_source: source.into(), getter_mode: "any".into(), relative_dest: dest.into(), ..TaskArtifact::default() }
    }

    #[tokio::test]
    async fn finished_artifacts_are_remembered_through_a_failure_and_skipped_on_retry() {
        let mut task = Task { name: "web".into(), ..Task::default() };
        task.artifacts = vec![
            artifact("https://x/${NOMAD_META_a}.tgz", "local/a"),
            artifact("https://x/b", "${NOMAD_ALLOC_DIR}/b"),
            artifact("https://x/c", "local/c"),
        ];
        task.artifacts[0].getter_headers.insert("Authorization".into(), "Bearer ${NOMAD_META_token}".into());
        let mut config = super::super::tests_support::config();
        config.alloc_dir = "/srv/alloc/a1".into();
        config.env.insert("NOMAD_META_a".into(), "app".into());
        config.env.insert("NOMAD_META_token".into(), "t0k".into());
        config.env.insert("NOMAD_ALLOC_DIR".into(), "/alloc".into());
        let alloc = Allocation::default();
        let events = Arc::new(Events::default());
        let control: Arc<dyn TaskControl> = events.clone();
        let getter = Arc::new(FakeGetter { fail: vec!["https://x/c".into()], ..FakeGetter::default() });
        let hook = ArtifactHook::new(getter.clone(), Arc::downgrade(&control), Arc::new(|| Arc::new(Node::default())), "global".into());
        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };

        let err = AsyncPrestartHook::prestart(&hook, &req).await.unwrap_err();
        assert!(err.recoverable);
        assert_eq!(err.message, "failed to download artifact \"https://x/c\": bad response code: 500");
        let event = err.event.as_deref().unwrap();
        assert_eq!((event.event_type.as_str(), event.download_error.as_str()), ("Failed Artifact Download", err.message.as_str()));
        assert_eq!(events.0.lock().unwrap()[0].event_type, "Downloading Artifacts");
        let data = err.data.clone().unwrap();
        assert_eq!(data.len(), 2, "a and b are recorded: {data:?}");
        {
            let asked = getter.asked.lock().unwrap();
            let a = asked.iter().find(|r| r.source == "https://x/app.tgz").expect("the source is interpolated");
            assert_eq!(a.headers["Authorization"], "Bearer t0k");
            assert_eq!(a.destination, PathBuf::from("web/local/a"));
            let b = asked.iter().find(|r| r.source == "https://x/b").unwrap();
            assert_eq!(b.destination, PathBuf::from("alloc/b"), "the destination takes the client's alloc dir");
        }

        // The retry fetches only what is missing.
        getter.asked.lock().unwrap().clear();
        let previous = HookState { done: false, data };
        let req = HookRequest { previous: Some(&previous), ..req };
        assert!(AsyncPrestartHook::prestart(&hook, &req).await.is_err());
        let asked: Vec<String> = getter.asked.lock().unwrap().iter().map(|r| r.source.clone()).collect();
        assert_eq!(asked, ["https://x/c"]);
    }

    #[test]
    fn the_hash_covers_every_field() {
        let a = artifact("https://x/a", "local/");
        let mut b = a.clone();
        assert_eq!(artifact_hash(&a), artifact_hash(&b));
        b.getter_options.insert("checksum".into(), "md5:00".into());
        assert_ne!(artifact_hash(&a), artifact_hash(&b));
        let mut c = a.clone();
        c.getter_mode = "file".into();
        assert_ne!(artifact_hash(&a), artifact_hash(&c));
        assert_eq!(artifact_hash(&a).len(), 43, "base64 of 32 bytes, no padding");
    }
}
