//! The agent's own Consul services (`consul { auto_advertise = true }`, the default), as
//! Nomad's `agent.go` `setupServer`/`setupClient` and `ServiceClient.RegisterAgent` build them:
//!
//! - a client registers `client_service_name` ("nomad-client") with tag `http` at its
//!   advertised HTTP address, checked by `client_http_check_name` over
//!   `GET /v1/agent/health?type=client`;
//! - a server registers `server_service_name` ("nomad") twice: tag `http` (checked over
//!   `/v1/agent/health?type=server`) and tag `rpc` (a tcp check of the RPC address). Nomad also
//!   registers a third, tag `serf`, for its gossip port; nomad-rs servers have no Serf, so
//!   that one is not registered (a service whose check could only be critical would mislead).
//!
//! `consul.tags` are appended to Nomad's own tag on each. IDs are Nomad's:
//! `_nomad-<role>-<base32 of Service.Hash(role, "", false)>`, and the checks'
//! `_nomad-check-<hash>`, so a Consul that held a Go Nomad agent's services sees the same ones.
//! The services go through the agent's Consul sync loop like the allocs' (registered when
//! missing or drifted); its reconcile never removes agent services.

use std::time::Duration;

use nomad_proto::service::ServiceCheck as JobCheck;
use sha1::{Digest, Sha1};

use super::services::check_id;
use super::{ServiceCheck, ServiceRegistration};
use crate::cli::format::go_duration;
use crate::config::consul::ConsulSettings;

/// Nomad's `agentHttpCheckInterval` / `agentHttpCheckTimeout`.
const HTTP_CHECK_INTERVAL: Duration = Duration::from_secs(10);
const HTTP_CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// Nomad's `serverRpcCheckInterval` / `serverRpcCheckTimeout`.
const RPC_CHECK_INTERVAL: Duration = Duration::from_secs(10);
const RPC_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Which role registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }
}

/// Where the agent is reached: advertised addresses (the services) and the addresses its own
/// checks probe (bound, unless `checks_use_advertise`), each `host:port`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentAddrs {
    pub http_advertise: String,
    pub http_check: String,
    pub rpc_advertise: String,
    pub rpc_check: String,
}

/// Go's `base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567")` without padding (a SHA-1 is
/// 160 bits: 32 characters, none needed).
fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(bytes.len().div_ceil(5) * 8);
    let (mut buffer, mut bits) = (0u64, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u64::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buffer >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buffer << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// Nomad's `Service.Hash(role, "", false)` for an agent service: only the name, the port label
/// (the address itself) and the tags are set; empty maps print as Go's `map[]`.
fn agent_service_id(role: Role, name: &str, port_label: &str, tags: &[String]) -> String {
    let mut h = Sha1::new();
    for s in [role.as_str(), "", name, port_label, "", ""] {
        h.update(s.as_bytes());
    }
    for t in tags {
        h.update(t.as_bytes());
    }
    // CanaryTags (none), Canary and EnableTagOverride (false: nothing), Meta, CanaryMeta,
    // TaggedAddresses (empty maps), Connect (none), OnUpdate and Namespace (empty).
    h.update(b"map[]map[]map[]");
    format!("_nomad-{}-{}", role.as_str(), base32_lower(&h.finalize()))
}

fn split_host_port(addr: &str) -> Option<(String, i64)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some((host.trim_start_matches('[').trim_end_matches(']').to_string(), i64::from(port)))
}

/// One agent service with its checks (Nomad's `RegisterAgent`).
fn service(role: Role, name: &str, addr: &str, tag: &str, extra: &[String], checks: Vec<JobCheck>) -> Option<ServiceRegistration> {
    let (host, port) = split_host_port(addr)?;
    let tags: Vec<String> = std::iter::once(tag.to_string()).chain(extra.iter().cloned()).collect();
    let id = agent_service_id(role, name, addr, &tags);
    let checks = checks
        .iter()
        .filter_map(|c| {
            let (chost, cport) = split_host_port(&c.port_label)?;
            let hp = if chost.contains(':') { format!("[{chost}]:{cport}") } else { format!("{chost}:{cport}") };
            let mut out = ServiceCheck {
                check_id: check_id(&id, c),
                name: c.name.clone(),
                interval: go_duration(c.interval),
                timeout: go_duration(c.timeout),
                ..ServiceCheck::default()
            };
            match c.check_type.as_str() {
                "http" => out.http = format!("{}://{hp}{}", c.protocol, c.path),
                _ => out.tcp = hp,
            }
            Some(out)
        })
        .collect();
    Some(ServiceRegistration {
        id,
        name: name.to_string(),
        tags,
        port,
        address: host,
        meta: [("external-source".to_string(), "nomad".to_string())].into(),
        checks,
        ..ServiceRegistration::default()
    })
}

fn ns(d: Duration) -> i64 {
    d.as_nanos() as i64
}

