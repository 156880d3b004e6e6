//! Task events with Nomad's types, messages and details, and the rules for recording them.

use std::collections::BTreeMap;
use std::time::Duration;

use nomad_proto::alloc::task_event;
use nomad_proto::{TaskEvent, TaskState, Timestamp};

use super::restart::go_duration;
use crate::client::driver::ExitResult;

/// Events kept per task; older ones are dropped (Nomad keeps 10).
pub const MAX_EVENTS: usize = 10;
/// The task failed validation before it could start.
pub const FAILED_VALIDATION: &str = "Failed Validation";
/// Every main task of the group is dead, so its sidecars are stopped.
pub const MAIN_DEAD: &str = "Main Tasks Dead";
/// A user sent the task a signal.
pub const SIGNALING: &str = "Signaling";
/// What templates report (`structs.TaskTemplate`).
pub const TEMPLATE: &str = "Template";
/// A hook's message (`structs.TaskHookMessage`).
pub const HOOK_MESSAGE: &str = "Task hook message";
/// A task hook failed (`structs.TaskHookFailed`).
pub const HOOK_FAILED: &str = "Task hook failed";

fn event(kind: &str, message: impl Into<String>) -> TaskEvent {
    let message = message.into();
    TaskEvent {
        event_type: kind.to_string(),
        time: Timestamp::now().unix_nanos(),
        display_message: message.clone(),
        message,
        ..TaskEvent::default()
    }
}

fn with(mut e: TaskEvent, details: &[(&str, String)]) -> TaskEvent {
    e.details = details.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<BTreeMap<_, _>>();
    e
}

/// The client received the task.
pub fn received() -> TaskEvent {
    event(task_event::RECEIVED, "Task received by client")
}

/// The task directory is being built.
pub fn task_setup() -> TaskEvent {
    event(task_event::TASK_SETUP, "Building Task Directory")
}

/// The driver started the task.
pub fn started() -> TaskEvent {
    event(task_event::STARTED, "Task started by client")
}

/// The task exited.
pub fn terminated(exit: &ExitResult) -> TaskEvent {
    let mut msg = format!("Exit Code: {}", exit.exit_code);
    if exit.signal != 0 {
        msg.push_str(&format!(", Signal: {}", exit.signal));
    }
    if exit.oom_killed {
        msg.push_str(", OOM Killed: true");
    }
    if let Some(err) = &exit.err {
        msg.push_str(&format!(", Exit Message: {err:?}"));
    }
    let mut e = with(
        event(task_event::TERMINATED, String::new()),
        &[("exit_code", exit.exit_code.to_string()), ("signal", exit.signal.to_string()), ("oom_killed", exit.oom_killed.to_string())],
    );
    e.display_message = msg;
    e.exit_code = i64::from(exit.exit_code);
    e.signal = i64::from(exit.signal);
    if let Some(err) = &exit.err {
        e.message = err.clone();
        e.details.insert("exit_message".into(), err.clone());
    }
    e
}

/// The task will be started again after `delay`.
pub fn restarting(delay: Duration, reason: &str) -> TaskEvent {
    let mut e = with(
        event(task_event::RESTARTING, String::new()),
        &[("start_delay", delay.as_nanos().to_string()), ("restart_reason", reason.to_string())],
    );
    e.display_message = format!("Task restarting in {}", go_duration(delay));
    e.start_delay = delay.as_nanos() as i64;
    e.restart_reason = reason.to_string();
    e
}

/// The task will not be started again; it fails the task.
pub fn not_restarting(reason: &str) -> TaskEvent {
    let mut e = with(event(task_event::NOT_RESTARTING, reason), &[("restart_reason", reason.to_string()), ("fails_task", "true".into())]);
    e.restart_reason = reason.to_string();
    e.fails_task = true;
    e
}

/// The task is being stopped: `signal` now, SIGKILL after `timeout`.
pub fn killing(signal: &str, timeout: Duration) -> TaskEvent {
    let mut e = with(event(task_event::KILLING, String::new()), &[("kill_timeout", timeout.as_nanos().to_string())]);
    e.display_message = format!("Sent {signal}. Waiting {} before force killing", go_duration(timeout));
    e.kill_timeout = timeout.as_nanos() as i64;
    e
}

/// The task was stopped.
pub fn killed() -> TaskEvent {
    event(task_event::KILLED, "Task successfully killed")
}

/// The driver could not start the task.
pub fn driver_failure(err: &str) -> TaskEvent {
    let mut e = with(event(task_event::DRIVER_FAILURE, err), &[("driver_error", err.to_string())]);
    e.driver_error = err.to_string();
    e
}

/// A prestart hook failed.
pub fn setup_failure(err: &str, fails_task: bool) -> TaskEvent {
    let mut e = with(event(task_event::SETUP_FAILURE, err), &[("setup_error", err.to_string())]);
    e.fails_task = fails_task;
    e
}

/// A hook failed: Nomad's `emitHookError` event, `<hook>: <error>`.
pub fn hook_failed(hook: &str, err: &str, fails_task: bool) -> TaskEvent {
    let mut e = event(HOOK_FAILED, format!("{hook}: {err}"));
    e.fails_task = fails_task;
    e
}

