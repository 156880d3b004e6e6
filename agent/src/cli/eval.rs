//! `nomad-rs eval status [-json] [-verbose] <id prefix>`, `nomad-rs eval list` and
//! `nomad-rs eval delete [-filter <expr>] [-yes] [<id>]` (the eval broker must be paused first:
//! `operator scheduler set-config -pause-eval-broker=true`).

use clap::{Args, Subcommand};
use nomad_proto::{AllocListStub, Evaluation};

use super::api::{ApiFlags, Query, encode_path};
use super::format::{Style, go_duration, kv, limit, now_nanos, relative_time};
use super::{CmdResult, Ctx, Failure, exit, prefix, tables};

/// `nomad-rs eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The eval command.
    #[command(subcommand)]
    pub command: EvalCommand,
}

/// Eval commands.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Show an evaluation: status, placement failures, placed allocations.
    Status(StatusArgs),
    /// List evaluations (by job, status or filter expression; paged).
    List(ListArgs),
    /// Delete evaluations by ID or filter expression (the eval broker must be paused).
    Delete(DeleteArgs),
}

/// Flags of `eval delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Delete the evaluations this filter expression matches (asks first unless -yes).
    #[arg(long)]
    pub filter: Option<String>,
    /// Delete without asking.
    #[arg(long)]
    pub yes: bool,
    /// The evaluation's full ID.
    pub ids: Vec<String>,
}

/// Flags of `eval list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Only the evaluations of this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Only evaluations with this status.
    #[arg(long)]
    pub status: Option<String>,
    /// A filter expression on the evaluations.
    #[arg(long)]
    pub filter: Option<String>,
    /// How many per page (0: all).
    #[arg(long = "per-page", default_value_t = 0)]
    pub per_page: u32,
    /// Where the page starts (the token a previous page printed).
    #[arg(long = "page-token")]
    pub page_token: Option<String>,
}

/// Flags of `eval status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// Evaluation ID or prefix.
    #[arg(value_name = "EVAL")]
    pub eval: String,
}

/// Runs an eval command.
pub async fn run(a: EvalArgs) -> CmdResult {
    match a.command {
        EvalCommand::Status(s) => {
            let ctx = Ctx::new(&a.api)?;
            show(&ctx, &s.eval, s.verbose, s.json).await
        }
        EvalCommand::List(l) => {
            let ctx = Ctx::new(&a.api)?;
            list(&ctx, l).await
        }
        EvalCommand::Delete(d) => delete(&a.api, d).await,
    }
}

/// Deletes evaluations as Nomad's `eval delete` does: one by ID (no question), or those a
/// filter matches (after confirming their count unless `-yes`).
async fn delete(api: &ApiFlags, args: DeleteArgs) -> CmdResult {
    let filter = args.filter.clone().filter(|f| !f.is_empty());
    let invalid = |e: String| Failure::new(format!("Error validating command args and flags: {e}"));
    if filter.is_none() == args.ids.is_empty() {
        return Err(invalid("evaluation ID or filter flag required".into()));
    }
    if args.ids.len() > 1 {
        return Err(invalid(format!("expected 1 argument, got {}", args.ids.len())));
    }
    let ctx = Ctx::new(api)?;
    let config = super::scheduler_config::current(&ctx).await?;
    if config["PauseEvalBroker"].as_bool() != Some(true) {
        eprintln!("Eval broker is not paused");
        println!(
            r#"To delete evaluations you must first pause the eval broker by running "nomad-rs operator scheduler set-config -pause-eval-broker=true""#
        );
        println!(
            r#"After the deletion is complete, unpause the eval broker by running "nomad-rs operator scheduler set-config -pause-eval-broker=false""#
        );
        return Ok(exit::ERROR);
    }
    let (code, outcome) = match (args.ids.first(), filter) {
        (Some(id), _) => delete_by_id(&ctx, id).await,
        (None, Some(filter)) => delete_by_filter(&ctx, &filter, args.yes).await,
        (None, None) => return Err(invalid("evaluation ID or filter flag required".into())),
    };
    match outcome {
        Ok(n) if n > 0 => println!("Successfully deleted {n} {}", if n > 1 { "evaluations" } else { "evaluation" }),
        Ok(_) => println!("No evaluations were deleted"),
        Err(e) => eprintln!("Error deleting evaluations: {e}"),
    }
    Ok(code)
}

