//! Agent configuration files in Nomad's HCL format.
//!
//! Files are parsed to a JSON value, merged in order (later files win, maps
//! merge key by key), then decoded into [`FileConfig`] with unknown keys
//! refused. Errors name the file and the key (`server.heartbeat_grace`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// A problem with a configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid HCL.
    #[error("{path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Parser message with line and column.
        message: String,
    },
    /// A key is unknown or its value has the wrong type.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// File(s) the merged value came from.
        path: String,
        /// Dotted key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// Everything an agent config file may hold, as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Agent (and node) name.
    pub name: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Datacenter.
    pub datacenter: Option<String>,
    /// Data directory.
    pub data_dir: Option<String>,
    /// Address every listener binds to.
    pub bind_addr: Option<String>,
    /// Log level (`TRACE`, `DEBUG`, `INFO`, `WARN`, `ERROR`).
    pub log_level: Option<String>,
    /// Listener ports.
    pub ports: Option<Ports>,
    /// Per-listener bind addresses.
    pub addresses: Option<Addresses>,
    /// Addresses advertised to others.
    pub advertise: Option<Addresses>,
    /// Server role.
    pub server: Option<ServerBlock>,
    /// Client role.
    pub client: Option<ClientBlock>,
    /// Listener limits (Nomad's agent `limits {}`).
    pub limits: Option<LimitsBlock>,
    /// Driver plugins: `plugin "raw_exec" { config { enabled = true } }`.
    pub plugin: Option<BTreeMap<String, PluginBlock>>,
    /// Accepted for compatibility; nomad-rs has no UI.
    pub ui: Option<Value>,
    /// `telemetry {}`: only `prometheus_metrics` is read; the other keys are listed as unused.
    pub telemetry: Option<Value>,
    /// Consul: `consul {}` (see [`super::consul`]).
    pub consul: Option<super::consul::ConsulBlock>,
    /// ACLs: `acl {}` (see [`super::acl`]).
    pub acl: Option<super::acl::AclBlock>,
    /// TLS: `tls {}` (see [`crate::tls`]).
    pub tls: Option<crate::tls::TlsBlock>,
    /// Accepted for compatibility.
    pub leave_on_interrupt: Option<bool>,
    /// Accepted for compatibility.
    pub leave_on_terminate: Option<bool>,
    /// Accepted for compatibility.
    pub disable_update_check: Option<bool>,
}

/// `ports {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ports {
    /// HTTP API port (4646).
    pub http: Option<u16>,
    /// RPC port (4647).
    pub rpc: Option<u16>,
    /// Serf port (4648); accepted, unused (servers form clusters over RPC).
    pub serf: Option<u16>,
}

/// `addresses {}` / `advertise {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Addresses {
    /// HTTP.
    pub http: Option<String>,
    /// RPC.
    pub rpc: Option<String>,
    /// Serf (unused).
    pub serf: Option<String>,
}

