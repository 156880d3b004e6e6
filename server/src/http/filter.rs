//! `?filter=` expressions on list endpoints, in go-bexpr's language.
//!
//! ```text
//! expr      := or
//! or        := and ("or" and)*
//! and       := unary ("and" unary)*
//! unary     := "not" unary | "(" expr ")" | match
//! match     := selector ("==" | "!=") value
//!            | selector "is" ["not"] "empty"
//!            | value ["not"] "in" selector
//!            | selector ["not"] "contains" value
//!            | selector ["not"] "matches" value
//! selector  := ident ("." ident | "[" string "]")*
//! value     := "string" | `raw string` | number | true | false | bare-word
//! ```
//!
//! Selectors use Go field names and walk the JSON of each list element
//! (`Status`, `Meta.rack`, `Meta["rack"]`, `TaskGroups` for a list). Values
//! compare as strings, the way bexpr compares after conversion.

use regex::Regex;
use serde_json::Value;

/// A parsed filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Both.
    And(Box<Filter>, Box<Filter>),
    /// Either.
    Or(Box<Filter>, Box<Filter>),
    /// Negation.
    Not(Box<Filter>),
    /// `selector == value` (or `!=` via `Not`).
    Equal(Vec<String>, String),
    /// `selector is empty`.
    Empty(Vec<String>),
    /// `value in selector` / `selector contains value`.
    Contains(Vec<String>, String),
    /// `selector matches "regex"`.
    Matches(Vec<String>, Regex),
}

/// A filter that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FilterError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Str(String),
    Op(&'static str),
    LParen,
    RParen,
    LBracket,
    RBracket,
    Dot,
}

