//! The CNI protocol, caller side (CNI SPEC.md, as libcni 1.1 runs a network list): each
//! plugin's binary is found in `cni_path` and executed with `CNI_*` in its environment and its
//! config JSON on stdin; ADD runs the list in order, each plugin getting the previous one's
//! result as `prevResult`; DEL runs it in reverse with the cached final ADD result.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nomad_proto::resources::DnsConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The network list Nomad's bridge mode uses (`networking_bridge_linux.go`), built in memory.
pub fn bridge_conflist(bridge: &str, subnet: &str, hairpin: bool) -> Value {
    json!({
        "cniVersion": "0.4.0",
        "name": "nomad",
        "plugins": [
            {"type": "loopback"},
            {
                "type": "bridge",
                "bridge": bridge,
                "ipMasq": true,
                "isGateway": true,
                "forceAddress": true,
                "hairpinMode": hairpin,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": "NOMAD-ADMIN"},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    })
}

/// One `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The host port.
    pub host_port: i64,
    /// The port inside the namespace.
    pub container_port: i64,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Host address to bind (left out: every address).
    #[serde(default, rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// The alloc's ports as Nomad maps them (`getPortMapping`): each allocated port gives a tcp and
/// a udp entry, to its `to` (its host value when `to` is unset). The host IP is left out, as
/// Nomad does while `bind_wildcard_default_host_network` holds and no `host_network` exists.
pub fn port_mappings(alloc: &nomad_proto::Allocation) -> Vec<PortMapping> {
    let ports = alloc.allocated_resources.as_ref().map(|r| r.shared.ports.as_slice()).unwrap_or_default();
    let mut out = Vec::new();
    for p in ports {
        let to = if p.to < 1 { p.value } else { p.to };
        for protocol in ["tcp", "udp"] {
            out.push(PortMapping { host_port: p.value, container_port: to, protocol: protocol.into(), host_ip: String::new() });
        }
    }
    out
}

/// A network list: its name, version and plugins (each a JSON object with a `type`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    /// `name`.
    pub name: String,
    /// `cniVersion`.
    pub cni_version: String,
    /// The plugins' configs, in order.
    pub plugins: Vec<Map<String, Value>>,
}

impl NetworkList {
    /// From a `.conflist` document.
    pub fn from_conflist(doc: &Value) -> Result<NetworkList, String> {
        let obj = doc.as_object().ok_or("a network list must be a JSON object")?;
        let name = obj.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or("no 'name' in the network list")?;
        let cni_version = obj.get("cniVersion").and_then(Value::as_str).unwrap_or("0.4.0").to_string();
        let plugins = obj.get("plugins").and_then(Value::as_array).ok_or_else(|| format!("no 'plugins' in network list {name:?}"))?;
        if plugins.is_empty() {
            return Err(format!("no plugins in network list {name:?}"));
        }
        let plugins = plugins
            .iter()
            .map(|p| {
                let p = p.as_object().ok_or_else(|| format!("a plugin of network list {name:?} is not a JSON object"))?;
                check_type(p)?;
                Ok(p.clone())
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(NetworkList { name: name.to_string(), cni_version, plugins })
    }

    /// From a single-plugin `.conf` document (libcni's `ConfListFromConf`).
    pub fn from_conf(doc: &Value) -> Result<NetworkList, String> {
        let obj = doc.as_object().ok_or("a network config must be a JSON object")?;
        let name = obj.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or("no 'name' in the network config")?;
        check_type(obj)?;
        let cni_version = obj.get("cniVersion").and_then(Value::as_str).unwrap_or("0.4.0").to_string();
        let mut plugin = obj.clone();
        plugin.remove("name");
        plugin.remove("cniVersion");
        Ok(NetworkList { name: name.to_string(), cni_version, plugins: vec![plugin] })
    }
}

/// A plugin's `type` must name a binary: one plain file name.
fn check_type(plugin: &Map<String, Value>) -> Result<(), String> {
    match plugin.get("type").and_then(Value::as_str) {
        Some(t) if !t.is_empty() && !t.contains('/') && t != "." && t != ".." => Ok(()),
        Some(t) => Err(format!("plugin type {t:?} is not a file name")),
        None => Err("a plugin has no 'type'".into()),
    }
}

/// Largest config file read from `cni_config_dir`, and largest plugin output read.
const MAX_DOC: u64 = 1 << 20;

/// The list named `name` among `dir`'s `*.conf`, `*.conflist` and `*.json`, in file name order
/// (Nomad's `loadCNIConf`); unreadable or malformed files are skipped, as libcni's loader does.
pub fn load_named(dir: &Path, name: &str) -> Result<NetworkList, String> {
    let files = config_files(dir);
    if files.is_empty() {
        return Err(format!("no CNI network config found in {}", dir.display()));
    }
    for file in files {
        let Ok(doc) = read_doc(&file) else { continue };
        let list =
            if file.extension().is_some_and(|e| e == "conflist") { NetworkList::from_conflist(&doc) } else { NetworkList::from_conf(&doc) };
        if let Ok(list) = list
            && list.name == name
        {
            return Ok(list);
        }
    }
    Err(format!("CNI network config not found for name {name:?}"))
}

/// Every network name in `dir` (the `cni/<name>` fingerprint).
pub fn network_names(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for file in config_files(dir) {
        let Ok(doc) = read_doc(&file) else { continue };
        let list =
            if file.extension().is_some_and(|e| e == "conflist") { NetworkList::from_conflist(&doc) } else { NetworkList::from_conf(&doc) };
        if let Ok(list) = list
            && !names.contains(&list.name)
        {
            names.push(list.name);
        }
    }
    names
}

fn config_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "conf" || e == "conflist" || e == "json"))
        .collect();
    files.sort();
    files
}

fn read_doc(path: &Path) -> Result<Value, String> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_DOC + 1).read_to_end(&mut text))
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_DOC {
        return Err(format!("{} is larger than {MAX_DOC} bytes", path.display()));
    }
    serde_json::from_slice(&text).map_err(|e| format!("parse {}: {e}", path.display()))
}

