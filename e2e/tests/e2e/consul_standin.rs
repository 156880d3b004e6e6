//! The Consul stand-in against Consul's published API (v1.16, MPL): every response shape is
//! decoded field by field, with the Consul source each was checked against named at the test.
//! These need no nomad-rs process.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use nomad_e2e::HttpClient;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn, ConsulTarget};
use nomad_testkit::wait_for_blocking;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

fn standin() -> (ConsulStandIn, HttpClient) {
    let s = ConsulStandIn::start(ConsulOptions::default()).expect("start stand-in");
    let c = HttpClient::new(&s.addr().to_string());
    (s, c)
}

fn put(c: &HttpClient, path: &str, body: &Value) -> (u16, String) {
    let r = c.request("PUT", path, Some(body.to_string().as_bytes())).expect("request");
    (r.status, r.text())
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
    k.sort();
    k
}

/// `agent/agent_endpoint.go` `Self` and what Nomad's fingerprinter reads from it
/// (`client/fingerprint/consul.go`): Config.{Datacenter,NodeName,NodeID,Revision,Server,Version},
/// DebugConfig.{ConnectEnabled,GRPCPort,GRPCTLSPort}, Member.Tags, xDS.SupportedProxies.envoy.
/// Runs against a real Consul with `E2E_CONSUL_ADDR` (types only there; values on the stand-in).
#[test]
fn agent_self_has_consuls_shape() {
    let target = ConsulTarget::from_env(ConsulOptions::default()).unwrap();
    let c = HttpClient::new(&target.addr());
    let v = c.get_json(&target.path("/v1/agent/self")).unwrap();
    for k in ["Config", "DebugConfig", "Coord", "Member", "Stats", "Meta", "xDS"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let cfg = &v["Config"];
    for k in ["Datacenter", "NodeName", "NodeID", "Revision", "Version"] {
        assert!(cfg[k].is_string(), "Config.{k} is a string: {cfg}");
    }
    assert!(cfg["Server"].is_boolean());
    assert!(v["DebugConfig"]["ConnectEnabled"].is_boolean());
    assert!(v["DebugConfig"]["GRPCPort"].is_i64() && v["DebugConfig"]["GRPCTLSPort"].is_i64());
    assert!(v["Member"]["Tags"].is_object());
    assert!(v["xDS"]["SupportedProxies"]["envoy"].as_array().unwrap().iter().all(Value::is_string));
    if target.standin().is_none() {
        return;
    }
    assert_eq!(cfg["Datacenter"], "dc1");
    assert_eq!(cfg["NodeName"], "consul-standin");
    assert_eq!(cfg["NodeID"].as_str().unwrap().len(), 36);
    assert_eq!(cfg["Revision"], "e0ab4d29");
    assert_eq!(cfg["Server"], true);
    assert_eq!(cfg["Version"], "1.16.1");
    assert_eq!(v["DebugConfig"]["ConnectEnabled"], true);
    assert_eq!(v["DebugConfig"]["GRPCPort"], 8502);
    assert_eq!(v["DebugConfig"]["GRPCTLSPort"], -1);
    assert!(v["Member"]["Tags"].get("segment").is_none(), "no segment tag outside Enterprise");
}

/// Register, read back and deregister, and the unknown-key refusal: the same on a real Consul
/// (`E2E_CONSUL_ADDR`) and on the stand-in.
#[test]
fn register_read_deregister_on_any_consul() {
    let target = ConsulTarget::from_env(ConsulOptions::default()).unwrap();
    let c = HttpClient::new(&target.addr());
    let id = format!("_nomad-e2e-{}", std::process::id());
    let reg = json!({"ID": id, "Name": "nomad-e2e-probe", "Port": 9999, "Tags": ["e2e"], "Meta": {"external-source": "nomad"},
                     "Checks": [{"CheckID": format!("{id}-ttl"), "Name": "ttl", "TTL": "60s"}]});
    assert_eq!(put(&c, &target.path("/v1/agent/service/register"), &reg).0, 200);
    let svc = c.get_json(&target.path("/v1/agent/services")).unwrap()[&id].clone();
    assert_eq!((svc["Service"].as_str(), svc["Port"].as_i64()), (Some("nomad-e2e-probe"), Some(9999)));
    assert_eq!(svc["Meta"]["external-source"], "nomad");
    let chk = c.get_json(&target.path("/v1/agent/checks")).unwrap()[&format!("{id}-ttl")].clone();
    assert_eq!(
        (chk["Status"].as_str(), chk["Type"].as_str(), chk["ServiceID"].as_str()),
        (Some("critical"), Some("ttl"), Some(id.as_str()))
    );
    let (status, body) = put(&c, &target.path("/v1/agent/service/register"), &json!({"Name": "x", "Bogus": 1}));
    assert_eq!((status, body.as_str()), (400, "Request decode failed: json: unknown field \"Bogus\""));
    assert_eq!(put(&c, &target.path(&format!("/v1/agent/service/deregister/{id}")), &json!(null)).0, 200);
    assert!(c.get_json(&target.path("/v1/agent/services")).unwrap().get(&id).is_none());
}

/// `api/agent.go` `AgentServiceRegistration` in, `AgentService` and `AgentCheck` out; the sidecar
/// expansion follows `agent/sidecar_service.go`.
#[test]
fn register_expands_sidecars_and_lists_services_and_checks() {
    let (s, c) = standin();
    let reg = json!({
        "ID": "_nomad-task-a1-group-web-web-http", "Name": "web", "Tags": ["v1"], "Port": 8080, "Address": "10.0.0.5",
        "Meta": {"external-source": "nomad"}, "TaggedAddresses": {"lan": {"Address": "10.0.0.5", "Port": 8080}},
        "Checks": [{"CheckID": "_nomad-check-abc", "Name": "alive", "TTL": "30s"}],
        "Connect": {"SidecarService": {"Port": 25000, "Proxy": {"Config": {"bind_address": "0.0.0.0"},
            "Upstreams": [{"DestinationName": "db", "LocalBindPort": 5432, "MeshGateway": {"Mode": ""}}]}}}
    });
    assert_eq!(put(&c, "/v1/agent/service/register", &reg), (200, String::new()));
    let services = c.get_json("/v1/agent/services").unwrap();
    assert_eq!(keys(&services), ["_nomad-task-a1-group-web-web-http", "_nomad-task-a1-group-web-web-http-sidecar-proxy"]);
    let web = &services["_nomad-task-a1-group-web-web-http"];
    assert_eq!(
        keys(web),
        ["Address", "Datacenter", "EnableTagOverride", "ID", "Meta", "Port", "Service", "TaggedAddresses", "Tags", "Weights"]
    );
    assert_eq!(web["Service"], "web");
    assert_eq!(web["Tags"], json!(["v1"]));
    assert_eq!(web["Port"], 8080);
    assert_eq!(web["Address"], "10.0.0.5");
    assert_eq!(web["Meta"], json!({"external-source": "nomad"}));
    assert_eq!(web["TaggedAddresses"], json!({"lan": {"Address": "10.0.0.5", "Port": 8080}}));
    assert_eq!(web["Weights"], json!({"Passing": 1, "Warning": 1}));
    let sc = &services["_nomad-task-a1-group-web-web-http-sidecar-proxy"];
    assert_eq!(sc["Kind"], "connect-proxy");
    assert_eq!(sc["Service"], "web-sidecar-proxy");
    assert_eq!(sc["Port"], 25000);
    assert_eq!(sc["Tags"], json!(["v1"]), "tags default to the parent's");
    assert_eq!(sc["Meta"], json!({"external-source": "nomad"}), "so does meta");
    assert_eq!(sc["Address"], "10.0.0.5", "and the address");
    assert_eq!(sc["Proxy"]["DestinationServiceName"], "web");
    assert_eq!(sc["Proxy"]["DestinationServiceID"], "_nomad-task-a1-group-web-web-http");
    assert_eq!(sc["Proxy"]["LocalServiceAddress"], "127.0.0.1");
    assert_eq!(sc["Proxy"]["LocalServicePort"], 8080, "defaults to the parent's port");
    assert_eq!(sc["Proxy"]["Upstreams"][0]["DestinationName"], "db");
    assert_eq!(sc["Proxy"]["Config"]["bind_address"], "0.0.0.0");

    let checks = c.get_json("/v1/agent/checks").unwrap();
    let ttl = &checks["_nomad-check-abc"];
    assert_eq!(
        keys(ttl),
        [
            "CheckID",
            "CreateIndex",
            "Definition",
            "ExposedPort",
            "ModifyIndex",
            "Name",
            "Node",
            "Notes",
            "Output",
            "ServiceID",
            "ServiceName",
            "ServiceTags",
            "Status",
            "Type"
        ]
    );
    assert_eq!(ttl["Status"], "critical", "a check starts critical");
    assert_eq!(ttl["Type"], "ttl");
    assert_eq!(ttl["ServiceID"], "_nomad-task-a1-group-web-web-http");
    assert_eq!(ttl["ServiceName"], "web");
    assert_eq!(ttl["Node"], "consul-standin");
    // The sidecar got Consul's default checks: a TCP listening check and an alias of the parent.
    let sc_checks: Vec<&Value> =
        checks.as_object().unwrap().values().filter(|c| c["ServiceID"] == "_nomad-task-a1-group-web-web-http-sidecar-proxy").collect();
    assert_eq!(sc_checks.len(), 2);
    assert!(
        sc_checks
            .iter()
            .any(|c| c["Name"] == "Connect Sidecar Listening" && c["Type"] == "tcp" && c["Definition"]["TCP"] == "10.0.0.5:25000")
    );
    assert!(sc_checks.iter().any(|c| c["Name"] == "Connect Sidecar Aliasing _nomad-task-a1-group-web-web-http" && c["Type"] == "alias"));
    assert!(s.calls_to("PUT", "/v1/agent/service/register")[0].json()["Connect"]["SidecarService"].is_object(), "calls keep the raw body");

    // Re-registering without the sidecar's port allocates from 21000.
    let mut reg2 = reg.clone();
    reg2["ID"] = json!("other");
    reg2["Checks"] = json!([]);
    reg2["Connect"]["SidecarService"]["Port"] = json!(0);
    assert_eq!(put(&c, "/v1/agent/service/register", &reg2).0, 200);
    assert_eq!(c.get_json("/v1/agent/services").unwrap()["other-sidecar-proxy"]["Port"], 21000);

    assert_eq!(put(&c, "/v1/agent/service/deregister/other", &json!(null)).0, 200);
    assert!(!s.has_service("other"));
    let (status, body) = put(&c, "/v1/agent/service/deregister/other", &json!(null));
    assert_eq!(status, 404);
    assert_eq!(body, "Unknown service ID \"other\". Ensure that the service ID is passed, not the service name.");
}

/// Nomad 1.6's sidecar registration (`command/agent/consul/connect.go`, sent as `api/agent.go`
/// `AgentServiceRegistration` with `AgentServiceConnect.SidecarService`) through Consul v1.16's
/// agent path: expanded as `agent/sidecar_service.go` `sidecarServiceFromNodeService` does (ID
/// and Name from the parent's, kind `connect-proxy`, destination, local service address
/// `127.0.0.1` and the parent's port when unset, the checks as registered with the IDs
/// `agent.go` `addServiceInternal` gives them), served over xDS exactly as the same proxy
/// registered on its own, and removed with its parent (`agent.go` `removeServiceSidecars`, only
/// for a sidecar registered that way).
#[test]
fn nomads_sidecar_payload_is_expanded_served_and_removed_with_its_parent() {
    let (s, c) = standin();
    let parent = "_nomad-task-a1-group-front-api-http";
    let sidecar_id = format!("{parent}-sidecar-proxy");
    let proxy = json!({
        "Config": {"bind_address": "0.0.0.0", "bind_port": 25001,
                   "envoy_stats_tags": ["nomad.alloc_id=a1", "nomad.group=front", "nomad.job=web", "nomad.namespace=default"]},
        "Upstreams": [{"DestinationNamespace": "team", "DestinationName": "db", "Datacenter": "dc2", "LocalBindAddress": "127.0.0.2",
                       "LocalBindPort": 5432, "Config": {"connect_timeout_ms": 1000}, "MeshGateway": {"Mode": "local"}}],
        "MeshGateway": {},
        "Expose": {"Paths": [{"ListenerPort": 25002, "Path": "/health", "LocalPathPort": 8080, "Protocol": "http"}]},
    });
    let reg = json!({
        "ID": parent, "Name": "api", "Port": 23456, "Address": "10.1.2.3", "Meta": {"external-source": "nomad"}, "Checks": [],
        "Connect": {"SidecarService": {
            "Port": 25001, "Address": "10.1.2.3", "Tags": ["mesh"], "Meta": {"role": "sidecar"},
            "Checks": [{"Name": format!("Connect Sidecar Aliasing {parent}"), "AliasService": parent},
                       {"Name": "Connect Sidecar Listening", "TCP": "10.1.2.3:25001", "Interval": "10s"}],
            "Proxy": proxy,
        }},
    });
    assert_eq!(put(&c, "/v1/agent/service/register", &reg), (200, String::new()));
    let services = c.get_json("/v1/agent/services").unwrap();
    let sc = &services[&sidecar_id];
    assert_eq!(sc["Kind"], "connect-proxy");
    assert_eq!(sc["ID"], sidecar_id.as_str());
    assert_eq!(sc["Service"], "api-sidecar-proxy");
    assert_eq!((sc["Address"].as_str(), sc["Port"].as_i64()), (Some("10.1.2.3"), Some(25001)));
    assert_eq!(sc["Tags"], json!(["mesh"]), "its own tags, not the parent's");
    assert_eq!(sc["Meta"], json!({"role": "sidecar"}), "its own meta");
    let p = &sc["Proxy"];
    assert_eq!((p["DestinationServiceName"].as_str(), p["DestinationServiceID"].as_str()), (Some("api"), Some(parent)));
    assert_eq!((p["LocalServiceAddress"].as_str(), p["LocalServicePort"].as_i64()), (Some("127.0.0.1"), Some(23456)));
    for k in ["Config", "Upstreams", "MeshGateway", "Expose"] {
        assert_eq!(p[k], proxy[k], "Proxy.{k} as sent");
    }
    let checks = c.get_json("/v1/agent/checks").unwrap();
    let alias = &checks[&format!("service:{sidecar_id}:1")];
    assert_eq!(
        (alias["Name"].as_str(), alias["Type"].as_str()),
        (Some(format!("Connect Sidecar Aliasing {parent}").as_str()), Some("alias"))
    );
    let listening = &checks[&format!("service:{sidecar_id}:2")];
    assert_eq!((listening["Type"].as_str(), listening["Definition"]["TCP"].as_str()), (Some("tcp"), Some("10.1.2.3:25001")));
    assert_eq!(checks.as_object().unwrap().len(), 2);

    // The same proxy registered on its own gets the same xDS resources.
    let mut alone = reg["Connect"]["SidecarService"].clone();
    alone["Kind"] = json!("connect-proxy");
    alone["ID"] = json!("alone-sidecar-proxy");
    alone["Name"] = json!("api-sidecar-proxy");
    alone["Proxy"]["DestinationServiceName"] = json!("api");
    alone["Proxy"]["DestinationServiceID"] = json!(parent);
    alone["Proxy"]["LocalServiceAddress"] = json!("127.0.0.1");
    alone["Proxy"]["LocalServicePort"] = json!(23456);
    assert_eq!(put(&c, "/v1/agent/service/register", &alone).0, 200);
    let expanded = s.xds_resource_names(&sidecar_id).unwrap();
    assert_eq!(expanded, s.xds_resource_names("alone-sidecar-proxy").unwrap());
    let listeners = &expanded["type.googleapis.com/envoy.config.listener.v3.Listener"];
    assert!(listeners.contains(&"public_listener:0.0.0.0:25001".to_string()), "{listeners:?}");
    assert!(listeners.contains(&"db?dc=dc2:127.0.0.2:5432".to_string()), "{listeners:?}");

    // The parent goes: so does the sidecar it registered, and its checks; not the other proxy.
    assert_eq!(put(&c, &format!("/v1/agent/service/deregister/{parent}"), &json!(null)).0, 200);
    assert_eq!(keys(&c.get_json("/v1/agent/services").unwrap()), ["alone-sidecar-proxy"]);
    assert!(c.get_json("/v1/agent/checks").unwrap().as_object().unwrap().keys().all(|k| !k.contains(parent)));

    // Empty sidecar tags and meta are Consul's "none": the parent's are copied.
    let mut bare = reg.clone();
    bare["Connect"]["SidecarService"]["Tags"] = json!([]);
    bare["Connect"]["SidecarService"]["Meta"] = json!({});
    bare["Tags"] = json!(["v1"]);
    assert_eq!(put(&c, "/v1/agent/service/register", &bare).0, 200);
    let sc = &c.get_json("/v1/agent/services").unwrap()[&sidecar_id];
    assert_eq!((sc["Tags"].clone(), sc["Meta"].clone()), (json!(["v1"]), json!({"external-source": "nomad"})));
    assert_eq!(put(&c, &format!("/v1/agent/service/deregister/{parent}"), &json!(null)).0, 200);

    // A `<id>-sidecar-proxy` registered on its own is not taken with `<id>`.
    assert_eq!(put(&c, "/v1/agent/service/register", &json!({"ID": "alone", "Name": "api", "Port": 1})).0, 200);
    assert_eq!(put(&c, "/v1/agent/service/deregister/alone", &json!(null)).0, 200);
    assert!(s.has_service("alone-sidecar-proxy"));
}

/// Nomad 1.6's gateway registration (`serviceRegs` with `newConnectGateway`: `Kind` and
/// `Proxy.Config`, Go's empty `MeshGateway` and `Expose` structs, no `Connect`) is accepted by
/// Consul v1.16's decoder (`api/agent.go` `AgentServiceConnectProxyConfig`) and listed with its
/// kind and config.
#[test]
fn nomads_gateway_payload_is_accepted_and_listed() {
    let (_s, c) = standin();
    let reg = json!({
        "Kind": "terminating-gateway", "ID": "_nomad-task-a1-group-gw-tgw-connect-terminating-tgw", "Name": "tgw",
        "Port": 25003, "Address": "10.1.2.3", "Meta": {"external-source": "nomad"}, "Checks": [],
        "Proxy": {"Config": {"connect_timeout_ms": 5000, "envoy_gateway_bind_addresses": {"default": {"Address": "0.0.0.0", "Port": 25003}},
                             "envoy_gateway_no_default_bind": true},
                  "MeshGateway": {}, "Expose": {}},
    });
    assert_eq!(put(&c, "/v1/agent/service/register", &reg), (200, String::new()));
    let gw = &c.get_json("/v1/agent/services").unwrap()["_nomad-task-a1-group-gw-tgw-connect-terminating-tgw"];
    assert_eq!(gw["Kind"], "terminating-gateway");
    assert_eq!(gw["Proxy"]["Config"], reg["Proxy"]["Config"]);
    assert!(gw.get("Connect").is_none());
    // Consul 1.16's proxy config also takes EnvoyExtensions (api/agent.go).
    let mut with_ext = reg.clone();
    with_ext["Proxy"]["EnvoyExtensions"] = json!([{"Name": "builtin/lua", "Arguments": {}}]);
    assert_eq!(put(&c, "/v1/agent/service/register", &with_ext).0, 200);
}

/// `api/catalog.go` `CatalogService` and `api/health.go` `ServiceEntry`/`HealthCheck`.
#[test]
fn catalog_and_health_reads() {
    let (_s, c) = standin();
    for (id, status) in [("a", "passing"), ("b", "critical")] {
        let reg = json!({"ID": id, "Name": "api", "Port": 9000, "Tags": [id], "Check": {"CheckID": format!("chk-{id}"), "TTL": "60s", "Status": status}});
        assert_eq!(put(&c, "/v1/agent/service/register", &reg).0, 200);
    }
    let services = c.get("/v1/catalog/services").unwrap();
    assert!(services.header("x-consul-index").unwrap().parse::<u64>().unwrap() > 1);
    assert_eq!(services.json().unwrap(), json!({"consul": [], "api": ["a", "b"]}));
    let cat = c.get_json("/v1/catalog/service/api").unwrap();
    assert_eq!(cat.as_array().unwrap().len(), 2);
    for k in [
        "ID",
        "Node",
        "Address",
        "Datacenter",
        "TaggedAddresses",
        "NodeMeta",
        "ServiceID",
        "ServiceName",
        "ServiceAddress",
        "ServiceTags",
        "ServiceMeta",
        "ServicePort",
        "ServiceKind",
        "ServiceProxy",
        "ServiceConnect",
        "ServiceEnableTagOverride",
        "ServiceWeights",
        "CreateIndex",
        "ModifyIndex",
    ] {
        assert!(cat[0].get(k).is_some(), "CatalogService.{k}");
    }
    assert_eq!(cat[0]["ServiceName"], "api");
    assert_eq!(cat[0]["ServicePort"], 9000);
    let health = c.get_json("/v1/health/service/api").unwrap();
    assert_eq!(health.as_array().unwrap().len(), 2);
    assert_eq!(keys(&health[0]), ["Checks", "Node", "Service"]);
    assert_eq!(health[0]["Node"]["Node"], "consul-standin");
    assert_eq!(health[0]["Service"]["Service"], "api");
    assert_eq!(health[0]["Checks"][0]["CheckID"], "serfHealth");
    let passing = c.get_json("/v1/health/service/api?passing").unwrap();
    assert_eq!(passing.as_array().unwrap().len(), 1);
    assert_eq!(passing[0]["Service"]["ID"], "a");
    assert_eq!(c.get_json("/v1/health/service/nope").unwrap(), json!([]));
}

/// Consul decodes with `DisallowUnknownFields`; keys match case-insensitively.
#[test]
fn unknown_keys_and_wrong_types_are_refused_like_consul() {
    let (s, c) = standin();
    assert_eq!(
        put(&c, "/v1/agent/service/register", &json!({"Name": "web", "Bogus": 1})),
        (400, "Request decode failed: json: unknown field \"Bogus\"".to_string())
    );
    assert_eq!(
        put(&c, "/v1/agent/service/register", &json!({"Name": "web", "Checks": [{"TTL": "10s", "Intervall": "1s"}]})),
        (400, "Request decode failed: json: unknown field \"Intervall\"".to_string())
    );
    assert_eq!(
        put(&c, "/v1/agent/service/register", &json!({"Name": "web", "Port": "80"})),
        (
            400,
            "Request decode failed: json: cannot unmarshal string into Go struct field AgentServiceRegistration.Port of type int"
                .to_string()
        )
    );
    assert_eq!(put(&c, "/v1/agent/service/register", &json!({"Port": 80})), (400, "Missing service name".to_string()));
    assert_eq!(
        put(&c, "/v1/agent/service/register", &json!({"Name": "web", "Check": {"HTTP": "http://x/"}})).1,
        "Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP or UDP checks"
    );
    assert!(!s.has_service("web"));
    // Case-insensitive keys decode to the field; null is the zero value.
    assert_eq!(put(&c, "/v1/agent/service/register", &json!({"name": "web", "PORT": 81, "tags": null})).0, 200);
    assert_eq!(c.get_json("/v1/agent/services").unwrap()["web"]["Port"], 81);
    // Check update bodies (`api/agent.go` checkUpdate) and config entries too.
    assert_eq!(
        put(&c, "/v1/agent/check/update/x", &json!({"Status": "passing", "Note": "x"})).1,
        "Request decode failed: json: unknown field \"Note\""
    );
    assert_eq!(
        put(&c, "/v1/config", &json!({"Kind": "terminating-gateway", "Name": "gw", "Services": [{"Name": "db", "Port": 1}]})).1,
        "Request decoding failed: 1 error occurred:\n\t* invalid config key \"Services[0].Port\"\n\n"
    );
    assert_eq!(
        put(&c, "/v1/config", &json!({"Name": "gw"})).1,
        "Request decoding failed: Payload does not contain a kind/Kind key at the top level"
    );
}

/// `api/acl.go` `ACLToken` (create/read/self/delete) and Consul's refusals with ACLs on.
#[test]
fn acls_refuse_unknown_and_unprivileged_tokens() {
    let s = ConsulStandIn::start(ConsulOptions { management_token: Some("root-secret".into()), ..Default::default() }).unwrap();
    let c = HttpClient::new(&s.addr().to_string());
    let reg = json!({"Name": "web", "Port": 80});
    assert_eq!(
        put(&c, "/v1/agent/service/register", &reg),
        (403, "Permission denied: anonymous token lacks permission 'service:write' on \"web\"".to_string())
    );
    assert_eq!(put(&c, "/v1/agent/service/register?token=wrong", &reg), (403, "ACL not found".to_string()));
    assert_eq!(c.request("GET", "/v1/agent/self", None).unwrap().status, 403);
    assert_eq!(c.request("PUT", "/v1/acl/token", Some(b"{}")).unwrap().status, 403);

    let (status, body) = put(
        &c,
        "/v1/acl/token?token=root-secret",
        &json!({"Description": "_nomad_si [c1] [a1] [web]", "ServiceIdentities": [{"ServiceName": "web"}], "Local": true}),
    );
    assert_eq!(status, 200, "{body}");
    let tok: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        keys(&tok),
        ["AccessorID", "CreateIndex", "CreateTime", "Description", "Hash", "Local", "ModifyIndex", "SecretID", "ServiceIdentities"]
    );
    assert_eq!(tok["Local"], true);
    assert_eq!(tok["ServiceIdentities"], json!([{"ServiceName": "web"}]));
    let (acc, secret) = (tok["AccessorID"].as_str().unwrap(), tok["SecretID"].as_str().unwrap());
    assert_ne!(acc, secret);

    // The identity may write its own service (and its sidecar), nothing else.
    assert_eq!(put(&c, &format!("/v1/agent/service/register?token={secret}"), &reg).0, 200);
    let (status, body) = put(&c, &format!("/v1/agent/service/register?token={secret}"), &json!({"Name": "db"}));
    assert_eq!(
        (status, body),
        (403, format!("Permission denied: token with AccessorID '{acc}' lacks permission 'service:write' on \"db\""))
    );

    assert_eq!(c.get_json(&format!("/v1/acl/token/self?token={secret}")).unwrap()["AccessorID"], acc);
    assert_eq!(c.get_json(&format!("/v1/acl/token/{acc}?token=root-secret")).unwrap()["Description"], "_nomad_si [c1] [a1] [web]");
    assert_eq!(c.request("DELETE", &format!("/v1/acl/token/{acc}?token=root-secret"), None).unwrap().text(), "true");
    let again = c.request("DELETE", &format!("/v1/acl/token/{acc}?token=root-secret"), None).unwrap();
    assert_eq!((again.status, again.text()), (500, "Cannot find token to delete".to_string()));
    assert_eq!(c.request("GET", &format!("/v1/acl/token/{acc}?token=root-secret"), None).unwrap().text(), "ACL not found");
    assert_eq!(put(&c, &format!("/v1/agent/service/register?token={secret}"), &reg), (403, "ACL not found".to_string()));
    assert_eq!(
        put(&c, "/v1/acl/token?token=root-secret", &json!({"ServiceIdentities": [{"ServiceName": "Web!"}]})).1,
        "Service identity \"Web!\" has an invalid name. Only lowercase alphanumeric characters, '-' and '_' are allowed"
    );
}

