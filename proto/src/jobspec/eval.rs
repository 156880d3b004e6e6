//! Evaluation of HCL expressions and templates as Nomad's jobspec2 does it.
//!
//! Nomad evaluates `var.*`, `local.*` and functions when it parses a job, but
//! leaves runtime interpolations (`${NOMAD_ALLOC_ID}`, `${attr.kernel.name}`,
//! `${meta.rack}`, ...) for the client: its HCL context turns any variable
//! it does not know into the literal text `${<source>}`. hcl-rs's evaluator
//! has no such hook (it fails on the first unknown variable), so this module
//! evaluates hcl-edit's syntax tree itself. Working on that tree also gives
//! byte spans, so errors point at the exact expression.
//!
//! Evaluation is bounded: every step and every value produced is charged
//! against a budget, so a hostile file (nested `for` over `range`, locals
//! that double a string) fails with an error instead of exhausting memory.

use std::cell::Cell;
use std::rc::Rc;

use hcl::edit::expr::{BinaryOperator, Expression, ObjectKey, TraversalOperator, UnaryOperator};
use hcl::edit::template::{Directive, Element, Template};
use hcl::edit::{Decorated, Span};
use hcl::{Map, Number, Value};

use super::error::{DResult, Diag, ErrorKind};
use super::functions;

/// Work units one parse may spend evaluating (steps plus sizes of values copied).
const EVALUATION_BUDGET: u64 = 5_000_000;
/// Longest string an expression may build.
pub(crate) const MAX_STRING_BYTES: usize = 8 << 20;

/// Names in scope: `var`, `local`, and the iteration variables of `for`
/// expressions, template `for` directives and `dynamic` blocks.
#[derive(Clone, Default)]
pub(crate) struct Scope(Option<Rc<Binding>>);

struct Binding {
    name: String,
    value: Value,
    parent: Scope,
}

impl Scope {
    /// A scope with `name` bound to `value` on top of this one.
    pub fn bind(&self, name: impl Into<String>, value: Value) -> Scope {
        Scope(Some(Rc::new(Binding { name: name.into(), value, parent: self.clone() })))
    }

    /// The innermost value bound to `name`.
    pub fn lookup(&self, name: &str) -> Option<&Value> {
        let mut cur = self.0.as_deref();
        while let Some(b) = cur {
            if b.name == name {
                return Some(&b.value);
            }
            cur = b.parent.0.as_deref();
        }
        None
    }
}

/// Evaluates expressions of one source text.
pub(crate) struct Evaluator<'s> {
    /// The text the expressions were parsed from; runtime interpolations are copied from it.
    source: &'s str,
    /// Job files keep unknown variables as `${...}` for the client; variable
    /// files and `-var` values have no runtime, so there they are errors.
    keep_unknown_as_literal: bool,
    budget: Rc<Cell<u64>>,
    /// What the filesystem functions may read (nothing unless the caller allows it).
    files: Rc<functions::FileAccess>,
}

impl<'s> Evaluator<'s> {
    /// An evaluator for a job file: unknown variables stay as runtime interpolations.
    pub fn for_job_file(source: &'s str) -> Evaluator<'s> {
        Evaluator { source, keep_unknown_as_literal: true, budget: Rc::new(Cell::new(EVALUATION_BUDGET)), files: Rc::default() }
    }

    /// This evaluator with the filesystem functions allowed as `files` says.
    pub fn with_file_access(mut self, files: functions::FileAccess) -> Evaluator<'s> {
        self.files = Rc::new(files);
        self
    }

    /// An evaluator for constant values (variable files, `-var`, defaults): no variables at all.
    pub fn for_constants(source: &'s str) -> Evaluator<'s> {
        Evaluator { source, keep_unknown_as_literal: false, budget: Rc::new(Cell::new(EVALUATION_BUDGET)), files: Rc::default() }
    }

    /// The text the expressions come from.
    pub fn source(&self) -> &'s str {
        self.source
    }

