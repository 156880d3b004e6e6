//! String functions (go-cty's stdlib): lengths, offsets and widths count
//! grapheme clusters, as cty does, so `strlen("👾🕹️")` is 2.

use hcl::{Number, Value};
use unicode_segmentation::UnicodeSegmentation;

use super::encoding::json_text;
use super::{arity, bounded, float_arg, string_arg, strings, whole};
use crate::jobspec::eval::{MAX_STRING_BYTES, as_bool, as_number, describe, integer_of};

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "upper" => string_fn(args, |s| s.to_uppercase()),
        "lower" => string_fn(args, |s| s.to_lowercase()),
        "title" => string_fn(args, title_case),
        "strrev" => string_fn(args, |s| s.graphemes(true).rev().collect()),
        "strlen" => {
            let [s] = strings::<1>(args)?;
            Ok(Value::from(s.graphemes(true).count() as u64))
        }
        "trimspace" => string_fn(args, |s| s.trim().to_string()),
        "chomp" => string_fn(args, |s| s.trim_end_matches(['\n', '\r']).to_string()),
        "trim" => {
            let [s, cut] = strings::<2>(args)?;
            Ok(Value::String(s.trim_matches(|c| cut.contains(c)).to_string()))
        }
        "trimprefix" => {
            let [s, p] = strings::<2>(args)?;
            Ok(Value::String(s.strip_prefix(p.as_str()).unwrap_or(&s).to_string()))
        }
        "trimsuffix" => {
            let [s, p] = strings::<2>(args)?;
            Ok(Value::String(s.strip_suffix(p.as_str()).unwrap_or(&s).to_string()))
        }
        "replace" => {
            let [s, from, to] = strings::<3>(args)?;
            replace(&s, &from, &to)
        }
        "regex_replace" => {
            let [s, pattern, to] = strings::<3>(args)?;
            regex_replace(&s, &pattern, &to)
        }
        "substr" => substr(args),
        "split" => {
            let [sep, s] = strings::<2>(args)?;
            if sep.is_empty() {
                return Ok(Value::Array(s.chars().map(|c| Value::String(c.to_string())).collect()));
            }
            Ok(Value::Array(s.split(sep.as_str()).map(Value::from).collect()))
        }
        "join" => {
            arity(args, 2, usize::MAX)?;
            let sep = string_arg(&args[0])?;
            let mut parts = Vec::new();
            for (i, list) in args[1..].iter().enumerate() {
                let Value::Array(items) = list else {
                    return Err(format!("argument {} must be a list of strings, got {}", i + 2, describe(list)));
                };
                for (j, item) in items.iter().enumerate() {
                    if matches!(item, Value::Null) {
                        return Err(format!("element {j} of list {} is null; cannot concatenate null values", i + 1));
                    }
                    parts.push(string_arg(item)?);
                }
            }
            bounded(parts.join(&sep))
        }
        "indent" => {
            arity(args, 2, 2)?;
            let n = usize::try_from(whole(&args[0])?).map_err(|_| "the number of spaces must not be negative".to_string())?;
            let s = string_arg(&args[1])?;
            if n.saturating_mul(s.matches('\n').count()) > MAX_STRING_BYTES {
                return Err("the result would be too long".to_string());
            }
            bounded(s.replace('\n', &format!("\n{}", " ".repeat(n))))
        }
        "format" => {
            arity(args, 1, usize::MAX)?;
            format(&string_arg(&args[0])?, &args[1..]).and_then(bounded)
        }
        "formatlist" => {
            arity(args, 1, usize::MAX)?;
            formatlist(&string_arg(&args[0])?, &args[1..])
        }
        _ => unreachable!("{name} is not a string function"),
    }
}

fn string_fn(args: &[Value], f: impl Fn(&str) -> String) -> Result<Value, String> {
    let [s] = strings::<1>(args)?;
    bounded(f(&s))
}

/// Go's `strings.Title`: a letter after a separator (space, punctuation; not `_` or a digit) is upper-cased.
fn title_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut previous_separates = true;
    for c in s.chars() {
        if previous_separates {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        previous_separates = if c.is_ascii() { !(c.is_ascii_alphanumeric() || c == '_') } else { c.is_whitespace() };
    }
    out
}