/// `DELETE /v1/evaluations` with `body`; the number deleted.
async fn delete_request(ctx: &Ctx, body: serde_json::Value) -> Result<u64, String> {
    let reply: serde_json::Value =
        ctx.client.write(http::Method::DELETE, "/v1/evaluations", &Query::new(), Some(&body)).await.map_err(|e| e.to_string())?.value;
    Ok(reply["Count"].as_u64().unwrap_or(0))
}

async fn delete_by_id(ctx: &Ctx, id: &str) -> (u8, Result<u64, String>) {
    let found = ctx.client.get::<serde_json::Value>(&format!("/v1/evaluation/{}", encode_path(id)), &Query::new()).await;
    if let Err(e) = found {
        return (exit::ERROR, Err(e.to_string()));
    }
    match delete_request(ctx, serde_json::json!({ "EvalIDs": [id] })).await {
        Ok(n) => (exit::OK, Ok(n)),
        Err(e) => (exit::ERROR, Err(e)),
    }
}

async fn delete_by_filter(ctx: &Ctx, filter: &str, yes: bool) -> (u8, Result<u64, String>) {
    if !yes {
        let matching = ctx.client.get::<Vec<serde_json::Value>>("/v1/evaluations", &Query::new().param("filter", filter)).await;
        let count = match matching {
            Ok(answer) => answer.value.len(),
            Err(e) => return (exit::ERROR, Err(e.to_string())),
        };
        let question = format!("Are you sure you want to delete {count} evals? [y/N] ");
        match super::ask_exact_yes(&question, "Cancelling eval deletion") {
            Ok(None) => println!(),
            Ok(Some(code)) => {
                println!();
                return (code, Ok(0));
            }
            Err(e) => return (exit::ERROR, Err(e.message)),
        }
    }
    match delete_request(ctx, serde_json::json!({ "Filter": filter })).await {
        Ok(n) => (exit::OK, Ok(n)),
        Err(e) => (exit::ERROR, Err(e)),
    }
}

/// Lists evaluations as Nomad's `eval list` does.
async fn list(ctx: &Ctx, args: ListArgs) -> CmdResult {
    let mut q = Query::new();
    for (key, value) in [("job", &args.job), ("status", &args.status), ("filter", &args.filter), ("next_token", &args.page_token)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            q = q.param(key, v);
        }
    }
    if args.per_page > 0 {
        q = q.param("per_page", args.per_page.to_string());
    }
    let (answer, next) = ctx
        .client
        .get_page::<Vec<serde_json::Value>>("/v1/evaluations", &q)
        .await
        .map_err(|e| Failure::new(format!("Error querying evaluations: {e}")))?;
    let evals = answer.value;
    if args.json {
        println!("{}", super::format::json_text(&evals));
        return Ok(exit::OK);
    }
    if evals.is_empty() {
        println!("No evals found");
        return Ok(exit::OK);
    }
    let len = super::format::id_len(args.verbose);
    let text = |e: &serde_json::Value, k: &str| e.get(k).and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
    let rows = evals
        .iter()
        .map(|e| {
            let failures = match e.get("FailedTGAllocs") {
                _ if text(e, "Status") == "blocked" => "N/A - In Progress".to_string(),
                Some(serde_json::Value::Object(m)) if !m.is_empty() => "true".to_string(),
                _ => "false".to_string(),
            };
            vec![
                limit(&text(e, "ID"), len).into_owned(),
                e.get("Priority").and_then(serde_json::Value::as_i64).unwrap_or(0).to_string(),
                text(e, "TriggeredBy"),
                text(e, "JobID"),
                text(e, "Namespace"),
                limit(&text(e, "NodeID"), len).into_owned(),
                text(e, "Status"),
                failures,
            ]
        })
        .collect();
    let header = ["ID", "Priority", "Triggered By", "Job ID", "Namespace", "Node ID", "Status", "Placement Failures"];
    println!("{}", super::format::table_with_header(&header, rows));
    if !next.is_empty() {
        let mut argv: Vec<String> = Vec::new();
        let mut it = std::env::args().peekable();
        while let Some(a) = it.next() {
            if a.trim_start_matches('-').starts_with("page-token") {
                if !a.contains('=') {
                    it.next();
                }
                continue;
            }
            argv.push(a);
        }
        println!("\nResults have been paginated. To get the next page run:\n{} -page-token {next}", argv.join(" "));
    }
    Ok(exit::OK)
}