    /// Spends `units` of the budget, failing once it is used up.
    pub fn charge(&self, units: u64, offset: Option<usize>) -> DResult<()> {
        let left = self.budget.get();
        if units > left {
            self.budget.set(0);
            return Err(Diag::new(
                ErrorKind::Expression,
                offset,
                "expression is too expensive to evaluate (too many steps or too large values)",
            ));
        }
        self.budget.set(left - units);
        Ok(())
    }

    /// Evaluates an expression to a value.
    pub fn eval(&self, expr: &Expression, scope: &Scope) -> DResult<Value> {
        let at = start_of(expr);
        self.charge(1, at)?;
        match expr {
            Expression::Null(_) => Ok(Value::Null),
            Expression::Bool(b) => Ok(Value::Bool(*b.value())),
            Expression::Number(n) => Ok(Value::Number(**n)),
            Expression::String(s) => Ok(Value::String(s.value().clone())),
            Expression::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items.iter() {
                    out.push(self.eval(item, scope)?);
                }
                Ok(Value::Array(out))
            }
            Expression::Object(object) => {
                let mut out = Map::new();
                for (key, value) in object.iter() {
                    let key = match key {
                        ObjectKey::Ident(ident) => ident.as_str().to_string(),
                        ObjectKey::Expression(e) => self.object_key(e, scope)?,
                    };
                    out.insert(key, self.eval(value.expr(), scope)?);
                }
                Ok(Value::Object(out))
            }
            Expression::StringTemplate(t) => self.eval_template(t, scope, at),
            Expression::HeredocTemplate(h) => {
                // `<<-`: HCL2's dedent rule, not hcl-edit's (see heredoc.rs).
                let flushed = match at.and_then(|start| self.source.get(start..)) {
                    Some(text) if text.starts_with("<<-") => super::heredoc::flush(&h.template, self.source),
                    _ => None,
                };
                self.eval_template(flushed.as_ref().unwrap_or(&h.template), scope, at)
            }
            Expression::Parenthesis(p) => self.eval(p.inner(), scope),
            Expression::Variable(name) => match scope.lookup(name.as_str()) {
                Some(v) => self.copy_of(v, at),
                None => self.unknown_variable(expr, name.as_str()),
            },
            Expression::Conditional(c) => {
                let cond = self.eval(&c.cond_expr, scope)?;
                let cond = as_bool(&cond).ok_or_else(|| {
                    Diag::new(ErrorKind::Expression, start_of(&c.cond_expr), format!("condition must be a bool, got {}", describe(&cond)))
                })?;
                self.eval(if cond { &c.true_expr } else { &c.false_expr }, scope)
            }
            Expression::FuncCall(call) => {
                let name = call.name.name.as_str();
                if call.name.is_namespaced() {
                    return Err(Diag::new(ErrorKind::Expression, at, format!("namespaced function {name}() is not supported")));
                }
                if matches!(name, "can" | "try" | "convert") {
                    return self.eval_special_call(name, call, scope, at);
                }
                let mut args = Vec::with_capacity(call.args.len());
                for arg in call.args.iter() {
                    args.push(self.eval(arg, scope)?);
                }
                if call.args.expand_final() {
                    match args.pop() {
                        Some(Value::Array(rest)) => args.extend(rest),
                        _ => {
                            return Err(Diag::new(
                                ErrorKind::Expression,
                                at,
                                format!("the last argument of {name}(...) must be a list to expand"),
                            ));
                        }
                    }
                }
                self.charge(functions::work_of(name, &args), at)?;
                let result =
                    functions::call(name, args, &self.files).map_err(|m| Diag::new(ErrorKind::Expression, at, format!("{name}(): {m}")))?;
                self.charge(size_of(&result), at)?;
                Ok(result)
            }
            Expression::Traversal(t) => {
                if let Expression::Variable(root) = &t.expr
                    && scope.lookup(root.as_str()).is_none()
                {
                    return self.unknown_variable(expr, root.as_str());
                }
                let root_name = match &t.expr {
                    Expression::Variable(root) => root.as_str().to_string(),
                    _ => String::new(),
                };
                let value = self.eval(&t.expr, scope)?;
                self.traverse(value, &t.operators, scope, root_name)
            }
            Expression::UnaryOp(op) => {
                let value = self.eval(&op.expr, scope)?;
                unary(*op.operator.value(), &value).map_err(|m| Diag::new(ErrorKind::Expression, at, m))
            }
            Expression::BinaryOp(op) => {
                let lhs = self.eval(&op.lhs_expr, scope)?;
                let rhs = self.eval(&op.rhs_expr, scope)?;
                binary(*op.operator.value(), &lhs, &rhs).map_err(|m| Diag::new(ErrorKind::Expression, at, m))
            }
            Expression::ForExpr(f) => {
                let collection = self.eval(&f.intro.collection_expr, scope)?;
                let pairs =
                    iteration_pairs(collection).map_err(|m| Diag::new(ErrorKind::Expression, start_of(&f.intro.collection_expr), m))?;
                let key_var = f.intro.key_var.as_ref().map(|k| k.as_str());
                let value_var = f.intro.value_var.as_str();
                let mut list = Vec::new();
                let mut object = Map::new();
                for (key, value) in pairs {
                    let mut inner = scope.clone();
                    if let Some(k) = key_var {
                        inner = inner.bind(k, key);
                    }
                    inner = inner.bind(value_var, value);
                    if let Some(cond) = &f.cond {
                        let keep = self.eval(&cond.expr, &inner)?;
                        let keep = as_bool(&keep).ok_or_else(|| {
                            Diag::new(
                                ErrorKind::Expression,
                                start_of(&cond.expr),
                                format!("for condition must be a bool, got {}", describe(&keep)),
                            )
                        })?;
                        if !keep {
                            continue;
                        }
                    }
                    let item = self.eval(&f.value_expr, &inner)?;
                    match &f.key_expr {
                        None => list.push(item),
                        Some(key_expr) => {
                            let key = self.eval(key_expr, &inner)?;
                            let key = as_string(&key).ok_or_else(|| {
                                Diag::new(
                                    ErrorKind::Expression,
                                    start_of(key_expr),
                                    format!("for key must be a string, got {}", describe(&key)),
                                )
                            })?;
                            if f.grouping {
                                if let Value::Array(group) = object.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
                                    group.push(item);
                                }
                            } else if object.contains_key(&key) {
                                return Err(Diag::new(
                                    ErrorKind::Expression,
                                    start_of(key_expr),
                                    format!("duplicate key \"{key}\" in for expression; use ... after the value to group values by key"),
                                ));
                            } else {
                                object.insert(key, item);
                            }
                        }
                    }
                }
                Ok(if f.key_expr.is_some() { Value::Object(object) } else { Value::Array(list) })
            }
        }
    }

    /// `can`, `try` and `convert`, which take expressions: `can` and `try` catch the errors of
    /// evaluating them (but not running out of budget, which stays fatal), and `convert` reads
    /// its second argument as a type.
    fn eval_special_call(&self, name: &str, call: &hcl::edit::expr::FuncCall, scope: &Scope, at: Option<usize>) -> DResult<Value> {
        let fail = |m: String| Diag::new(ErrorKind::Expression, at, format!("{name}(): {m}"));
        if call.args.expand_final() {
            return Err(fail("its arguments cannot be expanded with ...".to_string()));
        }
        let args: Vec<&Expression> = call.args.iter().collect();
        match name {
            "can" => {
                if args.len() != 1 {
                    return Err(fail(format!("expected 1 argument, got {}", args.len())));
                }
                match self.eval(args[0], scope) {
                    Ok(_) => Ok(Value::Bool(true)),
                    Err(e) if self.budget.get() == 0 => Err(e),
                    Err(_) => Ok(Value::Bool(false)),
                }
            }
            "try" => {
                if args.is_empty() {
                    return Err(fail("at least one argument is required".to_string()));
                }
                let mut problems = Vec::new();
                for arg in args {
                    match self.eval(arg, scope) {
                        Ok(v) => return Ok(v),
                        Err(e) if self.budget.get() == 0 => return Err(e),
                        Err(e) => problems.push(e.message),
                    }
                }
                Err(fail(format!(
                    "no expression succeeded:\n{}\nAt least one expression must produce a successful result",
                    problems.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n")
                )))
            }
            _ => {
                if args.len() != 2 {
                    return Err(fail(format!("expected 2 arguments (a value and a type), got {}", args.len())));
                }
                let value = self.eval(args[0], scope)?;
                let result = functions::convert(value, args[1]).map_err(fail)?;
                self.charge(size_of(&result), at)?;
                Ok(result)
            }
        }
    }

    /// A copy of a bound value, charged by its size (copies are where sizes multiply).
    fn copy_of(&self, value: &Value, at: Option<usize>) -> DResult<Value> {
        self.charge(size_of(value), at)?;
        Ok(value.clone())
    }

    fn object_key(&self, expr: &Expression, scope: &Scope) -> DResult<String> {
        let key = self.eval(expr, scope)?;
        as_string(&key)
            .ok_or_else(|| Diag::new(ErrorKind::Expression, start_of(expr), format!("object key must be a string, got {}", describe(&key))))
    }

    /// A variable that nothing binds: a runtime interpolation in a job file, an error elsewhere.
    fn unknown_variable(&self, expr: &Expression, root: &str) -> DResult<Value> {
        if !self.keep_unknown_as_literal {
            return Err(Diag::new(ErrorKind::Expression, start_of(expr), format!("variables are not allowed here (found \"{root}\")")));
        }
        let Some(span) = expr.span() else { return Ok(Value::String(format!("${{{root}}}"))) };
        let text = self.source.get(span.clone()).unwrap_or(root);
        // Nomad copies the whole `${ ... }` around the reference when only spaces separate them,
        // so `${ NOMAD_ALLOC_DIR }` reaches the client as written, spaces included.
        let before = self.source.get(..span.start).unwrap_or_default();
        let after = self.source.get(span.end..).unwrap_or_default();
        let open = before.trim_end_matches(' ');
        let close = after.trim_start_matches(' ');
        if open.ends_with("${") && close.starts_with('}') {
            let lead = &before[open.len()..];
            let trail = &after[..after.len() - close.len()];
            return Ok(Value::String(format!("${{{lead}{text}{trail}}}")));
        }
        Ok(Value::String(format!("${{{text}}}")))
    }

    fn traverse(&self, mut value: Value, ops: &[Decorated<TraversalOperator>], scope: &Scope, mut path: String) -> DResult<Value> {
        for (i, op) in ops.iter().enumerate() {
            let at = op.span().map(|s| s.start);
            match op.value() {
                TraversalOperator::GetAttr(name) => {
                    value = get_attr(value, name.as_str(), &path).map_err(|m| Diag::new(ErrorKind::Expression, at, m))?;
                    path = format!("{path}.{}", name.as_str());
                }
                TraversalOperator::Index(index) => {
                    let key = self.eval(index, scope)?;
                    value = get_index(value, &key).map_err(|m| Diag::new(ErrorKind::Expression, at, m))?;
                    path.push_str("[...]");
                }
                TraversalOperator::LegacyIndex(n) => {
                    value = get_index(value, &Value::from(*n.value())).map_err(|m| Diag::new(ErrorKind::Expression, at, m))?;
                    path = format!("{path}.{}", n.value());
                }
                TraversalOperator::AttrSplat(_) | TraversalOperator::FullSplat(_) => {
                    let items = match value {
                        Value::Array(items) => items,
                        Value::Null => Vec::new(),
                        other => vec![other],
                    };
                    let rest = &ops[i + 1..];
                    let mut out = Vec::with_capacity(items.len());
                    for item in items {
                        out.push(self.traverse(item, rest, scope, format!("{path}[*]"))?);
                    }
                    return Ok(Value::Array(out));
                }
            }
        }
        Ok(value)
    }

    /// A template's value: a lone interpolation keeps its type (`"${var.list}"`
    /// is a list), anything else renders to a string.
    fn eval_template(&self, template: &Template, scope: &Scope, at: Option<usize>) -> DResult<Value> {
        if let Some(Element::Interpolation(only)) = template.as_single_element() {
            return self.eval(&only.expr, scope);
        }
        let mut out = String::new();
        self.render(template, scope, &mut out, false, false)?;
        self.charge(out.len() as u64 / 64, at)?;
        Ok(Value::String(out))
    }

    /// Renders template elements; `trim_first`/`trim_last` say whether the
    /// enclosing directive strips whitespace at the edges (`~}` / `{~`).
    fn render(&self, template: &Template, scope: &Scope, out: &mut String, trim_first: bool, trim_last: bool) -> DResult<()> {
        let elements: Vec<&Element> = template.iter().collect();
        for (i, element) in elements.iter().enumerate() {
            match element {
                Element::Literal(text) => {
                    let mut text = text.value().as_str();
                    let trim_start = if i == 0 { trim_first } else { strips_after(elements[i - 1]) };
                    let trim_end = if i + 1 == elements.len() { trim_last } else { strips_before(elements[i + 1]) };
                    if trim_start {
                        text = text.trim_start();
                    }
                    if trim_end {
                        text = text.trim_end();
                    }
                    out.push_str(text);
                }
                Element::Interpolation(interp) => {
                    let value = self.eval(&interp.expr, scope)?;
                    // Null and collections cannot be inserted into a string.
                    let text = as_string(&value).ok_or_else(|| {
                        Diag::new(
                            ErrorKind::Expression,
                            start_of(&interp.expr),
                            format!("cannot include {} in a string template", describe(&value)),
                        )
                    })?;
                    out.push_str(&text);
                }
                Element::Directive(directive) => match directive.as_ref() {
                    Directive::If(d) => {
                        let cond = self.eval(&d.if_expr.cond_expr, scope)?;
                        let cond = as_bool(&cond).ok_or_else(|| {
                            Diag::new(
                                ErrorKind::Expression,
                                start_of(&d.if_expr.cond_expr),
                                format!("if condition must be a bool, got {}", describe(&cond)),
                            )
                        })?;
                        if cond {
                            let before_end = d.else_expr.as_ref().map_or(d.endif_expr.strip, |e| e.strip).strip_start();
                            self.render(&d.if_expr.template, scope, out, d.if_expr.strip.strip_end(), before_end)?;
                        } else if let Some(e) = &d.else_expr {
                            self.render(&e.template, scope, out, e.strip.strip_end(), d.endif_expr.strip.strip_start())?;
                        }
                    }
                    Directive::For(d) => {
                        let f = &d.for_expr;
                        let collection = self.eval(&f.collection_expr, scope)?;
                        let pairs =
                            iteration_pairs(collection).map_err(|m| Diag::new(ErrorKind::Expression, start_of(&f.collection_expr), m))?;
                        for (key, value) in pairs {
                            self.charge(1, start_of(&f.collection_expr))?;
                            let mut inner = scope.clone();
                            if let Some(k) = &f.key_var {
                                inner = inner.bind(k.as_str(), key);
                            }
                            inner = inner.bind(f.value_var.as_str(), value);
                            self.render(&f.template, &inner, out, f.strip.strip_end(), d.endfor_expr.strip.strip_start())?;
                        }
                    }
                },
            }
            if out.len() > MAX_STRING_BYTES {
                return Err(Diag::new(
                    ErrorKind::Expression,
                    template.span().map(|s| s.start),
                    "template renders to a string that is too long",
                ));
            }
        }
        Ok(())
    }
}

