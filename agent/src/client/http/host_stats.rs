//! `GET /v1/client/stats`: the host's usage in Nomad's `HostStats` shape: memory from
//! `/proc/meminfo`, per-core CPU percentages (between two requests, as Nomad's collector
//! computes them between two samples) from `/proc/stat`, the disks of the mounted real file
//! systems and of the alloc dir (`statvfs`), uptime, and `CPUTicksConsumed` (the busy share of
//! every core times one core's MHz).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use nomad_proto::Timestamp;
use nomad_server::http::util::{HttpError, QueryOptions, json_response, require_method};
use serde_json::{Value, json};

use super::ClientHttp;

/// Most mounts reported (a host can have thousands).
const MAX_DISKS: usize = 256;
/// File systems that hold no disk.
const PSEUDO_FS: &[&str] = &[
    "proc",
    "sysfs",
    "devtmpfs",
    "devpts",
    "tmpfs",
    "cgroup",
    "cgroup2",
    "securityfs",
    "pstore",
    "bpf",
    "debugfs",
    "tracefs",
    "configfs",
    "fusectl",
    "mqueue",
    "hugetlbfs",
    "autofs",
    "binfmt_misc",
    "nsfs",
    "rpc_pipefs",
    "overlay",
    "squashfs",
    "efivarfs",
    "ramfs",
    "shm",
    "fuse.lxcfs",
];

/// One core's jiffies: (busy user, busy system, idle, total).
type CoreTimes = (u64, u64, u64, u64);

static PREVIOUS: Mutex<Option<HashMap<String, CoreTimes>>> = Mutex::new(None);

/// `cpuN` lines of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Vec<(String, CoreTimes)> {
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let v: Vec<u64> = it.filter_map(|x| x.parse().ok()).collect();
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            // user nice system idle iowait irq softirq steal (guest counted in user already)
            let user = get(0) + get(1);
            let system = get(2) + get(5) + get(6);
            let idle = get(3) + get(4);
            let total = user + system + idle + get(7);
            Some((name, (user, system, idle, total)))
        })
        .collect()
}

/// Percentages of a core between two samples: (user, system, idle, total busy).
pub fn core_percents(before: Option<CoreTimes>, now: CoreTimes) -> (f64, f64, f64, f64) {
    let Some(b) = before else { return (0.0, 0.0, 100.0, 0.0) };
    let total = now.3.saturating_sub(b.3) as f64;
    if total <= 0.0 {
        return (0.0, 0.0, 100.0, 0.0);
    }
    let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / total * 100.0;
    let (user, system, idle) = (pct(now.0, b.0), pct(now.1, b.1), pct(now.2, b.2));
    (user, system, idle, (100.0 - idle).clamp(0.0, 100.0))
}

/// `Key: N kB` lines of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n: u64 = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), n.saturating_mul(1024)))
        })
        .collect()
}

/// What `statvfs` says of the file system under a path, in Nomad's terms (gopsutil's: the
/// used share counts the blocks only root may use as neither used nor available).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskUsage {
    /// Bytes.
    pub size: u64,
    /// Bytes in use.
    pub used: u64,
    /// Bytes an unprivileged writer can still use.
    pub available: u64,
    /// `used / (used + available)`, percent.
    pub used_percent: f64,
    /// Inodes in use, percent.
    pub inodes_used_percent: f64,
}

/// The usage of the file system `path` is on.
pub fn disk_usage(path: &Path) -> Result<DiskUsage, String> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| format!("statvfs {}: {e}", path.display()))?;
    let frsize = s.fragment_size() as u64;
    let size = (s.blocks() as u64).saturating_mul(frsize);
    let free = (s.blocks_free() as u64).saturating_mul(frsize);
    let available = (s.blocks_available() as u64).saturating_mul(frsize);
    let used = size.saturating_sub(free);
    let used_percent = if used + available > 0 { used as f64 / (used + available) as f64 * 100.0 } else { 0.0 };
    let inodes = s.files() as u64;
    let inodes_used_percent = if inodes > 0 { (inodes - (s.files_free() as u64).min(inodes)) as f64 / inodes as f64 * 100.0 } else { 0.0 };
    Ok(DiskUsage { size, used, available, used_percent, inodes_used_percent })
}

fn disk(device: &str, mountpoint: &Path) -> Option<Value> {
    let u = disk_usage(mountpoint).ok()?;
    Some(json!({
        "Device": device, "Mountpoint": mountpoint.display().to_string(), "Size": u.size, "Used": u.used, "Available": u.available,
        "UsedPercent": u.used_percent, "InodesUsedPercent": u.inodes_used_percent,
    }))
}

