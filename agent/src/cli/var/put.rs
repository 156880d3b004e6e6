//! `nomad-rs var put [options] <path> [@spec|-] [key=value ...]` and
//! `nomad-rs var put [options] <@spec|-> [key=value ...]`: create or update a variable.
//!
//! The variable is the specification (if any) with the path argument, the `-namespace` flag and
//! the `key=value` pairs on top (`key=` removes an item). Without `-force` the write is a
//! check-and-set at the specification's ModifyIndex, `-check-index`, or else 0 (create only), so
//! overwriting an existing variable takes one of them; a conflict exits 1 with Nomad's message.

use clap::Args;
use nomad_proto::variables::Variable;

use super::spec::{Inputs, MAX_SPEC_BYTES, ProcessInputs, invalid_identifier_warning, parse_hcl_spec, parse_json_spec, parse_pairs};
use super::{
    CheckIndexError, ERR_INVALID_IN_FORMAT, ERR_INVALID_OUT_FORMAT, GoVariable, check_out, clean_path, conflict_of, default_out, go_quote,
    parse_check_index, refuse_wildcard, render_hcl, render_json, render_table, var_url,
};
use crate::cli::api::{ApiFlags, Query};
use crate::cli::format::safe_lines;
use crate::cli::{CmdResult, Ctx, Failure, exit};

/// Flags and arguments of `var put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    /// Write regardless of the variable's index on the server (no check-and-set).
    #[arg(long)]
    pub force: bool,
    /// Write only if the variable's modify index on the server is this (0: only if it does not
    /// exist); overrides a specification's modify_index.
    #[arg(long = "check-index", value_name = "INDEX")]
    pub check_index: Option<String>,
    /// Format of a specification read from stdin, or from a file whose name ends in neither
    /// .hcl nor .json: hcl or json (default json).
    #[arg(long = "in", value_name = "FORMAT")]
    pub input: Option<String>,
    /// How to print the written variable: none, hcl, json or table (default none on a terminal,
    /// json otherwise).
    #[arg(long, value_name = "FORMAT")]
    pub out: Option<String>,
    /// A Go template for -out go-template (not supported by nomad-rs yet).
    #[arg(long, value_name = "TEMPLATE")]
    pub template: Option<String>,
    /// Say what is done on stderr.
    #[arg(long)]
    pub verbose: bool,
    /// The path (or @spec-file or - for a specification on stdin), then optionally @spec-file or
    /// -, then key=value pairs (key=@file reads a file, key=- stdin, key= removes the item).
    #[arg(value_name = "ARGS", required = true, num_args = 1..)]
    pub args: Vec<String>,
}

fn is_stdin(arg: &str) -> bool {
    arg == "-"
}

fn file_ref(arg: &str) -> Option<&str> {
    arg.strip_prefix('@')
}

/// A specification file's format: from its extension, else `-in` when given.
fn file_format(path: &str, input: Option<&str>) -> Result<String, Failure> {
    match std::path::Path::new(path).extension().and_then(|e| e.to_str()) {
        Some("json") => Ok("json".into()),
        Some("hcl") => Ok("hcl".into()),
        _ => match input {
            Some(f) => Ok(f.to_string()),
            None => Err(Failure::new(format!("Unable to determine format of {path}; Use the -in flag to specify it."))),
        },
    }
}

/// A specification's text and format.
struct Spec {
    text: String,
    format: String,
}

fn spec_text(bytes: Vec<u8>, format: String, name: &str) -> Result<Spec, Failure> {
    let text = String::from_utf8(bytes).map_err(|_| Failure::new(format!("Failed to parse variable data: {name} is not UTF-8 text")))?;
    Ok(Spec { text, format })
}

/// The variable to write before the pairs: the specification with the path argument and the
/// `-namespace` flag on top (either resets the server-set fields, as for a copy), or an empty
/// one at `path`.
fn make_variable(spec: Option<Spec>, path: &str, namespace: Option<&str>) -> Result<Variable, String> {
    let Some(spec) = spec.filter(|s| !s.text.is_empty()) else {
        return Ok(Variable { path: path.to_string(), namespace: namespace.unwrap_or_default().to_string(), ..Variable::default() });
    };
    let mut v = match spec.format.as_str() {
        "hcl" => parse_hcl_spec(&spec.text)?,
        _ => parse_json_spec(&spec.text)?,
    };
    let mut reset = false;
    if let Some(ns) = namespace.filter(|ns| !ns.is_empty() && *ns != v.namespace) {
        v.namespace = ns.to_string();
        reset = true;
    }
    if !path.is_empty() && path != v.path {
        v.path = path.to_string();
        reset = true;
    }
    if reset {
        (v.create_index, v.create_time, v.modify_index, v.modify_time) = (0, 0, 0, 0);
    }
    Ok(v)
}

