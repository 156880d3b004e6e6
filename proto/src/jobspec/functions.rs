//! The HCL functions a job file may call (a subset of Nomad's jobspec2 list,
//! which is Terraform's cty standard library).
//!
//! Functions get already evaluated arguments and return a value or a message;
//! the evaluator adds the function name and location. Results are bounded
//! (`range` to 1024 elements like cty, strings to [`MAX_STRING_BYTES`]).

use std::collections::BTreeMap;

use hcl::{Map, Number, Value};

use super::eval::{MAX_STRING_BYTES, as_bool, as_number, as_string, describe, integer_of, number_from_f64, values_equal};

/// Functions Nomad offers that nomad-rs does not implement, so the message can say so.
const NOT_IMPLEMENTED: &[&str] = &[
    "can",
    "try",
    "regex",
    "regexall",
    "regex_replace",
    "cidrhost",
    "cidrnetmask",
    "cidrsubnet",
    "cidrsubnets",
    "csvdecode",
    "file",
    "fileexists",
    "fileset",
    "filebase64",
    "templatefile",
    "formatdate",
    "timeadd",
    "yamldecode",
    "yamlencode",
    "setproduct",
    "setintersection",
    "setsubtract",
    "setunion",
    "transpose",
    "convert",
    "uuidv5",
    "bcrypt",
    "md5",
    "sha1",
    "sha256",
    "sha512",
    "rsadecrypt",
    "formatlist",
    "log",
];

/// Most elements `range` may produce (cty's limit).
const MAX_RANGE: usize = 1024;