/// Go's `strings.Replace(s, from, to, -1)`: an empty `from` matches before every character and at the end.
fn replace(s: &str, from: &str, to: &str) -> Result<Value, String> {
    let matches = if from.is_empty() { s.chars().count() + 1 } else { s.matches(from).count() };
    if matches.saturating_mul(to.len()) > MAX_STRING_BYTES {
        return Err("the result would be too long".to_string());
    }
    if !from.is_empty() {
        return bounded(s.replace(from, to));
    }
    let mut out = String::with_capacity(s.len() + matches * to.len());
    for c in s.chars() {
        out.push_str(to);
        out.push(c);
    }
    out.push_str(to);
    bounded(out)
}

/// RE2 syntax (the `regex` crate's is the same family); `$1`, `${1}` and `$name` expand as in Go.
fn regex_replace(s: &str, pattern: &str, to: &str) -> Result<Value, String> {
    let re = regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("error parsing regexp: {}", e.to_string().lines().last().unwrap_or_default().trim()))?;
    let matches = re.find_iter(s).count();
    if matches.saturating_mul(to.len()).saturating_add(s.len()) > MAX_STRING_BYTES * 2 {
        return Err("the result would be too long".to_string());
    }
    bounded(re.replace_all(s, to).into_owned())
}

fn substr(args: &[Value]) -> Result<Value, String> {
    arity(args, 3, 3)?;
    let s = string_arg(&args[0])?;
    let clusters: Vec<&str> = s.graphemes(true).collect();
    let len = clusters.len() as i64;
    let mut offset = whole(&args[1])?;
    let length = whole(&args[2])?;
    if offset < 0 {
        offset = (offset + len).max(0);
    }
    if offset >= len {
        return Ok(Value::String(String::new()));
    }
    let end = if length < 0 { len } else { offset.saturating_add(length).min(len) };
    Ok(Value::String(clusters[offset as usize..end as usize].concat()))
}

