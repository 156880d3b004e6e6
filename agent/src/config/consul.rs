//! The agent's `consul {}` block, resolved with Nomad's defaults
//! (`nomad/structs/config/consul.go` `DefaultConsulConfig`, v1.6.1).
//!
//! As Nomad's Consul client does (`consul/api.DefaultConfig`), unset keys fall back to
//! `CONSUL_HTTP_ADDR`, `CONSUL_HTTP_TOKEN`, `CONSUL_HTTP_AUTH`, `CONSUL_HTTP_SSL` and
//! `CONSUL_NAMESPACE`, then to the defaults. TLS to Consul is not built, so `ssl = true` (or an
//! `https://` address) and the TLS file keys are refused rather than ignored.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::file::DurationValue;

/// `consul {}` as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsulBlock {
    pub server_service_name: Option<String>,
    pub server_http_check_name: Option<String>,
    pub server_serf_check_name: Option<String>,
    pub server_rpc_check_name: Option<String>,
    pub client_service_name: Option<String>,
    pub client_http_check_name: Option<String>,
    pub tags: Option<Vec<String>>,
    pub auto_advertise: Option<bool>,
    pub checks_use_advertise: Option<bool>,
    pub address: Option<String>,
    pub grpc_address: Option<String>,
    pub timeout: Option<DurationValue>,
    pub token: Option<String>,
    pub allow_unauthenticated: Option<bool>,
    /// `user:password` for HTTP basic auth.
    pub auth: Option<String>,
    pub ssl: Option<bool>,
    pub share_ssl: Option<bool>,
    pub verify_ssl: Option<bool>,
    pub grpc_ca_file: Option<String>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub server_auto_join: Option<bool>,
    pub client_auto_join: Option<bool>,
    pub namespace: Option<String>,
}

/// The resolved Consul settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsulSettings {
    /// Consul's HTTP API, `host:port` (default `127.0.0.1:8500`).
    pub address: String,
    /// Consul's gRPC (xDS) address for Envoy; empty when unset (Nomad then derives it from the
    /// fingerprinted `consul.grpc` port).
    pub grpc_address: String,
    /// `X-Consul-Token` on every call; empty for none. A token is also Nomad's only sign that
    /// Consul ACLs are on (it gates Service Identity tokens).
    pub token: String,
    /// HTTP basic auth, `(user, password)`.
    pub auth: Option<(String, String)>,
    /// Consul Enterprise namespace for the agent's own calls; empty for the default.
    pub namespace: String,
    /// Bound on every HTTP call to Consul (`timeout`, default 5 s).
    pub timeout: Duration,
    pub auto_advertise: bool,
    pub checks_use_advertise: bool,
    pub server_service_name: String,
    pub server_http_check_name: String,
    pub server_serf_check_name: String,
    pub server_rpc_check_name: String,
    pub client_service_name: String,
    pub client_http_check_name: String,
    /// Tags added to the agent's own `nomad`/`nomad-client` registrations.
    pub tags: Vec<String>,
    /// Whether jobs may use Consul without the submitter giving a Consul token.
    pub allow_unauthenticated: bool,
    /// Accepted with Nomad's default; joining servers through Consul is not built.
    pub server_auto_join: bool,
    /// Accepted with Nomad's default; joining servers through Consul is not built.
    pub client_auto_join: bool,
}

impl Default for ConsulSettings {
    fn default() -> Self {
        ConsulSettings::resolve(None, |_| None).expect("the defaults are valid")
    }
}

/// The default Consul HTTP address (`consul/api.DefaultConfig`).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:8500";