/// Calls the function `name`.
pub(crate) fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    let result = match name {
        // strings
        "upper" => string_fn(&args, |s| s.to_uppercase()),
        "lower" => string_fn(&args, |s| s.to_lowercase()),
        "title" => string_fn(&args, title_case),
        "strrev" => string_fn(&args, |s| s.chars().rev().collect()),
        "trimspace" => string_fn(&args, |s| s.trim().to_string()),
        "chomp" => string_fn(&args, |s| s.trim_end_matches(['\n', '\r']).to_string()),
        "trim" => {
            let [s, cut] = strings::<2>(&args)?;
            Ok(Value::String(s.trim_matches(|c| cut.contains(c)).to_string()))
        }
        "trimprefix" => {
            let [s, p] = strings::<2>(&args)?;
            Ok(Value::String(s.strip_prefix(p.as_str()).unwrap_or(&s).to_string()))
        }
        "trimsuffix" => {
            let [s, p] = strings::<2>(&args)?;
            Ok(Value::String(s.strip_suffix(p.as_str()).unwrap_or(&s).to_string()))
        }
        "startswith" => {
            let [s, p] = strings::<2>(&args)?;
            Ok(Value::Bool(s.starts_with(p.as_str())))
        }
        "endswith" => {
            let [s, p] = strings::<2>(&args)?;
            Ok(Value::Bool(s.ends_with(p.as_str())))
        }
        "strcontains" => {
            let [s, p] = strings::<2>(&args)?;
            Ok(Value::Bool(s.contains(p.as_str())))
        }
        "replace" => {
            let [s, from, to] = strings::<3>(&args)?;
            if from.len() > 1 && from.starts_with('/') && from.ends_with('/') {
                return Err("regular expression patterns are not supported by nomad-rs".to_string());
            }
            if from.is_empty() {
                return Ok(Value::String(s));
            }
            bounded(s.replace(from.as_str(), &to))
        }
        "substr" => substr(&args),
        "split" => {
            let [sep, s] = strings::<2>(&args)?;
            if sep.is_empty() {
                return Ok(Value::Array(s.chars().map(|c| Value::String(c.to_string())).collect()));
            }
            Ok(Value::Array(s.split(sep.as_str()).map(Value::from).collect()))
        }
        "join" => {
            arity(&args, 2, usize::MAX)?;
            let sep = string_arg(&args[0])?;
            let mut parts = Vec::new();
            for list in &args[1..] {
                for item in list_arg(list)? {
                    parts.push(string_arg(&item)?);
                }
            }
            bounded(parts.join(&sep))
        }
        "indent" => {
            arity(&args, 2, 2)?;
            let n = usize::try_from(whole(&args[0])?).map_err(|_| "indent must not be negative".to_string())?;
            if n > 1024 {
                return Err("indent is too large".to_string());
            }
            let s = string_arg(&args[1])?;
            let pad = " ".repeat(n);
            bounded(
                s.split('\n')
                    .enumerate()
                    .map(|(i, l)| if i == 0 { l.to_string() } else { format!("{pad}{l}") })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        }
        "format" => {
            arity(&args, 1, usize::MAX)?;
            format(&string_arg(&args[0])?, &args[1..])
        }
        // collections
        "length" => {
            arity(&args, 1, 1)?;
            match &args[0] {
                Value::String(s) => Ok(Value::from(s.chars().count() as u64)),
                Value::Array(a) => Ok(Value::from(a.len() as u64)),
                Value::Object(m) => Ok(Value::from(m.len() as u64)),
                other => Err(format!("cannot take the length of {}", describe(other))),
            }
        }
        "concat" => {
            let mut out = Vec::new();
            for list in &args {
                out.extend(list_arg(list)?);
            }
            Ok(Value::Array(out))
        }
        "contains" => {
            arity(&args, 2, 2)?;
            Ok(Value::Bool(list_arg(&args[0])?.iter().any(|v| values_equal(v, &args[1]))))
        }
        "distinct" => {
            arity(&args, 1, 1)?;
            let mut out: Vec<Value> = Vec::new();
            for v in list_arg(&args[0])? {
                if !out.iter().any(|o| values_equal(o, &v)) {
                    out.push(v);
                }
            }
            Ok(Value::Array(out))
        }
        "element" => {
            arity(&args, 2, 2)?;
            let list = list_arg(&args[0])?;
            if list.is_empty() {
                return Err("cannot use element() on an empty list".to_string());
            }
            let i = whole(&args[1])?;
            if i < 0 {
                return Err("index must not be negative".to_string());
            }
            let len = list.len() as i64;
            Ok(list[(i % len) as usize].clone())
        }
        "index" => {
            arity(&args, 2, 2)?;
            list_arg(&args[0])?
                .iter()
                .position(|v| values_equal(v, &args[1]))
                .map(|i| Value::from(i as u64))
                .ok_or_else(|| "value not found in the list".to_string())
        }
        "flatten" => {
            arity(&args, 1, 1)?;
            let mut out = Vec::new();
            flatten_into(list_arg(&args[0])?, &mut out, 0)?;
            Ok(Value::Array(out))
        }
        "keys" => {
            arity(&args, 1, 1)?;
            Ok(Value::Array(sorted_entries(&args[0])?.into_keys().map(Value::String).collect()))
        }
        "values" => {
            arity(&args, 1, 1)?;
            Ok(Value::Array(sorted_entries(&args[0])?.into_values().collect()))
        }
        "lookup" => {
            arity(&args, 2, 3)?;
            let map = object_arg(&args[0])?;
            let key = string_arg(&args[1])?;
            match (map.get(&key), args.get(2)) {
                (Some(v), _) => Ok(v.clone()),
                (None, Some(default)) => Ok(default.clone()),
                (None, None) => Err(format!("key \"{key}\" not found and no default given")),
            }
        }
        "merge" => {
            let mut out = Map::new();
            for m in &args {
                if matches!(m, Value::Null) {
                    continue;
                }
                for (k, v) in object_arg(m)? {
                    out.insert(k, v);
                }
            }
            Ok(Value::Object(out))
        }
        "zipmap" => {
            arity(&args, 2, 2)?;
            let (keys, values) = (list_arg(&args[0])?, list_arg(&args[1])?);
            if keys.len() != values.len() {
                return Err(format!("{} keys but {} values", keys.len(), values.len()));
            }
            let mut out = Map::new();
            for (k, v) in keys.iter().zip(values) {
                out.insert(string_arg(k)?, v);
            }
            Ok(Value::Object(out))
        }
        "range" => range(&args),
        "reverse" => {
            arity(&args, 1, 1)?;
            let mut list = list_arg(&args[0])?;
            list.reverse();
            Ok(Value::Array(list))
        }
        "slice" => {
            arity(&args, 3, 3)?;
            let list = list_arg(&args[0])?;
            let (start, end) = (whole(&args[1])?, whole(&args[2])?);
            if start < 0 || end < start || end as usize > list.len() {
                return Err(format!("slice bounds [{start}, {end}) are out of range for {} elements", list.len()));
            }
            Ok(Value::Array(list[start as usize..end as usize].to_vec()))
        }
        "sort" => {
            arity(&args, 1, 1)?;
            let mut items = list_arg(&args[0])?.iter().map(string_arg).collect::<Result<Vec<_>, _>>()?;
            items.sort();
            Ok(Value::Array(items.into_iter().map(Value::String).collect()))
        }
        "chunklist" => {
            arity(&args, 2, 2)?;
            let list = list_arg(&args[0])?;
            let size = whole(&args[1])?;
            if size < 0 {
                return Err("chunk size must not be negative".to_string());
            }
            if size == 0 {
                return Ok(Value::Array(vec![Value::Array(list)]));
            }
            Ok(Value::Array(list.chunks(size as usize).map(|c| Value::Array(c.to_vec())).collect()))
        }
        "compact" => {
            arity(&args, 1, 1)?;
            Ok(Value::Array(
                list_arg(&args[0])?
                    .into_iter()
                    .filter(|v| !matches!(v, Value::Null) && !matches!(v, Value::String(s) if s.is_empty()))
                    .collect(),
            ))
        }
        "coalesce" => args
            .iter()
            .find(|v| !matches!(v, Value::Null) && !matches!(v, Value::String(s) if s.is_empty()))
            .cloned()
            .ok_or_else(|| "no non-null, non-empty argument".to_string()),
        "coalescelist" => args
            .iter()
            .find(|v| matches!(v, Value::Array(a) if !a.is_empty()))
            .cloned()
            .ok_or_else(|| "no non-empty list argument".to_string()),
        // numbers
        "abs" => number_fn(&args, f64::abs),
        "ceil" => number_fn(&args, f64::ceil),
        "floor" => number_fn(&args, f64::floor),
        "signum" => number_fn(&args, f64::signum),
        "pow" => {
            arity(&args, 2, 2)?;
            let (a, b) = (float_arg(&args[0])?, float_arg(&args[1])?);
            number_from_f64(a.powf(b)).map(Value::Number).ok_or_else(|| "result is not a finite number".to_string())
        }
        "max" | "min" => {
            arity(&args, 1, usize::MAX)?;
            let mut best = as_number(&args[0]).ok_or_else(|| format!("a number is required, got {}", describe(&args[0])))?;
            for v in &args[1..] {
                let n = as_number(v).ok_or_else(|| format!("a number is required, got {}", describe(v)))?;
                let (x, y) = (n.as_f64().unwrap_or(f64::NAN), best.as_f64().unwrap_or(f64::NAN));
                if (name == "max" && x > y) || (name == "min" && x < y) {
                    best = n;
                }
            }
            Ok(Value::Number(best))
        }
        "parseint" => {
            arity(&args, 2, 2)?;
            let s = string_arg(&args[0])?;
            let base = whole(&args[1])?;
            if !(2..=62).contains(&base) {
                return Err("base must be between 2 and 62".to_string());
            }
            let base = if base > 36 { return Err("bases above 36 are not supported".to_string()) } else { base as u32 };
            i64::from_str_radix(&s, base).map(Value::from).map_err(|_| format!("cannot parse \"{s}\" as a base {base} integer"))
        }
        // encodings
        "jsonencode" => {
            arity(&args, 1, 1)?;
            serde_json::to_string(&args[0]).map(Value::String).map_err(|e| e.to_string())
        }
        "jsondecode" => {
            arity(&args, 1, 1)?;
            let s = string_arg(&args[0])?;
            let json: serde_json::Value = serde_json::from_str(&s).map_err(|e| format!("invalid JSON: {e}"))?;
            Ok(from_json(json))
        }
        "base64encode" => string_fn(&args, |s| base64_encode(s.as_bytes())),
        "base64decode" => {
            arity(&args, 1, 1)?;
            let bytes = base64_decode(&string_arg(&args[0])?).ok_or_else(|| "invalid base64".to_string())?;
            String::from_utf8(bytes).map(Value::String).map_err(|_| "the decoded bytes are not UTF-8".to_string())
        }
        "urlencode" => string_fn(&args, |s| {
            s.bytes()
                .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
                .collect()
        }),
        "uuidv4" => {
            arity(&args, 0, 0)?;
            Ok(Value::String(uuid::Uuid::new_v4().to_string()))
        }
        // type conversions
        "tostring" => {
            arity(&args, 1, 1)?;
            match &args[0] {
                Value::Null => Ok(Value::Null),
                v => as_string(v).map(Value::String).ok_or_else(|| format!("cannot convert {} to a string", describe(v))),
            }
        }
        "tonumber" => {
            arity(&args, 1, 1)?;
            match &args[0] {
                Value::Null => Ok(Value::Null),
                v => as_number(v).map(Value::Number).ok_or_else(|| format!("cannot convert {} to a number", describe(v))),
            }
        }
        "tobool" => {
            arity(&args, 1, 1)?;
            match &args[0] {
                Value::Null => Ok(Value::Null),
                v => as_bool(v).map(Value::Bool).ok_or_else(|| format!("cannot convert {} to a bool", describe(v))),
            }
        }
        "tolist" | "toset" => {
            arity(&args, 1, 1)?;
            let list = list_arg(&args[0])?;
            if name == "toset" { call("distinct", vec![Value::Array(list)]) } else { Ok(Value::Array(list)) }
        }
        "tomap" => {
            arity(&args, 1, 1)?;
            object_arg(&args[0]).map(Value::Object)
        }
        _ if NOT_IMPLEMENTED.contains(&name) => Err("this function is not supported by nomad-rs".to_string()),
        _ => Err("call to unknown function".to_string()),
    }?;
    Ok(result)
}

