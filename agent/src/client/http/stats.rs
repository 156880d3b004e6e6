//! `GET /v1/client/allocation/<alloc_id>/stats`: resource usage in Nomad's shape, per running
//! task and summed over the alloc.
//!
//! What is reported is measured over everything the task runs, not its main process alone: a
//! task with a cgroup (exec, oci) is read from that cgroup (v1 or v2: CPU time split into user
//! and system, throttling, memory usage with its RSS, cache, swap and peak); a raw_exec task,
//! which has none, is the sum over its process tree from `/proc`. CPU `Percent` (of one core)
//! is the usage between two requests for the same task, and `TotalTicks` that share of one
//! core's MHz, as Nomad computes them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use nomad_proto::Timestamp;
use nomad_server::http::util::{HttpError, json_response, require_method};
use serde_json::{Value, json};

use super::{ClientHttp, Target};
use crate::client::driver::{DriverState, TaskHandle};
use crate::executor::cgroups::CgroupVersion;
use crate::executor::process::process_tree;

/// Where cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A task's counters at one moment. CPU times in nanoseconds, memory in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reading {
    cpu_total: u64,
    cpu_user: u64,
    cpu_system: u64,
    throttled_periods: u64,
    throttled_time: u64,
    rss: u64,
    cache: u64,
    swap: u64,
    usage: u64,
    max_usage: u64,
    /// Read from a cgroup (else from the process tree).
    cgroup: Option<CgroupVersion>,
}

