//! Input variables and locals: what `var.*` and `local.*` mean in a job file.
//!
//! Values come, lowest precedence first, from a declaration's `default`, the
//! variable files in order, then `-var name=value` options. As in Nomad (in
//! its strict mode, which `nomad job run` uses), setting a variable that is
//! not declared is an error, and so is a declared variable left without a
//! value. `-var` strings are taken literally for `string` and `number`
//! variables (and untyped ones) and parsed as HCL for other types
//! (`-var 'dcs=["dc1","dc2"]'`); every value is then converted to the
//! declared type with HCL's conversion rules.

use std::fmt;

use hcl::edit::Span;
use hcl::edit::expr::{Expression, ObjectKey};
use hcl::edit::structure::{Block, Structure};
use hcl::{Map, Value};

use super::ParseOptions;
use super::error::{DResult, Diag, ErrorKind, JobspecError};
use super::eval::{Evaluator, Scope, as_bool, as_number, as_string, describe, start_of};
use super::reader::{BlockRef, Reader};

/// A variable's type constraint (`type = list(string)`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum VarType {
    Any,
    String,
    Number,
    Bool,
    List(Box<VarType>),
    Set(Box<VarType>),
    Map(Box<VarType>),
    Object(Vec<(String, VarType)>),
    Tuple(Vec<VarType>),
}

impl fmt::Display for VarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VarType::Any => f.write_str("any"),
            VarType::String => f.write_str("string"),
            VarType::Number => f.write_str("number"),
            VarType::Bool => f.write_str("bool"),
            VarType::List(t) => write!(f, "list({t})"),
            VarType::Set(t) => write!(f, "set({t})"),
            VarType::Map(t) => write!(f, "map({t})"),
            VarType::Object(fields) => {
                f.write_str("object({")?;
                for (i, (k, t)) in fields.iter().enumerate() {
                    write!(f, "{}{k}={t}", if i == 0 { "" } else { ", " })?;
                }
                f.write_str("})")
            }
            VarType::Tuple(items) => {
                f.write_str("tuple([")?;
                for (i, t) in items.iter().enumerate() {
                    write!(f, "{}{t}", if i == 0 { "" } else { ", " })?;
                }
                f.write_str("])")
            }
        }
    }
}

impl VarType {
    /// The type of an untyped variable is the type of its default, as in Nomad.
    fn of_default(v: &Value) -> VarType {
        match v {
            Value::String(_) => VarType::String,
            Value::Number(_) => VarType::Number,
            Value::Bool(_) => VarType::Bool,
            Value::Array(_) => VarType::List(Box::new(VarType::Any)),
            Value::Object(_) => VarType::Map(Box::new(VarType::Any)),
            Value::Null => VarType::Any,
        }
    }

    /// Parses a type expression: `string`, `number`, `bool`, `any`, `list(T)`,
    /// `set(T)`, `map(T)`, `object({k = T})`, `tuple([T, ...])`.
    pub(crate) fn parse(expr: &Expression) -> Result<VarType, String> {
        match expr {
            Expression::Variable(v) => match v.as_str() {
                "string" => Ok(VarType::String),
                "number" => Ok(VarType::Number),
                "bool" => Ok(VarType::Bool),
                "any" => Ok(VarType::Any),
                other => Err(format!(
                    "unknown type \"{other}\"; expected string, number, bool, any, list(...), set(...), map(...), object(...) or tuple(...)"
                )),
            },
            Expression::FuncCall(call) => {
                let args: Vec<&Expression> = call.args.iter().collect();
                match (call.name.name.as_str(), args.as_slice()) {
                    ("list", [t]) => Ok(VarType::List(Box::new(VarType::parse(t)?))),
                    ("set", [t]) => Ok(VarType::Set(Box::new(VarType::parse(t)?))),
                    ("map", [t]) => Ok(VarType::Map(Box::new(VarType::parse(t)?))),
                    ("object", [Expression::Object(fields)]) => fields
                        .iter()
                        .map(|(k, v)| {
                            let name = match k {
                                ObjectKey::Ident(i) => i.as_str().to_string(),
                                ObjectKey::Expression(Expression::String(s)) => s.value().clone(),
                                ObjectKey::Expression(_) => return Err("object type attribute names must be names".to_string()),
                            };
                            Ok((name, VarType::parse(v.expr())?))
                        })
                        .collect::<Result<_, _>>()
                        .map(VarType::Object),
                    ("tuple", [Expression::Array(items)]) => items.iter().map(VarType::parse).collect::<Result<_, _>>().map(VarType::Tuple),
                    (name, _) => Err(format!("invalid type constructor {name}(...)")),
                }
            }
            Expression::String(_) | Expression::StringTemplate(_) => {
                Err("type must be a type expression such as string or list(string), not a quoted string".to_string())
            }
            _ => Err("invalid type expression".to_string()),
        }
    }

