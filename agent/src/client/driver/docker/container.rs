//! The container Nomad would create for a task: the create body built from the task config,
//! the plugin policy and the alloc (a pure function, so its output is tested byte for byte),
//! and the create/start/stop/remove calls.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, DeviceMapping, EndpointIpamConfig, EndpointSettings, HealthConfig, HostConfig, HostConfigLogConfig, Mount,
    MountBindOptions, MountBindOptionsPropagationEnum, MountTmpfsOptions, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig,
    NetworkingConfig, PortBinding, ResourcesUlimits,
};
use bollard::query_parameters::{CreateContainerOptions, KillContainerOptions, RemoveContainerOptions};

use super::super::capabilities::{self, CapSet};
use super::super::{DriverError, TaskConfig as Task};
use super::NAME;
use super::config::{DockerOptions, MountBlock, TaskConfig};
use crate::client::taskrunner::env::clean_env_key;

/// Label every container of ours carries (Nomad's).
pub const ALLOC_ID_LABEL: &str = "com.hashicorp.nomad.alloc_id";
/// The alloc dir root of the agent that made the container: the reaper removes only its own
/// agent's containers, so agents sharing an Engine leave each other's alone.
pub const ALLOC_ROOT_LABEL: &str = "io.nomad-rs.alloc_root";
/// Most bytes of a `seccomp=<file>` profile read.
const MAX_SECCOMP_BYTES: u64 = 1 << 20;

fn invalid(reason: impl Into<String>) -> DriverError {
    DriverError::InvalidConfig { driver: NAME, reason: reason.into() }
}

/// The host directories bound at /alloc, /local and /secrets (resolved, symlink-free).
#[derive(Debug, Clone)]
pub struct TaskDirs {
    pub alloc: PathBuf,
    pub local: PathBuf,
    pub secrets: PathBuf,
}

/// `<task>-<alloc id>`, as Nomad names the container.
pub fn container_name(task: &Task) -> String {
    format!("{}-{}", task.task_name.replace('/', "_"), task.alloc_id)
}

/// Nomad's image reference rules: `https://` dropped, no tag means `latest`.
pub fn normalize_image(image: &str) -> String {
    let image = image.trim().strip_prefix("https://").unwrap_or(image.trim());
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || last.contains('@') { image.to_string() } else { format!("{image}:latest") }
}

/// Whether a glob with `*` matches (extra_labels).
fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// The container's labels: the task's, the alloc ID, our agent's alloc root, and the
/// `extra_labels` the plugin asks for.
pub fn labels(task: &Task, config: &TaskConfig, options: &DockerOptions) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = config.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.insert(ALLOC_ID_LABEL.to_string(), task.alloc_id.clone());
    if let Some(root) = task.alloc_dir.parent() {
        labels.insert(ALLOC_ROOT_LABEL.to_string(), root.display().to_string());
    }
    let env = |k: &str| task.env.get(k).cloned().unwrap_or_default();
    let candidates = [
        ("job_name", env("NOMAD_JOB_NAME")),
        ("job_id", env("NOMAD_JOB_ID")),
        ("parent_job_id", env("NOMAD_JOB_PARENT_ID")),
        ("task_group_name", env("NOMAD_GROUP_NAME")),
        ("task_name", task.task_name.clone()),
        ("namespace", env("NOMAD_NAMESPACE")),
    ];
    for (name, value) in candidates {
        if name == "parent_job_id" && value.is_empty() {
            continue;
        }
        if options.extra_labels.iter().any(|p| glob_match(p, name)) {
            labels.insert(format!("com.hashicorp.nomad.{name}"), value);
        }
    }
    labels
}