fn arity(args: &[Value], min: usize, max: usize) -> Result<(), String> {
    if args.len() < min || args.len() > max {
        let want = if min == max {
            format!("{min}")
        } else if max == usize::MAX {
            format!("at least {min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(format!("expected {want} argument(s), got {}", args.len()));
    }
    Ok(())
}

fn string_arg(v: &Value) -> Result<String, String> {
    as_string(v).ok_or_else(|| format!("a string is required, got {}", describe(v)))
}

fn strings<const N: usize>(args: &[Value]) -> Result<[String; N], String> {
    arity(args, N, N)?;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, v) in out.iter_mut().zip(args) {
        *slot = string_arg(v)?;
    }
    Ok(out)
}

fn string_fn(args: &[Value], f: impl Fn(&str) -> String) -> Result<Value, String> {
    let [s] = strings::<1>(args)?;
    bounded(f(&s))
}

fn bounded(s: String) -> Result<Value, String> {
    if s.len() > MAX_STRING_BYTES { Err("result is too long".to_string()) } else { Ok(Value::String(s)) }
}

fn float_arg(v: &Value) -> Result<f64, String> {
    as_number(v).and_then(|n| n.as_f64()).ok_or_else(|| format!("a number is required, got {}", describe(v)))
}

fn whole(v: &Value) -> Result<i64, String> {
    as_number(v).and_then(|n| integer_of(&n)).ok_or_else(|| format!("a whole number is required, got {}", describe(v)))
}

fn number_fn(args: &[Value], f: impl Fn(f64) -> f64) -> Result<Value, String> {
    arity(args, 1, 1)?;
    if let Some(Some(i)) = as_number(&args[0]).map(|n| integer_of(&n)) {
        // Whole numbers stay exact (abs/ceil/floor/signum of an integer is an integer).
        let r = f(i as f64);
        if r.abs() < 9.0e15 {
            return Ok(Value::from(r as i64));
        }
    }
    number_from_f64(f(float_arg(&args[0])?)).map(Value::Number).ok_or_else(|| "result is not a finite number".to_string())
}

fn list_arg(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items.clone()),
        other => Err(format!("a list is required, got {}", describe(other))),
    }
}

