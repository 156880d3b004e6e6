//! consul-template's environment-independent template functions (v0.31.0
//! behaviour), written for the `gotmpl` engine.
//!
//! Pipelines pass the previous value as the *last* argument, so every
//! function takes its operand last (`split sep s`, `subtract b a` = a - b).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use gotmpl::{FuncMap, TemplateError, Value};
use md5::Digest as _;

type FnResult = gotmpl::Result<Value>;

/// Functions replaced by [`disabled`] unless the operator re-enables them,
/// as Nomad's default `function_denylist`.
pub const DEFAULT_DENIED: &[&str] = &["plugin", "writeToFile"];

fn fail(msg: impl Into<String>) -> TemplateError {
    TemplateError::Exec(msg.into())
}

fn put(funcs: &mut FuncMap, name: &str, f: impl Fn(&[Value]) -> FnResult + Send + Sync + 'static) {
    funcs.insert(name.to_string(), Arc::new(f));
}

fn string(s: impl Into<Arc<str>>) -> Value {
    Value::String(s.into())
}

fn list(items: Vec<Value>) -> Value {
    Value::List(items.into())
}

fn map(entries: BTreeMap<Arc<str>, Value>) -> Value {
    Value::Map(Arc::new(entries))
}

fn arity(name: &str, args: &[Value], expected: usize) -> gotmpl::Result<()> {
    if args.len() == expected { Ok(()) } else { Err(TemplateError::ArgCount { name: name.to_string(), expected, got: args.len() }) }
}

fn str_of<'a>(name: &str, v: &'a Value) -> gotmpl::Result<&'a str> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(fail(format!("{name}: expected string, got {} ({other})", other.type_name()))),
    }
}

fn int_of(name: &str, v: &Value) -> gotmpl::Result<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::Uint(n) => i64::try_from(*n).map_err(|_| fail(format!("{name}: {n} overflows int"))),
        other => Err(fail(format!("{name}: expected integer, got {} ({other})", other.type_name()))),
    }
}

/// A function taking exactly one string.
fn str_fn(funcs: &mut FuncMap, name: &'static str, f: impl Fn(&str) -> FnResult + Send + Sync + 'static) {
    put(funcs, name, move |args| {
        arity(name, args, 1)?;
        f(str_of(name, &args[0])?)
    });
}

/// A function taking exactly two strings.
fn str2_fn(funcs: &mut FuncMap, name: &'static str, f: impl Fn(&str, &str) -> FnResult + Send + Sync + 'static) {
    put(funcs, name, move |args| {
        arity(name, args, 2)?;
        f(str_of(name, &args[0])?, str_of(name, &args[1])?)
    });
}

/// The error every denied function returns.
fn disabled(name: &str) -> gotmpl::ValueFunc {
    let message = format!("error calling {name}: function is disabled");
    Arc::new(move |_: &[Value]| Err(fail(&message)))
}

/// Replaces each named function with one that fails "function is disabled",
/// so templates using it still parse (Nomad's `function_denylist`).
pub fn deny(funcs: &mut FuncMap, names: &[String]) {
    for name in names {
        funcs.insert(name.clone(), disabled(name));
    }
}

/// `env`, `mustEnv` and `envOrDefault` over the task's environment only.
pub fn env_funcs(env: Arc<BTreeMap<String, String>>) -> FuncMap {
    let mut funcs = FuncMap::new();
    let e = Arc::clone(&env);
    str_fn(&mut funcs, "env", move |k| Ok(string(e.get(k).map(String::as_str).unwrap_or(""))));
    let e = Arc::clone(&env);
    str_fn(&mut funcs, "mustEnv", move |k| match e.get(k) {
        Some(v) if !v.is_empty() => Ok(string(v.as_str())),
        _ => Err(fail(format!("required environment variable {k} is empty"))),
    });
    str2_fn(&mut funcs, "envOrDefault", move |k, default| Ok(string(env.get(k).map(String::as_str).unwrap_or(default))));
    funcs
}

/// Every function that needs neither data sources nor the task environment.
pub fn pure_funcs() -> FuncMap {
    let mut funcs = FuncMap::new();
    add_parse_funcs(&mut funcs);
    add_encode_funcs(&mut funcs);
    add_string_funcs(&mut funcs);
    add_collection_funcs(&mut funcs);
    add_math_funcs(&mut funcs);
    add_misc_funcs(&mut funcs);
    let denied: Vec<String> = DEFAULT_DENIED.iter().map(|s| s.to_string()).collect();
    deny(&mut funcs, &denied);
    funcs
}

// ---------------------------------------------------------------- parsing

fn add_parse_funcs(funcs: &mut FuncMap) {
    str_fn(funcs, "parseBool", |s| {
        Ok(Value::Bool(match s {
            "" => false,
            "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
            "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
            _ => return Err(strconv_error("parseBool", "ParseBool", s, "invalid syntax")),
        }))
    });
    str_fn(funcs, "parseInt", |s| {
        if s.is_empty() {
            return Ok(Value::Int(0));
        }
        s.parse::<i64>().map(Value::Int).map_err(|e| strconv_error("parseInt", "ParseInt", s, int_reason(&e)))
    });
    str_fn(funcs, "parseUint", |s| {
        if s.is_empty() {
            return Ok(Value::Uint(0));
        }
        // Go's ParseUint refuses a sign; Rust would accept "+1".
        if s.starts_with('+') {
            return Err(strconv_error("parseUint", "ParseUint", s, "invalid syntax"));
        }
        s.parse::<u64>().map(Value::Uint).map_err(|e| strconv_error("parseUint", "ParseUint", s, int_reason(&e)))
    });
    str_fn(funcs, "parseFloat", |s| {
        if s.is_empty() {
            return Ok(Value::Float(0.0));
        }
        s.parse::<f64>().map(Value::Float).map_err(|_| strconv_error("parseFloat", "ParseFloat", s, "invalid syntax"))
    });
    str_fn(funcs, "parseJSON", |s| {
        if s.is_empty() {
            return Ok(map(BTreeMap::new()));
        }
        let parsed: serde_json::Value = serde_json::from_str(s).map_err(|e| fail(format!("parseJSON: {e}")))?;
        Ok(from_json(parsed))
    });
    str_fn(funcs, "parseYAML", |s| {
        if s.is_empty() {
            return Ok(map(BTreeMap::new()));
        }
        let docs = yaml_rust2::YamlLoader::load_from_str(s).map_err(|e| fail(format!("parseYAML: {e}")))?;
        Ok(docs.into_iter().next().map(from_yaml).unwrap_or(Value::Nil))
    });
}

