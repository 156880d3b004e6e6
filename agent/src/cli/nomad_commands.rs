//! Nomad 1.6.1's commands (its `command/commands.go`), so a Nomad command nomad-rs does not have
//! yet is named as such instead of being answered with clap's "unrecognized subcommand".

use clap::CommandFactory;

use super::Cli;

/// Every command and command group of Nomad 1.6.1's CLI, deprecated spellings included.
pub const NOMAD_COMMANDS: &[&str] = &[
    "acl",
    "acl auth-method",
    "acl auth-method create",
    "acl auth-method delete",
    "acl auth-method info",
    "acl auth-method list",
    "acl auth-method update",
    "acl binding-rule",
    "acl binding-rule create",
    "acl binding-rule delete",
    "acl binding-rule info",
    "acl binding-rule list",
    "acl binding-rule update",
    "acl bootstrap",
    "acl policy",
    "acl policy apply",
    "acl policy delete",
    "acl policy info",
    "acl policy list",
    "acl role",
    "acl role create",
    "acl role delete",
    "acl role info",
    "acl role list",
    "acl role update",
    "acl token",
    "acl token create",
    "acl token delete",
    "acl token info",
    "acl token list",
    "acl token self",
    "acl token update",
    "agent",
    "agent-info",
    "alloc",
    "alloc checks",
    "alloc exec",
    "alloc fs",
    "alloc logs",
    "alloc restart",
    "alloc signal",
    "alloc status",
    "alloc stop",
    "alloc-status",
    "check",
    "client-config",
    "config",
    "config validate",
    "debug",
    "deployment",
    "deployment fail",
    "deployment list",
    "deployment pause",
    "deployment promote",
    "deployment resume",
    "deployment status",
    "deployment unblock",
    "eval",
    "eval delete",
    "eval list",
    "eval status",
    "eval-status",
    "exec",
    "fmt",
    "fs",
    "init",
    "inspect",
    "job",
    "job allocs",
    "job deployments",
    "job dispatch",
    "job eval",
    "job history",
    "job init",
    "job inspect",
    "job periodic",
    "job periodic force",
    "job plan",
    "job promote",
    "job restart",
    "job revert",
    "job run",
    "job scale",
    "job scaling-events",
    "job status",
    "job stop",
    "job validate",
    "license",
    "license get",
    "login",
    "logs",
    "monitor",
    "namespace",
    "namespace apply",
    "namespace delete",
    "namespace inspect",
    "namespace list",
    "namespace status",
    "node",
    "node config",
    "node drain",
    "node eligibility",
    "node meta",
    "node meta apply",
    "node meta read",
    "node pool",
    "node pool apply",
    "node pool delete",
    "node pool info",
    "node pool init",
    "node pool jobs",
    "node pool list",
    "node pool nodes",
    "node status",
    "node-drain",
    "node-status",
    "operator",
    "operator api",
    "operator autopilot",
    "operator autopilot get-config",
    "operator autopilot set-config",
    "operator client-state",
    "operator debug",
    "operator gossip keyring",
    "operator gossip keyring generate",
    "operator gossip keyring install",
    "operator gossip keyring list",
    "operator gossip keyring remove",
    "operator gossip keyring use",
    "operator metrics",
    "operator raft",
    "operator raft info",
    "operator raft list-peers",
    "operator raft logs",
    "operator raft remove-peer",
    "operator raft state",
    "operator root keyring",
    "operator root keyring list",
    "operator root keyring remove",
    "operator root keyring rotate",
    "operator scheduler",
    "operator scheduler get-config",
    "operator scheduler set-config",
    "operator snapshot",
    "operator snapshot inspect",
    "operator snapshot restore",
    "operator snapshot save",
    "operator snapshot state",
    "plan",
    "plugin",
    "plugin status",
    "quota",
    "quota apply",
    "quota delete",
    "quota init",
    "quota inspect",
    "quota list",
    "quota status",
    "recommendation",
    "recommendation apply",
    "recommendation dismiss",
    "recommendation info",
    "recommendation list",
    "run",
    "scaling",
    "scaling policy",
    "scaling policy info",
    "scaling policy list",
    "sentinel",
    "sentinel apply",
    "sentinel delete",
    "sentinel list",
    "sentinel read",
    "server",
    "server force-leave",
    "server join",
    "server members",
    "server-force-leave",
    "server-join",
    "server-members",
    "service",
    "service delete",
    "service info",
    "service list",
    "status",
    "stop",
    "system",
    "system gc",
    "system reconcile",
    "system reconcile summaries",
    "tls",
    "tls ca",
    "tls ca create",
    "tls ca info",
    "tls cert",
    "tls cert create",
    "tls cert info",
    "ui",
    "validate",
    "var",
    "var get",
    "var init",
    "var list",
    "var purge",
    "var put",
    "version",
    "volume",
    "volume create",
    "volume delete",
    "volume deregister",
    "volume detach",
    "volume init",
    "volume register",
    "volume snapshot",
    "volume snapshot create",
    "volume snapshot delete",
    "volume snapshot list",
    "volume status",
];

