//! `nomad-rs deployment list|status|fail|pause|resume|promote` (Nomad's `command/deployment_*.go`).

use clap::{Args, Subcommand};
use nomad_proto::Deployment;
use serde::Deserialize;

use super::api::{ApiFlags, Query, encode_path};
use super::format::{format_time, json_text, kv, limit, safe, table_with_header};
use super::monitor::follow_eval;
use super::{CmdResult, Ctx, Failure, exit};

/// `nomad-rs deployment`.
#[derive(Debug, Args)]
pub struct DeploymentArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The deployment command.
    #[command(subcommand)]
    pub command: DeploymentCommand,
}

/// Deployment commands.
#[derive(Debug, Subcommand)]
pub enum DeploymentCommand {
    /// List deployments.
    List(ListArgs),
    /// Show a deployment's status and its groups' progress.
    Status(StatusArgs),
    /// Mark a deployment failed.
    Fail(WriteArgs),
    /// Pause a deployment.
    Pause(IdArgs),
    /// Resume a paused deployment.
    Resume(WriteArgs),
    /// Promote a deployment's canaries.
    Promote(PromoteArgs),
}

/// Flags of `deployment list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
}

/// Flags of `deployment status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// The deployment, by ID or prefix.
    #[arg(value_name = "DEPLOYMENT")]
    pub id: String,
}

/// A deployment by ID or prefix.
#[derive(Debug, Args)]
pub struct IdArgs {
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// The deployment, by ID or prefix.
    #[arg(value_name = "DEPLOYMENT")]
    pub id: String,
}

/// Flags of the writes that evaluate the job afterwards.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Return right after the change, printing the evaluation ID.
    #[arg(long)]
    pub detach: bool,
    /// Show full IDs.
    #[arg(long)]
    pub verbose: bool,
    /// The deployment, by ID or prefix.
    #[arg(value_name = "DEPLOYMENT")]
    pub id: String,
}

/// Flags of `deployment promote`.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// Promote only these groups' canaries (repeatable).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// The write and the deployment.
    #[command(flatten)]
    pub write: WriteArgs,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "PascalCase")]
struct UpdateResponse {
    #[serde(rename = "EvalID")]
    eval_id: String,
    reverted_job_version: Option<u64>,
}

/// Runs a deployment command.
pub async fn run(a: DeploymentArgs) -> CmdResult {
    let ctx = Ctx::new(&a.api)?;
    match a.command {
        DeploymentCommand::List(l) => list(&ctx, l).await,
        DeploymentCommand::Status(s) => status(&ctx, s).await,
        DeploymentCommand::Fail(w) => {
            let d = find(&ctx, &w.id, w.verbose).await?;
            let u = write(&ctx, &d, "fail", serde_json::json!({"DeploymentID": d.id}), "Error failing deployment").await?;
            match u.reverted_job_version {
                Some(v) => println!("Deployment {:?} failed. Auto-reverted to job version {v}.", d.id),
                None => println!("Deployment {:?} failed", d.id),
            }
            follow(&ctx, &u, &w).await
        }
        DeploymentCommand::Pause(p) => {
            let d = find(&ctx, &p.id, p.verbose).await?;
            write(&ctx, &d, "pause", serde_json::json!({"DeploymentID": d.id, "Pause": true}), "Error pausing deployment").await?;
            println!("Deployment {:?} paused", d.id);
            Ok(exit::OK)
        }
        DeploymentCommand::Resume(w) => {
            let d = find(&ctx, &w.id, w.verbose).await?;
            let u =
                write(&ctx, &d, "pause", serde_json::json!({"DeploymentID": d.id, "Pause": false}), "Error resuming deployment").await?;
            println!("Deployment {:?} resumed", d.id);
            follow(&ctx, &u, &w).await
        }
        DeploymentCommand::Promote(p) => {
            let d = find(&ctx, &p.write.id, p.write.verbose).await?;
            let body = serde_json::json!({"DeploymentID": d.id, "All": p.groups.is_empty(), "Groups": p.groups});
            let u = write(&ctx, &d, "promote", body, "Error promoting deployment").await?;
            follow(&ctx, &u, &p.write).await
        }
    }
}

/// An eval a write created: its ID with `-detach`, else followed as `job run` does.
async fn follow(ctx: &Ctx, u: &UpdateResponse, w: &WriteArgs) -> CmdResult {
    if u.eval_id.is_empty() {
        return Ok(exit::OK);
    }
    if w.detach {
        println!("Evaluation ID: {}", safe(&u.eval_id));
        return Ok(exit::OK);
    }
    println!();
    follow_eval(&ctx.client, &u.eval_id, w.verbose, "the evaluation").await
}

async fn write(ctx: &Ctx, d: &Deployment, action: &str, body: serde_json::Value, what: &str) -> Result<UpdateResponse, Failure> {
    let q = Query::new().param("namespace", d.namespace.clone());
    Ok(ctx
        .client
        .put(&format!("/v1/deployment/{action}/{}", encode_path(&d.id)), &q, &body)
        .await
        .map_err(|e| Failure::new(format!("{what}: {e}")))?
        .value)
}

