//! Runs a directory of job files through the job file parser and the servers' admission, offline,
//! and says per file what nomad-rs does with it (`scripts/corpus-check` drives it).
//!
//! ```text
//! cargo run -p nomad-proto --example corpus_check -- DIR
//! ```
//!
//! One line per file, `<path>: <verdict>[: <detail>]`, sorted by path; the totals are the last
//! lines. Verdicts:
//! - `accepted`: admitted, and nothing in it keeps it from a node a nomad-rs client makes;
//! - `constrained`: admitted, but placed only on nodes that have what it needs (a driver no
//!   nomad-rs client has, host volumes); the detail says what;
//! - `refused`: parsed, but admission refuses it (what nomad-rs does not run, limits, Nomad's
//!   validation); the detail is the message `Job.Register` gives;
//! - `parse error`: the job file parser's message;
//! - `needs vars`: a variable without a default has no value (the file's own defaults are used);
//! - `not a job`: no top-level `job` block (agent configs, volume specs, variable files, ...).
//!
//! Admission is the servers' (`admit_job` in `server/src/endpoints/job.rs`), in the same order and
//! with the servers' default limits, as `nomad-rs job validate` does it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nomad_proto::admission::{Fate, features_used};
use nomad_proto::jobspec::{ErrorKind, ParseOptions, parse};
use nomad_proto::{Job, JobLimits};

/// The drivers a nomad-rs client has (`agent/src/client/driver`); a task with another driver is
/// placed only on a node that has it, which no nomad-rs client is.
const CLIENT_DRIVERS: &[&str] = &["raw_exec", "exec", "oci"];

/// What nomad-rs does with one file.
enum Verdict {
    Accepted,
    Constrained(String),
    Refused(String),
    ParseError(String),
    NeedsVars(String),
    NotAJob,
}

impl Verdict {
    const NAMES: [&'static str; 6] = ["accepted", "constrained", "refused", "parse error", "needs vars", "not a job"];

    fn index(&self) -> usize {
        match self {
            Verdict::Accepted => 0,
            Verdict::Constrained(_) => 1,
            Verdict::Refused(_) => 2,
            Verdict::ParseError(_) => 3,
            Verdict::NeedsVars(_) => 4,
            Verdict::NotAJob => 5,
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Verdict::Accepted | Verdict::NotAJob => None,
            Verdict::Constrained(d) | Verdict::Refused(d) | Verdict::ParseError(d) | Verdict::NeedsVars(d) => Some(d),
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir] = args.as_slice() else {
        eprintln!("usage: corpus_check DIR");
        return ExitCode::from(2);
    };
    let root = Path::new(dir);
    let mut files = Vec::new();
    if let Err(e) = collect(root, &mut files) {
        eprintln!("reading {dir}: {e}");
        return ExitCode::FAILURE;
    }
    files.sort();
    let mut totals = [0usize; Verdict::NAMES.len()];
    for path in &files {
        let shown = path.strip_prefix(root).unwrap_or(path).display();
        let verdict = match std::fs::read_to_string(path) {
            Ok(text) => check(&shown.to_string(), path.parent(), &text),
            Err(e) => Verdict::ParseError(format!("unreadable: {e}")),
        };
        totals[verdict.index()] += 1;
        let name = Verdict::NAMES[verdict.index()];
        match verdict.detail() {
            // One line per file: multi-line messages are joined.
            Some(detail) => println!("{shown}: {name}: {}", detail.trim_end().replace('\n', " | ")),
            None => println!("{shown}: {name}"),
        }
    }
    println!("---");
    println!("files: {}", files.len());
    for (name, n) in Verdict::NAMES.iter().zip(totals) {
        println!("{name}: {n}");
    }
    ExitCode::SUCCESS
}

/// Every `.nomad` and `.hcl` file under `dir`.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "nomad" || e == "hcl") {
            out.push(path);
        }
    }
    Ok(())
}

/// As `nomad-rs job run` reads a job file: the filesystem functions on, relative to its directory.
fn check(name: &str, dir: Option<&Path>, text: &str) -> Verdict {
    if !has_job_block(text) {
        return Verdict::NotAJob;
    }
    let opts = ParseOptions { filename: name.to_string(), allow_fs: true, base_dir: dir.map(Path::to_path_buf), ..ParseOptions::default() };
    let mut job = match parse(text, &opts) {
        Ok(job) => job,
        Err(e) if e.kind == ErrorKind::Variable && e.message.starts_with("unset variable") => return Verdict::NeedsVars(e.to_string()),
        Err(e) => return Verdict::ParseError(e.to_string()),
    };
    if let Err(refused) = admit(&mut job) {
        return Verdict::Refused(refused);
    }
    let mut needs = Vec::new();
    for feature in features_used(&job) {
        if let Fate::Constrained(reason) = feature.entry().fate {
            let what = match feature {
                nomad_proto::admission::Feature::Driver => {
                    let mut others: Vec<&str> = job
                        .task_groups
                        .iter()
                        .flat_map(|g| &g.tasks)
                        .map(|t| t.driver.as_str())
                        .filter(|d| !CLIENT_DRIVERS.contains(d))
                        .collect();
                    others.sort_unstable();
                    others.dedup();
                    if others.is_empty() {
                        continue;
                    }
                    format!("{reason} ({})", others.join(", "))
                }
                _ => reason.to_string(),
            };
            needs.push(what);
        }
    }
    if needs.is_empty() { Verdict::Accepted } else { Verdict::Constrained(needs.join("; ")) }
}

/// `Job.Register`'s admission (`admit_job`), with the servers' default limits and no region check.
fn admit(job: &mut Job) -> Result<(), String> {
    job.check_limits(&JobLimits::default()).map_err(|e| e.to_string())?;
    job.canonicalize();
    job.mutate_connect().map_err(|e| e.to_string())?;
    job.check_limits(&JobLimits::default()).map_err(|e| e.to_string())?;
    job.check_encoded_size().map_err(|e| e.to_string())?;
    job.check_supported().map_err(|e| e.to_string())?;
    job.add_implied_constraints();
    job.validate_connect().map_err(|e| e.to_string())?;
    job.validate().map_err(|e| e.to_string())?;
    Ok(())
}

/// Whether the text has a top-level `job "<id>"` block: a line that starts with it, so files that
/// do not even parse are still told apart from agent configs and volume specs.
fn has_job_block(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start();
        line.strip_prefix("job").is_some_and(|rest| rest.starts_with([' ', '\t', '"']) && rest.trim_start().starts_with('"'))
    })
}
