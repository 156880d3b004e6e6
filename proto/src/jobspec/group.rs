//! `group "<name>"` blocks, and the group Nomad makes for a task written
//! directly under `job`.

use serde_json::json;

use crate::job::{EphemeralDisk, JobType, MigrateStrategy, Task, TaskGroup, UpdateStrategy};
use crate::volume::{CsiMountOptions, VolumeRequest};

use super::error::{DResult, Diag, ErrorKind};
use super::network::network;
use super::placement::{affinity, constraint, spread};
use super::policies::{MigrateOverrides, RescheduleOverrides, RestartOverrides, UpdateOverrides, default_reschedule, default_restart};
use super::reader::{BlockRef, Reader};
use super::service::service;
use super::task::{scaling_policy, task, vault};

/// What a group takes from its job.
pub(crate) struct Inherited {
    pub job_type: JobType,
    /// The job's `update` block merged onto the default, if it has one.
    pub update: Option<UpdateStrategy>,
    /// The job's `reschedule` and `migrate` blocks, which Nomad merges into
    /// every group (our `Job` has no field for them).
    pub reschedule: Option<RescheduleOverrides>,
    pub migrate: Option<MigrateOverrides>,
    /// The job's `vault` block, for tasks that have none.
    pub vault: Option<serde_json::Value>,
}

