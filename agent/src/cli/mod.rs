//! The `nomad-rs` command line: one file per command.
//!
//! Nomad's commands take Go-style single-dash long flags (`-config`,
//! `-dev`); [`normalize_args`] turns them into clap's double-dash form, so
//! both spellings work.

pub mod agent;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

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
    /// Print the version.
    Version,
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
        assert_eq!(norm(&["nomad-rs", "agent", "-dev", "-config=a.hcl", "--bind", "x", "-h", "-1", "-"]), vec![
            "nomad-rs", "agent", "--dev", "--config=a.hcl", "--bind", "x", "-h", "-1", "-"
        ]);
        assert_eq!(norm(&["job", "run", "--", "-not-a-flag"]), vec!["job", "run", "--", "-not-a-flag"]);
    }

    #[test]
    fn both_spellings_parse() {
        let a = Cli::try_parse_from(normalize_args(["nomad-rs", "agent", "-dev", "-data-dir", "/tmp/x"].map(OsString::from))).unwrap();
        let b = Cli::try_parse_from(["nomad-rs", "agent", "--dev", "--data-dir", "/tmp/x"]).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
