//! Consul's request decoding rules, as a schema walk over JSON.
//!
//! Consul decodes bodies with Go's `encoding/json` and `DisallowUnknownFields`: keys match a
//! struct's field names case-insensitively (an exact match wins), `null` leaves the zero value,
//! an unknown key is `json: unknown field "X"` and a wrong JSON type is
//! `json: cannot unmarshal <json type> into Go struct field <Struct>.<Field> of type <go type>`.
//! [`decode`] checks a body against a [`Shape`] and returns it with every key rewritten to the
//! field's own spelling, so the handlers read fields by their Go names.

use serde_json::{Map, Value};

/// The Go type a JSON value decodes into.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    Str,
    Int,
    Bool,
    /// `interface{}` (or a type the stand-in does not look inside).
    Any,
    List(&'static Shape),
    /// `map[string]T`.
    Map(&'static Shape),
    /// A struct: its Go name and fields.
    Obj(&'static str, &'static [(&'static str, Shape)]),
    /// A struct that refers to itself (`SidecarService` is an `AgentServiceRegistration`).
    Lazy(fn() -> &'static Shape),
}

impl Shape {
    fn go_type(&self) -> String {
        match self {
            Shape::Str => "string".into(),
            Shape::Int => "int".into(),
            Shape::Bool => "bool".into(),
            Shape::Any => "interface {}".into(),
            Shape::List(s) => format!("[]{}", s.go_type()),
            Shape::Map(s) => format!("map[string]{}", s.go_type()),
            Shape::Obj(name, _) => format!("api.{name}"),
            Shape::Lazy(f) => f().go_type(),
        }
    }
}

fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => "string".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
    }
}

/// Checks `body` against `shape`; the error is Consul's 400 body text.
pub fn decode(body: &[u8], shape: &Shape) -> Result<Value, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("Request decode failed: {e}"))?;
    walk(value, shape, None).map_err(|e| format!("Request decode failed: json: {e}"))
}

/// `field` is `Struct.Field` for the error text.
fn walk(value: Value, shape: &Shape, field: Option<&str>) -> Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    let mismatch = |v: &Value| match field {
        Some(f) => format!("cannot unmarshal {} into Go struct field {f} of type {}", json_type(v), shape.go_type()),
        None => format!("cannot unmarshal {} into Go value of type {}", json_type(v), shape.go_type()),
    };
    match shape {
        Shape::Any => Ok(value),
        Shape::Lazy(f) => walk(value, f(), field),
        Shape::Str if value.is_string() => Ok(value),
        Shape::Bool if value.is_boolean() => Ok(value),
        Shape::Int if value.is_i64() || value.is_u64() => Ok(value),
        Shape::List(item) => match value {
            Value::Array(items) => Ok(Value::Array(items.into_iter().map(|v| walk(v, item, field)).collect::<Result<_, _>>()?)),
            other => Err(mismatch(&other)),
        },
        Shape::Map(item) => match value {
            Value::Object(map) => {
                Ok(Value::Object(map.into_iter().map(|(k, v)| Ok((k, walk(v, item, field)?))).collect::<Result<Map<_, _>, String>>()?))
            }
            other => Err(mismatch(&other)),
        },
        Shape::Obj(name, fields) => match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (key, v) in map {
                    let known =
                        fields.iter().find(|(f, _)| *f == key).or_else(|| fields.iter().find(|(f, _)| f.eq_ignore_ascii_case(&key)));
                    let Some((canonical, sub)) = known else {
                        return Err(format!("unknown field \"{key}\""));
                    };
                    let v = walk(v, sub, Some(&format!("{name}.{canonical}")))?;
                    if !v.is_null() {
                        out.insert((*canonical).to_string(), v);
                    }
                }
                Ok(Value::Object(out))
            }
            other => Err(mismatch(&other)),
        },
        _ => Err(mismatch(&value)),
    }
}

/// Config entries are decoded differently (`agent/config_endpoint.go` `ConfigApply` →
/// `structs.DecodeConfigEntry`): mapstructure, whose unused keys become a multierror of
/// `invalid config key "Services[0].Port"`, all behind `Request decoding failed: `.
pub fn decode_config_entry(raw: &Value, shape: &Shape) -> Result<Value, String> {
    let mut unknown = Vec::new();
    unknown_keys(raw, shape, "", &mut unknown);
    if !unknown.is_empty() {
        let n = unknown.len();
        let items: String = unknown.iter().map(|k| format!("\t* invalid config key \"{k}\"\n")).collect();
        let head = if n == 1 { "1 error occurred:".to_string() } else { format!("{n} errors occurred:") };
        return Err(format!("Request decoding failed: {head}\n{items}\n"));
    }
    walk(raw.clone(), shape, None).map_err(|e| format!("Request decoding failed: {e}"))
}

