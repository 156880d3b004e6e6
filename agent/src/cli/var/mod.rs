//! `nomad-rs var init|put|get|list|purge`: Nomad Variables (Nomad's `command/var_*.go`), over
//! `/v1/var/<path>` and `/v1/vars`.
//!
//! Writes are check-and-set unless `-force`; a conflict prints Nomad's "Check-and-Set conflict"
//! with the server's index and exits 1. Output formats are Nomad's (`-out`); the default is a
//! table (or the plain message for `put`) on a terminal and JSON when stdout is redirected.
//! `-out go-template` is refused: nomad-rs has no Go template engine for the CLI yet.

pub mod get;
pub mod init;
pub mod list;
pub mod purge;
pub mod put;
pub mod spec;

use std::collections::BTreeMap;
use std::io::IsTerminal;

use clap::{Args, Subcommand};
use nomad_proto::variables::Variable;
use serde::Serialize;

use super::api::{ApiError, ApiFlags, encode_path};
use super::format::{format_time, kv, safe, safe_json};
use super::{CmdResult, Failure, format::Style};

/// Nomad's messages.
pub const ERR_MISSING_TEMPLATE: &str = "A template must be supplied using '-template' when using go-template formatting";
/// `-template` without `-out go-template`.
pub const ERR_UNEXPECTED_TEMPLATE: &str = "The '-template' flag is only valid when using 'go-template' formatting";
/// `var get` of a path that holds no variable (or one the token may not read).
pub const ERR_VARIABLE_NOT_FOUND: &str = "Variable not found";
/// `var list` found nothing.
pub const ERR_NO_MATCHING_VARIABLES: &str = "No matching variables found";
/// A bad `-in`.
pub const ERR_INVALID_IN_FORMAT: &str = "Invalid value for \"-in\"; valid values are [hcl, json]";
/// A bad `-out` for `put` and `get`.
pub const ERR_INVALID_OUT_FORMAT: &str = "Invalid value for \"-out\"; valid values are [go-template, hcl, json, none, table]";
/// A bad `-out` for `list`.
pub const ERR_INVALID_LIST_OUT_FORMAT: &str = "Invalid value for \"-out\"; valid values are [go-template, json, table, terse]";
/// `-namespace '*'` on a command about one variable.
pub const ERR_WILDCARD_NAMESPACE: &str = "The wildcard namespace (\"*\") is not valid for this command.";
/// What nomad-rs says for `-out go-template`.
pub const ERR_GO_TEMPLATE_UNSUPPORTED: &str =
    "-out go-template is not supported by nomad-rs yet (it has no Go template engine); use -out json with a JSON tool";

/// `nomad-rs var`.
#[derive(Debug, Args)]
pub struct VarArgs {
    /// General options.
    #[command(flatten)]
    pub api: ApiFlags,
    /// The var command.
    #[command(subcommand)]
    pub command: VarCommand,
}

/// Var commands.
#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// Write an example variable specification (spec.nv.hcl or spec.nv.json).
    Init(init::InitArgs),
    /// Create or update a variable from a specification and/or key=value pairs.
    Put(put::PutArgs),
    /// Show a variable, or one of its items.
    Get(get::GetArgs),
    /// List variables (metadata only), optionally under a path prefix.
    List(list::ListArgs),
    /// Delete a variable for good.
    Purge(purge::PurgeArgs),
}

/// Runs a var command.
pub async fn run(a: VarArgs) -> CmdResult {
    match a.command {
        VarCommand::Init(i) => init::run(i),
        VarCommand::Put(p) => put::run(&a.api, p).await,
        VarCommand::Get(g) => get::run(&a.api, g).await,
        VarCommand::List(l) => list::run(&a.api, l).await,
        VarCommand::Purge(p) => purge::run(&a.api, p).await,
    }
}

/// A path as Nomad's client sends it: spaces and slashes trimmed from both ends.
pub fn clean_path(path: &str) -> &str {
    path.trim_matches(|c| c == ' ' || c == '/')
}

/// Whether a read error means "no such variable" (a 404 from a server that serves variables,
/// or a 403: Nomad's client reads both as absent).
pub fn is_absent(e: &crate::cli::api::ApiError) -> bool {
    matches!(e, crate::cli::api::ApiError::Status { code: 403, .. }) || (e.is_not_found() && !e.is_unsupported_route())
}

