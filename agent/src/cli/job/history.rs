//! `nomad-rs job history [-p] [-full] [-version N] [-json] <job>`: the job's tracked versions,
//! newest first, as Nomad's `job history` prints them.

use clap::Args;
use serde_json::Value;

use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{Style, format_time, json_text, kv};
use crate::cli::job::plan::format_job_diff;
use crate::cli::{CmdResult, Ctx, Failure, exit, prefix};

/// Flags of `job history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Show the diff of each version from the one before it.
    #[arg(short = 'p')]
    pub diff: bool,
    /// Show each version's full job.
    #[arg(long)]
    pub full: bool,
    /// Only this version.
    #[arg(long)]
    pub version: Option<String>,
    /// Print the versions as JSON.
    #[arg(long)]
    pub json: bool,
    /// Job ID or prefix.
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// Runs `job history`.
pub async fn run(api: &ApiFlags, args: HistoryArgs) -> CmdResult {
    if args.json && (args.diff || args.full) {
        return Err(Failure::new("-json and -t are exclusive with -p and -full"));
    }
    let version = match args.version.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => Some(v.parse::<u64>().map_err(|e| Failure::new(format!("Error parsing version value {v:?}: {e}")))?),
        None => None,
    };
    let ctx = Ctx::new(api)?;
    let job = prefix::job(&ctx, args.job.trim()).await?;
    let mut q = Query::new().param("namespace", job.namespace.clone());
    if args.diff {
        q = q.param("diffs", "true");
    }
    let resp: Value = ctx
        .client
        .get_json(&format!("/v1/job/{}/versions", encode_path(&job.id)), &q)
        .await
        .map_err(|e| Failure::new(format!("Error retrieving job versions: {e}")))?
        .value;
    let versions = resp.get("Versions").and_then(Value::as_array).cloned().unwrap_or_default();
    let diffs = resp.get("Diffs").and_then(Value::as_array).cloned().unwrap_or_default();
    if !diffs.is_empty() && versions.len() != diffs.len() + 1 {
        return Err(Failure::new(format!("Number of job versions {} doesn't match number of diffs {}", versions.len(), diffs.len())));
    }
    let shown: Vec<usize> = match version {
        Some(v) => {
            let i = versions.iter().position(|j| j.get("Version").and_then(Value::as_u64) == Some(v));
            let Some(i) = i else {
                if args.json {
                    println!("null");
                    return Ok(exit::OK);
                }
                return Err(Failure::new("Error printing job history for non-existing job or job version"));
            };
            vec![i]
        }
        None => (0..versions.len()).collect(),
    };
    if args.json {
        let out: Value = match version {
            Some(_) => versions[shown[0]].clone(),
            None => Value::Array(versions),
        };
        println!("{}", json_text(&out));
        return Ok(exit::OK);
    }
    let blocks: Vec<String> = shown.iter().map(|&i| format_version(&versions[i], diffs.get(i), args.full, &ctx.style)).collect();
    println!("{}", blocks.join("\n\n"));
    Ok(exit::OK)
}

/// One version: `Version`, `Stable`, `Submit Date`, then the diff and the full job if asked.
fn format_version(job: &Value, diff: Option<&Value>, full: bool, style: &Style) -> String {
    let mut out = kv(&[
        ("Version", job.get("Version").and_then(Value::as_u64).unwrap_or(0).to_string()),
        ("Stable", job.get("Stable").and_then(Value::as_bool).unwrap_or(false).to_string()),
        ("Submit Date", format_time(job.get("SubmitTime").and_then(Value::as_i64).unwrap_or(0))),
    ]);
    if let Some(d) = diff {
        out.push_str(&format!("\nDiff        =\n{}", format_job_diff(d, false, style).trim()));
    }
    if full {
        out.push_str(&format!("\nFull        = JSON Job:\n{}", json_text(job)));
    }
    out
}
