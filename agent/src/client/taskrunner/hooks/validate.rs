//! `validate`: the task can run at all: its name can be a directory name, its driver exists, its
//! driver config has the right shape (after interpolation) and its `kill_signal` names a signal.
//! A failure fails the task with a `Failed Validation` event that says why; it is never retried.

use super::{HookError, HookRequest, PrestartHook, PrestartResponse, TaskHook};
use crate::client::driver::signal_named;
use crate::client::taskrunner::events;
use crate::fs_beneath::check_name;

/// See the module docs.
pub struct ValidateHook;

impl TaskHook for ValidateHook {
    fn name(&self) -> &'static str {
        "validate"
    }
    fn prestart(&self) -> Option<&dyn PrestartHook> {
        Some(self)
    }
}

fn invalid(message: String) -> HookError {
    HookError { event: Some(Box::new(events::failed_validation(&message))), ..HookError::fatal(message) }
}

impl PrestartHook for ValidateHook {
    fn prestart(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        // The name becomes the task's directory under the alloc dir (the alloc runner refuses
        // such an alloc already; this keeps the task dir hook from ever seeing one).
        if let Err(reason) = check_name(&req.task.name) {
            return Err(invalid(format!("task name {:?} {reason}: it must be usable as a directory name", req.task.name)));
        }
        let Some(driver) = req.driver else {
            return Err(invalid(format!("unknown driver {:?}", req.task.driver)));
        };
        driver.validate_config(req.config).map_err(|e| invalid(e.to_string()))?;
        if !req.task.kill_signal.is_empty() {
            signal_named(&req.task.kill_signal).map_err(|e| invalid(format!("kill_signal: {e}")))?;
        }
        Ok(PrestartResponse::default())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::client::driver::{DriverOptions, DriverRegistry, TaskConfig};

    #[test]
    fn wrong_shapes_and_signals_fail_with_an_event_that_says_why() {
        let registry = DriverRegistry::new(&DriverOptions::new(true));
        let driver = registry.get("raw_exec").unwrap();
        let mut config: TaskConfig = super::super::tests_support::config();
        let alloc = nomad_proto::Allocation::default();
        let mut task = nomad_proto::Task { name: "t".into(), driver: "raw_exec".into(), ..Default::default() };

        config.driver_config = json!({"command": 5}).as_object().unwrap().clone();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: Some(driver.as_ref()),
            secrets_tmpfs: false,
            previous: None,
        };
        let err = PrestartHook::prestart(&ValidateHook, &req).unwrap_err();
        assert!(!err.recoverable);
        assert!(err.message.contains("invalid raw_exec config") && err.message.contains("command"), "{}", err.message);
        assert_eq!(err.event.unwrap().event_type, "Failed Validation");

        config.driver_config = json!({"command": "/bin/true"}).as_object().unwrap().clone();
        task.kill_signal = "SIGNOPE".into();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: Some(driver.as_ref()),
            secrets_tmpfs: false,
            previous: None,
        };
        assert!(PrestartHook::prestart(&ValidateHook, &req).unwrap_err().message.contains("kill_signal"));

        task.kill_signal = "SIGTERM".into();
        let req = HookRequest {
            alloc: &alloc,
            task: &task,
            config: &config,
            driver: Some(driver.as_ref()),
            secrets_tmpfs: false,
            previous: None,
        };
        assert!(PrestartHook::prestart(&ValidateHook, &req).is_ok());

        let req = HookRequest { alloc: &alloc, task: &task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        assert!(PrestartHook::prestart(&ValidateHook, &req).unwrap_err().message.contains("unknown driver"));

        for name in ["..", ".", "a/b", ""] {
            let task = nomad_proto::Task { name: name.into(), driver: "raw_exec".into(), ..Default::default() };
            let req = HookRequest {
                alloc: &alloc,
                task: &task,
                config: &config,
                driver: Some(driver.as_ref()),
                secrets_tmpfs: false,
                previous: None,
            };
            let err = PrestartHook::prestart(&ValidateHook, &req).unwrap_err();
            assert!(!err.recoverable);
            assert!(err.message.starts_with(&format!("task name {name:?} ")), "{}", err.message);
            assert_eq!(err.event.unwrap().event_type, "Failed Validation");
        }
    }
}
