//! The HCL functions a job file may call: exactly Nomad 1.6's list
//! (`jobspec2/functions.go`), which is go-cty's standard library plus
//! go-cty-funcs (cidr, crypto, encoding, filesystem, uuid), hcl's `can`/`try`
//! and `convert`, and go-cty-yaml. A name that is not on that list is an
//! "unknown function", as in Nomad, even where Terraform has it (`regex`,
//! `startswith`, `tostring`, `templatefile`, `timestamp`, ...).
//!
//! Functions get already evaluated arguments and return a value or a message;
//! the evaluator adds the function name and location. `can`, `try` and
//! `convert` look at their argument expressions, not values, so `eval.rs`
//! handles them before evaluating arguments.
//!
//! Every result is bounded: strings by [`MAX_STRING_BYTES`], collections by
//! the evaluator's budget (charged by the size of each result), `range` by
//! cty's 1024 elements, `setproduct` and `fileset` by limits of their own,
//! and files read by [`super::MAX_JOBSPEC_BYTES`].

mod cidr;
mod collections;
mod conversion;
mod crypto;
mod datetime;
mod encoding;
mod files;
mod numeric;
mod strings;
mod uuid;

pub use encoding::write_go_json_string;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;

use hcl::{Map, Value};

use super::eval::{MAX_STRING_BYTES, as_number, as_string, describe, integer_of};

pub(crate) use collections::set_of;
pub(crate) use conversion::convert;

/// Nomad 1.6.1's function names (`jobspec2/functions.go`), sorted.
pub(crate) const NOMAD_FUNCTIONS: &[&str] = &[
    "abs",
    "abspath",
    "base64decode",
    "base64encode",
    "basename",
    "bcrypt",
    "can",
    "ceil",
    "chomp",
    "chunklist",
    "cidrhost",
    "cidrnetmask",
    "cidrsubnet",
    "cidrsubnets",
    "coalesce",
    "coalescelist",
    "compact",
    "concat",
    "contains",
    "convert",
    "csvdecode",
    "dirname",
    "distinct",
    "element",
    "file",
    "filebase64",
    "fileexists",
    "fileset",
    "flatten",
    "floor",
    "format",
    "formatdate",
    "formatlist",
    "indent",
    "index",
    "join",
    "jsondecode",
    "jsonencode",
    "keys",
    "length",
    "log",
    "lookup",
    "lower",
    "max",
    "md5",
    "merge",
    "min",
    "parseint",
    "pathexpand",
    "pow",
    "range",
    "regex_replace",
    "replace",
    "reverse",
    "rsadecrypt",
    "setintersection",
    "setproduct",
    "setunion",
    "sha1",
    "sha256",
    "sha512",
    "signum",
    "slice",
    "sort",
    "split",
    "strlen",
    "strrev",
    "substr",
    "timeadd",
    "title",
    "trim",
    "trimprefix",
    "trimspace",
    "trimsuffix",
    "try",
    "upper",
    "urlencode",
    "uuidv4",
    "uuidv5",
    "values",
    "yamldecode",
    "yamlencode",
    "zipmap",
];

/// What the filesystem functions may do: Nomad's `Functions(basedir, allowFS)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileAccess {
    /// Whether `file`, `fileset`, `abspath`, ... may run at all (the CLI: yes; the HTTP parse endpoint: no).
    pub allowed: bool,
    /// The directory relative paths are read from: the job file's. `None` is the working directory.
    pub base_dir: Option<PathBuf>,
}

