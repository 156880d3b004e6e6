//! Zero-argument methods on template values (`.Keys`, `.Metadata`), which
//! gotmpl cannot call: it only looks fields up in maps.
//!
//! A data function registers the methods of the value it returns in a
//! [`MethodTable`], keyed by the identity of the value's shared allocation.
//! [`compile`] rewrites every field segment named like a method into a call
//! of an internal function that consults the table first, so the methods
//! never show up as map entries (`range` and `len` see only real data).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use gotmpl::parse::{CommandNode, Expr, ListNode, Node, PipeNode, Pos, SmolStr};
use gotmpl::{FuncMap, MissingKey, Template, TemplateError, Value, ValueFunc};

/// The internal function that method segments are rewritten into.
pub const METHOD_FUNC: &str = "__method";

struct Registered {
    /// Held so the allocation (and thus the identity key) cannot be reused
    /// by another value while the entry exists.
    _value: Value,
    methods: BTreeMap<String, Value>,
}

/// Methods of individual Map and List values, shared by the data functions
/// of a render and the compiled template.
#[derive(Default)]
pub struct MethodTable {
    entries: Mutex<HashMap<usize, Registered>>,
}

fn identity(value: &Value) -> Option<usize> {
    match value {
        Value::Map(m) => Some(Arc::as_ptr(m).cast::<()>() as usize),
        Value::List(l) => Some(Arc::as_ptr(l).cast::<()>() as usize),
        _ => None,
    }
}

impl MethodTable {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<usize, Registered>> {
        // A panic elsewhere cannot leave the map half-updated; keep using it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `value` (and every clone of it) the named methods. Returns false,
    /// registering nothing, when `value` is not a Map or List.
    pub fn register(&self, value: &Value, methods: BTreeMap<String, Value>) -> bool {
        let Some(id) = identity(value) else {
            return false;
        };
        self.lock().insert(id, Registered { _value: value.clone(), methods });
        true
    }

    /// The method `name` of `receiver`, if one was registered.
    pub fn method(&self, receiver: &Value, name: &str) -> Option<Value> {
        let id = identity(receiver)?;
        self.lock().get(&id)?.methods.get(name).cloned()
    }