fn unknown_keys(v: &Value, shape: &Shape, prefix: &str, out: &mut Vec<String>) {
    match (shape, v) {
        (Shape::Lazy(f), _) => unknown_keys(v, f(), prefix, out),
        (Shape::List(item), Value::Array(items)) => {
            for (i, x) in items.iter().enumerate() {
                unknown_keys(x, item, &format!("{prefix}[{i}]"), out);
            }
        }
        (Shape::Map(item), Value::Object(map)) => {
            for (k, x) in map {
                unknown_keys(x, item, &format!("{prefix}[{k}]"), out);
            }
        }
        (Shape::Obj(_, fields), Value::Object(map)) => {
            for (k, x) in map {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match fields.iter().find(|(f, _)| f.eq_ignore_ascii_case(k)) {
                    Some((_, sub)) => unknown_keys(x, sub, &path, out),
                    None => out.push(path),
                }
            }
        }
        _ => {}
    }
}

// The request shapes, field for field from Consul's `api` package (v1.16): `api/agent.go`
// (AgentServiceRegistration, AgentServiceCheck, AgentServiceConnect,
// AgentServiceConnectProxyConfig, Upstream), `api/connect.go`-era `MeshGatewayConfig` and
// `ExposeConfig` (in `api/config_entry.go`), `api/acl.go` (ACLToken and its links), and
// `api/agent.go` `checkUpdate` for check updates.

pub const SERVICE_ADDRESS: Shape = Shape::Obj("ServiceAddress", &[("Address", Shape::Str), ("Port", Shape::Int)]);
pub const WEIGHTS: Shape = Shape::Obj("AgentWeights", &[("Passing", Shape::Int), ("Warning", Shape::Int)]);
pub const MESH_GATEWAY: Shape = Shape::Obj("MeshGatewayConfig", &[("Mode", Shape::Str)]);
pub const EXPOSE_PATH: Shape = Shape::Obj(
    "ExposePath",
    &[
        ("ListenerPort", Shape::Int),
        ("Path", Shape::Str),
        ("LocalPathPort", Shape::Int),
        ("Protocol", Shape::Str),
        ("ParsedFromCheck", Shape::Bool),
    ],
);
pub const EXPOSE: Shape = Shape::Obj("ExposeConfig", &[("Checks", Shape::Bool), ("Paths", Shape::List(&EXPOSE_PATH))]);
pub const UPSTREAM: Shape = Shape::Obj(
    "Upstream",
    &[
        ("DestinationType", Shape::Str),
        ("DestinationPartition", Shape::Str),
        ("DestinationNamespace", Shape::Str),
        ("DestinationPeer", Shape::Str),
        ("DestinationName", Shape::Str),
        ("Datacenter", Shape::Str),
        ("LocalBindAddress", Shape::Str),
        ("LocalBindPort", Shape::Int),
        ("LocalBindSocketPath", Shape::Str),
        ("LocalBindSocketMode", Shape::Str),
        ("Config", Shape::Map(&Shape::Any)),
        ("MeshGateway", MESH_GATEWAY),
        ("CentrallyConfigured", Shape::Bool),
    ],
);
pub const PROXY: Shape = Shape::Obj(
    "AgentServiceConnectProxyConfig",
    &[
        ("EnvoyExtensions", Shape::List(&Shape::Any)),
        ("DestinationServiceName", Shape::Str),
        ("DestinationServiceID", Shape::Str),
        ("LocalServiceAddress", Shape::Str),
        ("LocalServicePort", Shape::Int),
        ("LocalServiceSocketPath", Shape::Str),
        ("Mode", Shape::Str),
        ("TransparentProxy", Shape::Any),
        ("Config", Shape::Map(&Shape::Any)),
        ("Upstreams", Shape::List(&UPSTREAM)),
        ("MeshGateway", MESH_GATEWAY),
        ("Expose", EXPOSE),
        ("AccessLogs", Shape::Any),
    ],
);
pub const CHECK: Shape = Shape::Obj(
    "AgentServiceCheck",
    &[
        ("CheckID", Shape::Str),
        ("Name", Shape::Str),
        ("ScriptArgs", Shape::List(&Shape::Str)),
        ("DockerContainerID", Shape::Str),
        ("Shell", Shape::Str),
        ("Interval", Shape::Str),
        ("Timeout", Shape::Str),
        ("TTL", Shape::Str),
        ("HTTP", Shape::Str),
        ("Header", Shape::Map(&Shape::List(&Shape::Str))),
        ("Method", Shape::Str),
        ("Body", Shape::Str),
        ("TCP", Shape::Str),
        ("UDP", Shape::Str),
        ("Status", Shape::Str),
        ("Notes", Shape::Str),
        ("TLSServerName", Shape::Str),
        ("TLSSkipVerify", Shape::Bool),
        ("GRPC", Shape::Str),
        ("GRPCUseTLS", Shape::Bool),
        ("H2PING", Shape::Str),
        ("H2PingUseTLS", Shape::Bool),
        ("AliasNode", Shape::Str),
        ("AliasService", Shape::Str),
        ("SuccessBeforePassing", Shape::Int),
        ("FailuresBeforeWarning", Shape::Int),
        ("FailuresBeforeCritical", Shape::Int),
        ("DeregisterCriticalServiceAfter", Shape::Str),
    ],
);
pub const CONNECT: Shape =
    Shape::Obj("AgentServiceConnect", &[("Native", Shape::Bool), ("SidecarService", Shape::Lazy(service_registration))]);
