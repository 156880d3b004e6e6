//! The infra ("pause") container of a group network with a docker task (Nomad's
//! `drivers/docker/network.go`). A container can only join the network namespace of another
//! container, so for a `bridge`, `none` or `cni/<name>` group with a docker task the namespace is
//! this container's: `nomad_init_<alloc ID>`, of the plugin's `infra_image`, network mode
//! `none` (a namespace with only loopback), restart policy `unless-stopped`, labelled with the
//! alloc ID (and this agent's alloc root, for the reaper).
//!
//! The driver offers it as a [`NetnsMaker`] ([`InfraContainers`]): the network manager mounts its sandbox at the
//! alloc's usual path, runs CNI in it, and the group's exec, raw_exec and oci tasks enter it
//! there; docker tasks join it with `network_mode = "container:<infra ID>"`. A running one
//! found by name is the one made before an agent restart (no second container). It is removed
//! with the alloc's network.
//!
//! The infra image is used when the Engine has it (its tag is not `latest`), else pulled within
//! `infra_image_pull_timeout`; with no registry reachable the alloc fails with the image named.
//! It is not reference-counted for `gc.image`: every bridge group needs it, and an image that
//! cannot be pulled back must not be deleted.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, ContainerInspectResponse, HostConfig, RestartPolicy, RestartPolicyNameEnum};
use nomad_proto::Allocation;

use super::super::DriverError;
use super::container::{self, ALLOC_ID_LABEL, ALLOC_ROOT_LABEL, engine_error, status_of};
use super::images::{self, Images};
use super::{DockerDriver, NAME, lock, running};
use crate::client::network::NetnsMaker;

/// The name prefix of infra containers (Nomad's).
pub const INFRA_PREFIX: &str = "nomad_init_";

/// `nomad_init_<alloc ID>`.
pub fn infra_name(alloc_id: &str) -> String {
    format!("{INFRA_PREFIX}{alloc_id}")
}

/// The alloc ID of an infra container's name as the Engine lists it (`/nomad_init_<id>`).
pub fn infra_alloc_id(container_name: &str) -> Option<&str> {
    container_name.trim_start_matches('/').strip_prefix(INFRA_PREFIX).filter(|id| !id.is_empty())
}

/// The create request of the alloc's infra container.
pub fn infra_body(image: &str, alloc_id: &str, alloc_root: Option<&std::path::Path>) -> ContainerCreateBody {
    let mut labels = std::collections::HashMap::from([(ALLOC_ID_LABEL.to_string(), alloc_id.to_string())]);
    if let Some(root) = alloc_root {
        labels.insert(ALLOC_ROOT_LABEL.to_string(), root.display().to_string());
    }
    ContainerCreateBody {
        image: Some(image.to_string()),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::UNLESS_STOPPED), maximum_retry_count: None }),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    }
}

/// The nsfs file of a running container's namespace: its sandbox, else its init's.
fn sandbox_of(c: &ContainerInspectResponse) -> Result<PathBuf, DriverError> {
    let key = c.network_settings.as_ref().and_then(|n| n.sandbox_key.clone()).filter(|k| !k.is_empty());
    match (key, c.state.as_ref().and_then(|s| s.pid).filter(|p| *p > 0)) {
        (Some(key), _) => Ok(PathBuf::from(key)),
        (None, Some(pid)) => Ok(PathBuf::from(format!("/proc/{pid}/ns/net"))),
        (None, None) => Err(DriverError::Docker("the infra container has no network namespace".into())),
    }
}

/// Whether any task of the alloc's group runs under the docker driver.
fn has_docker_task(alloc: &Allocation) -> bool {
    let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group));
    group.is_some_and(|g| g.tasks.iter().any(|t| t.driver == NAME))
}

impl DockerDriver {
    /// The alloc's running infra container, if there is one.
    pub async fn infra_container(&self, docker: &Docker, alloc_id: &str) -> Result<Option<ContainerInspectResponse>, DriverError> {
        match docker.inspect_container(&infra_name(alloc_id), None).await {
            Ok(c) if running(&c) => Ok(Some(c)),
            Ok(_) => Ok(None),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(engine_error("inspect the infra container", e)),
        }
    }

    /// Makes the alloc's infra container, or finds the running one; its namespace and whether
    /// it is new.
    pub async fn create_network(&self, docker: &Docker, alloc_id: &str) -> Result<(PathBuf, bool), DriverError> {
        if let Some(c) = self.infra_container(docker, alloc_id).await? {
            let id = c.id.clone().unwrap_or_default();
            lock(&self.tracked).insert(id);
            return Ok((sandbox_of(&c)?, false));
        }
        let image = container::normalize_image(&self.options.infra_image);
        if image.ends_with(":latest") || Images::local_id(docker, &image).await?.is_none() {
            self.images.pull(docker, &image, self.options.infra_image_pull_timeout, self.options.pull_activity_timeout).await?;
            if Images::local_id(docker, &image).await?.is_none() {
                return Err(DriverError::ImageUnavailable(images::not_found_message(&image, "pulled but not found")));
            }
        }
        let name = infra_name(alloc_id);
        // One left stopped (the agent died mid-way, or someone stopped it) is replaced.
        let body = infra_body(&image, alloc_id, self.options.alloc_root.as_deref());
        let (id, adopted) = container::create(docker, &name, body).await?;
        lock(&self.tracked).insert(id.clone());
        if !adopted
            && let Err(e) = docker.start_container(&id, None).await
            && status_of(&e) != Some(304)
        {
            lock(&self.tracked).remove(&id);
            let _ = container::remove(docker, &id).await;
            return Err(engine_error("start the infra container", e));
        }
        // The sandbox is known only once it runs.
        let c = docker.inspect_container(&id, None).await.map_err(|e| engine_error("inspect the infra container", e))?;
        tracing::info!(alloc_id, container = %id, "started the alloc's infra container");
        Ok((sandbox_of(&c)?, !adopted))
    }