fn object_arg(v: &Value) -> Result<Map<String, Value>, String> {
    match v {
        Value::Object(map) => Ok(map.clone()),
        other => Err(format!("a map is required, got {}", describe(other))),
    }
}

/// Map entries sorted by key, as cty orders map keys.
fn sorted_entries(v: &Value) -> Result<BTreeMap<String, Value>, String> {
    Ok(object_arg(v)?.into_iter().collect())
}

fn flatten_into(items: Vec<Value>, out: &mut Vec<Value>, depth: usize) -> Result<(), String> {
    if depth > 64 {
        return Err("lists are nested too deeply".to_string());
    }
    for item in items {
        match item {
            Value::Array(inner) => flatten_into(inner, out, depth + 1)?,
            other => out.push(other),
        }
    }
    Ok(())
}

fn title_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at_word_start = true;
    for c in s.chars() {
        if at_word_start && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        at_word_start = !c.is_alphanumeric();
    }
    out
}

fn substr(args: &[Value]) -> Result<Value, String> {
    arity(args, 3, 3)?;
    let chars: Vec<char> = string_arg(&args[0])?.chars().collect();
    let len = chars.len() as i64;
    let mut offset = whole(&args[1])?;
    let length = whole(&args[2])?;
    if offset < 0 {
        offset += len;
    }
    if offset < 0 || offset > len {
        return Err("offset is out of range".to_string());
    }
    let end = if length < 0 { len } else { offset.saturating_add(length).min(len) };
    Ok(Value::String(chars[offset as usize..end as usize].iter().collect()))
}