/// `server {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerBlock {
    /// Run the server role.
    pub enabled: Option<bool>,
    /// Servers expected before bootstrapping.
    pub bootstrap_expect: Option<usize>,
    /// Extra wait past a client's TTL.
    pub heartbeat_grace: Option<DurationValue>,
    /// Shortest client TTL.
    pub min_heartbeat_ttl: Option<DurationValue>,
    /// Target heartbeat rate of the leader.
    pub max_heartbeats_per_second: Option<f64>,
    /// TTL given to every client after a leader election.
    pub failover_heartbeat_ttl: Option<DurationValue>,
    /// Scheduler workers.
    pub num_schedulers: Option<usize>,
    /// Server data dir (defaults to `<data_dir>/server`).
    pub data_dir: Option<String>,
    /// How to find other servers.
    pub server_join: Option<ServerJoin>,
    /// Shorthand for `server_join { retry_join }`.
    pub retry_join: Option<Vec<String>>,
    /// Event stream buffer (batches).
    pub event_buffer_size: Option<usize>,
    /// Most allocs one job may ask for over all its groups (Nomad's name, from later versions).
    pub job_max_count: Option<i64>,
    /// The cluster key (base64 of 16, 24 or 32 bytes) the servers prove themselves to each other
    /// with; `nomad-rs operator keygen` makes one.
    pub encrypt: Option<String>,
    /// How often the leader runs the CSI volume claim GC (Nomad: 5m).
    pub csi_volume_claim_gc_interval: Option<DurationValue>,
    /// How old a volume must be for the claim GC (Nomad: 5m).
    pub csi_volume_claim_gc_threshold: Option<DurationValue>,
    /// How old an unused plugin must be for the plugin GC (accepted, unused: plugins go as soon
    /// as no node runs an instance).
    pub csi_plugin_gc_threshold: Option<DurationValue>,
    /// How old an expired ACL token must be for the token GC (Nomad: 1h).
    pub acl_token_gc_threshold: Option<DurationValue>,
    /// How often the leader collects finished jobs, evals, deployments and down nodes (Nomad: 5m).
    pub job_gc_interval: Option<DurationValue>,
    /// How long a job must have been finished to be collected (Nomad: 4h).
    pub job_gc_threshold: Option<DurationValue>,
    /// How long a service or system job's eval must have been finished (Nomad: 1h).
    pub eval_gc_threshold: Option<DurationValue>,
    /// How long a batch job's eval must have been finished (Nomad: 24h).
    pub batch_eval_gc_threshold: Option<DurationValue>,
    /// How long a deployment must have been finished (Nomad: 1h).
    pub deployment_gc_threshold: Option<DurationValue>,
    /// How long a node must have been down (Nomad: 24h).
    pub node_gc_threshold: Option<DurationValue>,
    /// How old the active root key may get before the leader replaces it (Nomad: 720h).
    pub root_key_rotation_threshold: Option<DurationValue>,
    /// How often the leader deletes unused inactive root keys (Nomad: 10m).
    pub root_key_gc_interval: Option<DurationValue>,
    /// How old an unused inactive root key must be to be deleted (Nomad: 1h).
    pub root_key_gc_threshold: Option<DurationValue>,
}

/// `limits {}`: what one client may hold on the listeners. 0 turns a limit off, as in Nomad.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsBlock {
    /// Time a new HTTP connection has to send its request head (Nomad: the TLS handshake and
    /// first byte; without TLS here, the whole head, and each next one on a kept connection).
    pub https_handshake_timeout: Option<DurationValue>,
    /// Most HTTP connections open at once from one client IP.
    pub http_max_conns_per_client: Option<i64>,
    /// Time a new RPC connection has to send its first bytes.
    pub rpc_handshake_timeout: Option<DurationValue>,
    /// Most RPC connections open at once from one client IP.
    pub rpc_max_conns_per_client: Option<i64>,
}

/// `server_join {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerJoin {
    /// Server RPC addresses to join.
    pub retry_join: Option<Vec<String>>,
    /// Accepted for compatibility.
    pub retry_max: Option<i64>,
    /// Accepted for compatibility.
    pub retry_interval: Option<DurationValue>,
}

