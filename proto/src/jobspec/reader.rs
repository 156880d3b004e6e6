//! Reading one block body: typed attributes, child blocks, and the check that
//! nothing unknown was written.
//!
//! A decoder asks a [`Reader`] for every attribute and block its block may
//! have; the reader records each name it was asked for and marks what it
//! handed out. [`Reader::finish`] then reports whatever is left as unknown,
//! suggesting the closest name that was asked for. So the list of accepted
//! names is the decoder itself and cannot drift from it.
//!
//! `dynamic "<type>" { for_each labels iterator content {} }` blocks are
//! expanded here, so every decoder supports them.

use std::cell::RefCell;
use std::collections::BTreeMap;

use hcl::edit::Span;
use hcl::edit::expr::Expression;
use hcl::edit::structure::{Attribute, Block, Body, Structure};
use hcl::{Map, Value};

use super::duration::parse_go_duration;
use super::error::{DResult, Diag, ErrorKind, with_suggestion};
use super::eval::{Evaluator, Scope, as_bool, as_number, as_string, describe, integer_of, start_of};
use super::hints::HCL1_BLOCK_ASSIGNMENT;

/// A block to decode: its type, labels, body and the scope its expressions see.
pub(crate) struct BlockRef<'a> {
    pub ident: &'a str,
    pub labels: Vec<String>,
    pub body: &'a Body,
    pub offset: Option<usize>,
    pub scope: Scope,
}

impl<'a> BlockRef<'a> {
    /// A block as written in the file.
    pub fn from_block(block: &'a Block, scope: &Scope) -> BlockRef<'a> {
        BlockRef {
            ident: block.ident.as_str(),
            labels: block.labels.iter().map(|l| l.as_str().to_string()).collect(),
            body: &block.body,
            offset: block.span().map(|s| s.start),
            scope: scope.clone(),
        }
    }

    /// The first label, for blocks that have exactly one.
    pub fn label(&self) -> &str {
        self.labels.first().map_or("", String::as_str)
    }
}

/// Reads the attributes and blocks of one block body.
pub(crate) struct Reader<'a> {
    eval: &'a Evaluator<'a>,
    body: &'a Body,
    scope: Scope,
    /// How messages name this block: `group "web"` or `restart block of group "web"`.
    context: String,
    /// The nearest labeled block, which unlabeled children are named after.
    named: String,
    consumed: RefCell<Vec<bool>>,
    asked_attributes: RefCell<Vec<&'static str>>,
    asked_blocks: RefCell<Vec<&'static str>>,
}

