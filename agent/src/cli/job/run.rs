//! `nomad-rs job run`: parse locally, register (`PUT /v1/jobs`), then follow
//! the evaluation and the allocations it placed until they run.

use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{JobFileArgs, LoadedJob, load};
use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::{id_len, parse_go_duration, stdout_is_live_terminal};
use crate::cli::monitor::{Monitor, MonitorOptions};
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Flags of `job run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Return right after submitting, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Submit only if the job's modify index is this (0: only if the job does not exist).
    #[arg(long = "check-index", value_name = "INDEX")]
    pub check_index: Option<u64>,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Print the job as JSON the HTTP API takes (`{"Job": ...}`) instead of submitting it.
    #[arg(long)]
    pub output: bool,
    /// Stop monitoring after this long (the job keeps running).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// The job file and its variables.
    #[command(flatten)]
    pub file: JobFileArgs,
}

/// Parses `-timeout`.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let ns = parse_go_duration(s)?;
    if ns <= 0 {
        return Err("the timeout must be positive".to_string());
    }
    Ok(Duration::from_nanos(ns.unsigned_abs()))
}

/// Body of `PUT /v1/jobs` (`api.JobRegisterRequest`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct RegisterRequest<'a> {
    /// The job.
    pub job: &'a nomad_proto::Job,
    /// Check the modify index.
    pub enforce_index: bool,
    /// The index to check.
    pub job_modify_index: u64,
    /// What was submitted (Nomad 1.6 keeps the source).
    pub submission: serde_json::Value,
}

/// What the register call answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct RegisterResponse {
    /// The eval (empty for periodic and parameterized jobs).
    #[serde(rename = "EvalID")]
    pub eval_id: String,
    /// Job modify index.
    pub job_modify_index: u64,
    /// Warnings.
    pub warnings: String,
}

/// Registers a loaded job; the namespace is the job's, or the client's when the file sets none.
pub async fn register(ctx: &Ctx, loaded: &LoadedJob, check_index: Option<u64>) -> Result<RegisterResponse, Failure> {
    let job = &loaded.job;
    let mut q = Query::new();
    if !job.namespace.is_empty() {
        q = q.param("namespace", job.namespace.clone());
    }
    if !job.region.is_empty() {
        q = q.param("region", job.region.clone());
    }
    let body = RegisterRequest {
        job,
        enforce_index: check_index.is_some(),
        job_modify_index: check_index.unwrap_or(0),
        submission: json!({
            "Source": loaded.source,
            "Format": loaded.format,
            "VariableFlags": loaded.variable_flags,
            "Variables": loaded.variables,
        }),
    };
    let resp = ctx.client.put::<RegisterResponse>("/v1/jobs", &q, &body).await.map_err(|e| {
        let msg = match check_index {
            Some(i) if e.to_string().contains("modify index") => format!("Enforcing job modify index {i}: {e}"),
            _ => format!("Error submitting job: {e}"),
        };
        Failure::new(msg)
    })?;
    Ok(resp.value)
}

/// `job run -output`: the job as the register request carries it, `{"Job": ...}` indented four
/// spaces as Nomad prints it; `job run -json` reads it back.
pub fn output_json(job: &nomad_proto::Job) -> Result<String, Failure> {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    json!({ "Job": job }).serialize(&mut ser).map_err(|e| Failure::new(format!("Error converting job: {e}")))?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Runs `job run`.
pub async fn run(api: &ApiFlags, args: RunArgs) -> CmdResult {
    let loaded = load(&args.file)?;
    if args.output {
        println!("{}", output_json(&loaded.job)?);
        return Ok(exit::OK);
    }
    let ctx = Ctx::new(api)?;
    let resp = register(&ctx, &loaded, args.check_index).await?;
    if !resp.warnings.is_empty() {
        println!("{}", ctx.style.yellow(&format!("Job Warnings:\n{}\n", resp.warnings)));
    }
    if resp.eval_id.is_empty() {
        // Periodic and parameterized jobs get no eval until they launch.
        println!("Job registration successful");
        return Ok(exit::OK);
    }
    if args.detach {
        println!("Job registration successful");
        println!("Evaluation ID: {}", crate::cli::format::safe(&resp.eval_id));
        return Ok(exit::OK);
    }
    let job_id = loaded.job.id.clone();
    let opts = MonitorOptions { id_len: id_len(args.verbose), wait_for_allocs: true, live: stdout_is_live_terminal() };
    let mut monitor = Monitor::new(&ctx.client, opts, Box::new(std::io::stdout()));
    let interrupt = crate::cli::interrupted();
    let outcome = tokio::select! {
        r = monitor.run(&resp.eval_id) => r,
        _ = tokio::time::sleep(args.timeout) => {
            println!(
                "==> Timed out after {} waiting for job \"{job_id}\"; it stays submitted. Check it with `nomad-rs job status {job_id}`",
                humantime::format_duration(args.timeout)
            );
            Ok(exit::ERROR)
        }
        _ = interrupt => {
            println!("\n==> Monitoring interrupted; job \"{job_id}\" stays submitted. Check it with `nomad-rs job status {job_id}`");
            Ok(exit::INTERRUPTED)
        }
    };
    outcome
}