/// The stand-in runs tcp checks itself: critical while nothing listens, passing once something does.
#[test]
fn a_tcp_check_turns_passing_when_a_listener_appears() {
    let (s, c) = standin();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let reg = json!({"Name": "db", "Check": {"CheckID": "tcp1", "TCP": format!("127.0.0.1:{port}"), "Interval": "100ms", "Timeout": "1s"}});
    assert_eq!(put(&c, "/v1/agent/service/register", &reg).0, 200);
    wait_for_blocking("the tcp check to have run", WAIT, || {
        let chk = c.get_json("/v1/agent/checks").ok()?["tcp1"].clone();
        (chk["Output"].as_str()?.contains("dial tcp")).then_some(())
    })
    .unwrap();
    assert_eq!(s.check_status("tcp1").as_deref(), Some("critical"));
    let _listener = TcpListener::bind(("127.0.0.1", port)).expect("rebind the probed port");
    wait_for_blocking("the tcp check to pass", WAIT, || (s.check_status("tcp1").as_deref() == Some("passing")).then_some(())).unwrap();
    assert_eq!(c.get_json("/v1/agent/checks").unwrap()["tcp1"]["Output"], format!("TCP connect 127.0.0.1:{port}: Success"));
}

/// http checks: 2xx passes, anything else is critical (the stand-in probes itself here).
#[test]
fn http_checks_follow_the_status_code() {
    let (s, c) = standin();
    let base = s.url();
    let reg = json!({"Name": "web", "Checks": [
        {"CheckID": "ok", "HTTP": format!("{base}/v1/agent/self"), "Interval": "100ms"},
        {"CheckID": "missing", "HTTP": format!("{base}/nope"), "Interval": "100ms", "Status": "passing"},
    ]});
    assert_eq!(put(&c, "/v1/agent/service/register", &reg).0, 200);
    wait_for_blocking("http checks to run", WAIT, || {
        (s.check_status("ok").as_deref() == Some("passing") && s.check_status("missing").as_deref() == Some("critical")).then_some(())
    })
    .unwrap();
    let out = c.get_json("/v1/agent/checks").unwrap()["missing"]["Output"].as_str().unwrap().to_string();
    assert!(out.starts_with(&format!("HTTP GET {base}/nope: 404 Not Found")), "{out}");
    assert!(!s.calls_to("GET", "/v1/agent/self").is_empty(), "the probe went to the URL");
}

