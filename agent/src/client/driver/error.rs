//! Driver errors.

use std::path::PathBuf;

/// Why a driver operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The driver is turned off in the agent configuration.
    #[error("driver {0} is disabled on this client")]
    Disabled(&'static str),
    /// No driver with this name is registered.
    #[error("unknown driver {0:?}")]
    UnknownDriver(String),
    /// The task's driver config has the wrong shape.
    #[error("invalid {driver} config: {reason}")]
    InvalidConfig {
        /// Driver name.
        driver: &'static str,
        /// What was wrong, naming the key.
        reason: String,
    },
    /// The client's policy refuses what the task asks for (a denied user or capability).
    #[error("{0}")]
    Refused(String),
    /// The task's command does not exist.
    #[error("command {command:?} not found: {detail}")]
    CommandNotFound {
        /// The command as configured.
        command: String,
        /// Where it was looked for.
        detail: String,
    },
    /// The executor could not start the task.
    #[error("task failed to start: {0}")]
    StartFailed(String),
    /// The executor itself failed.
    #[error("executor: {0}")]
    Executor(String),
    /// A chroot source directory is missing.
    #[error("chroot source {0} does not exist on this host")]
    MissingChrootSource(PathBuf),
    /// cgroup setup or cleanup failed.
    #[error("cgroup: {0}")]
    Cgroup(String),
    /// The OCI image is unusable.
    #[error("image {path}: {reason}")]
    Image {
        /// The configured image path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The OCI runtime failed.
    #[error("oci runtime: {0}")]
    Runtime(String),
    /// The Docker Engine refused or failed a call.
    #[error("docker: {0}")]
    Docker(String),
    /// The task's image is neither present nor obtainable; the message is the task event's.
    #[error("{0}")]
    ImageUnavailable(String),
    /// A handle from another driver was passed in.
    #[error("task handle belongs to driver {found:?}, not {expected}")]
    WrongDriver {
        /// This driver.
        expected: &'static str,
        /// The handle's driver.
        found: String,
    },
    /// A signal name that does not exist (consul-template's text, which Nomad's drivers give).
    #[error("invalid signal {0:?} - valid signals are {names}", names = super::valid_signal_names())]
    UnknownSignal(String),
    /// Signalling the task failed.
    #[error("signal task: {0}")]
    Signal(nix::Error),
    /// Path-safe work inside the alloc dir failed or was refused (a symlink, FIFO or hard link
    /// where the task must not put one); the message says what and where.
    #[error("{0}")]
    TaskFiles(#[from] crate::fs_beneath::FsError),
    /// The driver cannot run commands in its tasks.
    #[error("driver {0} does not support exec")]
    ExecUnsupported(&'static str),
    /// A command run in the task's context did not finish in time (it was killed).
    #[error("exec timed out after {0:?}")]
    ExecTimedOut(std::time::Duration),
    /// The command could not be run in the task's context (the task is gone, its namespaces
    /// could not be entered, ...).
    #[error("exec in the task: {0}")]
    ExecFailed(String),
    /// File-system work failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl DriverError {
    /// A failure that may go away by itself (as opposed to a refusal of what the task left).
    pub fn transient_files_error(&self) -> bool {
        use crate::fs_beneath::FsError;
        matches!(self, DriverError::TaskFiles(FsError::Io { .. } | FsError::Open { .. }))
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> DriverError {
        DriverError::Io { context: context.into(), source }
    }
}
