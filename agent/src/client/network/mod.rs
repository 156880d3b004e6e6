//! Group network namespaces: `network { mode = "bridge" | "none" | "cni/<name>" }`.
//!
//! Behind [`NetworkManager`]: the alloc runner's `network` hook creates the alloc's namespace
//! (`/var/run/netns/<alloc ID>`, Nomad's default network manager) and configures it by running
//! the real CNI plugins ([`cni`]): for bridge mode the list Nomad builds (loopback, bridge with
//! host-local IPAM, firewall with the `NOMAD-ADMIN` chain, portmap with the alloc's ports); for
//! `cni/<name>` the list of that name from `cni_config_dir`; for `none` nothing (an empty
//! namespace). Tasks join the namespace by its path (the executor enters it before exec).
//!
//! A group with a task of a driver that can only join a namespace it made itself (docker: a
//! container joins another container's) gets its namespace from that driver ([`NetnsMaker`]:
//! the docker driver's infra container); the manager mounts it at the same path, so CNI and the
//! group's other tasks use it as any other, and it lives on while mounted there.
//!
//! The final ADD result is cached under the client state dir with the list and runtime config
//! it came from: the restarted agent finds it and runs no second ADD, and DEL gets it as
//! `prevResult` even if the config on disk changed since. Setup and teardown of every alloc
//! are serialised by one process-wide lock, as Nomad's are.

pub mod cni;
pub mod fingerprint;
pub mod netns;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nomad_proto::Allocation;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use cni::AllocNetworkStatus;
use cni::{Invocation, NetworkList, PluginExec, RealExec};

use crate::config::CniSettings;

/// Where Nomad (and `ip netns`) keep named network namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";
/// The interface CNI makes in the namespace (go-cni's prefix `eth` and the network index 0).
pub const IFNAME: &str = "eth0";
/// Nomad's ADD attempts.
const ADD_TRIES: usize = 3;

/// Serialises every setup and teardown in the process (Nomad's `networking.go`).
static LOCK: Mutex<()> = Mutex::new(());

/// A group network's isolation, as Nomad's drivers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode<'a> {
    /// `host` or unset: no namespace.
    Host,
    /// `bridge`.
    Bridge,
    /// `none`: a namespace with nothing configured in it.
    None,
    /// `cni/<name>`.
    Cni(&'a str),
}