/// The API path of a variable.
pub fn var_url(path: &str) -> String {
    format!("/v1/var/{}", encode_path(clean_path(path)))
}

/// Refuses `-namespace '*'` (the flag, as Nomad checks it) for commands about one variable.
pub fn refuse_wildcard(api: &ApiFlags) -> Result<(), Failure> {
    if api.namespace.as_deref() == Some("*") {
        return Err(Failure::new(ERR_WILDCARD_NAMESPACE));
    }
    Ok(())
}

/// `-out`'s default: `terminal` when stdout is a terminal, else `json` (Nomad's rule).
pub fn default_out(out: Option<String>, terminal: &str) -> String {
    out.unwrap_or_else(|| if std::io::stdout().is_terminal() { terminal.to_string() } else { "json".to_string() })
}

/// Checks `-out` and `-template` in Nomad's order; `go-template` with a template is refused
/// as not supported yet.
pub fn check_out(out: &str, template: Option<&str>, valid: &[&str], invalid: &str) -> Result<(), Failure> {
    let template = template.filter(|t| !t.is_empty());
    if out != "go-template" && template.is_some() {
        return Err(Failure::new(ERR_UNEXPECTED_TEMPLATE));
    }
    match out {
        "go-template" if template.is_none() => Err(Failure::new(ERR_MISSING_TEMPLATE)),
        "go-template" => Err(Failure::new(ERR_GO_TEMPLATE_UNSUPPORTED)),
        o if valid.contains(&o) => Ok(()),
        _ => Err(Failure::new(invalid)),
    }
}

/// Why `-check-index` did not parse (Go's `strconv.ParseUint` cases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckIndexError {
    /// Not a number.
    Syntax,
    /// Over `u64::MAX`.
    Range,
}

/// `-check-index`: `None` when not given.
pub fn parse_check_index(s: &str) -> Result<Option<u64>, CheckIndexError> {
    if s.is_empty() {
        return Ok(None);
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CheckIndexError::Syntax);
    }
    s.parse().map(Some).map_err(|_| CheckIndexError::Range)
}

/// A variable in the field order of Nomad's API type (its JSON output).
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct GoVariable<'a> {
    namespace: &'a str,
    path: &'a str,
    create_index: u64,
    modify_index: u64,
    create_time: i64,
    modify_time: i64,
    items: &'a BTreeMap<String, String>,
}