fn strconv_error(func: &str, go_func: &str, input: &str, reason: &str) -> TemplateError {
    fail(format!("{func}: strconv.{go_func}: parsing {input:?}: {reason}"))
}

fn int_reason(e: &std::num::ParseIntError) -> &'static str {
    use std::num::IntErrorKind;
    match e.kind() {
        IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => "value out of range",
        _ => "invalid syntax",
    }
}

fn from_json(v: serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::Uint(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => string(s),
        serde_json::Value::Array(items) => list(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(entries) => map(entries.into_iter().map(|(k, v)| (Arc::from(k), from_json(v))).collect()),
    }
}

fn from_yaml(v: yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match v {
        Yaml::Null | Yaml::BadValue | Yaml::Alias(_) => Value::Nil,
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Integer(i) => Value::Int(i),
        real @ Yaml::Real(_) => Value::Float(real.as_f64().unwrap_or(f64::NAN)),
        Yaml::String(s) => string(s),
        Yaml::Array(items) => list(items.into_iter().map(from_yaml).collect()),
        Yaml::Hash(entries) => map(entries.into_iter().map(|(k, v)| (Arc::from(yaml_key_string(&k)), from_yaml(v))).collect()),
    }
}

/// Go's yaml.v2 keeps non-string keys; our maps are string-keyed, so keys
/// print the way Go would print them.
fn yaml_key_string(k: &yaml_rust2::Yaml) -> String {
    use yaml_rust2::Yaml;
    match k {
        Yaml::String(s) | Yaml::Real(s) => s.clone(),
        Yaml::Integer(i) => i.to_string(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Null => "<nil>".to_string(),
        other => format!("{other:?}"),
    }
}

// --------------------------------------------------------------- encoding

fn add_encode_funcs(funcs: &mut FuncMap) {
    put(funcs, "toJSON", |args| json_fn("toJSON", args, true, false));
    put(funcs, "toJSONPretty", |args| json_fn("toJSONPretty", args, true, true));
    put(funcs, "toUnescapedJSON", |args| json_fn("toUnescapedJSON", args, false, false));
    put(funcs, "toUnescapedJSONPretty", |args| json_fn("toUnescapedJSONPretty", args, false, true));
    put(funcs, "toYAML", |args| {
        arity("toYAML", args, 1)?;
        let out = to_yaml(&args[0]).map_err(|e| fail(format!("toYAML: {e}")))?;
        Ok(string(out.trim()))
    });
    put(funcs, "toTOML", |args| {
        arity("toTOML", args, 1)?;
        let out = to_toml(&args[0]).map_err(|e| fail(format!("toTOML: {e}")))?;
        Ok(string(out.trim()))
    });

    str_fn(funcs, "base64Encode", |s| Ok(string(base64::engine::general_purpose::STANDARD.encode(s))));
    str_fn(funcs, "base64URLEncode", |s| Ok(string(base64::engine::general_purpose::URL_SAFE.encode(s))));
    str_fn(funcs, "base64Decode", |s| base64_decode("base64Decode", &base64::alphabet::STANDARD, s));
    str_fn(funcs, "base64URLDecode", |s| base64_decode("base64URLDecode", &base64::alphabet::URL_SAFE, s));
    str_fn(funcs, "sha256Hex", |s| Ok(string(hex(&sha2::Sha256::digest(s)))));
    str_fn(funcs, "md5sum", |s| Ok(string(hex(&md5::Md5::digest(s)))));
}

fn json_fn(name: &str, args: &[Value], escape_html: bool, pretty: bool) -> FnResult {
    arity(name, args, 1)?;
    let mut out = String::new();
    let indent = if pretty { Some("  ") } else { None };
    write_json(&mut out, &args[0], escape_html, indent, 0).map_err(|e| fail(format!("{name}: {e}")))?;
    Ok(string(out))
}

fn base64_decode(name: &str, alphabet: &base64::alphabet::Alphabet, s: &str) -> FnResult {
    // Go's decoder skips line breaks and tolerates non-zero trailing bits.
    let engine = GeneralPurpose::new(
        alphabet,
        GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true).with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let cleaned: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    let bytes = engine.decode(cleaned).map_err(|e| fail(format!("{name}: {e}")))?;
    String::from_utf8(bytes).map(string).map_err(|_| fail(format!("{name}: decoded data is not valid UTF-8 text")))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Go's encoding/json output: sorted keys, no spaces, optional HTML escaping.
fn write_json(out: &mut String, v: &Value, escape_html: bool, indent: Option<&str>, depth: usize) -> Result<(), String> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(unit) = indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(unit);
            }
        }
    };
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Uint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Float(f) => out.push_str(&go_json_float(*f)?),
        Value::String(s) => nomad_proto::jobspec::write_go_json_string(out, s, escape_html),
        Value::List(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                write_json(out, item, escape_html, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Map(entries) => {
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                newline(out, depth + 1);
                nomad_proto::jobspec::write_go_json_string(out, k, escape_html);
                out.push(':');
                if indent.is_some() {
                    out.push(' ');
                }
                write_json(out, item, escape_html, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        Value::Function(_) => return Err("json: unsupported type: func".to_string()),
    }
    Ok(())
}

fn go_json_float(f: f64) -> Result<String, String> {
    if !f.is_finite() {
        return Err(format!("json: unsupported value: {}", go_float_word(f)));
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        // Go: exponent form with a sign and no zero padding ("1e+21", "1e-7").
        let e = format!("{f:e}");
        return Ok(match e.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => e,
        });
    }
    Ok(format!("{f}"))
}

fn go_float_word(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

// ------------------------------------------------------------------ YAML

/// yaml.v2's block style: sorted keys, sequences inside maps not indented.
fn to_yaml(v: &Value) -> Result<String, String> {
    let mut out = String::new();
    match v {
        Value::Map(m) if !m.is_empty() => yaml_block(&mut out, v, 0, false)?,
        Value::List(l) if !l.is_empty() => yaml_block(&mut out, v, 0, false)?,
        other => {
            yaml_inline(&mut out, other, 0)?;
            out.push('\n');
        }
    }
    Ok(out)
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// Writes a non-empty map or list. `inline_first`: the first line's
/// indentation was already written (after a "- ").
fn yaml_block(out: &mut String, v: &Value, indent: usize, inline_first: bool) -> Result<(), String> {
    match v {
        Value::Map(entries) => {
            let mut keys: Vec<&Arc<str>> = entries.keys().collect();
            keys.sort_by(|a, b| yaml_key_order(a, b));
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 || !inline_first {
                    pad(out, indent);
                }
                yaml_string(out, key, indent)?;
                out.push(':');
                let item = &entries[key];
                match item {
                    Value::Map(m) if !m.is_empty() => {
                        out.push('\n');
                        yaml_block(out, item, indent + 2, false)?;
                    }
                    Value::List(l) if !l.is_empty() => {
                        out.push('\n');
                        yaml_block(out, item, indent, false)?;
                    }
                    _ => {
                        out.push(' ');
                        yaml_inline(out, item, indent)?;
                        out.push('\n');
                    }
                }
            }
        }
        Value::List(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 || !inline_first {
                    pad(out, indent);
                }
                out.push_str("- ");
                match item {
                    Value::Map(m) if !m.is_empty() => yaml_block(out, item, indent + 2, true)?,
                    Value::List(l) if !l.is_empty() => yaml_block(out, item, indent + 2, true)?,
                    _ => {
                        yaml_inline(out, item, indent)?;
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            yaml_inline(out, other, indent)?;
            out.push('\n');
        }
    }
    Ok(())
}

/// A scalar or an empty collection, on the current line.
fn yaml_inline(out: &mut String, v: &Value, indent: usize) -> Result<(), String> {
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Uint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Float(f) => out.push_str(&match go_format_g(*f).as_str() {
            "+Inf" => ".inf".to_string(),
            "-Inf" => "-.inf".to_string(),
            "NaN" => ".nan".to_string(),
            s => s.to_string(),
        }),
        Value::String(s) => yaml_string(out, s, indent)?,
        Value::List(_) => out.push_str("[]"),
        Value::Map(_) => out.push_str("{}"),
        Value::Function(_) => return Err("cannot marshal type: func".to_string()),
    }
    Ok(())
}

fn yaml_string(out: &mut String, s: &str, indent: usize) -> Result<(), String> {
    if s.contains('\n') {
        yaml_literal(out, s, indent + 2);
    } else if yaml_resolves_to_non_string(s) || !yaml_printable(s) {
        yaml_double_quoted(out, s);
    } else if !yaml_plain_allowed(s) {
        out.push('\'');
        out.push_str(&s.replace('\'', "''"));
        out.push('\'');
    } else {
        out.push_str(s);
    }
    Ok(())
}

fn yaml_literal(out: &mut String, s: &str, indent: usize) {
    out.push('|');
    if s.starts_with(' ') || s.starts_with('\n') {
        out.push('2');
    }
    let body = if s.ends_with("\n\n") {
        out.push('+');
        &s[..s.len() - 1]
    } else if let Some(stripped) = s.strip_suffix('\n') {
        stripped
    } else {
        out.push('-');
        s
    };
    out.push('\n');
    let lines: Vec<&str> = body.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
        if i + 1 < lines.len() {
            out.push('\n');
        }
    }
}

fn yaml_double_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn yaml_printable(s: &str) -> bool {
    s.chars().all(|c| c == '\n' || (' '..='~').contains(&c) || (c as u32 >= 0xA0 && c != '\u{FEFF}'))
}

/// YAML 1.1 (yaml.v2) would read these back as something other than a string.
fn yaml_resolves_to_non_string(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
        "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf",
        "-.INF", ".nan", ".NaN", ".NAN", "<<",
    ];
    if WORDS.contains(&s) {
        return true;
    }
    let Some(&first) = s.as_bytes().first() else {
        return true;
    };
    if !(first.is_ascii_digit() || first == b'-' || first == b'+' || first == b'.') {
        return false;
    }
    static NUMBERISH: std::sync::LazyLock<Vec<regex::Regex>> = std::sync::LazyLock::new(|| {
        [
            // float
            r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$",
            // int in any Go base, underscores allowed
            r"^[-+]?(0[bB][01_]+|0[oO]?[0-7_]+|0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)$",
            // base-60 float
            r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$",
            // timestamp
            r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt ].*)?$",
        ]
        .iter()
        .filter_map(|p| regex::Regex::new(p).ok())
        .collect()
    });
    NUMBERISH.iter().any(|r| r.is_match(s))
}

