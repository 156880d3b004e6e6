//! HCL2 job files (Nomad's "jobspec2") to [`Job`].
//!
//! ```
//! use nomad_proto::jobspec::{parse, ParseOptions};
//!
//! let src = r#"
//! job "web" {
//!   group "g" {
//!     task "t" {
//!       driver = "raw_exec"
//!       config { command = "/bin/sleep" }
//!     }
//!   }
//! }
//! "#;
//! let job = parse(src, &ParseOptions::default()).unwrap();
//! assert_eq!(job.task_groups[0].tasks[0].driver, "raw_exec");
//! ```
//!
//! The result is in the shape Nomad's parser returns, ready for
//! [`Job::canonicalize`] and [`Job::validate`]. The parser itself fills the
//! defaults our types cannot express as "unset": `restart`, `reschedule`,
//! `update` and `migrate` blocks start from the job type's default (and the
//! job's block) and override only the keys written (see `policies.rs`);
//! job-level `reschedule`, `migrate` and `vault` are pushed into the groups
//! and tasks, since `Job` has no field for them.
//!
//! # How it works
//!
//! The text is parsed with hcl-edit (re-exported by hcl-rs as `hcl::edit`),
//! whose syntax tree keeps byte spans for every block, attribute and
//! expression. Decoders read that tree through a `Reader` per block, which
//! evaluates expressions with `var`/`local` in scope (`eval.rs`), converts
//! values to the field types, and reports whatever the decoder did not ask
//! for as unknown, with the closest known name. Every error carries the span
//! of the offending attribute, block or expression, so locations are exact,
//! not searched for in the text. Only the first error is reported.
//!
//! Runtime interpolations stay literal the way Nomad keeps them: a variable
//! that is not `var`, `local` or an iteration variable becomes the text
//! `${<source>}` (`${NOMAD_ALLOC_ID}`, `${attr.kernel.name}`, `${meta.rack}`);
//! `$${X}` is `${X}`.
//!
//! # Compatibility with Nomad 1.6
//!
//! Supported (every key below is checked; anything else is an error):
//! - top level: one `job`, `variable` (`type default description validation`),
//!   `variables`, `locals`; `dynamic` blocks anywhere except inside `config`.
//! - `job`: `id name region namespace type priority datacenters node_pool
//!   all_at_once consul_token vault_token meta constraint affinity spread
//!   update periodic parameterized reschedule migrate multiregion vault group
//!   task` (a lone `task` gets its own group, placed first).
//! - `group`: `count shutdown_delay stop_after_client_disconnect
//!   max_client_disconnect meta constraint affinity spread network service
//!   volume task restart reschedule ephemeral_disk update migrate scaling
//!   consul vault`.
//! - `task`: `driver user config env meta kill_timeout kill_signal leader
//!   shutdown_delay kind constraint affinity service resources restart
//!   lifecycle logs template artifact volume_mount csi_plugin vault identity
//!   dispatch_payload scaling "cpu"|"mem"`.
//! - `resources` (`cpu cores memory memory_max disk network device`),
//!   `network` (`mode hostname device cidr ip mbits dns port reserved_ports`), `service`
//!   (`name port tags canary_tags enable_tag_override address_mode address task
//!   on_update provider meta canary_meta tagged_addresses check check_restart
//!   connect`), `check` (all of Nomad's keys), `connect` (`native
//!   sidecar_service proxy upstreams expose config sidecar_task gateway proxy
//!   ingress terminating mesh`), `volume`, `volume_mount`, `lifecycle`,
//!   `logs`, `restart`, `reschedule`, `update`, `migrate`, `ephemeral_disk`,
//!   `periodic` (`cron crons enabled prohibit_overlap time_zone`),
//!   `parameterized`, `template`, `artifact`, `csi_plugin`, and the
//!   constraint/affinity shorthands (`version semver regexp set_contains
//!   set_contains_any set_contains_all distinct_hosts distinct_property`).
//!
//! Accepted but dropped, because our types have no field for them: check
//! `advertise`, upstream `config`, resources `iops`,
//! template `uid gid vault_grace wait error_on_missing_key`.
//!
//! Not supported: JSON-syntax and HCL1 job files (a syntax error on a line
//! that only HCL1 accepts says so, see `hints.rs`); template `change_script`
//! (refused, since dropping it would change behaviour); `NOMAD_VAR_*`
//! environment variables (callers pass them in [`ParseOptions::variables`]);
//! `optional()` in object types; network `reserved_ports` blocks beside `port`
//! blocks (refused: Nomad drops them). The functions are exactly Nomad 1.6's
//! list (`functions/`); the filesystem ones run only with
//! [`ParseOptions::allow_fs`].

mod duration;
mod error;
mod eval;
mod functions;

pub use functions::write_go_json_string;
mod group;
mod heredoc;
mod hints;
mod job;
mod network;
mod placement;
mod policies;
mod reader;
mod service;
mod task;
mod variables;
pub mod volume;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_syntax;

use std::collections::BTreeMap;
use std::path::PathBuf;

use hcl::edit::Span;
use hcl::edit::structure::{Body, Structure};

use crate::job::Job;

pub use error::{ErrorKind, JobspecError, Position};

use error::{Diag, with_suggestion};
use eval::Evaluator;
use variables::Declarations;

