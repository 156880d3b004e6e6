//! The `nomad-rs` command line: one file per command.
//!
//! Nomad's commands take Go-style single-dash long flags (`-config`,
//! `-dev`); [`normalize_args`] turns them into clap's double-dash form, so
//! both spellings work.
//!
//! Every command but `agent` and `version` is a client of the HTTP API
//! ([`api`]). Commands print their output and return an exit code; a failure
//! carries the message for stderr. Exit codes: 0 success, 1 error, 2 when
//! `job run` (or another monitored write) could not place or run its
//! allocations; `job plan` keeps Nomad's own codes (0 no changes, 1 changes,
//! 255 error).

pub mod acl;
pub mod agent;
pub mod alloc;
pub mod api;
pub mod deployment;
pub mod eval;
pub mod format;
pub mod job;
pub mod log_monitor;
pub mod monitor;
pub mod namespace;
pub mod node;
pub mod nomad_commands;
pub mod operator;
pub mod plugin;
pub mod prefix;
pub mod root_keyring;
pub mod scheduler_config;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod status;
pub mod system;
pub mod tables;
pub mod tls;
pub mod var;
pub mod volume;

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};

use clap::{Parser, Subcommand};

use api::{ApiConfig, ApiFlags, Client};
use format::Style;

/// nomad-rs: a workload orchestrator that speaks Nomad's API.
#[derive(Debug, Parser)]
#[command(name = "nomad-rs", version, about, long_about = None, disable_help_subcommand = true)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run an agent (server, client, or both with -dev).
    Agent(agent::AgentArgs),
    /// ACLs: bootstrap, policies and tokens.
    Acl(acl::AclArgs),
    /// Submit, inspect and stop jobs.
    Job(job::JobArgs),
    /// Show and manage client nodes.
    Node(node::NodeArgs),
    /// Show and manage allocations.
    Alloc(alloc::AllocArgs),
    /// Show evaluations.
    Eval(eval::EvalArgs),
    /// Show the servers.
    Server(server::ServerArgs),
    /// Stream the agent's log lines.
    Monitor(log_monitor::MonitorArgs),
    /// Show Nomad-native service registrations.
    Service(service::ServiceArgs),
    /// Cluster operations: the servers' Raft configuration, the root keyring.
    Operator(operator::OperatorArgs),
    /// Nomad Variables: init, put, get, list, purge.
    Var(var::VarArgs),
    /// Register, show and remove CSI volumes.
    Volume(volume::VolumeArgs),
    /// Show CSI plugins.
    Plugin(plugin::PluginArgs),
    /// List, show, fail, pause, resume and promote deployments.
    Deployment(deployment::DeploymentArgs),
    /// List, show, create, update and delete namespaces.
    Namespace(namespace::NamespaceArgs),
    /// Show the status of jobs, or of any object by ID prefix.
    Status(status::StatusArgs),
    /// System maintenance: a forced garbage collection.
    System(system::SystemArgs),
    /// Create a CA and agent certificates for TLS.
    Tls(tls::TlsArgs),
    /// Print the version.
    Version,
}

/// Exit codes.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// An error.
    pub const ERROR: u8 = 1;
    /// Allocations could not be placed, or failed (`job run`, `job stop`, `alloc stop`).
    pub const PLACEMENT: u8 = 2;
    /// `job plan`: allocations would be created or destroyed (Nomad's code).
    pub const PLAN_CHANGES: u8 = 1;
    /// `job plan`: the plan could not be made (Nomad's code).
    pub const PLAN_ERROR: u8 = 255;
    /// Monitoring interrupted with Ctrl-C (the work carries on).
    pub const INTERRUPTED: u8 = 130;
    /// A top-level command that neither nomad-rs nor Nomad has (Nomad's CLI library's code).
    pub const UNKNOWN_COMMAND: u8 = 127;
}

/// A command that did not succeed: the message for stderr and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Exit code.
    pub code: u8,
    /// Message (may be several lines).
    pub message: String,
}

impl Failure {
    /// A failure with exit code 1.
    pub fn new(message: impl Into<String>) -> Failure {
        Failure { code: exit::ERROR, message: message.into() }
    }

    /// The same failure with another exit code.
    pub fn code(mut self, code: u8) -> Failure {
        self.code = code;
        self
    }
}

/// What a command returns: its exit code, or a failure.
pub type CmdResult = Result<u8, Failure>;

/// What API commands share: the client and the output style.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The API client.
    pub client: Client,
    /// Colors (off unless stdout is a terminal).
    pub style: Style,
}

