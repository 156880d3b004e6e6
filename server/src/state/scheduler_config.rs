//! The scheduler configuration (Nomad's `SchedulerConfiguration`, `/v1/operator/scheduler/
//! configuration`): one object, stored through Raft so every leader reads the same. nomad-rs
//! honours `PauseEvalBroker` (the leader holds no eval broker while it is set, which
//! `eval delete` requires); the other settings describe what nomad-rs's scheduler does, and a
//! request for anything else is refused rather than stored and ignored.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{State, Table, Txn};

/// Nomad's `binpack` algorithm, the only one nomad-rs schedules with.
pub const SCHEDULER_ALGORITHM_BINPACK: &str = "binpack";

/// Which schedulers may preempt (`PreemptionConfig`). nomad-rs preempts nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PreemptionConfig {
    /// System jobs.
    pub system_scheduler_enabled: bool,
    /// Sysbatch jobs.
    pub sys_batch_scheduler_enabled: bool,
    /// Batch jobs.
    pub batch_scheduler_enabled: bool,
    /// Service jobs.
    pub service_scheduler_enabled: bool,
}

/// The scheduler configuration. Keys a request leaves out keep what nomad-rs does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct SchedulerConfiguration {
    /// `binpack` (`""` reads as binpack, as in Nomad).
    pub scheduler_algorithm: String,
    /// Preemption per scheduler.
    pub preemption_config: PreemptionConfig,
    /// `memory_max` is honoured (nomad-rs always does).
    pub memory_oversubscription_enabled: bool,
    /// Refuse job registrations from non-management tokens (not supported: always false).
    pub reject_job_registration: bool,
    /// The leader holds no eval broker: evals are neither scheduled nor unblocked.
    pub pause_eval_broker: bool,
    /// Raft index of the first write.
    pub create_index: u64,
    /// Raft index of the last write.
    pub modify_index: u64,
}

impl Default for SchedulerConfiguration {
    fn default() -> Self {
        SchedulerConfiguration {
            scheduler_algorithm: SCHEDULER_ALGORITHM_BINPACK.into(),
            preemption_config: PreemptionConfig::default(),
            memory_oversubscription_enabled: true,
            reject_job_registration: false,
            pause_eval_broker: false,
            create_index: 0,
            modify_index: 0,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedulerConfigError {
    /// Nomad refuses it too (400).
    Invalid(String),
    /// Valid in Nomad, not done by nomad-rs (501).
    Unsupported(String),
}

impl SchedulerConfiguration {
    /// Nomad's validation, then what nomad-rs cannot do.
    pub fn check(&self) -> Result<(), SchedulerConfigError> {
        let unsupported = |what: &str| Err(SchedulerConfigError::Unsupported(format!("{what} is not supported by nomad-rs")));
        match self.scheduler_algorithm.as_str() {
            "" | SCHEDULER_ALGORITHM_BINPACK => {}
            "spread" => return unsupported("the spread scheduler algorithm"),
            other => return Err(SchedulerConfigError::Invalid(format!("invalid scheduler algorithm: {other}"))),
        }
        if self.preemption_config != PreemptionConfig::default() {
            return unsupported("preemption");
        }
        if !self.memory_oversubscription_enabled {
            return unsupported("disabling memory oversubscription (memory_max is always honoured)");
        }
        if self.reject_job_registration {
            return unsupported("rejecting job registrations");
        }
        Ok(())
    }
}

impl State {
    /// The scheduler configuration (the defaults, at index 0, until one is written).
    pub fn scheduler_config(&self) -> SchedulerConfiguration {
        self.scheduler_config.as_deref().cloned().unwrap_or_default()
    }
}

impl Txn<'_> {
    /// Writes the configuration; with `cas`, only if the stored one's `ModifyIndex` is `cas`
    /// (0: none stored yet). Returns whether it was written.
    pub fn set_scheduler_config(&mut self, config: &SchedulerConfiguration, cas: Option<u64>) -> bool {
        let current = self.state.scheduler_config.as_deref();
        if cas.is_some_and(|cas| cas != current.map_or(0, |c| c.modify_index)) {
            return false;
        }
        let mut config = config.clone();
        if config.scheduler_algorithm.is_empty() {
            config.scheduler_algorithm = SCHEDULER_ALGORITHM_BINPACK.into();
        }
        config.create_index = current.map_or(self.index, |c| c.create_index);
        config.modify_index = self.index;
        self.state.scheduler_config = Some(Arc::new(config));
        self.touch(Table::SchedulerConfig);
        true
    }
}