    /// Converts a value to this type with HCL's rules (numbers and bools to
    /// strings, numeric strings to numbers, `"true"` to bools, ...).
    pub fn convert(&self, value: Value) -> Result<Value, String> {
        if matches!(value, Value::Null) {
            return Ok(Value::Null);
        }
        let mismatch = |value: &Value| format!("{self} required, got {}", describe(value));
        match self {
            VarType::Any => Ok(value),
            VarType::String => as_string(&value).map(Value::String).ok_or_else(|| mismatch(&value)),
            VarType::Number => as_number(&value).map(Value::Number).ok_or_else(|| mismatch(&value)),
            VarType::Bool => as_bool(&value).map(Value::Bool).ok_or_else(|| mismatch(&value)),
            VarType::List(elem) | VarType::Set(elem) => {
                let Value::Array(items) = value else { return Err(mismatch(&value)) };
                let mut out: Vec<Value> = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    out.push(elem.convert(item).map_err(|e| format!("element {i}: {e}"))?);
                }
                // A set has no duplicates and cty's order (strings sorted, ...).
                if matches!(self, VarType::Set(_)) {
                    out = super::functions::set_of(out);
                }
                Ok(Value::Array(out))
            }
            VarType::Map(elem) => {
                let Value::Object(map) = value else { return Err(mismatch(&value)) };
                map.into_iter()
                    .map(|(k, v)| elem.convert(v).map(|v| (k.clone(), v)).map_err(|e| format!("key \"{k}\": {e}")))
                    .collect::<Result<Map<_, _>, _>>()
                    .map(Value::Object)
            }
            VarType::Object(fields) => {
                let Value::Object(mut map) = value else { return Err(mismatch(&value)) };
                let mut out = Map::new();
                for (name, ty) in fields {
                    let v = map.swap_remove(name).ok_or_else(|| format!("attribute \"{name}\" is required"))?;
                    out.insert(name.clone(), ty.convert(v).map_err(|e| format!("attribute \"{name}\": {e}"))?);
                }
                Ok(Value::Object(out))
            }
            VarType::Tuple(types) => {
                let Value::Array(items) = value else { return Err(mismatch(&value)) };
                if items.len() != types.len() {
                    return Err(format!("{self} required, got a list of {} elements", items.len()));
                }
                items
                    .into_iter()
                    .zip(types)
                    .enumerate()
                    .map(|(i, (v, t))| t.convert(v).map_err(|e| format!("element {i}: {e}")))
                    .collect::<Result<_, _>>()
                    .map(Value::Array)
            }
        }
    }
}

/// One declared input variable.
struct Declared<'a> {
    name: String,
    ty: Option<VarType>,
    value: Option<Value>,
    offset: Option<usize>,
    validations: Vec<Validation<'a>>,
}

/// A `validation { condition error_message }` block of a variable.
struct Validation<'a> {
    condition: &'a Expression,
    error_message: String,
    offset: Option<usize>,
}

/// The top-level blocks that feed the scope of a job.
pub(crate) struct Declarations<'a> {
    pub variable: Vec<&'a Block>,
    pub variables: Vec<&'a Block>,
    pub locals: Vec<&'a Block>,
}