    /// Removes the alloc's infra container; none is fine.
    pub async fn destroy_network(&self, docker: &Docker, alloc_id: &str) -> Result<(), DriverError> {
        let name = infra_name(alloc_id);
        let id = match docker.inspect_container(&name, None).await {
            Ok(c) => c.id.unwrap_or(name),
            Err(e) if status_of(&e) == Some(404) => return Ok(()),
            Err(e) => return Err(engine_error("inspect the infra container", e)),
        };
        container::remove(docker, &id).await?;
        lock(&self.tracked).remove(&id);
        tracing::info!(alloc_id, container = %id, "removed the alloc's infra container");
        Ok(())
    }

    /// Runs Engine work to its end from blocking code (the network manager is called from the
    /// `network` hook in a blocking section). On a multi-threaded runtime it runs there with the
    /// driver's client; anywhere else on a thread and runtime of its own with a client of its
    /// own, since a client's connections belong to the runtime they were made on.
    fn block_on_engine<T, F, Fut>(&self, work: F) -> Result<T, String>
    where
        T: Send,
        F: FnOnce(Docker) -> Fut + Send,
        Fut: Future<Output = Result<T, DriverError>> + Send,
    {
        use tokio::runtime::{Handle, RuntimeFlavor};
        if let Ok(handle) = Handle::try_current()
            && handle.runtime_flavor() == RuntimeFlavor::MultiThread
        {
            return tokio::task::block_in_place(|| {
                handle.block_on(async {
                    let docker = self.client().await?;
                    work(docker).await
                })
            })
            .map_err(|e| e.to_string());
        }
        let socket = self.options.socket.clone();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| DriverError::Docker(format!("start a runtime: {e}")))?;
                    runtime.block_on(async {
                        let docker = super::connect(&socket).await?;
                        work(docker).await
                    })
                })
                .join()
                .unwrap_or_else(|_| Err(DriverError::Docker("the Engine call panicked".into())))
        })
        .map_err(|e| e.to_string())
    }
}

/// The docker driver's side of the network manager: the namespaces of groups with a docker
/// task are infra containers.
pub struct InfraContainers(pub Arc<DockerDriver>);

impl NetnsMaker for InfraContainers {
    fn makes(&self, alloc: &Allocation) -> bool {
        has_docker_task(alloc)
    }

    fn create(&self, alloc: &Allocation) -> Result<(PathBuf, bool), String> {
        let alloc_id = alloc.id.clone();
        self.0.block_on_engine(|docker| async move { self.0.create_network(&docker, &alloc_id).await })
    }

    fn destroy(&self, alloc_id: &str) -> Result<(), String> {
        self.0.block_on_engine(|docker| async move { self.0.destroy_network(&docker, alloc_id).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_infra_container_is_nomads() {
        let body = infra_body("pause:1", "a1", Some(std::path::Path::new("/var/nomad/alloc")));
        let v = serde_json::to_value(&body).unwrap();
        assert_eq!(v["Image"], "pause:1");
        assert_eq!(v["Labels"][ALLOC_ID_LABEL], "a1");
        assert_eq!(v["Labels"][ALLOC_ROOT_LABEL], "/var/nomad/alloc");
        assert_eq!(v["HostConfig"]["NetworkMode"], "none");
        assert_eq!(v["HostConfig"]["RestartPolicy"]["Name"], "unless-stopped");
        assert_eq!(infra_name("a1"), "nomad_init_a1");
        assert_eq!(infra_alloc_id("/nomad_init_a1"), Some("a1"));
        assert_eq!(infra_alloc_id("/web-a1"), None);
        assert_eq!(infra_alloc_id("/nomad_init_"), None);
    }

    #[test]
    fn only_groups_with_a_docker_task_get_an_infra_container() {
        use nomad_proto::{Job, Task, TaskGroup};
        let alloc = |drivers: &[&str]| {
            let tasks = drivers.iter().map(|d| Task { name: d.to_string(), driver: d.to_string(), ..Task::default() }).collect();
            let job = Job { task_groups: vec![TaskGroup { name: "g".into(), tasks, ..TaskGroup::default() }], ..Job::default() };
            Allocation { task_group: "g".into(), job: Some(std::sync::Arc::new(job)), ..Allocation::default() }
        };
        assert!(has_docker_task(&alloc(&["exec", "docker"])));
        assert!(!has_docker_task(&alloc(&["exec", "raw_exec"])));
        assert!(!has_docker_task(&Allocation::default()));
    }
}
