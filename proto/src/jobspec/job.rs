//! The `job "<id>"` block.

use hcl::edit::structure::Block;
use serde_json::json;

use crate::job::{Job, JobType, ParameterizedJobConfig, PeriodicConfig, UpdateStrategy};

use super::error::{DResult, Diag, ErrorKind};
use super::eval::{Evaluator, Scope};
use super::group::{Inherited, group, lone_task_group};
use super::placement::{affinity, constraint, spread};
use super::policies::{MigrateOverrides, RescheduleOverrides, UpdateOverrides, default_restart};
use super::reader::{BlockRef, Reader};
use super::task::{task, vault};

/// Decodes the job block. Its label is the job's ID and name unless `id` or
/// `name` say otherwise.
pub(crate) fn decode<'a>(eval: &'a Evaluator<'a>, block: &'a Block, scope: &Scope) -> DResult<Job> {
    let job_ref = BlockRef::from_block(block, scope);
    if job_ref.labels.len() != 1 {
        return Err(Diag::new(ErrorKind::Structure, job_ref.offset, "a job block needs exactly one label, its ID: job \"<id>\" { ... }"));
    }
    let r = Reader::open(eval, &job_ref)?;
    let label = job_ref.label().to_string();
    let mut job = Job { id: label.clone(), name: label, ..Job::default() };
    r.set_string("id", &mut job.id)?;
    r.set_string("name", &mut job.name)?;
    r.set_string("region", &mut job.region)?;
    r.set_string("namespace", &mut job.namespace)?;
    r.set_string("node_pool", &mut job.node_pool)?;
    r.set_int("priority", &mut job.priority)?;
    r.set_bool("all_at_once", &mut job.all_at_once)?;
    r.set_strings("datacenters", &mut job.datacenters)?;
    r.set_string("consul_token", &mut job.consul_token)?;
    r.set_string("vault_token", &mut job.vault_token)?;
    r.set_string_map("meta", &mut job.meta)?;
    if let Some((v, at)) = r.value("type")? {
        let name = super::eval::as_string(&v).unwrap_or_default();
        job.job_type = match name.as_str() {
            "service" => JobType::Service,
            "batch" => JobType::Batch,
            "system" => JobType::System,
            "sysbatch" => JobType::Sysbatch,
            _ => {
                return Err(r.invalid(
                    "type",
                    at,
                    format!("unknown job type {}; expected service, batch, system or sysbatch", super::eval::describe(&v)),
                ));
            }
        };
    }
    for c in r.blocks("constraint", 0)? {
        job.constraints.push(constraint(&r.child(&c)?)?);
    }
    for a in r.blocks("affinity", 0)? {
        job.affinities.push(affinity(&r.child(&a)?)?);
    }
    for s in r.blocks("spread", 0)? {
        job.spreads.push(spread(&r.child(&s)?)?);
    }
    if let Some(b) = r.block("update")? {
        let mut strategy = UpdateStrategy::default_service();
        UpdateOverrides::read(&r.child(&b)?)?.apply(&mut strategy);
        job.update = Some(strategy);
    }
    if let Some(b) = r.block("periodic")? {
        job.periodic = Some(periodic(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("parameterized")? {
        let pr = r.child(&b)?;
        let mut p = ParameterizedJobConfig { payload: "optional".to_string(), ..ParameterizedJobConfig::default() };
        pr.set_string("payload", &mut p.payload)?;
        pr.set_strings("meta_required", &mut p.meta_required)?;
        pr.set_strings("meta_optional", &mut p.meta_optional)?;
        pr.finish()?;
        job.parameterized_job = Some(p);
    }
    if let Some(b) = r.block("multiregion")? {
        job.multiregion = Some(multiregion(&r.child(&b)?)?);
    }
    let inherited = Inherited {
        job_type: job.job_type,
        update: job.update.clone(),
        reschedule: match r.block("reschedule")? {
            Some(b) => Some(RescheduleOverrides::read(&r.child(&b)?)?),
            None => None,
        },
        migrate: match r.block("migrate")? {
            Some(b) => Some(MigrateOverrides::read(&r.child(&b)?)?),
            None => None,
        },
        vault: match r.block("vault")? {
            Some(b) => Some(vault(&r.child(&b)?)?),
            None => None,
        },
    };
    // Nomad puts the groups of lone tasks before the declared groups.
    let lone_restart = default_restart(job.job_type);
    for t in r.blocks("task", 1)? {
        let decoded = task(&r.child(&t)?, &t, &lone_restart)?;
        job.task_groups.push(lone_task_group(decoded, &inherited));
    }
    for g in r.blocks("group", 1)? {
        job.task_groups.push(group(&r.child(&g)?, &g, &inherited)?);
    }
    r.finish()?;
    Ok(job)
}

/// Decodes `periodic`: enabled unless `enabled = false`, cron specs, and the
/// time zone (UTC by default, as Nomad's canonicalization sets it).
fn periodic(r: &Reader<'_>) -> DResult<PeriodicConfig> {
    let mut p = PeriodicConfig { enabled: true, time_zone: "UTC".to_string(), ..PeriodicConfig::default() };
    r.set_bool("enabled", &mut p.enabled)?;
    r.set_string("cron", &mut p.spec)?;
    r.set_strings("crons", &mut p.specs)?;
    r.set_bool("prohibit_overlap", &mut p.prohibit_overlap)?;
    r.set_string("time_zone", &mut p.time_zone)?;
    r.finish()?;
    if !p.spec.is_empty() || !p.specs.is_empty() {
        p.spec_type = "cron".to_string();
    }
    Ok(p)
}

/// Decodes `multiregion` into Nomad's JSON shape.
fn multiregion(r: &Reader<'_>) -> DResult<serde_json::Value> {
    let strategy = match r.block("strategy")? {
        None => serde_json::Value::Null,
        Some(b) => {
            let sr = r.child(&b)?;
            let v = json!({ "MaxParallel": sr.int("max_parallel")?.unwrap_or_default(), "OnFailure": sr.string("on_failure")?.unwrap_or_default() });
            sr.finish()?;
            v
        }
    };
    let mut regions = Vec::new();
    for b in r.blocks("region", 1)? {
        let rr = r.child(&b)?;
        regions.push(json!({
            "Name": b.label(),
            "Count": rr.int("count")?.unwrap_or(1),
            "Datacenters": rr.strings("datacenters")?.unwrap_or_default(),
            "NodePool": rr.string("node_pool")?.unwrap_or_default(),
            "Meta": rr.string_map("meta")?.unwrap_or_default(),
        }));
        rr.finish()?;
    }
    r.finish()?;
    Ok(json!({ "Strategy": strategy, "Regions": regions }))
}
