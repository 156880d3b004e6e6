//! The server role's Consul calls over [`ConsulClient`]: `nomad_server::consul`'s narrow traits
//! (SI tokens: `PUT /v1/acl/token`, `DELETE /v1/acl/token/:accessor`; gateway config entries:
//! `PUT /v1/config`). Errors keep Consul's status and words.

use futures::future::BoxFuture;
use http::Method;
use nomad_server::consul::config_entries::ConfigEntry;
use nomad_server::consul::{AclTokenCreate, ConsulAcl, ConsulCallError, ConsulConfigEntries, CreatedToken};

use super::{ConsulClient, ConsulError};
use crate::cli::api::encode_path;

/// The servers' handle to Consul.
#[derive(Debug, Clone)]
pub struct ServerConsul(pub ConsulClient);

fn call_error(e: ConsulError) -> ConsulCallError {
    ConsulCallError { status: e.status(), message: e.to_string() }
}

fn encode<T: serde::Serialize>(what: &str, v: &T) -> Result<Vec<u8>, ConsulCallError> {
    serde_json::to_vec(v).map_err(|e| ConsulCallError::unreachable(format!("encoding the {what}: {e}")))
}

impl ConsulAcl for ServerConsul {
    fn create_token(&self, token: AclTokenCreate) -> BoxFuture<'_, Result<CreatedToken, ConsulCallError>> {
        Box::pin(async move {
            let body = encode("token", &token)?;
            // The namespace travels in the body (`ACLToken.Namespace`), as Nomad sends it.
            let bytes = self.0.call_in(Method::PUT, "/v1/acl/token", "", Some(body)).await.map_err(call_error)?;
            let created: CreatedToken = nomad_proto::lenient::from_trusted_slice(&bytes)
                .map_err(|e| ConsulCallError { status: Some(200), message: format!("decoding Consul's token: {e}") })?;
            if created.accessor_id.is_empty() || created.secret_id.is_empty() {
                return Err(ConsulCallError {
                    status: Some(200),
                    message: "Consul answered a token without an AccessorID or SecretID".into(),
                });
            }
            Ok(created)
        })
    }

    fn revoke_token<'a>(&'a self, namespace: &'a str, accessor_id: &'a str) -> BoxFuture<'a, Result<(), ConsulCallError>> {
        Box::pin(async move {
            let path = format!("/v1/acl/token/{}", encode_path(accessor_id));
            self.0.call_in(Method::DELETE, &path, namespace, None).await.map(drop).map_err(call_error)
        })
    }
}

impl ConsulConfigEntries for ServerConsul {
    fn set_config_entry<'a>(&'a self, entry: &'a ConfigEntry) -> BoxFuture<'a, Result<(), ConsulCallError>> {
        Box::pin(async move {
            let body = encode("config entry", entry)?;
            self.0.call_in(Method::PUT, "/v1/config", entry.namespace(), Some(body)).await.map(drop).map_err(call_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
    use nomad_server::consul::AclServiceIdentity;
    use nomad_server::consul::config_entries::{LinkedService, TerminatingGatewayConfigEntry};

    use super::*;
    use crate::config::consul::ConsulSettings;

    fn consul(addr: &str, token: &str) -> ServerConsul {
        let s = ConsulSettings {
            address: addr.to_string(),
            token: token.to_string(),
            timeout: Duration::from_secs(5),
            ..ConsulSettings::default()
        };
        ServerConsul(ConsulClient::new(&s))
    }

    fn si(service: &str) -> AclTokenCreate {
        AclTokenCreate {
            description: "_nomad_si [c] [a] [t]".into(),
            service_identities: vec![AclServiceIdentity { service_name: service.into() }],
            namespace: String::new(),
            local: true,
        }
    }

    #[tokio::test]
    async fn si_tokens_are_created_and_revoked_through_consuls_acl_api() {
        let standin = ConsulStandIn::start(ConsulOptions { management_token: Some("root".into()), ..Default::default() }).unwrap();
        let c = consul(&standin.addr().to_string(), "root");
        let t = c.create_token(si("web")).await.unwrap();
        let body = standin.calls_to("PUT", "/v1/acl/token")[0].json();
        assert_eq!(
            body,
            serde_json::json!({"Description": "_nomad_si [c] [a] [t]", "ServiceIdentities": [{"ServiceName": "web"}], "Local": true})
        );
        // The secret works as a Consul token for the service (and its sidecar) only.
        let as_web = consul(&standin.addr().to_string(), &t.secret_id);
        assert!(as_web.create_token(si("other")).await.unwrap_err().message.contains("403"), "an SI token has no acl:write");

        c.revoke_token("", &t.accessor_id).await.unwrap();
        let again = c.revoke_token("", &t.accessor_id).await.unwrap_err();
        assert!(again.message.contains(nomad_server::consul::revoker::TOKEN_NOT_FOUND), "{again}");
        let bad = c.create_token(si("Not Valid")).await.unwrap_err();
        assert_eq!(bad.status, Some(400), "{bad}");
        let anonymous = consul(&standin.addr().to_string(), "");
        assert_eq!(anonymous.create_token(si("web")).await.unwrap_err().status, Some(403));

        standin.stop();
        let down = c.revoke_token("ns1", &t.accessor_id).await.unwrap_err();
        assert_eq!(down.status, None, "no answer: {down}");
        assert!(down.message.contains("/v1/acl/token/"), "names the call: {down}");
    }

    #[tokio::test]
    async fn a_config_entry_is_written_in_its_namespace_and_read_back_as_consul_keeps_it() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let c = consul(&standin.addr().to_string(), "");
        let entry = ConfigEntry::Terminating(TerminatingGatewayConfigEntry {
            kind: "terminating-gateway".into(),
            name: "gw".into(),
            namespace: "team-a".into(),
            services: vec![LinkedService { name: "billing".into(), sni: "b.internal".into(), ..Default::default() }],
        });
        c.set_config_entry(&entry).await.unwrap();
        let call = &standin.calls_to("PUT", "/v1/config")[0];
        assert_eq!(call.query, "ns=team-a");
        assert_eq!(call.json()["Services"], serde_json::json!([{"Name": "billing", "SNI": "b.internal"}]));
        let stored = c.0.call_in(Method::GET, "/v1/config/terminating-gateway/gw", "", None).await.unwrap();
        let stored: serde_json::Value = serde_json::from_slice(&stored).unwrap();
        assert_eq!(stored["Services"][0]["Name"], "billing");
    }
}
