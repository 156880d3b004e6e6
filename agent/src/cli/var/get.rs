//! `nomad-rs var get [-item <key>] [-out ...] <path>`: `GET /v1/var/<path>`.
//!
//! A path with no variable, or one the token may not read, is "Variable not found" (exit 1), as
//! in Nomad, whose client reads both answers as absent.

use std::io::{IsTerminal, Write};

use clap::Args;
use nomad_proto::variables::Variable;

use super::{
    ERR_INVALID_OUT_FORMAT, ERR_VARIABLE_NOT_FOUND, check_out, default_out, is_absent, refuse_wildcard, render_hcl, render_json,
    render_table, var_url,
};
use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::safe_lines;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Flags and argument of `var get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// Print only this item's value, without a trailing newline (for pipes).
    #[arg(long, value_name = "KEY")]
    pub item: Option<String>,
    /// Output format: hcl, json, none or table (default table on a terminal, json otherwise).
    #[arg(long, value_name = "FORMAT")]
    pub out: Option<String>,
    /// A Go template for -out go-template (not supported by nomad-rs yet).
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// The variable's path.
    #[arg(value_name = "PATH")]
    pub path: String,
}

/// Runs `var get`.
pub async fn run(api: &ApiFlags, a: GetArgs) -> CmdResult {
    let out = default_out(a.out.clone(), "table");
    check_out(&out, a.template.as_deref(), &["hcl", "json", "none", "table"], ERR_INVALID_OUT_FORMAT)?;
    refuse_wildcard(api)?;
    let ctx = Ctx::new(api)?;
    let v: Variable = match ctx.client.get(&var_url(&a.path), &Query::new()).await {
        Ok(answer) => answer.value,
        Err(e) if is_absent(&e) => return Err(Failure::new(ERR_VARIABLE_NOT_FOUND)),
        Err(e) => return Err(Failure::new(format!("Error retrieving variable: {e}"))),
    };
    if let Some(item) = a.item.as_deref().filter(|i| !i.is_empty()) {
        let Some(value) = v.items.get(item) else {
            return Err(Failure::new(format!("Variable does not contain {item:?} item")));
        };
        // Raw for pipes and files; made safe only when a terminal would interpret it.
        let mut stdout = std::io::stdout().lock();
        let text = if stdout.is_terminal() { safe_lines(value) } else { value.as_str().into() };
        let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
        return Ok(exit::OK);
    }
    let text = match out.as_str() {
        "json" => render_json(&v),
        "hcl" => render_hcl(&v),
        "none" => return Ok(exit::OK),
        _ => render_table(&v, &ctx.style),
    };
    println!("{text}");
    Ok(exit::OK)
}