fn lex(src: &str) -> Result<Vec<Tok>, FilterError> {
    let mut out = Vec::new();
    let chars: Vec<char> = src.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '(' => {
                out.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                out.push(Tok::RParen);
                i += 1;
            }
            '[' => {
                out.push(Tok::LBracket);
                i += 1;
            }
            ']' => {
                out.push(Tok::RBracket);
                i += 1;
            }
            '.' => {
                out.push(Tok::Dot);
                i += 1;
            }
            '=' | '!' => {
                if chars.get(i + 1) != Some(&'=') {
                    return Err(FilterError(format!("unexpected {c:?} at position {i}: expected == or !=")));
                }
                out.push(Tok::Op(if c == '=' { "==" } else { "!=" }));
                i += 2;
            }
            '"' | '`' => {
                let quote = c;
                let mut s = String::new();
                i += 1;
                loop {
                    let Some(&ch) = chars.get(i) else {
                        return Err(FilterError("unterminated string".into()));
                    };
                    i += 1;
                    if ch == quote {
                        break;
                    }
                    if ch == '\\' && quote == '"' {
                        let Some(&esc) = chars.get(i) else { return Err(FilterError("unterminated string".into())) };
                        i += 1;
                        s.push(match esc {
                            'n' => '\n',
                            't' => '\t',
                            other => other,
                        });
                    } else {
                        s.push(ch);
                    }
                }
                out.push(Tok::Str(s));
            }
            c if c.is_alphanumeric() || c == '_' || c == '-' || c == '/' || c == ':' || c == '*' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || "_-/:*".contains(chars[i])) {
                    i += 1;
                }
                out.push(Tok::Word(chars[start..i].iter().collect()));
            }
            other => return Err(FilterError(format!("unexpected {other:?} at position {i}"))),
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_word(&self, w: &str) -> bool {
        matches!(self.peek(), Some(Tok::Word(x)) if x == w)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn or(&mut self) -> Result<Filter, FilterError> {
        let mut left = self.and()?;
        while self.peek_word("or") {
            self.pos += 1;
            left = Filter::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Filter, FilterError> {
        let mut left = self.unary()?;
        while self.peek_word("and") {
            self.pos += 1;
            left = Filter::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Filter, FilterError> {
        if self.peek_word("not") {
            self.pos += 1;
            return Ok(Filter::Not(Box::new(self.unary()?)));
        }
        if self.peek() == Some(&Tok::LParen) {
            self.pos += 1;
            let e = self.or()?;
            if self.next() != Some(Tok::RParen) {
                return Err(FilterError("missing closing parenthesis".into()));
            }
            return Ok(e);
        }
        self.matcher()
    }

    fn value(&mut self) -> Result<String, FilterError> {
        match self.next() {
            Some(Tok::Str(s)) | Some(Tok::Word(s)) => Ok(s),
            other => Err(FilterError(format!("expected a value, found {}", describe(other.as_ref())))),
        }
    }

    fn selector(&mut self) -> Result<Vec<String>, FilterError> {
        let mut path = match self.next() {
            Some(Tok::Word(w)) if !w.is_empty() => vec![w],
            other => return Err(FilterError(format!("expected a selector, found {}", describe(other.as_ref())))),
        };
        loop {
            match self.peek() {
                Some(Tok::Dot) => {
                    self.pos += 1;
                    match self.next() {
                        Some(Tok::Word(w)) => path.push(w),
                        other => return Err(FilterError(format!("expected a field after '.', found {}", describe(other.as_ref())))),
                    }
                }
                Some(Tok::LBracket) => {
                    self.pos += 1;
                    let key = self.value()?;
                    if self.next() != Some(Tok::RBracket) {
                        return Err(FilterError("missing ']' in selector".into()));
                    }
                    path.push(key);
                }
                _ => return Ok(path),
            }
        }
    }

    fn matcher(&mut self) -> Result<Filter, FilterError> {
        // `value in selector` starts with a value that is followed by `in`/`not in`.
        let save = self.pos;
        if let Ok(v) = self.value() {
            let negated = self.peek_word("not") && matches!(self.toks.get(self.pos + 1), Some(Tok::Word(w)) if w == "in");
            if negated {
                self.pos += 1;
            }
            if self.peek_word("in") {
                self.pos += 1;
                let sel = self.selector()?;
                let f = Filter::Contains(sel, v);
                return Ok(if negated { Filter::Not(Box::new(f)) } else { f });
            }
        }
        self.pos = save;
        let sel = self.selector()?;
        match self.next() {
            Some(Tok::Op("==")) => Ok(Filter::Equal(sel, self.value()?)),
            Some(Tok::Op("!=")) => Ok(Filter::Not(Box::new(Filter::Equal(sel, self.value()?)))),
            Some(Tok::Word(w)) if w == "is" => {
                let negated = self.peek_word("not");
                if negated {
                    self.pos += 1;
                }
                match self.next() {
                    Some(Tok::Word(e)) if e == "empty" => {}
                    other => return Err(FilterError(format!("expected 'empty' after 'is', found {}", describe(other.as_ref())))),
                }
                let f = Filter::Empty(sel);
                Ok(if negated { Filter::Not(Box::new(f)) } else { f })
            }
            Some(Tok::Word(w)) if w == "contains" => Ok(Filter::Contains(sel, self.value()?)),
            Some(Tok::Word(w)) if w == "matches" => Ok(Filter::Matches(sel, regex(&self.value()?)?)),
            Some(Tok::Word(w)) if w == "not" => match self.next() {
                Some(Tok::Word(op)) if op == "contains" => Ok(Filter::Not(Box::new(Filter::Contains(sel, self.value()?)))),
                Some(Tok::Word(op)) if op == "matches" => Ok(Filter::Not(Box::new(Filter::Matches(sel, regex(&self.value()?)?)))),
                other => Err(FilterError(format!("expected 'contains' or 'matches' after 'not', found {}", describe(other.as_ref())))),
            },
            other => {
                Err(FilterError(format!("expected an operator after selector {:?}, found {}", sel.join("."), describe(other.as_ref()))))
            }
        }
    }
}

fn regex(p: &str) -> Result<Regex, FilterError> {
    Regex::new(p).map_err(|e| FilterError(format!("invalid regular expression {p:?}: {e}")))
}

fn describe(t: Option<&Tok>) -> String {
    match t {
        None => "the end of the expression".into(),
        Some(Tok::Word(w)) => format!("{w:?}"),
        Some(Tok::Str(s)) => format!("\"{s}\""),
        Some(Tok::Op(o)) => (*o).to_string(),
        Some(Tok::LParen) => "'('".into(),
        Some(Tok::RParen) => "')'".into(),
        Some(Tok::LBracket) => "'['".into(),
        Some(Tok::RBracket) => "']'".into(),
        Some(Tok::Dot) => "'.'".into(),
    }
}

impl Filter {
    /// Parses an expression.
    pub fn parse(src: &str) -> Result<Filter, FilterError> {
        let mut p = Parser { toks: lex(src)?, pos: 0 };
        if p.toks.is_empty() {
            return Err(FilterError("empty filter expression".into()));
        }
        let f = p.or()?;
        if p.pos < p.toks.len() {
            return Err(FilterError(format!("unexpected {} after a complete expression", describe(p.peek()))));
        }
        Ok(f)
    }

    /// Whether a JSON value passes.
    pub fn matches(&self, v: &Value) -> bool {
        match self {
            Filter::And(a, b) => a.matches(v) && b.matches(v),
            Filter::Or(a, b) => a.matches(v) || b.matches(v),
            Filter::Not(f) => !f.matches(v),
            Filter::Equal(sel, want) => lookup(v, sel).is_some_and(|x| scalar(x).is_some_and(|s| s == *want)),
            Filter::Empty(sel) => match lookup(v, sel) {
                None | Some(Value::Null) => true,
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(o)) => o.is_empty(),
                Some(Value::String(s)) => s.is_empty(),
                Some(_) => false,
            },
            Filter::Contains(sel, want) => match lookup(v, sel) {
                Some(Value::Array(a)) => a.iter().any(|x| scalar(x).is_some_and(|s| s == *want)),
                Some(Value::Object(o)) => o.contains_key(want),
                Some(Value::String(s)) => s.contains(want.as_str()),
                _ => false,
            },
            Filter::Matches(sel, re) => lookup(v, sel).and_then(scalar).is_some_and(|s| re.is_match(&s)),
        }
    }
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| match cur {
        Value::Object(m) => m.get(key),
        Value::Array(a) => key.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(expr: &str, v: &Value) -> bool {
        Filter::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}")).matches(v)
    }

    #[test]
    fn the_common_shapes_evaluate_like_bexpr() {
        let job = json!({"ID": "web", "Status": "running", "Priority": 50, "Stop": false,
            "Datacenters": ["dc1", "dc2"], "Meta": {"team": "core", "tier": ""}, "ParentID": ""});
        assert!(check(r#"Status == "running""#, &job));
        assert!(check("Status == running", &job));
        assert!(!check(r#"Status != "running""#, &job));
        assert!(check("Priority == 50 and Stop == false", &job));
        assert!(check(r#""dc2" in Datacenters"#, &job));
        assert!(check(r#""dc3" not in Datacenters"#, &job));
        assert!(check(r#"Datacenters contains "dc1""#, &job));
        assert!(check(r#"Meta.team == "core""#, &job));
        assert!(check(r#"Meta["team"] == core"#, &job));
        assert!(check("Meta.tier is empty and ParentID is empty", &job));
        assert!(check("Meta is not empty", &job));
        assert!(check(r#"ID matches "^w.b$""#, &job));
        assert!(check(r#"not (Status == "dead" or ID == "db")"#, &job));
        assert!(check(r#"Missing is empty"#, &job));
        assert!(!check(r#"Missing == "x""#, &job));
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        for (bad, needle) in [
            ("", "empty"),
            ("Status =", "expected == or !="),
            ("Status == ", "expected a value"),
            (r#"Status == "open"#, "unterminated"),
            ("(Status == a", "parenthesis"),
            ("Status is full", "expected 'empty'"),
            (r#"ID matches "(""#, "invalid regular expression"),
            ("Status == a b", "after a complete expression"),
            ("== a", "expected a selector"),
        ] {
            let e = Filter::parse(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }
}
