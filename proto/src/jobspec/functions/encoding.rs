//! Encoding functions: base64 and URLs (go-cty-funcs), JSON and CSV (go-cty's
//! stdlib), YAML (go-cty-yaml: YAML 1.1 scalars, anchors, one document).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hcl::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::TScalarStyle;

use super::{arity, bounded, sorted_entries, strings};
use crate::jobspec::eval::{integer_of, number_from_f64, parse_number, size_of};

/// Most value nodes one `yamldecode` may build, aliases expanded (so a "billion laughs" document fails).
const MAX_YAML_NODES: u64 = 1_000_000;

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "base64encode" => {
            let [s] = strings::<1>(args)?;
            bounded(STANDARD.encode(s.as_bytes()))
        }
        "base64decode" => {
            let [s] = strings::<1>(args)?;
            // Go's decoder skips line breaks; anything else must be canonical, padded base64.
            let compact: String = s.chars().filter(|c| *c != '\n' && *c != '\r').collect();
            let bytes = STANDARD.decode(compact.as_bytes()).map_err(|_| format!("failed to decode base64 data '{s}'"))?;
            String::from_utf8(bytes)
                .map(Value::String)
                .map_err(|_| "the result of decoding the the provided string is not valid UTF-8".to_string())
        }
        "urlencode" => {
            // Go's url.QueryEscape: a space is "+", unreserved bytes stay, everything else is %XX.
            let [s] = strings::<1>(args)?;
            let mut out = String::with_capacity(s.len());
            for b in s.bytes() {
                match b {
                    b' ' => out.push('+'),
                    b if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) => out.push(b as char),
                    b => out.push_str(&format!("%{b:02X}")),
                }
            }
            bounded(out)
        }
        "jsonencode" => {
            arity(args, 1, 1)?;
            bounded(json_text(&args[0]))
        }
        "jsondecode" => {
            let [s] = strings::<1>(args)?;
            let json: serde_json::Value = serde_json::from_str(&s).map_err(|e| format!("invalid JSON: {e}"))?;
            Ok(from_json(json))
        }
        "csvdecode" => {
            let [s] = strings::<1>(args)?;
            csvdecode(&s)
        }
        "yamldecode" => {
            let [s] = strings::<1>(args)?;
            yamldecode(&s)
        }
        "yamlencode" => {
            arity(args, 1, 1)?;
            let mut out = String::new();
            yaml_node(&args[0], 0, Context::Top, &mut out);
            if !out.ends_with('\n') {
                out.push('\n');
            }
            bounded(out)
        }
        _ => unreachable!("{name} is not an encoding function"),
    }
}

/// Converts parsed JSON into an HCL value.
pub(super) fn from_json(json: serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => n
            .as_i64()
            .map(Number::from)
            .or_else(|| n.as_u64().map(Number::from))
            .or_else(|| n.as_f64().and_then(number_from_f64))
            .map_or(Value::Null, Value::Number),
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(items) => Value::Array(items.into_iter().map(from_json).collect()),
        serde_json::Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, from_json(v))).collect()),
    }
}

/// JSON as cty writes it: object keys sorted, `<`, `>` and `&` escaped as Go's encoder does.
pub(crate) fn json_text(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_text(n)),
        Value::String(s) => write_go_json_string(out, s, true),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(item, out);
            }
            out.push(']');
        }
        Value::Object(_) => {
            out.push('{');
            for (i, (k, item)) in sorted_entries(v).unwrap_or_default().iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_go_json_string(out, k, true);
                out.push(':');
                write_json(item, out);
            }
            out.push('}');
        }
    }
}

/// `s` as a JSON string the way Go's `encoding/json` writes it: `<`, `>` and `&` escaped when
/// `escape_html` (as `json.Marshal` does), the JavaScript line terminators and other control
/// characters always.
pub fn write_go_json_string(out: &mut String, s: &str, escape_html: bool) {
    use std::fmt::Write as _;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' if escape_html => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number in decimal without an exponent (cty's `Text('f', -1)`).
fn number_text(n: &Number) -> String {
    match integer_of(n) {
        Some(i) => i.to_string(),
        None => n.as_f64().map_or_else(|| n.to_string(), |f| format!("{f}")),
    }
}

/// Go's `encoding/csv` as cty uses it: the first record names the columns, every record has as
/// many fields, quotes may wrap fields (`""` is a quote), blank lines are skipped.
fn csvdecode(s: &str) -> Result<Value, String> {
    let records = csv_records(s)?;
    let mut records = records.into_iter();
    let Some((_, header)) = records.next() else { return Err("missing header line".to_string()) };
    for (i, name) in header.iter().enumerate() {
        if header[..i].contains(name) {
            return Err(format!("duplicate column name \"{name}\""));
        }
    }
    let mut rows = Vec::new();
    for (line, fields) in records {
        if fields.len() != header.len() {
            return Err(format!("CSV parse error on line {line}: wrong number of fields"));
        }
        let row: Map<String, Value> = header.iter().cloned().zip(fields.into_iter().map(Value::String)).collect();
        rows.push(Value::Object(row));
    }
    Ok(Value::Array(rows))
}