impl<'a> GoVariable<'a> {
    /// The view of `v`.
    pub fn of(v: &'a Variable) -> GoVariable<'a> {
        GoVariable {
            namespace: &v.namespace,
            path: &v.path,
            create_index: v.create_index,
            modify_index: v.modify_index,
            create_time: v.create_time,
            modify_time: v.modify_time,
            items: &v.items,
        }
    }
}

/// `-out json`: the variable as indented JSON, printed safe.
pub fn render_json(v: &Variable) -> String {
    safe_json(&serde_json::to_string_pretty(&GoVariable::of(v)).unwrap_or_default()).into_owned()
}

/// `-out hcl`: a specification `var put` reads back (Nomad's layout: items right-aligned on `=`).
/// Unlike Nomad's, keys that are not HCL identifiers are quoted and `${`/`%{` in values are
/// escaped, since HCL2 (which `var put` reads) would otherwise take them for expressions.
pub fn render_hcl(v: &Variable) -> String {
    let keys: Vec<String> = v.items.keys().map(|k| hcl_key(k)).collect();
    let pad = keys.iter().map(|k| k.chars().count()).max().unwrap_or(0);
    let items: String =
        keys.iter().zip(v.items.values()).map(|(k, val)| format!("  {k:>pad$} = {}\n", go_quote(&hcl_escape_template(val)))).collect();
    format!(
        "\nnamespace    = \"{}\"\npath         = \"{}\"\ncreate_index = {}  # Set by server\nmodify_index = {}  # Set by server; consulted for check-and-set\ncreate_time  = {}   # Set by server\nmodify_time  = {}   # Set by server\n\nitems = {{\n{items}}}\n",
        safe(&v.namespace),
        safe(&v.path),
        v.create_index,
        v.modify_index,
        v.create_time,
        v.modify_time,
    )
}

/// `-out table`: metadata, then the items.
pub fn render_table(v: &Variable, style: &Style) -> String {
    let mut meta = vec![("Namespace", v.namespace.clone()), ("Path", v.path.clone()), ("Create Time", format_time(v.create_time))];
    if v.create_time != v.modify_time {
        meta.push(("Modify Time", format_time(v.modify_time)));
    }
    meta.push(("Check Index", v.modify_index.to_string()));
    let items: Vec<(&str, String)> = v.items.iter().map(|(k, val)| (k.as_str(), val.clone())).collect();
    format!("{}\n\n{}\n{}", kv(&meta), style.bold("Items"), kv(&items))
}

/// An item key as HCL reads it back: bare when it is an identifier, else quoted.
fn hcl_key(k: &str) -> String {
    let mut chars = k.chars();
    let ident = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ident { k.to_string() } else { go_quote(k) }
}

/// `${` and `%{` written as HCL's literal escapes `$${` and `%%{`.
fn hcl_escape_template(s: &str) -> String {
    s.replace("${", "$${").replace("%{", "%%{")
}

/// Text quoted as Go's `%q` does: `"`, `\` and control characters escaped, the rest kept. Other
/// controls are written `\u00XX` (Go writes `\x1b`), which HCL reads back too.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if nomad_proto::validate::is_unsafe_char(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Greedy word wrap at `width` characters; runs of spaces inside a line are kept.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    let mut pending = 0;
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            pending += 1;
        }
        if word.is_empty() {
            continue;
        }
        let w = word.chars().count();
        if len > 0 && len + pending + w > width {
            lines.push(std::mem::take(&mut line));
            len = 0;
        }
        if len == 0 {
            pending = 0;
        }
        line.push_str(&" ".repeat(pending));
        line.push_str(word);
        len += pending + w;
        pending = 0;
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// The current variable a 409 answer carries, when `e` is a check-and-set conflict.
pub fn conflict_of(e: &ApiError) -> Option<Variable> {
    match e {
        ApiError::Status { code: 409, body } => Some(nomad_proto::lenient::from_trusted_slice(body.as_bytes()).unwrap_or_default()),
        _ => None,
    }
}