/// Builds the scope job expressions see: `var` and `local`.
pub(crate) fn resolve(job_file: &Evaluator<'_>, decls: &Declarations<'_>, opts: &ParseOptions, file: &str) -> Result<Scope, JobspecError> {
    let src = job_file.source();
    let locate = |d: Diag| d.locate(file, src);
    let constants = Evaluator::for_constants(src);
    let mut declared: Vec<Declared<'_>> = Vec::new();
    for block in &decls.variable {
        let variable = decode_variable_block(&constants, block).map_err(locate)?;
        if declared.iter().any(|d| d.name == variable.name) {
            return Err(locate(Diag::new(
                ErrorKind::Variable,
                variable.offset,
                format!("variable \"{}\" is declared twice", variable.name),
            )));
        }
        declared.push(variable);
    }
    for block in &decls.variables {
        for s in block.body.iter() {
            let Structure::Attribute(attr) = s else {
                return Err(locate(Diag::new(
                    ErrorKind::Structure,
                    s.span().map(|s| s.start),
                    "a variables block may only contain name = default pairs",
                )));
            };
            let name = attr.key.as_str().to_string();
            let offset = attr.span().map(|s| s.start);
            if declared.iter().any(|d| d.name == name) {
                return Err(locate(Diag::new(ErrorKind::Variable, offset, format!("variable \"{name}\" is declared twice"))));
            }
            let value = constants.eval(&attr.value, &Scope::default()).map_err(locate)?;
            declared.push(Declared { name, ty: Some(VarType::of_default(&value)), value: Some(value), offset, validations: Vec::new() });
        }
    }

    for (var_file, text) in &opts.var_files {
        apply_var_file(&mut declared, var_file, text)?;
    }

    for (name, raw) in &opts.variables {
        let no_place = |message: String| Diag::new(ErrorKind::Variable, None, message).locate(file, src);
        let Some(variable) = declared.iter_mut().find(|d| &d.name == name) else {
            return Err(no_place(format!(
                "variable \"{name}\" was given with -var but is not declared; declare it with a variable \"{name}\" block"
            )));
        };
        let value = value_from_flag(raw, variable.ty.as_ref()).map_err(|e| no_place(format!("invalid value for -var {name}: {e}")))?;
        variable.value = Some(value);
    }

    let mut vars = Map::new();
    for variable in &declared {
        let Some(value) = variable.value.clone() else {
            return Err(locate(Diag::new(
                ErrorKind::Variable,
                variable.offset,
                format!("unset variable \"{0}\": give it a value with -var {0}=..., a variable file, or a default", variable.name),
            )));
        };
        vars.insert(variable.name.clone(), value);
    }
    for variable in &declared {
        check_validations(&constants, variable, &vars).map_err(locate)?;
    }

    let scope = Scope::default().bind("var", Value::Object(vars));
    evaluate_locals(job_file, &decls.locals, scope).map_err(locate)
}

fn decode_variable_block<'a>(constants: &'a Evaluator<'a>, block: &'a Block) -> DResult<Declared<'a>> {
    let block_ref = BlockRef::from_block(block, &Scope::default());
    let reader = Reader::open(constants, &block_ref)?;
    if block_ref.labels.len() != 1 {
        return Err(Diag::new(
            ErrorKind::Structure,
            block_ref.offset,
            "a variable block needs exactly one name: variable \"<name>\" { ... }",
        ));
    }
    let name = block_ref.label().to_string();
    if !is_identifier(&name) {
        return Err(Diag::new(
            ErrorKind::Variable,
            block_ref.offset,
            format!(
                "invalid variable name \"{name}\": a name must start with a letter or underscore and may contain only letters, digits, underscores and dashes"
            ),
        ));
    }
    let ty = match reader.attribute("type") {
        None => None,
        Some(attr) => Some(
            VarType::parse(&attr.value)
                .map_err(|e| Diag::new(ErrorKind::Variable, start_of(&attr.value), format!("variable \"{name}\": {e}")))?,
        ),
    };
    let _description = reader.string("description")?;
    let default = match reader.value("default")? {
        None => None,
        Some((v, at)) => Some(match &ty {
            Some(ty) => ty
                .convert(v)
                .map_err(|e| Diag::new(ErrorKind::Variable, at, format!("default of variable \"{name}\" does not match its type: {e}")))?,
            None => v,
        }),
    };
    let mut validations = Vec::new();
    for v in reader.blocks("validation", 0)? {
        let vr = reader.child(&v)?;
        let condition = vr.attribute("condition");
        let error_message = vr.string("error_message")?;
        vr.finish()?;
        match (condition, error_message) {
            (Some(attr), Some(error_message)) => validations.push(Validation { condition: &attr.value, error_message, offset: v.offset }),
            _ => {
                return Err(Diag::new(
                    ErrorKind::Structure,
                    v.offset,
                    format!("validation of variable \"{name}\" needs condition and error_message"),
                ));
            }
        }
    }
    reader.finish()?;
    let ty = ty.or_else(|| default.as_ref().map(VarType::of_default));
    Ok(Declared { name, ty, value: default, offset: block_ref.offset, validations })
}