/// The records of a CSV text with the line each starts on.
fn csv_records(s: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut records = Vec::new();
    let mut chars = s.chars().peekable();
    let mut line = 1;
    while chars.peek().is_some() {
        // Skip empty lines.
        if matches!(chars.peek(), Some('\n') | Some('\r')) {
            if chars.next() == Some('\r') && chars.peek() == Some(&'\n') {
                chars.next();
            }
            line += 1;
            continue;
        }
        let start_line = line;
        let mut fields = Vec::new();
        loop {
            let mut field = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err(format!("CSV parse error on line {start_line}: extraneous or missing \" in quoted-field")),
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            field.push('"');
                        }
                        Some('"') => break,
                        Some('\r') if chars.peek() == Some(&'\n') => {}
                        Some(c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            field.push(c);
                        }
                    }
                }
                if !matches!(chars.peek(), None | Some(',') | Some('\n') | Some('\r')) {
                    return Err(format!("CSV parse error on line {line}: extraneous or missing \" in quoted-field"));
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ',' || c == '\n' || c == '\r' {
                        break;
                    }
                    if c == '"' {
                        return Err(format!("CSV parse error on line {line}: bare \" in non-quoted-field"));
                    }
                    field.push(c);
                    chars.next();
                }
            }
            fields.push(field);
            match chars.next() {
                Some(',') => continue,
                Some('\r') => {
                    if chars.peek() == Some(&'\n') {
                        chars.next();
                    }
                    line += 1;
                    break;
                }
                Some('\n') => {
                    line += 1;
                    break;
                }
                _ => break,
            }
        }
        records.push((start_line, fields));
    }
    Ok(records)
}

/// A collection being built while reading YAML events.
enum Frame {
    Seq { items: Vec<Value>, anchor: usize },
    Map { map: Map<String, Value>, key: Option<Key>, anchor: usize },
}

enum Key {
    Name(String),
    /// `<<`: the value's keys are merged into the mapping.
    Merge,
}

fn yamldecode(s: &str) -> Result<Value, String> {
    let mut parser = Parser::new_from_str(s);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: std::collections::HashMap<usize, Value> = std::collections::HashMap::new();
    let mut root: Option<Value> = None;
    let mut documents = 0;
    let mut nodes: u64 = 0;
    loop {
        let (event, mark) =
            parser.next_token().map_err(|e| format!("on line {}, column {}: {}", e.marker().line(), e.marker().col() + 1, e.info()))?;
        let at = |m: String| format!("on line {}, column {}: {m}", mark.line(), mark.col() + 1);
        let finished = match event {
            Event::StreamEnd => break,
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    return Err(at("only a single document is allowed".to_string()));
                }
                None
            }
            Event::Alias(id) => {
                if stack.iter().any(|f| matches!(f, Frame::Seq { anchor, .. } | Frame::Map { anchor, .. } if *anchor == id)) {
                    return Err(at("cannot refer to anchor from inside its own definition".to_string()));
                }
                let v = anchors.get(&id).cloned().ok_or_else(|| at("alias refers to an unknown anchor".to_string()))?;
                nodes += size_of(&v);
                Some((v, 0))
            }
            Event::Scalar(text, style, anchor, tag) => {
                nodes += 1;
                let tag = tag.map(|t| {
                    if t.handle == "tag:yaml.org,2002:" || t.handle == "!!" {
                        format!("!!{}", t.suffix)
                    } else {
                        format!("{}{}", t.handle, t.suffix)
                    }
                });
                let plain = matches!(style, TScalarStyle::Plain);
                let is_merge_key = plain && tag.is_none() && text == "<<" && matches!(stack.last(), Some(Frame::Map { key: None, .. }));
                if is_merge_key {
                    if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                        *key = Some(Key::Merge);
                    }
                    continue;
                }
                Some((yaml_scalar(&text, plain, tag.as_deref()).map_err(at)?, anchor))
            }
            Event::SequenceStart(anchor, tag) => {
                check_collection_tag(tag.as_ref(), "seq").map_err(at)?;
                stack.push(Frame::Seq { items: Vec::new(), anchor });
                None
            }
            Event::MappingStart(anchor, tag) => {
                check_collection_tag(tag.as_ref(), "map").map_err(at)?;
                stack.push(Frame::Map { map: Map::new(), key: None, anchor });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq { items, anchor }) => Some((Value::Array(items), anchor)),
                Some(Frame::Map { map, anchor, .. }) => Some((Value::Object(map), anchor)),
                None => return Err(at("unexpected end of a collection".to_string())),
            },
        };
        if nodes > MAX_YAML_NODES {
            return Err(format!("the document expands to more than {MAX_YAML_NODES} values"));
        }
        let Some((value, anchor)) = finished else { continue };
        if anchor > 0 {
            anchors.insert(anchor, value.clone());
        }
        match stack.last_mut() {
            None => root = Some(value),
            Some(Frame::Seq { items, .. }) => items.push(value),
            Some(Frame::Map { map, key, .. }) => match key.take() {
                None => {
                    let name = match value {
                        Value::String(s) => s,
                        Value::Null => "null".to_string(),
                        Value::Bool(b) => b.to_string(),
                        Value::Number(n) => number_text(&n),
                        _ => return Err(at("only strings are allowed as mapping keys".to_string())),
                    };
                    *key = Some(Key::Name(name));
                }
                Some(Key::Name(name)) => {
                    map.insert(name, value);
                }
                Some(Key::Merge) => {
                    let sources = match value {
                        Value::Object(m) => vec![m],
                        Value::Array(items) => items
                            .into_iter()
                            .map(|i| match i {
                                Value::Object(m) => Ok(m),
                                _ => Err(at("map merge requires map or sequence of maps as the value".to_string())),
                            })
                            .collect::<Result<_, _>>()?,
                        _ => return Err(at("map merge requires map or sequence of maps as the value".to_string())),
                    };
                    for source in sources {
                        for (k, v) in source {
                            map.entry(k).or_insert(v);
                        }
                    }
                }
            },
        }
    }
    Ok(root.unwrap_or(Value::Null))
}