/// Calls the function `name` with evaluated arguments.
pub(crate) fn call(name: &str, args: Vec<Value>, files: &FileAccess) -> Result<Value, String> {
    match name {
        // strings
        "chomp" | "format" | "formatlist" | "indent" | "join" | "lower" | "regex_replace" | "replace" | "split" | "strlen" | "strrev"
        | "substr" | "title" | "trim" | "trimprefix" | "trimspace" | "trimsuffix" | "upper" => strings::call(name, &args),
        // collections
        "chunklist" | "coalesce" | "coalescelist" | "compact" | "concat" | "contains" | "distinct" | "element" | "flatten" | "index"
        | "keys" | "length" | "lookup" | "merge" | "range" | "reverse" | "setintersection" | "setproduct" | "setunion" | "slice"
        | "sort" | "values" | "zipmap" => collections::call(name, args),
        // numbers
        "abs" | "ceil" | "floor" | "log" | "max" | "min" | "parseint" | "pow" | "signum" => numeric::call(name, &args),
        // encodings
        "base64decode" | "base64encode" | "csvdecode" | "jsondecode" | "jsonencode" | "urlencode" | "yamldecode" | "yamlencode" => {
            encoding::call(name, &args)
        }
        // hashes and crypto
        "bcrypt" | "md5" | "rsadecrypt" | "sha1" | "sha256" | "sha512" => crypto::call(name, &args),
        "formatdate" | "timeadd" => datetime::call(name, &args),
        "cidrhost" | "cidrnetmask" | "cidrsubnet" | "cidrsubnets" => cidr::call(name, &args),
        "uuidv4" | "uuidv5" => uuid::call(name, &args),
        "abspath" | "basename" | "dirname" | "file" | "filebase64" | "fileexists" | "fileset" | "pathexpand" => {
            if !files.allowed {
                // Nomad's guardFS wording.
                return Err("filesystem function disabled".to_string());
            }
            files::call(name, &args, files)
        }
        // These take expressions, not values: eval.rs calls them before evaluating arguments.
        "can" | "try" | "convert" => Err("this function must be called directly, with its arguments written out".to_string()),
        _ => Err(crate::jobspec::error::with_suggestion("call to unknown function".to_string(), name, NOMAD_FUNCTIONS.iter().copied())),
    }
}

/// Budget units a call costs before it runs, for functions whose work is not in the size of
/// their result: bcrypt doubles its work with each step of cost, an RSA decryption is a
/// modular exponentiation. Without this a loop over `bcrypt` could stall a parse for hours.
pub(crate) fn work_of(name: &str, args: &[Value]) -> u64 {
    match name {
        "bcrypt" => {
            let cost = args.get(1).and_then(|c| whole(c).ok()).filter(|c| (4..=crypto::MAX_BCRYPT_COST).contains(c));
            100 << cost.unwrap_or(crypto::DEFAULT_BCRYPT_COST)
        }
        "rsadecrypt" => 50_000,
        _ => 0,
    }
}

pub(crate) fn arity(args: &[Value], min: usize, max: usize) -> Result<(), String> {
    if args.len() < min {
        return Err(format!("not enough function arguments: expected {}, got {}", want(min, max), args.len()));
    }
    if args.len() > max {
        return Err(format!("too many function arguments: expected {}, got {}", want(min, max), args.len()));
    }
    Ok(())
}

fn want(min: usize, max: usize) -> String {
    if min == max {
        format!("{min}")
    } else if max == usize::MAX {
        format!("at least {min}")
    } else {
        format!("{min} to {max}")
    }
}

pub(crate) fn string_arg(v: &Value) -> Result<String, String> {
    as_string(v).ok_or_else(|| format!("a string is required, got {}", describe(v)))
}

pub(crate) fn strings<const N: usize>(args: &[Value]) -> Result<[String; N], String> {
    arity(args, N, N)?;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, v) in out.iter_mut().zip(args) {
        *slot = string_arg(v)?;
    }
    Ok(out)
}

/// A string result, refused when longer than any expression may build.
pub(crate) fn bounded(s: String) -> Result<Value, String> {
    if s.len() > MAX_STRING_BYTES {
        Err(format!("the result is {} bytes, more than the {MAX_STRING_BYTES} a string may have", s.len()))
    } else {
        Ok(Value::String(s))
    }
}

pub(crate) fn float_arg(v: &Value) -> Result<f64, String> {
    as_number(v).and_then(|n| n.as_f64()).ok_or_else(|| format!("a number is required, got {}", describe(v)))
}

pub(crate) fn whole(v: &Value) -> Result<i64, String> {
    let n = as_number(v).ok_or_else(|| format!("a number is required, got {}", describe(v)))?;
    integer_of(&n).ok_or_else(|| format!("a whole number is required, got {n}"))
}

pub(crate) fn list_arg(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items.clone()),
        other => Err(format!("a list is required, got {}", describe(other))),
    }
}

pub(crate) fn object_arg(v: &Value) -> Result<Map<String, Value>, String> {
    match v {
        Value::Object(map) => Ok(map.clone()),
        other => Err(format!("a map is required, got {}", describe(other))),
    }
}

/// Map entries sorted by key, as cty orders map keys.
pub(crate) fn sorted_entries(v: &Value) -> Result<BTreeMap<String, Value>, String> {
    Ok(object_arg(v)?.into_iter().collect())
}
