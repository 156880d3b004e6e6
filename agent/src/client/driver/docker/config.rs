//! The docker task config and plugin config with Nomad's keys; an unknown key is an error naming it.
//!
//! Job files turn blocks and object-valued attributes into lists of objects (`labels = {..}` and
//! `labels {..}` both arrive as `[{..}]`), and agent files may give a plain object, so maps and
//! single blocks accept either form.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde_json::Value;

use super::super::capabilities::{self, CapSet};

/// Most entries any list or map of the task config may hold.
pub const MAX_CONFIG_ENTRIES: usize = 256;

/// A map given as an object, or a list of objects merged in order. Scalar values become strings.
fn string_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let value = Value::deserialize(d)?;
    let objects = match value {
        Value::Object(m) => vec![m],
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Object(m) => Ok(m),
                other => Err(de::Error::custom(format!("expected a map, got {other}"))),
            })
            .collect::<Result<_, _>>()?,
        Value::Null => Vec::new(),
        other => return Err(de::Error::custom(format!("expected a map, got {other}"))),
    };
    let mut out = BTreeMap::new();
    for (k, v) in objects.into_iter().flatten() {
        let v = match v {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => return Err(de::Error::custom(format!("{k}: expected a string, got {other}"))),
        };
        out.insert(k, v);
    }
    if out.len() > MAX_CONFIG_ENTRIES {
        return Err(de::Error::custom(format!("more than {MAX_CONFIG_ENTRIES} entries")));
    }
    Ok(out)
}

/// One block, given as an object or as a list holding one object.
fn one_block<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let value = Value::deserialize(d)?;
    let object = match value {
        Value::Null => return Ok(None),
        Value::Array(mut items) if items.len() <= 1 => match items.pop() {
            None => return Ok(None),
            Some(v) => v,
        },
        Value::Array(_) => return Err(de::Error::custom("only one block is allowed")),
        v => v,
    };
    serde_path_to_error::deserialize(object).map(Some).map_err(|e| de::Error::custom(path_error(&e)))
}

/// A bounded list.
fn bounded_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let items: Vec<T> = Option::<Vec<T>>::deserialize(d)?.unwrap_or_default();
    if items.len() > MAX_CONFIG_ENTRIES {
        return Err(de::Error::custom(format!("more than {MAX_CONFIG_ENTRIES} entries")));
    }
    Ok(items)
}

fn path_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) }
}

/// A Go duration string (`"3m"`) or a number of nanoseconds.
fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => nomad_proto::time::parse_go_duration(&s)
            .map_err(|e| de::Error::custom(format!("{s:?}: {e}")))
            .and_then(|ns| u64::try_from(ns).map_err(|_| de::Error::custom(format!("{s:?}: must not be negative"))))
            .map(|ns| Some(Duration::from_nanos(ns))),
        Value::Number(n) => {
            n.as_u64().map(|ns| Some(Duration::from_nanos(ns))).ok_or_else(|| de::Error::custom(format!("{n}: not a duration")))
        }
        other => Err(de::Error::custom(format!("expected a duration, got {other}"))),
    }
}