/// TTL checks: updates set status and output; without one in time they expire to critical.
#[test]
fn ttl_checks_update_and_expire() {
    let (s, c) = standin();
    let reg = json!({"Name": "web", "Check": {"CheckID": "ttl", "TTL": "1s"}});
    assert_eq!(put(&c, "/v1/agent/service/register", &reg).0, 200);
    assert_eq!(put(&c, "/v1/agent/check/update/ttl", &json!({"Status": "passing", "Output": "fine"})).0, 200);
    let chk = c.get_json("/v1/agent/checks").unwrap()["ttl"].clone();
    assert_eq!((chk["Status"].as_str(), chk["Output"].as_str()), (Some("passing"), Some("fine")));
    wait_for_blocking("the TTL to expire", WAIT, || (s.check_status("ttl").as_deref() == Some("critical")).then_some(())).unwrap();
    assert_eq!(c.get_json("/v1/agent/checks").unwrap()["ttl"]["Output"], "TTL expired");
    assert_eq!(put(&c, "/v1/agent/check/warn/ttl?note=slow", &json!(null)).0, 200);
    assert_eq!(put(&c, "/v1/agent/check/update/ttl", &json!({"Status": "bogus"})), (400, "Invalid 'Status' provided".to_string()));
    assert_eq!(
        put(&c, "/v1/agent/check/pass/nope", &json!(null)),
        (404, "Unknown check ID \"nope\". Ensure that the check ID is passed, not the check name.".to_string())
    );
}