fn range(args: &[Value]) -> Result<Value, String> {
    arity(args, 1, 3)?;
    let nums = args.iter().map(float_arg).collect::<Result<Vec<_>, _>>()?;
    let (start, end, step) = match nums.as_slice() {
        [end] => (0.0, *end, 1.0),
        [start, end] => (*start, *end, if end >= start { 1.0 } else { -1.0 }),
        [start, end, step] => (*start, *end, *step),
        _ => return Err("expected 1 to 3 arguments".to_string()),
    };
    if step == 0.0 || !step.is_finite() {
        return Err("step must not be zero".to_string());
    }
    if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
        return Err("step moves away from the end".to_string());
    }
    let mut out = Vec::new();
    let mut v = start;
    while (step > 0.0 && v < end) || (step < 0.0 && v > end) {
        if out.len() >= MAX_RANGE {
            return Err(format!("more than {MAX_RANGE} elements"));
        }
        out.push(Value::Number(number_from_f64(v).ok_or("range value is not finite")?));
        v += step;
    }
    Ok(Value::Array(out))
}

/// Go's fmt verbs as cty's `format` supports them: `%s %d %f %v %q %t %%`,
/// with `-`, `0` flags, width and precision.
fn format(spec: &str, args: &[Value]) -> Result<Value, String> {
    let mut out = String::new();
    let mut chars = spec.chars().peekable();
    let mut next_arg = 0;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        let (mut left, mut zero) = (false, false);
        while let Some(&f) = chars.peek() {
            match f {
                '-' => left = true,
                '0' => zero = true,
                '+' | ' ' | '#' => {}
                _ => break,
            }
            chars.next();
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            chars.next();
        }
        let mut precision = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut p = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                p.push(d);
                chars.next();
            }
            precision = Some(p.parse::<usize>().unwrap_or(0).min(64));
        }
        let width = width.parse::<usize>().unwrap_or(0);
        if width > 1024 {
            return Err("format width is too large".to_string());
        }
        let verb = chars.next().ok_or("format string ends in the middle of a verb")?;
        let arg = args.get(next_arg).ok_or_else(|| format!("not enough arguments for \"{spec}\""))?;
        next_arg += 1;
        let text = match verb {
            's' | 'v' => match arg {
                Value::Array(_) | Value::Object(_) => serde_json::to_string(arg).map_err(|e| e.to_string())?,
                Value::Null => "null".to_string(),
                _ => string_arg(arg)?,
            },
            'q' => serde_json::to_string(&string_arg(arg)?).map_err(|e| e.to_string())?,
            't' => as_bool(arg).ok_or_else(|| format!("%t needs a bool, got {}", describe(arg)))?.to_string(),
            'd' => whole(arg)?.to_string(),
            'f' | 'e' | 'g' => {
                let f = float_arg(arg)?;
                match verb {
                    'f' => format!("{:.*}", precision.unwrap_or(6), f),
                    'e' => format!("{:.*e}", precision.unwrap_or(6), f),
                    _ => Number::from_f64(f).map_or_else(|| f.to_string(), |n| n.to_string()),
                }
            }
            'x' => format!("{:x}", whole(arg)?),
            'X' => format!("{:X}", whole(arg)?),
            other => return Err(format!("unsupported format verb %{other}")),
        };
        let text = if verb == 's' { precision.map_or(text.clone(), |p| text.chars().take(p).collect()) } else { text };
        let pad = width.saturating_sub(text.chars().count());
        if left {
            out.push_str(&text);
            out.push_str(&" ".repeat(pad));
        } else if zero && matches!(verb, 'd' | 'f' | 'x' | 'X' | 'e') {
            let (sign, digits) = text.strip_prefix('-').map_or(("", text.as_str()), |d| ("-", d));
            out.push_str(sign);
            out.push_str(&"0".repeat(pad));
            out.push_str(digits);
        } else {
            out.push_str(&" ".repeat(pad));
            out.push_str(&text);
        }
        if out.len() > MAX_STRING_BYTES {
            return Err("result is too long".to_string());
        }
    }
    if next_arg < args.len() {
        return Err(format!("too many arguments for \"{spec}\""));
    }
    Ok(Value::String(out))
}