/// One `%` verb of a format string.
#[derive(Default)]
struct Verb {
    plus: bool,
    minus: bool,
    zero: bool,
    space: bool,
    sharp: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

/// cty's `format`: Go's verbs `%v %#v %t %b %d %o %x %X %e %E %f %g %G %s %q %%`, flags
/// `+ - 0 # space`, width, precision and `[n]` argument indexes; every argument must be used.
pub(super) fn format(spec: &str, args: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    let mut next_arg = 1usize;
    let mut highest_arg = 0usize;
    let mut chars = spec.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek().map(|(_, c)| *c) == Some('%') {
            chars.next();
            out.push('%');
            continue;
        }
        let mut verb = Verb::default();
        while let Some(&(_, f)) = chars.peek() {
            match f {
                '0' => verb.zero = true,
                '#' => verb.sharp = true,
                '-' => verb.minus = true,
                '+' => verb.plus = true,
                ' ' => verb.space = true,
                _ => break,
            }
            chars.next();
        }
        let number = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| -> Option<usize> {
            let mut n: Option<usize> = None;
            while let Some(&(_, d)) = chars.peek().filter(|(_, d)| d.is_ascii_digit()) {
                n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d as usize - '0' as usize));
                chars.next();
            }
            n
        };
        verb.width = number(&mut chars);
        if chars.peek().map(|(_, c)| *c) == Some('.') {
            chars.next();
            verb.precision = Some(number(&mut chars).unwrap_or(0));
        }
        let mut arg_num = next_arg;
        if chars.peek().map(|(_, c)| *c) == Some('[') {
            chars.next();
            arg_num = number(&mut chars).filter(|n| *n > 0).ok_or_else(|| format!("invalid format string starting at offset {start}"))?;
            if chars.next().map(|(_, c)| c) != Some(']') {
                return Err(format!("invalid format string starting at offset {start}"));
            }
        }
        if verb.width.unwrap_or(0) > 1024 || verb.precision.unwrap_or(0) > 1024 {
            return Err(format!("width or precision of the verb at offset {start} is too large (at most 1024)"));
        }
        let (end, mode) = match chars.next() {
            Some((i, m)) if m.is_ascii_alphabetic() => (i + 1, m),
            Some((i, m)) => return Err(format!("unrecognized format character {m:?} at offset {i}")),
            None => return Err(format!("invalid format string starting at offset {start}")),
        };
        let raw = &spec[start..end];
        let arg = args
            .get(arg_num - 1)
            .ok_or_else(|| format!("not enough arguments for \"{raw}\" at {start}: need index {arg_num} but have {} total", args.len()))?;
        highest_arg = highest_arg.max(arg_num);
        next_arg = arg_num + 1;
        let unsupported = |why: String| format!("unsupported value for \"{raw}\" at {start}: {why}");
        if mode != 'v' && matches!(arg, Value::Null) {
            return Err(unsupported("null value cannot be formatted".to_string()));
        }
        let text = match mode {
            'v' => match arg {
                Value::String(s) if !verb.sharp => s.clone(),
                Value::Number(n) if !verb.sharp => number_text(n),
                Value::Bool(b) if !verb.sharp => b.to_string(),
                other => json_text(other),
            },
            't' => as_bool(arg).ok_or_else(|| unsupported(format!("a bool is required, got {}", describe(arg))))?.to_string(),
            'b' | 'd' | 'o' | 'x' | 'X' => {
                let n = as_number(arg).ok_or_else(|| unsupported(format!("a number is required, got {}", describe(arg))))?;
                let i = integer_of(&n).ok_or_else(|| unsupported("an integer is required".to_string()))?;
                let digits = match mode {
                    'b' => format!("{:b}", i.unsigned_abs()),
                    'd' => i.unsigned_abs().to_string(),
                    'o' => format!("{:o}", i.unsigned_abs()),
                    'x' => format!("{:x}", i.unsigned_abs()),
                    _ => format!("{:X}", i.unsigned_abs()),
                };
                let digits = match verb.precision {
                    Some(p) if digits.len() < p => format!("{}{digits}", "0".repeat(p - digits.len())),
                    _ => digits,
                };
                let prefix = match (verb.sharp, mode) {
                    (true, 'b') => "0b",
                    (true, 'o') => "0",
                    (true, 'x') => "0x",
                    (true, 'X') => "0X",
                    _ => "",
                };
                signed(&verb, i < 0, &format!("{prefix}{digits}"))
            }
            'e' | 'E' | 'f' | 'g' | 'G' => {
                let f = float_arg(arg).map_err(unsupported)?;
                let body = float_text(mode, verb.precision, f.abs());
                signed(&verb, f.is_sign_negative() && f != 0.0, &body)
            }
            's' | 'q' => {
                let s = string_arg(arg).map_err(unsupported)?;
                let s = match verb.precision {
                    Some(p) if p > 0 => s.graphemes(true).take(p).collect(),
                    _ => s,
                };
                if mode == 'q' { json_text(&Value::String(s)) } else { s }
            }
            other => return Err(format!("unsupported format verb '{other}' in \"{raw}\" at offset {start}")),
        };
        pad(&mut out, &verb, mode, &text);
        if out.len() > MAX_STRING_BYTES {
            return Err("the result is too long".to_string());
        }
    }
    if highest_arg < args.len() {
        if highest_arg == 0 {
            return Err("too many arguments; no verbs in format string".to_string());
        }
        return Err(format!("too many arguments; only {highest_arg} used by format string"));
    }
    Ok(out)
}

/// A number as cty prints it with `%v` (Go's `%g` with the shortest exact digits).
fn number_text(n: &Number) -> String {
    let f = n.as_f64().unwrap_or(0.0);
    signed(&Verb::default(), f < 0.0, &float_text('g', None, f.abs()))
}

/// Adds the sign a verb asks for (`+`, space) in front of a magnitude.
fn signed(verb: &Verb, negative: bool, magnitude: &str) -> String {
    let sign = if negative {
        "-"
    } else if verb.plus {
        "+"
    } else if verb.space {
        " "
    } else {
        ""
    };
    format!("{sign}{magnitude}")
}

