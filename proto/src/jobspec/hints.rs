//! Syntax errors explained: what a job file most likely meant when HCL2 refuses it.
//!
//! The parser's own message ("expected `{`") is exact but says nothing about the two mistakes
//! behind most syntax errors in real job files: a block label written with `${...}`, and a file
//! written in HCL1, the syntax Nomad read before 1.0. Nomad 1.6 tells them apart by parsing the
//! file again with its HCL1 parser; nomad-rs has none, so the line the error is on is read for the
//! forms only HCL1 accepts. The original message is always kept.

use super::error::{JobspecError, Position};

/// Where Nomad explains what changed from HCL1 to HCL2.
pub(crate) const HCL2_UPGRADE_GUIDE: &str = "https://developer.hashicorp.com/nomad/docs/job-specification/hcl2#backward-compatibilities";

/// Added to "is a block, not an attribute" when the attribute's value is an object.
pub(crate) const HCL1_BLOCK_ASSIGNMENT: &str = " (HCL1 read name = { ... } as the block; HCL2 does not, and nomad-rs reads only HCL2 job files, \
     as Nomad 1.6 does by default)";

/// The sentence added to every HCL1 hint.
pub(crate) fn hcl1_advice(what: &str) -> String {
    format!(
        "this looks like an HCL1 job file ({what}); nomad-rs reads only HCL2 job files, as Nomad 1.6 does by default \
         (Nomad reads HCL1 only with -hcl1, which nomad-rs does not have): update the file to HCL2, see {HCL2_UPGRADE_GUIDE}"
    )
}

/// Adds what a syntax error in a job file most likely means to its message.
pub(crate) fn explain(mut e: JobspecError, src: &str) -> JobspecError {
    let Some(position) = e.position else { return e };
    let Some(line) = src.lines().nth(position.line.saturating_sub(1)) else { return e };
    let (before, at) = split_at_column(line, position);
    if let Some(explained) = interpolated_label(before, at) {
        e.message = format!("{explained} ({})", e.message);
    } else if let Some(explained) = shell_expansion(before, at) {
        e.message = format!("{}; {explained}", e.message);
    } else if let Some(form) = hcl1_form(before, at, &e.message) {
        e.message = format!("{}; {}", e.message, hcl1_advice(form));
    }
    e
}

/// The line split at a 1-based character column.
fn split_at_column(line: &str, position: Position) -> (&str, &str) {
    let byte = line.char_indices().nth(position.column.saturating_sub(1)).map_or(line.len(), |(i, _)| i);
    line.split_at(byte)
}

/// `job "${var.name}" {`: HCL2 block labels are literal strings. The error is reported at the
/// label; `before` must be a block header so far (the block type and any earlier labels).
fn interpolated_label(before: &str, at: &str) -> Option<String> {
    let label = at.strip_prefix('"')?;
    let mut words = before.split_whitespace();
    let block_type = words.next()?;
    if !is_identifier(block_type) || !words.all(|w| (w.len() >= 2 && w.starts_with('"') && w.ends_with('"')) || is_identifier(w)) {
        return None;
    }
    let sequence = template_sequence(label)?;
    let advice = match block_type {
        "job" => {
            "the job's ID is its label: write it out, or set the id and name attributes inside the block (for example name = var.name)"
                .to_string()
        }
        "variable" | "variables" | "locals" => "write the name out".to_string(),
        other => format!(
            "write the name out, or generate the blocks with a dynamic block whose labels attribute computes them (dynamic \"{other}\" {{ for_each = ... labels = [...] content {{ ... }} }})"
        ),
    };
    Some(format!(
        "the label of this \"{block_type}\" block uses {sequence}...}}, but block labels are literal strings and cannot be interpolated; {advice}"
    ))
}

/// The first template sequence (`${` or `%{`, not escaped as `$${` or `%%{`) in a quoted string
/// that starts at `text` (just after its opening quote), before the string's first plain `"`.
fn template_sequence(text: &str) -> Option<&'static str> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return None,
            b'\\' => i += 2,
            c @ (b'$' | b'%') if bytes.get(i + 1) == Some(&c) && bytes.get(i + 2) == Some(&b'{') => i += 3,
            b'$' if bytes.get(i + 1) == Some(&b'{') => return Some("${"),
            b'%' if bytes.get(i + 1) == Some(&b'{') => return Some("%{"),
            _ => i += 1,
        }
    }
    None
}