impl<'a> Mode<'a> {
    /// From the group network's `mode`; `Err` for one no driver can run.
    pub fn parse(mode: &'a str) -> Result<Mode<'a>, String> {
        match mode {
            "" | "host" => Ok(Mode::Host),
            "bridge" => Ok(Mode::Bridge),
            "none" => Ok(Mode::None),
            m => match m.strip_prefix("cni/") {
                Some(name) if !name.is_empty() => Ok(Mode::Cni(name)),
                _ => Err(format!("network mode {m:?} is not supported")),
            },
        }
    }

    /// The mode of the alloc's group network (its first network, as Nomad reads it).
    pub fn of_alloc(alloc: &'a Allocation) -> Result<Mode<'a>, String> {
        let group = alloc.job.as_ref().and_then(|j| j.lookup_task_group(&alloc.task_group));
        match group.and_then(|g| g.networks.first()) {
            Some(n) => Mode::parse(&n.mode),
            None => Ok(Mode::Host),
        }
    }
}

/// The alloc's network namespace, for the `network` alloc hook.
pub trait NetworkManager: Send + Sync {
    /// Where the alloc's namespace is (whether or not it exists).
    fn netns_path(&self, alloc_id: &str) -> PathBuf;
    /// Creates the namespace; `false` when it exists already (an agent restart).
    fn create(&self, alloc: &Allocation) -> Result<bool, String>;
    /// What an earlier setup of the alloc reported (kept across agent restarts), if it ran.
    fn restored(&self, alloc_id: &str) -> Option<AllocNetworkStatus>;
    /// Configures the namespace (CNI ADD); the status to report.
    fn setup(&self, alloc: &Allocation, mode: Mode<'_>) -> Result<Option<AllocNetworkStatus>, String>;
    /// Undoes the configuration (CNI DEL); nothing to undo is not an error.
    fn teardown(&self, alloc_id: &str) -> Result<(), String>;
    /// Removes the namespace (and what its maker made for it).
    fn destroy(&self, alloc: &Allocation) -> Result<(), String>;
}

/// Makes the namespace of an alloc whose group has a task of a driver that must own it (Nomad's
/// `MustInitiateNetwork` drivers: docker, whose containers can only join another container's
/// namespace). Called from blocking code (the `network` hook).
pub trait NetnsMaker: Send + Sync {
    /// Whether the alloc's namespace is made here (its group has a task of this driver).
    fn makes(&self, alloc: &Allocation) -> bool;
    /// Makes the alloc's namespace, or finds the one made before an agent restart: the path of
    /// its nsfs file, and whether it is new.
    fn create(&self, alloc: &Allocation) -> Result<(PathBuf, bool), String>;
    /// Removes what `create` made; nothing there is not an error.
    fn destroy(&self, alloc_id: &str) -> Result<(), String>;
}

/// What is kept of a successful ADD: all DEL needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    list: Value,
    netns: PathBuf,
    ifname: String,
    port_mappings: Vec<cni::PortMapping>,
    result: Value,
    status: AllocNetworkStatus,
}

/// The manager that runs the CNI plugins.
pub struct CniNetworks {
    settings: CniSettings,
    netns_dir: PathBuf,
    cache_dir: PathBuf,
    exec: Arc<dyn PluginExec>,
    /// Between ADD attempts (Nomad: a random 1-2 s).
    retry_wait: fn() -> Duration,
    /// Makes the namespaces of groups with a docker task.
    maker: Option<Arc<dyn NetnsMaker>>,
}

fn random_retry_wait() -> Duration {
    Duration::from_millis(1000 + rand::random::<u64>() % 1000)
}

impl CniNetworks {
    /// The manager of a client whose state dir is `state_dir`.
    pub fn new(settings: CniSettings, state_dir: &Path) -> CniNetworks {
        CniNetworks {
            settings,
            netns_dir: PathBuf::from(NETNS_DIR),
            cache_dir: state_dir.join("cni").join("results"),
            exec: Arc::new(RealExec),
            retry_wait: random_retry_wait,
            maker: None,
        }
    }

    /// Namespaces of allocs `maker` makes come from it.
    pub fn with_maker(mut self, maker: Arc<dyn NetnsMaker>) -> CniNetworks {
        self.maker = Some(maker);
        self
    }

    fn maker_of(&self, alloc: &Allocation) -> Option<&Arc<dyn NetnsMaker>> {
        self.maker.as_ref().filter(|m| m.makes(alloc))
    }

    /// The namespace `maker` made, mounted at the alloc's path. `false` when it is mounted there
    /// already; a different one mounted there (its maker had to make it again: the Engine
    /// restarted the infra container) is torn down and replaced.
    fn bind_made(&self, maker: &dyn NetnsMaker, alloc: &Allocation) -> Result<bool, String> {
        // Outside the lock: it may wait for an image.
        let (source, new) = maker.create(alloc)?;
        let path = self.netns_path(&alloc.id);
        let _serial = lock();
        if netns::is_netns(&path) {
            if !new && netns::same(&path, &source) {
                return Ok(false);
            }
            tracing::warn!(alloc_id = %alloc.id, "the alloc's namespace is not its infra container's any more: configuring the new one");
            if let Err(e) = self.teardown_locked(&alloc.id) {
                tracing::error!(alloc_id = %alloc.id, error = %e, "failed to cleanup network for allocation, resources may have leaked");
            }
            netns::remove(&path)?;
        }
        netns::bind(&source, &path)?;
        Ok(true)
    }

    fn cache_path(&self, alloc_id: &str) -> PathBuf {
        // libcni's cache key: network name, container ID, interface.
        self.cache_dir.join(format!("{alloc_id}-{IFNAME}.json"))
    }

    fn cached(&self, alloc_id: &str) -> Option<Cached> {
        let text = std::fs::read(self.cache_path(alloc_id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn store(&self, alloc_id: &str, cached: &Cached) -> Result<(), String> {
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| format!("create {}: {e}", self.cache_dir.display()))?;
        let path = self.cache_path(alloc_id);
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec(cached).map_err(|e| format!("encode the CNI result: {e}"))?;
        std::fs::write(&tmp, json).and_then(|_| std::fs::rename(&tmp, &path)).map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// The list for `mode`: Nomad's bridge list, or `cni/<name>` from `cni_config_dir`.
    fn list(&self, mode: Mode<'_>) -> Result<Option<NetworkList>, String> {
        let s = &self.settings;
        match mode {
            Mode::Host | Mode::None => Ok(None),
            Mode::Bridge => NetworkList::from_conflist(&cni::bridge_conflist(&s.bridge_name, &s.bridge_subnet, s.hairpin_mode)).map(Some),
            Mode::Cni(name) => cni::load_named(&s.config_dir, name).map(Some),
        }
    }

    fn invocation(&self, alloc_id: &str, port_mappings: Vec<cni::PortMapping>) -> Invocation {
        Invocation {
            container_id: alloc_id.to_string(),
            netns: self.netns_path(alloc_id),
            ifname: IFNAME.to_string(),
            path: self.settings.path.clone(),
            port_mappings,
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A list as JSON again, for the cache.
fn list_json(list: &NetworkList) -> Value {
    serde_json::json!({"cniVersion": list.cni_version, "name": list.name, "plugins": list.plugins})
}

impl NetworkManager for CniNetworks {
    fn netns_path(&self, alloc_id: &str) -> PathBuf {
        self.netns_dir.join(alloc_id)
    }

    fn create(&self, alloc: &Allocation) -> Result<bool, String> {
        if let Some(maker) = self.maker_of(alloc) {
            return self.bind_made(maker.as_ref(), alloc);
        }
        let _serial = lock();
        netns::create(&self.netns_path(&alloc.id))
    }

    fn restored(&self, alloc_id: &str) -> Option<AllocNetworkStatus> {
        self.cached(alloc_id).map(|c| c.status)
    }

    fn setup(&self, alloc: &Allocation, mode: Mode<'_>) -> Result<Option<AllocNetworkStatus>, String> {
        let Some(list) = self.list(mode)? else { return Ok(None) };
        let _serial = lock();
        if mode == Mode::Bridge {
            ensure_admin_rule(&self.settings.bridge_name, &self.settings.bridge_subnet)
                .map_err(|e| format!("failed to initialize table forwarding rules: {e}"))?;
        }
        let inv = self.invocation(&alloc.id, cni::port_mappings(alloc));
        let mut first_error = None;
        for attempt in 0..ADD_TRIES {
            if attempt > 0 {
                std::thread::sleep((self.retry_wait)());
            }
            match cni::add(self.exec.as_ref(), &list, &inv) {
                Ok(result) => {
                    let status = cni::status_from_result(&result)?;
                    let cached = Cached {
                        list: list_json(&list),
                        netns: inv.netns.clone(),
                        ifname: inv.ifname.clone(),
                        port_mappings: inv.port_mappings.clone(),
                        result,
                        status: status.clone(),
                    };
                    self.store(&alloc.id, &cached)?;
                    tracing::info!(alloc_id = %alloc.id, network = %list.name, address = %status.address, "configured the alloc's network namespace");
                    return Ok(Some(status));
                }
                Err(e) => {
                    tracing::warn!(alloc_id = %alloc.id, attempt = attempt + 1, error = %e, "CNI ADD failed");
                    // What the plugins that succeeded made is undone before the next try.
                    let _ = cni::del(self.exec.as_ref(), &list, &inv, None);
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(format!("failed to configure network: {}", first_error.unwrap_or_default()))
    }

    fn teardown(&self, alloc_id: &str) -> Result<(), String> {
        let _serial = lock();
        self.teardown_locked(alloc_id)
    }

    fn destroy(&self, alloc: &Allocation) -> Result<(), String> {
        let unmounted = {
            let _serial = lock();
            netns::remove(&self.netns_path(&alloc.id))
        };
        let made = self.maker_of(alloc).map_or(Ok(()), |m| m.destroy(&alloc.id));
        unmounted.and(made)
    }
}

impl CniNetworks {
    /// CNI DEL with the cached result, under the caller's hold of the lock.
    fn teardown_locked(&self, alloc_id: &str) -> Result<(), String> {
        let Some(cached) = self.cached(alloc_id) else { return Ok(()) };
        let list = NetworkList::from_conflist(&cached.list)?;
        let inv = Invocation {
            container_id: alloc_id.to_string(),
            netns: cached.netns.clone(),
            ifname: cached.ifname.clone(),
            path: self.settings.path.clone(),
            port_mappings: cached.port_mappings.clone(),
        };
        cni::del(self.exec.as_ref(), &list, &inv, Some(&cached.result))?;
        let path = self.cache_path(alloc_id);
        std::fs::remove_file(&path).map_err(|e| format!("remove {}: {e}", path.display()))
    }
}

/// `NOMAD-ADMIN` in the filter table holds `-o <bridge> -d <subnet> -j ACCEPT` (the firewall
/// plugin jumps to it from `FORWARD`), made once and kept, as Nomad does.
fn ensure_admin_rule(bridge: &str, subnet: &str) -> Result<(), String> {
    let iptables = |args: &[&str]| std::process::Command::new("iptables").args(["-w", "-t", "filter"]).args(args).output();
    let run = |args: &[&str]| -> Result<bool, String> {
        let out = iptables(args).map_err(|e| format!("run iptables: {e}"))?;
        if !out.status.success() && !args.contains(&"-C") && !args.contains(&"-S") {
            return Err(format!("iptables {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(out.status.success())
    };
    if !run(&["-S", "NOMAD-ADMIN"])? {
        run(&["-N", "NOMAD-ADMIN"])?;
    }
    let rule = ["NOMAD-ADMIN", "-o", bridge, "-d", subnet, "-j", "ACCEPT"];
    let mut check = vec!["-C"];
    check.extend(rule);
    if !run(&check)? {
        let mut append = vec!["-A"];
        append.extend(rule);
        run(&append)?;
    }
    Ok(())
}

/// `a.b.c.d/n` with `n <= 32`.
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    Some((ip.parse().ok()?, len))
}

#[cfg(test)]
mod tests;
