//! `nomad-rs job ...`: run, status, stop, plan, inspect, validate, init, eval, history, revert,
//! dispatch, periodic force, scale, scaling-events, promote, deployments.

pub mod deployments;
pub mod dispatch;
pub mod eval;
pub mod history;
pub mod init;
pub mod inspect;
pub mod periodic;
pub mod plan;
pub mod revert;
pub mod run;
pub mod scale;
pub mod status;
pub mod stop;
pub mod validate;

use std::collections::BTreeMap;
use std::io::Read;

use clap::{Args, Subcommand};
use nomad_proto::Job;
use nomad_proto::jobspec::{ParseOptions, parse};

use super::api::ApiFlags;
use super::{CmdResult, Failure};

/// `nomad-rs job`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The job command.
    #[command(subcommand)]
    pub command: JobCommand,
}

/// Job commands.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job file and follow its evaluation and allocations.
    Run(run::RunArgs),
    /// List jobs, or show one job's summary and allocations.
    Status(status::StatusArgs),
    /// Stop a running job.
    Stop(stop::StopArgs),
    /// Dry-run a job file: show what the scheduler would do.
    Plan(plan::PlanArgs),
    /// Print a registered job as JSON.
    Inspect(inspect::InspectArgs),
    /// Check a job file without submitting it.
    Validate(validate::ValidateArgs),
    /// Write an example job file to start from.
    Init(init::InitArgs),
    /// Create a new evaluation for a job (`-force-reschedule`: reschedule its failed allocs now).
    Eval(eval::EvalArgs),
    /// Show a job's tracked versions (`-p`: with the diff of each).
    History(history::HistoryArgs),
    /// Register an earlier version of a job again.
    Revert(revert::RevertArgs),
    /// Dispatch a child of a parameterized job, with a payload and meta.
    Dispatch(dispatch::DispatchArgs),
    /// Periodic job commands.
    #[command(subcommand)]
    Periodic(periodic::PeriodicCommand),
    /// Set a group's count (within its scaling policy) and follow the evaluation.
    Scale(scale::ScaleArgs),
    /// List a job's scaling events, newest first.
    #[command(name = "scaling-events")]
    ScalingEvents(scale::ScalingEventsArgs),
    /// Promote the canaries of the job's newest deployment and follow the evaluation.
    Promote(deployments::PromoteArgs),
    /// List a job's deployments (`-latest`: the newest, in full).
    Deployments(deployments::DeploymentsArgs),
}

/// Runs a job command.
pub async fn run(a: JobArgs) -> CmdResult {
    match a.command {
        JobCommand::Run(r) => run::run(&a.api, r).await,
        JobCommand::Status(s) => status::run(&a.api, s).await,
        JobCommand::Stop(s) => stop::run(&a.api, s).await,
        JobCommand::Plan(p) => plan::run(&a.api, p).await,
        JobCommand::Inspect(i) => inspect::run(&a.api, i).await,
        JobCommand::Validate(v) => validate::run(v),
        JobCommand::Init(i) => init::run(&a.api, i).await,
        JobCommand::Eval(e) => eval::run(&a.api, e).await,
        JobCommand::History(h) => history::run(&a.api, h).await,
        JobCommand::Revert(r) => revert::run(&a.api, r).await,
        JobCommand::Scale(s) => scale::run(&a.api, s).await,
        JobCommand::ScalingEvents(e) => scale::run_events(&a.api, e).await,
        JobCommand::Dispatch(d) => dispatch::run(&a.api, d).await,
        JobCommand::Periodic(p) => periodic::run(&a.api, p).await,
        JobCommand::Promote(p) => deployments::promote(&a.api, p).await,
        JobCommand::Deployments(d) => deployments::deployments(&a.api, d).await,
    }
}

