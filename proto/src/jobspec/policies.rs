//! `restart`, `reschedule`, `update` and `migrate`: blocks whose unset keys
//! come from a default that depends on the job type or an enclosing block.
//!
//! Nomad keeps these as pointer fields and merges them during
//! canonicalization (job type default, then the job's block, then the
//! group's, then the task's for `restart`). Our types have plain fields, so
//! "not set" cannot survive parsing; the parser records which keys a block
//! sets (`*Overrides`, all `Option`s) and merges them onto the right base.

use crate::job::{JobType, MigrateStrategy, ReschedulePolicy, RestartPolicy, UpdateStrategy};

use super::error::DResult;
use super::reader::Reader;

/// The keys a `restart` block sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct RestartOverrides {
    attempts: Option<i64>,
    interval: Option<i64>,
    delay: Option<i64>,
    mode: Option<String>,
    render_templates: Option<bool>,
}

impl RestartOverrides {
    pub fn read(r: &Reader<'_>) -> DResult<RestartOverrides> {
        let o = RestartOverrides {
            attempts: r.int("attempts")?,
            interval: r.duration("interval")?,
            delay: r.duration("delay")?,
            mode: r.string("mode")?,
            render_templates: r.bool("render_templates")?,
        };
        r.finish()?;
        Ok(o)
    }

    pub fn apply(&self, p: &mut RestartPolicy) {
        set(&mut p.attempts, self.attempts);
        set(&mut p.interval, self.interval);
        set(&mut p.delay, self.delay);
        set(&mut p.mode, self.mode.clone());
        set(&mut p.render_templates, self.render_templates);
    }
}

/// Nomad's restart default for a job type (service and system share one).
pub(crate) fn default_restart(job_type: JobType) -> RestartPolicy {
    match job_type {
        JobType::Batch | JobType::Sysbatch => RestartPolicy::default_batch(),
        _ => RestartPolicy::default_service(),
    }
}

/// The keys a `reschedule` block sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct RescheduleOverrides {
    attempts: Option<i64>,
    interval: Option<i64>,
    delay: Option<i64>,
    delay_function: Option<String>,
    max_delay: Option<i64>,
    unlimited: Option<bool>,
}

impl RescheduleOverrides {
    pub fn read(r: &Reader<'_>) -> DResult<RescheduleOverrides> {
        let o = RescheduleOverrides {
            attempts: r.int("attempts")?,
            interval: r.duration("interval")?,
            delay: r.duration("delay")?,
            delay_function: r.string("delay_function")?,
            max_delay: r.duration("max_delay")?,
            unlimited: r.bool("unlimited")?,
        };
        r.finish()?;
        Ok(o)
    }

    pub fn apply(&self, p: &mut ReschedulePolicy) {
        set(&mut p.attempts, self.attempts);
        set(&mut p.interval, self.interval);
        set(&mut p.delay, self.delay);
        set(&mut p.delay_function, self.delay_function.clone());
        set(&mut p.max_delay, self.max_delay);
        set(&mut p.unlimited, self.unlimited);
    }
}

/// Nomad's reschedule default for a job type; system and sysbatch jobs start from zero.
pub(crate) fn default_reschedule(job_type: JobType) -> ReschedulePolicy {
    match job_type {
        JobType::Service => ReschedulePolicy::default_service(),
        JobType::Batch => ReschedulePolicy::default_batch(),
        _ => ReschedulePolicy::default(),
    }
}

/// The keys an `update` block sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct UpdateOverrides {
    stagger: Option<i64>,
    max_parallel: Option<i64>,
    health_check: Option<String>,
    min_healthy_time: Option<i64>,
    healthy_deadline: Option<i64>,
    progress_deadline: Option<i64>,
    canary: Option<i64>,
    auto_revert: Option<bool>,
    auto_promote: Option<bool>,
}

impl UpdateOverrides {
    pub fn read(r: &Reader<'_>) -> DResult<UpdateOverrides> {
        let o = UpdateOverrides {
            stagger: r.duration("stagger")?,
            max_parallel: r.int("max_parallel")?,
            health_check: r.string("health_check")?,
            min_healthy_time: r.duration("min_healthy_time")?,
            healthy_deadline: r.duration("healthy_deadline")?,
            progress_deadline: r.duration("progress_deadline")?,
            canary: r.int("canary")?,
            auto_revert: r.bool("auto_revert")?,
            auto_promote: r.bool("auto_promote")?,
        };
        r.finish()?;
        Ok(o)
    }

    pub fn apply(&self, u: &mut UpdateStrategy) {
        set(&mut u.stagger, self.stagger);
        set(&mut u.max_parallel, self.max_parallel);
        set(&mut u.health_check, self.health_check.clone());
        set(&mut u.min_healthy_time, self.min_healthy_time);
        set(&mut u.healthy_deadline, self.healthy_deadline);
        set(&mut u.progress_deadline, self.progress_deadline);
        set(&mut u.canary, self.canary);
        set(&mut u.auto_revert, self.auto_revert);
        set(&mut u.auto_promote, self.auto_promote);
    }
}

/// The keys a `migrate` block sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct MigrateOverrides {
    max_parallel: Option<i64>,
    health_check: Option<String>,
    min_healthy_time: Option<i64>,
    healthy_deadline: Option<i64>,
}

impl MigrateOverrides {
    pub fn read(r: &Reader<'_>) -> DResult<MigrateOverrides> {
        let o = MigrateOverrides {
            max_parallel: r.int("max_parallel")?,
            health_check: r.string("health_check")?,
            min_healthy_time: r.duration("min_healthy_time")?,
            healthy_deadline: r.duration("healthy_deadline")?,
        };
        r.finish()?;
        Ok(o)
    }

    pub fn apply(&self, m: &mut MigrateStrategy) {
        set(&mut m.max_parallel, self.max_parallel);
        set(&mut m.health_check, self.health_check.clone());
        set(&mut m.min_healthy_time, self.min_healthy_time);
        set(&mut m.healthy_deadline, self.healthy_deadline);
    }
}

fn set<T>(target: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *target = v;
    }
}