/// Every flag of Nomad 1.6.1's `nomad agent` (its `command/agent/command.go`).
pub const NOMAD_AGENT_FLAGS: &[&str] = &[
    "acl-enabled",
    "acl-replication-token",
    "alloc-dir",
    "bind",
    "bootstrap-expect",
    "client",
    "config",
    "consul-address",
    "consul-allow-unauthenticated",
    "consul-auth",
    "consul-auto-advertise",
    "consul-ca-file",
    "consul-cert-file",
    "consul-checks-use-advertise",
    "consul-client-auto-join",
    "consul-client-http-check-name",
    "consul-client-service-name",
    "consul-key-file",
    "consul-server-auto-join",
    "consul-server-http-check-name",
    "consul-server-rpc-check-name",
    "consul-server-serf-check-name",
    "consul-server-service-name",
    "consul-ssl",
    "consul-token",
    "consul-verify-ssl",
    "data-dir",
    "dc",
    "dev",
    "dev-connect",
    "encrypt",
    "join",
    "log-json",
    "log-level",
    "meta",
    "network-interface",
    "network-speed",
    "node",
    "node-class",
    "node-pool",
    "plugin-dir",
    "raft-protocol",
    "region",
    "rejoin",
    "retry-interval",
    "retry-join",
    "retry-max",
    "server",
    "servers",
    "state-dir",
    "vault-address",
    "vault-allow-unauthenticated",
    "vault-ca-file",
    "vault-ca-path",
    "vault-cert-file",
    "vault-create-from-role",
    "vault-enabled",
    "vault-key-file",
    "vault-namespace",
    "vault-tls-server-name",
    "vault-tls-skip-verify",
    "vault-token",
];

/// What `nomad-rs agent` says for a flag of Nomad's agent it does not take: `None` when `arg`
/// (`--vault-address=x`, as clap reports it) is not one of Nomad's.
pub fn unsupported_agent_flag(arg: &str) -> Option<String> {
    let name = arg.trim_start_matches('-').split('=').next().unwrap_or_default();
    NOMAD_AGENT_FLAGS.contains(&name).then(|| format!("\"nomad-rs agent\" does not support -{name} yet"))
}

/// Nomad's old top-level spellings and the command they stand for.
pub const NOMAD_ALIASES: &[(&str, &str)] = &[
    ("alloc-status", "alloc status"),
    ("client-config", "node config"),
    ("eval-status", "eval status"),
    ("exec", "alloc exec"),
    ("fs", "alloc fs"),
    ("init", "job init"),
    ("inspect", "job inspect"),
    ("logs", "alloc logs"),
    ("node-drain", "node drain"),
    ("node-status", "node status"),
    ("plan", "job plan"),
    ("run", "job run"),
    ("server-force-leave", "server force-leave"),
    ("server-join", "server join"),
    ("server-members", "server members"),
    ("stop", "job stop"),
    ("validate", "job validate"),
];

/// Whether nomad-rs has the command `words` (`["job", "run"]`).
pub fn implemented(words: &[&str]) -> bool {
    let mut cmd = Cli::command();
    for w in words {
        match cmd.find_subcommand(w) {
            Some(sub) => cmd = sub.clone(),
            None => return false,
        }
    }
    true
}

/// The Nomad command a command line that clap refused asks for, when nomad-rs does not have it:
/// `nomad-rs job -namespace x history web` asks for `job history`. Flags are skipped; a word that
/// is neither one of our subcommands nor starts a Nomad command is taken for a flag's value when
/// it follows a flag, and ends the search otherwise.
pub fn unimplemented_in(args: &[String]) -> Option<String> {
    let mut cmd = Cli::command();
    let mut path: Vec<&str> = Vec::new();
    let mut after_flag = false;
    for (i, arg) in args.iter().enumerate().skip(1) {
        if arg == "--" {
            return None;
        }
        if arg.starts_with('-') {
            // `-flag=value` carries its value; `-flag value` may be followed by it.
            after_flag = !arg.contains('=');
            continue;
        }
        if let Some(sub) = cmd.find_subcommand(arg) {
            path.push(arg);
            cmd = sub.clone();
            after_flag = false;
            continue;
        }
        if !cmd.has_subcommands() {
            return None;
        }
        // The longest Nomad command spelled by the path and the words that follow.
        let rest: Vec<&str> = args[i..].iter().map(String::as_str).take_while(|w| !w.starts_with('-')).collect();
        for take in (1..=rest.len()).rev() {
            let words: Vec<&str> = path.iter().copied().chain(rest[..take].iter().copied()).collect();
            let name = words.join(" ");
            if NOMAD_COMMANDS.contains(&name.as_str()) {
                return Some(name);
            }
        }
        if !after_flag {
            return None;
        }
        after_flag = false;
    }
    None
}

