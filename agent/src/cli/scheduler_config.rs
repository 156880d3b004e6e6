//! `nomad-rs operator scheduler get-config [-json]` and `set-config [flags]`: Nomad's commands
//! over `/v1/operator/scheduler/configuration`. `set-config` reads the configuration, merges
//! the flags given and writes it back with check-and-set, as Nomad's does.

use clap::{Args, Subcommand};
use serde_json::Value;

use super::api::Query;
use super::format::kv;
use super::{CmdResult, Ctx, Failure, exit};

/// `operator scheduler` commands.
#[derive(Debug, Subcommand)]
pub enum SchedulerCommand {
    /// Show the scheduler configuration.
    GetConfig(GetConfigArgs),
    /// Change the scheduler configuration (only what a flag names).
    SetConfig(SetConfigArgs),
}

/// Flags of `get-config`.
#[derive(Debug, Args)]
pub struct GetConfigArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `set-config`.
#[derive(Debug, Args)]
pub struct SetConfigArgs {
    /// Only update if the configuration's modify index is this one.
    #[arg(long = "check-index")]
    pub check_index: Option<String>,
    /// `binpack` (nomad-rs schedules with no other).
    #[arg(long = "scheduler-algorithm")]
    pub scheduler_algorithm: Option<String>,
    /// Honour `memory_max`.
    #[arg(long = "memory-oversubscription", value_parser = go_bool)]
    pub memory_oversubscription: Option<bool>,
    /// Refuse job registrations from non-management tokens.
    #[arg(long = "reject-job-registration", value_parser = go_bool)]
    pub reject_job_registration: Option<bool>,
    /// Pause the eval broker (required by `eval delete`).
    #[arg(long = "pause-eval-broker", value_parser = go_bool)]
    pub pause_eval_broker: Option<bool>,
    /// Preemption for batch jobs.
    #[arg(long = "preempt-batch-scheduler", value_parser = go_bool)]
    pub preempt_batch_scheduler: Option<bool>,
    /// Preemption for service jobs.
    #[arg(long = "preempt-service-scheduler", value_parser = go_bool)]
    pub preempt_service_scheduler: Option<bool>,
    /// Preemption for sysbatch jobs.
    #[arg(long = "preempt-sysbatch-scheduler", value_parser = go_bool)]
    pub preempt_sysbatch_scheduler: Option<bool>,
    /// Preemption for system jobs.
    #[arg(long = "preempt-system-scheduler", value_parser = go_bool)]
    pub preempt_system_scheduler: Option<bool>,
}

/// Go's `strconv.ParseBool`, as Nomad's boolean flags read their values.
fn go_bool(v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("parse error: {v:?} is not a boolean")),
    }
}

const PATH: &str = "/v1/operator/scheduler/configuration";

/// Runs an `operator scheduler` command.
pub async fn run(ctx: &Ctx, command: SchedulerCommand) -> CmdResult {
    match command {
        SchedulerCommand::GetConfig(a) => get_config(ctx, a.json).await,
        SchedulerCommand::SetConfig(a) => set_config(ctx, a).await,
    }
}

/// The current configuration (`SchedulerConfig`).
pub async fn current(ctx: &Ctx) -> Result<Value, Failure> {
    let reply =
        ctx.client.get_json(PATH, &Query::new()).await.map_err(|e| Failure::new(format!("Error querying scheduler configuration: {e}")))?;
    Ok(reply.value.get("SchedulerConfig").cloned().unwrap_or(Value::Null))
}

async fn get_config(ctx: &Ctx, json: bool) -> CmdResult {
    if json {
        return ctx.print_json(PATH, &Query::new(), "Error querying scheduler configuration").await;
    }
    let c = current(ctx).await?;
    let b = |v: &Value| v.as_bool().unwrap_or(false).to_string();
    let p = &c["PreemptionConfig"];
    println!(
        "{}",
        kv(&[
            ("Scheduler Algorithm", c["SchedulerAlgorithm"].as_str().unwrap_or_default().to_string()),
            ("Memory Oversubscription", b(&c["MemoryOversubscriptionEnabled"])),
            ("Reject Job Registration", b(&c["RejectJobRegistration"])),
            ("Pause Eval Broker", b(&c["PauseEvalBroker"])),
            ("Preemption System Scheduler", b(&p["SystemSchedulerEnabled"])),
            ("Preemption Service Scheduler", b(&p["ServiceSchedulerEnabled"])),
            ("Preemption Batch Scheduler", b(&p["BatchSchedulerEnabled"])),
            ("Preemption SysBatch Scheduler", b(&p["SysBatchSchedulerEnabled"])),
            ("Modify Index", c["ModifyIndex"].as_u64().unwrap_or(0).to_string()),
        ])
    );
    Ok(exit::OK)
}

async fn set_config(ctx: &Ctx, a: SetConfigArgs) -> CmdResult {
    let check_index = match a.check_index.as_deref().filter(|v| !v.is_empty()) {
        None => 0,
        Some(v) => v.parse::<u64>().map_err(|e| Failure::new(format!("Error parsing check-index value {v:?}: {e}")))?,
    };
    let mut config = ctx
        .client
        .get_json(PATH, &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying for scheduler configuration: {e}")))?
        .value
        .get("SchedulerConfig")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let modify_index = config["ModifyIndex"].as_u64().unwrap_or(0);
    if check_index > 0 && modify_index != check_index {
        return Err(Failure::new(format!(
            "Error performing check index set: check-index {check_index} does not match does not match current state value {modify_index}"
        )));
    }
    if let Some(algorithm) = a.scheduler_algorithm.filter(|v| !v.is_empty()) {
        config["SchedulerAlgorithm"] = Value::from(algorithm);
    }
    let flags = [
        (&["MemoryOversubscriptionEnabled"][..], a.memory_oversubscription),
        (&["RejectJobRegistration"][..], a.reject_job_registration),
        (&["PauseEvalBroker"][..], a.pause_eval_broker),
        (&["PreemptionConfig", "BatchSchedulerEnabled"][..], a.preempt_batch_scheduler),
        (&["PreemptionConfig", "ServiceSchedulerEnabled"][..], a.preempt_service_scheduler),
        (&["PreemptionConfig", "SysBatchSchedulerEnabled"][..], a.preempt_sysbatch_scheduler),
        (&["PreemptionConfig", "SystemSchedulerEnabled"][..], a.preempt_system_scheduler),
    ];
    for (path, value) in flags {
        if let Some(value) = value {
            let slot = path.iter().fold(&mut config, |v, key| &mut v[*key]);
            *slot = Value::from(value);
        }
    }
    let cas = if check_index > 0 { check_index } else { modify_index };
    let reply: Value = ctx
        .client
        .put(PATH, &Query::new().param("cas", cas.to_string()), &config)
        .await
        .map_err(|e| Failure::new(format!("Error setting scheduler configuration: {e}")))?
        .value;
    if reply["Updated"].as_bool() == Some(true) {
        println!("Scheduler configuration updated!");
        return Ok(exit::OK);
    }
    println!("Scheduler configuration could not be atomically updated, please try again");
    Ok(exit::ERROR)
}
