//! What `var put` reads: a variable specification (HCL or JSON, Nomad's `spec.nv.*` shapes) and
//! `key=value` arguments whose values may come from a file (`k=@file`) or stdin (`k=-`).
//!
//! Inputs are read with a limit checked before they are parsed: a specification may be
//! [`MAX_SPEC_BYTES`], a value [`MAX_VARIABLE_SIZE`] (what a whole variable may hold).

use std::io::Read;

use nomad_proto::variables::{MAX_VARIABLE_SIZE, Variable};
use serde_json::Value;

/// The largest specification read. A variable holds at most 64 KiB of keys and values; this
/// leaves room for quoting, escapes and comments around them.
pub const MAX_SPEC_BYTES: usize = 1024 * 1024;

/// Reads at most `limit` bytes from `r`; more is an error naming `what` (one byte past the limit
/// is enough to know, whatever the input's size).
pub fn read_limited(r: impl Read, limit: usize, what: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    r.take(limit as u64 + 1).read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.len() > limit {
        return Err(format!("{what} is over {limit} bytes, the most it may be"));
    }
    Ok(out)
}

/// Reads a file with [`read_limited`].
pub fn read_file_limited(path: &str, limit: usize, what: &str) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("open {path}: {e}"))?;
    read_limited(f, limit, &format!("{what} {path:?}"))
}

fn utf8(bytes: Vec<u8>, what: &str) -> Result<String, String> {
    String::from_utf8(bytes).map_err(|e| format!("{what} is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

/// A JSON value's type, as error messages name it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses a JSON specification (what `var init -out json` writes and `var get -out json`
/// prints): `Namespace`, `Path`, `Items` and the server-set indexes and times. Keys match
/// without regard to case, as Go's decoder does; `null` leaves a field unset. A key that is none
/// of these is refused (Nomad drops it, and a misspelt `Items` would write nothing).
pub fn parse_json_spec(text: &str) -> Result<Variable, String> {
    nomad_proto::lenient::check_depth(text.as_bytes(), nomad_proto::lenient::MAX_REQUEST_DEPTH).map_err(|e| e.message)?;
    let value: Value = serde_json::from_str(text).map_err(|e| format!("error unmarshaling json: {e}"))?;
    let Value::Object(map) = value else {
        return Err(format!("error unmarshaling json: the specification must be an object, not {}", kind(&value)));
    };
    let mut out = Variable::default();
    for (key, v) in map {
        if v.is_null() {
            continue;
        }
        let bad = |want: &str| format!("error unmarshaling json: {key} must be {want}, not {}", kind(&v));
        match key.to_ascii_lowercase().as_str() {
            "namespace" => out.namespace = v.as_str().ok_or_else(|| bad("a string"))?.to_string(),
            "path" => out.path = v.as_str().ok_or_else(|| bad("a string"))?.to_string(),
            "createindex" => out.create_index = v.as_u64().ok_or_else(|| bad("a non-negative integer"))?,
            "modifyindex" => out.modify_index = v.as_u64().ok_or_else(|| bad("a non-negative integer"))?,
            "createtime" => out.create_time = v.as_i64().ok_or_else(|| bad("an integer"))?,
            "modifytime" => out.modify_time = v.as_i64().ok_or_else(|| bad("an integer"))?,
            "items" => {
                let Value::Object(items) = &v else { return Err(bad("an object of strings")) };
                for (k, item) in items {
                    let Value::String(s) = item else {
                        return Err(format!("error unmarshaling json: Items[{k:?}] must be a string, not {}", kind(item)));
                    };
                    out.items.insert(k.clone(), s.clone());
                }
            }
            _ => {
                return Err(format!(
                    "error unmarshaling json: unknown key {key:?}; a specification has Namespace, Path and Items (and the server-set CreateIndex, ModifyIndex, CreateTime, ModifyTime)"
                ));
            }
        }
    }
    Ok(out)
}

/// The keys an HCL specification may have (Nomad's list).
const HCL_KEYS: &[&str] = &["namespace", "path", "create_index", "modify_index", "create_time", "modify_time", "items"];

/// A scalar as the string Nomad's weak decoding makes of it: numbers in decimal, `true`/`false`
/// as `1`/`0`.
fn weak_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_string()),
        _ => None,
    }
}