/// `api/kv.go` `KVPair`; blocking reads (`?index=&wait=`) return when the key is written.
#[test]
fn kv_reads_writes_and_blocking_queries() {
    let (s, c) = standin();
    let r = c.request("PUT", "/v1/kv/app/config", Some(b"hello")).unwrap();
    assert_eq!((r.status, r.text()), (200, "true".to_string()));
    assert_eq!(c.request("PUT", "/v1/kv/app/other?flags=7", Some(b"x")).unwrap().status, 200);
    let got = c.get("/v1/kv/app/config").unwrap();
    let index: u64 = got.header("x-consul-index").unwrap().parse().unwrap();
    let pair = &got.json().unwrap()[0];
    assert_eq!(keys(pair), ["CreateIndex", "Flags", "Key", "LockIndex", "ModifyIndex", "Value"]);
    assert_eq!(pair["Key"], "app/config");
    assert_eq!(pair["Value"], "aGVsbG8=");
    assert_eq!(pair["ModifyIndex"], index);
    assert_eq!(c.get("/v1/kv/app/config?raw").unwrap().text(), "hello");
    assert_eq!(c.get_json("/v1/kv/app/?keys").unwrap(), json!(["app/config", "app/other"]));
    assert_eq!(c.get_json("/v1/kv/app?recurse").unwrap()[1]["Flags"], 7);
    assert_eq!(c.request("GET", "/v1/kv/missing", None).unwrap().status, 404);
    assert_eq!(c.request("PUT", "/v1/kv/a+b%20c", Some(b"plus")).unwrap().status, 200);
    assert_eq!(c.get_json("/v1/kv/a+b%20c?keys").unwrap(), json!(["a+b c"]), "+ in a key path is itself, %20 a space");
    assert_eq!(c.request("DELETE", "/v1/kv/a+b%20c", None).unwrap().status, 200);

    // With no write, a blocking read waits out its `wait`.
    let started = Instant::now();
    let idle = c.get(&format!("/v1/kv/app/config?index={index}&wait=300ms")).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(idle.header("x-consul-index").unwrap(), index.to_string());

    // A write wakes a blocked read at once.
    let c2 = c.clone();
    let blocked = std::thread::spawn(move || c2.get(&format!("/v1/kv/app/config?index={index}&wait=60s")).unwrap());
    wait_for_blocking("the blocking read to arrive", WAIT, || {
        s.calls_to("GET", "/v1/kv/app/config").iter().any(|c| c.query.contains("wait=60s")).then_some(())
    })
    .unwrap();
    let written = Instant::now();
    assert_eq!(c.request("PUT", "/v1/kv/app/config", Some(b"world")).unwrap().status, 200);
    let woke = blocked.join().unwrap();
    assert!(written.elapsed() < Duration::from_secs(30), "the read returned on the write, not at its wait");
    assert!(woke.header("x-consul-index").unwrap().parse::<u64>().unwrap() > index);
    assert_eq!(woke.json().unwrap()[0]["Value"], "d29ybGQ=");

    assert_eq!(c.request("DELETE", "/v1/kv/app?recurse", None).unwrap().text(), "true");
    assert_eq!(c.request("GET", "/v1/kv/app/other", None).unwrap().status, 404);
    let big = vec![b'x'; 512 * 1024 + 1];
    assert_eq!(c.request("PUT", "/v1/kv/big", Some(&big)).unwrap().status, 413);
}