/// Applies one variable file (`name = value` lines); its errors point into it.
fn apply_var_file(declared: &mut [Declared<'_>], file: &str, text: &str) -> Result<(), JobspecError> {
    let body = super::parse_hcl(file, text)?;
    let locate = |d: Diag| d.locate(file, text);
    let constants = Evaluator::for_constants(text);
    for s in body.iter() {
        let attr = match s {
            Structure::Attribute(attr) => attr,
            Structure::Block(b) => {
                return Err(locate(Diag::new(
                    ErrorKind::Structure,
                    b.span().map(|s| s.start),
                    format!(
                        "variable files only assign values (name = value); declare variables with a \"{}\" block in the job file",
                        b.ident.as_str()
                    ),
                )));
            }
        };
        let name = attr.key.as_str();
        let Some(variable) = declared.iter_mut().find(|d| d.name == name) else {
            return Err(locate(Diag::new(
                ErrorKind::Variable,
                attr.span().map(|s| s.start),
                format!("variable \"{name}\" is set but not declared; declare it with a variable \"{name}\" block in the job file"),
            )));
        };
        let value = constants.eval(&attr.value, &Scope::default()).map_err(locate)?;
        let value = match &variable.ty {
            Some(ty) => ty.convert(value).map_err(|e| {
                locate(Diag::new(ErrorKind::Variable, start_of(&attr.value), format!("invalid value for variable \"{name}\": {e}")))
            })?,
            None => value,
        };
        variable.value = Some(value);
    }
    Ok(())
}

/// A `-var` value: literal text for strings, numbers and untyped variables, HCL otherwise.
fn value_from_flag(raw: &str, ty: Option<&VarType>) -> Result<Value, String> {
    let value = match ty {
        None | Some(VarType::String) | Some(VarType::Number) => Value::String(raw.to_string()),
        Some(_) => {
            let expr = hcl::edit::parser::parse_expr(raw).map_err(|e| format!("not a valid HCL value: {}", e.message()))?;
            Evaluator::for_constants(raw).eval(&expr, &Scope::default()).map_err(|d| d.message)?
        }
    };
    match ty {
        Some(ty) => ty.convert(value),
        None => Ok(value),
    }
}

fn check_validations(constants: &Evaluator<'_>, variable: &Declared<'_>, vars: &Map<String, Value>) -> DResult<()> {
    if variable.validations.is_empty() {
        return Ok(());
    }
    let mut only_this = Map::new();
    if let Some(v) = vars.get(&variable.name) {
        only_this.insert(variable.name.clone(), v.clone());
    }
    let scope = Scope::default().bind("var", Value::Object(only_this));
    for validation in &variable.validations {
        let result = constants.eval(validation.condition, &scope)?;
        match as_bool(&result) {
            Some(true) => {}
            Some(false) => {
                return Err(Diag::new(
                    ErrorKind::Variable,
                    validation.offset,
                    format!("invalid value for variable \"{}\": {}", variable.name, validation.error_message),
                ));
            }
            None => {
                return Err(Diag::new(
                    ErrorKind::Variable,
                    start_of(validation.condition),
                    format!("validation condition of variable \"{}\" must be a bool, got {}", variable.name, describe(&result)),
                ));
            }
        }
    }
    Ok(())
}

/// Evaluates `locals` in dependency order: a local that refers to one not yet
/// known is retried after the others, as Nomad does; a pass without progress
/// means a cycle or a real error, and the first error is reported.
fn evaluate_locals(eval: &Evaluator<'_>, blocks: &[&Block], scope: Scope) -> DResult<Scope> {
    let mut pending = Vec::new();
    for block in blocks {
        if !block.labels.is_empty() {
            return Err(Diag::new(ErrorKind::Structure, block.span().map(|s| s.start), "a locals block takes no labels"));
        }
        for s in block.body.iter() {
            let Structure::Attribute(attr) = s else {
                return Err(Diag::new(
                    ErrorKind::Structure,
                    s.span().map(|s| s.start),
                    "a locals block may only contain name = value pairs",
                ));
            };
            if pending.iter().any(|a: &&hcl::edit::structure::Attribute| a.key.as_str() == attr.key.as_str()) {
                return Err(Diag::new(
                    ErrorKind::Structure,
                    attr.span().map(|s| s.start),
                    format!("local \"{}\" is defined twice", attr.key.as_str()),
                ));
            }
            pending.push(attr);
        }
    }
    let mut locals = Map::new();
    while !pending.is_empty() {
        let before = pending.len();
        let mut first_error = None;
        let mut retry = Vec::new();
        for attr in pending {
            eval.charge(locals.len() as u64, start_of(&attr.value))?;
            let inner = scope.bind("local", Value::Object(locals.clone()));
            match eval.eval(&attr.value, &inner) {
                Ok(v) => {
                    locals.insert(attr.key.as_str().to_string(), v);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    retry.push(attr);
                }
            }
        }
        if let Some(e) = first_error
            && retry.len() == before
        {
            return Err(e);
        }
        pending = retry;
    }
    Ok(scope.bind("local", Value::Object(locals)))
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_') && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '-')
}