/// What every plugin of one invocation gets in its environment.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// `CNI_CONTAINERID`: the alloc ID.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_PATH`, searched for the plugin binaries.
    pub path: Vec<PathBuf>,
    /// `runtimeConfig.portMappings`, given to plugins that declare the capability.
    pub port_mappings: Vec<PortMapping>,
}

/// How long one plugin may run.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs plugin binaries; a trait so the list logic is tested without root.
pub trait PluginExec: Send + Sync {
    /// Runs `plugin` for `command` with `stdin`; the parsed stdout on success, libcni's error
    /// text otherwise.
    fn exec(&self, command: &str, plugin: &str, inv: &Invocation, stdin: &[u8]) -> Result<Value, String>;
}

/// Executes the real binaries.
pub struct RealExec;

impl PluginExec for RealExec {
    fn exec(&self, command: &str, plugin: &str, inv: &Invocation, stdin: &[u8]) -> Result<Value, String> {
        let binary = find_plugin(plugin, &inv.path)?;
        let mut child = Command::new(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &inv.container_id)
            .env("CNI_NETNS", &inv.netns)
            .env("CNI_IFNAME", &inv.ifname)
            .env("CNI_PATH", std::env::join_paths(&inv.path).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run {}: {e}", binary.display()))?;
        if let Some(mut input) = child.stdin.take() {
            // A plugin that exits before reading it all reports why on stdout.
            let _ = input.write_all(stdin);
        }
        let bounded = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(r) = r {
                    let _ = r.take(MAX_DOC).read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = bounded(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
        let err = bounded(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
        let deadline = Instant::now() + PLUGIN_TIMEOUT;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("plugin {plugin} did not finish within {}s", PLUGIN_TIMEOUT.as_secs()));
                }
                Err(e) => return Err(format!("wait for plugin {plugin}: {e}")),
            }
        };
        let stdout = out.join().unwrap_or_default();
        let stderr = err.join().unwrap_or_default();
        if status.success() {
            if stdout.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&stdout).map_err(|e| format!("plugin {plugin} printed a result that is not JSON: {e}"));
        }
        // The plugin's error object: `msg; details` (libcni's types.Error).
        if let Ok(Value::Object(e)) = serde_json::from_slice::<Value>(&stdout) {
            let msg = e.get("msg").and_then(Value::as_str).unwrap_or_default();
            let details = e.get("details").and_then(Value::as_str).unwrap_or_default();
            return Err(if details.is_empty() { msg.to_string() } else { format!("{msg}; {details}") });
        }
        let text = String::from_utf8_lossy(if stdout.is_empty() { &stderr } else { &stdout }).trim().to_string();
        Err(if text.is_empty() { format!("plugin {plugin} exited with {status}") } else { text })
    }
}

/// The plugin binary in the first `path` directory holding it; libcni's error otherwise.
pub fn find_plugin(plugin: &str, path: &[PathBuf]) -> Result<PathBuf, String> {
    path.iter().map(|d| d.join(plugin)).find(|p| p.is_file()).ok_or_else(|| {
        let dirs: Vec<String> = path.iter().map(|d| d.display().to_string()).collect();
        format!("failed to find plugin {plugin:?} in path [{}]", dirs.join(" "))
    })
}

