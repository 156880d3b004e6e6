//! `nomad-rs job plan [-diff] <file>`: a scheduler dry run
//! (`PUT /v1/job/<id>/plan`) showing the diff against the registered job,
//! what would be placed, and why placements would fail.
//!
//! Exit codes are Nomad's: 0 when no allocations would be created or
//! destroyed, 1 when some would, 255 on error.

use std::collections::BTreeMap;

use clap::Args;
use nomad_proto::AllocMetric;
use nomad_proto::plan::DesiredUpdates;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{JobFileArgs, load};
use crate::cli::api::{ApiFlags, Query, encode_path};
use crate::cli::format::{Style, go_duration, safe};
use crate::cli::{CmdResult, Ctx, Failure, exit, tables};

/// Flags of `job plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Show the diff against the registered job (`-diff=false` hides it).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub diff: bool,
    /// Show unchanged fields too.
    #[arg(long)]
    pub verbose: bool,
    /// The job file and its variables.
    #[command(flatten)]
    pub file: JobFileArgs,
}

/// What the plan endpoint answers.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct PlanResponse {
    /// Per-group counts.
    pub annotations: Option<Annotations>,
    /// Failed placements per group.
    #[serde(rename = "FailedTGAllocs")]
    pub failed_tg_allocs: BTreeMap<String, AllocMetric>,
    /// Index to pass to `job run -check-index`.
    pub job_modify_index: u64,
    /// Evals the plan would create (rolling updates).
    pub created_evals: Option<Vec<Value>>,
    /// The structured diff.
    pub diff: Option<Value>,
    /// Warnings.
    pub warnings: String,
}

/// `Annotations` of a plan.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
pub struct Annotations {
    /// Per group.
    #[serde(rename = "DesiredTGUpdates")]
    pub desired_tg_updates: BTreeMap<String, DesiredUpdates>,
    /// Allocations that would be preempted.
    pub preempted_allocs: Option<Vec<Value>>,
}

/// Runs `job plan`.
pub async fn run(api: &ApiFlags, args: PlanArgs) -> CmdResult {
    let loaded = load(&args.file).map_err(|f| f.code(exit::PLAN_ERROR))?;
    let ctx = Ctx::new(api).map_err(|f| f.code(exit::PLAN_ERROR))?;
    let job = &loaded.job;
    let mut q = Query::new();
    if !job.namespace.is_empty() {
        q = q.param("namespace", job.namespace.clone());
    }
    if !job.region.is_empty() {
        q = q.param("region", job.region.clone());
    }
    let path = format!("/v1/job/{}/plan", encode_path(&job.id));
    let body = json!({ "Job": job, "Diff": true, "PolicyOverride": false });
    let resp = ctx.client.put::<PlanResponse>(&path, &q, &body).await.map_err(|e| {
        let msg = if e.is_unsupported_route() {
            format!("Error during plan: this server does not support job plans yet (PUT {path}: {e}); upgrade the nomad-rs servers")
        } else {
            format!("Error during plan: {e}")
        };
        Failure::new(msg).code(exit::PLAN_ERROR)
    })?;
    let resp = resp.value;
    let style = ctx.style;
    if args.diff
        && let Some(d) = &resp.diff
    {
        println!("{}\n", format_job_diff(d, args.verbose, &style).trim_end());
    }
    println!("{}", style.bold("Scheduler dry-run:"));
    println!("{}", dry_run(&resp, job.job_type == nomad_proto::JobType::System, &style));
    println!();
    if !resp.warnings.is_empty() {
        println!("{}", style.yellow(&format!("Job Warnings:\n{}\n", resp.warnings)));
    }
    if let Some(pre) = resp.annotations.as_ref().and_then(|a| a.preempted_allocs.as_ref()).filter(|p| !p.is_empty()) {
        println!("{}", style.yellow("Preemptions:"));
        for a in pre {
            println!("  {} (job {}, group {})", safe(str_of(a, "ID")), safe(str_of(a, "JobID")), safe(str_of(a, "TaskGroup")));
        }
        println!();
    }
    let mut run_args = String::new();
    for v in &args.file.vars {
        run_args.push_str(&format!("-var={v:?} "));
    }
    for f in &args.file.var_files {
        run_args.push_str(&format!("-var-file={f:?} "));
    }
    if let Some(ns) = &ctx.client.config().namespace {
        run_args.push_str(&format!("-namespace={ns:?} "));
    }
    println!("{}", style.bold(&format!("Job Modify Index: {}", resp.job_modify_index)));
    println!(
        "To submit the job with version verification run:\n\nnomad-rs job run -check-index {} {run_args}{}\n\n\
         When running the job with the check-index flag, the job will only be run if the\n\
         job modify index given matches the server-side version. If the index has\n\
         changed, another user has modified the job and the plan's results are\n\
         potentially invalid.",
        resp.job_modify_index, args.file.file
    );
    Ok(exit_code(&resp))
}

