//! Alloc stats measure everything a task runs: an exec task from its cgroup, a raw_exec task
//! from its process tree. The task's main process stays small; a child it spawned holds the
//! memory, and must be counted.

use std::time::Duration;

use crate::support::{options, task, wait_for_output};
use nomad_agent::client::driver::{DriverRegistry, TaskResources};
use nomad_agent::client::http::task_resource_usage;
use serde_json::json;

/// What the child holds: a string of this many bytes in a subshell.
const HELD: u64 = 64 << 20;

fn script() -> String {
    format!("( x=$(head -c {HELD} /dev/zero | tr '\\0' a); echo ready; sleep 600; echo ${{#x}} ) & wait")
}

fn main_process_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    kb * 1024
}

async fn measure(driver_name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut task = task(dir.path(), "hold", json!({"command": "/bin/sh", "args": ["-c", script()]}));
    task.resources = TaskResources { memory_mib: 512, cpu_mhz: 100, ..TaskResources::default() };
    task.kill_timeout = Duration::from_secs(1);
    let driver = DriverRegistry::new(&options(true)).get(driver_name).unwrap();
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;

    let usage = task_resource_usage(&handle).expect("a running task has usage");
    let alone = main_process_rss(handle.task.pid);
    driver.stop(&handle, nix::sys::signal::Signal::SIGKILL, Duration::from_secs(1)).await.ok();
    driver.wait(&handle).await.ok();
    driver.destroy(&handle).await.unwrap();

    let memory = &usage["MemoryStats"];
    let rss = memory["RSS"].as_u64().unwrap();
    assert!(alone < HELD / 4, "the main process alone holds {alone} bytes: the test proves nothing");
    assert!(rss >= HELD, "{driver_name}: RSS {rss} leaves out the child's {HELD} bytes: {usage}");
    assert!(memory["Usage"].as_u64().unwrap() >= HELD, "{usage}");
}

#[tokio::test]
async fn an_exec_task_is_measured_over_its_cgroup_children_included() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root);
    measure("exec").await;
}

#[tokio::test]
async fn a_raw_exec_task_is_measured_over_its_process_tree() {
    measure("raw_exec").await;
}
