//! `nomad-rs job init [-short] [-template <name>] [-list-templates] [<file>]`: writes an example
//! job file to start from, or the job template kept in the Nomad variable
//! `nomad/job-templates/<name>` (its `template` item), as Nomad's UI and CLI share them.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use clap::Args;
use nomad_proto::variables::{Variable, VariableMetadata};

use crate::cli::api::{ApiFlags, Query};
use crate::cli::var::{ERR_VARIABLE_NOT_FOUND, is_absent, var_url};
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Where job templates are kept.
const TEMPLATES_PREFIX: &str = "nomad/job-templates/";

/// The file `job init` writes when given none (Nomad's name).
pub const DEFAULT_INIT_NAME: &str = "example.nomad.hcl";

/// The commented example: every block in it is one nomad-rs runs.
pub const EXAMPLE: &str = include_str!("assets/example.nomad.hcl");

/// The same job, minimal and without comments (`-short`).
pub const EXAMPLE_SHORT: &str = include_str!("assets/example-short.nomad.hcl");

/// Flags of `job init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Write a minimal job file without comments.
    #[arg(long)]
    pub short: bool,
    /// Include Consul Connect (refused: nomad-rs does not run Connect yet).
    #[arg(long)]
    pub connect: bool,
    /// Write the job template kept in the variable `nomad/job-templates/<TEMPLATE>`.
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// List the job templates kept under `nomad/job-templates/`.
    #[arg(long = "list-templates")]
    pub list_templates: bool,
    /// The file to write.
    #[arg(value_name = "FILE", default_value = DEFAULT_INIT_NAME)]
    pub file: String,
}

/// Runs `job init`.
pub async fn run(api: &ApiFlags, args: InitArgs) -> CmdResult {
    if args.connect {
        return Err(Failure::new("-connect is not supported by nomad-rs yet: it does not run Consul Connect"));
    }
    if args.list_templates {
        return list_templates(api).await;
    }
    let owned;
    let text = match args.template.as_deref().filter(|t| !t.is_empty()) {
        Some(name) => {
            // As Nomad: an existing file is refused before the server is asked.
            if std::fs::symlink_metadata(&args.file).is_ok() {
                return Err(Failure::new(format!("Job '{}' already exists", args.file)));
            }
            owned = job_template(api, name).await?;
            println!("Initializing a job template from {name}");
            owned.as_str()
        }
        None if args.short => EXAMPLE_SHORT,
        None => EXAMPLE,
    };
    write_new(&args.file, text)?;
    println!("Example job file written to {}", args.file);
    Ok(exit::OK)
}

/// `-list-templates`: the names under `nomad/job-templates/`.
async fn list_templates(api: &ApiFlags) -> CmdResult {
    let ctx = Ctx::new(api)?;
    let vars: Vec<VariableMetadata> =
        ctx.client.get("/v1/vars", &Query::new().prefix(TEMPLATES_PREFIX)).await.map(|a| a.value).map_err(|e| {
            Failure::new(format!(
                "Error retrieving job templates from the server; unable to read variables at path {TEMPLATES_PREFIX}. Error: {e}"
            ))
        })?;
    if vars.is_empty() {
        return Err(Failure::new("No variables in nomad/job-templates"));
    }
    println!("Use nomad job init -template=<template> with any of the following:");
    for v in &vars {
        println!("  {}", v.path.strip_prefix(TEMPLATES_PREFIX).unwrap_or(&v.path));
    }
    Ok(exit::OK)
}

/// The `template` item of `nomad/job-templates/<name>`.
async fn job_template(api: &ApiFlags, name: &str) -> Result<String, Failure> {
    let ctx = Ctx::new(api)?;
    let v: Variable = match ctx.client.get(&var_url(&format!("{TEMPLATES_PREFIX}{name}")), &Query::new()).await {
        Ok(a) => a.value,
        Err(e) if is_absent(&e) => return Err(Failure::new(ERR_VARIABLE_NOT_FOUND)),
        Err(e) => return Err(Failure::new(format!("Error retrieving variable: {e}"))),
    };
    v.items.get("template").cloned().ok_or_else(|| {
        Failure::new(format!(
            "Job template {name:?} is malformed and is missing a template field. Please visit the jobs/run/templates route in the Nomad UI to add it"
        ))
    })
}

/// Writes `text` to a new `path`; an existing file is never overwritten, even one that appears
/// meanwhile (create_new).
fn write_new(path: &str, text: &str) -> Result<(), Failure> {
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o660).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Failure::new(format!("Job '{path}' already exists")));
        }
        Err(e) => return Err(Failure::new(format!("Failed to write '{path}': {e}"))),
    };
    file.write_all(text.as_bytes()).map_err(|e| Failure::new(format!("Failed to write '{path}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::job::JobFileArgs;
    use crate::cli::job::validate::check;

    fn init(dir: &std::path::Path, name: &str, short: bool) -> CmdResult {
        let file = dir.join(name).display().to_string();
        block_on(run(&ApiFlags::default(), InitArgs { short, connect: false, template: None, list_templates: false, file }))
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    /// What `job init` writes is a job nomad-rs runs: it parses, passes admission and validates.
    #[test]
    fn both_examples_pass_job_validate() {
        let dir = tempfile::tempdir().unwrap();
        for (name, short) in [("long.nomad.hcl", false), ("short.nomad.hcl", true)] {
            assert_eq!(init(dir.path(), name, short), Ok(exit::OK));
            let path = dir.path().join(name);
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(text, if short { EXAMPLE_SHORT } else { EXAMPLE });
            let args = JobFileArgs { file: path.display().to_string(), ..JobFileArgs::default() };
            let job = check(&args).unwrap_or_else(|f| panic!("{name}: {}", f.message));
            assert_eq!((job.id.as_str(), job.task_groups.len()), ("example", 1));
            assert_eq!(job.task_groups[0].tasks[0].driver, "raw_exec");
        }
        assert!(!EXAMPLE_SHORT.contains('#'), "the short example has no comments");
    }

    #[test]
    fn an_existing_file_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DEFAULT_INIT_NAME), "mine").unwrap();
        let e = init(dir.path(), DEFAULT_INIT_NAME, false).unwrap_err();
        assert_eq!(e.message, format!("Job '{}' already exists", dir.path().join(DEFAULT_INIT_NAME).display()));
        assert_eq!(std::fs::read_to_string(dir.path().join(DEFAULT_INIT_NAME)).unwrap(), "mine");
    }

    #[test]
    fn connect_is_refused_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.hcl").display().to_string();
        let args = InitArgs { short: false, connect: true, template: None, list_templates: false, file: file.clone() };
        let e = block_on(run(&ApiFlags::default(), args)).unwrap_err();
        assert!(e.message.starts_with("-connect is not supported by nomad-rs yet"), "{}", e.message);
        assert!(!std::path::Path::new(&file).exists(), "nothing is written");
    }
}