impl<'a> Reader<'a> {
    /// Opens a top-level block (one with no enclosing block).
    pub fn open(eval: &'a Evaluator<'a>, block: &BlockRef<'a>) -> DResult<Reader<'a>> {
        Reader::new(eval, block, None)
    }

    /// Opens a block found inside this one.
    pub fn child(&self, block: &BlockRef<'a>) -> DResult<Reader<'a>> {
        Reader::new(self.eval, block, Some(&self.named))
    }

    fn new(eval: &'a Evaluator<'a>, block: &BlockRef<'a>, parent: Option<&str>) -> DResult<Reader<'a>> {
        let (context, named) = if !block.labels.is_empty() {
            let name = format!("{} \"{}\"", block.ident, block.labels.join("\" \""));
            (name.clone(), name)
        } else if let Some(parent) = parent {
            (format!("{} block of {parent}", block.ident), parent.to_string())
        } else {
            (block.ident.to_string(), block.ident.to_string())
        };
        Ok(Reader {
            eval,
            body: block.body,
            scope: block.scope.clone(),
            context,
            named,
            consumed: RefCell::new(vec![false; block.body.len()]),
            asked_attributes: RefCell::new(Vec::new()),
            asked_blocks: RefCell::new(Vec::new()),
        })
    }

    /// How messages name this block.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The attribute `name`, marked as handled.
    pub fn attribute(&self, name: &'static str) -> Option<&'a Attribute> {
        self.asked_attributes.borrow_mut().push(name);
        let mut consumed = self.consumed.borrow_mut();
        for (i, s) in self.body.iter().enumerate() {
            if let Structure::Attribute(a) = s
                && a.key.as_str() == name
            {
                consumed[i] = true;
                return Some(a);
            }
        }
        None
    }

    /// The value of attribute `name` and where it starts; `null` counts as not set.
    pub fn value(&self, name: &'static str) -> DResult<Option<(Value, Option<usize>)>> {
        let Some(attr) = self.attribute(name) else { return Ok(None) };
        let at = start_of(&attr.value);
        match self.eval.eval(&attr.value, &self.scope)? {
            Value::Null => Ok(None),
            v => Ok(Some((v, at))),
        }
    }

    /// Evaluates an expression in this block's scope.
    pub fn eval(&self, expr: &Expression) -> DResult<Value> {
        self.eval.eval(expr, &self.scope)
    }

    /// The body being read, for decoders that walk free-form contents themselves.
    pub fn body(&self) -> &'a Body {
        self.body
    }

    /// Where a structure of this body starts.
    pub fn offset_of(&self, s: &Structure) -> Option<usize> {
        s.span().map(|s| s.start)
    }

    /// A wrong-type error for `name`, for decoders that evaluate values themselves.
    pub fn type_mismatch(&self, name: &str, at: Option<usize>, expected: &str, got: &Value) -> Diag {
        self.type_error(name, at, expected, got)
    }

    fn type_error(&self, name: &str, at: Option<usize>, expected: &str, got: &Value) -> Diag {
        Diag::new(
            ErrorKind::Type,
            at,
            format!("invalid value for \"{name}\" in {}: expected {expected}, got {}", self.context, describe(got)),
        )
    }

    /// An error about the value of `name` (right type, wrong value).
    pub fn invalid(&self, name: &str, at: Option<usize>, why: impl std::fmt::Display) -> Diag {
        Diag::new(ErrorKind::InvalidValue, at, format!("invalid value for \"{name}\" in {}: {why}", self.context))
    }

    /// A string attribute (numbers and bools convert, as in HCL).
    pub fn string(&self, name: &'static str) -> DResult<Option<String>> {
        match self.value(name)? {
            None => Ok(None),
            Some((v, at)) => as_string(&v).map(Some).ok_or_else(|| self.type_error(name, at, "a string", &v)),
        }
    }

    /// A whole-number attribute (numeric strings convert, as in HCL).
    pub fn int(&self, name: &'static str) -> DResult<Option<i64>> {
        match self.value(name)? {
            None => Ok(None),
            Some((v, at)) => {
                as_number(&v).and_then(|n| integer_of(&n)).map(Some).ok_or_else(|| self.type_error(name, at, "a whole number", &v))
            }
        }
    }

    /// A bool attribute (`"true"`/`"false"` convert, as in HCL).
    pub fn bool(&self, name: &'static str) -> DResult<Option<bool>> {
        match self.value(name)? {
            None => Ok(None),
            Some((v, at)) => as_bool(&v).map(Some).ok_or_else(|| self.type_error(name, at, "a bool", &v)),
        }
    }

    /// A duration attribute in nanoseconds: a Go duration string, or a number of nanoseconds.
    pub fn duration(&self, name: &'static str) -> DResult<Option<i64>> {
        match self.value(name)? {
            None => Ok(None),
            Some((Value::String(s), at)) => parse_go_duration(&s)
                .map(Some)
                .map_err(|why| Diag::new(ErrorKind::Duration, at, format!("invalid duration for \"{name}\" in {}: {why}", self.context))),
            Some((Value::Number(n), at)) => {
                integer_of(&n).map(Some).ok_or_else(|| self.type_error(name, at, "a duration string such as \"30s\"", &Value::Number(n)))
            }
            Some((v, at)) => Err(self.type_error(name, at, "a duration string such as \"30s\"", &v)),
        }
    }

    /// A list-of-strings attribute.
    pub fn strings(&self, name: &'static str) -> DResult<Option<Vec<String>>> {
        match self.value(name)? {
            None => Ok(None),
            Some((Value::Array(items), at)) => items
                .iter()
                .map(|item| as_string(item).ok_or_else(|| self.type_error(name, at, "a list of strings", item)))
                .collect::<DResult<Vec<_>>>()
                .map(Some),
            Some((v, at)) => Err(self.type_error(name, at, "a list of strings", &v)),
        }
    }

    /// A string map written either as a block (`meta { a = "b" }`) or as an
    /// attribute (`meta = { "a.b" = "c" }`), as Nomad allows for `env` and `meta`.
    pub fn string_map(&self, name: &'static str) -> DResult<Option<BTreeMap<String, String>>> {
        let attr = self.attribute(name);
        let blocks = self.blocks(name, 0)?;
        match (attr, blocks.as_slice()) {
            (Some(attr), [first, ..]) => Err(Diag::new(
                ErrorKind::Structure,
                first.offset.or_else(|| attr.span().map(|s| s.start)),
                format!("\"{name}\" is set both as an attribute and as a block in {}", self.context),
            )),
            (Some(attr), []) => {
                let at = start_of(&attr.value);
                match self.eval.eval(&attr.value, &self.scope)? {
                    Value::Null => Ok(None),
                    Value::Object(map) => map
                        .into_iter()
                        .map(|(k, v)| match as_string(&v) {
                            Some(s) => Ok((k, s)),
                            None => Err(self.type_error(name, at, &format!("a string for key \"{k}\""), &v)),
                        })
                        .collect::<DResult<_>>()
                        .map(Some),
                    v => Err(self.type_error(name, at, "a map of strings", &v)),
                }
            }
            (None, []) => Ok(None),
            (None, blocks) => {
                let mut out = BTreeMap::new();
                for block in blocks {
                    let reader = self.child(block)?;
                    for s in block.body.iter() {
                        match s {
                            Structure::Attribute(a) => {
                                let at = start_of(&a.value);
                                let v = reader.eval(&a.value)?;
                                if matches!(v, Value::Null) {
                                    continue;
                                }
                                let s = as_string(&v).ok_or_else(|| reader.type_error(a.key.as_str(), at, "a string", &v))?;
                                out.insert(a.key.as_str().to_string(), s);
                            }
                            Structure::Block(b) => {
                                return Err(Diag::new(
                                    ErrorKind::Structure,
                                    b.span().map(|s| s.start),
                                    format!(
                                        "unexpected block \"{}\" in {}; only key = value pairs are allowed",
                                        b.ident.as_str(),
                                        reader.context
                                    ),
                                ));
                            }
                        }
                    }
                }
                Ok(Some(out))
            }
        }
    }

    /// A free-form block such as a driver's `config {}`, as JSON in HCLv1's
    /// shape: nested blocks become lists of objects (`port_map { db = 1 }` is
    /// `"port_map": [{"db": 1}]`), and so do object-valued attributes, which is
    /// what drivers written for HCLv1 expect.
    pub fn free_form(&self, name: &'static str) -> DResult<Option<BTreeMap<String, serde_json::Value>>> {
        match self.block(name)? {
            None => Ok(None),
            Some(block) => {
                let reader = self.child(&block)?;
                Ok(Some(reader.free_form_body(block.body, 0)?.into_iter().collect()))
            }
        }
    }

    fn free_form_body(&self, body: &'a Body, depth: usize) -> DResult<serde_json::Map<String, serde_json::Value>> {
        let mut out = serde_json::Map::new();
        for s in body.iter() {
            match s {
                Structure::Attribute(a) => {
                    let key = a.key.as_str();
                    if out.contains_key(key) {
                        return Err(Diag::new(
                            ErrorKind::Structure,
                            a.span().map(|s| s.start),
                            format!("\"{key}\" is set twice in {}", self.context),
                        ));
                    }
                    let value = to_json(self.eval(&a.value)?);
                    let value = if matches!(a.value, Expression::Object(_)) { serde_json::Value::Array(vec![value]) } else { value };
                    out.insert(key.to_string(), value);
                }
                Structure::Block(b) => {
                    let at = b.span().map(|s| s.start);
                    if depth > 32 {
                        return Err(Diag::new(ErrorKind::Structure, at, format!("blocks are nested too deeply in {}", self.context)));
                    }
                    let mut value = serde_json::Value::Object(self.free_form_body(&b.body, depth + 1)?);
                    for label in b.labels.iter().rev() {
                        let mut wrapper = serde_json::Map::new();
                        wrapper.insert(label.as_str().to_string(), serde_json::Value::Array(vec![value]));
                        value = serde_json::Value::Object(wrapper);
                    }
                    let key = b.ident.as_str();
                    match out.entry(key.to_string()).or_insert_with(|| serde_json::Value::Array(Vec::new())) {
                        serde_json::Value::Array(list) => list.push(value),
                        _ => {
                            return Err(Diag::new(
                                ErrorKind::Structure,
                                at,
                                format!("\"{key}\" is set both as an attribute and as a block in {}", self.context),
                            ));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every block of type `name` (including `dynamic "name"` expansions), in
    /// file order, each with exactly `labels` labels.
    pub fn blocks(&self, name: &'static str, labels: usize) -> DResult<Vec<BlockRef<'a>>> {
        self.asked_blocks.borrow_mut().push(name);
        let mut out = Vec::new();
        for (i, s) in self.body.iter().enumerate() {
            let Structure::Block(b) = s else { continue };
            if b.ident.as_str() == name {
                self.consumed.borrow_mut()[i] = true;
                let block = BlockRef::from_block(b, &self.scope);
                self.check_labels(&block, labels)?;
                out.push(block);
            } else if b.ident.as_str() == "dynamic" && b.labels.first().is_some_and(|l| l.as_str() == name) {
                self.consumed.borrow_mut()[i] = true;
                for block in self.expand_dynamic(b, name)? {
                    self.check_labels(&block, labels)?;
                    out.push(block);
                }
            }
        }
        Ok(out)
    }

    /// The block of type `name`, which may appear at most once and has no labels.
    pub fn block(&self, name: &'static str) -> DResult<Option<BlockRef<'a>>> {
        let mut blocks = self.blocks(name, 0)?.into_iter();
        let first = blocks.next();
        if let Some(second) = blocks.next() {
            return Err(Diag::new(
                ErrorKind::Structure,
                second.offset,
                format!("only one \"{name}\" block is allowed in {}", self.context),
            ));
        }
        Ok(first)
    }

    fn check_labels(&self, block: &BlockRef<'a>, want: usize) -> DResult<()> {
        let got = block.labels.len();
        if got == want {
            return Ok(());
        }
        let ident = block.ident;
        let message = match (want, got) {
            (0, _) => format!("block \"{ident}\" in {} takes no labels, got {got}", self.context),
            (1, 0) => format!("block \"{ident}\" in {} needs a name: {ident} \"<name>\" {{ ... }}", self.context),
            _ => format!("block \"{ident}\" in {} takes {want} label(s), got {got}", self.context),
        };
        Err(Diag::new(ErrorKind::Structure, block.offset, message))
    }

    /// Expands `dynamic "name" { for_each = ... content { ... } }` into one block per element.
    fn expand_dynamic(&self, dynamic: &'a Block, name: &'static str) -> DResult<Vec<BlockRef<'a>>> {
        let spec = BlockRef::from_block(dynamic, &self.scope);
        let reader = self.child(&spec)?;
        let for_each = reader.attribute("for_each");
        // The iterator is a bare name (`iterator = port`), not a value to evaluate.
        let iterator = match reader.attribute("iterator").map(|a| &a.value) {
            None => name.to_string(),
            Some(Expression::Variable(v)) => v.as_str().to_string(),
            Some(Expression::String(s)) => s.value().clone(),
            Some(other) => {
                return Err(Diag::new(ErrorKind::Type, start_of(other), format!("\"iterator\" in dynamic \"{name}\" must be a name")));
            }
        };
        let labels_attr = reader.attribute("labels");
        let content = reader.block("content")?;
        reader.finish()?;
        let Some(for_each) = for_each else {
            return Err(Diag::new(
                ErrorKind::Structure,
                spec.offset,
                format!("dynamic \"{name}\" in {} needs a for_each attribute", self.context),
            ));
        };
        let Some(content) = content else {
            return Err(Diag::new(
                ErrorKind::Structure,
                spec.offset,
                format!("dynamic \"{name}\" in {} needs a content block", self.context),
            ));
        };
        let items: Vec<(Value, Value)> = match reader.eval(&for_each.value)? {
            Value::Array(items) => items.into_iter().enumerate().map(|(i, v)| (Value::from(i as u64), v)).collect(),
            Value::Object(map) => map.into_iter().map(|(k, v)| (Value::String(k), v)).collect(),
            Value::Null => Vec::new(),
            other => {
                return Err(Diag::new(
                    ErrorKind::Type,
                    start_of(&for_each.value),
                    format!("invalid value for \"for_each\" in dynamic \"{name}\": expected a list or map, got {}", describe(&other)),
                ));
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (key, value) in items {
            let mut element = Map::new();
            element.insert("key".to_string(), key);
            element.insert("value".to_string(), value);
            let scope = self.scope.bind(iterator.clone(), Value::Object(element));
            let labels = match labels_attr {
                None => Vec::new(),
                Some(attr) => match self.eval.eval(&attr.value, &scope)? {
                    Value::Array(items) => items
                        .iter()
                        .map(|l| as_string(l).ok_or_else(|| reader.type_error("labels", start_of(&attr.value), "a list of strings", l)))
                        .collect::<DResult<Vec<_>>>()?,
                    other => return Err(reader.type_error("labels", start_of(&attr.value), "a list of strings", &other)),
                },
            };
            out.push(BlockRef { ident: name, labels, body: content.body, offset: content.offset, scope });
        }
        Ok(out)
    }

    /// Fails on the first attribute or block no decoder asked for.
    pub fn finish(&self) -> DResult<()> {
        let consumed = self.consumed.borrow();
        let attributes = self.asked_attributes.borrow();
        let blocks = self.asked_blocks.borrow();
        let all_names = || attributes.iter().chain(blocks.iter()).copied();
        for (i, s) in self.body.iter().enumerate() {
            if consumed.get(i).copied().unwrap_or(false) {
                continue;
            }
            match s {
                Structure::Attribute(a) => {
                    let key = a.key.as_str();
                    let at = a.span().map(|s| s.start);
                    if blocks.contains(&key) {
                        let mut message = format!("\"{key}\" in {} is a block, not an attribute; write {key} {{ ... }}", self.context);
                        if matches!(a.value, Expression::Object(_)) {
                            message.push_str(HCL1_BLOCK_ASSIGNMENT);
                        }
                        return Err(Diag::new(ErrorKind::Structure, at, message));
                    }
                    let message = format!("unknown attribute \"{key}\" in {}", self.context);
                    return Err(Diag::new(ErrorKind::UnknownKey, at, with_suggestion(message, key, all_names())));
                }
                Structure::Block(b) => {
                    let ident = b.ident.as_str();
                    let at = b.span().map(|s| s.start);
                    let (ident, message) = if ident == "dynamic" {
                        let target = b.labels.first().map_or("", |l| l.as_str());
                        (target, format!("unknown block \"{target}\" in dynamic block of {}", self.context))
                    } else {
                        (ident, format!("unknown block \"{ident}\" in {}", self.context))
                    };
                    if attributes.contains(&ident) {
                        return Err(Diag::new(
                            ErrorKind::Structure,
                            at,
                            format!("\"{ident}\" in {} is an attribute, not a block; write {ident} = ...", self.context),
                        ));
                    }
                    return Err(Diag::new(ErrorKind::UnknownKey, at, with_suggestion(message, ident, all_names())));
                }
            }
        }
        Ok(())
    }

    // Setters that leave the target alone when the attribute is not set, so
    // defaults already in the target survive.

    pub fn set_string(&self, name: &'static str, target: &mut String) -> DResult<()> {
        if let Some(v) = self.string(name)? {
            *target = v;
        }
        Ok(())
    }

    pub fn set_int(&self, name: &'static str, target: &mut i64) -> DResult<()> {
        if let Some(v) = self.int(name)? {
            *target = v;
        }
        Ok(())
    }

    pub fn set_bool(&self, name: &'static str, target: &mut bool) -> DResult<()> {
        if let Some(v) = self.bool(name)? {
            *target = v;
        }
        Ok(())
    }

    pub fn set_duration(&self, name: &'static str, target: &mut i64) -> DResult<()> {
        if let Some(v) = self.duration(name)? {
            *target = v;
        }
        Ok(())
    }

    pub fn set_strings(&self, name: &'static str, target: &mut Vec<String>) -> DResult<()> {
        if let Some(v) = self.strings(name)? {
            *target = v;
        }
        Ok(())
    }

    pub fn set_string_map(&self, name: &'static str, target: &mut BTreeMap<String, String>) -> DResult<()> {
        if let Some(v) = self.string_map(name)? {
            *target = v;
        }
        Ok(())
    }
}

/// An HCL value as JSON; whole numbers stay integers.
pub(crate) fn to_json(v: Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(b),
        Value::Number(n) => match (integer_of(&n), n.as_u64()) {
            (Some(i), _) => serde_json::Value::from(i),
            (None, Some(u)) => serde_json::Value::from(u),
            _ => n.as_f64().and_then(serde_json::Number::from_f64).map_or(serde_json::Value::Null, serde_json::Value::Number),
        },
        Value::String(s) => serde_json::Value::String(s),
        Value::Array(items) => serde_json::Value::Array(items.into_iter().map(to_json).collect()),
        Value::Object(map) => serde_json::Value::Object(map.into_iter().map(|(k, v)| (k, to_json(v))).collect()),
    }
}