/// 0 when nothing would be created or destroyed, 1 otherwise (Nomad's rule).
pub fn exit_code(resp: &PlanResponse) -> u8 {
    if resp.diff.as_ref().is_some_and(|d| str_of(d, "Type") == "None") {
        return exit::OK;
    }
    let changes = resp
        .annotations
        .as_ref()
        .is_some_and(|a| a.desired_tg_updates.values().any(|d| d.stop + d.place + d.migrate + d.destructive_update + d.canary > 0));
    if changes { exit::PLAN_CHANGES } else { exit::OK }
}

/// The "Scheduler dry-run" block.
pub fn dry_run(resp: &PlanResponse, system: bool, style: &Style) -> String {
    let mut out = Vec::new();
    if resp.failed_tg_allocs.is_empty() {
        out.push(style.green("- All tasks successfully allocated."));
    } else {
        let what =
            if system { "- WARNING: Failed to place allocations on all nodes." } else { "- WARNING: Failed to place all allocations." };
        out.push(style.yellow(what));
        for (group, m) in &resp.failed_tg_allocs {
            for l in tables::failed_group(group, m, "  ") {
                out.push(style.yellow(&l));
            }
        }
    }
    for e in resp.created_evals.iter().flatten() {
        if str_of(e, "TriggeredBy") == "rolling-update" {
            let wait = e.get("Wait").and_then(Value::as_i64).unwrap_or(0);
            out.push(style.green(&format!("- Rolling update, next evaluation will be in {}.", go_duration(wait))));
        }
    }
    out.join("\n")
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn marker(kind: &str) -> &'static str {
    match kind {
        "Added" => "+",
        "Deleted" => "-",
        "Edited" => "+/-",
        _ => "",
    }
}

fn colored(kind: &str, s: &str, style: &Style) -> String {
    match kind {
        "Added" => style.green(s),
        "Deleted" => style.red(s),
        "Edited" => style.yellow(s),
        _ => s.to_string(),
    }
}

fn annotations(v: &Value) -> String {
    let list: Vec<&str> = v.get("Annotations").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    if list.is_empty() { String::new() } else { format!(" ({})", list.join(", ")) }
}

fn field_line(f: &Value, indent: usize, style: &Style) -> String {
    let kind = str_of(f, "Type");
    let name = safe(str_of(f, "Name"));
    let (old, new) = (str_of(f, "Old"), str_of(f, "New"));
    let pad = " ".repeat(indent);
    let body = match kind {
        "Added" => format!("{name}: {new:?}"),
        "Deleted" => format!("{name}: {old:?}"),
        "Edited" => format!("{name}: {old:?} => {new:?}"),
        _ => format!("{name}: {new:?}"),
    };
    let m = marker(kind);
    let prefix = if m.is_empty() { String::new() } else { format!("{} ", colored(kind, m, style)) };
    format!("{pad}{prefix}{body}{}", annotations(f))
}

fn fields_and_objects(v: &Value, indent: usize, verbose: bool, style: &Style, out: &mut Vec<String>) {
    for f in v.get("Fields").and_then(Value::as_array).into_iter().flatten() {
        if str_of(f, "Type") == "None" && !verbose {
            continue;
        }
        out.push(field_line(f, indent, style));
    }
    for o in v.get("Objects").and_then(Value::as_array).into_iter().flatten() {
        let kind = str_of(o, "Type");
        if kind == "None" && !verbose {
            continue;
        }
        let m = marker(kind);
        let prefix = if m.is_empty() { String::new() } else { format!("{} ", colored(kind, m, style)) };
        out.push(format!("{}{prefix}{} {{", " ".repeat(indent), safe(str_of(o, "Name"))));
        fields_and_objects(o, indent + 2, verbose, style, out);
        out.push(format!("{}}}", " ".repeat(indent + 2)));
    }
}