pub const SERVICE_REGISTRATION: Shape = Shape::Obj(
    "AgentServiceRegistration",
    &[
        ("Kind", Shape::Str),
        ("ID", Shape::Str),
        ("Name", Shape::Str),
        ("Tags", Shape::List(&Shape::Str)),
        ("Port", Shape::Int),
        ("Address", Shape::Str),
        ("SocketPath", Shape::Str),
        ("TaggedAddresses", Shape::Map(&SERVICE_ADDRESS)),
        ("EnableTagOverride", Shape::Bool),
        ("Meta", Shape::Map(&Shape::Str)),
        ("Weights", WEIGHTS),
        ("Check", CHECK),
        ("Checks", Shape::List(&CHECK)),
        ("Proxy", PROXY),
        ("Connect", CONNECT),
        ("Namespace", Shape::Str),
        ("Partition", Shape::Str),
        ("Locality", Shape::Any),
    ],
);

fn service_registration() -> &'static Shape {
    &SERVICE_REGISTRATION
}

/// `api/agent.go` `checkUpdate`.
pub const CHECK_UPDATE: Shape = Shape::Obj("checkUpdate", &[("Status", Shape::Str), ("Output", Shape::Str)]);

pub const LINK: Shape = Shape::Obj("ACLTokenPolicyLink", &[("ID", Shape::Str), ("Name", Shape::Str)]);
pub const SERVICE_IDENTITY: Shape =
    Shape::Obj("ACLServiceIdentity", &[("ServiceName", Shape::Str), ("Datacenters", Shape::List(&Shape::Str))]);
pub const NODE_IDENTITY: Shape = Shape::Obj("ACLNodeIdentity", &[("NodeName", Shape::Str), ("Datacenter", Shape::Str)]);
/// `api/acl.go` `ACLToken` (what `PUT /v1/acl/token` accepts).
pub const ACL_TOKEN: Shape = Shape::Obj(
    "ACLToken",
    &[
        ("CreateIndex", Shape::Int),
        ("ModifyIndex", Shape::Int),
        ("AccessorID", Shape::Str),
        ("SecretID", Shape::Str),
        ("Description", Shape::Str),
        ("Policies", Shape::List(&LINK)),
        ("Roles", Shape::List(&LINK)),
        ("ServiceIdentities", Shape::List(&SERVICE_IDENTITY)),
        ("NodeIdentities", Shape::List(&NODE_IDENTITY)),
        ("TemplatedPolicies", Shape::Any),
        ("Local", Shape::Bool),
        ("AuthMethod", Shape::Str),
        // `time.Duration` in the api package (nanoseconds); the server also takes "1h".
        ("ExpirationTTL", Shape::Any),
        ("ExpirationTime", Shape::Str),
        ("CreateTime", Shape::Str),
        ("Hash", Shape::Any),
        ("Legacy", Shape::Bool),
        ("Rules", Shape::Str),
        ("Namespace", Shape::Str),
        ("Partition", Shape::Str),
        ("AuthMethodNamespace", Shape::Str),
    ],
);

