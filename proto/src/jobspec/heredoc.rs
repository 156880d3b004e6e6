//! `<<-` heredocs dedented the way HCL2 does it, byte for byte.
//!
//! hcl-edit strips the indentation of a `<<-` heredoc itself, but differs from HCL2 in ways that
//! change the text a template hands to its task: it drops the `\r` of CRLF lines, lets a line
//! of only spaces lower the indentation every other line loses, and leaves the lines inside
//! `%{ if }` and `%{ for }` bodies alone. HCL2's rule, applied here to the literal text as
//! written (read back from the source through the literals' spans): of the lines that start
//! with literal text, ignoring lines made only of whitespace, find the fewest leading whitespace
//! characters (a line that starts with `${` or `%{` has none), and strip that many from each
//! of those lines; lines made only of whitespace keep it.

use hcl::edit::Span;
use hcl::edit::template::{Directive, Element, Template};

/// The heredoc `template` with HCL2's indentation rule applied, or `None` when a literal's
/// text cannot be read back from `source` (then hcl-edit's own dedent stands).
pub(crate) fn flush(template: &Template, source: &str) -> Option<Template> {
    let mut tokens = Vec::new();
    tokens_of(template, &mut tokens);
    let mut raw = Vec::new();
    for span in tokens.iter().flatten() {
        raw.push(source.get(span.clone())?);
    }

    // Pass 1: the indentation every line that starts with literal text has in common.
    let mut min_spaces = usize::MAX;
    let mut at_line_start = true;
    let mut literals = raw.iter();
    for token in &tokens {
        match token {
            None => {
                if at_line_start {
                    min_spaces = 0;
                }
                at_line_start = false;
            }
            Some(_) => {
                for line in literals.next()?.split_inclusive('\n') {
                    if at_line_start && !is_blank(line) {
                        min_spaces = min_spaces.min(line.chars().take_while(|c| c.is_whitespace()).count());
                    }
                    at_line_start = line.ends_with('\n');
                }
            }
        }
    }

    // Pass 2: each literal's new text.
    let mut values = Vec::with_capacity(raw.len());
    let mut at_line_start = true;
    let mut literals = raw.iter();
    for token in &tokens {
        match token {
            None => at_line_start = false,
            Some(_) => {
                let mut text = String::new();
                for line in literals.next()?.split_inclusive('\n') {
                    let line = if at_line_start && !is_blank(line) { skip_chars(line, min_spaces) } else { line };
                    unescape_into(line, &mut text);
                    at_line_start = line.ends_with('\n');
                }
                values.push(text);
            }
        }
    }

    let mut flushed = template.clone();
    let mut values = values.into_iter();
    set_literals(&mut flushed, &mut values);
    Some(flushed)
}

/// A line HCL2 leaves out of the count: only whitespace, up to its newline.
fn is_blank(line: &str) -> bool {
    line.ends_with('\n') && line.chars().all(char::is_whitespace)
}

fn skip_chars(line: &str, n: usize) -> &str {
    line.char_indices().nth(n).map_or("", |(i, _)| &line[i..])
}

/// Heredoc literal text as written to its value: `$${` is `${` and `%%{` is `%{` (heredocs
/// have no other escapes).
fn unescape_into(raw: &str, out: &mut String) {
    let mut rest = raw;
    while let Some(i) = rest.find(['$', '%']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("$${") || tail.starts_with("%%{") {
            out.push_str(&tail[1..3]);
            rest = &tail[3..];
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
}

/// The template's pieces in source order: the span of each literal, `None` for each
/// interpolation and directive marker (`%{ if }`, `%{ else }`, `%{ endif }`, `%{ for }`,
/// `%{ endfor }`), descending into directive bodies as HCL2's flat token list does.
fn tokens_of(template: &Template, out: &mut Vec<Option<std::ops::Range<usize>>>) {
    for element in template.iter() {
        match element {
            // A literal without a span makes `flush` give up (it cannot be read back).
            Element::Literal(literal) => out.push(Some(literal.span().unwrap_or(usize::MAX..usize::MAX))),
            Element::Interpolation(_) => out.push(None),
            Element::Directive(directive) => match directive.as_ref() {
                Directive::If(d) => {
                    out.push(None);
                    tokens_of(&d.if_expr.template, out);
                    if let Some(e) = &d.else_expr {
                        out.push(None);
                        tokens_of(&e.template, out);
                    }
                    out.push(None);
                }
                Directive::For(d) => {
                    out.push(None);
                    tokens_of(&d.for_expr.template, out);
                    out.push(None);
                }
            },
        }
    }
}

/// Gives the literals of `template`, in the order of [`tokens_of`], the values in turn.
fn set_literals(template: &mut Template, values: &mut impl Iterator<Item = String>) {
    for element in template.iter_mut() {
        match element {
            Element::Literal(literal) => {
                if let Some(value) = values.next() {
                    *literal.as_mut() = value;
                }
            }
            Element::Interpolation(_) => {}
            Element::Directive(directive) => match directive.as_mut() {
                Directive::If(d) => {
                    set_literals(&mut d.if_expr.template, values);
                    if let Some(e) = &mut d.else_expr {
                        set_literals(&mut e.template, values);
                    }
                }
                Directive::For(d) => set_literals(&mut d.for_expr.template, values),
            },
        }
    }
}