/// The mount a path is on: the longest mount point that prefixes it.
fn mount_of<'a>(mounts: &'a [(String, String, String)], path: &Path) -> Option<&'a (String, String, String)> {
    mounts.iter().filter(|(_, mp, _)| path.starts_with(mp)).max_by_key(|(_, mp, _)| mp.len())
}

fn read_mounts() -> Vec<(String, String, String)> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.replace("\\040", " "), it.next()?.to_string()))
        })
        .collect()
}

/// The host's stats; `alloc_root` is the client's alloc dir, `mhz` one core's clock.
pub fn host_stats(alloc_root: &Path, mhz: f64) -> Value {
    let mem = parse_meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default());
    let get = |k: &str| mem.get(k).copied().unwrap_or(0);
    let total = get("MemTotal");
    let available = get("MemAvailable");
    let free = get("MemFree");
    let cores = parse_proc_stat(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
    let mut cpu = Vec::new();
    let mut ticks = 0.0;
    {
        let mut previous = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
        let previous = previous.get_or_insert_with(HashMap::new);
        for (name, times) in cores {
            let (user, system, idle, busy) = core_percents(previous.get(&name).copied(), times);
            previous.insert(name.clone(), times);
            let core_ticks = busy / 100.0 * mhz;
            ticks += core_ticks;
            cpu.push(json!({ "CPU": name, "User": user, "System": system, "Idle": idle, "TotalPercent": busy, "TotalTicks": core_ticks }));
        }
    }
    let mounts = read_mounts();
    let mut seen = std::collections::HashSet::new();
    let disks: Vec<Value> = mounts
        .iter()
        .filter(|(dev, _, fs)| !PSEUDO_FS.contains(&fs.as_str()) && dev.starts_with('/') && seen.insert(dev.clone()))
        .take(MAX_DISKS)
        .filter_map(|(dev, mp, _)| disk(dev, Path::new(mp)))
        .collect();
    let alloc_dev = mount_of(&mounts, alloc_root).map_or_else(|| alloc_root.display().to_string(), |m| m.0.clone());
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|u| u.parse::<f64>().ok()))
        .unwrap_or(0.0) as u64;
    json!({
        "Memory": { "Total": total, "Available": available, "Used": total.saturating_sub(available), "Free": free },
        "CPU": cpu,
        "DiskStats": disks,
        "AllocDirStats": disk(&alloc_dev, alloc_root),
        "DeviceStats": [],
        "Uptime": uptime,
        "Timestamp": Timestamp::now().unix_nanos(),
        "CPUTicksConsumed": ticks,
    })
}

pub(super) async fn handle(State(state): State<ClientHttp>, req: Request<Body>) -> Response {
    serve(state, req).await.unwrap_or_else(IntoResponse::into_response)
}

async fn serve(state: ClientHttp, req: Request<Body>) -> Result<Response, HttpError> {
    require_method(req.method(), &[Method::GET])?;
    let q = QueryOptions::parse(req.uri())?;
    let client = super::local_node_client(&state, q.params.get("node_id").map(String::as_str))?;
    let mhz = super::core_mhz(&client);
    let root = client.alloc_root();
    let stats = tokio::task::spawn_blocking(move || host_stats(&root, mhz)).await.unwrap_or(Value::Null);
    json_response(&stats, None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_read_from_proc_stat_and_rated_between_samples() {
        let text = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 4 1 5 40 0 0 0 0 0 0\ncpu1 5 0 5 40 0 0 0 0\nintr 1 2\n";
        let cores = parse_proc_stat(text);
        assert_eq!(cores, vec![("cpu0".to_string(), (5, 5, 40, 50)), ("cpu1".to_string(), (5, 5, 40, 50))]);
        let later = (15, 10, 75, 100);
        let (user, system, idle, busy) = core_percents(Some(cores[0].1), later);
        assert_eq!((user, system, idle, busy), (20.0, 10.0, 70.0, 30.0));
        assert_eq!(core_percents(None, later), (0.0, 0.0, 100.0, 0.0));
    }

    #[test]
    fn the_host_is_measured_in_nomads_shape() {
        let dir = tempfile::tempdir().unwrap();
        let v = host_stats(dir.path(), 2000.0);
        assert!(v["Memory"]["Total"].as_u64().unwrap() > 0);
        assert!(v["Memory"]["Used"].as_u64().unwrap() <= v["Memory"]["Total"].as_u64().unwrap());
        assert!(!v["CPU"].as_array().unwrap().is_empty());
        assert!(v["Uptime"].as_u64().unwrap() > 0);
        assert!(v["AllocDirStats"]["Size"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["AllocDirStats"]["Mountpoint"], dir.path().display().to_string());
    }
}
