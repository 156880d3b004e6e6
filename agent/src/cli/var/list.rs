//! `nomad-rs var list [-per-page N] [-page-token T] [-filter expr] [-out ...] [<prefix>]`:
//! `GET /v1/vars`, metadata only. The next page's token goes to stderr (stdout keeps the list),
//! or into the JSON with `-per-page`.

use std::time::Instant;

use clap::Args;
use nomad_proto::variables::VariableMetadata;
use serde::Serialize;

use super::{ERR_INVALID_LIST_OUT_FORMAT, ERR_NO_MATCHING_VARIABLES, check_out, default_out};
use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::{format_time, safe_json, safe_lines, table, table_with_header};
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Nomad's warning for `-filter`.
pub const MSG_WARN_FILTER_PERFORMANCE: &str = "Filter queries require a full scan of the data; use prefix searching where possible";

/// Flags and argument of `var list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// How many variables per page.
    #[arg(long = "per-page", value_name = "N")]
    pub per_page: Option<u32>,
    /// Where the page starts (a token a previous page gave).
    #[arg(long = "page-token", value_name = "TOKEN")]
    pub page_token: Option<String>,
    /// A filter expression over the listed metadata (slower than a prefix).
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,
    /// Output format: json, table or terse (default table on a terminal, json otherwise).
    #[arg(long, value_name = "FORMAT")]
    pub out: Option<String>,
    /// A Go template for -out go-template (not supported by nomad-rs yet).
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// Only variables whose path starts with this.
    #[arg(value_name = "PREFIX")]
    pub prefix: Option<String>,
}

/// Metadata in the field order of Nomad's API type.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct GoMetadata<'a> {
    namespace: &'a str,
    path: &'a str,
    create_index: u64,
    modify_index: u64,
    create_time: i64,
    modify_time: i64,
}

impl<'a> GoMetadata<'a> {
    fn of(m: &'a VariableMetadata) -> GoMetadata<'a> {
        GoMetadata {
            namespace: &m.namespace,
            path: &m.path,
            create_index: m.create_index,
            modify_index: m.modify_index,
            create_time: m.create_time,
            modify_time: m.modify_time,
        }
    }
}

/// Nomad's `QueryMeta`, which `-out json -per-page` prints next to the page.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct QueryMeta {
    last_index: u64,
    last_contact: i64,
    known_leader: bool,
    request_time: i64,
    next_token: String,
}

/// `-out json -per-page`: the page and its metadata.
#[derive(Debug, Serialize)]
#[serde(rename_all = "PascalCase")]
struct Page<'a> {
    data: Vec<GoMetadata<'a>>,
    query_meta: QueryMeta,
}

/// JSON indented by four spaces, as Nomad's list formatter writes it.
fn json4(v: &impl Serialize) -> String {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    let _ = v.serialize(&mut ser);
    safe_json(&String::from_utf8_lossy(&buf)).into_owned()
}

/// Nomad's table: namespace, path and last update, sorted by namespace then path.
pub fn render_table(vars: &mut [VariableMetadata]) -> String {
    if vars.is_empty() {
        return ERR_NO_MATCHING_VARIABLES.to_string();
    }
    vars.sort_by(|a, b| a.namespace.cmp(&b.namespace).then_with(|| a.path.cmp(&b.path)));
    let rows = vars.iter().map(|v| vec![v.namespace.clone(), v.path.clone(), format_time(v.modify_time)]).collect();
    table_with_header(&["Namespace", "Path", "Last Updated"], rows)
}

/// `-out terse`: paths, with their namespace when listing all namespaces.
pub fn render_terse(vars: &[VariableMetadata], all_namespaces: bool) -> String {
    let rows: Vec<Vec<String>> =
        vars.iter().map(|v| if all_namespaces { vec![v.namespace.clone(), v.path.clone()] } else { vec![v.path.clone()] }).collect();
    table(&rows)
}

/// Runs `var list`.
pub async fn run(api: &ApiFlags, a: ListArgs) -> CmdResult {
    let out = default_out(a.out.clone(), "table");
    check_out(&out, a.template.as_deref(), &["json", "terse", "table"], ERR_INVALID_LIST_OUT_FORMAT)?;
    let ctx = Ctx::new(api)?;
    let filter = a.filter.clone().unwrap_or_default();
    if !filter.is_empty() {
        eprintln!("{MSG_WARN_FILTER_PERFORMANCE}");
    }
    let per_page = a.per_page.unwrap_or(0);
    let mut q = Query::new();
    if let Some(prefix) = a.prefix.as_deref().filter(|p| !p.is_empty()) {
        q = q.prefix(prefix);
    }
    if !filter.is_empty() {
        q = q.param("filter", filter);
    }
    if per_page > 0 {
        q = q.param("per_page", per_page.to_string());
    }
    if let Some(token) = a.page_token.as_deref().filter(|t| !t.is_empty()) {
        q = q.param("next_token", token);
    }
    let started = Instant::now();
    let (answer, next) = ctx
        .client
        .get_page::<Vec<VariableMetadata>>("/v1/vars", &q)
        .await
        .map_err(|e| Failure::new(format!("Error retrieving vars: {e}")))?;
    let mut vars = answer.value;
    match out.as_str() {
        "json" => {
            let list: Vec<GoMetadata<'_>> = vars.iter().map(GoMetadata::of).collect();
            let text = if per_page > 0 {
                let meta = QueryMeta {
                    last_index: answer.index,
                    last_contact: 0,
                    known_leader: true,
                    request_time: i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX),
                    next_token: next,
                };
                json4(&Page { data: list, query_meta: meta })
            } else {
                json4(&list)
            };
            println!("{text}");
            return Ok(exit::OK);
        }
        "terse" => println!("{}", render_terse(&vars, api.namespace.as_deref() == Some("*"))),
        _ => println!("{}", render_table(&mut vars)),
    }
    if !next.is_empty() {
        eprintln!("{}", safe_lines(&format!("Next page token: {next}")));
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ns: &str, path: &str) -> VariableMetadata {
        VariableMetadata {
            namespace: ns.into(),
            path: path.into(),
            create_index: 5,
            modify_index: 9,
            create_time: 1_700_000_000_000_000_000,
            modify_time: 1_700_000_000_000_000_000,
        }
    }

    #[test]
    fn table_is_sorted_by_namespace_then_path() {
        let mut vars = vec![meta("prod", "a"), meta("default", "b/c"), meta("default", "a")];
        let out = render_table(&mut vars);
        let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().take(2).collect()).collect();
        assert_eq!(rows, [vec!["Namespace", "Path"], vec!["default", "a"], vec!["default", "b/c"], vec!["prod", "a"]]);
        assert!(out.lines().next().unwrap().ends_with("Last Updated"));
        assert_eq!(render_table(&mut []), "No matching variables found");
        assert_eq!(render_terse(&vars, false), "a\nb/c\na");
        assert_eq!(render_terse(&vars[..2], true), "default  a\ndefault  b/c");
    }

    #[test]
    fn json_is_nomads_field_order_indented_by_four() {
        let out = json4(&vec![GoMetadata::of(&meta("default", "a"))]);
        assert!(out.starts_with("[\n    {\n        \"Namespace\": \"default\",\n        \"Path\": \"a\",\n        \"CreateIndex\": 5,\n        \"ModifyIndex\": 9,"), "{out}");
    }
}