/// A bind source from the task config: relative paths are in the task dir; anything outside the
/// alloc dir needs `volumes.enabled`.
fn bind_source(task: &Task, source: &str, options: &DockerOptions, key: &str) -> Result<String, DriverError> {
    let path = Path::new(source);
    if path.components().any(|c| c == Component::ParentDir) && !options.volumes_enabled {
        return Err(invalid(format!("{key}: {source:?} must not contain `..` unless the plugin enables volumes")));
    }
    let resolved = if path.is_absolute() { path.to_path_buf() } else { task.task_dir().join(path) };
    let inside = resolved.starts_with(&task.alloc_dir) && !resolved.components().any(|c| c == Component::ParentDir);
    if !inside && !options.volumes_enabled {
        return Err(invalid(format!(
            "{key}: {source:?} is outside the alloc dir: volumes are not enabled (plugin config volumes.enabled)"
        )));
    }
    Ok(resolved.display().to_string())
}

fn mount_of(task: &Task, m: &MountBlock, options: &DockerOptions, key: &str) -> Result<Mount, DriverError> {
    if m.target.is_empty() {
        return Err(invalid(format!("{key}.target: required")));
    }
    let kind = m.kind.as_deref().unwrap_or("volume");
    let mut mount = Mount { target: Some(m.target.clone()), read_only: Some(m.readonly), ..Mount::default() };
    match kind {
        "bind" => {
            mount.typ = Some(MountType::BIND);
            mount.source = Some(bind_source(task, &m.source, options, key)?);
            if let Some(p) = m.bind_options.as_ref().and_then(|b| b.propagation.as_deref()) {
                let propagation = match p {
                    "private" => MountBindOptionsPropagationEnum::PRIVATE,
                    "rprivate" => MountBindOptionsPropagationEnum::RPRIVATE,
                    "shared" => MountBindOptionsPropagationEnum::SHARED,
                    "rshared" => MountBindOptionsPropagationEnum::RSHARED,
                    "slave" => MountBindOptionsPropagationEnum::SLAVE,
                    "rslave" => MountBindOptionsPropagationEnum::RSLAVE,
                    other => return Err(invalid(format!("{key}.bind_options.propagation: unknown mode {other:?}"))),
                };
                mount.bind_options = Some(MountBindOptions { propagation: Some(propagation), ..Default::default() });
            }
        }
        "volume" => {
            if !options.volumes_enabled {
                return Err(invalid(format!("{key}: volume mounts are not enabled (plugin config volumes.enabled)")));
            }
            mount.typ = Some(MountType::VOLUME);
            mount.source = Some(m.source.clone());
            if let Some(v) = &m.volume_options {
                mount.volume_options = Some(MountVolumeOptions {
                    no_copy: Some(v.no_copy),
                    labels: (!v.labels.is_empty()).then(|| v.labels.clone().into_iter().collect()),
                    driver_config: v.driver_config.as_ref().map(|d| MountVolumeOptionsDriverConfig {
                        name: d.name.clone(),
                        options: (!d.options.is_empty()).then(|| d.options.clone().into_iter().collect()),
                    }),
                    ..Default::default()
                });
            }
        }
        "tmpfs" => {
            if !m.source.is_empty() {
                return Err(invalid(format!("{key}.source: must be empty for a tmpfs mount")));
            }
            mount.typ = Some(MountType::TMPFS);
            if let Some(t) = &m.tmpfs_options {
                mount.tmpfs_options = Some(MountTmpfsOptions { size_bytes: t.size, mode: t.mode, ..Default::default() });
            }
        }
        other => return Err(invalid(format!("{key}.type: unknown mount type {other:?} (bind, volume or tmpfs)"))),
    }
    Ok(mount)
}

/// `soft[:hard]`.
fn ulimit(name: &str, value: &str) -> Result<ResourcesUlimits, DriverError> {
    let parse = |s: &str| s.trim().parse::<i64>().map_err(|_| invalid(format!("ulimit.{name}: {value:?} is not soft[:hard]")));
    let (soft, hard) = match value.split_once(':') {
        Some((s, h)) => (parse(s)?, parse(h)?),
        None => (parse(value)?, parse(value)?),
    };
    if soft > hard {
        return Err(invalid(format!("ulimit.{name}: soft limit {soft} exceeds hard limit {hard}")));
    }
    Ok(ResourcesUlimits { name: Some(name.to_string()), soft: Some(soft), hard: Some(hard) })
}

