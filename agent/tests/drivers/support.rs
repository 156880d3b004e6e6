//! Shared fixtures for the driver tests: a task in its own temp dir, log readers, condition waits.
#![allow(dead_code)] // not every helper is used by every module

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use nomad_agent::client::driver::{DriverOptions, LogConfig, TaskConfig, TaskResources};

/// The executor binary cargo built for these tests.
pub fn executor_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nomad-rs-executor"))
}

/// Driver options pointing at the test executor.
pub fn options(raw_exec_enabled: bool) -> DriverOptions {
    DriverOptions { executor_path: executor_path(), ..DriverOptions::new(raw_exec_enabled) }
}

/// A task named `name` with its alloc, task and state dirs under `root`.
pub fn task(root: &Path, name: &str, config: serde_json::Value) -> TaskConfig {
    let alloc_id = uuid::Uuid::new_v4().to_string();
    let alloc_dir = root.join("alloc-dir");
    let task = TaskConfig {
        alloc_id,
        task_name: name.to_string(),
        alloc_dir: alloc_dir.clone(),
        state_dir: root.join("state").join(name),
        driver_config: config.as_object().cloned().expect("config is an object"),
        env: BTreeMap::from([("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string())]),
        user: None,
        resources: TaskResources::default(),
        logs: LogConfig::default(),
        kill_signal: Signal::SIGTERM,
        kill_timeout: Duration::from_secs(5),
        mounts: Vec::new(),
        netns: None,
    };
    for dir in [task.log_dir(), task.local_dir(), task.secrets_dir(), task.tmp_dir()] {
        fs::create_dir_all(dir).unwrap();
    }
    // The modes the alloc_dir and task_dir hooks give them: an exec task runs as nobody.
    use std::os::unix::fs::PermissionsExt;
    for (dir, mode) in [(task.shared_dir(), 0o777), (task.task_dir(), 0o777), (task.local_dir(), 0o777), (task.tmp_dir(), 0o1777)] {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode)).unwrap();
    }
    task
}

/// Contents of `<task>.<stream>.<index>` (empty if missing).
pub fn log(task: &TaskConfig, stream: &str, index: u64) -> String {
    fs::read_to_string(task.log_dir().join(format!("{}.{stream}.{index}", task.task_name))).unwrap_or_default()
}

pub use nomad_testkit::wait_until;

/// Waits until the task's stdout log contains `text`.
pub async fn wait_for_output(task: &TaskConfig, text: &str) {
    wait_until(&format!("stdout contains {text:?}"), || log(task, "stdout", 0).contains(text)).await;
}