/// Go's `%e %E %f %g %G` of a non-negative number.
fn float_text(mode: char, precision: Option<usize>, f: f64) -> String {
    match mode {
        'f' => format!("{:.*}", precision.unwrap_or(6), f),
        'e' | 'E' => {
            let s = go_exponent(&format!("{:.*e}", precision.unwrap_or(6), f));
            if mode == 'E' { s.to_uppercase() } else { s }
        }
        _ => {
            // %g: the shortest representation by default, else `precision` significant digits;
            // exponent form when the exponent is < -4 or >= the precision.
            let s = match precision {
                None => {
                    // Go's shortest %g switches to the exponent form from 1e+06 on.
                    let short = format!("{f:e}");
                    let exp: i32 = short.split('e').nth(1).and_then(|e| e.parse().ok()).unwrap_or(0);
                    if f != 0.0 && !(-4..6).contains(&exp) { go_exponent(&short) } else { format!("{f}") }
                }
                Some(p) => {
                    let p = p.max(1);
                    let sci = format!("{:.*e}", p - 1, f);
                    let exp: i32 = sci.split('e').nth(1).and_then(|e| e.parse().ok()).unwrap_or(0);
                    if exp < -4 || exp >= p as i32 {
                        let (mantissa, e) = sci.split_once('e').unwrap_or((&sci, "0"));
                        let mantissa = if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
                        go_exponent(&format!("{mantissa}e{e}"))
                    } else {
                        let decimals = (p as i32 - 1 - exp).max(0) as usize;
                        let fixed = format!("{f:.decimals$}");
                        if fixed.contains('.') { fixed.trim_end_matches('0').trim_end_matches('.').to_string() } else { fixed }
                    }
                }
            };
            if mode == 'G' { s.to_uppercase() } else { s }
        }
    }
}

/// Rust's `1.5e3` as Go writes it: `1.5e+03`.
fn go_exponent(s: &str) -> String {
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s.to_string(),
    }
}

/// Pads to the verb's width (counted in grapheme clusters), left or right, with spaces or zeros.
fn pad(out: &mut String, verb: &Verb, mode: char, text: &str) {
    let width = verb.width.unwrap_or(0);
    let len = text.graphemes(true).count();
    let fill = width.saturating_sub(len);
    if verb.minus {
        out.push_str(text);
        out.push_str(&" ".repeat(fill));
    } else if verb.zero && "bdoxXeEfgG".contains(mode) {
        let sign_len = text.find(|c: char| !matches!(c, '-' | '+' | ' ')).unwrap_or(0);
        out.push_str(&text[..sign_len]);
        out.push_str(&"0".repeat(fill));
        out.push_str(&text[sign_len..]);
    } else {
        out.push_str(&" ".repeat(fill));
        out.push_str(text);
    }
}

/// cty's `formatlist`: list arguments are iterated together (all the same length), others repeat.
fn formatlist(spec: &str, args: &[Value]) -> Result<Value, String> {
    let mut length: Option<(usize, usize)> = None;
    for (i, arg) in args.iter().enumerate() {
        if let Value::Array(items) = arg {
            match length {
                None => length = Some((items.len(), i)),
                Some((len, first)) if len != items.len() => {
                    return Err(format!(
                        "argument {} has length {}, which is inconsistent with argument {} of length {len}",
                        i + 1,
                        items.len(),
                        first + 1
                    ));
                }
                Some(_) => {}
            }
        }
    }
    let iterations = length.map_or(1, |(len, _)| len);
    let mut out = Vec::with_capacity(iterations);
    let mut total = 0usize;
    for iteration in 0..iterations {
        let these: Vec<Value> = args
            .iter()
            .map(|a| match a {
                Value::Array(items) => items[iteration].clone(),
                other => other.clone(),
            })
            .collect();
        let s = format(spec, &these).map_err(|e| format!("error on format iteration {iteration}: {e}"))?;
        total += s.len();
        if total > MAX_STRING_BYTES {
            return Err("the result is too long".to_string());
        }
        out.push(Value::String(s));
    }
    Ok(Value::Array(out))
}