/// The task's `config { ... }` block (Nomad 1.6's keys).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    pub image: String,
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub args: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub entrypoint: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub ports: Vec<String>,
    /// Deprecated task-level port mapping; refused with advice.
    #[serde(default)]
    pub port_map: Option<Value>,
    #[serde(default, deserialize_with = "string_map")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub volumes: Vec<String>,
    #[serde(default)]
    pub volume_driver: Option<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub mount: Vec<MountBlock>,
    /// The pre-1.0 spelling of `mount`.
    #[serde(default, deserialize_with = "bounded_list")]
    pub mounts: Vec<MountBlock>,
    #[serde(default)]
    pub network_mode: Option<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub network_aliases: Vec<String>,
    #[serde(default)]
    pub ipv4_address: Option<String>,
    #[serde(default)]
    pub ipv6_address: Option<String>,
    #[serde(default)]
    pub mac_address: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub work_dir: Option<String>,
    #[serde(default)]
    pub privileged: bool,
    #[serde(default, deserialize_with = "bounded_list")]
    pub cap_add: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub cap_drop: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub devices: Vec<DeviceBlock>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub dns_servers: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub dns_search_domains: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub dns_options: Vec<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub extra_hosts: Vec<String>,
    #[serde(default)]
    pub ipc_mode: Option<String>,
    #[serde(default)]
    pub pid_mode: Option<String>,
    #[serde(default)]
    pub uts_mode: Option<String>,
    #[serde(default)]
    pub userns_mode: Option<String>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub security_opt: Vec<String>,
    #[serde(default)]
    pub shm_size: Option<i64>,
    #[serde(default, deserialize_with = "string_map")]
    pub sysctl: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "string_map")]
    pub ulimit: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "string_map")]
    pub storage_opt: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "one_block")]
    pub logging: Option<LoggingBlock>,
    #[serde(default)]
    pub force_pull: bool,
    #[serde(default, deserialize_with = "duration")]
    pub image_pull_timeout: Option<Duration>,
    /// Registry credentials; refused: this client reaches no registry.
    #[serde(default)]
    pub auth: Option<Value>,
    #[serde(default)]
    pub auth_soft_fail: bool,
    /// A `docker save` tarball under the task's `local/` dir.
    #[serde(default)]
    pub load: Option<String>,
    #[serde(default)]
    pub interactive: bool,
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub readonly_rootfs: bool,
    #[serde(default)]
    pub init: bool,
    #[serde(default, deserialize_with = "bounded_list")]
    pub group_add: Vec<String>,
    #[serde(default)]
    pub runtime: Option<String>,
    #[serde(default)]
    pub isolation: Option<String>,
    #[serde(default)]
    pub cpu_hard_limit: bool,
    #[serde(default)]
    pub cpu_cfs_period: Option<i64>,
    #[serde(default)]
    pub cpuset_cpus: Option<String>,
    #[serde(default)]
    pub memory_hard_limit: Option<i64>,
    #[serde(default)]
    pub pids_limit: Option<i64>,
    #[serde(default, deserialize_with = "one_block")]
    pub healthchecks: Option<HealthchecksBlock>,
    #[serde(default)]
    pub advertise_ipv6_address: bool,
}

/// A `mount` block.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountBlock {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub readonly: bool,
    #[serde(default, deserialize_with = "one_block")]
    pub bind_options: Option<BindOptions>,
    #[serde(default, deserialize_with = "one_block")]
    pub tmpfs_options: Option<TmpfsOptions>,
    #[serde(default, deserialize_with = "one_block")]
    pub volume_options: Option<VolumeOptions>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindOptions {
    #[serde(default)]
    pub propagation: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TmpfsOptions {
    #[serde(default)]
    pub size: Option<i64>,
    #[serde(default)]
    pub mode: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeOptions {
    #[serde(default)]
    pub no_copy: bool,
    #[serde(default, deserialize_with = "string_map")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "one_block")]
    pub driver_config: Option<VolumeDriverConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeDriverConfig {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "string_map")]
    pub options: BTreeMap<String, String>,
}

/// A `devices` entry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceBlock {
    pub host_path: String,
    #[serde(default)]
    pub container_path: Option<String>,
    #[serde(default)]
    pub cgroup_permissions: Option<String>,
}

/// The `logging` block.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingBlock {
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The legacy spelling of `type`.
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default, deserialize_with = "string_map")]
    pub config: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthchecksBlock {
    #[serde(default)]
    pub disable: bool,
}