/// Shows one evaluation (also `nomad-rs status <eval prefix>`).
pub async fn show(ctx: &Ctx, id_prefix: &str, verbose: bool, json: bool) -> CmdResult {
    let eval = prefix::eval(ctx, id_prefix).await?;
    let path = format!("/v1/evaluation/{}", encode_path(&eval.id));
    if json {
        return ctx.print_json(&path, &Query::new(), "Error querying evaluation").await;
    }
    let allocs = ctx
        .client
        .get::<Vec<AllocListStub>>(&format!("{path}/allocations"), &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error querying eval allocations: {e}")))?
        .value;
    println!("{}", render(&eval, &allocs, verbose, now_nanos(), &ctx.style));
    Ok(exit::OK)
}

/// The whole `eval status` output.
pub fn render(e: &Evaluation, allocs: &[AllocListStub], verbose: bool, now: i64, style: &Style) -> String {
    let len = if verbose { usize::MAX } else { 8 };
    let opt = |s: &str| if s.is_empty() { "<none>".to_string() } else { limit(s, len).to_string() };
    let mut pairs = vec![
        ("ID", limit(&e.id, len).to_string()),
        ("Create Time", relative_time(e.create_time, now)),
        ("Modify Time", relative_time(e.modify_time, now)),
        ("Status", e.status.as_str().to_string()),
        ("Status Description", if e.status_description.is_empty() { e.status.as_str().to_string() } else { e.status_description.clone() }),
        ("Type", e.eval_type.as_str().to_string()),
        ("TriggeredBy", e.triggered_by.clone()),
    ];
    if !e.job_id.is_empty() {
        pairs.push(("Job ID", e.job_id.clone()));
    }
    if !e.node_id.is_empty() {
        pairs.push(("Node ID", limit(&e.node_id, len).to_string()));
    }
    if !e.deployment_id.is_empty() {
        pairs.push(("Deployment ID", limit(&e.deployment_id, len).to_string()));
    }
    pairs.extend([
        ("Namespace", e.namespace.clone()),
        ("Priority", e.priority.to_string()),
        ("Placement Failures", tables::eval_failures(e)),
        ("Previous Eval", opt(&e.previous_eval)),
        ("Next Eval", opt(&e.next_eval)),
        ("Blocked Eval", opt(&e.blocked_eval)),
    ]);
    if e.wait > 0 {
        pairs.push(("Wait", go_duration(e.wait)));
    }
    let mut out = vec![kv(&pairs)];
    if !e.failed_tg_allocs.is_empty() {
        out.push(style.section("Failed Placements"));
        let mut lines = Vec::new();
        for (group, m) in &e.failed_tg_allocs {
            lines.extend(tables::failed_group(group, m, ""));
        }
        if !e.blocked_eval.is_empty() {
            lines.push(format!("\nEvaluation {:?} waiting for additional capacity to place remainder", limit(&e.blocked_eval, len)));
        }
        out.push(lines.join("\n"));
    }
    if !allocs.is_empty() {
        out.push(style.section("Placed Allocations"));
        out.push(tables::allocs(allocs, len, verbose, now));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use nomad_proto::{AllocMetric, EvalStatus};

    use super::*;

    #[test]
    fn failures_are_listed_under_the_eval() {
        let mut e = Evaluation {
            id: "e1e1e1e1-2222".into(),
            job_id: "web".into(),
            status: EvalStatus::Complete,
            blocked_eval: "b1b1b1b1-3".into(),
            ..Evaluation::default()
        };
        let mut m = AllocMetric { nodes_evaluated: 1, ..AllocMetric::default() };
        m.dimension_exhausted.insert("memory".into(), 1);
        e.failed_tg_allocs.insert("g".into(), m);
        let out = render(&e, &[], false, 0, &Style::plain());
        assert!(out.starts_with("ID                 = e1e1e1e1\n"), "{out}");
        assert!(out.contains("Placement Failures = true"));
        assert!(out.contains("Blocked Eval       = b1b1b1b1"));
        assert!(
            out.contains(
                "\nFailed Placements\nTask Group \"g\" (failed to place 1 allocation):\n  * Dimension \"memory\" exhausted on 1 nodes"
            ),
            "{out}"
        );
        assert!(!out.contains("Placed Allocations"));
    }
}