/// Capabilities as Nomad gives docker tasks: cap_add must be allowed; the Engine's defaults that
/// `allow_caps` does not allow (net_raw by default) are dropped, and so is the task's cap_drop.
fn capability_lists(config: &TaskConfig, allow: CapSet) -> Result<(Vec<String>, Vec<String>), DriverError> {
    let supported = capabilities::supported();
    let add = CapSet::parse(&config.cap_add, supported)
        .map_err(|e| invalid(format!("cap_add: configured with capabilities not supported by system: {e}")))?;
    CapSet::parse(&config.cap_drop, supported)
        .map_err(|e| invalid(format!("cap_drop: configured with capabilities not supported by system: {e}")))?;
    let not_allowed = add.minus(allow);
    if not_allowed != CapSet::default() {
        return Err(DriverError::Refused(format!("driver does not allow the following capabilities: {}", not_allowed.names().join(", "))));
    }
    let mut engine_defaults: Vec<&str> = capabilities::NOMAD_DEFAULTS.to_vec();
    engine_defaults.push("net_raw");
    let engine_defaults = CapSet::parse(&engine_defaults, supported).unwrap_or_default();
    let mut drop: Vec<String> = engine_defaults.minus(allow).names().into_iter().map(str::to_string).collect();
    drop.extend(config.cap_drop.iter().cloned());
    Ok((config.cap_add.clone(), drop))
}