/// Parses an HCL specification (what `var init` writes and `var get -out hcl` prints):
/// `namespace`, `path`, an `items` block or `items = { ... }`, and the server-set
/// `create_index`, `modify_index`, `create_time`, `modify_time`. Other keys are refused with
/// Nomad's `invalid key` message; numbers and bools in items become strings, as in Nomad.
pub fn parse_hcl_spec(text: &str) -> Result<Variable, String> {
    // Evaluated with no variables or functions: a reference (`a.b = "x"` as an object key, or
    // `${x}`) is an error here, not text kept as `${a.b}`.
    let value: Value =
        hcl::eval::from_str(text, &hcl::eval::Context::new()).map_err(|e| format!("error parsing hcl: {}", e.to_string().trim()))?;
    let Value::Object(map) = value else { return Err("error parsing hcl: root should be an object".into()) };
    if let Some(key) = map.keys().find(|k| !HCL_KEYS.contains(&k.as_str())) {
        return Err(format!("error parsing hcl: invalid key: {key}"));
    }
    let mut out = Variable::default();
    for (key, v) in &map {
        let index = || v.as_u64().ok_or_else(|| format!("error parsing hcl: {key} must be integer; got {}", kind(v)));
        let time = || v.as_i64().ok_or_else(|| format!("error parsing hcl: {key} must be a int64; got {}", kind(v)));
        let string = || weak_string(v).ok_or_else(|| format!("error parsing hcl: {key} must be a string; got {}", kind(v)));
        match key.as_str() {
            "namespace" => out.namespace = string()?,
            "path" => out.path = string()?,
            "create_index" => out.create_index = index()?,
            "modify_index" => out.modify_index = index()?,
            "create_time" => out.create_time = time()?,
            "modify_time" => out.modify_time = time()?,
            _ => {
                let Value::Object(items) = v else {
                    return Err(format!("error parsing hcl: items must be one block or object of strings; got {}", kind(v)));
                };
                for (k, item) in items {
                    let s =
                        weak_string(item).ok_or_else(|| format!("error parsing hcl: items.{k} must be a string; got {}", kind(item)))?;
                    out.items.insert(k.clone(), s);
                }
            }
        }
    }
    Ok(out)
}

/// Where `key=value` arguments read stdin from (once) and files from.
pub trait Inputs {
    /// All of stdin, at most `limit` bytes.
    fn stdin(&mut self, limit: usize) -> Result<Vec<u8>, String>;
    /// A file, at most `limit` bytes.
    fn file(&mut self, path: &str, limit: usize) -> Result<Vec<u8>, String>;
}

/// The process's stdin and files; stdin may be read once (a specification given as `-` counts).
#[derive(Debug, Default)]
pub struct ProcessInputs {
    /// Whether stdin was read already.
    pub stdin_used: bool,
}

impl Inputs for ProcessInputs {
    fn stdin(&mut self, limit: usize) -> Result<Vec<u8>, String> {
        if self.stdin_used {
            return Err("stdin already consumed".into());
        }
        self.stdin_used = true;
        read_limited(std::io::stdin().lock(), limit, "stdin")
    }

    fn file(&mut self, path: &str, limit: usize) -> Result<Vec<u8>, String> {
        read_file_limited(path, limit, "file")
    }
}

/// Parses `key=value` arguments into items in order: `k=v`; `k=@file` (the file's contents);
/// `k=\@v` (a literal `@v`); `k=-` (all of stdin); `k=` (an empty value: `var put` removes the
/// item). A bare `-` or `@file` merges a JSON object of strings from stdin or the file. Empty
/// arguments are skipped. A key given twice is refused (Nomad would crash on it).
pub fn parse_pairs(args: &[String], inputs: &mut dyn Inputs) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for raw in args {
        parse_pair(raw, inputs, &mut out).map_err(|e| format!("invalid key/value pair {raw:?}: {e}"))?;
    }
    Ok(out)
}

fn set(out: &mut Vec<(String, String)>, key: &str, value: String) {
    match out.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => out.push((key.to_string(), value)),
    }
}

fn parse_pair(raw: &str, inputs: &mut dyn Inputs, out: &mut Vec<(String, String)>) -> Result<(), String> {
    if raw.is_empty() {
        return Ok(());
    }
    let Some((key, value)) = raw.split_once('=') else {
        let json = if raw == "-" {
            inputs.stdin(MAX_SPEC_BYTES)?
        } else if let Some(path) = raw.strip_prefix('@') {
            inputs.file(path, MAX_SPEC_BYTES)?
        } else {
            return Err("format must be key=value".into());
        };
        return merge_json(&json, out);
    };
    if out.iter().any(|(k, _)| k == key) {
        return Err(format!("key {key:?} is given more than once"));
    }
    let value = if let Some(path) = value.strip_prefix('@') {
        utf8(inputs.file(path, MAX_VARIABLE_SIZE).map_err(|e| format!("error reading file: {e}"))?, "the file")?
    } else if let Some(literal) = value.strip_prefix("\\@") {
        format!("@{literal}")
    } else if value == "-" {
        utf8(inputs.stdin(MAX_VARIABLE_SIZE)?, "stdin")?
    } else {
        value.to_string()
    };
    set(out, key, value);
    Ok(())
}

