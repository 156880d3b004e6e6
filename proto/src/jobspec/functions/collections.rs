//! Collection functions (go-cty's stdlib). Job files have no separate set
//! type, so a set is a list without duplicates in cty's set order: strings
//! lexically, numbers by value, `false` before `true`; other elements keep
//! the order they were first seen in (cty leaves theirs unspecified).

use std::cmp::Ordering;

use hcl::{Map, Value};

use super::{arity, float_arg, list_arg, sorted_entries, string_arg, whole};
use crate::jobspec::eval::{as_string, describe, number_from_f64, values_equal};

/// Most elements `range` may produce (cty's limit).
const MAX_RANGE: usize = 1024;
/// Most combinations `setproduct` may produce.
const MAX_PRODUCT: usize = 100_000;

pub(super) fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    match name {
        "length" => {
            arity(&args, 1, 1)?;
            match &args[0] {
                Value::Array(a) => Ok(Value::from(a.len() as u64)),
                Value::Object(m) => Ok(Value::from(m.len() as u64)),
                // cty's length takes collections only; strlen counts characters.
                _ => Err("collection must be a list, a map or a tuple".to_string()),
            }
        }
        "concat" => {
            arity(&args, 1, usize::MAX)?;
            let mut out = Vec::new();
            for list in &args {
                match list {
                    Value::Array(items) => out.extend(items.iter().cloned()),
                    other => return Err(format!("all arguments must be lists or tuples; got {}", describe(other))),
                }
            }
            Ok(Value::Array(out))
        }
        "contains" => {
            arity(&args, 2, 2)?;
            match &args[0] {
                Value::Array(items) => Ok(Value::Bool(items.iter().any(|v| values_equal(v, &args[1])))),
                Value::Null => Err("cannot search a nil list or set".to_string()),
                _ => Err("argument must be list, tuple, or set".to_string()),
            }
        }
        "distinct" => {
            arity(&args, 1, 1)?;
            Ok(Value::Array(dedup(unify(list_arg(&args[0])?))))
        }
        "element" => {
            arity(&args, 2, 2)?;
            let list = match &args[0] {
                Value::Array(items) => items,
                other => return Err(format!("cannot read elements from {}", describe(other))),
            };
            let i = whole(&args[1]).map_err(|e| format!("invalid index: {e}"))?;
            if i < 0 {
                return Err("cannot use element function with a negative index".to_string());
            }
            if list.is_empty() {
                return Err("cannot use element function with an empty list".to_string());
            }
            Ok(list[(i as u64 % list.len() as u64) as usize].clone())
        }
        "index" => {
            // cty's index is the element at a list index or map key (not the position of a value).
            arity(&args, 2, 2)?;
            match &args[0] {
                Value::Array(items) => {
                    let i = whole(&args[1]).map_err(|_| "key for list must be number".to_string())?;
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| items.get(i))
                        .cloned()
                        .ok_or_else(|| format!("invalid index: {i} is out of range for a list of {} elements", items.len()))
                }
                Value::Object(map) => {
                    let key = as_string(&args[1]).ok_or_else(|| "key for map must be string".to_string())?;
                    map.get(&key).cloned().ok_or_else(|| format!("invalid index: the map has no key \"{key}\""))
                }
                _ => Err("collection must be a list, a map or a tuple".to_string()),
            }
        }
        "flatten" => {
            arity(&args, 1, 1)?;
            let Value::Array(items) = &args[0] else { return Err("can only flatten lists, sets and tuples".to_string()) };
            let mut out = Vec::new();
            flatten_into(items, &mut out, 0)?;
            Ok(Value::Array(out))
        }
        "keys" => {
            arity(&args, 1, 1)?;
            let entries = sorted_entries(&args[0]).map_err(|_| "must have map or object type".to_string())?;
            Ok(Value::Array(entries.into_keys().map(Value::String).collect()))
        }
        "values" => {
            arity(&args, 1, 1)?;
            let entries = sorted_entries(&args[0]).map_err(|_| "values() requires a map as the first argument".to_string())?;
            Ok(Value::Array(entries.into_values().collect()))
        }
        "lookup" => {
            // cty's lookup (Nomad's) needs the default: three arguments.
            arity(&args, 3, 3)?;
            let Value::Object(map) = &args[0] else { return Err("lookup() requires a map as the first argument".to_string()) };
            let key = string_arg(&args[1])?;
            Ok(map.get(&key).cloned().unwrap_or_else(|| args[2].clone()))
        }
        "merge" => {
            let mut out = Map::new();
            for m in args {
                match m {
                    Value::Null => {}
                    Value::Object(map) => out.extend(map),
                    other => return Err(format!("arguments must be maps or objects, got {}", describe(&other))),
                }
            }
            Ok(Value::Object(out))
        }
        "zipmap" => {
            arity(&args, 2, 2)?;
            let keys = list_arg(&args[0])?;
            let Value::Array(values) = &args[1] else { return Err("values argument must be a list or tuple value".to_string()) };
            if keys.len() != values.len() {
                return Err(format!("number of keys ({}) does not match number of values ({})", keys.len(), values.len()));
            }
            let mut out = Map::new();
            for (i, (k, v)) in keys.iter().zip(values).enumerate() {
                if matches!(k, Value::Null) {
                    return Err(format!("keys list has null value at index {i}"));
                }
                out.insert(string_arg(k)?, v.clone());
            }
            Ok(Value::Object(out))
        }
        "range" => range(&args),
        "reverse" => {
            arity(&args, 1, 1)?;
            let Value::Array(items) = &args[0] else {
                return Err(format!("can only reverse list or tuple values, not {}", describe(&args[0])));
            };
            Ok(Value::Array(items.iter().rev().cloned().collect()))
        }
        "slice" => slice(&args),
        "sort" => {
            arity(&args, 1, 1)?;
            let mut items = Vec::new();
            for v in list_arg(&args[0])? {
                if matches!(v, Value::Null) {
                    return Err("given list element is null; a null string cannot be sorted".to_string());
                }
                items.push(string_arg(&v)?);
            }
            items.sort();
            Ok(Value::Array(items.into_iter().map(Value::String).collect()))
        }
        "chunklist" => {
            arity(&args, 2, 2)?;
            let list = unify(list_arg(&args[0])?);
            let size = whole(&args[1]).map_err(|e| format!("invalid size: {e}"))?;
            if size < 0 {
                return Err("the size argument must be positive".to_string());
            }
            if list.is_empty() {
                return Ok(Value::Array(Vec::new()));
            }
            if size == 0 {
                return Ok(Value::Array(vec![Value::Array(list)]));
            }
            Ok(Value::Array(list.chunks(size as usize).map(|c| Value::Array(c.to_vec())).collect()))
        }
        "compact" => {
            arity(&args, 1, 1)?;
            let mut out = Vec::new();
            for v in list_arg(&args[0])? {
                if matches!(v, Value::Null) {
                    continue;
                }
                let s = string_arg(&v)?;
                if !s.is_empty() {
                    out.push(Value::String(s));
                }
            }
            Ok(Value::Array(out))
        }
        "coalesce" => {
            // cty's coalesce: the first non-null argument (an empty string counts), in the arguments' common type.
            let all = unify(args);
            all.into_iter().find(|v| !matches!(v, Value::Null)).ok_or_else(|| "no non-null arguments".to_string())
        }
        "coalescelist" => {
            arity(&args, 1, usize::MAX)?;
            if args.iter().any(|v| !matches!(v, Value::Array(_) | Value::Null)) {
                return Err("coalescelist arguments must be lists or tuples".to_string());
            }
            args.into_iter().find(|v| matches!(v, Value::Array(a) if !a.is_empty())).ok_or_else(|| "no non-null arguments".to_string())
        }
        "setunion" | "setintersection" => {
            arity(&args, 1, usize::MAX)?;
            let mut sets = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                let Value::Array(items) = a else {
                    return Err(format!("argument {}: a set or a list is required, got {}", i + 1, describe(a)));
                };
                sets.push(items.clone());
            }
            let result = if name == "setunion" {
                sets.into_iter().flatten().collect()
            } else {
                let mut iter = sets.into_iter();
                let first = iter.next().unwrap_or_default();
                let rest: Vec<Vec<Value>> = iter.map(unify).collect();
                let first = unify(first);
                first.into_iter().filter(|v| rest.iter().all(|s| s.iter().any(|w| values_equal(v, w)))).collect()
            };
            Ok(Value::Array(set_of(result)))
        }
        "setproduct" => setproduct(&args),
        _ => unreachable!("{name} is not a collection function"),
    }
}