/// Everything the create call sends, from the task and its parsed config. `infra` is the
/// alloc's infra container, which a task in a group network joins unless it names a
/// `network_mode` of its own.
pub fn create_body(
    task: &Task,
    config: &TaskConfig,
    options: &DockerOptions,
    image: &str,
    dirs: &TaskDirs,
    infra: Option<&str>,
) -> Result<ContainerCreateBody, DriverError> {
    let network_mode = match (&config.network_mode, infra) {
        (Some(mode), _) => Some(mode.clone()),
        (None, Some(infra)) => Some(format!("container:{infra}")),
        (None, None) if task.netns.is_some() => {
            return Err(DriverError::Docker("the task is in a group network but the alloc has no infra container".to_string()));
        }
        (None, None) => None,
    };
    if config.port_map.is_some() {
        return Err(invalid("port_map: task-level port maps are not supported; use group network ports and `ports`"));
    }
    if config.auth.is_some() {
        return Err(invalid("auth: registry credentials are not supported: this client pulls from no registry"));
    }
    if config.isolation.as_deref().is_some_and(|i| !i.is_empty()) {
        return Err(invalid("isolation: Windows only"));
    }
    if config.cpu_hard_limit {
        return Err(invalid("cpu_hard_limit: not supported yet (use cpu shares)"));
    }
    if config.privileged && !options.allow_privileged {
        return Err(DriverError::Refused("docker privileged mode is disabled on this Nomad agent".to_string()));
    }
    if let Some(runtime) = &config.runtime
        && !options.allow_runtimes.contains(runtime)
    {
        return Err(DriverError::Refused(format!("runtime {runtime:?} is not allowed (plugin allow_runtimes)")));
    }
    if config.volume_driver.is_some() && !options.volumes_enabled {
        return Err(invalid("volume_driver: volumes are not enabled (plugin config volumes.enabled)"));
    }

    let cmd = match &config.command {
        Some(c) if c.is_empty() || c.trim() != c => return Err(invalid("command: must not be empty or padded with spaces")),
        Some(c) => Some(std::iter::once(c.clone()).chain(config.args.iter().cloned()).collect::<Vec<_>>()),
        None if config.args.is_empty() => None,
        None => Some(config.args.clone()),
    };

    let selinux = options.selinux_label.as_ref().map(|l| format!(":{l}")).unwrap_or_default();
    let mut binds = vec![
        format!("{}:/alloc{selinux}", dirs.alloc.display()),
        format!("{}:/local{selinux}", dirs.local.display()),
        format!("{}:/secrets{selinux}", dirs.secrets.display()),
    ];
    for (i, v) in config.volumes.iter().enumerate() {
        let key = format!("volumes[{i}]");
        let mut parts = v.splitn(3, ':');
        let (src, dst) = match (parts.next(), parts.next()) {
            (Some(s), Some(d)) if !s.is_empty() && !d.is_empty() => (s, d),
            _ => return Err(invalid(format!("{key}: {v:?} is not src:dst[:mode]"))),
        };
        let mode = parts.next().map(|m| format!(":{m}")).unwrap_or_default();
        let src = if config.volume_driver.is_some() && !src.starts_with('/') && !src.starts_with('.') {
            src.to_string()
        } else {
            bind_source(task, src, options, &key)?
        };
        binds.push(format!("{src}:{dst}{mode}{selinux}"));
    }
    // CSI and host volumes the agent mounted for the task.
    for m in &task.mounts {
        let mode = if m.read_only { ":ro" } else { "" };
        binds.push(format!("{}:{}{mode}", m.host_path.display(), m.task_path));
    }
    let mounts = config
        .mount
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("mount[{i}]"), m))
        .chain(config.mounts.iter().enumerate().map(|(i, m)| (format!("mounts[{i}]"), m)))
        .map(|(key, m)| mount_of(task, m, options, &key))
        .collect::<Result<Vec<_>, _>>()?;

    // Ports: each label maps the host port to the task's `to` (tcp and udp), as Nomad.
    // The Engine refuses port bindings and exposed ports for a container that joins another's
    // namespace; a group network's ports are mapped by CNI.
    let container_network = network_mode.as_deref().is_some_and(|m| m.starts_with("container:"));
    let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    let mut exposed = Vec::new();
    for label in &config.ports {
        let key = clean_env_key(label);
        let (Some(host_port), Some(to)) = (task.env.get(&format!("NOMAD_HOST_PORT_{key}")), task.env.get(&format!("NOMAD_PORT_{key}")))
        else {
            return Err(invalid(format!("ports: port label {label:?} not found in the group's network")));
        };
        if container_network {
            continue;
        }
        let host_ip = task.env.get(&format!("NOMAD_HOST_IP_{key}")).cloned().unwrap_or_default();
        for proto in ["tcp", "udp"] {
            let container_port = format!("{to}/{proto}");
            port_bindings
                .entry(container_port.clone())
                .or_insert_with(|| Some(Vec::new()))
                .get_or_insert_with(Vec::new)
                .push(PortBinding { host_ip: Some(host_ip.clone()), host_port: Some(host_port.clone()) });
            if !exposed.contains(&container_port) {
                exposed.push(container_port);
            }
        }
    }
    exposed.sort();

    let limits = &task.resources;
    let memory_mib = limits.memory_mib as i64;
    let hard_mib = config.memory_hard_limit.unwrap_or(0).max(limits.memory_max_mib as i64);
    let (memory, reservation) = if hard_mib > 0 { (hard_mib, Some(memory_mib)) } else { (memory_mib, None) };
    let memory_bytes = memory * 1024 * 1024;
    let pids_limit = match config.pids_limit {
        Some(p) if p < 0 => return Err(invalid("pids_limit: must not be negative")),
        Some(p) if options.pids_limit > 0 && (p == 0 || p > options.pids_limit) => {
            return Err(invalid(format!("pids_limit: cannot be greater than the plugin's pids_limit {}", options.pids_limit)));
        }
        Some(p) if p > 0 => p,
        _ => options.pids_limit,
    };
    let cpuset = config.cpuset_cpus.clone().or_else(|| task.env.get("NOMAD_CPU_CORES").filter(|c| !c.is_empty()).cloned());

    let (cap_add, cap_drop) = capability_lists(config, options.allow_caps)?;
    let devices = config
        .devices
        .iter()
        .map(|d| DeviceMapping {
            path_on_host: Some(d.host_path.clone()),
            path_in_container: Some(d.container_path.clone().unwrap_or_else(|| d.host_path.clone())),
            cgroup_permissions: Some(d.cgroup_permissions.clone().unwrap_or_else(|| "rwm".to_string())),
        })
        .collect::<Vec<_>>();
    let mut security_opt = Vec::new();
    for opt in &config.security_opt {
        match opt.strip_prefix("seccomp=").filter(|p| *p != "unconfined") {
            Some(path) => {
                use std::io::Read;
                let mut text = String::new();
                std::fs::File::open(path)
                    .and_then(|f| f.take(MAX_SECCOMP_BYTES).read_to_string(&mut text))
                    .map_err(|e| invalid(format!("security_opt: reading the seccomp profile {path}: {e}")))?;
                security_opt.push(format!("seccomp={text}"));
            }
            None => security_opt.push(opt.clone()),
        }
    }
    let ulimits = config.ulimit.iter().map(|(k, v)| ulimit(k, v)).collect::<Result<Vec<_>, _>>()?;
    let dns_servers: Vec<String> = config.dns_servers.iter().filter(|s| s.parse::<std::net::IpAddr>().is_ok()).cloned().collect();
    let logging = config.logging.clone().unwrap_or_default();
    let (log_type, log_config) = match logging.kind.or(logging.driver) {
        Some(t) => (t, logging.config),
        None => (options.logging_type.clone(), if logging.config.is_empty() { options.logging_config.clone() } else { logging.config }),
    };
    let nonempty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    let map = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone().into_iter().collect::<HashMap<_, _>>());

    let host_config = HostConfig {
        binds: Some(binds),
        mounts: (!mounts.is_empty()).then_some(mounts),
        cpu_shares: Some(limits.cpu_mhz.max(2) as i64),
        memory: Some(memory_bytes),
        memory_reservation: reservation.map(|r| r * 1024 * 1024),
        memory_swap: Some(memory_bytes),
        memory_swappiness: Some(0),
        cpuset_cpus: cpuset,
        pids_limit: Some(pids_limit),
        cpu_period: config.cpu_cfs_period.filter(|p| *p > 0),
        privileged: Some(config.privileged),
        cap_add: nonempty(&cap_add),
        cap_drop: nonempty(&cap_drop),
        devices: (!devices.is_empty()).then_some(devices),
        dns: nonempty(&dns_servers),
        dns_search: nonempty(&config.dns_search_domains),
        dns_options: nonempty(&config.dns_options),
        extra_hosts: nonempty(&config.extra_hosts),
        ipc_mode: config.ipc_mode.clone(),
        pid_mode: config.pid_mode.clone(),
        uts_mode: config.uts_mode.clone(),
        userns_mode: config.userns_mode.clone(),
        security_opt: nonempty(&security_opt),
        shm_size: config.shm_size,
        sysctls: map(&config.sysctl),
        storage_opt: map(&config.storage_opt),
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        log_config: Some(HostConfigLogConfig { typ: Some(log_type), config: map(&log_config) }),
        network_mode: network_mode.clone(),
        port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
        readonly_rootfs: Some(config.readonly_rootfs),
        init: config.init.then_some(true),
        group_add: nonempty(&config.group_add),
        runtime: config.runtime.clone(),
        volume_driver: config.volume_driver.clone(),
        ..HostConfig::default()
    };
    let networking_config = match (&config.network_mode, config.network_aliases.is_empty(), &config.ipv4_address, &config.ipv6_address) {
        (Some(mode), aliases_empty, v4, v6) if !aliases_empty || v4.is_some() || v6.is_some() || config.mac_address.is_some() => {
            let endpoint = EndpointSettings {
                aliases: nonempty(&config.network_aliases),
                ipam_config: (v4.is_some() || v6.is_some()).then(|| EndpointIpamConfig {
                    ipv4_address: v4.clone(),
                    ipv6_address: v6.clone(),
                    ..Default::default()
                }),
                mac_address: config.mac_address.clone(),
                ..Default::default()
            };
            Some(NetworkingConfig { endpoints_config: Some(HashMap::from([(mode.clone(), endpoint)])) })
        }
        _ => None,
    };
    Ok(ContainerCreateBody {
        image: Some(image.to_string()),
        cmd,
        entrypoint: nonempty(&config.entrypoint),
        env: Some(task.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
        labels: Some(labels(task, config, options)),
        hostname: config.hostname.clone(),
        working_dir: config.work_dir.clone(),
        user: task.user.clone(),
        exposed_ports: (!exposed.is_empty()).then_some(exposed),
        tty: Some(config.tty),
        open_stdin: Some(config.interactive),
        healthcheck: config
            .healthchecks
            .as_ref()
            .filter(|h| h.disable)
            .map(|_| HealthConfig { test: Some(vec!["NONE".to_string()]), ..Default::default() }),
        host_config: Some(host_config),
        networking_config,
        ..ContainerCreateBody::default()
    })
}