fn check_collection_tag(tag: Option<&yaml_rust2::parser::Tag>, kind: &str) -> Result<(), String> {
    match tag {
        None => Ok(()),
        Some(t) if (t.handle == "tag:yaml.org,2002:" || t.handle == "!!") && t.suffix == kind => Ok(()),
        Some(t) => Err(format!("can't interpret {} as {}{}", if kind == "seq" { "sequence" } else { "mapping" }, t.handle, t.suffix)),
    }
}

/// A scalar with go-cty-yaml's resolution (YAML 1.1 booleans, `~`/`null`, numbers, timestamps).
fn yaml_scalar(text: &str, plain: bool, tag: Option<&str>) -> Result<Value, String> {
    match tag {
        None if !plain => return Ok(Value::String(text.to_string())),
        None | Some("!!bool") | Some("!!int") | Some("!!float") | Some("!!null") | Some("!!timestamp") => {}
        Some("!!str") => return Ok(Value::String(text.to_string())),
        Some("!!binary") => {
            let compact: String = text.split_whitespace().collect();
            STANDARD.decode(compact.as_bytes()).map_err(|_| format!("cannot parse \"{text}\" as !!binary: not valid base64"))?;
            return Ok(Value::String(text.to_string()));
        }
        Some(other) => return Err(format!("unsupported tag \"{other}\"")),
    }
    let resolved = match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(Value::Bool(true)),
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(Value::Bool(false)),
        "" | "~" | "null" | "Null" | "NULL" => Some(Value::Null),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF" => {
            return Err("infinity cannot be represented in a job file".to_string());
        }
        ".nan" | ".NaN" | ".NAN" => return Err("floating point NaN is not supported".to_string()),
        _ => None,
    };
    let resolved = resolved.or_else(|| yaml_timestamp(text).map(Value::String)).or_else(|| yaml_number(text).map(Value::Number));
    match (tag, resolved) {
        (None, Some(v)) => Ok(v),
        (None, None) => Ok(Value::String(text.to_string())),
        (Some("!!bool"), Some(v @ Value::Bool(_)))
        | (Some("!!null"), Some(v @ Value::Null))
        | (Some("!!int" | "!!float"), Some(v @ Value::Number(_)))
        | (Some("!!timestamp"), Some(v @ Value::String(_))) => Ok(v),
        (Some(tag), _) => Err(format!("cannot parse \"{text}\" as {tag}")),
    }
}

fn yaml_number(text: &str) -> Option<Number> {
    let plain = text.replace('_', "");
    let first = plain.bytes().next()?;
    if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.')) {
        return None;
    }
    if let Some(n) = parse_number(plain.strip_prefix('+').unwrap_or(&plain)) {
        return Some(n);
    }
    let (negative, digits) = match plain.as_bytes()[0] {
        b'-' => (true, &plain[1..]),
        b'+' => (false, &plain[1..]),
        _ => (false, plain.as_str()),
    };
    let (radix, digits) = if let Some(h) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        (16, h)
    } else if let Some(b) = digits.strip_prefix("0b").or_else(|| digits.strip_prefix("0B")) {
        (2, b)
    } else if let Some(o) = digits.strip_prefix("0o").or_else(|| digits.strip_prefix("0O")) {
        (8, o)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        return None;
    };
    let n = i64::from_str_radix(digits, radix).ok()?;
    Some(Number::from(if negative { -n } else { n }))
}