impl ConsulSettings {
    /// Resolves the block: the file, then `env` (Consul's `CONSUL_*` variables), then defaults.
    pub fn resolve(block: Option<ConsulBlock>, env: impl Fn(&str) -> Option<String>) -> Result<ConsulSettings, ConfigError> {
        let invalid =
            |key: &str, message: String| ConfigError::Invalid { path: "agent configuration".into(), key: format!("consul.{key}"), message };
        let b = block.unwrap_or_default();
        let env = |k: &str| env(k).filter(|v| !v.is_empty());

        let env_ssl = match env("CONSUL_HTTP_SSL") {
            None => None,
            Some(v) => Some(parse_go_bool(&v).ok_or_else(|| invalid("ssl", format!("CONSUL_HTTP_SSL={v:?} is not a boolean")))?),
        };
        let ssl = b.ssl.or(env_ssl).unwrap_or(false);
        let raw_address = b.address.or_else(|| env("CONSUL_HTTP_ADDR")).unwrap_or_else(|| DEFAULT_ADDRESS.into());
        let (address, https) = parse_address(&raw_address).map_err(|m| invalid("address", m))?;
        if ssl || https {
            return Err(invalid("ssl", "TLS to Consul is not built in nomad-rs yet; use ssl = false and an http address".into()));
        }
        for (key, value) in
            [("ca_file", &b.ca_file), ("cert_file", &b.cert_file), ("key_file", &b.key_file), ("grpc_ca_file", &b.grpc_ca_file)]
        {
            if value.as_deref().is_some_and(|v| !v.is_empty()) {
                return Err(invalid(key, "TLS to Consul is not built in nomad-rs yet, so TLS files cannot be used; remove the key".into()));
            }
        }
        let grpc_address = match b.grpc_address {
            Some(g) if !g.is_empty() => parse_address(&g).map_err(|m| invalid("grpc_address", m))?.0,
            _ => String::new(),
        };
        let auth = match b.auth.or_else(|| env("CONSUL_HTTP_AUTH")) {
            None => None,
            Some(a) => match a.split_once(':') {
                Some((u, p)) => Some((u.to_string(), p.to_string())),
                None => Some((a, String::new())),
            },
        };
        let timeout = b.timeout.map_or(Duration::from_secs(5), |d| d.0);
        if timeout.is_zero() {
            return Err(invalid("timeout", "must be greater than zero".into()));
        }
        let name = |v: Option<String>, default: &str| v.filter(|s| !s.is_empty()).unwrap_or_else(|| default.to_string());
        Ok(ConsulSettings {
            address,
            grpc_address,
            token: b.token.filter(|t| !t.is_empty()).or_else(|| env("CONSUL_HTTP_TOKEN")).unwrap_or_default(),
            auth,
            namespace: b.namespace.filter(|n| !n.is_empty()).or_else(|| env("CONSUL_NAMESPACE")).unwrap_or_default(),
            timeout,
            auto_advertise: b.auto_advertise.unwrap_or(true),
            checks_use_advertise: b.checks_use_advertise.unwrap_or(false),
            server_service_name: name(b.server_service_name, "nomad"),
            server_http_check_name: name(b.server_http_check_name, "Nomad Server HTTP Check"),
            server_serf_check_name: name(b.server_serf_check_name, "Nomad Server Serf Check"),
            server_rpc_check_name: name(b.server_rpc_check_name, "Nomad Server RPC Check"),
            client_service_name: name(b.client_service_name, "nomad-client"),
            client_http_check_name: name(b.client_http_check_name, "Nomad Client HTTP Check"),
            tags: b.tags.unwrap_or_default(),
            allow_unauthenticated: b.allow_unauthenticated.unwrap_or(true),
            server_auto_join: b.server_auto_join.unwrap_or(true),
            client_auto_join: b.client_auto_join.unwrap_or(true),
        })
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `host:port`, `http://host:port` or `https://host:port` → (`host:port`, whether https).
fn parse_address(raw: &str) -> Result<(String, bool), String> {
    let raw = raw.trim();
    if raw.contains("{{") {
        return Err(format!("{raw:?}: go-sockaddr templates are not supported; give host:port"));
    }
    if raw.starts_with("unix://") {
        return Err(format!("{raw:?}: unix sockets are not supported; give host:port"));
    }
    let (rest, https) = match raw.split_once("://") {
        Some(("http", r)) => (r, false),
        Some(("https", r)) => (r, true),
        Some((scheme, _)) => return Err(format!("{raw:?}: unknown scheme {scheme:?}; use host:port")),
        None => (raw, false),
    };
    let rest = rest.trim_end_matches('/');
    let port_ok = rest.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !port_ok || rest.contains('/') {
        return Err(format!("{raw:?} is not host:port"));
    }
    Ok((rest.to_string(), https))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(src: &str) -> ConsulBlock {
        let v: serde_json::Value = hcl::from_str(src).expect("hcl");
        serde_json::from_value(v).expect("block")
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults_are_nomads() {
        let s = ConsulSettings::resolve(None, no_env).unwrap();
        assert_eq!(s.address, "127.0.0.1:8500");
        assert_eq!(s.grpc_address, "");
        assert_eq!(s.token, "");
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert!(s.auto_advertise && s.allow_unauthenticated && s.server_auto_join && s.client_auto_join);
        assert!(!s.checks_use_advertise);
        assert_eq!(s.server_service_name, "nomad");
        assert_eq!(s.client_service_name, "nomad-client");
        assert_eq!(s.server_http_check_name, "Nomad Server HTTP Check");
        assert_eq!(s.server_serf_check_name, "Nomad Server Serf Check");
        assert_eq!(s.server_rpc_check_name, "Nomad Server RPC Check");
        assert_eq!(s.client_http_check_name, "Nomad Client HTTP Check");
        assert!(s.tags.is_empty());
        assert_eq!(s, ConsulSettings::default());
    }

    #[test]
    fn the_block_beats_the_environment_which_beats_defaults() {
        let env = |k: &str| match k {
            "CONSUL_HTTP_ADDR" => Some("http://10.0.0.1:8500".to_string()),
            "CONSUL_HTTP_TOKEN" => Some("env-token".to_string()),
            "CONSUL_NAMESPACE" => Some("env-ns".to_string()),
            _ => None,
        };
        let s = ConsulSettings::resolve(None, env).unwrap();
        assert_eq!((s.address.as_str(), s.token.as_str(), s.namespace.as_str()), ("10.0.0.1:8500", "env-token", "env-ns"));
        let b = block(
            r#"
            address = "consul.service:8501"
            grpc_address = "127.0.0.1:8502"
            token = "file-token"
            namespace = "apps"
            auto_advertise = false
            server_service_name = "nomad-srv"
            client_service_name = "nomad-cli"
            tags = ["a", "b"]
            allow_unauthenticated = false
            timeout = "2s"
            auth = "user:pass"
            ssl = false
            verify_ssl = true
            "#,
        );
        let s = ConsulSettings::resolve(Some(b), env).unwrap();
        assert_eq!(s.address, "consul.service:8501");
        assert_eq!(s.grpc_address, "127.0.0.1:8502");
        assert_eq!(s.token, "file-token");
        assert_eq!(s.namespace, "apps");
        assert!(!s.auto_advertise && !s.allow_unauthenticated);
        assert_eq!((s.server_service_name.as_str(), s.client_service_name.as_str()), ("nomad-srv", "nomad-cli"));
        assert_eq!(s.tags, ["a", "b"]);
        assert_eq!(s.timeout, Duration::from_secs(2));
        assert_eq!(s.auth, Some(("user".into(), "pass".into())));
    }

    #[test]
    fn tls_and_bad_addresses_are_refused_by_name() {
        let err = |src: &str| ConsulSettings::resolve(Some(block(src)), no_env).unwrap_err().to_string();
        assert_eq!(
            err("ssl = true"),
            "agent configuration: consul.ssl: TLS to Consul is not built in nomad-rs yet; use ssl = false and an http address"
        );
        assert!(err(r#"address = "https://127.0.0.1:8501""#).contains("consul.ssl: TLS to Consul is not built"));
        assert!(err(r#"ca_file = "/etc/ca.pem""#).contains("consul.ca_file: TLS to Consul is not built"));
        assert!(err(r#"address = "nohost""#).contains("consul.address: \"nohost\" is not host:port"));
        assert!(err(r#"address = "{{ GetInterfaceIP \"eth0\" }}:8500""#).contains("go-sockaddr templates are not supported"));
        assert!(err(r#"timeout = "0s""#).contains("consul.timeout: must be greater than zero"));
        let ssl_env = |k: &str| (k == "CONSUL_HTTP_SSL").then(|| "true".to_string());
        assert!(ConsulSettings::resolve(None, ssl_env).is_err(), "CONSUL_HTTP_SSL=true is refused too");
        let v: serde_json::Value = hcl::from_str("adress = \"x\"").unwrap();
        assert!(serde_json::from_value::<ConsulBlock>(v).unwrap_err().to_string().contains("unknown field `adress`"));
    }

    #[test]
    fn a_config_file_typo_names_the_consul_key() {
        let v = crate::config::file::parse_str("consul {\n  adress = \"127.0.0.1:8500\"\n}\n", std::path::Path::new("agent.hcl")).unwrap();
        let e = crate::config::file::decode(v, "agent.hcl").unwrap_err().to_string();
        assert!(e.starts_with("agent.hcl: consul.adress: unknown field `adress`"), "{e}");
    }
}