/// What nomad-rs says for a Nomad command it does not have yet.
pub fn not_implemented_message(name: &str) -> String {
    let mut message = format!("\"nomad-rs {name}\" is not implemented yet");
    if let Some((_, target)) = NOMAD_ALIASES.iter().find(|(old, _)| *old == name) {
        let words: Vec<&str> = target.split(' ').collect();
        if implemented(&words) {
            message.push_str(&format!("; use \"nomad-rs {target}\""));
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_nomad_command_asked_for_is_found_past_flags_and_their_values() {
        assert_eq!(unimplemented_in(&args("nomad-rs job restart web")).as_deref(), Some("job restart"));
        assert_eq!(unimplemented_in(&args("nomad-rs job -namespace prod restart web")).as_deref(), Some("job restart"));
        assert_eq!(unimplemented_in(&args("nomad-rs -h quota apply q.hcl")).as_deref(), Some("quota apply"));
        assert_eq!(unimplemented_in(&args("nomad-rs operator snapshot state x.snap")).as_deref(), Some("operator snapshot state"));
        assert_eq!(unimplemented_in(&args("nomad-rs operator raft info")).as_deref(), Some("operator raft info"));
        assert_eq!(unimplemented_in(&args("nomad-rs volume snapshot list")).as_deref(), Some("volume snapshot list"));
        assert_eq!(unimplemented_in(&args("nomad-rs volume -namespace x init")).as_deref(), Some("volume init"));
        assert_eq!(unimplemented_in(&args("nomad-rs bogus")), None);
        assert_eq!(unimplemented_in(&args("nomad-rs job bogus promote")), None, "an unknown word ends the search");
        assert_eq!(unimplemented_in(&args("nomad-rs job status promote")), None, "a leaf's arguments are not commands");
    }

    /// Every Nomad command nomad-rs lacks is named as such, whatever follows it.
    #[test]
    fn every_nomad_command_is_either_ours_or_reported_as_not_implemented() {
        let mut lacking = 0;
        for name in NOMAD_COMMANDS {
            let words: Vec<&str> = name.split(' ').collect();
            if implemented(&words) {
                continue;
            }
            lacking += 1;
            let line = format!("nomad-rs {name} arg");
            assert_eq!(unimplemented_in(&args(&line)).as_deref(), Some(*name), "{line}");
        }
        // A sanity floor: the table is Nomad's whole command list, most of it not ours yet.
        assert!(lacking > 100, "{lacking}");
        for ours in [
            "job run",
            "job init",
            "alloc logs",
            "operator raft list-peers",
            "version",
            "agent",
            "volume register",
            "volume deregister",
            "volume status",
            "volume create",
            "volume delete",
            "volume detach",
            "plugin status",
            "acl role create",
            "acl role update",
            "var init",
            "var put",
            "var get",
            "var list",
            "var purge",
            "operator root keyring list",
            "operator root keyring rotate",
            "operator root keyring remove",
        ] {
            assert!(implemented(&ours.split(' ').collect::<Vec<_>>()), "{ours}");
        }
    }

    /// Each of Nomad's agent flags is either taken by `nomad-rs agent` or named as not supported.
    #[test]
    fn every_nomad_agent_flag_is_taken_or_refused_by_name() {
        let agent = Cli::command().find_subcommand("agent").cloned().unwrap();
        let ours: Vec<&str> = agent.get_arguments().flat_map(|a| a.get_long_and_visible_aliases().unwrap_or_default()).collect();
        let mut refused = Vec::new();
        for flag in NOMAD_AGENT_FLAGS {
            if ours.contains(flag) {
                assert_eq!(unsupported_agent_flag(&format!("--{flag}")), Some(format!("\"nomad-rs agent\" does not support -{flag} yet")));
                continue;
            }
            refused.push(*flag);
            let line = ["nomad-rs".to_string(), "agent".into(), "-dev".into(), format!("-{flag}=x")];
            assert!(matches!(super::super::parse(line.iter().map(std::ffi::OsString::from)), Err(1)), "{flag}");
        }
        for taken in ["bind", "config", "dev", "encrypt", "meta", "node-class", "state-dir", "retry-join"] {
            assert!(!refused.contains(&taken), "{taken}");
        }
        assert_eq!(unsupported_agent_flag("--bogus"), None);
    }

    #[test]
    fn an_old_spelling_points_at_the_command_we_have() {
        assert_eq!(not_implemented_message("run"), "\"nomad-rs run\" is not implemented yet; use \"nomad-rs job run\"");
        assert_eq!(not_implemented_message("exec"), "\"nomad-rs exec\" is not implemented yet; use \"nomad-rs alloc exec\"");
        assert_eq!(not_implemented_message("quota"), "\"nomad-rs quota\" is not implemented yet");
        for (old, target) in NOMAD_ALIASES {
            assert!(NOMAD_COMMANDS.contains(old) && NOMAD_COMMANDS.contains(target), "{old} -> {target}");
        }
    }
}