/// The deployment an ID or prefix names (Nomad's `getDeployment`: dashes ignored, an odd
/// prefix shortened by one).
async fn find(ctx: &Ctx, id: &str, verbose: bool) -> Result<Deployment, Failure> {
    let retrieving = |e: String| Failure::new(format!("Error retrieving deployment: {e}"));
    if id.len() == 36 {
        return Ok(ctx
            .client
            .get::<Deployment>(&format!("/v1/deployment/{}", encode_path(id)), &Query::new())
            .await
            .map_err(|e| retrieving(e.to_string()))?
            .value);
    }
    let mut prefix: String = id.chars().filter(|c| *c != '-').collect();
    if prefix.chars().count() == 1 {
        return Err(retrieving("Identifier must contain at least two characters.".into()));
    }
    if prefix.len() % 2 == 1 {
        prefix.pop();
    }
    let list: Vec<Deployment> = ctx
        .client
        .get("/v1/deployments", &Query::new().prefix(&prefix).param("namespace", "*"))
        .await
        .map_err(|e| retrieving(e.to_string()))?
        .value;
    match list.len() {
        0 => Err(retrieving(format!("Deployment ID {prefix:?} matched no deployments"))),
        1 => Ok(list.into_iter().next().expect("one")),
        _ => Err(Failure::new(format!("Prefix matched multiple deployments\n\n{}", format_list(&list, verbose)))),
    }
}

fn format_list(list: &[Deployment], verbose: bool) -> String {
    if list.is_empty() {
        return "No deployments found".into();
    }
    let len = if verbose { 36 } else { 8 };
    let rows = list
        .iter()
        .map(|d| {
            vec![
                limit(&d.id, len).into_owned(),
                d.job_id.clone(),
                d.job_version.to_string(),
                d.status.clone(),
                d.status_description.clone(),
            ]
        })
        .collect();
    table_with_header(&["ID", "Job ID", "Job Version", "Status", "Description"], rows)
}

async fn list(ctx: &Ctx, args: ListArgs) -> CmdResult {
    let list: Vec<Deployment> = ctx
        .client
        .get("/v1/deployments", &Query::new())
        .await
        .map_err(|e| Failure::new(format!("Error retrieving deployments: {e}")))?
        .value;
    print_list(&list, args.json, args.verbose)
}

/// Prints deployments as the API's JSON or as Nomad's table.
pub(crate) fn print_list(list: &[Deployment], json: bool, verbose: bool) -> CmdResult {
    if json {
        println!("{}", json_text(&list));
    } else {
        println!("{}", format_list(list, verbose));
    }
    Ok(exit::OK)
}

async fn status(ctx: &Ctx, args: StatusArgs) -> CmdResult {
    let d = find(ctx, &args.id, args.verbose).await?;
    if args.json {
        println!("{}", json_text(&d));
    } else {
        println!("{}", format_deployment(&d, args.verbose));
    }
    Ok(exit::OK)
}

/// Nomad's `formatDeployment`: the key/values, then the "Deployed" table with the optional
/// columns only when some group uses them.
pub fn format_deployment(d: &Deployment, verbose: bool) -> String {
    let len = if verbose { 36 } else { 8 };
    let mut out = kv(&[
        ("ID", limit(&d.id, len).into_owned()),
        ("Job ID", d.job_id.clone()),
        ("Job Version", d.job_version.to_string()),
        ("Status", d.status.clone()),
        ("Description", d.status_description.clone()),
    ]);
    if d.task_groups.is_empty() {
        return out;
    }
    let auto_revert = d.task_groups.values().any(|g| g.auto_revert);
    let canaries = d.task_groups.values().any(|g| g.desired_canaries > 0);
    let deadline = d.task_groups.values().any(|g| g.progress_deadline != 0);
    let mut header = vec!["Task Group"];
    if auto_revert {
        header.push("Auto Revert");
    }
    if canaries {
        header.push("Promoted");
    }
    header.push("Desired");
    if canaries {
        header.push("Canaries");
    }
    header.extend(["Placed", "Healthy", "Unhealthy"]);
    if deadline {
        header.push("Progress Deadline");
    }
    let rows = d
        .task_groups
        .iter()
        .map(|(name, g)| {
            let mut row = vec![name.clone()];
            if auto_revert {
                row.push(g.auto_revert.to_string());
            }
            if canaries {
                row.push(if g.desired_canaries > 0 { g.promoted.to_string() } else { "N/A".into() });
            }
            row.push(g.desired_total.to_string());
            if canaries {
                row.push(g.desired_canaries.to_string());
            }
            row.extend([g.placed_allocs.to_string(), g.healthy_allocs.to_string(), g.unhealthy_allocs.to_string()]);
            if deadline {
                row.push(if g.require_progress_by.is_zero() { "N/A".into() } else { format_time(g.require_progress_by.unix_nanos()) });
            }
            row
        })
        .collect();
    out.push_str("\n\nDeployed\n");
    out.push_str(&table_with_header(&header, rows));
    out
}

#[cfg(test)]
mod tests {
    use nomad_proto::DeploymentState;

    use super::*;

    #[test]
    fn status_shows_the_optional_columns_only_when_used() {
        let mut d = Deployment { id: "0123456789abcdef".into(), job_id: "web".into(), job_version: 2, ..Deployment::default() };
        d.status = "running".into();
        d.status_description = "Deployment is running".into();
        d.task_groups
            .insert("g".into(), DeploymentState { desired_total: 3, placed_allocs: 2, healthy_allocs: 1, ..DeploymentState::default() });
        let out = format_deployment(&d, false);
        assert!(out.starts_with("ID          = 01234567\nJob ID      = web\nJob Version = 2\n"), "{out}");
        assert!(
            out.ends_with("Deployed\nTask Group  Desired  Placed  Healthy  Unhealthy\ng           3        2       1        0"),
            "{out}"
        );
        d.task_groups.get_mut("g").unwrap().progress_deadline = 600_000_000_000;
        assert!(
            format_deployment(&d, false).contains("Unhealthy  Progress Deadline\ng           3        2       1        0          N/A")
        );
        assert_eq!(format_list(&[], false), "No deployments found");
    }
}