/// Start offset of an expression, when the parser recorded one.
pub(crate) fn start_of(expr: &Expression) -> Option<usize> {
    expr.span().map(|s| s.start)
}

/// Whether an element strips the whitespace after it (`~}`).
fn strips_after(element: &Element) -> bool {
    match element {
        Element::Literal(_) => false,
        Element::Interpolation(i) => i.strip.strip_end(),
        Element::Directive(d) => match d.as_ref() {
            Directive::If(d) => d.endif_expr.strip.strip_end(),
            Directive::For(d) => d.endfor_expr.strip.strip_end(),
        },
    }
}

/// Whether an element strips the whitespace before it (`{~`).
fn strips_before(element: &Element) -> bool {
    match element {
        Element::Literal(_) => false,
        Element::Interpolation(i) => i.strip.strip_start(),
        Element::Directive(d) => match d.as_ref() {
            Directive::If(d) => d.if_expr.strip.strip_start(),
            Directive::For(d) => d.for_expr.strip.strip_start(),
        },
    }
}

/// (key, value) pairs a `for` walks: list index and element, or object key and value.
fn iteration_pairs(collection: Value) -> Result<Vec<(Value, Value)>, String> {
    match collection {
        Value::Array(items) => Ok(items.into_iter().enumerate().map(|(i, v)| (Value::from(i as u64), v)).collect()),
        Value::Object(map) => Ok(map.into_iter().map(|(k, v)| (Value::String(k), v)).collect()),
        other => Err(format!("cannot iterate over {}", describe(&other))),
    }
}