/// Converts parsed JSON into an HCL value.
pub(crate) fn from_json(json: serde_json::Value) -> Value {
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

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = BASE64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Value {
        Value::String(v.to_string())
    }

    #[test]
    fn string_functions_behave_like_ctys() {
        assert_eq!(call("upper", vec![s("web")]).unwrap(), s("WEB"));
        assert_eq!(call("format", vec![s("%s-%03d"), s("web"), Value::from(7u64)]).unwrap(), s("web-007"));
        assert_eq!(call("join", vec![s(","), Value::Array(vec![s("a"), s("b")])]).unwrap(), s("a,b"));
        assert_eq!(call("substr", vec![s("hello"), Value::from(1u64), Value::from(3u64)]).unwrap(), s("ell"));
        assert_eq!(call("base64decode", vec![call("base64encode", vec![s("nomad!")]).unwrap()]).unwrap(), s("nomad!"));
        assert!(call("regex", vec![s("a"), s("b")]).unwrap_err().contains("not supported"));
        assert!(call("nosuch", vec![]).unwrap_err().contains("unknown function"));
    }

    #[test]
    fn range_is_bounded() {
        assert_eq!(call("range", vec![Value::from(3u64)]).unwrap(), Value::Array(vec![0u64.into(), 1u64.into(), 2u64.into()]));
        assert!(call("range", vec![Value::from(1_000_000u64)]).is_err());
    }
}
