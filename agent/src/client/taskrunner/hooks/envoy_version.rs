//! `envoy_version`: the Envoy version of a Connect sidecar or gateway image (Nomad's
//! `envoy_version_hook.go`).
//!
//! Given to every task of a sidecar or gateway kind. Before each start, when the task's
//! interpolated `image` still holds `${NOMAD_envoy_version}` (the default image from node meta
//! `connect.sidecar_image` is `docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}`), it asks
//! the local Consul agent which Envoy versions it supports (`GET /v1/agent/self` →
//! `xDS.SupportedProxies.envoy`, most preferred first) and puts the first, as a semantic version
//! without `v`, in its place. The resolved image is kept in the hook's data ([`IMAGE_KEY`]); the
//! task runner gives it to the driver. Nomad's errors, which fail the task: Consul unreachable,
//! an answer of the wrong shape, no versions at all, a version that does not parse.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::{AsyncPrestartHook, HookError, HookRequest, PrestartResponse, TaskHook};
use crate::consul::ConsulApi;

/// The hook's name (part of the on-disk hook state format).
pub const NAME: &str = "envoy_version";
/// The hook data key holding the image with the version put in.
pub const IMAGE_KEY: &str = "image";
/// The pseudo variable Nomad replaces with Consul's preferred Envoy version.
pub const VERSION_VAR: &str = "${NOMAD_envoy_version}";

/// See the module docs.
pub struct EnvoyVersionHook {
    /// The agent's Consul client; `None` when the agent has no Consul.
    consul: Option<Arc<dyn ConsulApi>>,
}

impl EnvoyVersionHook {
    /// A hook asking `consul`.
    pub fn new(consul: Option<Arc<dyn ConsulApi>>) -> EnvoyVersionHook {
        EnvoyVersionHook { consul }
    }

    /// The image with the version put in, when it asks for one.
    async fn resolve(&self, req: &HookRequest<'_>) -> Result<PrestartResponse, HookError> {
        // The image as the task's config interpolates it (`${meta.connect.sidecar_image}`
        // is already the node's value here).
        let Some(image) = req.config.driver_config.get("image").and_then(Value::as_str) else {
            return Ok(PrestartResponse::default());
        };
        if !req.task.uses_connect_sidecar() || !image.contains(VERSION_VAR) {
            return Ok(PrestartResponse::default());
        }
        let retrieving = |e: String| HookError::fatal(format!("error retrieving supported Envoy versions from Consul: {e}"));
        let consul = self.consul.as_ref().ok_or_else(|| retrieving("this client has no Consul configuration".into()))?;
        let agent_self = consul.agent_self().await.map_err(|e| retrieving(e.to_string()))?;
        let supported = supported_proxies(&agent_self).map_err(retrieving)?;
        let resolved = resolve_image(image, &supported)
            .map_err(|e| HookError::fatal(format!("error interpreting desired Envoy version from Consul: {e}")))?;
        tracing::debug!(alloc_id = %req.alloc.id, task = %req.task.name, image = %resolved, "setting task envoy image");
        let mut resp = PrestartResponse::default();
        resp.data.insert(IMAGE_KEY.into(), resolved);
        Ok(resp)
    }
}

/// `xDS.SupportedProxies` of a `/v1/agent/self` answer (Nomad's `ConnectProxies.Proxies`): none
/// from a Consul too old to report it; an error when it is not a map. A proxy whose versions are
/// not a list is left out, and so is any version that is not a string.
pub fn supported_proxies(agent_self: &Value) -> Result<BTreeMap<String, Vec<String>>, String> {
    let Some(proxies) = agent_self.get("xDS").and_then(|x| x.get("SupportedProxies")) else {
        return Ok(BTreeMap::new());
    };
    let Value::Object(map) = proxies else {
        return Err("unexpected SupportedProxies response format from Consul".into());
    };
    Ok(map
        .iter()
        .filter_map(|(k, v)| v.as_array().map(|vs| (k.clone(), vs.iter().filter_map(|v| v.as_str().map(String::from)).collect())))
        .collect())
}

/// A version as go-version prints it (`version.NewVersion(v).String()`): no `v`, at least three
/// numeric segments (missing ones are 0, leading zeros dropped), then `-prerelease` and
/// `+metadata` as given.
pub fn semver(raw: &str) -> Result<String, String> {
    let malformed = || format!("unexpected envoy version format: Malformed version: {raw}");
    let s = raw.strip_prefix('v').unwrap_or(raw);
    let (s, metadata) = match s.split_once('+') {
        Some((v, m)) if !m.is_empty() && m.split('.').all(is_ident) => (v, Some(m)),
        Some(_) => return Err(malformed()),
        None => (s, None),
    };
    let numeric_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (numbers, pre) = s.split_at(numeric_end);
    let pre = pre.strip_prefix('-').unwrap_or(pre);
    if !pre.is_empty() && !pre.split('.').all(is_ident) {
        return Err(malformed());
    }
    let mut segments = Vec::new();
    for part in numbers.split('.') {
        segments.push(part.parse::<u64>().map_err(|_| malformed())?);
    }
    while segments.len() < 3 {
        segments.push(0);
    }
    let mut out = segments.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    if !pre.is_empty() {
        out.push('-');
        out.push_str(pre);
    }
    if let Some(m) = metadata {
        out.push('+');
        out.push_str(m);
    }
    Ok(out)
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '~')
}