/// Nomad's check-and-set conflict message (stderr, exit 1): the index given, the server's, when
/// it last changed, and the flags that would go through.
pub fn cas_conflict(check_index: u64, current: &Variable) -> Failure {
    let last = if current.modify_index > 0 {
        format!("The server-side item was last updated on {}.", format_time(current.modify_time))
    } else {
        String::new()
    };
    let text = format!(
        "Your provided check-index ({check_index}) does not match the server-side index ({0}). {last} If you are sure you want to perform this operation, add the -force or -check-index={0} flag before the positional arguments.",
        current.modify_index
    );
    let body: Vec<String> = wrap(&text, 76).into_iter().map(|l| format!("    {l}")).collect();
    Failure::new(format!("\nCheck-and-Set conflict\n\n{}\n", body.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var() -> Variable {
        Variable {
            namespace: "default".into(),
            path: "app/db".into(),
            create_index: 10,
            modify_index: 12,
            create_time: 1_700_000_000_000_000_000,
            modify_time: 1_700_000_100_000_000_000,
            items: BTreeMap::from([("user".into(), "admin".into()), ("password".into(), "s3\"cr\\et\n".into())]),
        }
    }

    #[test]
    fn json_is_in_nomads_field_order() {
        let out = render_json(&var());
        let keys: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("  \"")).map(|l| l.split('"').next().unwrap()).collect();
        assert_eq!(keys, ["Namespace", "Path", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime", "Items"]);
        let back: Variable = serde_json::from_str(&out).unwrap();
        assert_eq!(back, var());
    }

    #[test]
    fn hcl_output_is_nomads_layout_and_reads_back_as_a_spec() {
        let out = render_hcl(&var());
        assert!(out.starts_with("\nnamespace    = \"default\"\npath         = \"app/db\"\n"), "{out}");
        assert!(out.contains("modify_index = 12  # Set by server; consulted for check-and-set\n"), "{out}");
        assert!(out.ends_with("items = {\n  password = \"s3\\\"cr\\\\et\\n\"\n      user = \"admin\"\n}\n"), "{out}");
        let back = spec::parse_hcl_spec(&out).unwrap();
        assert_eq!(back, var());
        // Keys that are no identifiers and template sequences read back as they were.
        let mut odd = var();
        odd.items = BTreeMap::from([
            ("db.name".into(), "${x} %{y}".into()),
            ("2fa".into(), "o\u{1b}n\u{202e}".into()),
            ("ok-key".into(), "v".into()),
        ]);
        let out = render_hcl(&odd);
        assert!(out.contains("  \"db.name\" = \"$${x} %%{y}\"\n"), "{out}");
        assert!(out.contains("     ok-key = \"v\"\n"), "{out}");
        assert_eq!(spec::parse_hcl_spec(&out).unwrap(), odd);
    }

    #[test]
    fn table_shows_metadata_then_items() {
        let out = render_table(&var(), &Style::plain());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "Namespace   = default");
        assert_eq!(lines[1], "Path        = app/db");
        assert!(lines[2].starts_with("Create Time = 2023-11-"), "{out}");
        assert!(lines[3].starts_with("Modify Time = 2023-11-"), "{out}");
        assert_eq!(lines[4], "Check Index = 12");
        assert_eq!(&lines[5..], ["", "Items", "password = s3\"cr\\et\\n", "user     = admin"]);
    }

    #[test]
    fn a_conflict_names_both_indexes_and_the_way_through() {
        let f = cas_conflict(0, &var());
        assert_eq!(f.code, 1);
        let lines: Vec<&str> = f.message.lines().collect();
        assert_eq!(lines[..3], ["", "Check-and-Set conflict", ""]);
        assert_eq!(lines[3], "    Your provided check-index (0) does not match the server-side index (12). The");
        let unwrapped = f.message.replace("\n    ", " ");
        assert!(unwrapped.contains("add the -force or -check-index=12 flag before the positional arguments.\n"), "{}", f.message);
        assert!(unwrapped.contains("The server-side item was last updated on 2023-11-"), "{}", f.message);
        assert!(lines.iter().all(|l| l.chars().count() <= 80));
        let missing = cas_conflict(5, &Variable::default());
        assert!(missing.message.contains("server-side index (0).  If\n    you are sure"), "{}", missing.message);
    }

    #[test]
    fn out_flags_are_checked_in_nomads_order() {
        let valid = ["none", "json", "hcl", "table"];
        assert_eq!(check_out("json", None, &valid, ERR_INVALID_OUT_FORMAT), Ok(()));
        assert_eq!(check_out("json", Some("{{.Path}}"), &valid, ERR_INVALID_OUT_FORMAT).unwrap_err().message, ERR_UNEXPECTED_TEMPLATE);
        assert_eq!(check_out("go-template", None, &valid, ERR_INVALID_OUT_FORMAT).unwrap_err().message, ERR_MISSING_TEMPLATE);
        assert_eq!(check_out("go-template", Some("x"), &valid, ERR_INVALID_OUT_FORMAT).unwrap_err().message, ERR_GO_TEMPLATE_UNSUPPORTED);
        assert_eq!(check_out("yaml", None, &valid, ERR_INVALID_OUT_FORMAT).unwrap_err().message, ERR_INVALID_OUT_FORMAT);
    }

    #[test]
    fn check_index_parses_as_go_does() {
        assert_eq!(parse_check_index(""), Ok(None));
        assert_eq!(parse_check_index("42"), Ok(Some(42)));
        assert_eq!(parse_check_index("+4"), Err(CheckIndexError::Syntax));
        assert_eq!(parse_check_index("x"), Err(CheckIndexError::Syntax));
        assert_eq!(parse_check_index("99999999999999999999999"), Err(CheckIndexError::Range));
    }

    #[test]
    fn paths_are_trimmed_as_nomads_client_does() {
        assert_eq!(var_url(" /app/db/ "), "/v1/var/app/db");
        assert_eq!(go_quote("a\"b\u{1b}"), "\"a\\\"b\\u001b\"");
        assert_eq!(wrap("aaa bbb ccc", 7), ["aaa bbb", "ccc"]);
    }
}