impl Ctx {
    /// A context for these flags and the process environment.
    pub fn new(flags: &ApiFlags) -> Result<Ctx, Failure> {
        let client = Client::new(ApiConfig::from_env(flags)).map_err(|e| Failure::new(format!("Error initializing client: {e}")))?;
        Ok(Ctx { client, style: Style::detect(flags.no_color) })
    }

    /// `-json`: prints the API's answer for `path` as it came; `error` starts the message of a
    /// failed read (`Error querying jobs`).
    pub async fn print_json(&self, path: &str, q: &api::Query, error: &str) -> CmdResult {
        let v = self.client.get_json(path, q).await.map_err(|e| Failure::new(format!("{error}: {e}")))?;
        println!("{}", format::safe_json(&serde_json::to_string_pretty(&v.value).unwrap_or_default()));
        Ok(exit::OK)
    }

    /// How many characters of an ID to show.
    pub fn id_len(&self, verbose: bool) -> usize {
        format::id_len(verbose)
    }
}

/// Runs an API command and returns the process exit code, printing a failure to stderr.
pub async fn run(command: Command) -> u8 {
    let result = match command {
        Command::Acl(a) => acl::run(a).await,
        Command::Job(a) => job::run(a).await,
        Command::Node(a) => node::run(a).await,
        Command::Alloc(a) => alloc::run(a).await,
        Command::Eval(a) => eval::run(a).await,
        Command::Server(a) => server::run(a).await,
        Command::Monitor(a) => log_monitor::run(a).await,
        Command::System(a) => system::run(a).await,
        Command::Namespace(a) => namespace::run(a).await,
        Command::Service(a) => service::run(a).await,
        Command::Operator(a) => operator::run(a).await,
        Command::Var(a) => var::run(a).await,
        Command::Volume(a) => volume::run(a).await,
        Command::Plugin(a) => plugin::run(a).await,
        Command::Deployment(a) => deployment::run(a).await,
        Command::Status(a) => status::run(a).await,
        Command::Tls(a) => tls::run(a),
        Command::Agent(_) | Command::Version => Err(Failure::new("agent and version are not API commands")),
    };
    match result {
        Ok(code) => code,
        Err(f) => {
            if !f.message.is_empty() {
                // Messages quote servers' answers and errors; their text is printed safe.
                eprintln!("{}", format::safe_lines(&f.message));
            }
            f.code
        }
    }
}

/// Resolves on Ctrl-C (SIGINT). The handler is installed when this is called, not when the
/// future is first polled, so an interrupt right after a command prints its first line is caught.
pub fn interrupted() -> impl std::future::Future<Output = ()> {
    let sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        match sig {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    }
}

