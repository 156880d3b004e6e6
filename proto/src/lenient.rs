//! Request decoding with Go's `encoding/json` manners.
//!
//! Nomad's HTTP API decodes request bodies with Go's standard library, so
//! clients in the wild rely on two habits of it:
//! - object keys match struct fields case-insensitively (`"id"`, `"Id"` and
//!   `"ID"` all fill `ID`), and unknown keys are ignored;
//! - `null` is accepted anywhere and leaves the zero value.
//!
//! [`from_slice`] gives serde-derived types the same manners by walking a
//! parsed [`Value`]: when a struct is asked for, each key is renamed to the
//! field it matches ignoring ASCII case and `null` members are dropped (so
//! the field's default applies); a `null` where a string, number, list or map
//! is expected becomes the empty value. Errors carry the JSON path.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A request body that could not be decoded into the expected shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Where in the document the problem is (`Job.TaskGroups[0].Count`), empty at the top.
    pub path: String,
    /// What was wrong.
    pub message: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() || self.path == "." { write!(f, "{}", self.message) } else { write!(f, "{}: {}", self.path, self.message) }
    }
}

impl std::error::Error for DecodeError {}

/// Deepest nesting of arrays and objects a request body may have.
///
/// What a caller sends is stored wrapped in more levels (a job inside a Raft log entry or a
/// snapshot, inside an alloc, inside an RPC reply), and every one of those is decoded again
/// with serde_json's limit of 128 levels. Refusing requests past 64 keeps 64 levels for the
/// wrapping, so nothing accepted can become a log entry, snapshot or reply that no longer
/// decodes. Nomad's own job, node and alloc shapes need about 12.
pub const MAX_REQUEST_DEPTH: usize = 64;

/// Refuses JSON nested deeper than `max` levels, by one pass over the bytes (no allocation,
/// nothing parsed), so the check costs less than the parse it guards. Brackets inside strings
/// do not count; malformed JSON is left for the parser to report.
pub fn check_depth(bytes: &[u8], max: usize) -> Result<(), DecodeError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return Err(DecodeError {
                        path: String::new(),
                        message: format!("invalid JSON: arrays and objects nest deeper than {max} levels"),
                    });
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Decodes a request body with Go's case-insensitive, null-tolerant rules; bodies nested
/// deeper than [`MAX_REQUEST_DEPTH`] are refused before they are parsed.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    check_depth(bytes, MAX_REQUEST_DEPTH)?;
    from_trusted_slice(bytes)
}

/// Decodes with the same rules as [`from_slice`] but without its depth limit (serde_json's own
/// limit of 128 levels still applies): for replies from a server, which nest deeper than the
/// requests they were made from (an alloc carries its job).
pub fn from_trusted_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| DecodeError { path: String::new(), message: format!("invalid JSON: {e}") })?;
    from_value(value)
}

/// Decodes an already parsed JSON value with the same rules as [`from_slice`].
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(Lenient(value)).map_err(|e| DecodeError { path: e.path().to_string(), message: e.inner().to_string() })
}

/// A [`Value`] that deserializes with Go's manners.
struct Lenient(Value);

fn rename_for_struct(map: Map<String, Value>, fields: &'static [&'static str]) -> Map<String, Value> {
    let mut out = Map::with_capacity(map.len());
    // Exact matches first, so `{"ID":1,"id":2}` keeps the exact key as Go does.
    let mut rest = Vec::new();
    for (k, v) in map {
        if v.is_null() {
            continue;
        }
        if fields.contains(&k.as_str()) {
            out.insert(k, v);
        } else {
            rest.push((k, v));
        }
    }
    for (k, v) in rest {
        // Unknown keys are dropped: Go ignores them, and types that keep
        // extra keys (flatten) are not used for request bodies.
        if let Some(f) = fields.iter().find(|f| f.eq_ignore_ascii_case(&k))
            && !out.contains_key(*f)
        {
            out.insert((*f).to_string(), v);
        }
    }
    out
}

