//! `nomad-rs alloc ...`: status, logs, fs, exec, signal, stop, restart.

pub mod exec;
pub mod fs;
pub mod logs;
pub mod restart;
pub mod signal;
pub mod status;
pub mod stop;

use clap::{Args, Subcommand};
use nomad_proto::Allocation;

use super::api::ApiFlags;
use super::{CmdResult, Failure};

/// `nomad-rs alloc`.
#[derive(Debug, Args)]
pub struct AllocArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The alloc command.
    #[command(subcommand)]
    pub command: AllocCommand,
}

/// Allocation commands.
#[derive(Debug, Subcommand)]
pub enum AllocCommand {
    /// Show an allocation's tasks, resources and recent events.
    Status(status::StatusArgs),
    /// Print (or follow) a task's stdout or stderr.
    Logs(logs::LogsArgs),
    /// Stop an allocation (the scheduler replaces it).
    Stop(stop::StopArgs),
    /// Restart an allocation's tasks in place.
    Restart(restart::RestartArgs),
    /// List, print, describe or follow files of an allocation's directory.
    Fs(fs::FsArgs),
    /// Run a command in a running task.
    Exec(exec::ExecArgs),
    /// Send a signal to an allocation's tasks.
    Signal(signal::SignalArgs),
}

/// Runs an alloc command.
pub async fn run(a: AllocArgs) -> CmdResult {
    match a.command {
        AllocCommand::Status(s) => status::run(&a.api, s).await,
        AllocCommand::Logs(l) => logs::run(&a.api, l).await,
        AllocCommand::Stop(s) => stop::run(&a.api, s).await,
        AllocCommand::Restart(r) => restart::run(&a.api, r).await,
        AllocCommand::Fs(f) => fs::run(&a.api, f).await,
        AllocCommand::Exec(e) => exec::run(&a.api, e).await,
        AllocCommand::Signal(s) => signal::run(&a.api, s).await,
    }
}

/// The names of the tasks an allocation runs (from its job's group).
pub fn task_names(alloc: &Allocation) -> Vec<String> {
    let from_job = alloc
        .job
        .as_ref()
        .and_then(|j| j.lookup_task_group(&alloc.task_group))
        .map(|g| g.tasks.iter().map(|t| t.name.clone()).collect::<Vec<_>>())
        .unwrap_or_default();
    if !from_job.is_empty() {
        return from_job;
    }
    alloc.task_states.iter().flatten().map(|(n, _)| n.clone()).collect()
}

/// The task to act on: the one given, or the only one. Several without a choice is an error.
pub fn pick_task(alloc: &Allocation, given: Option<&str>) -> Result<String, Failure> {
    let names = task_names(alloc);
    if let Some(t) = given {
        if !names.is_empty() && !names.iter().any(|n| n == t) {
            return Err(Failure::new(format!("Could not find task named: {t}; the allocation runs: {}", names.join(", "))));
        }
        return Ok(t.to_string());
    }
    match names.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Failure::new("The allocation has no tasks to choose from; give a task name")),
        many => Err(Failure::new(format!(
            "Allocation {:?} is running the following tasks:\n{}\n\nPlease specify the task.",
            super::format::limit(&alloc.id, 8),
            many.iter().map(|n| format!("  * {n}")).collect::<Vec<_>>().join("\n")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::{Job, Task, TaskGroup};

    use super::*;

    fn alloc(tasks: &[&str]) -> Allocation {
        let group = TaskGroup {
            name: "g".into(),
            tasks: tasks.iter().map(|t| Task { name: t.to_string(), ..Task::default() }).collect(),
            ..TaskGroup::default()
        };
        Allocation {
            id: "abcdef0123".into(),
            task_group: "g".into(),
            job: Some(Arc::new(Job { task_groups: vec![group], ..Job::default() })),
            ..Allocation::default()
        }
    }

    #[test]
    fn the_only_task_is_picked_and_several_need_a_choice() {
        assert_eq!(pick_task(&alloc(&["web"]), None).unwrap(), "web");
        assert_eq!(pick_task(&alloc(&["web", "log"]), Some("log")).unwrap(), "log");
        let e = pick_task(&alloc(&["web", "log"]), None).unwrap_err().message;
        assert!(e.contains("  * web\n  * log") && e.contains("Please specify the task"), "{e}");
        assert!(pick_task(&alloc(&["web"]), Some("nope")).unwrap_err().message.contains("Could not find task named: nope"));
    }
}