/// Applies the pairs: an empty value removes the item. Returns the warnings for keys that are
/// not identifiers.
fn apply_pairs(v: &mut Variable, pairs: Vec<(String, String)>, verbose: &dyn Fn(&str)) -> Vec<String> {
    let mut warnings = Vec::new();
    for (key, value) in pairs {
        if value.is_empty() {
            if v.items.remove(&key).is_some() {
                verbose(&format!("Removed item {key:?}"));
            } else {
                verbose(&format!("Item {key:?} does not exist, continuing..."));
            }
            continue;
        }
        warnings.extend(invalid_identifier_warning(&key));
        v.items.insert(key, value);
    }
    warnings
}

/// Nomad's warnings block (stderr).
pub fn format_warnings(header: &str, warnings: &[String]) -> String {
    let count = if warnings.len() == 1 { "1 warning:".to_string() } else { format!("{} warnings:", warnings.len()) };
    let list: String = warnings.iter().map(|w| format!("\n* {}", w.trim())).collect();
    format!("{header} Warnings:\n{count}\n{list}\n")
}

/// Runs `var put`.
pub async fn run(api: &ApiFlags, a: PutArgs) -> CmdResult {
    let verbose = |m: &str| {
        if a.verbose {
            eprintln!("{}", safe_lines(m));
        }
    };
    let check_str = a.check_index.clone().unwrap_or_default();
    let check_index = parse_check_index(&check_str).map_err(|e| {
        let why = if e == CheckIndexError::Range { "value out of range" } else { "invalid syntax" };
        Failure::new(format!("Error parsing check-index value {check_str:?}: strconv.ParseUint: parsing {check_str:?}: {why}"))
    })?;
    refuse_wildcard(api)?;
    let args = &a.args;
    if args.len() == 1 && !is_stdin(&args[0]) && file_ref(&args[0]).is_none() {
        return Err(Failure::new("Must supply data"));
    }
    let input = a.input.as_deref();
    let in_fmt = input.unwrap_or("json").to_string();
    if !matches!(in_fmt.as_str(), "hcl" | "json") {
        return Err(Failure::new(ERR_INVALID_IN_FORMAT));
    }
    let out = default_out(a.out.clone(), "none");
    check_out(&out, a.template.as_deref(), &["none", "json", "hcl", "table"], ERR_INVALID_OUT_FORMAT)?;

    let mut inputs = ProcessInputs::default();
    let mut spec = None;
    let mut path = String::new();
    let first = &args[0];
    if is_stdin(first) {
        let bytes = inputs.stdin(MAX_SPEC_BYTES).map_err(|e| Failure::new(format!("Error reading from stdin: {e}")))?;
        verbose(&format!("Reading whole {} variable specification from stdin", in_fmt.to_uppercase()));
        spec = Some(spec_text(bytes, in_fmt.clone(), "stdin")?);
    } else if let Some(file) = file_ref(first) {
        let format = file_format(file, input)?;
        verbose(&format!("Reading whole {} variable specification from {file:?}", format.to_uppercase()));
        let bytes = inputs.file(file, MAX_SPEC_BYTES).map_err(|e| Failure::new(format!("Error reading {file:?}: {e}")))?;
        spec = Some(spec_text(bytes, format, file)?);
    } else {
        path = first.trim().trim_matches('/').to_string();
        verbose(&format!("Writing to path {path:?}"));
    }
    let mut rest = &args[1..];
    if let Some(second) = rest.first() {
        if is_stdin(second) {
            verbose(&format!("Creating variable {path:?} using specification from stdin"));
            let bytes = inputs.stdin(MAX_SPEC_BYTES).map_err(|e| Failure::new(format!("Error reading from stdin: {e}")))?;
            spec = Some(spec_text(bytes, in_fmt.clone(), "stdin")?);
            rest = &rest[1..];
        } else if let Some(file) = file_ref(second) {
            let format = file_format(file, input)?;
            verbose(&format!("Creating variable {path:?} from specification file {second:?}"));
            let bytes = inputs.file(file, MAX_SPEC_BYTES).map_err(|e| Failure::new(format!("error reading {file:?}: {e}")))?;
            spec = Some(spec_text(bytes, format, file)?);
            rest = &rest[1..];
        }
    }
    let mut v =
        make_variable(spec, &path, api.namespace.as_deref()).map_err(|e| Failure::new(format!("Failed to parse variable data: {e}")))?;
    let pairs = parse_pairs(rest, &mut inputs).map_err(|e| Failure::new(format!("Failed to parse K=V data: {e}")))?;
    let warnings = apply_pairs(&mut v, pairs, &verbose);

    let ctx = Ctx::new(api)?;
    if let Some(ci) = check_index {
        v.modify_index = ci;
    }
    v.path = clean_path(&v.path).to_string();
    if v.path.is_empty() {
        return Err(Failure::new(
            "Error creating variable: no path; give it as the first argument or as the specification's path".to_string(),
        ));
    }
    let q = if a.force { Query::new() } else { Query::new().param("cas", v.modify_index.to_string()) };
    let written: Variable = match ctx.client.put(&var_url(&v.path), &q, &GoVariable::of(&v)).await {
        Ok(answer) => answer.value,
        Err(e) => {
            return Err(match conflict_of(&e) {
                Some(current) => super::cas_conflict(v.modify_index, &current),
                None => Failure::new(format!("Error creating variable: {e}")),
            });
        }
    };
    let success = format!("Created variable {} with modify index {}", go_quote(&written.path), written.modify_index);
    if !warnings.is_empty() {
        eprintln!("{}", safe_lines(&format_warnings("Variable", &warnings)));
    }
    let text = match out.as_str() {
        "json" => render_json(&written),
        "hcl" => render_hcl(&written),
        "table" => render_table(&written, &ctx.style),
        _ => {
            println!("{}", safe_lines(&success));
            return Ok(exit::OK);
        }
    };
    verbose(&success);
    println!("{text}");
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn spec(text: &str, format: &str) -> Option<Spec> {
        Some(Spec { text: text.into(), format: format.into() })
    }

    #[test]
    fn the_path_argument_and_namespace_flag_override_a_spec_and_reset_its_indexes() {
        let text = r#"{"Namespace":"default","Path":"a","ModifyIndex":7,"CreateIndex":3,"Items":{"k":"v"}}"#;
        let same = make_variable(spec(text, "json"), "", None).unwrap();
        assert_eq!((same.path.as_str(), same.modify_index, same.create_index), ("a", 7, 3), "kept for check-and-set");
        let copied = make_variable(spec(text, "json"), "b", None).unwrap();
        assert_eq!((copied.path.as_str(), copied.modify_index, copied.create_index), ("b", 0, 0));
        let moved = make_variable(spec(text, "json"), "", Some("prod")).unwrap();
        assert_eq!((moved.namespace.as_str(), moved.modify_index), ("prod", 0));
        let bare = make_variable(None, "c", None).unwrap();
        assert_eq!((bare.path.as_str(), bare.items.len()), ("c", 0));
        let hcl = make_variable(spec("path = \"h\"\nitems { x = \"1\" }", "hcl"), "", None).unwrap();
        assert_eq!(hcl.items, BTreeMap::from([("x".to_string(), "1".to_string())]));
    }

    #[test]
    fn empty_values_remove_items_and_odd_keys_warn() {
        let mut v = Variable { items: BTreeMap::from([("old".into(), "1".into())]), ..Variable::default() };
        let said = std::cell::RefCell::new(Vec::new());
        let pairs =
            vec![("old".into(), String::new()), ("gone".into(), String::new()), ("a.b".into(), "2".into()), ("ok".into(), "3".into())];
        let warnings = apply_pairs(&mut v, pairs, &|m| said.borrow_mut().push(m.to_string()));
        assert_eq!(v.items, BTreeMap::from([("a.b".into(), "2".into()), ("ok".into(), "3".into())]));
        assert_eq!(*said.borrow(), ["Removed item \"old\"", "Item \"gone\" does not exist, continuing..."]);
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            format_warnings("Variable", &warnings),
            "Variable Warnings:\n1 warning:\n\n* \"a.b\" contains characters [\".\"] that require the 'index' function for direct access in templates\n"
        );
        assert!(format_warnings("Variable", &["a".into(), "b".into()]).starts_with("Variable Warnings:\n2 warnings:\n\n* a\n* b"));
    }

    #[test]
    fn a_spec_files_format_comes_from_its_extension_or_in() {
        assert_eq!(file_format("x.hcl", None).unwrap(), "hcl");
        assert_eq!(file_format("x.nv.json", Some("hcl")).unwrap(), "json");
        assert_eq!(file_format("x.txt", Some("hcl")).unwrap(), "hcl");
        assert_eq!(file_format("x.txt", None).unwrap_err().message, "Unable to determine format of x.txt; Use the -in flag to specify it.");
    }
}
