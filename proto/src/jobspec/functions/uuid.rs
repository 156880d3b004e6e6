//! `uuidv4` and `uuidv5` (go-cty-funcs on google/uuid).

use hcl::Value;
use uuid::Uuid;

use super::{arity, strings};

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "uuidv4" => {
            arity(args, 0, 0)?;
            Ok(Value::String(Uuid::new_v4().to_string()))
        }
        "uuidv5" => {
            let [namespace, name] = strings::<2>(args)?;
            let ns = match namespace.as_str() {
                "dns" => Uuid::NAMESPACE_DNS,
                "url" => Uuid::NAMESPACE_URL,
                "oid" => Uuid::NAMESPACE_OID,
                "x500" => Uuid::NAMESPACE_X500,
                other => Uuid::parse_str(other).map_err(|e| format!("uuidv5() doesn't support namespace {other} ({e})"))?,
            };
            Ok(Value::String(Uuid::new_v5(&ns, name.as_bytes()).to_string()))
        }
        _ => unreachable!("{name} is not a uuid function"),
    }
}