/// A task's cgroup: the directories holding its memory and CPU counters (the same one on v2).
#[derive(Debug, Clone, PartialEq, Eq)]
struct CgroupDirs {
    version: CgroupVersion,
    memory: PathBuf,
    cpu: PathBuf,
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `key value` lines (`memory.stat`, `cpu.stat`, `cpuacct.stat`).
fn read_keyed(path: &Path) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            Some((key.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as u64
}

/// Reads a cgroup's counters; `None` when it is gone (the task ended) or unreadable.
fn read_cgroup(dirs: &CgroupDirs) -> Option<Reading> {
    let mut r = Reading { cgroup: Some(dirs.version), ..Reading::default() };
    match dirs.version {
        CgroupVersion::V2 => {
            let cpu = read_keyed(&dirs.cpu.join("cpu.stat"));
            let usec = |key: &str| cpu.get(key).copied().unwrap_or(0).saturating_mul(1000);
            r.cpu_total = usec("usage_usec");
            r.cpu_user = usec("user_usec");
            r.cpu_system = usec("system_usec");
            r.throttled_periods = cpu.get("nr_throttled").copied().unwrap_or(0);
            r.throttled_time = usec("throttled_usec");
            r.usage = read_u64(&dirs.memory.join("memory.current"))?;
            let stat = read_keyed(&dirs.memory.join("memory.stat"));
            r.rss = stat.get("anon").copied().unwrap_or(0);
            r.cache = stat.get("file").copied().unwrap_or(0);
            r.swap = read_u64(&dirs.memory.join("memory.swap.current")).unwrap_or(0);
            // memory.peak exists from Linux 5.19.
            r.max_usage = read_u64(&dirs.memory.join("memory.peak")).unwrap_or(0);
        }
        CgroupVersion::V1 => {
            match read_u64(&dirs.cpu.join("cpuacct.usage")) {
                Some(total) => {
                    r.cpu_total = total;
                    let ticks = read_keyed(&dirs.cpu.join("cpuacct.stat"));
                    let to_ns = 1_000_000_000 / clock_ticks_per_second();
                    r.cpu_user = ticks.get("user").copied().unwrap_or(0).saturating_mul(to_ns);
                    r.cpu_system = ticks.get("system").copied().unwrap_or(0).saturating_mul(to_ns);
                }
                // cpuacct mounted on its own, where the task has no group: the CPU time of the
                // processes in its memory cgroup (with their reaped children's).
                None => {
                    let pids = std::fs::read_to_string(dirs.memory.join("cgroup.procs")).unwrap_or_default();
                    let pids: Vec<i32> = pids.lines().filter_map(|p| p.trim().parse().ok()).collect();
                    let cpu = sum_processes(&pids).unwrap_or_default();
                    (r.cpu_total, r.cpu_user, r.cpu_system) = (cpu.cpu_total, cpu.cpu_user, cpu.cpu_system);
                }
            }
            let throttling = read_keyed(&dirs.cpu.join("cpu.stat"));
            r.throttled_periods = throttling.get("nr_throttled").copied().unwrap_or(0);
            r.throttled_time = throttling.get("throttled_time").copied().unwrap_or(0);
            r.usage = read_u64(&dirs.memory.join("memory.usage_in_bytes"))?;
            r.max_usage = read_u64(&dirs.memory.join("memory.max_usage_in_bytes")).unwrap_or(0);
            let stat = read_keyed(&dirs.memory.join("memory.stat"));
            r.rss = stat.get("rss").copied().unwrap_or(0);
            r.cache = stat.get("cache").copied().unwrap_or(0);
            r.swap = stat.get("swap").copied().unwrap_or(0);
        }
    }
    Some(r)
}

/// The cgroup a process is in, from `/proc/<pid>/cgroup` (`0::/path` on v2; `N:memory:/path`
/// and `N:cpu,cpuacct:/path` on v1), under the hierarchies mounted at `root`.
fn cgroup_of(proc_cgroup: &str, root: &Path) -> Option<CgroupDirs> {
    let mut v1_memory = None;
    let mut v1_cpu = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let relative = path.trim_start_matches('/');
        if controllers.is_empty() {
            v2 = Some(root.join(relative));
        }
        for controller in controllers.split(',') {
            match controller {
                "memory" => v1_memory = Some(root.join(controllers).join(relative)),
                "cpuacct" => v1_cpu = Some(root.join(controllers).join(relative)),
                _ => {}
            }
        }
    }
    match (v1_memory, v1_cpu, v2) {
        (Some(memory), Some(cpu), _) => Some(CgroupDirs { version: CgroupVersion::V1, memory, cpu }),
        (None, None, Some(dir)) if root.join("cgroup.controllers").exists() => {
            Some(CgroupDirs { version: CgroupVersion::V2, memory: dir.clone(), cpu: dir })
        }
        _ => None,
    }
}

/// The cgroup of a task that has one of its own (exec, oci); raw_exec tasks share the agent's.
fn task_cgroup(handle: &TaskHandle) -> Option<CgroupDirs> {
    match &handle.driver_state {
        DriverState::RawExec => None,
        DriverState::Exec { cgroup } => match cgroup.version {
            CgroupVersion::V2 => {
                let dir = cgroup.dirs.first()?.clone();
                Some(CgroupDirs { version: CgroupVersion::V2, memory: dir.clone(), cpu: dir })
            }
            // Directories in the order of the controllers limited: memory, cpu, pids. cpuacct
            // is mounted with cpu (`cpu,cpuacct`, `cpu` a link to it) where it is not on its own.
            CgroupVersion::V1 => {
                let memory = cgroup.dirs.first()?.clone();
                let cpu = cgroup.dirs.get(1)?.clone();
                Some(CgroupDirs { version: CgroupVersion::V1, memory, cpu })
            }
        },
        // The runtime (or the Docker Engine) made the container's cgroup: where its init process
        // is, is where it is.
        DriverState::Oci { .. } | DriverState::Docker { .. } => {
            let proc_cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", handle.task.pid)).ok()?;
            cgroup_of(&proc_cgroup, Path::new(CGROUP_ROOT))
        }
    }
}

/// Sums RSS, swap and CPU time over a process and its descendants; `None` once it is gone.
fn read_process_tree(pid: i32) -> Option<Reading> {
    sum_processes(&process_tree(pid))
}

/// Sums RSS, swap and CPU time (each process's own plus its reaped children's, so a child that
/// ended is still counted once) over `pids`; `None` if none of them exists.
fn sum_processes(pids: &[i32]) -> Option<Reading> {
    let to_ns = 1_000_000_000 / clock_ticks_per_second();
    let mut r = Reading::default();
    let mut found = false;
    for &member in pids {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{member}/status")) else { continue };
        let kb = |key: &str| -> u64 {
            status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{member}/stat")) else { continue };
        let Some(after_name) = stat.rfind(')').map(|i| &stat[i + 2..]) else { continue };
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // utime, stime, cutime and cstime are fields 14 to 17; `fields` starts at field 3.
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        found = true;
        r.rss = r.rss.saturating_add(kb("VmRSS:").saturating_mul(1024));
        r.swap = r.swap.saturating_add(kb("VmSwap:").saturating_mul(1024));
        r.cpu_user = r.cpu_user.saturating_add(ticks(11).saturating_add(ticks(13)).saturating_mul(to_ns));
        r.cpu_system = r.cpu_system.saturating_add(ticks(12).saturating_add(ticks(14)).saturating_mul(to_ns));
    }
    r.cpu_total = r.cpu_user.saturating_add(r.cpu_system);
    r.usage = r.rss;
    found.then_some(r)
}

/// Readings kept from the last request per task, to compute CPU percentages between two;
/// entries not read for this long are dropped, so ended tasks leave nothing behind.
const PREVIOUS_KEPT: Duration = Duration::from_secs(600);

static PREVIOUS: Mutex<Option<HashMap<String, (Instant, Reading)>>> = Mutex::new(None);

/// CPU use between `before` and `now` as percents of one core: (total, user, system).
fn cpu_percents(before: Option<(Instant, Reading)>, now: (Instant, Reading)) -> (f64, f64, f64) {
    let Some((then, old)) = before else { return (0.0, 0.0, 0.0) };
    let wall = now.0.saturating_duration_since(then).as_nanos() as f64;
    if wall <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let percent = |new: u64, old: u64| new.saturating_sub(old) as f64 / wall * 100.0;
    (percent(now.1.cpu_total, old.cpu_total), percent(now.1.cpu_user, old.cpu_user), percent(now.1.cpu_system, old.cpu_system))
}

/// Nomad's `ResourceUsage` for a reading; `mhz` is one core's clock (TotalTicks is the share
/// of it used: Percent / 100 × MHz).
fn resource_usage(r: &Reading, (percent, user, system): (f64, f64, f64), mhz: f64) -> Value {
    let (memory_measured, cpu_measured): (&[&str], &[&str]) = match r.cgroup {
        Some(_) => (
            &["RSS", "Cache", "Swap", "Usage", "Max Usage"],
            &["System Mode", "User Mode", "Throttled Periods", "Throttled Time", "Percent"],
        ),
        None => (&["RSS", "Swap"], &["System Mode", "User Mode", "Percent"]),
    };
    json!({
        "MemoryStats": {
            "RSS": r.rss, "Cache": r.cache, "Swap": r.swap, "MappedFile": 0,
            "Usage": r.usage, "MaxUsage": r.max_usage, "KernelUsage": 0, "KernelMaxUsage": 0,
            "Measured": memory_measured,
        },
        "CpuStats": {
            "SystemMode": system, "UserMode": user, "Percent": percent,
            "TotalTicks": percent / 100.0 * mhz,
            "ThrottledPeriods": r.throttled_periods, "ThrottledTime": r.throttled_time,
            "Measured": cpu_measured,
        },
        "DeviceStats": [],
    })
}

/// A running task's usage in Nomad's `ResourceUsage` shape, measured now (`None` once it is
/// gone). CPU percentages need two readings apart in time, so this one reports them as 0.
pub fn task_resource_usage(handle: &TaskHandle) -> Option<Value> {
    read_task(handle).map(|r| resource_usage(&r, (0.0, 0.0, 0.0), 1000.0))
}

/// One task's reading: its cgroup's when it has one, else its process tree's.
fn read_task(handle: &TaskHandle) -> Option<Reading> {
    match task_cgroup(handle) {
        Some(dirs) => read_cgroup(&dirs),
        None => read_process_tree(handle.task.pid),
    }
}

pub(super) async fn handle(State(state): State<ClientHttp>, UrlPath(alloc_id): UrlPath<String>, req: Request<Body>) -> Response {
    if let Err(e) = require_method(req.method(), &[Method::GET]) {
        return e.into_response();
    }
    let mhz = state
        .client
        .as_ref()
        .and_then(|c| c.node().attributes.get("cpu.frequency").and_then(|f| f.parse::<f64>().ok()))
        .filter(|mhz| *mhz > 0.0)
        .unwrap_or(1000.0);
    let runner = match state.target(&alloc_id, req).await {
        Target::Local(r) => r,
        Target::Done(resp) => return resp,
    };
    let handles: Vec<(String, TaskHandle)> =
        runner.task_names().into_iter().filter_map(|name| runner.task(&name).and_then(|t| t.handle()).map(|h| (name, h))).collect();
    // /proc and cgroup files are read off the async runtime.
    let readings = tokio::task::spawn_blocking(move || {
        handles.into_iter().map(|(name, handle)| (name, read_task(&handle).unwrap_or_default())).collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let now = Instant::now();
    let mut tasks = BTreeMap::new();
    let mut total = Reading::default();
    let mut total_percents = (0.0, 0.0, 0.0);
    {
        let mut previous = PREVIOUS.lock().unwrap_or_else(|e| e.into_inner());
        let previous = previous.get_or_insert_with(HashMap::new);
        previous.retain(|_, (at, _)| now.saturating_duration_since(*at) < PREVIOUS_KEPT);
        for (name, reading) in readings {
            let key = format!("{alloc_id}/{name}");
            let percents = cpu_percents(previous.get(&key).copied(), (now, reading));
            previous.insert(key, (now, reading));
            total = add(total, &reading);
            total_percents = (total_percents.0 + percents.0, total_percents.1 + percents.1, total_percents.2 + percents.2);
            let usage = resource_usage(&reading, percents, mhz);
            tasks.insert(name, json!({ "ResourceUsage": usage, "Timestamp": Timestamp::now().unix_nanos(), "Pids": null }));
        }
    }
    let body = json!({
        "ResourceUsage": resource_usage(&total, total_percents, mhz),
        "Tasks": tasks,
        "Timestamp": Timestamp::now().unix_nanos(),
    });
    json_response(&body, None, false).unwrap_or_else(|e: HttpError| e.into_response())
}

/// The alloc's sum of its tasks' readings (measured as the first task's source says).
fn add(total: Reading, r: &Reading) -> Reading {
    Reading {
        cpu_total: total.cpu_total.saturating_add(r.cpu_total),
        cpu_user: total.cpu_user.saturating_add(r.cpu_user),
        cpu_system: total.cpu_system.saturating_add(r.cpu_system),
        throttled_periods: total.throttled_periods.saturating_add(r.throttled_periods),
        throttled_time: total.throttled_time.saturating_add(r.throttled_time),
        rss: total.rss.saturating_add(r.rss),
        cache: total.cache.saturating_add(r.cache),
        swap: total.swap.saturating_add(r.swap),
        usage: total.usage.saturating_add(r.usage),
        max_usage: total.max_usage.saturating_add(r.max_usage),
        cgroup: total.cgroup.or(r.cgroup),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn a_v2_cgroup_reports_cpu_split_and_memory_of_everything_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("nomad-rs/task");
        write(
            &cg,
            "cpu.stat",
            "usage_usec 3000000\nuser_usec 2000000\nsystem_usec 1000000\nnr_periods 9\nnr_throttled 4\nthrottled_usec 5000\n",
        );
        write(&cg, "memory.current", "104857600\n");
        write(&cg, "memory.stat", "anon 83886080\nfile 20971520\nkernel 1000\n");
        write(&cg, "memory.swap.current", "4096\n");
        write(&cg, "memory.peak", "209715200\n");
        let r = read_cgroup(&CgroupDirs { version: CgroupVersion::V2, memory: cg.clone(), cpu: cg }).unwrap();
        assert_eq!((r.cpu_total, r.cpu_user, r.cpu_system), (3_000_000_000, 2_000_000_000, 1_000_000_000));
        assert_eq!((r.throttled_periods, r.throttled_time), (4, 5_000_000));
        assert_eq!((r.usage, r.rss, r.cache, r.swap, r.max_usage), (104_857_600, 83_886_080, 20_971_520, 4096, 209_715_200));
    }

    #[test]
    fn a_v1_cgroup_reads_memory_and_cpuacct_hierarchies() {
        let dir = tempfile::tempdir().unwrap();
        let memory = dir.path().join("memory/nomad-rs/task");
        let cpu = dir.path().join("cpu,cpuacct/nomad-rs/task");
        write(&memory, "memory.usage_in_bytes", "50000000\n");
        write(&memory, "memory.max_usage_in_bytes", "60000000\n");
        write(&memory, "memory.stat", "cache 1000\nrss 40000000\nswap 7\ntotal_rss 1\n");
        write(&cpu, "cpuacct.usage", "2500000000\n");
        write(&cpu, "cpuacct.stat", "user 150\nsystem 50\n");
        write(&cpu, "cpu.stat", "nr_periods 10\nnr_throttled 2\nthrottled_time 3000\n");
        let r = read_cgroup(&CgroupDirs { version: CgroupVersion::V1, memory, cpu }).unwrap();
        let tick = 1_000_000_000 / clock_ticks_per_second();
        assert_eq!((r.cpu_total, r.cpu_user, r.cpu_system), (2_500_000_000, 150 * tick, 50 * tick));
        assert_eq!((r.usage, r.max_usage, r.rss, r.cache, r.swap), (50_000_000, 60_000_000, 40_000_000, 1000, 7));
        assert_eq!((r.throttled_periods, r.throttled_time), (2, 3000));
    }

    #[test]
    fn a_gone_cgroup_reads_as_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        assert_eq!(read_cgroup(&CgroupDirs { version: CgroupVersion::V2, memory: gone.clone(), cpu: gone }), None);
    }

    #[test]
    fn a_container_cgroup_is_found_from_its_process() {
        let root = tempfile::tempdir().unwrap();
        let v1 = "12:pids:/nomad-rs/c1\n4:cpu,cpuacct:/nomad-rs/c1\n3:memory:/nomad-rs/c1\n0::/\n";
        let dirs = cgroup_of(v1, root.path()).unwrap();
        assert_eq!(dirs.version, CgroupVersion::V1);
        assert_eq!(dirs.memory, root.path().join("memory/nomad-rs/c1"));
        assert_eq!(dirs.cpu, root.path().join("cpu,cpuacct/nomad-rs/c1"));

        write(root.path(), "cgroup.controllers", "cpu memory pids\n");
        let dirs = cgroup_of("0::/nomad-rs/c2\n", root.path()).unwrap();
        assert_eq!(
            dirs,
            CgroupDirs { version: CgroupVersion::V2, memory: root.path().join("nomad-rs/c2"), cpu: root.path().join("nomad-rs/c2") }
        );
    }

    #[test]
    fn cpu_percent_is_the_share_of_one_core_between_two_readings() {
        let start = Instant::now();
        let old = Reading { cpu_total: 1_000_000_000, cpu_user: 600_000_000, cpu_system: 400_000_000, ..Reading::default() };
        // 1.5 s of CPU (1 s user, 0.5 s system) in 1 s of wall time: 150% of a core.
        let new = Reading { cpu_total: 2_500_000_000, cpu_user: 1_600_000_000, cpu_system: 900_000_000, ..Reading::default() };
        let (percent, user, system) = cpu_percents(Some((start, old)), (start + Duration::from_secs(1), new));
        assert!((percent - 150.0).abs() < 1e-9 && (user - 100.0).abs() < 1e-9 && (system - 50.0).abs() < 1e-9);
        assert_eq!(cpu_percents(None, (start, new)), (0.0, 0.0, 0.0), "no earlier reading: no rate yet");
        let usage = resource_usage(&new, (percent, user, system), 2000.0);
        assert_eq!(usage["CpuStats"]["TotalTicks"], 3000.0, "150% of a 2000 MHz core");
    }

    /// A task whose child holds the memory: counted, where the main process alone is small.
    #[test]
    fn a_process_tree_counts_a_child_that_uses_memory() {
        let held: u64 = 64 << 20;
        // The subshell (a child of the main sh) holds a 64 MiB string, then signals it by a file.
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let script = format!("( x=$(head -c {held} /dev/zero | tr '\\0' a); touch {}; sleep 600; echo ${{#x}} ) & wait", ready.display());
        let mut main = std::process::Command::new("sh").arg("-c").arg(&script).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the child never allocated");
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = main.id() as i32;
        let tree = read_process_tree(pid).unwrap();
        let alone = read_process_tree_of(&[pid]);
        // The subshell and its sleep go too, children first (they are the main process's descendants).
        for member in process_tree(pid).into_iter().rev() {
            // SAFETY: kill on pids this test started; no memory is involved.
            unsafe { libc::kill(member, libc::SIGKILL) };
        }
        let _ = main.wait();
        assert!(alone < held / 4, "the main process alone holds {alone} bytes");
        assert!(tree.rss >= held, "the tree's RSS {} does not count the child's {held} bytes", tree.rss);
        assert_eq!(tree.usage, tree.rss);
    }

    fn read_process_tree_of(pids: &[i32]) -> u64 {
        pids.iter()
            .map(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let kb: u64 = status
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                kb * 1024
            })
            .sum()
    }
}
