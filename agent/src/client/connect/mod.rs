//! Consul Connect on the client: what a Connect task needs besides its driver.
//!
//! - [`bootstrap`]: the Envoy bootstrap, made natively as `consul connect envoy -bootstrap`
//!   makes it (no Consul binary on the hosts);
//! - [`proxy`]: what an Envoy task is started with (its service, proxy ID, listener binds and
//!   variables, the gRPC address), from the alloc alone;
//! - [`socket_proxy`]: the unix socket in an alloc dir that reaches Consul from a network
//!   namespace;
//! - [`default_node_meta`]: the node meta the injected tasks' images and arguments come from.
//!
//! The hooks using them: `taskrunner/hooks/envoy_version.rs`, `envoy_bootstrap.rs` and
//! `allocrunner/hooks/consul_socket.rs`.

pub mod bootstrap;
pub mod proxy;
pub mod socket_proxy;

use std::collections::BTreeMap;

/// The image Nomad's injected sidecars and gateways run by default; `${NOMAD_envoy_version}`
/// becomes the version Consul prefers (the `envoy_version` hook).
pub const ENVOY_IMAGE_FORMAT: &str = "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}";

/// Nomad's client node meta defaults for Connect (`client.go` `setupNode`), each unless the
/// operator set it: the sidecar and gateway images, Envoy's log level and concurrency, which the
/// servers' job mutator writes into injected tasks as `${meta.connect.*}`.
pub fn default_node_meta(meta: &mut BTreeMap<String, String>) {
    for (k, v) in [
        ("connect.sidecar_image", ENVOY_IMAGE_FORMAT),
        ("connect.gateway_image", ENVOY_IMAGE_FORMAT),
        ("connect.log_level", "info"),
        ("connect.proxy_concurrency", "1"),
    ] {
        meta.entry(k.to_string()).or_insert_with(|| v.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_meta_defaults_fill_only_what_the_operator_left_unset() {
        let mut meta = BTreeMap::from([("connect.log_level".to_string(), "debug".to_string()), ("rack".to_string(), "r1".to_string())]);
        default_node_meta(&mut meta);
        assert_eq!(meta["connect.sidecar_image"], "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}");
        assert_eq!(meta["connect.gateway_image"], "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}");
        assert_eq!(meta["connect.log_level"], "debug", "the operator's value stays");
        assert_eq!(meta["connect.proxy_concurrency"], "1");
        assert_eq!(meta["rack"], "r1");
        assert_eq!(meta.len(), 5);
    }
}