/// `plugin "docker" { config { ... } }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// `unix:///path` (empty: `DOCKER_HOST`, else `/var/run/docker.sock`).
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub allow_privileged: bool,
    #[serde(default = "default_allow_caps", deserialize_with = "bounded_list")]
    pub allow_caps: Vec<String>,
    #[serde(default, deserialize_with = "one_block")]
    pub volumes: Option<VolumesBlock>,
    #[serde(default, deserialize_with = "one_block")]
    pub gc: Option<GcBlock>,
    #[serde(default, deserialize_with = "bounded_list")]
    pub extra_labels: Vec<String>,
    #[serde(default)]
    pub infra_image: Option<String>,
    #[serde(default, deserialize_with = "duration")]
    pub infra_image_pull_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub pull_activity_timeout: Option<Duration>,
    #[serde(default)]
    pub pids_limit: Option<i64>,
    #[serde(default = "default_runtimes", deserialize_with = "bounded_list")]
    pub allow_runtimes: Vec<String>,
    #[serde(default)]
    pub nvidia_runtime: Option<String>,
    #[serde(default, deserialize_with = "one_block")]
    pub logging: Option<LoggingBlock>,
    #[serde(default)]
    pub disable_log_collection: bool,
    /// Registry auth (`config`, `helper`); refused: no registry is reachable.
    #[serde(default)]
    pub auth: Option<Value>,
    /// TLS to a TCP endpoint; refused: only unix sockets are spoken.
    #[serde(default)]
    pub tls: Option<Value>,
}

fn default_allow_caps() -> Vec<String> {
    capabilities::NOMAD_DEFAULTS.iter().map(|s| s.to_string()).collect()
}

fn default_runtimes() -> Vec<String> {
    vec!["runc".to_string(), "nvidia".to_string()]
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumesBlock {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub selinuxlabel: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcBlock {
    #[serde(default)]
    pub image: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub image_delay: Option<Duration>,
    #[serde(default)]
    pub container: Option<bool>,
    #[serde(default, deserialize_with = "one_block")]
    pub dangling_containers: Option<DanglingBlock>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DanglingBlock {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "duration")]
    pub period: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    pub creation_grace: Option<Duration>,
    #[serde(default)]
    pub dry_run: bool,
}

/// The plugin config, resolved with Nomad's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerOptions {
    /// The Engine's unix socket.
    pub socket: String,
    pub allow_privileged: bool,
    pub allow_caps: CapSet,
    pub volumes_enabled: bool,
    pub selinux_label: Option<String>,
    pub gc_image: bool,
    pub image_delay: Duration,
    pub gc_container: bool,
    pub dangling_enabled: bool,
    pub dangling_period: Duration,
    pub dangling_grace: Duration,
    pub dangling_dry_run: bool,
    pub extra_labels: Vec<String>,
    pub infra_image: String,
    pub infra_image_pull_timeout: Duration,
    pub pull_activity_timeout: Duration,
    pub pids_limit: i64,
    pub allow_runtimes: Vec<String>,
    pub logging_type: String,
    pub logging_config: BTreeMap<String, String>,
    pub disable_log_collection: bool,
    /// The agent's alloc dir root (set by the agent, not the plugin config): labels this agent's
    /// containers so the dangling reaper leaves other agents' alone.
    pub alloc_root: Option<std::path::PathBuf>,
}

/// Below this the reaper would race containers still being started.
const MIN_CREATION_GRACE: Duration = Duration::from_secs(60);
const MIN_PULL_ACTIVITY_TIMEOUT: Duration = Duration::from_secs(60);

/// Nomad's `infra_image` on amd64.
pub const DEFAULT_INFRA_IMAGE: &str = "gcr.io/google_containers/pause-amd64:3.1";

/// The socket when neither `endpoint` nor `DOCKER_HOST` names one.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions::from_plugin_config(&serde_json::Map::new()).expect("the empty config is valid")
    }
}