/// Asks `question` on a terminal; `None` when stdin is not one (nobody to ask).
pub fn confirm(question: &str) -> Result<Option<bool>, Failure> {
    if !std::io::stdin().is_terminal() {
        return Ok(None);
    }
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).map_err(|e| Failure::new(format!("Failed to read answer: {e}")))?;
    Ok(Some(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes")))
}

/// Asks on stdout and reads one line from stdin (a terminal or a pipe, as Nomad's UI does); an
/// input that ends before a line is an error.
pub fn ask(question: &str) -> Result<String, Failure> {
    print!("{question}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let n = std::io::Read::take(std::io::stdin().lock(), 4096)
        .read_line(&mut line)
        .map_err(|e| Failure::new(format!("Failed to parse answer: {e}")))?;
    if n == 0 {
        return Err(Failure::new("Failed to parse answer: EOF"));
    }
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

/// Nomad's confirmation: empty or "n..." prints `on_no` and ends with 0, an exact "y" goes on
/// (`None`), "yes" and the like are not exact enough (0), anything else is an error (1).
pub fn ask_exact_yes(question: &str, on_no: &str) -> Result<Option<u8>, Failure> {
    let answer = ask(question)?;
    Ok(match answer.as_str() {
        "y" => None,
        a if a.is_empty() || a.to_lowercase().starts_with('n') => {
            println!("{on_no}");
            Some(exit::OK)
        }
        a if a.to_lowercase().starts_with('y') => {
            println!("For confirmation, an exact ‘y’ is required.");
            Some(exit::OK)
        }
        _ => {
            println!("No confirmation detected. For confirmation, an exact 'y' is required.");
            Some(exit::ERROR)
        }
    })
}

/// What `version` and `-version` print.
pub fn version_line() -> String {
    format!("nomad-rs v{} (Nomad API {})", env!("CARGO_PKG_VERSION"), nomad_server::http::API_VERSION)
}

/// Parses the command line. Help and `-version` print and exit 0. A Nomad command nomad-rs does
/// not have yet says so and exits 1; other usage errors print and exit 1 (clap's own code 2 would
/// read as "placement failed" to scripts), except an unknown top-level command, which exits 127 as
/// Nomad's CLI does. Help and usage spell flags as Nomad does (`-detach`).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli, u8> {
    let args = normalize_args(args);
    match Cli::try_parse_from(&args) {
        Ok(cli) => Ok(cli),
        // `-version` says what `version` says.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayVersion => {
            println!("{}", version_line());
            Err(exit::OK)
        }
        Err(e) => {
            let words: Vec<String> = args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
            if e.use_stderr()
                && let Some(name) = nomad_commands::unimplemented_in(&words)
            {
                eprintln!("{}", nomad_commands::not_implemented_message(&name));
                return Err(exit::ERROR);
            }
            if e.kind() == clap::error::ErrorKind::UnknownArgument
                && words.iter().skip(1).find(|w| !w.starts_with('-')).is_some_and(|w| w == "agent")
                && let Some(clap::error::ContextValue::String(arg)) = e.get(clap::error::ContextKind::InvalidArg)
                && let Some(message) = nomad_commands::unsupported_agent_flag(arg)
            {
                eprintln!("{message}");
                return Err(exit::ERROR);
            }
            let text = single_dash_flags(&e.render().to_string());
            if !e.use_stderr() {
                print!("{text}");
                return Err(exit::OK);
            }
            eprint!("{text}");
            let top_level_unknown = e.kind() == clap::error::ErrorKind::InvalidSubcommand
                && words.iter().skip(1).find(|w| !w.starts_with('-')).is_some_and(|w| !nomad_commands::implemented(&[w.as_str()]));
            Err(if top_level_unknown { exit::UNKNOWN_COMMAND } else { exit::ERROR })
        }
    }
}

/// Clap's help and usage text with long flags in Nomad's single-dash spelling (`--detach` ->
/// `-detach`), which is also what [`normalize_args`] accepts. A lone `--` stays.
pub fn single_dash_flags(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let starts_flag = bytes[i] == b'-'
            && bytes.get(i + 1) == Some(&b'-')
            && bytes.get(i + 2).is_some_and(u8::is_ascii_alphabetic)
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if starts_flag {
            i += 1;
        }
        let ch = text[i..].chars().next().unwrap_or_default();
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Rewrites `-flag` and `-flag=value` to `--flag`/`--flag=value`. Single
/// letters (`-h`), negative numbers and a lone `-` are left alone, and
/// nothing after `--` is touched.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut passthrough = false;
    for a in args {
        let s = a.to_string_lossy();
        if passthrough {
            out.push(a);
            continue;
        }
        if s == "--" {
            passthrough = true;
            out.push(a);
            continue;
        }
        let bytes = s.as_bytes();
        let name_len = s.split('=').next().map_or(0, str::len);
        if bytes.len() > 2 && bytes[0] == b'-' && bytes[1] != b'-' && bytes[1].is_ascii_alphabetic() && name_len > 2 {
            out.push(OsString::from(format!("-{s}")));
        } else {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[&str]) -> Vec<String> {
        normalize_args(v.iter().map(OsString::from)).into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        assert_eq!(
            norm(&["nomad-rs", "agent", "-dev", "-config=a.hcl", "--bind", "x", "-h", "-1", "-"]),
            vec!["nomad-rs", "agent", "--dev", "--config=a.hcl", "--bind", "x", "-h", "-1", "-"]
        );
        assert_eq!(norm(&["job", "run", "--", "-not-a-flag"]), vec!["job", "run", "--", "-not-a-flag"]);
    }

    fn cli(v: &[&str]) -> Cli {
        match parse(v.iter().map(OsString::from)) {
            Ok(c) => c,
            Err(code) => panic!("{v:?} did not parse (exit {code})"),
        }
    }

    #[test]
    fn api_commands_parse_the_same_in_both_spellings() {
        let pairs: &[(&[&str], &[&str])] = &[
            (
                &[
                    "nomad-rs",
                    "job",
                    "run",
                    "-detach",
                    "-var",
                    "a=1",
                    "-var=b=2",
                    "-var-file",
                    "v.hcl",
                    "-check-index",
                    "5",
                    "-address",
                    "http://x:1",
                    "-timeout=30s",
                    "f.hcl",
                ],
                &[
                    "nomad-rs",
                    "job",
                    "run",
                    "--detach",
                    "--var",
                    "a=1",
                    "--var",
                    "b=2",
                    "--var-file",
                    "v.hcl",
                    "--check-index",
                    "5",
                    "--address",
                    "http://x:1",
                    "--timeout",
                    "30s",
                    "f.hcl",
                ],
            ),
            (
                &["nomad-rs", "job", "-namespace", "prod", "status", "-verbose", "web"],
                &["nomad-rs", "job", "status", "--namespace=prod", "--verbose", "web"],
            ),
            (
                &["nomad-rs", "job", "stop", "-purge", "-yes", "-detach", "web"],
                &["nomad-rs", "job", "stop", "--purge", "-y", "--detach", "web"],
            ),
            (&["nomad-rs", "job", "plan", "-diff=false", "f.hcl"], &["nomad-rs", "job", "plan", "--diff=false", "f.hcl"]),
            (
                &["nomad-rs", "node", "drain", "-enable", "-deadline", "10m", "-ignore-system", "-yes", "-detach", "n1"],
                &["nomad-rs", "node", "drain", "--enable", "--deadline=10m", "--ignore-system", "--yes", "--detach", "n1"],
            ),
            (&["nomad-rs", "node", "eligibility", "-disable", "-self"], &["nomad-rs", "node", "eligibility", "--disable", "--self"]),
            (
                &["nomad-rs", "alloc", "logs", "-stderr", "-f", "-tail", "-n", "5", "ab12", "web"],
                &["nomad-rs", "alloc", "logs", "--stderr", "--follow", "--tail", "-n=5", "ab12", "web"],
            ),
            (&["nomad-rs", "alloc", "restart", "-task", "web", "ab12"], &["nomad-rs", "alloc", "restart", "--task=web", "ab12"]),
            (&["nomad-rs", "eval", "status", "-json", "ab12"], &["nomad-rs", "eval", "status", "--json", "ab12"]),
            (&["nomad-rs", "server", "members", "-token", "t"], &["nomad-rs", "server", "members", "--token", "t"]),
            (&["nomad-rs", "status", "-region", "eu", "ab"], &["nomad-rs", "status", "--region", "eu", "ab"]),
        ];
        for (single, double) in pairs {
            assert_eq!(format!("{:?}", cli(single)), format!("{:?}", cli(double)), "{single:?}");
        }
        let Command::Job(j) = cli(&["nomad-rs", "job", "-address", "http://a:1", "run", "-var", "x=1", "f.hcl"]).command else { panic!() };
        assert_eq!(j.api.address.as_deref(), Some("http://a:1"), "general options work before the subcommand too");
        let job::JobCommand::Run(r) = j.command else { panic!() };
        assert_eq!(r.file.vars, vec!["x=1"]);
        assert_eq!(r.timeout, std::time::Duration::from_secs(300), "monitoring gives up after 5m by default");
    }

    #[test]
    fn usage_errors_exit_1_and_help_exits_0() {
        let code = |v: &[&str]| parse(v.iter().map(OsString::from)).err();
        assert_eq!(code(&["nomad-rs", "job", "run"]), Some(exit::ERROR), "a missing file");
        assert_eq!(code(&["nomad-rs", "job", "status", "-bogus"]), Some(exit::ERROR));
        assert_eq!(code(&["nomad-rs", "node", "eligibility", "n1"]), Some(exit::ERROR), "-enable or -disable is required");
        assert_eq!(code(&["nomad-rs", "node", "drain", "-enable", "-force", "-no-deadline", "n1"]), Some(exit::ERROR));
        assert_eq!(code(&["nomad-rs", "job", "-h"]), Some(exit::OK));
        assert_eq!(code(&["nomad-rs", "--version"]), Some(exit::OK));
        assert_ne!(exit::ERROR, exit::PLACEMENT, "scripts tell a failed placement from an error");
    }

    #[test]
    fn failures_carry_their_exit_code() {
        let f = Failure::new("boom");
        assert_eq!((f.code, f.message.as_str()), (1, "boom"));
        assert_eq!(f.code(exit::PLAN_ERROR).code, 255);
    }

    #[test]
    fn both_spellings_parse() {
        let a = Cli::try_parse_from(normalize_args(["nomad-rs", "agent", "-dev", "-data-dir", "/tmp/x"].map(OsString::from))).unwrap();
        let b = Cli::try_parse_from(["nomad-rs", "agent", "--dev", "--data-dir", "/tmp/x"]).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