/// `client {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientBlock {
    /// Run the client role.
    pub enabled: Option<bool>,
    /// Server RPC addresses.
    pub servers: Option<Vec<String>>,
    /// Node class.
    pub node_class: Option<String>,
    /// Node pool.
    pub node_pool: Option<String>,
    /// Node metadata.
    pub meta: Option<BTreeMap<String, String>>,
    /// Client options (`driver.raw_exec.enable` and the like).
    pub options: Option<BTreeMap<String, String>>,
    /// Client state dir (defaults to `<data_dir>/client`).
    pub state_dir: Option<String>,
    /// Alloc dir (defaults to `<data_dir>/alloc`).
    pub alloc_dir: Option<String>,
    /// Resources held back for the OS.
    pub reserved: Option<Reserved>,
    /// Host volumes.
    pub host_volume: Option<BTreeMap<String, HostVolumeBlock>>,
    /// Network interface to fingerprint.
    pub network_interface: Option<String>,
    /// Override fingerprinted CPU MHz.
    pub cpu_total_compute: Option<i64>,
    /// Override fingerprinted memory MiB.
    pub memory_total_mb: Option<i64>,
    /// Lowest dynamic port.
    pub min_dynamic_port: Option<i64>,
    /// Highest dynamic port.
    pub max_dynamic_port: Option<i64>,
    /// How often the alloc GC checks usage (Nomad: 1m).
    pub gc_interval: Option<DurationValue>,
    /// Percent of the alloc dir's disk in use above which terminal allocs are collected (80).
    pub gc_disk_usage_threshold: Option<f64>,
    /// Percent of its inodes in use above which terminal allocs are collected (70).
    pub gc_inode_usage_threshold: Option<f64>,
    /// Most allocs a client keeps, terminal ones included (50).
    pub gc_max_allocs: Option<i64>,
    /// Most alloc destroys at once (2).
    pub gc_parallel_destroys: Option<i64>,
    /// CNI plugin directories, `:`-separated.
    pub cni_path: Option<String>,
    /// Where `cni/<name>` network configs are read from.
    pub cni_config_dir: Option<String>,
    /// The bridge of `mode = "bridge"` networks.
    pub bridge_network_name: Option<String>,
    /// The bridge's subnet (host-local IPAM range).
    pub bridge_network_subnet: Option<String>,
    /// Hairpin mode on the bridge's ports.
    pub bridge_network_hairpin_mode: Option<bool>,
    /// What the exec driver's chroot holds: host path to path in the chroot (replaces the
    /// defaults).
    pub chroot_env: Option<BTreeMap<String, String>>,
    /// Artifact download limits.
    pub artifact: Option<ArtifactBlock>,
    /// How templates are rendered.
    pub template: Option<TemplateBlock>,
}

/// `client { template {} }`, Nomad's keys.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateBlock {
    /// Functions templates may not call.
    pub function_denylist: Option<Vec<String>>,
    /// The old name of `function_denylist`.
    pub function_blacklist: Option<Vec<String>>,
    /// Let templates reach outside the task's dirs.
    pub disable_file_sandbox: Option<bool>,
    /// Accepted; reads are consistent.
    pub max_stale: Option<String>,
    /// How long one blocking query waits.
    pub block_query_wait: Option<String>,
    /// The default quiescence of re-renders.
    pub wait: Option<TemplateWaitBlock>,
    /// What a template's own `wait` is clamped to.
    pub wait_bounds: Option<TemplateWaitBlock>,
    /// Accepted; templates do not read Consul.
    pub consul_retry: Option<TemplateRetryBlock>,
    /// Accepted; there is no Vault.
    pub vault_retry: Option<TemplateRetryBlock>,
    /// Retries of Nomad reads.
    pub nomad_retry: Option<TemplateRetryBlock>,
}

/// `wait {}` / `wait_bounds {}` of `client { template {} }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateWaitBlock {
    /// Duration.
    pub min: Option<String>,
    /// Duration.
    pub max: Option<String>,
}

/// `*_retry {}` of `client { template {} }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateRetryBlock {
    /// Attempts (0: unlimited).
    pub attempts: Option<i64>,
    /// The first wait.
    pub backoff: Option<String>,
    /// The longest wait.
    pub max_backoff: Option<String>,
}

