//! `convert(value, type)` (hcl's typeexpr): the second argument is a type
//! expression (`string`, `list(number)`, `object({a = bool})`, ...), read as
//! a type, not evaluated. `can` and `try` are in `eval.rs`, since they must
//! catch the errors of evaluating their arguments.

use hcl::Value;
use hcl::edit::expr::Expression;

use crate::jobspec::variables::VarType;

/// Converts `value` to the type `type_expr` names, with HCL's conversion rules.
pub(crate) fn convert(value: Value, type_expr: &Expression) -> Result<Value, String> {
    let ty = VarType::parse(type_expr).map_err(|e| format!("invalid type: {e}"))?;
    ty.convert(value)
}
