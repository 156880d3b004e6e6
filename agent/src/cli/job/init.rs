//! `nomad-rs job init [-short] [<file>]`: writes an example job file to start from.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use clap::Args;

use crate::cli::{CmdResult, Failure, exit};

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
    /// Start from a job template stored in a Nomad variable (refused: nomad-rs has no variables yet).
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// List the job templates stored in Nomad variables (refused: nomad-rs has no variables yet).
    #[arg(long = "list-templates")]
    pub list_templates: bool,
    /// The file to write.
    #[arg(value_name = "FILE", default_value = DEFAULT_INIT_NAME)]
    pub file: String,
}

/// Runs `job init`.
pub fn run(args: InitArgs) -> CmdResult {
    if args.connect {
        return Err(Failure::new("-connect is not supported by nomad-rs yet: it does not run Consul Connect"));
    }
    if args.template.is_some() || args.list_templates {
        return Err(Failure::new("-template and -list-templates are not supported by nomad-rs yet: it has no Nomad variables"));
    }
    let text = if args.short { EXAMPLE_SHORT } else { EXAMPLE };
    // create_new: an existing file is never overwritten, even one that appears meanwhile.
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o660).open(&args.file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Failure::new(format!("Job '{}' already exists", args.file)));
        }
        Err(e) => return Err(Failure::new(format!("Failed to write '{}': {e}", args.file))),
    };
    file.write_all(text.as_bytes()).map_err(|e| Failure::new(format!("Failed to write '{}': {e}", args.file)))?;
    println!("Example job file written to {}", args.file);
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::job::JobFileArgs;
    use crate::cli::job::validate::check;

    fn init(dir: &std::path::Path, name: &str, short: bool) -> CmdResult {
        let file = dir.join(name).display().to_string();
        run(InitArgs { short, connect: false, template: None, list_templates: false, file })
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
    fn connect_and_templates_are_refused_naming_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x.hcl").display().to_string();
        let e = run(InitArgs { short: false, connect: true, template: None, list_templates: false, file: file.clone() }).unwrap_err();
        assert!(e.message.starts_with("-connect is not supported by nomad-rs yet"), "{}", e.message);
        let e = run(InitArgs { short: false, connect: false, template: Some("t".into()), list_templates: false, file: file.clone() })
            .unwrap_err();
        assert!(e.message.starts_with("-template and -list-templates are not supported"), "{}", e.message);
        assert!(!std::path::Path::new(&file).exists(), "nothing is written");
    }
}
