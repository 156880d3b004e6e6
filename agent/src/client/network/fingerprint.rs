//! The node's group-network fingerprints, as Nomad's `bridge_linux.go`, `cni.go` and
//! `plugins_cni.go`: the bridge mode when the kernel has the bridge module (with the attribute
//! `nomad.bridge.hairpin_mode`), one `cni/<name>` network per config in `cni_config_dir`, and
//! `plugins.cni.version.<file>` for each plugin binary in `cni_path`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nomad_proto::resources::NodeNetworkResource;
use nomad_proto::{NetworkResource, Node};

use super::cni;
use crate::config::CniSettings;

/// How long one plugin may take to print its version.
const VERSION_TIMEOUT: Duration = Duration::from_secs(3);

/// Does the kernel have the bridge module, loaded or built in? Nomad looks in `/sys/module`,
/// `/proc/modules`, `modules.builtin` and `modules.dep`.
pub fn bridge_module(root: &Path, kernel_release: &str) -> bool {
    if root.join("sys/module/bridge").is_dir() {
        return true;
    }
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    if lines(&root.join("proc/modules")).lines().any(|l| l.split_whitespace().next() == Some("bridge")) {
        return true;
    }
    let modules = root.join("lib/modules").join(kernel_release);
    let names_bridge = |l: &str| {
        let path = l.split(':').next().unwrap_or_default();
        let file = path.rsplit('/').next().unwrap_or_default();
        file == "bridge.ko" || file.starts_with("bridge.ko.")
    };
    lines(&modules.join("modules.builtin")).lines().any(names_bridge) || lines(&modules.join("modules.dep")).lines().any(names_bridge)
}

/// The first semver token of a plugin's output (`CNI protocol versions supported: ..., 1.0.0`
/// gives `1.0.0` on Debian's plugins, whose own version is unknown).
pub fn version_token(output: &str) -> Option<&str> {
    output.split_whitespace().find(|t| {
        let core = t.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

fn plugin_version(path: &Path) -> Option<String> {
    // Nomad reads the combined output: the reference plugins print their version on stderr.
    let mut child = Command::new(path).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().ok()?;
    let deadline = Instant::now() + VERSION_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.take(64 * 1024).read_to_string(&mut out).ok()?;
    child.stderr.take()?.take(64 * 1024).read_to_string(&mut out).ok()?;
    version_token(&out).map(str::to_string)
}

/// Adds the fingerprints to the node.
pub fn apply(node: &mut Node, s: &CniSettings, bridge_found: bool) {
    let resources = node.node_resources.get_or_insert_with(Default::default);
    if bridge_found {
        resources.networks.push(NetworkResource { mode: "bridge".into(), ..NetworkResource::default() });
        resources.node_networks.push(NodeNetworkResource {
            mode: "bridge".into(),
            device: s.bridge_name.clone(),
            ..NodeNetworkResource::default()
        });
        node.attributes.insert("nomad.bridge.hairpin_mode".into(), s.hairpin_mode.to_string());
    } else {
        tracing::warn!("failed to detect bridge kernel module, bridge network mode disabled");
    }
    for name in cni::network_names(&s.config_dir) {
        resources.networks.push(NetworkResource { mode: format!("cni/{name}"), ..NetworkResource::default() });
    }
    for dir in &s.path {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            use std::os::unix::fs::PermissionsExt;
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let key = format!("plugins.cni.version.{name}");
            if node.attributes.contains_key(&key) {
                continue; // the first directory holding it is the one run
            }
            if let Some(v) = plugin_version(&entry.path()) {
                node.attributes.insert(key, v);
            }
        }
    }
}

/// The host's kernel release (`uname -r`).
pub fn kernel_release() -> String {
    nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default()
}