/// YAML timestamps (`2001-12-14`, `2001-12-14t21:59:43.10-05:00`, ...) as RFC 3339 text.
fn yaml_timestamp(text: &str) -> Option<String> {
    let b = text.as_bytes();
    if b.len() < 10 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return None;
    }
    if b.len() == 10 && b[7] == b'-' && b[5..7].iter().chain(&b[8..10]).all(u8::is_ascii_digit) {
        return Some(format!("{text}T00:00:00Z"));
    }
    let normalized = text.replacen(['t', ' '], "T", 1);
    super::datetime::parse_rfc3339(&normalized).ok().map(|t| t.format_rfc3339())
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Top,
    /// The value of a mapping key written at this indentation.
    MapValue,
    /// An item after `- `.
    SeqItem,
}

/// yamlencode in the block style go-cty-yaml's emitter writes: keys and strings double-quoted,
/// strings with line breaks as literal blocks, map keys sorted.
fn yaml_node(v: &Value, indent: usize, ctx: Context, out: &mut String) {
    match v {
        Value::Array(items) if !items.is_empty() => {
            // A sequence under a key is not indented further; one in a sequence starts on the item's line.
            let item_indent = match ctx {
                Context::Top | Context::MapValue => indent,
                Context::SeqItem => indent + 2,
            };
            for (i, item) in items.iter().enumerate() {
                if ctx == Context::MapValue || i > 0 {
                    newline_to(out, item_indent);
                }
                out.push_str("- ");
                yaml_node(item, item_indent, Context::SeqItem, out);
            }
        }
        Value::Object(_) if !sorted_entries(v).unwrap_or_default().is_empty() => {
            let entry_indent = match ctx {
                Context::Top => 0,
                Context::MapValue | Context::SeqItem => indent + 2,
            };
            for (i, (k, item)) in sorted_entries(v).unwrap_or_default().iter().enumerate() {
                if ctx == Context::MapValue || i > 0 {
                    newline_to(out, entry_indent);
                }
                yaml_double_quoted(k, out);
                out.push(':');
                let collection = matches!(item, Value::Array(a) if !a.is_empty()) || matches!(item, Value::Object(m) if !m.is_empty());
                if !collection {
                    out.push(' ');
                }
                yaml_node(item, entry_indent, Context::MapValue, out);
            }
        }
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_text(n)),
        Value::String(s) => {
            let block_indent = if ctx == Context::Top { 2 } else { indent + 2 };
            if s.contains('\n') && literal_allowed(s) {
                yaml_literal(s, block_indent, out);
            } else {
                yaml_double_quoted(s, out);
            }
        }
    }
}

fn newline_to(out: &mut String, indent: usize) {
    out.push('\n');
    out.push_str(&" ".repeat(indent));
}

/// Whether libyaml would write this string as a literal block (no trailing spaces, no space
/// before a line break, only printable characters).
fn literal_allowed(s: &str) -> bool {
    !s.ends_with(' ') && !s.contains(" \n") && s.chars().all(|c| c == '\n' || yaml_printable(c))
}

fn yaml_printable(c: char) -> bool {
    let c = c as u32;
    c == 0x0A
        || (0x20..=0x7E).contains(&c)
        || c == 0x85
        || (0xA0..=0xD7FF).contains(&c)
        || ((0xE000..=0xFFFD).contains(&c) && c != 0xFEFF)
        || c >= 0x10000
}

fn yaml_literal(s: &str, indent: usize, out: &mut String) {
    out.push('|');
    if s.starts_with(' ') || s.starts_with('\n') {
        out.push('2');
    }
    if !s.ends_with('\n') {
        out.push('-');
    } else if s == "\n" || s.ends_with("\n\n") {
        out.push('+');
    }
    let body = s.strip_suffix('\n').unwrap_or(s);
    for line in body.split('\n') {
        out.push('\n');
        if !line.is_empty() {
            out.push_str(&" ".repeat(indent));
            out.push_str(line);
        }
    }
}

fn yaml_double_quoted(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push_str("\\0"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if !yaml_printable(c) || c == '\u{feff}' => {
                let n = c as u32;
                if n <= 0xFF {
                    out.push_str(&format!("\\x{n:02X}"));
                } else if n <= 0xFFFF {
                    out.push_str(&format!("\\u{n:04X}"));
                } else {
                    out.push_str(&format!("\\U{n:08X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