/// `${NAME:-default}` in a string: a shell's parameter expansion, which HCL2 reads as an
/// interpolation (HCL1 left `${...}` to Nomad, so such files worked before 1.0).
fn shell_expansion(before: &str, at: &str) -> Option<String> {
    let open = before.rfind("${")?;
    if before[open..].contains('}') || (open > 0 && before[..open].ends_with('$')) {
        return None;
    }
    let name = &before[open + 2..];
    let is_shell = [":-", ":=", ":+", ":?", "#", "%", "/", "^", ","].iter().any(|op| at.starts_with(op));
    if !is_shell || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    Some(format!(
        "HCL2 reads \"${{\" as the start of an interpolation, so a shell's ${{{name}...}} must be written $${{{name}...}} \
         (HCL1 job files did not need this)"
    ))
}

/// Which form only HCL1 accepts is on the line of a syntax error, if one is.
fn hcl1_form(before: &str, at: &str, message: &str) -> Option<&'static str> {
    let line = format!("{before}{at}");
    let trimmed = line.trim_start();
    // `"key" = ...` right where the error is, after a `{` on the same line.
    if let Some(rest) = at.strip_prefix('"')
        && let Some(end) = rest.find('"')
        && rest[end + 1..].trim_start().starts_with('=')
    {
        return Some("a quoted attribute name, \"key\" = ...");
    }
    // `a = 1,`: HCL1 allowed commas between attributes.
    if at.starts_with(',') && is_attribute(before) {
        return Some("a comma after an attribute, a = 1,");
    }
    // `resources { cpu = 20 memory = 100 }`, `job "x" { datacenters = ["dc1"]`: HCL1 read any
    // number of items on the line of a block's `{`; in HCL2 a block on one line holds one attribute.
    if let Some(inner) = open_body_on_line(before) {
        let next_item = at.is_empty() || at.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '"');
        let nested_block = at.starts_with('{') && is_block_header(inner);
        if (next_item && is_attribute(inner)) || nested_block {
            return Some("several attributes or blocks on the line of a block's {, a { b = 1 c = 2 }");
        }
    }
    // `"team" = "..."` in a block body: HCL2 attribute names are bare identifiers.
    if let Some(rest) = trimmed.strip_prefix('"')
        && let Some(end) = rest.find('"')
        && rest[end + 1..].trim_start().starts_with('=')
    {
        return Some("a quoted attribute name, \"key\" = ...");
    }
    // `my.key = "..."`: HCL1 names may contain dots; HCL2 identifiers may not.
    if let Some((name, _)) = trimmed.split_once('=')
        && let name = name.trim_end()
        && name.contains('.')
        && name.split('.').all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-'))
    {
        return Some("an attribute name with a dot, a.b = ...");
    }
    // `x = .5`: HCL1 read decimals without a leading zero.
    if at.strip_prefix('.').is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        && before.trim_end().ends_with(['=', '-', '[', ',', '(', ':'])
    {
        return Some("a decimal without a leading zero, .5");
    }
    // `mounts = [{ tmpfs_options { ... } }]`: HCL1 allowed block syntax inside a value.
    if message.contains("object value assignment")
        && let Some(first) = trimmed.split_whitespace().next()
        && is_identifier(first)
        && trimmed.trim_end().ends_with('{')
    {
        return Some("a block inside an assigned value; HCL2 needs name = { ... } there");
    }
    None
}

/// The text after the last `{` of `before` that is not closed on the line (outside strings).
fn open_body_on_line(before: &str) -> Option<&str> {
    let mut opens = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in before.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '{' if !in_string => opens.push(i),
            '}' if !in_string => {
                opens.pop();
            }
            _ => {}
        }
    }
    opens.last().map(|&i| &before[i + 1..])
}

/// `name = value`, complete (the value is not empty).
fn is_attribute(text: &str) -> bool {
    let Some((name, value)) = text.split_once('=') else { return false };
    is_identifier(name.trim()) && !value.trim().is_empty() && !value.starts_with('=')
}

/// `name` or `name "label" ...`: a block's type and labels.
fn is_block_header(text: &str) -> bool {
    let mut words = text.split_whitespace();
    words.next().is_some_and(is_identifier) && words.all(|w| w.len() >= 2 && w.starts_with('"') && w.ends_with('"'))
}

/// An HCL2 identifier: a letter or `_`, then letters, digits, `_` and `-`.
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}
