//! Consul: `consul.server`, `consul.version`, `consul.sku`, `consul.revision`,
//! `unique.consul.name`, `consul.datacenter`, `consul.segment`, `consul.connect`, `consul.grpc`,
//! `consul.ft.namespaces`, and the node link `consul` = `<dc>.<name>`, read from the local
//! Consul agent's `/v1/agent/self` (Nomad's `client/fingerprint/consul.go`, v1.6.1).
//!
//! Unlike the host fingerprinters this one talks to a service, so it is async and runs again
//! every [`CONSUL_FINGERPRINT_PERIOD`] (Nomad's period). When Consul cannot be reached its
//! attributes are removed from the node, so the servers stop placing work that needs Consul
//! there; Nomad 1.6 left the stale ones in place.

use std::collections::BTreeMap;
use std::time::Duration;

use nomad_proto::Node;
use serde_json::Value;

use crate::client::consul::ConsulApi;

/// How often Consul is fingerprinted again (Nomad: `Periodic() = (true, 15s)`).
pub const CONSUL_FINGERPRINT_PERIOD: Duration = Duration::from_secs(15);

/// What one fingerprint found: the attributes and the `consul` link, or nothing (unreachable).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConsulFingerprint {
    pub attributes: BTreeMap<String, String>,
    /// `<datacenter>.<node name>`, when both were read.
    pub link: Option<String>,
}

/// Reads `/v1/agent/self`; the error says why Consul could not be read (the caller logs it
/// once per change).
pub async fn fingerprint_consul(api: &dyn ConsulApi, https: bool) -> Result<ConsulFingerprint, String> {
    let info = api.agent_self().await.map_err(|e| e.to_string())?;
    Ok(extract(&info, https))
}

fn text(info: &Value, section: &str, key: &str) -> Option<String> {
    info.get(section)?.get(key)?.as_str().map(str::to_string)
}

fn flag(info: &Value, section: &str, key: &str) -> Option<String> {
    info.get(section)?.get(key)?.as_bool().map(|b| b.to_string())
}

fn port(info: &Value, key: &str) -> Option<String> {
    let n = info.get("DebugConfig")?.get(key)?.as_f64()?;
    Some(format!("{}", n as i64))
}

/// The leading `major.minor.patch` of a Consul version (`1.16.1+ent`, `1.9.0-beta1`).
fn core_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Nomad's extractors over a `/v1/agent/self` answer. An attribute whose field is missing or
/// of the wrong type is left out, as Nomad leaves it out (with a warning).
pub fn extract(info: &Value, https: bool) -> ConsulFingerprint {
    let mut attrs = BTreeMap::new();
    let mut put = |k: &str, v: Option<String>| match v {
        Some(v) => {
            attrs.insert(k.to_string(), v);
        }
        None => tracing::warn!(attribute = k, "unable to fingerprint consul"),
    };
    let version = text(info, "Config", "Version");
    put("consul.server", flag(info, "Config", "Server"));
    put("consul.version", version.clone());
    // `agentconsul.SKU`: `+ent` in the version means Enterprise.
    put("consul.sku", version.as_ref().map(|v| if v.contains("+ent") { "ent".to_string() } else { "oss".to_string() }));
    put("consul.revision", text(info, "Config", "Revision"));
    put("unique.consul.name", text(info, "Config", "NodeName"));
    put("consul.datacenter", text(info, "Config", "Datacenter"));
    put(
        "consul.segment",
        info.get("Member").and_then(|m| m.get("Tags")).and_then(|t| t.get("segment")).and_then(Value::as_str).map(String::from),
    );
    put("consul.connect", flag(info, "DebugConfig", "ConnectEnabled"));
    // Since Consul 1.14 the plaintext and TLS gRPC ports are separate; before, one port.
    let grpc = match version.as_deref().and_then(core_version) {
        None => None,
        Some(v) if v < (1, 14, 0) => port(info, "GRPCPort"),
        Some(_) if https => port(info, "GRPCTLSPort"),
        Some(_) => port(info, "GRPCPort"),
    };
    put("consul.grpc", grpc);
    // `agentconsul.Namespaces`: the Enterprise license lists the feature.
    let namespaces = info
        .get("Stats")
        .and_then(|s| s.get("license"))
        .and_then(|l| l.get("features"))
        .and_then(Value::as_str)
        .is_some_and(|f| f.split(',').any(|x| x.trim() == "Namespaces"));
    put("consul.ft.namespaces", Some(namespaces.to_string()));
    let link = match (attrs.get("consul.datacenter"), attrs.get("unique.consul.name")) {
        (Some(dc), Some(name)) => Some(format!("{dc}.{name}")),
        _ => None,
    };
    ConsulFingerprint { attributes: attrs, link }
}

/// Whether an attribute is one this fingerprinter owns.
fn is_consul_attr(k: &str) -> bool {
    k.starts_with("consul.") || k.starts_with("unique.consul.")
}