/// The task's configuration cannot work.
pub fn failed_validation(err: &str) -> TaskEvent {
    let mut e = with(event(FAILED_VALIDATION, err), &[("validation_error", err.to_string())]);
    e.fails_task = true;
    e
}

/// The artifacts are being fetched.
pub fn downloading_artifacts() -> TaskEvent {
    event(task_event::DOWNLOADING_ARTIFACTS, "Client is downloading artifacts")
}

/// An artifact could not be fetched (`SetDownloadError`); the restart policy retries.
pub fn artifact_download_failed(err: &str) -> TaskEvent {
    let mut e = with(event(task_event::ARTIFACT_DOWNLOAD_FAILED, err), &[("download_error", err.to_string())]);
    e.download_error = err.to_string();
    e
}

/// A template event: `Missing: …` while the first render waits for data (Nomad's
/// `TaskTemplate` type, `Template`).
pub fn template(message: &str) -> TaskEvent {
    event(TEMPLATE, message)
}

/// A re-rendered template signals the task (`change_mode = "signal"`).
pub fn template_signaling(signal: &str) -> TaskEvent {
    let mut e = with(event(SIGNALING, "Template re-rendered"), &[("signal", signal.to_string())]);
    e.display_message = "Template re-rendered".into();
    e
}

/// A template failed after the task started: it is killed and fails.
pub fn template_failed(err: &str) -> TaskEvent {
    let mut e = event(task_event::KILLING, format!("Template failed: {err}"));
    e.fails_task = true;
    e
}

/// A hook reports something (Nomad's `TaskHookMessage`).
pub fn hook_message(message: &str) -> TaskEvent {
    event(HOOK_MESSAGE, message)
}

/// The client reconnected to the servers and kept the task.
pub fn reconnected() -> TaskEvent {
    event(task_event::CLIENT_RECONNECTED, "Client reconnected")
}

/// A user asked for a restart.
pub fn restart_signaled(reason: &str) -> TaskEvent {
    let mut e = with(event(task_event::RESTART_SIGNAL, reason), &[("restart_reason", reason.to_string())]);
    e.restart_reason = reason.to_string();
    e
}

/// A user sent the task a signal (`alloc signal`): the signal is in the details only, so the
/// message is Nomad's generic one.
pub fn signaling(signal: &str) -> TaskEvent {
    let mut e = with(event(SIGNALING, ""), &[("signal", signal.to_string())]);
    e.display_message = "Task being sent a signal".into();
    e
}

/// Another task of the alloc failed, so this one is stopped.
pub fn sibling_failed(sibling: &str) -> TaskEvent {
    let msg = format!("Task's sibling {sibling:?} failed");
    with(event(task_event::SIBLING_FAILED, msg), &[("failed_sibling", sibling.to_string())])
}

/// The group's leader task died, so this one is stopped.
pub fn leader_dead() -> TaskEvent {
    event(task_event::LEADER_DEAD, "Leader Task in Group dead")
}

/// Every main task died, so this sidecar is stopped.
pub fn main_dead() -> TaskEvent {
    event(MAIN_DEAD, "Main tasks in the group died")
}

/// Appends `e` to the state, keeping [`MAX_EVENTS`], and applies what it means: a failing
/// event marks the task failed; `Restarting` counts a restart.
pub fn append(state: &mut TaskState, e: TaskEvent) {
    if e.fails_task {
        state.failed = true;
    }
    if e.event_type == task_event::RESTARTING {
        state.restarts += 1;
        state.last_restart = Timestamp::from_unix_nanos(e.time);
    }
    state.events.push(e);
    if state.events.len() > MAX_EVENTS {
        let extra = state.events.len() - MAX_EVENTS;
        state.events.drain(..extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_counts_restarts_marks_failures_and_keeps_ten_events() {
        let mut s = TaskState::default();
        for _ in 0..12 {
            append(&mut s, restarting(Duration::from_secs(15), "Restart within policy"));
        }
        assert_eq!(s.restarts, 12);
        assert!(!s.last_restart.is_zero());
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert!(!s.failed);
        append(&mut s, not_restarting("Exceeded allowed attempts 2 in interval 30m0s and mode is \"fail\""));
        assert!(s.failed);
        assert_eq!(s.events.last().unwrap().event_type, "Not Restarting");
        assert_eq!(s.events[MAX_EVENTS - 2].display_message, "Task restarting in 15s");
    }

    #[test]
    fn terminated_carries_the_exit() {
        let e = terminated(&ExitResult { exit_code: 3, signal: 0, ..ExitResult::default() });
        assert_eq!((e.exit_code, e.display_message.as_str()), (3, "Exit Code: 3"));
        let e = terminated(&ExitResult { exit_code: 0, signal: 9, oom_killed: true, ..ExitResult::default() });
        assert_eq!(e.display_message, "Exit Code: 0, Signal: 9, OOM Killed: true");
    }
}