/// Inputs besides the job file itself.
#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// `-var name=value` values; they take precedence over variable files and defaults.
    pub variables: BTreeMap<String, String>,
    /// Variable files as (name, contents), applied in order (`-var-file`).
    pub var_files: Vec<(String, String)>,
    /// The job file's name, used in error messages (`<jobspec>` when empty).
    pub filename: String,
    /// Whether the filesystem functions (`file`, `fileset`, `abspath`, ...) may run: Nomad's
    /// `AllowFS`, on for the CLI, off for the HTTP parse endpoint. When off they fail with
    /// "filesystem function disabled".
    pub allow_fs: bool,
    /// The directory relative paths in `file()`, `fileexists()` and `fileset()` start from: the
    /// job file's directory (Nomad's `BaseDir`). `None` is the working directory.
    pub base_dir: Option<PathBuf>,
}

/// Top-level blocks a job file may contain.
const TOP_LEVEL_BLOCKS: &[&str] = &["job", "variable", "variables", "locals"];

/// Largest job file (and each variable file) parsed, in bytes: the size of the largest job the
/// servers store ([`crate::limits::MAX_JOB_ENCODED_BYTES`]); the canonical JSON of a job is
/// larger than its HCL, so a bigger file could not become a job they accept. Checked before
/// parsing, whose time and memory grow with the text.
///
/// Nesting needs no check of ours: hcl-edit refuses blocks and expressions nested deeper than
/// 64 levels and operator chains longer than 128, with a syntax error, before the stack runs out.
pub const MAX_JOBSPEC_BYTES: usize = crate::limits::MAX_JOB_ENCODED_BYTES;

/// Parses an HCL2 job file into a job.
pub fn parse(src: &str, opts: &ParseOptions) -> Result<Job, JobspecError> {
    let file = if opts.filename.is_empty() { "<jobspec>" } else { opts.filename.as_str() };
    let too_large = |name: &str, len: usize| JobspecError {
        kind: ErrorKind::Structure,
        file: name.to_string(),
        position: None,
        message: format!("the file is {len} bytes; a job file may be at most {MAX_JOBSPEC_BYTES}"),
    };
    if src.len() > MAX_JOBSPEC_BYTES {
        return Err(too_large(file, src.len()));
    }
    if let Some((name, text)) = opts.var_files.iter().find(|(_, text)| text.len() > MAX_JOBSPEC_BYTES) {
        return Err(too_large(name, text.len()));
    }
    let locate = |d: Diag| d.locate(file, src);
    if src.trim_start().starts_with('{') {
        return Err(locate(Diag::new(
            ErrorKind::Syntax,
            Some(src.len() - src.trim_start().len()),
            "JSON job files are not supported here; submit JSON jobs to the HTTP API",
        )));
    }
    let body = parse_hcl(file, src).map_err(|e| hints::explain(e, src))?;

    let mut decls = Declarations { variable: Vec::new(), variables: Vec::new(), locals: Vec::new() };
    let mut jobs = Vec::new();
    for s in body.iter() {
        let at = s.span().map(|s| s.start);
        match s {
            Structure::Attribute(a) => {
                return Err(locate(Diag::new(
                    ErrorKind::UnknownKey,
                    at,
                    format!(
                        "unexpected attribute \"{}\" at the top level; a job file holds a job block and variable, variables or locals blocks",
                        a.key.as_str()
                    ),
                )));
            }
            Structure::Block(b) => match b.ident.as_str() {
                "job" => jobs.push(b),
                "variable" => decls.variable.push(b),
                "variables" => decls.variables.push(b),
                "locals" => decls.locals.push(b),
                other => {
                    let message = format!("unknown block \"{other}\" at the top level");
                    return Err(locate(Diag::new(
                        ErrorKind::UnknownKey,
                        at,
                        with_suggestion(message, other, TOP_LEVEL_BLOCKS.iter().copied()),
                    )));
                }
            },
        }
    }
    let job_block = match jobs.as_slice() {
        [] => {
            return Err(locate(Diag::new(
                ErrorKind::Structure,
                None,
                "no job block found; a job file needs one job \"<id>\" { ... } block",
            )));
        }
        [one] => *one,
        [first, second, ..] => {
            let first_line = first.span().map_or(0, |s| error::position_of(src, s.start).line);
            return Err(locate(Diag::new(
                ErrorKind::Structure,
                second.span().map(|s| s.start),
                format!("only one job block is allowed per file; the first one is at line {first_line}"),
            )));
        }
    };

    let eval =
        Evaluator::for_job_file(src).with_file_access(functions::FileAccess { allowed: opts.allow_fs, base_dir: opts.base_dir.clone() });
    let scope = variables::resolve(&eval, &decls, opts, file)?;
    job::decode(&eval, job_block, &scope).map_err(locate)
}

/// Parses HCL text, turning a syntax error into a located [`JobspecError`].
pub(crate) fn parse_hcl(file: &str, text: &str) -> Result<Body, JobspecError> {
    // hcl-edit is a third-party parser fed untrusted text; a bug in it must
    // become an error, never a crashed server.
    let parsed = std::panic::catch_unwind(|| hcl::edit::parser::parse_body(text));
    match parsed {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => Err(JobspecError {
            kind: ErrorKind::Syntax,
            file: file.to_string(),
            position: Some(Position { line: e.location().line(), column: e.location().column() }),
            message: format!("syntax error: {}", e.message()),
        }),
        Err(_) => Err(JobspecError {
            kind: ErrorKind::Syntax,
            file: file.to_string(),
            position: None,
            message: "syntax error: the HCL parser failed on this input".to_string(),
        }),
    }
}