/// The job diff, annotated like Nomad's (`+/- Task Group: "web" (1 create)`).
pub fn format_job_diff(d: &Value, verbose: bool, style: &Style) -> String {
    let mut out = Vec::new();
    let kind = str_of(d, "Type");
    let m = marker(kind);
    let prefix = if m.is_empty() { String::new() } else { format!("{} ", colored(kind, m, style)) };
    out.push(style.bold(&format!("{prefix}Job: {:?}", str_of(d, "ID"))));
    if kind == "Edited" || verbose {
        fields_and_objects(d, 0, verbose, style, &mut out);
    }
    for tg in d.get("TaskGroups").and_then(Value::as_array).into_iter().flatten() {
        let k = str_of(tg, "Type");
        let mut updates: Vec<String> = tg
            .get("Updates")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(name, n)| n.as_u64().filter(|n| *n > 0).map(|n| format!("{n} {name}")))
            .collect();
        updates.sort();
        let counts = if updates.is_empty() { String::new() } else { format!(" ({})", updates.join(", ")) };
        let m = marker(k);
        let prefix = if m.is_empty() { String::new() } else { format!("{} ", colored(k, m, style)) };
        out.push(style.bold(&format!("{prefix}Task Group: {:?}{counts}", str_of(tg, "Name"))));
        if k == "Edited" || verbose {
            fields_and_objects(tg, 2, verbose, style, &mut out);
        }
        for t in tg.get("Tasks").and_then(Value::as_array).into_iter().flatten() {
            let tk = str_of(t, "Type");
            if tk == "None" && !verbose {
                continue;
            }
            let m = marker(tk);
            let prefix = if m.is_empty() { String::new() } else { format!("{} ", colored(tk, m, style)) };
            out.push(style.bold(&format!("  {prefix}Task: {:?}{}", str_of(t, "Name"), annotations(t))));
            if tk == "Edited" || verbose {
                fields_and_objects(t, 4, verbose, style, &mut out);
            }
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diff() -> Value {
        json!({
            "Type": "Edited", "ID": "web",
            "Fields": [{"Type": "None", "Name": "Priority", "Old": "50", "New": "50"}],
            "Objects": null,
            "TaskGroups": [{
                "Type": "Edited", "Name": "g",
                "Updates": {"create/destroy update": 1, "ignore": 0},
                "Fields": [{"Type": "Edited", "Name": "Count", "Old": "1", "New": "3", "Annotations": null}],
                "Objects": [],
                "Tasks": [{
                    "Type": "Edited", "Name": "server", "Annotations": ["forces create/destroy update"],
                    "Fields": [{"Type": "Edited", "Name": "Driver", "Old": "exec", "New": "raw_exec"}],
                    "Objects": [{"Type": "Added", "Name": "Env", "Fields": [{"Type": "Added", "Name": "A", "Old": "", "New": "1"}]}]
                }]
            }]
        })
    }

    #[test]
    fn the_diff_names_groups_tasks_and_changed_fields() {
        let out = format_job_diff(&diff(), false, &Style::plain());
        assert_eq!(
            out,
            [
                "+/- Job: \"web\"",
                "+/- Task Group: \"g\" (1 create/destroy update)",
                "  +/- Count: \"1\" => \"3\"",
                "  +/- Task: \"server\" (forces create/destroy update)",
                "    +/- Driver: \"exec\" => \"raw_exec\"",
                "    + Env {",
                "      + A: \"1\"",
                "      }",
            ]
            .join("\n")
        );
        assert!(format_job_diff(&diff(), true, &Style::plain()).contains("Priority: \"50\""), "verbose shows unchanged fields");
    }

    #[test]
    fn exit_codes_follow_nomad() {
        let mut r = PlanResponse { diff: Some(json!({"Type": "None"})), ..PlanResponse::default() };
        assert_eq!(exit_code(&r), 0);
        r.diff = Some(diff());
        let mut a = Annotations::default();
        a.desired_tg_updates.insert("g".into(), DesiredUpdates { ignore: 2, ..DesiredUpdates::default() });
        r.annotations = Some(a);
        assert_eq!(exit_code(&r), 0, "in-place changes create and destroy nothing");
        r.annotations.as_mut().unwrap().desired_tg_updates.insert("h".into(), DesiredUpdates { place: 1, ..DesiredUpdates::default() });
        assert_eq!(exit_code(&r), 1);
    }

    #[test]
    fn the_dry_run_names_failed_placements() {
        let mut m = AllocMetric { nodes_evaluated: 2, ..AllocMetric::default() };
        m.constraint_filtered.insert("${attr.kernel.name} = windows".into(), 2);
        let r = PlanResponse { failed_tg_allocs: BTreeMap::from([("g".to_string(), m)]), ..PlanResponse::default() };
        let out = dry_run(&r, false, &Style::plain());
        assert!(out.starts_with("- WARNING: Failed to place all allocations."), "{out}");
        assert!(out.contains("  Task Group \"g\" (failed to place 1 allocation):"));
        assert!(out.contains("Constraint \"${attr.kernel.name} = windows\": 2 nodes excluded by filter"));
        assert_eq!(dry_run(&PlanResponse::default(), false, &Style::plain()), "- All tasks successfully allocated.");
    }
}