/// A list's elements converted to one type where cty would: a list mixing
/// strings, numbers and bools is a list of strings.
pub(crate) fn unify(items: Vec<Value>) -> Vec<Value> {
    let primitive = |v: &Value| matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null);
    let kind = |v: &Value| std::mem::discriminant(v);
    let mut kinds = items.iter().filter(|v| !matches!(v, Value::Null)).map(kind);
    let first = kinds.next();
    let mixed = first.is_some_and(|f| kinds.any(|k| k != f));
    if !mixed || !items.iter().all(primitive) {
        return items;
    }
    items.into_iter().map(|v| as_string(&v).map_or(v, Value::String)).collect()
}

fn dedup(items: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    for v in items {
        if !out.iter().any(|o| values_equal(o, &v)) {
            out.push(v);
        }
    }
    out
}

/// A list as a cty set: unified, without duplicates, in cty's set order.
pub(crate) fn set_of(items: Vec<Value>) -> Vec<Value> {
    let mut out = dedup(unify(items));
    out.sort_by(set_order);
    out
}

fn set_order(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => x.as_f64().partial_cmp(&y.as_f64()).unwrap_or(Ordering::Equal),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        // Nulls after everything else; other kinds keep their order (the sort is stable).
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Greater,
        (_, Value::Null) => Ordering::Less,
        _ => Ordering::Equal,
    }
}