    /// Forgets every registration (between renders).
    pub fn clear(&self) {
        self.lock().clear();
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `__method "Name" receiver`: the registered method, else a plain field
/// lookup with gotmpl's semantics.
fn method_func(table: Arc<MethodTable>, missing_key: MissingKey) -> ValueFunc {
    Arc::new(move |args: &[Value]| {
        let [Value::String(name), receiver] = args else {
            return Err(TemplateError::Exec(format!("{METHOD_FUNC}: expected a method name and a receiver, got {} arguments", args.len())));
        };
        if let Some(value) = table.method(receiver, name) {
            return Ok(value);
        }
        match receiver {
            Value::Map(entries) => match entries.get(name.as_ref()) {
                Some(value) => Ok(value.clone()),
                None if missing_key == MissingKey::Error => Err(TemplateError::MissingKey { key: name.to_string() }),
                None => Ok(Value::Nil),
            },
            Value::Nil => Ok(Value::Nil),
            other => Err(TemplateError::Exec(format!("can't evaluate field {name} in type {}", other.type_name()))),
        }
    })
}

/// Parses `source` and rewrites every field segment named in `methods`
/// into a method call resolved through `table` at execution time.
#[allow(clippy::too_many_arguments)]
pub fn compile(
    name: &str,
    source: &str,
    left: &str,
    right: &str,
    missing_key: MissingKey,
    mut funcs: FuncMap,
    methods: &[&str],
    table: Arc<MethodTable>,
) -> Result<Template, String> {
    funcs.insert(METHOD_FUNC.to_string(), method_func(table, missing_key));
    let parsed = Template::new(name).delims(left, right).missing_key(missing_key).funcs(funcs).parse(source).map_err(|e| e.to_string())?;

    let methods: BTreeSet<&str> = methods.iter().copied().collect();
    let names: Vec<String> = parsed.templates().into_iter().map(String::from).collect();
    let mut rewritten = Vec::with_capacity(names.len());
    for tree_name in &names {
        if let Some(tree) = parsed.lookup(tree_name) {
            let mut tree = tree.clone();
            rewrite_list(&mut tree, &methods);
            rewritten.push((tree_name.clone(), tree));
        }
    }

    let mut template = parsed;
    if names.iter().any(|n| n == name) {
        // gotmpl executes its main body from a private copy that
        // add_parse_tree cannot replace, so the main body becomes a call of
        // the (rewritten) template of the same name.
        let quoted = serde_json::to_string(name).map_err(|e| e.to_string())?;
        template = template.parse(&format!("{left} template {quoted} . {right}")).map_err(|e| e.to_string())?;
    }
    for (tree_name, tree) in rewritten {
        template = template.add_parse_tree(&tree_name, tree);
    }
    Ok(template)
}

type Methods<'a> = BTreeSet<&'a str>;

fn rewrite_list(list: &mut ListNode, methods: &Methods) {
    for node in &mut list.nodes {
        rewrite_node(node, methods);
    }
}

fn rewrite_node(node: &mut Node, methods: &Methods) {
    match node {
        Node::List(list) => rewrite_list(list, methods),
        Node::Action(action) => rewrite_pipe(&mut action.pipe, methods),
        Node::If(branch) | Node::Range(branch) | Node::With(branch) => {
            rewrite_pipe(&mut branch.pipe, methods);
            rewrite_list(&mut branch.body, methods);
            if let Some(else_body) = &mut branch.else_body {
                rewrite_list(else_body, methods);
            }
        }
        Node::Template(call) => {
            if let Some(pipe) = &mut call.pipe {
                rewrite_pipe(pipe, methods);
            }
        }
        Node::Define(define) => rewrite_list(&mut define.body, methods),
        Node::Text(_) | Node::Break(_) | Node::Continue(_) => {}
    }
}

fn is_function_chain_with_method(expr: &Expr, methods: &Methods) -> bool {
    matches!(expr, Expr::Chain(_, inner, fields)
        if matches!(inner.as_ref(), Expr::Identifier(_, f) if f != "and" && f != "or")
            && fields.iter().any(|f| methods.contains(f.as_str())))
}

fn rewrite_pipe(pipe: &mut PipeNode, methods: &Methods) {
    let commands = std::mem::take(&mut pipe.commands);
    for mut command in commands {
        let split = command.args.first().is_some_and(|first| is_function_chain_with_method(first, methods));
        for arg in command.args.iter_mut().skip(usize::from(split)) {
            rewrite_expr(arg, methods);
        }
        if !split {
            pipe.commands.push(command);
            continue;
        }
        // `fn.A.Keys.B args` calls fn with the args (and any piped value)
        // before walking the fields, so the method calls become later
        // pipeline stages: `fn.A args | __method.B "Keys"`.
        let first = command.args.remove(0);
        let Expr::Chain(pos, function, fields) = first else {
            command.args.insert(0, first);
            pipe.commands.push(command);
            continue;
        };
        let mut groups = split_at_methods(&fields, methods);
        let leading = groups.remove(0).1;
        command.args.insert(0, with_fields(pos, *function, leading));
        pipe.commands.push(command);
        for (method, trailing) in groups {
            let call = with_fields(pos, Expr::Identifier(pos, SmolStr::new(METHOD_FUNC)), trailing);
            pipe.commands.push(CommandNode { pos, args: vec![call, Expr::String(pos, Arc::from(method.as_str()))] });
        }
    }
}

/// Splits a field chain into the plain fields before the first method and
/// then one group per method with the plain fields that follow it.
fn split_at_methods(fields: &[SmolStr], methods: &Methods) -> Vec<(SmolStr, Vec<SmolStr>)> {
    let mut groups = vec![(SmolStr::default(), Vec::new())];
    for field in fields {
        if methods.contains(field.as_str()) {
            groups.push((field.clone(), Vec::new()));
        } else if let Some(last) = groups.last_mut() {
            last.1.push(field.clone());
        }
    }
    groups
}

fn rewrite_expr(expr: &mut Expr, methods: &Methods) {
    match expr {
        Expr::Pipe(_, pipe) => rewrite_pipe(pipe, methods),
        Expr::Chain(_, inner, _) => rewrite_expr(inner, methods),
        _ => {}
    }
    let has_method = |fields: &[SmolStr]| fields.iter().any(|f| methods.contains(f.as_str()));
    let (pos, base, fields) = match expr {
        Expr::Field(pos, fields) if has_method(fields) => (*pos, Expr::Dot(*pos), std::mem::take(fields)),
        Expr::Variable(pos, name, fields) if has_method(fields) => {
            let fields = std::mem::take(fields);
            (*pos, Expr::Variable(*pos, name.clone(), Vec::new()), fields)
        }
        Expr::Chain(pos, inner, fields) if has_method(fields) => {
            let inner = std::mem::replace(inner.as_mut(), Expr::Nil(*pos));
            (*pos, inner, std::mem::take(fields))
        }
        _ => return,
    };
    let mut groups = split_at_methods(&fields, methods).into_iter();
    let mut value = match groups.next() {
        Some((_, leading)) => with_fields(pos, base, leading),
        None => base,
    };
    for (method, trailing) in groups {
        value = with_fields(pos, method_call(pos, value, &method), trailing);
    }
    *expr = value;
}

/// `(__method "name" receiver)`
fn method_call(pos: Pos, receiver: Expr, name: &str) -> Expr {
    Expr::Pipe(
        pos,
        PipeNode {
            pos,
            decl: Vec::new(),
            commands: vec![CommandNode {
                pos,
                args: vec![Expr::Identifier(pos, SmolStr::new(METHOD_FUNC)), Expr::String(pos, Arc::from(name)), receiver],
            }],
            is_assign: false,
        },
    )
}

/// `base` followed by plain field lookups.
fn with_fields(pos: Pos, base: Expr, fields: Vec<SmolStr>) -> Expr {
    if fields.is_empty() {
        return base;
    }
    match base {
        Expr::Dot(p) => Expr::Field(p, fields),
        Expr::Variable(p, name, mut existing) => {
            existing.extend(fields);
            Expr::Variable(p, name, existing)
        }
        Expr::Chain(p, inner, mut existing) => {
            existing.extend(fields);
            Expr::Chain(p, inner, existing)
        }
        other => Expr::Chain(pos, Box::new(other), fields),
    }
}

#[cfg(test)]
#[path = "methods_tests.rs"]
mod tests;