/// libyaml's rules for a plain (unquoted) scalar in block context.
fn yaml_plain_allowed(s: &str) -> bool {
    let bytes = s.as_bytes();
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    if s.starts_with(' ') || s.ends_with(' ') || s.ends_with(':') {
        return false;
    }
    let Some(&first) = bytes.first() else {
        return false;
    };
    if b"#,[]{}&*!|>'\"%@`".contains(&first) {
        return false;
    }
    if matches!(first, b'-' | b'?' | b':') && (bytes.len() == 1 || bytes[1] == b' ') {
        return false;
    }
    !(s.contains(": ") || s.contains(" #"))
}

/// yaml.v2's map key order: digit runs compare numerically, letters sort
/// after other characters.
fn yaml_key_order(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let less = |a: &str, b: &str| -> bool {
        let ar: Vec<char> = a.chars().collect();
        let br: Vec<char> = b.chars().collect();
        let mut i = 0;
        while i < ar.len() && i < br.len() {
            if ar[i] == br[i] {
                i += 1;
                continue;
            }
            let al = ar[i].is_alphabetic();
            let bl = br[i].is_alphabetic();
            if al && bl {
                return ar[i] < br[i];
            }
            if al || bl {
                return bl;
            }
            let (mut an, mut bn): (i64, i64) = (0, 0);
            if ar[i] == '0' || br[i] == '0' {
                let mut j = i;
                while j > 0 && ar[j - 1].is_ascii_digit() {
                    j -= 1;
                    if ar[j] != '0' {
                        an = 1;
                        bn = 1;
                        break;
                    }
                }
            }
            let mut ai = i;
            while ai < ar.len() && ar[ai].is_ascii_digit() {
                an = an.wrapping_mul(10).wrapping_add(i64::from(ar[ai] as u8 - b'0'));
                ai += 1;
            }
            let mut bi = i;
            while bi < br.len() && br[bi].is_ascii_digit() {
                bn = bn.wrapping_mul(10).wrapping_add(i64::from(br[bi] as u8 - b'0'));
                bi += 1;
            }
            if an != bn {
                return an < bn;
            }
            if ai != bi {
                return ai < bi;
            }
            return ar[i] < br[i];
        }
        ar.len() < br.len()
    };
    if less(a, b) {
        Ordering::Less
    } else if less(b, a) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 64)`.
fn go_format_g(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((e.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    // Shortest formatting switches to an exponent from 1e+06 on, like Go.
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    format!("{f}")
}

// ------------------------------------------------------------------ TOML

/// BurntSushi/toml's layout: plain keys first, then `[tables]` indented two
/// spaces per nesting level, `[[arrays of tables]]`.
fn to_toml(v: &Value) -> Result<String, String> {
    let Value::Map(entries) = v else {
        return Err(format!("toml: top-level values must be maps, got {}", v.type_name()));
    };
    let mut out = String::new();
    toml_table(&mut out, &[], entries)?;
    Ok(out)
}

fn toml_is_table_array(v: &Value) -> bool {
    matches!(v, Value::List(items) if !items.is_empty() && items.iter().all(|i| matches!(i, Value::Map(_))))
}

fn toml_newline(out: &mut String) {
    if !out.is_empty() {
        out.push('\n');
    }
}

fn toml_table(out: &mut String, path: &[&str], entries: &BTreeMap<Arc<str>, Value>) -> Result<(), String> {
    let is_sub = |v: &Value| matches!(v, Value::Map(_)) || toml_is_table_array(v);
    for (key, item) in entries.iter() {
        if is_sub(item) || matches!(item, Value::Nil) {
            continue;
        }
        let _ = write!(out, "{}{} = ", indent_for(path.len()), toml_key(key));
        toml_value(out, item)?;
        toml_newline(out);
    }
    for (key, item) in entries.iter() {
        let mut sub_path: Vec<&str> = path.to_vec();
        sub_path.push(key);
        let header: Vec<String> = sub_path.iter().map(|k| toml_key(k)).collect();
        let header = header.join(".");
        match item {
            Value::Map(sub) => {
                if sub_path.len() == 1 {
                    toml_newline(out);
                }
                let _ = write!(out, "{}[{header}]", indent_for(sub_path.len() - 1));
                out.push('\n');
                toml_table(out, &sub_path, sub)?;
            }
            Value::List(items) if toml_is_table_array(item) => {
                for element in items.iter() {
                    if let Value::Map(sub) = element {
                        toml_newline(out);
                        let _ = write!(out, "{}[[{header}]]", indent_for(sub_path.len() - 1));
                        out.push('\n');
                        toml_table(out, &sub_path, sub)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn indent_for(levels: usize) -> String {
    "  ".repeat(levels)
}

fn toml_key(k: &str) -> String {
    if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        k.to_string()
    } else {
        let mut out = String::new();
        toml_string(&mut out, k);
        out
    }
}

fn toml_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn toml_value(out: &mut String, v: &Value) -> Result<(), String> {
    match v {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Uint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Float(f) => {
            if f.is_nan() {
                out.push_str("nan");
            } else if f.is_infinite() {
                out.push_str(if *f > 0.0 { "inf" } else { "-inf" });
            } else {
                let s = format!("{f}");
                out.push_str(&s);
                if !s.contains('.') {
                    out.push_str(".0");
                }
            }
        }
        Value::String(s) => toml_string(out, s),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if matches!(item, Value::Nil) {
                    return Err("toml: cannot encode array with nil element".to_string());
                }
                toml_value(out, item)?;
            }
            out.push(']');
        }
        Value::Map(entries) => {
            // Only reachable inside an inline array.
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{} = ", toml_key(k));
                toml_value(out, item)?;
            }
            out.push('}');
        }
        Value::Nil => return Err("toml: cannot encode a nil value".to_string()),
        Value::Function(_) => return Err("toml: unsupported type: func".to_string()),
    }
    Ok(())
}

// --------------------------------------------------------------- strings

/// Go's strings.Split: an empty separator splits into characters.
fn go_split<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    if sep.is_empty() { s.char_indices().map(|(i, c)| &s[i..i + c.len_utf8()]).collect() } else { s.split(sep).collect() }
}

/// Go's unicode.ToUpper/ToLower map one rune to one rune.
fn map_runes(s: &str, upper: bool) -> String {
    s.chars()
        .map(|c| {
            let mut mapped = if upper { c.to_uppercase().collect::<Vec<char>>() } else { c.to_lowercase().collect::<Vec<char>>() };
            if mapped.len() == 1 { mapped.remove(0) } else { c }
        })
        .collect()
}

/// Title-cases the first letter of each word and leaves the rest alone.
fn to_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_word = false;
    for c in s.chars() {
        if !in_word && c.is_alphabetic() {
            out.push_str(&map_runes(&c.to_string(), true));
        } else {
            out.push(c);
        }
        in_word = c.is_alphanumeric() || c == '_' || c == '\'';
    }
    out
}

fn regex(name: &str, pattern: &str) -> gotmpl::Result<regex::Regex> {
    regex::Regex::new(pattern).map_err(|e| fail(format!("{name}: {e}")))
}

fn add_string_funcs(funcs: &mut FuncMap) {
    str2_fn(funcs, "split", |sep, s| {
        let s = s.trim();
        if s.is_empty() {
            return Ok(list(Vec::new()));
        }
        Ok(list(go_split(s, sep).into_iter().map(string).collect()))
    });
    put(funcs, "splitToMap", |args| {
        arity("splitToMap", args, 3)?;
        let sep = str_of("splitToMap", &args[0])?;
        let kv_sep = str_of("splitToMap", &args[1])?;
        let s = str_of("splitToMap", &args[2])?.trim();
        let mut out = BTreeMap::new();
        if s.is_empty() {
            return Ok(map(out));
        }
        for item in go_split(s, sep) {
            if let Some((k, v)) = item.split_once(kv_sep) {
                out.insert(Arc::from(k), string(v));
            }
        }
        Ok(map(out))
    });
    put(funcs, "join", |args| {
        arity("join", args, 2)?;
        let sep = str_of("join", &args[0])?;
        let parts = match &args[1] {
            Value::List(items) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.to_string()),
                    Value::Map(_) | Value::List(_) | Value::Function(_) => {
                        Err(fail(format!("join: expected a list of strings, found {}", item.type_name())))
                    }
                    scalar => Ok(scalar.to_string()),
                })
                .collect::<gotmpl::Result<Vec<String>>>()?,
            Value::Nil => Vec::new(),
            other => {
                return Err(fail(format!("join: expected a list of strings, got {}", other.type_name())));
            }
        };
        Ok(string(parts.join(sep)))
    });
    str2_fn(funcs, "trim", |cutset, s| Ok(string(s.trim_matches(|c| cutset.contains(c)))));
    str_fn(funcs, "trimSpace", |s| Ok(string(s.trim())));
    str2_fn(funcs, "trimPrefix", |prefix, s| Ok(string(s.strip_prefix(prefix).unwrap_or(s))));
    str2_fn(funcs, "trimSuffix", |suffix, s| Ok(string(s.strip_suffix(suffix).unwrap_or(s))));
    put(funcs, "replaceAll", |args| {
        arity("replaceAll", args, 3)?;
        let from = str_of("replaceAll", &args[0])?;
        let to = str_of("replaceAll", &args[1])?;
        let s = str_of("replaceAll", &args[2])?;
        Ok(string(s.replace(from, to)))
    });
    put(funcs, "regexReplaceAll", |args| {
        arity("regexReplaceAll", args, 3)?;
        let re = regex("regexReplaceAll", str_of("regexReplaceAll", &args[0])?)?;
        let replacement = str_of("regexReplaceAll", &args[1])?;
        let s = str_of("regexReplaceAll", &args[2])?;
        // `$1`, `${name}` and `$$` expand the way Go's Regexp.Expand does.
        Ok(string(re.replace_all(s, replacement).into_owned()))
    });
    str2_fn(funcs, "regexMatch", |pattern, s| Ok(Value::Bool(regex("regexMatch", pattern)?.is_match(s))));
    str_fn(funcs, "toLower", |s| Ok(string(map_runes(s, false))));
    str_fn(funcs, "toUpper", |s| Ok(string(map_runes(s, true))));
    str_fn(funcs, "toTitle", |s| Ok(string(to_title(s))));
    put(funcs, "indent", |args| {
        arity("indent", args, 2)?;
        let spaces = int_of("indent", &args[0])?;
        let s = str_of("indent", &args[1])?;
        let spaces = usize::try_from(spaces).map_err(|_| fail("indent value must be a positive integer"))?;
        let prefix = " ".repeat(spaces);
        let mut out = String::with_capacity(s.len());
        let mut line_start = true;
        for c in s.chars() {
            if line_start && c != '\n' {
                out.push_str(&prefix);
            }
            out.push(c);
            line_start = c == '\n';
        }
        Ok(string(out))
    });
}

// ------------------------------------------------------------ collections

/// consul-template's `in`: membership for lists (ints match ints, floats
/// match floats, strings match strings), substring for strings.
fn contained_in(haystack: &Value, needle: &Value) -> bool {
    match haystack {
        Value::List(items) => items.iter().any(|item| match (item, needle) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::String(a), Value::String(b)) => a == b,
            _ => false,
        }),
        Value::String(s) => matches!(needle, Value::String(n) if s.contains(n.as_ref())),
        _ => false,
    }
}

fn add_contains_some(funcs: &mut FuncMap, name: &'static str, ret_true: bool, invert: bool) {
    put(funcs, name, move |args| {
        arity(name, args, 2)?;
        let needles: &[Value] = match &args[0] {
            Value::List(items) => items,
            Value::Nil => &[],
            other => {
                return Err(fail(format!("{name}: expected a list, got {}", other.type_name())));
            }
        };
        for needle in needles {
            if contained_in(&args[1], needle) != invert {
                return Ok(Value::Bool(!ret_true));
            }
        }
        Ok(Value::Bool(ret_true))
    });
}

fn add_collection_funcs(funcs: &mut FuncMap) {
    put(funcs, "contains", |args| {
        arity("contains", args, 2)?;
        Ok(Value::Bool(contained_in(&args[1], &args[0])))
    });
    put(funcs, "in", |args| {
        arity("in", args, 2)?;
        Ok(Value::Bool(contained_in(&args[0], &args[1])))
    });
    add_contains_some(funcs, "containsAll", true, true);
    add_contains_some(funcs, "containsAny", false, false);
    add_contains_some(funcs, "containsNone", true, false);
    add_contains_some(funcs, "containsNotAll", false, true);

    put(funcs, "loop", |args| {
        let (start, stop) = match args {
            [stop] => (0, loop_bound(stop)?),
            [start, stop] => (loop_bound(start)?, loop_bound(stop)?),
            _ => {
                return Err(fail(format!("loop: wrong number of arguments, expected 1 or 2, but got {}", args.len())));
            }
        };
        let count = i128::from(stop) - i128::from(start);
        if count > MAX_LOOP_LEN {
            return Err(fail(format!("loop: {count} iterations exceed the limit of {MAX_LOOP_LEN}")));
        }
        Ok(list((start..stop).map(Value::Int).collect()))
    });

    put(funcs, "byKey", |args| {
        arity("byKey", args, 1)?;
        by_key(&args[0])
    });
    put(funcs, "byTag", |args| {
        arity("byTag", args, 1)?;
        by_tag(&args[0])
    });
}

/// Caps `loop` so a template cannot allocate without bound (gotmpl's
/// default range budget).
const MAX_LOOP_LEN: i128 = 10_000_000;

fn loop_bound(v: &Value) -> gotmpl::Result<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::Uint(n) => Ok(*n as i64),
        Value::String(s) if s.is_empty() => Ok(0),
        Value::String(s) => s.parse::<i64>().map_err(|e| strconv_error("parseInt", "ParseInt", s, int_reason(&e))),
        other => Err(fail(format!("loop: bad argument type: {}", other.type_name()))),
    }
}

/// Groups KV pairs by their first path segment: top → (rest of key → pair
/// with Key set to the rest). Pairs with nothing after the top are dropped.
fn by_key(pairs: &Value) -> FnResult {
    let items: &[Value] = match pairs {
        Value::List(items) => items,
        Value::Nil => &[],
        other => {
            return Err(fail(format!("byKey: expected a list of key pairs, got {}", other.type_name())));
        }
    };
    let mut groups: BTreeMap<Arc<str>, BTreeMap<Arc<str>, Value>> = BTreeMap::new();
    for pair in items {
        let Value::Map(fields) = pair else {
            return Err(fail(format!("byKey: expected a key pair, got {}", pair.type_name())));
        };
        let key = match fields.get("Key") {
            Some(Value::String(k)) => k.clone(),
            _ => return Err(fail("byKey: key pair has no Key")),
        };
        let (top, rest) = key.split_once('/').unwrap_or((&key, ""));
        if rest.is_empty() {
            continue;
        }
        let mut stripped = (**fields).clone();
        stripped.insert(Arc::from("Key"), string(rest));
        groups.entry(Arc::from(top)).or_default().insert(Arc::from(rest), map(stripped));
    }
    Ok(map(groups.into_iter().map(|(k, v)| (k, map(v))).collect()))
}

/// Services grouped by each of their tags: tag → list of services.
fn by_tag(services: &Value) -> FnResult {
    let items: &[Value] = match services {
        Value::List(items) => items,
        Value::Nil => &[],
        other => {
            return Err(fail(format!("byTag: wrong argument type {}", other.type_name())));
        }
    };
    let mut groups: BTreeMap<Arc<str>, Vec<Value>> = BTreeMap::new();
    for service in items {
        let tags = service.field("Tags").or_else(|| service.field("ServiceTags"));
        let tags: &[Value] = match tags {
            Some(Value::List(tags)) => tags,
            Some(Value::Nil) | None if matches!(service, Value::Map(_)) => &[],
            _ => {
                return Err(fail(format!("byTag: wrong argument type: list of {}", service.type_name())));
            }
        };
        for tag in tags {
            let Value::String(tag) = tag else {
                return Err(fail("byTag: tags must be strings"));
            };
            groups.entry(tag.clone()).or_default().push(service.clone());
        }
    }
    Ok(map(groups.into_iter().map(|(k, v)| (k, list(v))).collect()))
}

// ------------------------------------------------------------------- math

#[derive(Clone, Copy)]
enum Num {
    I(i64),
    U(u64),
    F(f64),
}

impl Num {
    fn of(name: &str, v: &Value) -> gotmpl::Result<Num> {
        match v {
            Value::Int(n) => Ok(Num::I(*n)),
            Value::Uint(n) => Ok(Num::U(*n)),
            Value::Float(f) => Ok(Num::F(*f)),
            other => Err(fail(format!("{name}: unknown type for {:?} ({})", other.to_string(), other.type_name()))),
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            Num::I(n) => n as f64,
            Num::U(n) => n as f64,
            Num::F(f) => f,
        }
    }

    fn into_value(self) -> Value {
        match self {
            Num::I(n) => Value::Int(n),
            Num::U(n) => Value::Uint(n),
            Num::F(f) => Value::Float(f),
        }
    }
}

#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

/// `a op b` with Go's conversions: int with uint gives int64, uint with uint
/// gives uint64, anything with a float gives float64; integers wrap.
fn arith(name: &str, op: Op, a: Num, b: Num) -> gotmpl::Result<Value> {
    let zero_divisor = match b {
        Num::I(n) => n == 0,
        Num::U(n) => n == 0,
        Num::F(f) => f == 0.0,
    };
    if matches!(op, Op::Div | Op::Mod) && zero_divisor {
        return Err(fail(format!("{name}: division by zero")));
    }
    if let (Num::U(x), Num::U(y)) = (a, b) {
        return Ok(Value::Uint(match op {
            Op::Add => x.wrapping_add(y),
            Op::Sub => x.wrapping_sub(y),
            Op::Mul => x.wrapping_mul(y),
            Op::Div => x / y,
            Op::Mod => x % y,
        }));
    }
    if matches!(a, Num::F(_)) || matches!(b, Num::F(_)) {
        if matches!(op, Op::Mod) {
            let bad = if matches!(a, Num::F(_)) { a } else { b };
            return Err(fail(format!("{name}: unknown type for {:?} (float64)", bad.as_f64().to_string())));
        }
        let (x, y) = (a.as_f64(), b.as_f64());
        return Ok(Value::Float(match op {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
            _ => x / y,
        }));
    }
    let as_i64 = |n: Num| match n {
        Num::I(v) => v,
        Num::U(v) => v as i64,
        Num::F(v) => v as i64,
    };
    let (x, y) = (as_i64(a), as_i64(b));
    Ok(Value::Int(match op {
        Op::Add => x.wrapping_add(y),
        Op::Sub => x.wrapping_sub(y),
        Op::Mul => x.wrapping_mul(y),
        Op::Div => x.wrapping_div(y),
        Op::Mod => x.wrapping_rem(y),
    }))
}

/// Go's mixed comparisons: ints and uints compare as int64, anything with a
/// float as float64. The winner keeps its own type.
fn num_less(a: Num, b: Num) -> bool {
    match (a, b) {
        (Num::U(x), Num::U(y)) => x < y,
        (Num::I(_) | Num::U(_), Num::I(_) | Num::U(_)) => {
            let to_i = |n: Num| match n {
                Num::I(v) => v,
                Num::U(v) => v as i64,
                Num::F(v) => v as i64,
            };
            to_i(a) < to_i(b)
        }
        _ => a.as_f64() < b.as_f64(),
    }
}

fn add_math_funcs(funcs: &mut FuncMap) {
    for (name, op) in [("add", Op::Add), ("subtract", Op::Sub), ("multiply", Op::Mul), ("divide", Op::Div), ("modulo", Op::Mod)] {
        put(funcs, name, move |args| {
            arity(name, args, 2)?;
            let b = Num::of(name, &args[0])?;
            let a = Num::of(name, &args[1])?;
            arith(name, op, a, b)
        });
    }
    put(funcs, "minimum", |args| {
        arity("minimum", args, 2)?;
        let b = Num::of("minimum", &args[0])?;
        let a = Num::of("minimum", &args[1])?;
        Ok(if num_less(a, b) { a } else { b }.into_value())
    });
    put(funcs, "maximum", |args| {
        arity("maximum", args, 2)?;
        let b = Num::of("maximum", &args[0])?;
        let a = Num::of("maximum", &args[1])?;
        Ok(if num_less(b, a) { a } else { b }.into_value())
    });
}

// ------------------------------------------------------------------- time

fn add_misc_funcs(funcs: &mut FuncMap) {
    put(funcs, "timestamp", |args| {
        let now = time::OffsetDateTime::now_utc();
        match args {
            [] => Ok(string(format_go_time(now, RFC3339))),
            [layout] => {
                let layout = str_of("timestamp", layout)?;
                if layout == "unix" { Ok(string(now.unix_timestamp().to_string())) } else { Ok(string(format_go_time(now, layout))) }
            }
            _ => Err(fail(format!("timestamp: wrong number of arguments, expected 0 or 1, but got {}", args.len()))),
        }
    });
}

/// Go's time.RFC3339 layout.
pub const RFC3339: &str = "2006-01-02T15:04:05Z07:00";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    LongMonth,
    Month,
    NumMonth,
    ZeroMonth,
    LongWeekDay,
    WeekDay,
    Day,
    UnderDay,
    ZeroDay,
    UnderYearDay,
    ZeroYearDay,
    Hour,
    Hour12,
    ZeroHour12,
    Minute,
    ZeroMinute,
    Second,
    ZeroSecond,
    LongYear,
    Year,
    PmUpper,
    PmLower,
    TzName,
    /// (ISO 8601 "Z" for UTC, with colons, with seconds, hours only)
    NumTz {
        iso: bool,
        colon: bool,
        seconds: bool,
        hours_only: bool,
    },
    /// (separator, digits, trim trailing zeros)
    Frac {
        sep: char,
        digits: usize,
        trim: bool,
    },
}

/// Splits a Go layout at its first reference-time token: (literal, token, rest).
fn next_chunk(layout: &str) -> (&str, Option<Chunk>, &str) {
    let b = layout.as_bytes();
    let at = |i: usize, s: &str| layout[i..].starts_with(s);
    for i in 0..b.len() {
        let found: Option<(Chunk, usize)> = match b[i] {
            b'J' if at(i, "January") => Some((Chunk::LongMonth, 7)),
            b'J' if at(i, "Jan") => Some((Chunk::Month, 3)),
            b'M' if at(i, "Monday") => Some((Chunk::LongWeekDay, 6)),
            b'M' if at(i, "Mon") => Some((Chunk::WeekDay, 3)),
            b'M' if at(i, "MST") => Some((Chunk::TzName, 3)),
            b'0' if at(i, "002") => Some((Chunk::ZeroYearDay, 3)),
            b'0' if b.len() > i + 1 && (b'1'..=b'6').contains(&b[i + 1]) => Some((
                [Chunk::ZeroMonth, Chunk::ZeroDay, Chunk::ZeroHour12, Chunk::ZeroMinute, Chunk::ZeroSecond, Chunk::Year]
                    [usize::from(b[i + 1] - b'1')],
                2,
            )),
            b'1' if at(i, "15") => Some((Chunk::Hour, 2)),
            b'1' => Some((Chunk::NumMonth, 1)),
            b'2' if at(i, "2006") => Some((Chunk::LongYear, 4)),
            b'2' => Some((Chunk::Day, 1)),
            b'_' if at(i, "__2") => Some((Chunk::UnderYearDay, 3)),
            b'_' if at(i, "_2") && !at(i, "_2006") => Some((Chunk::UnderDay, 2)),
            b'3' => Some((Chunk::Hour12, 1)),
            b'4' => Some((Chunk::Minute, 1)),
            b'5' => Some((Chunk::Second, 1)),
            b'P' if at(i, "PM") => Some((Chunk::PmUpper, 2)),
            b'p' if at(i, "pm") => Some((Chunk::PmLower, 2)),
            b'-' | b'Z' => {
                let iso = b[i] == b'Z';
                [
                    ("070000", false, true, false, 7),
                    ("07:00:00", true, true, false, 9),
                    ("0700", false, false, false, 5),
                    ("07:00", true, false, false, 6),
                    ("07", false, false, true, 3),
                ]
                .into_iter()
                .find(|(pattern, ..)| at(i + 1, pattern))
                .map(|(_, colon, seconds, hours_only, len)| (Chunk::NumTz { iso, colon, seconds, hours_only }, len))
            }
            b'.' | b',' if b.len() > i + 1 && (b[i + 1] == b'0' || b[i + 1] == b'9') => {
                let digit = b[i + 1];
                let mut j = i + 1;
                while j < b.len() && b[j] == digit {
                    j += 1;
                }
                if j < b.len() && b[j].is_ascii_digit() {
                    None
                } else {
                    Some((Chunk::Frac { sep: b[i] as char, digits: j - i - 1, trim: digit == b'9' }, j - i))
                }
            }
            _ => None,
        };
        if let Some((chunk, len)) = found {
            return (&layout[..i], Some(chunk), &layout[i + len..]);
        }
    }
    (layout, None, "")
}

/// Formats `t` with a Go reference-time layout ("2006-01-02 15:04:05").
pub fn format_go_time(t: time::OffsetDateTime, layout: &str) -> String {
    const MONTHS: [&str; 12] =
        ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let month_name = MONTHS[usize::from(u8::from(t.month()) - 1)];
    let day_name = DAYS[usize::from(t.weekday().number_days_from_monday())];
    let hour12 = match t.hour() % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::new();
    let mut rest = layout;
    loop {
        let (literal, chunk, tail) = next_chunk(rest);
        out.push_str(literal);
        let Some(chunk) = chunk else { break };
        rest = tail;
        let _ = match chunk {
            Chunk::LongMonth => write!(out, "{month_name}"),
            Chunk::Month => write!(out, "{}", &month_name[..3]),
            Chunk::NumMonth => write!(out, "{}", u8::from(t.month())),
            Chunk::ZeroMonth => write!(out, "{:02}", u8::from(t.month())),
            Chunk::LongWeekDay => write!(out, "{day_name}"),
            Chunk::WeekDay => write!(out, "{}", &day_name[..3]),
            Chunk::Day => write!(out, "{}", t.day()),
            Chunk::UnderDay => write!(out, "{:>2}", t.day()),
            Chunk::ZeroDay => write!(out, "{:02}", t.day()),
            Chunk::UnderYearDay => write!(out, "{:>3}", t.ordinal()),
            Chunk::ZeroYearDay => write!(out, "{:03}", t.ordinal()),
            Chunk::Hour => write!(out, "{:02}", t.hour()),
            Chunk::Hour12 => write!(out, "{hour12}"),
            Chunk::ZeroHour12 => write!(out, "{hour12:02}"),
            Chunk::Minute => write!(out, "{}", t.minute()),
            Chunk::ZeroMinute => write!(out, "{:02}", t.minute()),
            Chunk::Second => write!(out, "{}", t.second()),
            Chunk::ZeroSecond => write!(out, "{:02}", t.second()),
            Chunk::LongYear => write!(out, "{:04}", t.year()),
            Chunk::Year => write!(out, "{:02}", t.year().rem_euclid(100)),
            Chunk::PmUpper => write!(out, "{}", if t.hour() >= 12 { "PM" } else { "AM" }),
            Chunk::PmLower => write!(out, "{}", if t.hour() >= 12 { "pm" } else { "am" }),
            Chunk::TzName => {
                let offset = t.offset().whole_seconds();
                if offset == 0 { write!(out, "UTC") } else { write_offset(&mut out, offset, false, false, false) }
            }
            Chunk::NumTz { iso, colon, seconds, hours_only } => {
                let offset = t.offset().whole_seconds();
                if iso && offset == 0 { write!(out, "Z") } else { write_offset(&mut out, offset, colon, seconds, hours_only) }
            }
            Chunk::Frac { sep, digits, trim } => {
                let nanos = format!("{:09}", t.nanosecond());
                let mut frac = &nanos[..digits.min(9)];
                if trim {
                    frac = frac.trim_end_matches('0');
                }
                if frac.is_empty() { Ok(()) } else { write!(out, "{sep}{frac}") }
            }
        };
    }
    out
}

fn write_offset(out: &mut String, offset_seconds: i32, colon: bool, seconds: bool, hours_only: bool) -> std::fmt::Result {
    let sign = if offset_seconds < 0 { '-' } else { '+' };
    let abs = offset_seconds.unsigned_abs();
    let (h, m, s) = (abs / 3600, abs / 60 % 60, abs % 60);
    let sep = if colon { ":" } else { "" };
    write!(out, "{sign}{h:02}")?;
    if !hours_only {
        write!(out, "{sep}{m:02}")?;
    }
    if seconds {
        write!(out, "{sep}{s:02}")?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "funcs_tests.rs"]
mod tests;