/// `client { artifact {} }`, Nomad's keys (sizes and durations as strings).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ArtifactBlock {
    /// The whole HTTP exchange of one download.
    pub http_read_timeout: Option<String>,
    /// Most bytes one download may be.
    pub http_max_size: Option<String>,
    /// Accepted; only http is fetched.
    pub gcs_timeout: Option<String>,
    /// Accepted; only http is fetched.
    pub git_timeout: Option<String>,
    /// Accepted; only http is fetched.
    pub hg_timeout: Option<String>,
    /// Accepted; only http is fetched.
    pub s3_timeout: Option<String>,
    /// Most entries in one archive.
    pub decompression_file_count_limit: Option<i64>,
    /// Most bytes unpacked from one archive.
    pub decompression_size_limit: Option<String>,
    /// Accepted; there is no subprocess.
    pub disable_filesystem_isolation: Option<bool>,
    /// Accepted; there is no subprocess.
    pub set_environment_variables: Option<String>,
}

/// `client { reserved {} }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Reserved {
    /// MHz.
    pub cpu: Option<i64>,
    /// MiB.
    pub memory: Option<i64>,
    /// MiB.
    pub disk: Option<i64>,
    /// Port list, e.g. `22,80,8000-8100`.
    pub reserved_ports: Option<String>,
}

/// `client { host_volume "name" {} }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostVolumeBlock {
    /// Host path.
    pub path: String,
    /// Read-only.
    pub read_only: Option<bool>,
}

/// `plugin "name" {}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginBlock {
    /// The plugin's own configuration.
    pub config: Option<BTreeMap<String, Value>>,
    /// Accepted for compatibility.
    pub args: Option<Vec<String>>,
}

/// A duration written as a Go duration string (`"10s"`) or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationValue(pub std::time::Duration);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => {
                let ns = nomad_proto::time::parse_go_duration(&s).map_err(serde::de::Error::custom)?;
                if ns < 0 {
                    return Err(serde::de::Error::custom(format!("duration {s:?} must not be negative")));
                }
                Ok(DurationValue(std::time::Duration::from_nanos(ns as u64)))
            }
            // Bounded like a duration string (an i64 of nanoseconds, 292 years), so adding it to a TTL or
            // an instant cannot overflow.
            Value::Number(n) if n.as_u64().is_some_and(|secs| secs <= MAX_DURATION_SECS) => {
                Ok(DurationValue(std::time::Duration::from_secs(n.as_u64().unwrap_or(0))))
            }
            Value::Number(n) if n.as_u64().is_some() => {
                Err(serde::de::Error::custom(format!("duration {n} seconds is too long; the limit is {MAX_DURATION_SECS}")))
            }
            other => Err(serde::de::Error::custom(format!("invalid duration {other}: expected a string such as \"10s\""))),
        }
    }
}

/// Longest duration given as a number of seconds: what an i64 of nanoseconds holds, as for strings.
const MAX_DURATION_SECS: u64 = i64::MAX as u64 / 1_000_000_000;

/// Largest config file read, in bytes. Nomad's own configs are a few KiB; the parser's work
/// and memory grow with the text, so a file past this is refused before it is read whole.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;

/// Reads one HCL file into a JSON value.
pub fn read(path: &Path) -> Result<Value, ConfigError> {
    use std::io::Read;
    let read_err = |source| ConfigError::Read { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    // One byte past the limit is enough to know it is too large, whatever the file's size says.
    file.take(MAX_CONFIG_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(read_err)?;
    if bytes.len() as u64 > MAX_CONFIG_FILE_BYTES {
        return Err(ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("the file is larger than {MAX_CONFIG_FILE_BYTES} bytes, the limit for a config file"),
        });
    }
    let src = String::from_utf8(bytes).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: format!("the file is not UTF-8 (invalid byte at offset {})", e.utf8_error().valid_up_to()),
    })?;
    parse_str(&src, path)
}

/// Parses HCL text (named `path` in errors) into a JSON value.
pub fn parse_str(src: &str, path: &Path) -> Result<Value, ConfigError> {
    let value: Value =
        hcl::from_str(src).map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string().trim().to_string() })?;
    if !value.is_object() {
        return Err(ConfigError::Parse { path: path.to_path_buf(), message: "expected attributes and blocks at the top level".into() });
    }
    Ok(value)
}