/// Puts a fingerprint on the node (or, with `None`, takes every Consul attribute and the link
/// off). Returns whether the node changed.
pub fn apply_consul(node: &mut Node, fp: Option<&ConsulFingerprint>) -> bool {
    let before: BTreeMap<&String, &String> = node.attributes.iter().filter(|(k, _)| is_consul_attr(k)).collect();
    let after: BTreeMap<&String, &String> = fp.map(|f| f.attributes.iter().collect()).unwrap_or_default();
    let link = fp.and_then(|f| f.link.clone());
    if before == after && node.links.get("consul") == link.as_ref() {
        return false;
    }
    node.attributes.retain(|k, _| !is_consul_attr(k));
    if let Some(f) = fp {
        node.attributes.extend(f.attributes.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    match link {
        Some(l) => {
            node.links.insert("consul".into(), l);
        }
        None => {
            node.links.remove("consul");
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
    use serde_json::json;

    use super::*;
    use crate::client::consul::ConsulClient;
    use crate::config::consul::ConsulSettings;

    fn client(standin: &ConsulStandIn) -> ConsulClient {
        ConsulClient::new(&ConsulSettings {
            address: standin.addr().to_string(),
            timeout: Duration::from_secs(5),
            ..ConsulSettings::default()
        })
    }

    #[tokio::test]
    async fn attributes_follow_the_consul_agent() {
        let standin = ConsulStandIn::start(ConsulOptions { segment: Some("alpha".into()), ..Default::default() }).unwrap();
        let api = client(&standin);
        let fp = fingerprint_consul(&api, false).await.unwrap();
        let expected: BTreeMap<String, String> = [
            ("consul.server", "true"),
            ("consul.version", "1.16.1"),
            ("consul.sku", "oss"),
            ("consul.revision", "e0ab4d29"),
            ("unique.consul.name", "consul-standin"),
            ("consul.datacenter", "dc1"),
            ("consul.segment", "alpha"),
            ("consul.connect", "true"),
            ("consul.grpc", "8502"),
            ("consul.ft.namespaces", "false"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(fp.attributes, expected);
        assert_eq!(fp.link.as_deref(), Some("dc1.consul-standin"));

        let mut node = Node::default();
        node.attributes.insert("kernel.name".into(), "linux".into());
        assert!(apply_consul(&mut node, Some(&fp)));
        assert_eq!(node.attributes["consul.version"], "1.16.1");
        assert!(!apply_consul(&mut node, Some(&fp)), "the same fingerprint is not a change");

        // An upgrade changes the node.
        standin.set_version("1.17.0");
        let upgraded = fingerprint_consul(&api, false).await.unwrap();
        assert!(apply_consul(&mut node, Some(&upgraded)));
        assert_eq!(node.attributes["consul.version"], "1.17.0");

        // Consul goes away: every Consul attribute and the link go with it, nothing else.
        standin.stop();
        let err = fingerprint_consul(&api, false).await.unwrap_err();
        assert!(err.starts_with(&format!("Get http://{}/v1/agent/self: ", standin.addr())), "{err}");
        assert!(apply_consul(&mut node, None));
        assert!(node.attributes.keys().all(|k| !k.contains("consul")), "{:?}", node.attributes);
        assert!(!node.links.contains_key("consul"));
        assert_eq!(node.attributes["kernel.name"], "linux");

        // And back.
        standin.restart().unwrap();
        assert!(apply_consul(&mut node, Some(&fingerprint_consul(&api, false).await.unwrap())));
        assert_eq!(node.attributes["unique.consul.name"], "consul-standin");
    }

    #[test]
    fn grpc_port_rules_follow_the_version_and_scheme() {
        let info = |v: &str| json!({"Config": {"Version": v}, "DebugConfig": {"GRPCPort": 8502, "GRPCTLSPort": 8503}});
        assert_eq!(extract(&info("1.13.9"), true).attributes["consul.grpc"], "8502", "one port before 1.14");
        assert_eq!(extract(&info("1.14.0"), true).attributes["consul.grpc"], "8503");
        assert_eq!(extract(&info("1.16.1+ent"), false).attributes["consul.grpc"], "8502");
        assert_eq!(extract(&info("1.16.1+ent"), false).attributes["consul.sku"], "ent");
        assert!(!extract(&info("garbage"), false).attributes.contains_key("consul.grpc"));
        let missing = extract(&json!({"Config": {}}), false);
        assert!(!missing.attributes.contains_key("consul.version") && missing.link.is_none());
        let ent = json!({"Config": {"Version": "1.16.1+ent"}, "Stats": {"license": {"features": "Automated Backups, Namespaces"}}});
        assert_eq!(extract(&ent, false).attributes["consul.ft.namespaces"], "true");
    }
}