/// A JSON object of strings merged into the pairs (later keys win, as Go's decoder does).
fn merge_json(bytes: &[u8], out: &mut Vec<(String, String)>) -> Result<(), String> {
    nomad_proto::lenient::check_depth(bytes, nomad_proto::lenient::MAX_REQUEST_DEPTH).map_err(|e| e.message)?;
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(map) = v else { return Err(format!("the JSON must be an object of strings, not {}", kind(&v))) };
    for (k, item) in map {
        let Value::String(s) = item else { return Err(format!("the value of {k:?} must be a string, not {}", kind(&item))) };
        set(out, &k, s);
    }
    Ok(())
}

/// Nomad's warning for an item key with characters a template can only reach with `index`
/// (anything but letters, digits and `_`); `None` for a plain identifier.
pub fn invalid_identifier_warning(key: &str) -> Option<String> {
    let mut bad: Vec<char> = key.chars().filter(|c| !(*c == '_' || c.is_alphabetic() || c.is_numeric())).collect();
    if bad.is_empty() {
        return None;
    }
    bad.sort_unstable();
    bad.dedup();
    let list: Vec<String> = bad.iter().map(|c| format!("\"{c}\"")).collect();
    Some(format!("\"{key}\" contains characters [{}] that require the 'index' function for direct access in templates", list.join(",")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    type Items = BTreeMap<String, String>;

    /// Canned stdin and files.
    #[derive(Default)]
    struct Fake {
        stdin: Option<String>,
        files: BTreeMap<String, String>,
    }

    impl Inputs for Fake {
        fn stdin(&mut self, limit: usize) -> Result<Vec<u8>, String> {
            let s = self.stdin.take().ok_or("stdin already consumed")?;
            read_limited(s.as_bytes(), limit, "stdin")
        }
        fn file(&mut self, path: &str, limit: usize) -> Result<Vec<u8>, String> {
            let s = self.files.get(path).ok_or_else(|| format!("open {path}: No such file or directory (os error 2)"))?;
            read_limited(s.as_bytes(), limit, &format!("file {path:?}"))
        }
    }

    fn pairs(args: &[&str], fake: &mut Fake) -> Result<Vec<(String, String)>, String> {
        parse_pairs(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), fake)
    }

    fn kv(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn pairs_take_literals_files_stdin_and_empty_values() {
        let mut fake = Fake { stdin: Some("from\nstdin".into()), files: BTreeMap::from([("cert.pem".into(), "PEM\n".into())]) };
        let got = pairs(&["a=1", "b=x=y", "c=@cert.pem", "d=\\@literal", "e=-", "f=", ""], &mut fake).unwrap();
        assert_eq!(got, kv(&[("a", "1"), ("b", "x=y"), ("c", "PEM\n"), ("d", "@literal"), ("e", "from\nstdin"), ("f", "")]));
    }

    #[test]
    fn bad_pairs_say_which_and_why() {
        let mut fake = Fake::default();
        assert_eq!(pairs(&["novalue"], &mut fake).unwrap_err(), "invalid key/value pair \"novalue\": format must be key=value");
        let e = pairs(&["k=@missing"], &mut fake).unwrap_err();
        assert!(e.starts_with("invalid key/value pair \"k=@missing\": error reading file: open missing"), "{e}");
        assert_eq!(pairs(&["k=1", "k=2"], &mut fake).unwrap_err(), "invalid key/value pair \"k=2\": key \"k\" is given more than once");
        let mut once = Fake { stdin: Some("v".into()), ..Fake::default() };
        assert_eq!(pairs(&["a=-", "b=-"], &mut once).unwrap_err(), "invalid key/value pair \"b=-\": stdin already consumed");
        let mut big = Fake { files: BTreeMap::from([("big".into(), "x".repeat(MAX_VARIABLE_SIZE + 1))]), ..Fake::default() };
        let e = pairs(&["k=@big"], &mut big).unwrap_err();
        assert!(e.contains("is over 65536 bytes"), "{e}");
    }

    #[test]
    fn a_bare_dash_or_file_merges_a_json_object_of_strings() {
        let mut fake = Fake {
            stdin: Some(r#"{"a":"1","b":"2"}"#.into()),
            files: BTreeMap::from([("m.json".into(), r#"{"b":"3"}"#.into()), ("n.json".into(), r#"{"n":5}"#.into())]),
        };
        assert_eq!(pairs(&["-", "@m.json", "c=4"], &mut fake).unwrap(), kv(&[("a", "1"), ("b", "3"), ("c", "4")]));
        let e = pairs(&["@n.json"], &mut fake).unwrap_err();
        assert_eq!(e, "invalid key/value pair \"@n.json\": the value of \"n\" must be a string, not a number");
    }

    #[test]
    fn hcl_specs_take_blocks_or_objects_and_nomads_keys() {
        let v = parse_hcl_spec(
            "# comment\npath = \"app/db\"\nnamespace = \"prod\"\nmodify_index = 12\nitems {\n  user = \"admin\"\n  port = 5432\n  tls = true\n}\n",
        )
        .unwrap();
        assert_eq!((v.path.as_str(), v.namespace.as_str(), v.modify_index), ("app/db", "prod", 12));
        assert_eq!(v.items, Items::from([("user".into(), "admin".into()), ("port".into(), "5432".into()), ("tls".into(), "1".into())]));
        // What `var get -out hcl` prints reads back.
        let v = parse_hcl_spec("items = {\n     a = \"1\"\n  long = \"two\\nlines\"\n}\n").unwrap();
        assert_eq!(v.items, Items::from([("a".into(), "1".into()), ("long".into(), "two\nlines".into())]));
        assert_eq!(parse_hcl_spec("itmes { a = \"1\" }").unwrap_err(), "error parsing hcl: invalid key: itmes");
        assert_eq!(parse_hcl_spec("modify_index = \"x\"").unwrap_err(), "error parsing hcl: modify_index must be integer; got a string");
        assert!(parse_hcl_spec("items { a = { b = \"c\" } }").unwrap_err().contains("items.a must be a string"));
        assert!(parse_hcl_spec("items {").unwrap_err().starts_with("error parsing hcl: "));
        // References are errors, never text: an unquoted dotted key, an interpolation, a call.
        assert!(parse_hcl_spec("items = {\n  a.b = \"x\"\n}").unwrap_err().contains("undefined variable `a`"));
        assert!(parse_hcl_spec("items = { k = \"${x}\" }").unwrap_err().contains("undefined variable `x`"));
        assert!(parse_hcl_spec("items = { k = upper(\"x\") }").unwrap_err().contains("undefined function `upper`"));
        let v = parse_hcl_spec("items = {\n  \"a.b\" = \"$${x}\"\n  k = <<EOT\nhello\nEOT\n}\n").unwrap();
        assert_eq!(v.items, Items::from([("a.b".into(), "${x}".into()), ("k".into(), "hello\n".into())]));
    }

    #[test]
    fn json_specs_match_keys_without_case_and_refuse_unknown_ones() {
        let v = parse_json_spec(r#"{"Namespace":"default","path":"a/b","ModifyIndex":7,"CreateTime":null,"Items":{"k":"v"}}"#).unwrap();
        assert_eq!((v.namespace.as_str(), v.path.as_str(), v.modify_index), ("default", "a/b", 7));
        assert_eq!(v.items, Items::from([("k".into(), "v".into())]));
        assert!(parse_json_spec(r#"{"Itmes":{}}"#).unwrap_err().contains("unknown key \"Itmes\""));
        assert_eq!(
            parse_json_spec(r#"{"Items":{"k":1}}"#).unwrap_err(),
            "error unmarshaling json: Items[\"k\"] must be a string, not a number"
        );
        assert!(parse_json_spec("[1]").unwrap_err().contains("must be an object, not a list"));
        assert!(parse_json_spec("{").unwrap_err().starts_with("error unmarshaling json: "));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(parse_json_spec(&deep).unwrap_err().contains("nest deeper"));
    }

    #[test]
    fn keys_that_are_not_identifiers_warn_with_their_characters_sorted() {
        assert_eq!(invalid_identifier_warning("db_user2"), None);
        assert_eq!(invalid_identifier_warning("ключ"), None, "letters of any script are identifiers");
        assert_eq!(
            invalid_identifier_warning("a.b-c.d").unwrap(),
            "\"a.b-c.d\" contains characters [\"-\",\".\"] that require the 'index' function for direct access in templates"
        );
    }
}