struct LenientMap {
    iter: serde_json::map::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for LenientMap {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        match self.iter.next() {
            Some((k, v)) => {
                self.value = Some(v);
                seed.deserialize(k.into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let v = self.value.take().unwrap_or(Value::Null);
        seed.deserialize(Lenient(v))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct LenientSeq {
    iter: std::vec::IntoIter<Value>,
}

impl<'de> SeqAccess<'de> for LenientSeq {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Self::Error> {
        match self.iter.next() {
            Some(v) => seed.deserialize(Lenient(v)).map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

fn visit_object<'de, V: Visitor<'de>>(m: Map<String, Value>, visitor: V) -> Result<V::Value, serde_json::Error> {
    visitor.visit_map(LenientMap { iter: m.into_iter(), value: None })
}

fn visit_array<'de, V: Visitor<'de>>(a: Vec<Value>, visitor: V) -> Result<V::Value, serde_json::Error> {
    visitor.visit_seq(LenientSeq { iter: a.into_iter() })
}

macro_rules! null_is_zero {
    ($($method:ident => $zero:expr),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                match self.0 {
                    Value::Null => $zero(visitor),
                    other => other.$method(visitor),
                }
            }
        )*
    };
}

impl<'de> Deserializer<'de> for Lenient {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(m) => visit_object(m, visitor),
            Value::Array(a) => visit_array(a, visitor),
            other => other.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(Lenient(other)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(m) => visit_object(rename_for_struct(m, fields), visitor),
            Value::Null => visit_object(Map::new(), visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
        }
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(m) => visit_object(m, visitor),
            Value::Null => visit_object(Map::new(), visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(a) => visit_array(a, visitor),
            Value::Null => visit_array(Vec::new(), visitor),
            other => Err(de::Error::invalid_type(unexpected(&other), &visitor)),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _name: &'static str, _len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_identifier(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_unit()
    }

    null_is_zero! {
        deserialize_bool => |v: V| v.visit_bool(false),
        deserialize_i8 => |v: V| v.visit_i64(0),
        deserialize_i16 => |v: V| v.visit_i64(0),
        deserialize_i32 => |v: V| v.visit_i64(0),
        deserialize_i64 => |v: V| v.visit_i64(0),
        deserialize_u8 => |v: V| v.visit_u64(0),
        deserialize_u16 => |v: V| v.visit_u64(0),
        deserialize_u32 => |v: V| v.visit_u64(0),
        deserialize_u64 => |v: V| v.visit_u64(0),
        deserialize_f32 => |v: V| v.visit_f64(0.0),
        deserialize_f64 => |v: V| v.visit_f64(0.0),
        deserialize_char => |v: V| v.visit_str(""),
        deserialize_str => |v: V| v.visit_str(""),
        deserialize_string => |v: V| v.visit_string(String::new()),
        deserialize_bytes => |v: V| v.visit_bytes(&[]),
        deserialize_byte_buf => |v: V| v.visit_byte_buf(Vec::new()),
        deserialize_unit => |v: V| v.visit_unit(),
    }
}

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => de::Unexpected::Unsigned(u),
            (_, Some(i), _) => de::Unexpected::Signed(i),
            (_, _, Some(f)) => de::Unexpected::Float(f),
            _ => de::Unexpected::Other("number"),
        },
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, Default, PartialEq)]
    #[serde(default, rename_all = "PascalCase")]
    struct Inner {
        #[serde(rename = "ID")]
        id: String,
        count: i64,
        tags: Vec<String>,
        meta: BTreeMap<String, String>,
    }

    #[derive(Debug, Deserialize, Default, PartialEq)]
    #[serde(default, rename_all = "PascalCase")]
    struct Outer {
        name: String,
        inner: Option<Inner>,
        list: Vec<Inner>,
        enabled: bool,
    }

    #[test]
    fn keys_match_case_insensitively_and_unknown_keys_are_ignored() {
        let o: Outer = from_slice(br#"{"name":"a","INNER":{"id":"x","cOuNt":3},"Unknown":1}"#).unwrap();
        assert_eq!(o.name, "a");
        let inner = o.inner.unwrap();
        assert_eq!(inner.id, "x");
        assert_eq!(inner.count, 3);
    }

    #[test]
    fn exact_key_wins_over_case_folded_one() {
        let i: Inner = from_slice(br#"{"id":"folded","ID":"exact"}"#).unwrap();
        assert_eq!(i.id, "exact");
    }

    #[test]
    fn null_is_accepted_anywhere() {
        let o: Outer = from_slice(br#"{"Name":null,"Inner":null,"List":null,"Enabled":null}"#).unwrap();
        assert_eq!(o, Outer::default());
        let i: Inner = from_slice(br#"{"Tags":[null,"a"],"Meta":{"k":null}}"#).unwrap();
        assert_eq!(i.tags, vec!["".to_string(), "a".to_string()]);
        assert_eq!(i.meta.get("k").map(String::as_str), Some(""));
        let top: Outer = from_slice(b"null").unwrap();
        assert_eq!(top, Outer::default());
    }

    #[test]
    fn errors_name_the_path_and_the_problem() {
        let e = from_slice::<Outer>(br#"{"List":[{"Count":"many"}]}"#).unwrap_err();
        assert_eq!(e.path, "List[0].Count");
        assert!(e.message.contains("invalid type: string \"many\""), "{e}");
        let e = from_slice::<Outer>(b"{not json").unwrap_err();
        assert!(e.message.starts_with("invalid JSON"), "{e}");
        let e = from_slice::<Outer>(b"[1,2]").unwrap_err();
        assert!(e.message.contains("invalid type: sequence"), "{e}");
    }

    #[test]
    fn request_bodies_nested_past_the_limit_are_refused_before_parsing() {
        let nested = |n: usize| format!("{{\"Name\":\"a\",\"Meta\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        // 1 level for the body, 1 for each bracket.
        assert!(from_slice::<Value>(nested(MAX_REQUEST_DEPTH - 1).as_bytes()).is_ok());
        for n in [MAX_REQUEST_DEPTH, 100, 100_000] {
            let e = from_slice::<Value>(nested(n).as_bytes()).unwrap_err();
            assert_eq!(e.message, "invalid JSON: arrays and objects nest deeper than 64 levels", "{n}");
        }
        let objects = format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
        assert!(from_slice::<Value>(objects.as_bytes()).unwrap_err().message.contains("nest deeper than 64"));
        // Brackets in strings, escaped quotes included, are text.
        let text = format!("{{\"Name\":\"\\\"{}\"}}", "[{".repeat(1_000));
        let o: Outer = from_slice(text.as_bytes()).unwrap();
        assert!(o.name.starts_with("\"[{"));
        // Replies may nest deeper, up to serde_json's own 128.
        assert!(from_trusted_slice::<Value>(nested(120).as_bytes()).is_ok());
        assert!(from_trusted_slice::<Value>(nested(100_000).as_bytes()).unwrap_err().message.contains("recursion limit"));
    }

    #[test]
    fn a_job_at_the_request_limit_still_decodes_inside_every_wrapper() {
        // The deepest job a caller can register, wrapped the way servers and clients store and
        // send it, must decode with serde_json's default limit.
        let config = format!("{}1{}", "[".repeat(MAX_REQUEST_DEPTH - 7), "]".repeat(MAX_REQUEST_DEPTH - 7));
        let body = format!(r#"{{"Job":{{"ID":"j","TaskGroups":[{{"Name":"g","Tasks":[{{"Name":"t","Config":{{"x":{config}}}}}]}}]}}}}"#);
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Register {
            job: crate::Job,
        }
        let job = from_slice::<Register>(body.as_bytes()).unwrap().job;
        let alloc = crate::Allocation { job: Some(std::sync::Arc::new(job)), ..Default::default() };
        // An RPC reply carrying the alloc, inside 50 more levels of wrapping.
        let reply = serde_json::json!({"a": [{"b": {"Allocs": [alloc]}}]});
        let mut wrapped = reply;
        for _ in 0..50 {
            wrapped = serde_json::json!([wrapped]);
        }
        let text = serde_json::to_string(&wrapped).unwrap();
        assert!(serde_json::from_str::<Value>(&text).is_ok());
    }
}