fn get_attr(value: Value, name: &str, path: &str) -> Result<Value, String> {
    match value {
        Value::Object(mut map) => match map.swap_remove(name) {
            Some(v) => Ok(v),
            None if path == "var" => Err(format!("reference to undeclared variable \"{name}\"; declare it with a variable block")),
            None if path == "local" => Err(format!("reference to undefined local value \"{name}\"")),
            None => Err(format!("{path} has no attribute \"{name}\"")),
        },
        other => Err(format!("cannot get attribute \"{name}\" of {}", describe(&other))),
    }
}

fn get_index(value: Value, key: &Value) -> Result<Value, String> {
    match value {
        Value::Array(mut items) => {
            let index = as_number(key)
                .and_then(|n| integer_of(&n))
                .ok_or_else(|| format!("list index must be a whole number, got {}", describe(key)))?;
            let len = items.len();
            usize::try_from(index)
                .ok()
                .filter(|i| *i < len)
                .map(|i| items.swap_remove(i))
                .ok_or_else(|| format!("index {index} is out of range for a list of {len} elements"))
        }
        Value::Object(mut map) => {
            let key = as_string(key).ok_or_else(|| format!("object key must be a string, got {}", describe(key)))?;
            map.swap_remove(&key).ok_or_else(|| format!("object has no key \"{key}\""))
        }
        other => Err(format!("cannot index {}", describe(&other))),
    }
}

