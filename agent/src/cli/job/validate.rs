//! `nomad-rs job validate <file>`: parse, apply Nomad's defaults and validate
//! locally, without a server.

use clap::Args;

use super::{JobFileArgs, load};
use crate::cli::{CmdResult, Failure, exit};

/// Flags of `job validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The job file and its variables.
    #[command(flatten)]
    pub file: JobFileArgs,
}

/// Parses, canonicalizes and validates a job file; the message lists every problem.
pub fn check(args: &JobFileArgs) -> Result<nomad_proto::Job, Failure> {
    let mut job = load(args)?.job;
    job.canonicalize();
    job.validate().map_err(|e| Failure::new(format!("Job validation errors:\n{}", e.to_string().trim_end())))?;
    Ok(job)
}

/// Runs `job validate`.
pub fn run(args: ValidateArgs) -> CmdResult {
    check(&args.file)?;
    println!("Job validation successful");
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, JobFileArgs) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.nomad.hcl");
        std::fs::write(&path, text).unwrap();
        let args = JobFileArgs { file: path.display().to_string(), ..JobFileArgs::default() };
        (dir, args)
    }

    #[test]
    fn an_invalid_job_lists_its_problems() {
        let (_d, args) =
            file("job \"x\" {\n  priority = 500\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n");
        let e = check(&args).unwrap_err();
        assert!(e.message.starts_with("Job validation errors:\n1 error occurred:"), "{}", e.message);
        assert!(e.message.contains("priority"), "{}", e.message);
    }

    /// Every example job file parses and validates; each one is there to be run.
    #[test]
    fn every_example_parses_and_validates() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut seen = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "hcl") {
                let args = JobFileArgs { file: path.display().to_string(), ..JobFileArgs::default() };
                let job = check(&args).unwrap_or_else(|e| panic!("{}: {}", path.display(), e.message));
                seen.push((path.file_name().unwrap().to_string_lossy().to_string(), job.job_type));
            }
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        for expected in ["hello.nomad.hcl", "oci-batch.nomad.hcl", "system.nomad.hcl", "web.nomad.hcl"] {
            assert!(names.contains(&expected), "examples/{expected} is missing: {names:?}");
        }
        let type_of = |n: &str| seen.iter().find(|(name, _)| name == n).map(|(_, t)| *t).unwrap();
        assert_eq!(type_of("oci-batch.nomad.hcl"), nomad_proto::JobType::Batch);
        assert_eq!(type_of("system.nomad.hcl"), nomad_proto::JobType::System);
    }
}
