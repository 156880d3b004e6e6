//! `nomad-rs job validate <file>`: parse, apply Nomad's defaults and validate
//! locally, without a server.

use clap::Args;
use nomad_proto::{JobLimits, LimitError};

use super::{JobFileArgs, load};
use crate::cli::{CmdResult, Failure, exit};

/// Flags of `job validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The job file and its variables.
    #[command(flatten)]
    pub file: JobFileArgs,
}

/// Parses, checks against the servers' default limits, canonicalizes, refuses what nomad-rs does
/// not run and validates a job file, as `Job.Register` does; the message lists every problem.
pub fn check(args: &JobFileArgs) -> Result<nomad_proto::Job, Failure> {
    check_job(load(args)?.job)
}

/// What `Job.Register` does to a parsed job before writing it, done locally: the Connect
/// sidecar and gateway tasks are injected as the servers inject them.
pub fn check_job(mut job: nomad_proto::Job) -> Result<nomad_proto::Job, Failure> {
    let limits = |e: LimitError| {
        let note = match e {
            // The one limit a server may be configured with: say whose value this is.
            LimitError::GroupCount { .. } | LimitError::TotalCount { .. } => {
                " (the servers' default; a server with a higher server.job_max_count accepts it)"
            }
            _ => "",
        };
        Failure::new(format!("Job validation errors:\n{e}{note}"))
    };
    let invalid = |e: String| Failure::new(format!("Job validation errors:\n{}", e.trim_end()));
    job.check_limits(&JobLimits::default()).map_err(limits)?;
    job.canonicalize();
    job.mutate_connect().map_err(|e| invalid(e.to_string()))?;
    job.check_limits(&JobLimits::default()).map_err(limits)?;
    job.check_encoded_size().map_err(limits)?;
    job.check_supported().map_err(|e| invalid(e.to_string()))?;
    job.validate_connect().map_err(|e| invalid(e.to_string()))?;
    job.validate().map_err(|e| invalid(e.to_string()))?;
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

    #[test]
    fn limits_and_names_are_checked_locally_as_the_servers_do() {
        let (_d, args) =
            file("job \"x\" {\n  group \"g\" {\n    count = 2147483648\n    task \"..\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n");
        let e = check(&args).unwrap_err();
        assert!(
            e.message.contains("task group \"g\" count 2147483648 is greater than job_max_count (50000) (the servers' default"),
            "{}",
            e.message
        );
        let (_d, args) = file("job \"x\" {\n  group \"g\" {\n    task \"..\" {\n      driver = \"raw_exec\"\n    }\n  }\n}\n");
        let e = check(&args).unwrap_err();
        assert!(e.message.contains("Task name cannot be \"..\""), "{}", e.message);
    }

    /// Every entry of the job specification support table, as the servers judge it.
    #[test]
    fn what_nomad_rs_does_not_run_is_refused_naming_it_as_the_servers_do() {
        use nomad_proto::admission::{Fate, TABLE, sample_job_using};
        for e in TABLE.iter() {
            let job = sample_job_using(e.feature);
            let mut canonical = job.clone();
            canonical.canonicalize();
            match (e.fate, canonical.check_supported()) {
                (Fate::Refused(_), Err(want)) => {
                    let got = check_job(job).unwrap_err();
                    assert_eq!(got.message, format!("Job validation errors:\n{}", want.to_string().trim_end()), "{:?}", e.feature);
                }
                (Fate::Refused(_), Ok(())) => panic!("{:?}: its sample is not refused", e.feature),
                (_, _) => {
                    check_job(job).unwrap_or_else(|f| panic!("{:?}: {}", e.feature, f.message));
                }
            }
        }
    }

    #[test]
    fn a_refused_block_in_a_job_file_is_named_with_its_path() {
        let (_d, args) = file(
            "job \"x\" {\n  group \"cache\" {\n    task \"redis\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/true\"\n      }\n      vault {\n        policies = [\"x\"]\n      }\n    }\n  }\n}\n",
        );
        let e = check(&args).unwrap_err();
        assert_eq!(
            e.message,
            "Job validation errors:\ngroup \"cache\" task \"redis\": the \"vault\" block is not supported by nomad-rs yet"
        );
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
        for expected in ["connect.nomad.hcl", "hello.nomad.hcl", "oci-batch.nomad.hcl", "system.nomad.hcl", "web.nomad.hcl"] {
            assert!(names.contains(&expected), "examples/{expected} is missing: {names:?}");
        }
        let type_of = |n: &str| seen.iter().find(|(name, _)| name == n).map(|(_, t)| *t).unwrap();
        assert_eq!(type_of("oci-batch.nomad.hcl"), nomad_proto::JobType::Batch);
        assert_eq!(type_of("system.nomad.hcl"), nomad_proto::JobType::System);
    }
}