fn flatten_into(items: &[Value], out: &mut Vec<Value>, depth: usize) -> Result<(), String> {
    if depth > 64 {
        return Err("lists are nested too deeply".to_string());
    }
    for item in items {
        match item {
            Value::Array(inner) => flatten_into(inner, out, depth + 1)?,
            other => out.push(other.clone()),
        }
    }
    Ok(())
}

fn range(args: &[Value]) -> Result<Value, String> {
    if args.is_empty() || args.len() > 3 {
        return Err("must have one, two, or three arguments".to_string());
    }
    let nums = args.iter().map(float_arg).collect::<Result<Vec<_>, _>>()?;
    let (start, end, step) = match nums.as_slice() {
        [end] => (0.0, *end, 1.0),
        [start, end] => (*start, *end, if end >= start { 1.0 } else { -1.0 }),
        [start, end, step] => (*start, *end, *step),
        _ => unreachable!("checked above"),
    };
    if step == 0.0 {
        return Err("step must not be zero".to_string());
    }
    if step < 0.0 && end > start {
        return Err("end must be less than start when step is negative".to_string());
    }
    if step > 0.0 && end < start {
        return Err("end must be greater than start when step is positive".to_string());
    }
    let mut out = Vec::new();
    loop {
        // start + i*step rather than repeated addition, so 0.1 steps do not drift.
        let v = start + step * out.len() as f64;
        if (step > 0.0 && v >= end) || (step < 0.0 && v <= end) {
            break;
        }
        if out.len() >= MAX_RANGE {
            return Err("more than 1024 values were generated; either decrease the difference between start and end or use a smaller step"
                .to_string());
        }
        out.push(Value::Number(number_from_f64(v).ok_or("range value is not finite")?));
    }
    Ok(Value::Array(out))
}

fn slice(args: &[Value]) -> Result<Value, String> {
    arity(args, 3, 3)?;
    let Value::Array(list) = &args[0] else { return Err("must be a list or tuple value".to_string()) };
    let start = whole(&args[1]).map_err(|e| format!("invalid start index: {e}"))?;
    let end = whole(&args[2]).map_err(|e| format!("invalid end index: {e}"))?;
    let len = list.len() as i64;
    if start < 0 {
        return Err("start index must not be less than zero".to_string());
    }
    if start > len {
        return Err("start index must not be greater than the length of the list".to_string());
    }
    if end < 0 {
        return Err("end index must not be less than zero".to_string());
    }
    if end > len {
        return Err("end index must not be greater than the length of the list".to_string());
    }
    if start > end {
        return Err("start index must not be greater than end index".to_string());
    }
    Ok(Value::Array(list[start as usize..end as usize].to_vec()))
}

fn setproduct(args: &[Value]) -> Result<Value, String> {
    if args.len() < 2 {
        return Err("at least two arguments are required".to_string());
    }
    let mut lists = Vec::with_capacity(args.len());
    let mut total: usize = 1;
    for (i, a) in args.iter().enumerate() {
        let Value::Array(items) = a else { return Err(format!("argument {}: a set or a list is required", i + 1)) };
        total = total.saturating_mul(items.len());
        lists.push(unify(items.clone()));
    }
    if total.saturating_mul(args.len()) > MAX_PRODUCT {
        return Err(format!(
            "the product would have {total} combinations of {} elements; at most {MAX_PRODUCT} elements are allowed",
            args.len()
        ));
    }
    let mut out: Vec<Vec<Value>> = vec![Vec::new()];
    for list in &lists {
        let mut next = Vec::with_capacity(out.len() * list.len());
        for prefix in &out {
            for item in list {
                let mut combination = prefix.clone();
                combination.push(item.clone());
                next.push(combination);
            }
        }
        out = next;
    }
    Ok(Value::Array(out.into_iter().map(Value::Array).collect()))
}