fn unary(op: UnaryOperator, value: &Value) -> Result<Value, String> {
    match op {
        UnaryOperator::Neg => {
            let n = as_number(value).ok_or_else(|| format!("cannot negate {}", describe(value)))?;
            arithmetic(BinaryOperator::Minus, &Number::from(0), &n).map(Value::Number)
        }
        UnaryOperator::Not => as_bool(value).map(|b| Value::Bool(!b)).ok_or_else(|| format!("cannot apply ! to {}", describe(value))),
    }
}

fn binary(op: BinaryOperator, lhs: &Value, rhs: &Value) -> Result<Value, String> {
    use BinaryOperator::*;
    match op {
        Eq => Ok(Value::Bool(values_equal(lhs, rhs))),
        NotEq => Ok(Value::Bool(!values_equal(lhs, rhs))),
        And | Or => {
            let (a, b) = (as_bool(lhs), as_bool(rhs));
            match (a, b) {
                (Some(a), Some(b)) => Ok(Value::Bool(if op == And { a && b } else { a || b })),
                _ => Err(format!("{} needs two bools, got {} and {}", op.as_str(), describe(lhs), describe(rhs))),
            }
        }
        Less | LessEq | Greater | GreaterEq => {
            let (a, b) = numbers(op, lhs, rhs)?;
            let (a, b) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(f64::NAN));
            Ok(Value::Bool(match op {
                Less => a < b,
                LessEq => a <= b,
                Greater => a > b,
                _ => a >= b,
            }))
        }
        Plus | Minus | Mul | Div | Mod => {
            let (a, b) = numbers(op, lhs, rhs)?;
            arithmetic(op, &a, &b).map(Value::Number)
        }
    }
}