/// Flags that say how to read a job file.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct JobFileArgs {
    /// Set an HCL2 variable (`-var 'name=value'`, repeatable).
    #[arg(long = "var", value_name = "KEY=VALUE")]
    pub vars: Vec<String>,
    /// A file of HCL2 variable values (repeatable).
    #[arg(long = "var-file", value_name = "PATH")]
    pub var_files: Vec<String>,
    /// Read the job file as JSON: `{"Job": {...}}` as `job inspect` and `job run -output` print
    /// it, or the job object alone. A file whose first character is `{` is read as JSON anyway.
    #[arg(long)]
    pub json: bool,
    /// The job file, or `-` for stdin.
    #[arg(value_name = "FILE")]
    pub file: String,
}

/// A job read from a file, with what is needed to describe its submission.
#[derive(Debug, Clone)]
pub struct LoadedJob {
    /// The parsed job.
    pub job: Job,
    /// The file's text.
    pub source: String,
    /// The `-var` values as given.
    pub variable_flags: BTreeMap<String, String>,
    /// The variable files' contents, concatenated.
    pub variables: String,
    /// How the file was written: `hcl2` or `json` (the submission's `Format`).
    pub format: &'static str,
}

/// Parses `-var` values; `NOMAD_VAR_<name>` environment variables come first and flags win.
pub fn collect_vars(flags: &[String], env: impl IntoIterator<Item = (String, String)>) -> Result<BTreeMap<String, String>, Failure> {
    let mut vars = BTreeMap::new();
    for (k, v) in env {
        if let Some(name) = k.strip_prefix("NOMAD_VAR_")
            && !name.is_empty()
        {
            vars.insert(name.to_string(), v);
        }
    }
    for f in flags {
        let Some((k, v)) = f.split_once('=') else {
            return Err(Failure::new(format!("Error parsing -var {f:?}: expected KEY=VALUE")));
        };
        if k.trim().is_empty() {
            return Err(Failure::new(format!("Error parsing -var {f:?}: the name is empty")));
        }
        vars.insert(k.trim().to_string(), v.to_string());
    }
    Ok(vars)
}

/// Reads the job file (or stdin for `-`) and parses it. Errors say `file:line:col: message`.
pub fn load(args: &JobFileArgs) -> Result<LoadedJob, Failure> {
    let (name, source) = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| Failure::new(format!("Error reading job file from stdin: {e}")))?;
        ("<stdin>".to_string(), s)
    } else {
        let s = std::fs::read_to_string(&args.file).map_err(|e| Failure::new(format!("Error reading job file {}: {e}", args.file)))?;
        (args.file.clone(), s)
    };
    if args.json || looks_like_json(&source) {
        return load_json(&name, source, args);
    }
    let mut var_files = Vec::new();
    for f in &args.var_files {
        let text = std::fs::read_to_string(f).map_err(|e| Failure::new(format!("Error reading variable file {f}: {e}")))?;
        var_files.push((f.clone(), text));
    }
    let flag_vars = collect_vars(&args.vars, std::iter::empty())?;
    let variables = collect_vars(&args.vars, std::env::vars())?;
    // As Nomad's CLI: the filesystem functions are allowed and read relative to the job file's
    // directory (the working directory for stdin or a bare file name).
    let base_dir = if args.file == "-" {
        None
    } else {
        std::path::Path::new(&args.file).parent().filter(|p| !p.as_os_str().is_empty()).map(std::path::Path::to_path_buf)
    };
    let opts = ParseOptions { variables, var_files: var_files.clone(), filename: name, allow_fs: true, base_dir };
    let job = parse(&source, &opts).map_err(|e| Failure::new(format!("Error parsing job file: {e}")))?;
    Ok(LoadedJob {
        job,
        source,
        variable_flags: flag_vars,
        variables: var_files.into_iter().map(|(_, t)| t).collect::<Vec<_>>().join("\n"),
        format: "hcl2",
    })
}

/// Whether a job file is JSON: an HCL2 file cannot start with `{`.
fn looks_like_json(source: &str) -> bool {
    source.trim_start().starts_with('{')
}