/// `api/config_entry_gateways.go` `TerminatingGatewayConfigEntry`, written, read and deleted.
#[test]
fn config_entries_round_trip() {
    let (_s, c) = standin();
    let entry = json!({"Kind": "terminating-gateway", "Name": "api-gateway", "Namespace": "", "Services": [{"Name": "billing", "SNI": "b.example"}]});
    let (status, body) = put(&c, "/v1/config", &entry);
    assert_eq!((status, body.as_str()), (200, "true"));
    let got = c.get_json("/v1/config/terminating-gateway/api-gateway").unwrap();
    assert_eq!(got["Kind"], "terminating-gateway");
    assert_eq!(got["Services"], json!([{"Name": "billing", "SNI": "b.example"}]));
    assert!(got["CreateIndex"].as_u64().unwrap() > 0);
    assert_eq!(c.get_json("/v1/config/terminating-gateway").unwrap().as_array().unwrap().len(), 1);
    assert_eq!(c.request("DELETE", "/v1/config/terminating-gateway/api-gateway", None).unwrap().status, 200);
    let gone = c.request("GET", "/v1/config/terminating-gateway/api-gateway", None).unwrap();
    assert_eq!((gone.status, gone.text()), (404, "Config entry not found for \"terminating-gateway\" / \"api-gateway\"".to_string()));
    assert_eq!(
        put(&c, "/v1/config", &json!({"Kind": "bogus", "Name": "x"})).1,
        "Request decoding failed: invalid config entry kind: bogus"
    );
}