fn numbers(op: BinaryOperator, lhs: &Value, rhs: &Value) -> Result<(Number, Number), String> {
    match (as_number(lhs), as_number(rhs)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!("{} needs two numbers, got {} and {}", op.as_str(), describe(lhs), describe(rhs))),
    }
}

/// Arithmetic that stays exact on whole numbers and never overflows or divides by zero.
pub(crate) fn arithmetic(op: BinaryOperator, a: &Number, b: &Number) -> Result<Number, String> {
    use BinaryOperator::*;
    if let (Some(x), Some(y)) = (integer_of(a), integer_of(b)) {
        let exact = match op {
            Plus => x.checked_add(y),
            Minus => x.checked_sub(y),
            Mul => x.checked_mul(y),
            Div if y != 0 && x.checked_rem(y) == Some(0) => x.checked_div(y),
            Mod if y != 0 => x.checked_rem(y),
            _ => None,
        };
        if let Some(v) = exact {
            return Ok(Number::from(v));
        }
    }
    let (x, y) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(f64::NAN));
    if matches!(op, Div | Mod) && y == 0.0 {
        return Err("division by zero".to_string());
    }
    let r = match op {
        Plus => x + y,
        Minus => x - y,
        Mul => x * y,
        Div => x / y,
        _ => x % y,
    };
    number_from_f64(r).ok_or_else(|| "result is not a finite number".to_string())
}