/// Reads a JSON job file as Nomad's `-json` does: the value of a top-level `Job` key when there
/// is one (`job inspect`, `job run -output`), else the whole object, decoded with the API's
/// manners (keys in any case, unknown keys ignored).
fn load_json(name: &str, source: String, args: &JobFileArgs) -> Result<LoadedJob, Failure> {
    if !args.vars.is_empty() || !args.var_files.is_empty() {
        return Err(Failure::new("Error parsing job file: cannot use variables with JSON files."));
    }
    let bad = |e: &dyn std::fmt::Display| Failure::new(format!("Error parsing job file: {name}: Failed to parse JSON job: {e}"));
    if source.len() > nomad_proto::jobspec::MAX_JOBSPEC_BYTES {
        return Err(bad(&format!(
            "the file is {} bytes; a job file may be at most {}",
            source.len(),
            nomad_proto::jobspec::MAX_JOBSPEC_BYTES
        )));
    }
    nomad_proto::lenient::check_depth(source.as_bytes(), nomad_proto::lenient::MAX_REQUEST_DEPTH).map_err(|e| bad(&e))?;
    let value: serde_json::Value = serde_json::from_str(&source).map_err(|e| bad(&e))?;
    let serde_json::Value::Object(mut top) = value else {
        return Err(bad(&"the file is not a JSON object"));
    };
    // Go's decoder matches the `Job` key in any case.
    let nested = top.keys().find(|k| k.eq_ignore_ascii_case("job")).cloned();
    let job_value = match nested.and_then(|k| top.remove(&k)) {
        Some(v @ serde_json::Value::Object(_)) => v,
        Some(_) => return Err(bad(&"Job: expected a JSON object")),
        None => serde_json::Value::Object(top),
    };
    let job: Job = nomad_proto::lenient::from_value(job_value).map_err(|e| bad(&e))?;
    Ok(LoadedJob { job, source, variable_flags: BTreeMap::new(), variables: String::new(), format: "json" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn var_flags_win_over_the_environment() {
        let env = vec![("NOMAD_VAR_image".to_string(), "env".to_string()), ("PATH".to_string(), "/bin".to_string())];
        let v = collect_vars(&["image=flag".into(), "count=3".into(), "eq=a=b".into()], env.clone()).unwrap();
        assert_eq!(v["image"], "flag");
        assert_eq!(v["count"], "3");
        assert_eq!(v["eq"], "a=b", "only the first = splits");
        assert!(!v.contains_key("PATH"));
        let only_env = collect_vars(&[], env).unwrap();
        assert_eq!(only_env["image"], "env");
        assert!(collect_vars(&["novalue".into()], std::iter::empty()).unwrap_err().message.contains("expected KEY=VALUE"));
    }

    #[test]
    fn a_bad_job_file_reports_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.nomad.hcl");
        std::fs::write(&path, "job \"x\" {\n  group \"g\" {\n    bogus = 1\n  }\n}\n").unwrap();
        let args = JobFileArgs { file: path.display().to_string(), ..JobFileArgs::default() };
        let e = load(&args).unwrap_err();
        assert!(e.message.starts_with(&format!("Error parsing job file: {}:3:5:", path.display())), "{}", e.message);
        assert_eq!(e.code, 1);
    }

    #[test]
    fn file_reads_relative_to_the_job_file() {
        // The working directory is elsewhere: only the job file's directory has greeting.txt.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("greeting.txt"), "hello from the job dir").unwrap();
        let path = dir.path().join("job.nomad.hcl");
        std::fs::write(
            &path,
            "job \"x\" {\n  meta { greeting = file(\"greeting.txt\") }\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n",
        )
        .unwrap();
        assert!(!std::path::Path::new("greeting.txt").exists());
        let args = JobFileArgs { file: path.display().to_string(), ..JobFileArgs::default() };
        let loaded = load(&args).unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(loaded.job.meta.get("greeting").map(String::as_str), Some("hello from the job dir"));
    }
}