/// `image` with [`VERSION_VAR`] replaced by the first supported Envoy version (`tweakImage`).
pub fn resolve_image(image: &str, supported: &BTreeMap<String, Vec<String>>) -> Result<String, String> {
    let Some(first) = supported.get("envoy").and_then(|v| v.first()) else {
        return Err("Consul did not report any supported envoy versions".into());
    };
    Ok(image.replace(VERSION_VAR, &semver(first)?))
}

impl TaskHook for EnvoyVersionHook {
    fn name(&self) -> &'static str {
        NAME
    }
    fn prestart_async(&self) -> Option<&dyn AsyncPrestartHook> {
        Some(self)
    }
}

impl AsyncPrestartHook for EnvoyVersionHook {
    fn prestart<'a>(&'a self, req: &'a HookRequest<'a>) -> BoxFuture<'a, Result<PrestartResponse, HookError>> {
        Box::pin(async move { self.resolve(req).await.map_err(|e| e.as_hook_event(NAME)) })
    }
}

#[cfg(test)]
mod tests {
    use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
    use serde_json::json;

    use super::*;
    use crate::config::consul::ConsulSettings;
    use crate::consul::ConsulClient;

    #[test]
    fn versions_print_as_go_version_does() {
        assert_eq!(semver("1.26.4").unwrap(), "1.26.4");
        assert_eq!(semver("v1.26").unwrap(), "1.26.0");
        assert_eq!(semver("1.026.04").unwrap(), "1.26.4");
        assert_eq!(semver("1.27.0-rc1+build.7").unwrap(), "1.27.0-rc1+build.7");
        assert_eq!(semver("1.27.0beta").unwrap(), "1.27.0-beta");
        assert_eq!(semver("latest").unwrap_err(), "unexpected envoy version format: Malformed version: latest");
        assert!(semver("1..2").is_err());
        assert!(semver("").is_err());
    }

    #[test]
    fn the_first_supported_version_replaces_the_variable() {
        let self_ = json!({"xDS": {"SupportedProxies": {"envoy": ["1.26.4", "1.25.9"], "other": "x"}}});
        let supported = supported_proxies(&self_).unwrap();
        assert_eq!(supported["envoy"], ["1.26.4", "1.25.9"]);
        assert!(!supported.contains_key("other"), "not a list");
        assert_eq!(
            resolve_image("docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}", &supported).unwrap(),
            "docker.io/envoyproxy/envoy:v1.26.4"
        );
        // An old Consul reports nothing: Nomad 1.6 refuses rather than guess.
        let none = supported_proxies(&json!({"Config": {}})).unwrap();
        assert_eq!(resolve_image("e:${NOMAD_envoy_version}", &none).unwrap_err(), "Consul did not report any supported envoy versions");
        assert_eq!(
            supported_proxies(&json!({"xDS": {"SupportedProxies": ["envoy"]}})).unwrap_err(),
            "unexpected SupportedProxies response format from Consul"
        );
    }

    fn sidecar() -> nomad_proto::Task {
        nomad_proto::Task { name: "connect-proxy-web".into(), kind: "connect-proxy:web".into(), ..Default::default() }
    }

    async fn run(hook: &EnvoyVersionHook, task: &nomad_proto::Task, image: &str) -> Result<PrestartResponse, HookError> {
        let alloc = nomad_proto::Allocation::default();
        let mut config = super::super::tests_support::config();
        config.driver_config.insert("image".into(), json!(image));
        let req = HookRequest { alloc: &alloc, task, config: &config, driver: None, secrets_tmpfs: false, previous: None };
        AsyncPrestartHook::prestart(hook, &req).await
    }

    #[tokio::test]
    async fn the_image_gets_consuls_preferred_version_from_agent_self() {
        let standin = ConsulStandIn::start(ConsulOptions::default()).unwrap();
        let settings = ConsulSettings { address: standin.addr().to_string(), ..ConsulSettings::default() };
        let hook = EnvoyVersionHook::new(Some(Arc::new(ConsulClient::new(&settings))));
        let resp = run(&hook, &sidecar(), "docker.io/envoyproxy/envoy:v${NOMAD_envoy_version}").await.unwrap();
        assert_eq!(resp.data[IMAGE_KEY], "docker.io/envoyproxy/envoy:v1.26.4", "the stand-in's first version");
        assert_eq!(standin.calls_to("GET", "/v1/agent/self").len(), 1);

        // A pinned image, or a task that runs no Envoy, is left alone without asking Consul.
        assert!(run(&hook, &sidecar(), "envoyproxy/envoy:v1.25.0").await.unwrap().data.is_empty());
        let app = nomad_proto::Task { name: "app".into(), ..Default::default() };
        assert!(run(&hook, &app, "x:${NOMAD_envoy_version}").await.unwrap().data.is_empty());
        assert_eq!(standin.calls_to("GET", "/v1/agent/self").len(), 1);

        // Consul gone: the task fails with Nomad's text.
        standin.stop();
        let err = run(&hook, &sidecar(), "e:${NOMAD_envoy_version}").await.unwrap_err();
        assert!(!err.recoverable);
        assert!(err.message.starts_with("error retrieving supported Envoy versions from Consul: "), "{}", err.message);
        let event = err.event.as_deref().expect("Nomad's hook event");
        assert_eq!((event.event_type.as_str(), event.fails_task), ("Task hook failed", true));
        assert!(event.message.starts_with("envoy_version: error retrieving"), "{}", event.message);
        let none = EnvoyVersionHook::new(None);
        assert!(run(&none, &sidecar(), "e:${NOMAD_envoy_version}").await.unwrap_err().message.contains("no Consul configuration"));
    }
}
