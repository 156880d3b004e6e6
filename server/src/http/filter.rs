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
//!
//! Every route takes `?filter=`, so the text is untrusted: it is refused above
//! [`MAX_FILTER_BYTES`] before it is lexed, and the recursive parser stops at
//! [`MAX_FILTER_DEPTH`] levels of `(` and `not`. Chains of `and`/`or` are kept
//! flat ([`Filter::All`], [`Filter::Any`]), so evaluating or dropping a filter
//! recurses no deeper than the parser did.

use regex::{Regex, RegexBuilder};
use serde_json::Value;

/// Longest filter expression accepted, in bytes. go-bexpr has no default
/// limit; real filters are a few clauses (under 200 bytes), and 4 KiB leaves
/// room for long generated ones while keeping parse work per request small.
pub const MAX_FILTER_BYTES: usize = 4 * 1024;

/// Deepest nesting of parentheses and `not` accepted. Each level is one frame
/// of the recursive parser (and of evaluation); 32 is far beyond what a person
/// writes and a few KiB of stack.
pub const MAX_FILTER_DEPTH: usize = 32;

/// Largest compiled `matches` regex, in bytes (the regex crate's default is 10 MiB);
/// one request should not be able to make the server build a large automaton.
const MAX_REGEX_BYTES: usize = 1024 * 1024;

