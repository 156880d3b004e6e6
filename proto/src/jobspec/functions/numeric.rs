//! Number functions (go-cty's stdlib). Whole numbers stay exact.

use hcl::Value;

use super::{arity, float_arg, string_arg, whole};
use crate::jobspec::eval::{as_number, describe, integer_of, number_from_f64};

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "abs" => number_fn(args, f64::abs),
        "ceil" => number_fn(args, f64::ceil),
        "floor" => number_fn(args, f64::floor),
        "signum" => number_fn(args, |f| if f == 0.0 { 0.0 } else { f.signum() }),
        "log" => {
            arity(args, 2, 2)?;
            let (n, base) = (float_arg(&args[0])?, float_arg(&args[1])?);
            finite(n.ln() / base.ln())
        }
        "pow" => {
            arity(args, 2, 2)?;
            let (a, b) = (float_arg(&args[0])?, float_arg(&args[1])?);
            finite(a.powf(b))
        }
        "max" | "min" => {
            if args.is_empty() {
                return Err("must pass at least one number".to_string());
            }
            let mut best = None;
            for v in args {
                let n = as_number(v).ok_or_else(|| format!("a number is required, got {}", describe(v)))?;
                let x = n.as_f64().unwrap_or(f64::NAN);
                let better = match best {
                    None => true,
                    Some((_, y)) => (name == "max" && x > y) || (name == "min" && x < y),
                };
                if better {
                    best = Some((n, x));
                }
            }
            Ok(Value::Number(best.map(|(n, _)| n).expect("at least one argument")))
        }
        "parseint" => parseint(args),
        _ => unreachable!("{name} is not a number function"),
    }
}

fn finite(f: f64) -> Result<Value, String> {
    number_from_f64(f).map(Value::Number).ok_or_else(|| "the result is not a finite number".to_string())
}

fn number_fn(args: &[Value], f: impl Fn(f64) -> f64) -> Result<Value, String> {
    arity(args, 1, 1)?;
    let n = as_number(&args[0]).ok_or_else(|| format!("a number is required, got {}", describe(&args[0])))?;
    if let Some(i) = integer_of(&n) {
        // abs/ceil/floor/signum of an integer is an integer; keep it exact.
        let r = f(i as f64);
        if r.abs() < 9.0e15 {
            return Ok(Value::from(r as i64));
        }
    }
    finite(f(float_arg(&args[0])?))
}

/// Go's `big.Int.SetString(s, base)`: an optional sign, then digits of the base; for bases above
/// 36 lower-case letters are 10-35 and upper-case 36-61, below that letters are case-insensitive.
fn parseint(args: &[Value]) -> Result<Value, String> {
    arity(args, 2, 2)?;
    let Value::String(s) = &args[0] else { return Err(format!("first argument must be a string, not {}", describe(&args[0]))) };
    let base = whole(&args[1])?;
    if !(2..=62).contains(&base) {
        return Err("base must be a whole number between 2 and 62 inclusive".to_string());
    }
    let bad = || format!("cannot parse {} as a base {base} integer", super::encoding::json_text(&Value::String(s.clone())));
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s.as_str()),
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let mut n: i128 = 0;
    for c in digits.chars() {
        let d = match c {
            '0'..='9' => c as i64 - '0' as i64,
            'a'..='z' => c as i64 - 'a' as i64 + 10,
            'A'..='Z' if base <= 36 => c as i64 - 'A' as i64 + 10,
            'A'..='Z' => c as i64 - 'A' as i64 + 36,
            _ => return Err(bad()),
        };
        if d >= base {
            return Err(bad());
        }
        n = n
            .checked_mul(base as i128)
            .and_then(|n| n.checked_add(d as i128))
            .filter(|n| *n <= i64::MAX as i128 + 1)
            .ok_or_else(|| format!("{} does not fit in a 64-bit integer", string_arg(&args[0]).unwrap_or_default()))?;
    }
    let n = if negative { -n } else { n };
    i64::try_from(n).map(Value::from).map_err(|_| format!("{s} does not fit in a 64-bit integer"))
}