/// Decodes a `group` block.
pub(crate) fn group(r: &Reader<'_>, block: &BlockRef<'_>, inherited: &Inherited) -> DResult<TaskGroup> {
    let mut g = TaskGroup { name: block.label().to_string(), ..TaskGroup::default() };
    let count = r.int("count")?;
    g.shutdown_delay = r.duration("shutdown_delay")?;
    g.stop_after_client_disconnect = r.duration("stop_after_client_disconnect")?;
    g.max_client_disconnect = r.duration("max_client_disconnect")?;
    r.set_string_map("meta", &mut g.meta)?;
    for c in r.blocks("constraint", 0)? {
        g.constraints.push(constraint(&r.child(&c)?)?);
    }
    for a in r.blocks("affinity", 0)? {
        g.affinities.push(affinity(&r.child(&a)?)?);
    }
    for s in r.blocks("spread", 0)? {
        g.spreads.push(spread(&r.child(&s)?)?);
    }
    for n in r.blocks("network", 0)? {
        g.networks.push(network(&r.child(&n)?)?);
    }
    for s in r.blocks("service", 0)? {
        g.services.push(service(&r.child(&s)?)?);
    }
    for v in r.blocks("volume", 1)? {
        let name = v.label().to_string();
        if g.volumes.contains_key(&name) {
            return Err(Diag::new(ErrorKind::Structure, v.offset, format!("volume \"{name}\" is defined twice in {}", r.context())));
        }
        g.volumes.insert(name.clone(), volume(&r.child(&v)?, name)?);
    }
    if let Some(b) = r.block("ephemeral_disk")? {
        let er = r.child(&b)?;
        let mut disk = EphemeralDisk::default();
        er.set_bool("sticky", &mut disk.sticky)?;
        er.set_int("size", &mut disk.size_mb)?;
        er.set_bool("migrate", &mut disk.migrate)?;
        er.finish()?;
        g.ephemeral_disk = disk;
    }
    let restart = match r.block("restart")? {
        Some(b) => Some(RestartOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    let reschedule = match r.block("reschedule")? {
        Some(b) => Some(RescheduleOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    let migrate = match r.block("migrate")? {
        Some(b) => Some(MigrateOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    let update = match r.block("update")? {
        Some(b) => Some(UpdateOverrides::read(&r.child(&b)?)?),
        None => None,
    };
    if let Some(b) = r.block("scaling")? {
        let mut policy = scaling_policy(&r.child(&b)?, "horizontal")?;
        if policy["Max"].is_null() {
            return Err(Diag::new(ErrorKind::Structure, b.offset, format!("scaling block of {} needs a max", r.context())));
        }
        // Nomad's defaults: the policy's min is the group count, and the
        // count is the policy's min when only the policy sets it.
        if policy["Min"].is_null() {
            policy["Min"] = json!(count.unwrap_or(1));
        }
        g.scaling = Some(
            serde_json::from_value(policy)
                .map_err(|e| Diag::new(ErrorKind::Structure, b.offset, format!("scaling block of {}: {e}", r.context())))?,
        );
    }
    if let Some(b) = r.block("consul")? {
        let cr = r.child(&b)?;
        g.consul = Some(json!({ "Namespace": cr.string("namespace")?.unwrap_or_default() }));
        cr.finish()?;
    }
    let group_vault = match r.block("vault")? {
        Some(b) => Some(vault(&r.child(&b)?)?),
        None => None,
    };

    if let Some(restart) = &restart {
        let mut policy = default_restart(inherited.job_type);
        restart.apply(&mut policy);
        g.restart_policy = Some(policy);
    }
    let task_restart_base = g.restart_policy.clone().unwrap_or_else(|| default_restart(inherited.job_type));
    for t in r.blocks("task", 1)? {
        g.tasks.push(task(&r.child(&t)?, &t, &task_restart_base)?);
    }
    r.finish()?;

    g.count = match (count, g.scaling.as_ref().and_then(|s| s.min)) {
        (Some(count), _) => count,
        (None, Some(min)) => min,
        (None, None) => 1,
    };
    apply_inherited(&mut g, inherited, reschedule.as_ref(), migrate.as_ref(), update.as_ref(), group_vault.as_ref());
    Ok(g)
}

/// The group Nomad makes for a `task` written directly under `job`: named
/// after the task, holding only it.
pub(crate) fn lone_task_group(task: Task, inherited: &Inherited) -> TaskGroup {
    let mut g = TaskGroup { name: task.name.clone(), tasks: vec![task], ..TaskGroup::default() };
    apply_inherited(&mut g, inherited, None, None, None, None);
    g
}

/// Merges what the job sets for all groups with what the group sets itself:
/// type default, then job block, then group block (Nomad's canonicalization order).
fn apply_inherited(
    g: &mut TaskGroup,
    inherited: &Inherited,
    reschedule: Option<&RescheduleOverrides>,
    migrate: Option<&MigrateOverrides>,
    update: Option<&UpdateOverrides>,
    group_vault: Option<&serde_json::Value>,
) {
    if inherited.reschedule.is_some() || reschedule.is_some() {
        let mut policy = default_reschedule(inherited.job_type);
        for o in [inherited.reschedule.as_ref(), reschedule].into_iter().flatten() {
            o.apply(&mut policy);
        }
        g.reschedule_policy = Some(policy);
    }
    if inherited.migrate.is_some() || migrate.is_some() {
        let mut strategy = MigrateStrategy::default();
        for o in [inherited.migrate.as_ref(), migrate].into_iter().flatten() {
            o.apply(&mut strategy);
        }
        g.migrate = Some(strategy);
    }
    g.update = match update {
        Some(o) => {
            let mut strategy = inherited.update.clone().unwrap_or_else(UpdateStrategy::default_service);
            o.apply(&mut strategy);
            Some(strategy)
        }
        None => inherited.update.clone(),
    };
    for t in &mut g.tasks {
        if t.vault.is_none() {
            t.vault = group_vault.or(inherited.vault.as_ref()).cloned();
        }
    }
}

fn volume(r: &Reader<'_>, name: String) -> DResult<VolumeRequest> {
    let mut v = VolumeRequest { name, ..VolumeRequest::default() };
    r.set_string("type", &mut v.volume_type)?;
    r.set_string("source", &mut v.source)?;
    r.set_bool("read_only", &mut v.read_only)?;
    r.set_string("access_mode", &mut v.access_mode)?;
    r.set_string("attachment_mode", &mut v.attachment_mode)?;
    r.set_bool("per_alloc", &mut v.per_alloc)?;
    if let Some(b) = r.block("mount_options")? {
        let mr = r.child(&b)?;
        let mut options = CsiMountOptions::default();
        mr.set_string("fs_type", &mut options.fs_type)?;
        mr.set_strings("mount_flags", &mut options.mount_flags)?;
        mr.finish()?;
        v.mount_options = Some(options);
    }
    r.finish()?;
    Ok(v)
}