/// A parsed filter.
#[derive(Debug, Clone)]
pub enum Filter {
    /// Every one (an `and` chain).
    All(Vec<Filter>),
    /// Any one (an `or` chain).
    Any(Vec<Filter>),
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
    /// Levels of `(` and `not` open at `pos`.
    depth: usize,
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
        let mut any = vec![self.and()?];
        while self.peek_word("or") {
            self.pos += 1;
            any.push(self.and()?);
        }
        Ok(if any.len() == 1 { any.pop().expect("one element") } else { Filter::Any(any) })
    }

    fn and(&mut self) -> Result<Filter, FilterError> {
        let mut all = vec![self.unary()?];
        while self.peek_word("and") {
            self.pos += 1;
            all.push(self.unary()?);
        }
        Ok(if all.len() == 1 { all.pop().expect("one element") } else { Filter::All(all) })
    }

    fn unary(&mut self) -> Result<Filter, FilterError> {
        let opens_level = self.peek_word("not") || self.peek() == Some(&Tok::LParen);
        if !opens_level {
            return self.matcher();
        }
        if self.depth == MAX_FILTER_DEPTH {
            return Err(FilterError(format!("filter expression nests deeper than {MAX_FILTER_DEPTH} levels of parentheses and \"not\"")));
        }
        self.depth += 1;
        let parsed = if self.peek_word("not") {
            self.pos += 1;
            self.unary().map(|f| Filter::Not(Box::new(f)))
        } else {
            self.pos += 1;
            self.or()
                .and_then(|e| if self.next() == Some(Tok::RParen) { Ok(e) } else { Err(FilterError("missing closing parenthesis".into())) })
        };
        self.depth -= 1;
        parsed
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
    RegexBuilder::new(p).size_limit(MAX_REGEX_BYTES).build().map_err(|e| FilterError(format!("invalid regular expression {p:?}: {e}")))
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
        if src.len() > MAX_FILTER_BYTES {
            return Err(FilterError(format!("filter expression is {} bytes; the limit is {MAX_FILTER_BYTES}", src.len())));
        }
        let mut p = Parser { toks: lex(src)?, pos: 0, depth: 0 };
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
            Filter::All(all) => all.iter().all(|f| f.matches(v)),
            Filter::Any(any) => any.iter().any(|f| f.matches(v)),
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

    fn nested(depth: usize) -> String {
        format!("{}Status == running{}", "(".repeat(depth), ")".repeat(depth))
    }

    #[test]
    fn length_and_depth_are_limited_before_the_stack_is() {
        let job = json!({"Status": "running"});
        assert!(check(&nested(MAX_FILTER_DEPTH), &job), "the deepest accepted nesting evaluates");
        let e = Filter::parse(&nested(MAX_FILTER_DEPTH + 1)).unwrap_err().to_string();
        assert_eq!(e, "filter expression nests deeper than 32 levels of parentheses and \"not\"");
        let nots = format!("{}Status == running", "not ".repeat(MAX_FILTER_DEPTH + 1));
        assert!(Filter::parse(&nots).unwrap_err().to_string().contains("nests deeper"));
        let mixed = format!("{}Status == running{}", "not (".repeat(17), ")".repeat(17));
        assert!(Filter::parse(&mixed).unwrap_err().to_string().contains("nests deeper"), "not and ( count alike");
        // 100,000 levels: refused by length, before anything proportional to the depth is done.
        let e = Filter::parse(&nested(100_000)).unwrap_err().to_string();
        assert_eq!(e, "filter expression is 200017 bytes; the limit is 4096");
        assert!(Filter::parse(&"x".repeat(MAX_FILTER_BYTES + 1)).unwrap_err().to_string().contains("the limit is 4096"));
    }

    #[test]
    fn long_chains_stay_flat() {
        // 200 clauses within the length limit: one level, however long the chain.
        let chain = vec!["Status == running"; 100].join(" and ") + " or " + &vec!["ID == x"; 100].join(" or ");
        assert!(chain.len() <= MAX_FILTER_BYTES);
        match Filter::parse(&chain).unwrap() {
            Filter::Any(any) => {
                assert_eq!(any.len(), 101);
                assert!(matches!(&any[0], Filter::All(all) if all.len() == 100));
            }
            other => panic!("expected a flat or-chain, got {other:?}"),
        }
        assert!(check(&chain, &json!({"Status": "running"})));
        assert!(check(&chain, &json!({"ID": "x"})));
        assert!(!check(&chain, &json!({"Status": "dead"})));
    }

    #[test]
    fn huge_regexes_are_refused() {
        let e = Filter::parse(r#"ID matches "(((a{100}){100}){100})""#).unwrap_err().to_string();
        assert!(e.contains("invalid regular expression"), "{e}");
    }

    /// Pieces that make up filters, so generated input reaches past the lexer.
    fn fragment() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("(".to_string()),
            Just(")".to_string()),
            Just(" not ".to_string()),
            Just(" and ".to_string()),
            Just(" or ".to_string()),
            Just(" == ".to_string()),
            Just(" != ".to_string()),
            Just(" in ".to_string()),
            Just(" is empty".to_string()),
            Just(" contains ".to_string()),
            Just(" matches ".to_string()),
            Just("Meta[\"a\"]".to_string()),
            Just(".".to_string()),
            "[A-Za-z_]{1,6}",
            "\"[^\"]{0,4}\"?",
            "`[^`]{0,4}`?",
            any::<char>().prop_map(String::from),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

        #[test]
        fn arbitrary_text_never_panics(src in "\\PC{0,300}") {
            let _ = Filter::parse(&src).map(|f| f.matches(&json!({"a": [1], "Meta": {"a": ""}})));
        }

        #[test]
        fn arbitrary_token_soup_never_panics(parts in proptest::collection::vec(fragment(), 0..200)) {
            let src = parts.concat();
            let _ = Filter::parse(&src).map(|f| f.matches(&json!({"a": [1], "Meta": {"a": ""}})));
        }

        #[test]
        fn nesting_is_accepted_exactly_up_to_the_limit(depth in 0usize..2_000, nots in proptest::bool::ANY) {
            let src = if nots { format!("{}a == b", "not ".repeat(depth)) } else { nested(depth) };
            let parsed = Filter::parse(&src);
            if src.len() > MAX_FILTER_BYTES {
                proptest::prop_assert!(parsed.unwrap_err().0.contains("the limit is 4096"));
            } else if depth > MAX_FILTER_DEPTH {
                proptest::prop_assert!(parsed.unwrap_err().0.contains("nests deeper"));
            } else {
                proptest::prop_assert!(parsed.is_ok());
            }
        }
    }
}