pub const TERMINATING_SERVICE: Shape = Shape::Obj(
    "LinkedService",
    &[
        ("Namespace", Shape::Str),
        ("Partition", Shape::Str),
        ("Name", Shape::Str),
        ("CAFile", Shape::Str),
        ("CertFile", Shape::Str),
        ("KeyFile", Shape::Str),
        ("SNI", Shape::Str),
    ],
);
/// `api/config_entry_gateways.go` `TerminatingGatewayConfigEntry`.
pub const TERMINATING_GATEWAY: Shape = Shape::Obj(
    "TerminatingGatewayConfigEntry",
    &[
        ("Kind", Shape::Str),
        ("Name", Shape::Str),
        ("Services", Shape::List(&TERMINATING_SERVICE)),
        ("Meta", Shape::Map(&Shape::Str)),
        ("CreateIndex", Shape::Int),
        ("ModifyIndex", Shape::Int),
        ("Partition", Shape::Str),
        ("Namespace", Shape::Str),
    ],
);
/// `api/config_entry_gateways.go` `IngressGatewayConfigEntry` (listeners not looked inside).
pub const INGRESS_GATEWAY: Shape = Shape::Obj(
    "IngressGatewayConfigEntry",
    &[
        ("Kind", Shape::Str),
        ("Name", Shape::Str),
        ("Partition", Shape::Str),
        ("Namespace", Shape::Str),
        ("TLS", Shape::Any),
        ("Listeners", Shape::List(&Shape::Any)),
        ("Meta", Shape::Map(&Shape::Str)),
        ("Defaults", Shape::Any),
        ("CreateIndex", Shape::Int),
        ("ModifyIndex", Shape::Int),
    ],
);
/// `api/config_entry.go` `ServiceConfigEntry` (nested blocks not looked inside).
pub const SERVICE_DEFAULTS: Shape = Shape::Obj(
    "ServiceConfigEntry",
    &[
        ("Kind", Shape::Str),
        ("Name", Shape::Str),
        ("Partition", Shape::Str),
        ("Namespace", Shape::Str),
        ("Protocol", Shape::Str),
        ("Mode", Shape::Str),
        ("TransparentProxy", Shape::Any),
        ("MutualTLSMode", Shape::Str),
        ("MeshGateway", MESH_GATEWAY),
        ("Expose", EXPOSE),
        ("ExternalSNI", Shape::Str),
        ("UpstreamConfig", Shape::Any),
        ("Destination", Shape::Any),
        ("MaxInboundConnections", Shape::Int),
        ("LocalConnectTimeoutMs", Shape::Int),
        ("LocalRequestTimeoutMs", Shape::Int),
        ("BalanceInboundConnections", Shape::Str),
        ("EnvoyExtensions", Shape::List(&Shape::Any)),
        ("Meta", Shape::Map(&Shape::Str)),
        ("CreateIndex", Shape::Int),
        ("ModifyIndex", Shape::Int),
    ],
);
/// `api/config_entry.go` `ProxyConfigEntry` (nested blocks not looked inside).
pub const PROXY_DEFAULTS: Shape = Shape::Obj(
    "ProxyConfigEntry",
    &[
        ("Kind", Shape::Str),
        ("Name", Shape::Str),
        ("Partition", Shape::Str),
        ("Namespace", Shape::Str),
        ("Mode", Shape::Str),
        ("TransparentProxy", Shape::Any),
        ("MutualTLSMode", Shape::Str),
        ("Config", Shape::Map(&Shape::Any)),
        ("MeshGateway", MESH_GATEWAY),
        ("Expose", EXPOSE),
        ("AccessLogs", Shape::Any),
        ("EnvoyExtensions", Shape::List(&Shape::Any)),
        ("FailoverPolicy", Shape::Any),
        ("PrioritizeByLocality", Shape::Any),
        ("Meta", Shape::Map(&Shape::Str)),
        ("CreateIndex", Shape::Int),
        ("ModifyIndex", Shape::Int),
    ],
);

/// The shape of a config entry of `kind`, or Consul's error for an unknown kind.
pub fn config_entry_shape(kind: &str) -> Result<&'static Shape, String> {
    match kind {
        "terminating-gateway" => Ok(&TERMINATING_GATEWAY),
        "ingress-gateway" => Ok(&INGRESS_GATEWAY),
        "service-defaults" => Ok(&SERVICE_DEFAULTS),
        "proxy-defaults" => Ok(&PROXY_DEFAULTS),
        other => Err(format!("invalid config entry kind: {other}")),
    }
}