/// The config one plugin gets on stdin: its own object plus the list's `name` and `cniVersion`,
/// the runtime config for the capabilities it declares, and the previous result. The
/// `capabilities` key itself is dropped (SPEC.md, "Deriving execution configuration").
pub fn plugin_stdin(list: &NetworkList, plugin: &Map<String, Value>, inv: &Invocation, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    let caps = conf.remove("capabilities");
    conf.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
    conf.insert("name".into(), Value::String(list.name.clone()));
    let wants_ports = caps.as_ref().and_then(|c| c.get("portMappings")).and_then(Value::as_bool).unwrap_or(false);
    if wants_ports && !inv.port_mappings.is_empty() {
        conf.insert("runtimeConfig".into(), json!({"portMappings": inv.port_mappings}));
    }
    if let Some(prev) = prev.filter(|p| !p.is_null()) {
        conf.insert("prevResult".into(), prev.clone());
    }
    Value::Object(conf)
}

/// ADD: every plugin in order; the final result. The error names the failing plugin as libcni
/// does: `plugin type="bridge" failed (add): ...`.
pub fn add(exec: &dyn PluginExec, list: &NetworkList, inv: &Invocation) -> Result<Value, String> {
    let mut prev: Option<Value> = None;
    for plugin in &list.plugins {
        let ty = plugin.get("type").and_then(Value::as_str).unwrap_or_default();
        let stdin = serde_json::to_vec(&plugin_stdin(list, plugin, inv, prev.as_ref())).unwrap_or_default();
        let result = exec.exec("ADD", ty, inv, &stdin).map_err(|e| format!("plugin type={ty:?} failed (add): {e}"))?;
        prev = Some(result);
    }
    Ok(prev.unwrap_or(Value::Null))
}

/// DEL: every plugin in reverse, each with the cached result; every plugin runs, the first
/// error is returned.
pub fn del(exec: &dyn PluginExec, list: &NetworkList, inv: &Invocation, cached: Option<&Value>) -> Result<(), String> {
    let mut first = None;
    for plugin in list.plugins.iter().rev() {
        let ty = plugin.get("type").and_then(Value::as_str).unwrap_or_default();
        let stdin = serde_json::to_vec(&plugin_stdin(list, plugin, inv, cached)).unwrap_or_default();
        if let Err(e) = exec.exec("DEL", ty, inv, &stdin) {
            first.get_or_insert(format!("plugin type={ty:?} failed (delete): {e}"));
        }
    }
    first.map_or(Ok(()), Err)
}

/// What Nomad reports of a configured network (`AllocNetworkStatus`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AllocNetworkStatus {
    /// The interface chosen.
    pub interface_name: String,
    /// Its address, without the prefix length.
    pub address: String,
    /// The DNS the result carried.
    #[serde(rename = "DNS")]
    pub dns: Option<DnsConfig>,
}

/// The interface and address Nomad reports from a result (`cniToAllocNet`): interfaces sorted
/// by name; the first inside the sandbox with an address wins, else the first with any.
pub fn status_from_result(result: &Value) -> Result<AllocNetworkStatus, String> {
    let interfaces = result.get("interfaces").and_then(Value::as_array).cloned().unwrap_or_default();
    if interfaces.is_empty() {
        return Err("no interfaces found".into());
    }
    let ips = result.get("ips").and_then(Value::as_array).cloned().unwrap_or_default();
    // (name, in the sandbox, first address)
    let mut named: Vec<(String, bool, Option<String>)> = interfaces
        .iter()
        .enumerate()
        .map(|(idx, iface)| {
            let name = iface.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            let sandbox = iface.get("sandbox").and_then(Value::as_str).is_some_and(|s| !s.is_empty());
            let addr = ips
                .iter()
                .filter(|ip| ip.get("interface").and_then(Value::as_u64) == Some(idx as u64))
                .find_map(|ip| ip.get("address").and_then(Value::as_str))
                .map(|a| a.split('/').next().unwrap_or(a).to_string());
            (name, sandbox, addr)
        })
        .collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let chosen = named.iter().find(|(_, sandbox, addr)| *sandbox && addr.is_some()).or_else(|| named.iter().find(|(_, _, a)| a.is_some()));
    let Some((name, _, Some(address))) = chosen else {
        return Err("no interface with an address".into());
    };
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default()
    };
    let dns = result.get("dns").map(|d| DnsConfig {
        servers: strings(d.get("nameservers")),
        searches: strings(d.get("search")),
        options: strings(d.get("options")),
    });
    Ok(AllocNetworkStatus { interface_name: name.clone(), address: address.clone(), dns })
}