/// The Engine's status code of an error, if it answered.
pub fn status_of(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// An Engine error as a driver error.
pub fn engine_error(what: &str, e: DockerError) -> DriverError {
    DriverError::Docker(format!("{what}: {e}"))
}

/// Creates the container; one left by an earlier attempt under the same name is adopted when it
/// runs and replaced otherwise (Nomad's "container already exists" handling).
pub async fn create(docker: &Docker, name: &str, body: ContainerCreateBody) -> Result<(String, bool), DriverError> {
    let options = || Some(CreateContainerOptions { name: Some(name.to_string()), ..Default::default() });
    match docker.create_container(options(), body.clone()).await {
        Ok(created) => Ok((created.id, false)),
        Err(e) if status_of(&e) == Some(409) => {
            let existing = docker.inspect_container(name, None).await.map_err(|e| engine_error("inspect the existing container", e))?;
            let id = existing.id.unwrap_or_default();
            if existing.state.and_then(|s| s.running).unwrap_or(false) {
                return Ok((id, true));
            }
            remove(docker, &id).await?;
            let created = docker.create_container(options(), body).await.map_err(|e| engine_error("create container", e))?;
            Ok((created.id, false))
        }
        Err(e) => Err(engine_error("create container", e)),
    }
}

/// Sends a signal; a container that is gone or stopped is not an error.
pub async fn kill(docker: &Docker, id: &str, signal: &str) -> Result<(), DriverError> {
    match docker.kill_container(id, Some(KillContainerOptions { signal: signal.to_string() })).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(status_of(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(engine_error("signal container", e)),
    }
}

/// Force-removes the container with its anonymous volumes; a missing one is fine.
pub async fn remove(docker: &Docker, id: &str) -> Result<(), DriverError> {
    let options = RemoveContainerOptions { force: true, v: true, ..Default::default() };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Ok(()),
        Err(e) => Err(engine_error("remove container", e)),
    }
}

/// How long a stop's calls may take beyond the stop's own timeout.
pub const CALL_SLACK: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> Task {
        let env = [
            ("NOMAD_HOST_PORT_http", "25000"),
            ("NOMAD_PORT_http", "8080"),
            ("NOMAD_HOST_IP_http", "10.0.0.1"),
            ("NOMAD_CPU_CORES", "1,2"),
            ("NOMAD_JOB_NAME", "j"),
            ("NOMAD_JOB_ID", "j-id"),
        ];
        Task {
            alloc_id: "0b3c4d5e-0000-4000-8000-000000000001".into(),
            task_name: "web".into(),
            alloc_dir: "/allocs/A".into(),
            state_dir: "/state/A/web".into(),
            driver_config: serde_json::Map::new(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            user: None,
            resources: crate::client::driver::TaskResources { cpu_mhz: 500, memory_mib: 256, memory_max_mib: 512, pids_max: 0 },
            logs: Default::default(),
            kill_signal: nix::sys::signal::Signal::SIGTERM,
            kill_timeout: Duration::from_secs(5),
            mounts: Vec::new(),
            netns: None,
        }
    }

    fn dirs() -> TaskDirs {
        TaskDirs { alloc: "/allocs/A/alloc".into(), local: "/allocs/A/web/local".into(), secrets: "/allocs/A/web/secrets".into() }
    }

    fn config(v: serde_json::Value) -> TaskConfig {
        serde_json::from_value(v).unwrap()
    }

    fn options() -> DockerOptions {
        DockerOptions { extra_labels: vec!["job_*".into()], ..DockerOptions::default() }
    }

    /// The whole create body for a representative task, as the Engine receives it.
    #[test]
    fn the_create_body_is_nomads_container_contract() {
        let cfg = config(json!({
            "image": "x:1", "command": "sh", "args": ["-c", "run"], "ports": ["http"], "labels": [{"team": "a"}],
            "volumes": ["data:/data:ro"], "cap_drop": ["chown"], "dns_servers": ["8.8.8.8", "bogus"],
            "ulimit": [{"nofile": "1024:2048"}], "mount": [{"type": "tmpfs", "target": "/scratch", "tmpfs_options": [{"size": 1024}]}],
        }));
        let body = create_body(&task(), &cfg, &options(), "x:1", &dirs(), None).unwrap();
        let binding = json!([{"HostIp": "10.0.0.1", "HostPort": "25000"}]);
        let expected = json!({
            "Image": "x:1",
            "Cmd": ["sh", "-c", "run"],
            "Env": ["NOMAD_CPU_CORES=1,2", "NOMAD_HOST_IP_http=10.0.0.1", "NOMAD_HOST_PORT_http=25000", "NOMAD_JOB_ID=j-id",
                    "NOMAD_JOB_NAME=j", "NOMAD_PORT_http=8080"],
            "Labels": {
                "team": "a",
                "com.hashicorp.nomad.alloc_id": "0b3c4d5e-0000-4000-8000-000000000001",
                "io.nomad-rs.alloc_root": "/allocs",
                "com.hashicorp.nomad.job_name": "j",
                "com.hashicorp.nomad.job_id": "j-id",
            },
            "ExposedPorts": {"8080/tcp": {}, "8080/udp": {}},
            "Tty": false,
            "OpenStdin": false,
            "HostConfig": {
                "Binds": ["/allocs/A/alloc:/alloc", "/allocs/A/web/local:/local", "/allocs/A/web/secrets:/secrets", "/allocs/A/web/data:/data:ro"],
                "Mounts": [{"Target": "/scratch", "Type": "tmpfs", "ReadOnly": false, "TmpfsOptions": {"SizeBytes": 1024}}],
                "CpuShares": 500,
                "Memory": 512 * 1024 * 1024,
                "MemoryReservation": 256 * 1024 * 1024,
                "MemorySwap": 512 * 1024 * 1024,
                "MemorySwappiness": 0,
                "CpusetCpus": "1,2",
                "PidsLimit": 0,
                "Privileged": false,
                "CapDrop": ["net_raw", "chown"],
                "Dns": ["8.8.8.8"],
                "Ulimits": [{"Name": "nofile", "Soft": 1024, "Hard": 2048}],
                "LogConfig": {"Type": "json-file", "Config": {"max-file": "2", "max-size": "2m"}},
                "PortBindings": {"8080/tcp": binding, "8080/udp": binding},
                "ReadonlyRootfs": false,
            },
        });
        assert_eq!(serde_json::to_value(&body).unwrap(), expected);
    }

    #[test]
    fn policy_refusals_name_what_was_refused() {
        let err =
            |v: serde_json::Value, o: &DockerOptions| create_body(&task(), &config(v), o, "x:1", &dirs(), None).unwrap_err().to_string();
        let o = options();
        assert!(err(json!({"image": "x:1", "privileged": true}), &o).contains("privileged mode is disabled"));
        assert!(err(json!({"image": "x:1", "volumes": ["/etc:/etc"]}), &o).contains("volumes[0]: \"/etc\" is outside the alloc dir"));
        assert!(err(json!({"image": "x:1", "volumes": ["../../x:/x"]}), &o).contains("`..`"));
        assert!(
            err(json!({"image": "x:1", "mount": [{"type": "volume", "target": "/v", "source": "v"}]}), &o)
                .contains("volume mounts are not enabled")
        );
        assert!(
            err(json!({"image": "x:1", "cap_add": ["sys_admin"]}), &o)
                .contains("driver does not allow the following capabilities: sys_admin")
        );
        assert!(err(json!({"image": "x:1", "ports": ["grpc"]}), &o).contains("port label \"grpc\" not found"));
        assert!(err(json!({"image": "x:1", "auth": [{"username": "u"}]}), &o).contains("auth: registry credentials are not supported"));
        assert!(err(json!({"image": "x:1", "command": " sh"}), &o).contains("command: must not be empty or padded"));
        assert!(err(json!({"image": "x:1", "ulimit": {"nofile": "9:1"}}), &o).contains("soft limit 9 exceeds hard limit 1"));
        let mut bridged = task();
        bridged.netns = Some("/run/netns/x".into());
        let e = create_body(&bridged, &config(json!({"image": "x:1"})), &o, "x:1", &dirs(), None).unwrap_err().to_string();
        assert!(e.contains("the alloc has no infra container"), "{e}");
        // Allowed by the plugin.
        let mut open = options();
        open.allow_privileged = true;
        open.volumes_enabled = true;
        let body = create_body(
            &task(),
            &config(json!({"image": "x:1", "privileged": true, "volumes": ["/etc:/etc"]})),
            &open,
            "x:1",
            &dirs(),
            None,
        )
        .unwrap();
        assert_eq!(body.host_config.unwrap().privileged, Some(true));
    }

    /// In a group network the container joins the infra container's namespace: no port is
    /// bound or exposed (CNI maps them), and a `network_mode` of the task's own is kept.
    #[test]
    fn a_task_in_a_group_network_joins_the_infra_container() {
        let mut bridged = task();
        bridged.netns = Some("/run/netns/x".into());
        let cfg = config(json!({"image": "x:1", "ports": ["http"]}));
        let body = create_body(&bridged, &cfg, &options(), "x:1", &dirs(), Some("infra-id")).unwrap();
        assert_eq!(body.exposed_ports, None);
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("container:infra-id"));
        assert_eq!(host.port_bindings, None);
        let own = config(json!({"image": "x:1", "network_mode": "host"}));
        let host = create_body(&bridged, &own, &options(), "x:1", &dirs(), None).unwrap().host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("host"));
    }

    #[test]
    fn memory_without_memory_max_is_the_hard_limit() {
        let mut t = task();
        t.resources.memory_max_mib = 0;
        let host = create_body(&t, &config(json!({"image": "x:1"})), &options(), "x:1", &dirs(), None).unwrap().host_config.unwrap();
        assert_eq!((host.memory, host.memory_reservation), (Some(256 * 1024 * 1024), None));
        let host = create_body(&t, &config(json!({"image": "x:1", "memory_hard_limit": 300})), &options(), "x:1", &dirs(), None)
            .unwrap()
            .host_config
            .unwrap();
        assert_eq!((host.memory, host.memory_reservation), (Some(300 * 1024 * 1024), Some(256 * 1024 * 1024)));
    }

    #[test]
    fn names_and_images_follow_nomad() {
        assert_eq!(container_name(&Task { task_name: "a/b".into(), ..task() }), "a_b-0b3c4d5e-0000-4000-8000-000000000001");
        assert_eq!(normalize_image("redis"), "redis:latest");
        assert_eq!(normalize_image("https://reg:5000/redis"), "reg:5000/redis:latest");
        assert_eq!(normalize_image("reg:5000/redis:7"), "reg:5000/redis:7");
        assert_eq!(normalize_image("redis@sha256:abc"), "redis@sha256:abc");
        assert!(glob_match("job_*", "job_name") && glob_match("*name", "task_name") && !glob_match("job_*", "task_name"));
    }
}