/// A number from a float, kept whole when it is one.
pub(crate) fn number_from_f64(f: f64) -> Option<Number> {
    if f.fract() == 0.0 && f.abs() < 9.0e15 { Some(Number::from(f as i64)) } else { Number::from_f64(f) }
}

/// The whole-number value of a number (also for floats like `3.0`).
pub(crate) fn integer_of(n: &Number) -> Option<i64> {
    n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18).map(|f| f as i64))
}

/// Equality as HCL defines it: numbers by value, collections element-wise.
pub(crate) fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (integer_of(x), integer_of(y)) {
            (Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| values_equal(a, b)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| values_equal(v, w))),
        _ => a == b,
    }
}

/// A bool, converting `"true"`/`"false"` as HCL's type conversion does.
pub(crate) fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) if s == "true" => Some(true),
        Value::String(s) if s == "false" => Some(false),
        _ => None,
    }
}

/// A number, converting numeric strings as HCL's type conversion does.
pub(crate) fn as_number(v: &Value) -> Option<Number> {
    match v {
        Value::Number(n) => Some(*n),
        Value::String(s) => parse_number(s),
        _ => None,
    }
}

/// Parses a decimal number the way HCL converts strings (`"42"`, `"-1.5"`, `"1e3"`).
pub(crate) fn parse_number(s: &str) -> Option<Number> {
    if let Ok(i) = s.parse::<i64>() {
        return Some(Number::from(i));
    }
    let looks_numeric = !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
    if looks_numeric { s.parse::<f64>().ok().and_then(number_from_f64) } else { None }
}

/// A string, converting numbers and bools as HCL's type conversion does.
pub(crate) fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// How a value is named in messages: `string "two"`, `number 3`, `list`, ...
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => {
            let shown: String = s.chars().take(40).collect();
            if shown.len() < s.len() { format!("string \"{shown}...\"") } else { format!("string \"{shown}\"") }
        }
        Value::Array(_) => "list".to_string(),
        Value::Object(_) => "object".to_string(),
    }
}

/// Rough size of a value in budget units: one per node, one per 64 bytes of text.
pub(crate) fn size_of(v: &Value) -> u64 {
    match v {
        Value::String(s) => 1 + s.len() as u64 / 64,
        Value::Array(items) => 1 + items.iter().map(size_of).sum::<u64>(),
        Value::Object(map) => 1 + map.iter().map(|(k, v)| 1 + k.len() as u64 / 64 + size_of(v)).sum::<u64>(),
        _ => 1,
    }
}