/// The agent's registrations for `role` (nothing when `auto_advertise` is off, or for an
/// address that is not `host:port`).
pub fn agent_registrations(settings: &ConsulSettings, role: Role, addrs: &AgentAddrs) -> Vec<ServiceRegistration> {
    if !settings.auto_advertise {
        return Vec::new();
    }
    let (name, http_check_name, health_type) = match role {
        Role::Client => (&settings.client_service_name, &settings.client_http_check_name, "client"),
        Role::Server => (&settings.server_service_name, &settings.server_http_check_name, "server"),
    };
    let pick = |check: &str, advertise: &str| if settings.checks_use_advertise { advertise.to_string() } else { check.to_string() };
    let http_check = JobCheck {
        name: http_check_name.clone(),
        check_type: "http".into(),
        path: format!("/v1/agent/health?type={health_type}"),
        protocol: "http".into(),
        interval: ns(HTTP_CHECK_INTERVAL),
        timeout: ns(HTTP_CHECK_TIMEOUT),
        port_label: pick(&addrs.http_check, &addrs.http_advertise),
        ..JobCheck::default()
    };
    let mut out = Vec::new();
    if role == Role::Server {
        let rpc_check = JobCheck {
            name: settings.server_rpc_check_name.clone(),
            check_type: "tcp".into(),
            interval: ns(RPC_CHECK_INTERVAL),
            timeout: ns(RPC_CHECK_TIMEOUT),
            port_label: pick(&addrs.rpc_check, &addrs.rpc_advertise),
            ..JobCheck::default()
        };
        out.extend(service(role, name, &addrs.rpc_advertise, "rpc", &settings.tags, vec![rpc_check]));
    }
    out.extend(service(role, name, &addrs.http_advertise, "http", &settings.tags, vec![http_check]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> AgentAddrs {
        AgentAddrs {
            http_advertise: "10.0.0.7:4646".into(),
            http_check: "0.0.0.0:4646".into(),
            rpc_advertise: "10.0.0.7:4647".into(),
            rpc_check: "0.0.0.0:4647".into(),
        }
    }

    #[test]
    fn base32_is_gos_lowercase_alphabet() {
        // RFC 4648 test vectors, lowercased and unpadded.
        assert_eq!(base32_lower(b"f"), "my");
        assert_eq!(base32_lower(b"foobar"), "mzxw6ytboi");
        assert_eq!(base32_lower(&[0u8; 20]).len(), 32);
    }

    #[test]
    fn a_client_advertises_nomad_client_with_its_http_check_and_the_agents_tags_appended() {
        let mut s = ConsulSettings { tags: vec!["edge".into(), "dc-a".into()], ..ConsulSettings::default() };
        let regs = agent_registrations(&s, Role::Client, &addrs());
        assert_eq!(regs.len(), 1);
        let r = &regs[0];
        assert!(r.id.starts_with("_nomad-client-") && r.id.len() == "_nomad-client-".len() + 32, "{}", r.id);
        assert_eq!((r.name.as_str(), r.address.as_str(), r.port), ("nomad-client", "10.0.0.7", 4646));
        assert_eq!(r.tags, ["http", "edge", "dc-a"]);
        assert_eq!(r.meta["external-source"], "nomad");
        let c = &r.checks[0];
        assert_eq!(c.name, "Nomad Client HTTP Check");
        assert_eq!(c.http, "http://0.0.0.0:4646/v1/agent/health?type=client");
        assert_eq!((c.interval.as_str(), c.timeout.as_str()), ("10s", "5s"));
        assert!(c.check_id.starts_with("_nomad-check-"));
        // The ID follows the service's content, as Nomad's hash does.
        s.tags.push("more".into());
        assert_ne!(agent_registrations(&s, Role::Client, &addrs())[0].id, r.id);
        s.checks_use_advertise = true;
        assert_eq!(agent_registrations(&s, Role::Client, &addrs())[0].checks[0].http, "http://10.0.0.7:4646/v1/agent/health?type=client");
        s.auto_advertise = false;
        assert!(agent_registrations(&s, Role::Client, &addrs()).is_empty());
    }

    #[test]
    fn a_server_advertises_rpc_and_http() {
        let regs = agent_registrations(&ConsulSettings::default(), Role::Server, &addrs());
        let tags: Vec<&str> = regs.iter().map(|r| r.tags[0].as_str()).collect();
        assert_eq!(tags, ["rpc", "http"]);
        assert!(regs.iter().all(|r| r.name == "nomad" && r.id.starts_with("_nomad-server-")));
        assert_eq!(regs[0].port, 4647);
        assert_eq!((regs[0].checks[0].name.as_str(), regs[0].checks[0].tcp.as_str()), ("Nomad Server RPC Check", "0.0.0.0:4647"));
        assert_eq!(regs[0].checks[0].timeout, "3s");
        assert_eq!(regs[1].checks[0].http, "http://0.0.0.0:4646/v1/agent/health?type=server");
        assert_eq!(regs[1].checks[0].name, "Nomad Server HTTP Check");
        assert_ne!(regs[0].id, regs[1].id);
    }
}