/// Stopping cuts Consul away; restarting brings it back on the same port with its state.
#[test]
fn stop_and_restart_on_the_same_port() {
    let (s, c) = standin();
    assert_eq!(put(&c, "/v1/agent/service/register", &json!({"Name": "web"})).0, 200);
    let addr = s.addr();
    s.stop();
    assert!(c.request("GET", "/v1/agent/self", None).is_err(), "connections are refused while stopped");
    s.restart().unwrap();
    assert_eq!(s.addr(), addr);
    assert!(c.get_json("/v1/agent/services").unwrap().get("web").is_some());
    s.set_version("1.17.0");
    assert_eq!(c.get_json("/v1/agent/self").unwrap()["Config"]["Version"], "1.17.0");
    s.forget_services();
    assert_eq!(c.get_json("/v1/agent/services").unwrap(), json!({}));
    let paths: Vec<String> = s.calls().into_iter().map(|c| format!("{} {}", c.method, c.path)).collect();
    assert_eq!(paths[0], "PUT /v1/agent/service/register");
}

/// The binary prints its address on its first line.
#[test]
fn the_binary_prints_its_address_first() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_consul-standin")).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("consul-standin listening on ").expect(&line).to_string();
    let v = HttpClient::new(&addr).get_json("/v1/agent/self");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(v.unwrap()["Config"]["Datacenter"], "dc1");
}