/// Merges `over` into `base`: objects key by key, anything else replaced.
pub fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Decodes a merged value, naming the offending key on error.
pub fn decode(value: Value, origin: &str) -> Result<FileConfig, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let key = e.path().to_string();
        let message = e.inner().to_string();
        ConfigError::Invalid { path: origin.to_string(), key: if key == "." { "(top level)".into() } else { key }, message }
    })
}

/// Reads, merges and decodes config files in order.
pub fn load(paths: &[PathBuf]) -> Result<FileConfig, ConfigError> {
    let mut merged = Value::Object(Default::default());
    let mut origins = Vec::new();
    for p in paths {
        let files: Vec<PathBuf> = if p.is_dir() {
            // A directory holds `.hcl` files, read in name order, as Nomad does.
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|source| ConfigError::Read { path: p.clone(), source })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "hcl"))
                .collect();
            v.sort();
            v
        } else {
            vec![p.clone()]
        };
        for f in files {
            let v = read(&f)?;
            // Decode each file alone first so an error names the file it is in.
            decode(v.clone(), &f.display().to_string())?;
            merge(&mut merged, v);
            origins.push(f.display().to_string());
        }
    }
    decode(merged, &origins.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Result<FileConfig, ConfigError> {
        decode(parse_str(src, Path::new("agent.hcl"))?, "agent.hcl")
    }

    #[test]
    fn a_full_config_decodes() {
        let c = parse(
            r#"
name       = "n1"
datacenter = "dc2"
data_dir   = "/var/lib/nomad-rs"
bind_addr  = "0.0.0.0"
log_level  = "DEBUG"
ports {
  http = 5646
  rpc  = 5647
  serf = 5648
}
server {
  enabled                   = true
  bootstrap_expect          = 3
  heartbeat_grace           = "1s"
  min_heartbeat_ttl         = "500ms"
  max_heartbeats_per_second = 100.0
  num_schedulers            = 2
  job_max_count             = 1000
  server_join {
    retry_join = ["10.0.0.1:4647"]
  }
}
client {
  enabled    = true
  servers    = ["10.0.0.1:4647"]
  node_class = "edge"
  meta {
    rack = "r1"
  }
  options = {
    "driver.allowlist" = "raw_exec"
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
"#,
        )
        .unwrap();
        let s = c.server.unwrap();
        assert_eq!(s.heartbeat_grace, Some(DurationValue(std::time::Duration::from_secs(1))));
        assert_eq!(s.min_heartbeat_ttl, Some(DurationValue(std::time::Duration::from_millis(500))));
        assert_eq!(s.job_max_count, Some(1000));
        assert_eq!(s.server_join.unwrap().retry_join.unwrap(), vec!["10.0.0.1:4647"]);
        let cl = c.client.unwrap();
        assert_eq!(cl.meta.unwrap()["rack"], "r1");
        assert_eq!(c.plugin.unwrap()["raw_exec"].config.as_ref().unwrap()["enabled"], Value::Bool(true));
        assert_eq!(c.ports.unwrap().http, Some(5646));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_file_and_key() {
        let e = parse("server {\n  enabeld = true\n}\n").unwrap_err().to_string();
        assert!(e.starts_with("agent.hcl: server.enabeld: unknown field `enabeld`"), "{e}");
        let e = parse("server {\n  heartbeat_grace = \"soon\"\n}\n").unwrap_err().to_string();
        assert!(e.contains("server.heartbeat_grace") && e.contains("invalid duration"), "{e}");
        let e = parse("ports {\n  http = \"x\"\n}\n").unwrap_err().to_string();
        assert!(e.contains("ports.http"), "{e}");
        let e = parse("ports {\n  http = 70000\n}\n").unwrap_err().to_string();
        assert!(e.contains("ports.http"), "{e}");
        let e = parse("name = \n").unwrap_err().to_string();
        assert!(e.contains("agent.hcl") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn later_files_win_and_maps_merge() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.hcl");
        let b = dir.path().join("b.hcl");
        std::fs::write(&a, "name = \"a\"\nclient {\n  meta {\n    x = \"1\"\n  }\n}\n").unwrap();
        std::fs::write(&b, "name = \"b\"\nclient {\n  meta {\n    y = \"2\"\n  }\n}\n").unwrap();
        let c = load(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(c.name.as_deref(), Some("b"));
        let meta = c.client.unwrap().meta.unwrap();
        assert_eq!((meta["x"].as_str(), meta["y"].as_str()), ("1", "2"));
        let from_dir = load(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(from_dir.name.as_deref(), Some("b"));
        std::fs::write(&b, "nmae = \"b\"\n").unwrap();
        let e = load(&[a, b]).unwrap_err().to_string();
        assert!(e.contains("b.hcl") && e.contains("nmae"), "{e}");
        let e = load(&[dir.path().join("missing.hcl")]).unwrap_err().to_string();
        assert!(e.contains("missing.hcl"), "{e}");
    }

    #[test]
    fn a_file_past_the_size_limit_is_refused_before_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.hcl");
        // Valid HCL, so only the size can refuse it.
        let line = "# padding padding padding padding padding padding padding padding padding\n";
        std::fs::write(&big, line.repeat((MAX_CONFIG_FILE_BYTES as usize / line.len()) + 1)).unwrap();
        let e = load(std::slice::from_ref(&big)).unwrap_err().to_string();
        assert!(e.contains("big.hcl") && e.contains("larger than 1048576 bytes"), "{e}");
        std::fs::write(&big, line.repeat(10)).unwrap();
        assert!(load(std::slice::from_ref(&big)).is_ok(), "a small file with the same content loads");
        std::fs::write(&big, b"name = \"\xff\"\n").unwrap();
        assert!(load(&[big]).unwrap_err().to_string().contains("not UTF-8"));
    }

    #[test]
    fn deep_nesting_is_a_parse_error_not_a_stack_overflow() {
        let n = 100_000;
        for src in [
            format!("name = {}1{}\n", "[".repeat(n), "]".repeat(n)),
            format!("name = {}{}\n", "{a = ".repeat(n), "}".repeat(n)),
            format!("name = {}1{}\n", "(".repeat(n), ")".repeat(n)),
            format!("name = {}1\n", "-".repeat(n)),
            format!("name = 1{}\n", " + 1".repeat(n)),
            format!("plugin \"x\" {{\n  config {{\n{}{}  }}\n}}\n", "a {\n".repeat(n), "}\n".repeat(n)),
            format!("name = \"{}{}\"\n", "${\"".repeat(n), "\"}".repeat(n)),
        ] {
            let e = parse_str(&src, Path::new("deep.hcl")).unwrap_err().to_string();
            assert!(e.starts_with("deep.hcl: ") && (e.contains("nesting depth") || e.contains("at most")), "{}: {e}", &src[..40]);
        }
    }

    #[test]
    fn durations_given_in_seconds_are_bounded() {
        let e = parse("server {\n  heartbeat_grace = 18446744073709551615\n}\n").unwrap_err().to_string();
        assert!(e.contains("server.heartbeat_grace") && e.contains("too long"), "{e}");
        let ok = parse("server {\n  heartbeat_grace = 9223372036\n}\n").unwrap();
        assert_eq!(ok.server.unwrap().heartbeat_grace.unwrap().0.as_secs(), 9_223_372_036);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        #[test]
        fn arbitrary_config_text_never_panics(src in "(\\PC|[{}\\[\\]()=\"\n$%~]){0,200}") {
            let _ = parse_str(&src, Path::new("fuzz.hcl")).and_then(|v| decode(v, "fuzz.hcl"));
        }
    }
}