impl DockerOptions {
    /// Reads `plugin "docker" { config { ... } }`; the error names the key that is wrong.
    pub fn from_plugin_config(config: &serde_json::Map<String, Value>) -> Result<DockerOptions, String> {
        let err = |reason: String| format!("plugin \"docker\" config {reason}");
        let raw: PluginConfig = serde_path_to_error::deserialize(Value::Object(config.clone())).map_err(|e| err(path_error(&e)))?;
        if raw.auth.is_some() {
            return Err(err("auth: registry credentials are not supported: this client pulls from no registry".into()));
        }
        if raw.tls.is_some() {
            return Err(err("tls: only a unix socket endpoint (unix:///path) is supported".into()));
        }
        let socket = match raw.endpoint.as_deref().filter(|e| !e.is_empty()) {
            Some(e) => match e.strip_prefix("unix://") {
                Some(path) if path.starts_with('/') => path.to_string(),
                _ => return Err(err(format!("endpoint: {e:?} is not a unix socket (unix:///path)"))),
            },
            None => match std::env::var("DOCKER_HOST").ok().as_deref().and_then(|h| h.strip_prefix("unix://")) {
                Some(path) if path.starts_with('/') => path.to_string(),
                _ => DEFAULT_SOCKET.to_string(),
            },
        };
        let allow_caps = CapSet::parse(&raw.allow_caps, capabilities::supported())
            .map_err(|e| err(format!("allow_caps: configured with capabilities not supported by system: {e}")))?;
        let volumes = raw.volumes.unwrap_or_default();
        let gc = raw.gc.unwrap_or_default();
        let dangling = gc.dangling_containers.clone().unwrap_or_default();
        let dangling_grace = dangling.creation_grace.unwrap_or(Duration::from_secs(300));
        if dangling_grace < MIN_CREATION_GRACE {
            return Err(err("gc.dangling_containers.creation_grace: must be at least 1m".into()));
        }
        let dangling_period = dangling.period.unwrap_or(Duration::from_secs(300));
        if dangling_period.is_zero() {
            return Err(err("gc.dangling_containers.period: must be positive".into()));
        }
        let pull_activity_timeout = raw.pull_activity_timeout.unwrap_or(Duration::from_secs(120));
        if pull_activity_timeout < MIN_PULL_ACTIVITY_TIMEOUT {
            return Err(err("pull_activity_timeout: must be at least 1m".into()));
        }
        let logging = raw.logging.unwrap_or_default();
        let logging_type = logging.kind.or(logging.driver).unwrap_or_else(|| "json-file".to_string());
        let logging_config = if logging.config.is_empty() && logging_type == "json-file" {
            BTreeMap::from([("max-file".to_string(), "2".to_string()), ("max-size".to_string(), "2m".to_string())])
        } else {
            logging.config
        };
        Ok(DockerOptions {
            socket,
            allow_privileged: raw.allow_privileged,
            allow_caps,
            volumes_enabled: volumes.enabled,
            selinux_label: volumes.selinuxlabel.filter(|s| !s.is_empty()),
            gc_image: gc.image.unwrap_or(true),
            image_delay: gc.image_delay.unwrap_or(Duration::from_secs(180)),
            gc_container: gc.container.unwrap_or(true),
            dangling_enabled: dangling.enabled.unwrap_or(true),
            dangling_period,
            dangling_grace,
            dangling_dry_run: dangling.dry_run,
            extra_labels: raw.extra_labels,
            infra_image: raw.infra_image.unwrap_or_else(|| DEFAULT_INFRA_IMAGE.to_string()),
            infra_image_pull_timeout: raw.infra_image_pull_timeout.unwrap_or(Duration::from_secs(300)),
            pull_activity_timeout,
            pids_limit: raw.pids_limit.unwrap_or(0).max(0),
            allow_runtimes: raw.allow_runtimes,
            logging_type,
            logging_config,
            disable_log_collection: raw.disable_log_collection,
            alloc_root: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plugin(v: Value) -> Result<DockerOptions, String> {
        DockerOptions::from_plugin_config(v.as_object().unwrap())
    }

    #[test]
    fn plugin_defaults_are_nomads() {
        let o = plugin(json!({"endpoint": "unix:///run/d.sock"})).unwrap();
        assert_eq!(o.socket, "/run/d.sock");
        assert!(o.gc_image && o.gc_container && o.dangling_enabled && !o.volumes_enabled && !o.allow_privileged);
        assert_eq!(o.image_delay, Duration::from_secs(180));
        assert_eq!(o.dangling_grace, Duration::from_secs(300));
        assert_eq!(o.pull_activity_timeout, Duration::from_secs(120));
        assert_eq!(o.logging_type, "json-file");
        assert_eq!(o.allow_caps.names().len(), capabilities::NOMAD_DEFAULTS.len());
    }

    #[test]
    fn plugin_blocks_are_read_as_objects_or_lists() {
        let o = plugin(json!({
            "allow_privileged": true,
            "volumes": [{"enabled": true}],
            "gc": {"image": false, "image_delay": "10s", "dangling_containers": [{"enabled": false, "creation_grace": "2m"}]},
            "extra_labels": ["job_name", "task*"],
            "infra_image": "pause:local",
            "pull_activity_timeout": "5m",
        }))
        .unwrap();
        assert!(o.allow_privileged && o.volumes_enabled && !o.gc_image && !o.dangling_enabled);
        assert_eq!(o.image_delay, Duration::from_secs(10));
        assert_eq!(o.dangling_grace, Duration::from_secs(120));
        assert_eq!(o.extra_labels, ["job_name", "task*"]);
        assert_eq!(o.infra_image, "pause:local");
        assert_eq!(plugin(json!({"infra_image_pull_timeout": "30s"})).unwrap().infra_image_pull_timeout, Duration::from_secs(30));
        assert_eq!(plugin(json!({})).unwrap().infra_image_pull_timeout, Duration::from_secs(300));
        assert_eq!(plugin(json!({})).unwrap().infra_image, DEFAULT_INFRA_IMAGE);
    }

    #[test]
    fn plugin_errors_name_the_key() {
        assert_eq!(plugin(json!({"endpoit": "x"})).unwrap_err().split(':').next().unwrap(), "plugin \"docker\" config endpoit");
        assert!(
            plugin(json!({"gc": {"imag": true}})).unwrap_err().starts_with("plugin \"docker\" config gc: "),
            "{:?}",
            plugin(json!({"gc": {"imag": true}}))
        );
        assert!(plugin(json!({"gc": {"image_delay": "soon"}})).unwrap_err().contains("image_delay"));
        assert!(plugin(json!({"endpoint": "tcp://1.2.3.4:2375"})).unwrap_err().contains("not a unix socket"));
        assert!(plugin(json!({"auth": {"config": "/x"}})).unwrap_err().contains("auth: registry credentials are not supported"));
        assert!(plugin(json!({"gc": {"dangling_containers": {"creation_grace": "10s"}}})).unwrap_err().contains("at least 1m"));
        assert!(plugin(json!({"allow_caps": ["flying"]})).unwrap_err().contains("allow_caps"));
    }

    fn task(v: Value) -> Result<TaskConfig, String> {
        serde_path_to_error::deserialize(v).map_err(|e| path_error(&e))
    }

    #[test]
    fn task_config_reads_nomads_keys_in_job_file_shapes() {
        let c = task(json!({
            "image": "busybox:1.36",
            "command": "sh",
            "args": ["-c", "echo hi"],
            "labels": [{"team": "a", "n": 3}],
            "ports": ["http"],
            "mount": [{"type": "tmpfs", "target": "/scratch", "tmpfs_options": [{"size": 1024}]}],
            "logging": [{"type": "json-file", "config": [{"max-size": "1m"}]}],
            "sysctl": [{"net.core.somaxconn": "16384"}],
            "ulimit": {"nofile": "2048:4096"},
            "devices": [{"host_path": "/dev/null"}],
            "healthchecks": [{"disable": true}],
        }))
        .unwrap();
        assert_eq!(c.labels["n"], "3");
        assert_eq!(c.mount[0].tmpfs_options.as_ref().unwrap().size, Some(1024));
        assert_eq!(c.logging.unwrap().config["max-size"], "1m");
        assert!(c.healthchecks.unwrap().disable);
    }

    #[test]
    fn task_config_errors_name_the_key() {
        assert!(task(json!({"image": "a:1", "comand": "x"})).unwrap_err().contains("unknown field `comand`"));
        assert!(task(json!({})).unwrap_err().contains("missing field `image`"));
        assert!(task(json!({"image": "a:1", "mount": [{"target": "/x", "colour": 1}]})).unwrap_err().starts_with("mount[0]"));
        assert!(task(json!({"image": "a:1", "logging": [{"type": "x"}, {"type": "y"}]})).unwrap_err().contains("only one block"));
        let many: Vec<String> = (0..300).map(|i| i.to_string()).collect();
        assert!(task(json!({"image": "a:1", "args": many})).unwrap_err().contains("more than 256"));
    }
}