/// A terminating gateway listens where Consul's `listenersFromSnapshotGateway` says: Nomad's
/// bridge-mode registration (the host's address, `envoy_gateway_no_default_bind` and a `default`
/// bind address on 0.0.0.0) gets one listener on 0.0.0.0, not one on the host's address that
/// Envoy could not bind inside the namespace; without those keys the service's own address is
/// used; tagged addresses only when asked for; one listener per address, by name.
#[test]
fn gateway_listeners_follow_the_proxy_bind_settings() {
    let (s, c) = standin();
    let listeners = |id: &str| -> Vec<String> {
        s.xds_resource_names(id).unwrap().remove("type.googleapis.com/envoy.config.listener.v3.Listener").unwrap_or_default()
    };
    let gateway = |id: &str, config: Value| {
        let reg = json!({"Kind": "terminating-gateway", "ID": id, "Name": "tgw", "Address": "192.0.2.9", "Port": 24402,
                         "TaggedAddresses": {"lan": {"Address": "10.0.0.9", "Port": 7000}},
                         "Proxy": {"Config": config}});
        assert_eq!(put(&c, "/v1/agent/service/register", &reg).0, 200);
    };
    gateway(
        "bridge",
        json!({"connect_timeout_ms": 5000, "envoy_gateway_no_default_bind": true,
               "envoy_gateway_bind_addresses": {"default": {"Address": "0.0.0.0", "Port": 24402}}}),
    );
    assert_eq!(listeners("bridge"), ["default:0.0.0.0:24402"]);
    gateway("host", json!({}));
    assert_eq!(listeners("host"), ["default:192.0.2.9:24402"]);
    gateway(
        "tagged",
        json!({"envoy_gateway_no_default_bind": "true", "envoy_gateway_bind_tagged_addresses": 1,
               "envoy_gateway_bind_addresses": {"again": {"address": "10.0.0.9", "port": 7000}, "extra": {"Address": "0.0.0.0", "Port": 7001}}}),
    );
    assert_eq!(
        listeners("tagged"),
        ["again:10.0.0.9:7000", "extra:0.0.0.0:7001"],
        "lan and again share an address: the first by name wins"
    );
}
