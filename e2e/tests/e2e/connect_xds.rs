//! The Consul stand-in's Connect control plane: its built-in CA (checked with the `openssl`
//! CLI), the delta ADS stream (driven directly over gRPC), and real Envoys that take their whole
//! configuration from it and carry bytes over mutual TLS.
//!
//! The Envoy tests bootstrap each Envoy with [`envoy_bootstrap`], a small local copy of the
//! shape `consul connect envoy -bootstrap` prints (reference connect-data-plane.md §2.1), kept
//! separate from the client's generator so the two can be compared.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    DownstreamTlsContext, UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use nomad_e2e::HttpClient;
use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_testkit::prereq::{Prereq, envoy_binary};
use nomad_testkit::{require_prereqs, wait_for_blocking};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const MANAGEMENT: &str = "8f2d7c1b-connect-xds-management";
const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn standin() -> (ConsulStandIn, HttpClient) {
    let opts = ConsulOptions { grpc_port: 0, management_token: Some(MANAGEMENT.into()), ..Default::default() };
    let s = ConsulStandIn::start(opts).expect("start stand-in");
    let c = HttpClient::new(&s.addr().to_string());
    (s, c)
}

fn with_token(path: &str, token: &str) -> String {
    format!("{path}{}token={token}", if path.contains('?') { "&" } else { "?" })
}

fn put(c: &HttpClient, path: &str, body: &Value) {
    let r = c.request("PUT", &with_token(path, MANAGEMENT), Some(body.to_string().as_bytes())).expect("request");
    assert_eq!(r.status, 200, "PUT {path}: {}", r.text());
}

/// A service-identity token for `service` (`service:write` on it and its sidecar).
fn identity_token(c: &HttpClient, service: &str) -> String {
    let r = c
        .request(
            "PUT",
            &with_token("/v1/acl/token", MANAGEMENT),
            Some(json!({"ServiceIdentities": [{"ServiceName": service}]}).to_string().as_bytes()),
        )
        .expect("create token");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()["SecretID"].as_str().unwrap().to_string()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn openssl(args: &[&str], dir: &Path) -> (bool, String) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Roots and leaves in Consul's shapes (`agent/connect_ca_endpoint.go`, `api/agent.go`
/// `LeafCert`), and a leaf that `openssl verify` accepts against the root, carrying only the
/// service's SPIFFE ID; leaves need `service:write`.
#[test]
fn ca_roots_and_leaves_have_consuls_shape_and_verify() {
    let (s, c) = standin();
    let ca = s.ca().expect("connect is on");
    for path in ["/v1/connect/ca/roots", "/v1/agent/connect/ca/roots"] {
        let v = c.get_json(&with_token(path, MANAGEMENT)).unwrap();
        assert_eq!(v["TrustDomain"], ca.trust_domain, "{path}");
        assert!(v["TrustDomain"].as_str().unwrap().ends_with(".consul"));
        let root = &v["Roots"][0];
        assert_eq!(v["ActiveRootID"], root["ID"]);
        assert_eq!(root["Active"], true);
        assert_eq!(root["PrivateKeyType"], "ec");
        assert_eq!(root["PrivateKeyBits"], 256);
        assert!(root["RootCert"].as_str().unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        for k in ["ID", "SigningKeyID"] {
            let id = root[k].as_str().unwrap();
            assert!(id.split(':').all(|b| b.len() == 2 && b.bytes().all(|x| x.is_ascii_hexdigit())), "{k} {id}");
        }
    }

    let anonymous = c.request("GET", "/v1/agent/connect/ca/leaf/web", None).unwrap();
    assert_eq!(anonymous.status, 403, "{}", anonymous.text());
    let web = identity_token(&c, "web");
    let other = c.request("GET", &with_token("/v1/agent/connect/ca/leaf/db", &web), None).unwrap();
    assert_eq!(other.status, 403, "{}", other.text());
    let leaf = c.get_json(&with_token("/v1/agent/connect/ca/leaf/web", &web)).unwrap();
    let uri = format!("spiffe://{}/ns/default/dc/dc1/svc/web", ca.trust_domain);
    assert_eq!(leaf["ServiceURI"], uri.as_str());
    assert_eq!(leaf["Service"], "web");
    for k in ["SerialNumber", "CertPEM", "PrivateKeyPEM", "ValidAfter", "ValidBefore"] {
        assert!(leaf[k].as_str().is_some_and(|v| !v.is_empty()), "{k}: {leaf}");
    }
    // The agent's leaf cache: the same leaf until renewal.
    let again = c.get_json(&with_token("/v1/agent/connect/ca/leaf/web", &web)).unwrap();
    assert_eq!(again["SerialNumber"], leaf["SerialNumber"]);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("root.pem"), &ca.root_pem).unwrap();
    std::fs::write(dir.path().join("leaf.pem"), leaf["CertPEM"].as_str().unwrap()).unwrap();
    let (ok, out) = openssl(&["verify", "-CAfile", "root.pem", "leaf.pem"], dir.path());
    assert!(ok, "openssl verify: {out}");
    let (ok, text) = openssl(&["x509", "-in", "leaf.pem", "-noout", "-text"], dir.path());
    assert!(ok, "{text}");
    assert!(text.contains(&format!("URI:{uri}")), "{text}");
    assert!(text.contains("prime256v1") || text.contains("P-256"), "{text}");
    assert!(text.contains("TLS Web Server Authentication") && text.contains("TLS Web Client Authentication"), "{text}");
    let (ok, root_text) = openssl(&["x509", "-in", "root.pem", "-noout", "-text"], dir.path());
    assert!(ok && root_text.contains("CA:TRUE"), "{root_text}");
    assert!(root_text.contains(&format!("URI:spiffe://{}", ca.trust_domain)), "{root_text}");
}

/// `/v1/agent/self` reports the xDS server's kernel-chosen port where Consul reports its gRPC
/// port, and the Envoy versions Consul 1.16 lists.
#[test]
fn agent_self_reports_the_xds_port() {
    let (s, c) = standin();
    let v = c.get_json(&with_token("/v1/agent/self", MANAGEMENT)).unwrap();
    let port = s.grpc_addr().expect("grpc runs").port();
    assert_ne!(port, 8502);
    assert_eq!(v["DebugConfig"]["GRPCPort"], port);
    assert_eq!(v["xDS"]["Ports"]["Plaintext"], port);
    assert_eq!(v["xDS"]["SupportedProxies"]["envoy"][0], "1.26.4");
    assert!(TcpStream::connect(s.grpc_addr().unwrap()).is_ok());
}

// ---- The delta ADS stream, driven directly ----

struct Stream {
    tx: tokio::sync::mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

async fn open(s: &ConsulStandIn, token: &str) -> Stream {
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", s.grpc_addr().unwrap())).await.expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert("x-consul-token", token.parse().unwrap());
    let response = client.delta_aggregated_resources(req).await.expect("the stream opens");
    Stream { tx, rx: response.into_inner() }
}

fn request(type_url: &str, node_id: Option<&str>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        node: node_id.map(|id| Node { id: id.into(), cluster: "web".into(), ..Default::default() }),
        ..Default::default()
    }
}

impl Stream {
    async fn send(&self, r: DeltaDiscoveryRequest) {
        self.tx.send(r).await.expect("send");
    }
    async fn next(&mut self) -> Result<DeltaDiscoveryResponse, tonic::Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await.expect("a response within the deadline") {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(tonic::Status::cancelled("stream ended")),
            Err(s) => Err(s),
        }
    }
    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest { type_url: r.type_url.clone(), response_nonce: r.nonce.clone(), ..Default::default() }).await;
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources.iter().map(|x| x.name.clone()).collect()
}

fn register_web_with_upstream(c: &HttpClient, upstream: &str) {
    put(
        c,
        "/v1/agent/service/register",
        &json!({"Name": "web", "ID": "web-1", "Port": 9090, "Connect": {"SidecarService": {"Port": 21000,
                "Proxy": {"Upstreams": [{"DestinationName": upstream, "LocalBindPort": 8181}]}}}}),
    );
}

/// Unknown tokens are `Unauthenticated`; a token without `service:write` on the sidecar's
/// destination is `PermissionDenied`; an unregistered proxy is `NotFound`; the
/// state-of-the-world stream is not implemented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_ads_checks_the_stream_token() {
    let (s, c) = tokio::task::block_in_place(standin);
    tokio::task::block_in_place(|| register_web_with_upstream(&c, "db"));
    let db_token = tokio::task::block_in_place(|| identity_token(&c, "db"));

    let mut unknown = open(&s, "no-such-secret").await;
    unknown.send(request(CLUSTER_TYPE, Some("web-1-sidecar-proxy"))).await;
    assert_eq!(unknown.next().await.unwrap_err().code(), tonic::Code::Unauthenticated);

    let mut wrong = open(&s, &db_token).await;
    wrong.send(request(CLUSTER_TYPE, Some("web-1-sidecar-proxy"))).await;
    assert_eq!(wrong.next().await.unwrap_err().code(), tonic::Code::PermissionDenied);

    let mut unregistered = open(&s, MANAGEMENT).await;
    unregistered.send(request(CLUSTER_TYPE, Some("nobody-sidecar-proxy"))).await;
    assert_eq!(unregistered.next().await.unwrap_err().code(), tonic::Code::NotFound);

    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", s.grpc_addr().unwrap())).await.unwrap();
    let sotw = client.stream_aggregated_resources(tokio_stream::iter(Vec::new())).await;
    assert_eq!(sotw.unwrap_err().code(), tonic::Code::Unimplemented);
}

/// CDS, then EDS by name, then LDS; ACKs release the next push; a NACK is recorded; a new
/// destination sidecar is pushed as an EDS update and its deregistration empties it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_ads_pushes_resources_and_updates() {
    let (s, c) = tokio::task::block_in_place(standin);
    tokio::task::block_in_place(|| register_web_with_upstream(&c, "db"));
    let web_token = tokio::task::block_in_place(|| identity_token(&c, "web"));
    let td = s.ca().unwrap().trust_domain.clone();
    let db_cluster = format!("db.default.dc1.internal.{td}");

    let mut st = open(&s, &web_token).await;
    st.send(request(CLUSTER_TYPE, Some("web-1-sidecar-proxy"))).await;
    st.send(request(LISTENER_TYPE, None)).await;
    let cds = st.next().await.expect("CDS");
    assert_eq!(cds.type_url, CLUSTER_TYPE);
    assert_eq!(cds.nonce, "00000001");
    let mut cds_names = names(&cds);
    cds_names.sort();
    assert_eq!(cds_names, vec![db_cluster.clone(), "local_app".to_string()]);
    // The upstream cluster dials with SNI and accepts only db's SPIFFE ID.
    let db = cds.resources.iter().find(|r| r.name == db_cluster).unwrap();
    let db = decode::<envoy_types::pb::envoy::config::cluster::v3::Cluster>(db.resource.as_ref().unwrap());
    let tls = decode::<UpstreamTlsContext>(typed(db.transport_socket.as_ref().unwrap()));
    assert_eq!(tls.sni, db_cluster);
    let validation = match tls.common_tls_context.as_ref().unwrap().validation_context_type.as_ref().unwrap() {
        common_tls_context::ValidationContextType::ValidationContext(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    let san = &validation.match_typed_subject_alt_names[0];
    assert_eq!(san.san_type, subject_alt_name_matcher::SanType::Uri as i32);
    let want = format!("spiffe://{td}/ns/default/dc/dc1/svc/db");
    assert_eq!(san.matcher.as_ref().unwrap().match_pattern, Some(string_matcher::MatchPattern::Exact(want)));
    st.ack(&cds).await;
    let lds = st.next().await.expect("LDS after the CDS ACK");
    assert_eq!(lds.type_url, LISTENER_TYPE);
    let mut lds_names = names(&lds);
    lds_names.sort();
    assert_eq!(lds_names, vec!["db:127.0.0.1:8181".to_string(), "public_listener:0.0.0.0:21000".to_string()]);
    // The public listener requires a client certificate.
    let public = lds.resources.iter().find(|r| r.name.starts_with("public_listener:")).unwrap();
    let public = decode::<envoy_types::pb::envoy::config::listener::v3::Listener>(public.resource.as_ref().unwrap());
    let tls = decode::<DownstreamTlsContext>(typed(public.filter_chains[0].transport_socket.as_ref().unwrap()));
    assert_eq!(tls.require_client_certificate.map(|b| b.value), Some(true));
    st.ack(&lds).await;

    // EDS by name: no db sidecar yet, so an explicit empty assignment.
    st.send(DeltaDiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        resource_names_subscribe: vec![db_cluster.clone()],
        ..Default::default()
    })
    .await;
    let eds = st.next().await.expect("EDS");
    assert_eq!(names(&eds), vec![db_cluster.clone()]);
    let cla = decode_cla(&eds);
    assert_eq!(cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum::<usize>(), 0);
    // A NACK is recorded and not retried.
    st.send(DeltaDiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        response_nonce: eds.nonce.clone(),
        error_detail: Some(RpcStatus { code: 3, message: "test rejects this".into(), details: vec![] }),
        ..Default::default()
    })
    .await;
    tokio::task::block_in_place(|| {
        wait_for_blocking("the NACK recorded", WAIT, || s.xds_nacks().iter().any(|n| n.message == "test rejects this").then_some(()))
    })
    .unwrap();

    // A db sidecar appears: the endpoint is pushed.
    tokio::task::block_in_place(|| {
        put(
            &c,
            "/v1/agent/service/register",
            &json!({"Name": "db", "ID": "db-1", "Port": 5432, "Connect": {"SidecarService": {"Port": 21001}}}),
        )
    });
    let update = st.next().await.expect("EDS update");
    assert_eq!(update.type_url, ENDPOINT_TYPE);
    let cla = decode_cla(&update);
    let ports: Vec<u32> = cla.endpoints.iter().flat_map(|l| l.lb_endpoints.iter()).map(endpoint_port).collect();
    assert_eq!(ports, vec![21001]);
    st.ack(&update).await;
    tokio::task::block_in_place(|| put(&c, "/v1/agent/service/deregister/db-1-sidecar-proxy", &json!({})));
    let gone = st.next().await.expect("EDS after deregistration");
    assert_eq!(decode_cla(&gone).endpoints.iter().map(|l| l.lb_endpoints.len()).sum::<usize>(), 0);
}

fn decode<T: prost::Message + Default>(any: &envoy_types::pb::google::protobuf::Any) -> T {
    T::decode(&any.value[..]).expect("decode")
}

fn typed(socket: &envoy_types::pb::envoy::config::core::v3::TransportSocket) -> &envoy_types::pb::google::protobuf::Any {
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
        panic!("no typed config")
    };
    any
}

fn decode_cla(r: &DeltaDiscoveryResponse) -> envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment {
    use prost::Message;
    envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(&r.resources[0].resource.as_ref().unwrap().value[..])
        .unwrap()
}

fn endpoint_port(e: &envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else { return 0 };
    let Some(address::Address::SocketAddress(sa)) = ep.address.as_ref().and_then(|a| a.address.as_ref()) else { return 0 };
    match sa.port_specifier {
        Some(socket_address::PortSpecifier::PortValue(p)) => p,
        _ => 0,
    }
}

// ---- Real Envoys ----

/// The bootstrap `consul connect envoy -bootstrap` prints for a proxy (v1.16): node id = the
/// proxy service ID, cluster = its service, ADS over delta gRPC to the agent's gRPC port with
/// the token as `x-consul-token`. The admin port is 0: Envoy writes the one it got to
/// `--admin-address-path`.
fn envoy_bootstrap(proxy_id: &str, cluster: &str, grpc_port: u16, token: &str) -> Value {
    json!({
        "admin": {"access_log_path": "/dev/null", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "node": {"cluster": cluster, "id": proxy_id, "metadata": {"namespace": "default", "partition": "default"}},
        "layered_runtime": {"layers": [{"name": "base", "static_layer": {"re2.max_program_size.error_level": 1048576}}]},
        "static_resources": {"clusters": [{
            "name": "local_agent", "ignore_health_on_host_removal": false, "connect_timeout": "1s", "type": "STATIC",
            "http2_protocol_options": {},
            "loadAssignment": {"clusterName": "local_agent", "endpoints": [{"lbEndpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": grpc_port}}}}]}]}
        }]},
        "stats_config": {"stats_tags": [{"tag_name": "local_cluster", "fixed_value": cluster}], "use_all_default_tags": true},
        "dynamic_resources": {
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
            "ads_config": {"api_type": "DELTA_GRPC", "transport_api_version": "V3", "grpc_services": {
                "initial_metadata": [{"key": "x-consul-token", "value": token}],
                "envoy_grpc": {"cluster_name": "local_agent"}}}
        }
    })
}

/// One Envoy process in its own temp dir, killed (by its PID) on drop.
struct Envoy {
    child: Child,
    dir: tempfile::TempDir,
    admin: Option<HttpClient>,
    name: String,
}

impl Envoy {
    fn start(name: &str, bootstrap: &Value) -> Envoy {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bootstrap.json");
        std::fs::write(&config, serde_json::to_vec_pretty(bootstrap).unwrap()).unwrap();
        let log = std::fs::File::create(dir.path().join("envoy.log")).unwrap();
        let child = Command::new(envoy_binary().expect("envoy"))
            .arg("-c")
            .arg(&config)
            .arg("--disable-hot-restart")
            .arg("--admin-address-path")
            .arg(dir.path().join("admin"))
            .args(["--log-level", "info", "--concurrency", "1"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn envoy");
        let mut e = Envoy { child, dir, admin: None, name: name.into() };
        let admin_file: PathBuf = e.dir.path().join("admin");
        let addr = wait_for_blocking(&format!("{name}'s admin address"), WAIT, || {
            std::fs::read_to_string(&admin_file).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|_| panic!("{name}: no admin address; log:\n{}", e.log()));
        e.admin = Some(HttpClient::new(&addr));
        e
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    fn admin(&self, path: &str) -> String {
        self.admin.as_ref().unwrap().get(path).map(|r| r.text()).unwrap_or_default()
    }

    /// Waits until Envoy has initialised from xDS (`/ready` says LIVE).
    fn wait_ready(&self) {
        let ok = wait_for_blocking(&format!("{} ready", self.name), WAIT, || {
            self.admin.as_ref().unwrap().get("/ready").ok().filter(|r| r.status == 200).map(|_| ())
        });
        assert!(ok.is_ok(), "{} not ready:\n{}", self.name, self.log());
    }

    /// The hosts `/clusters` lists for a cluster, with their health flags.
    fn hosts(&self, cluster: &str) -> Vec<(String, String)> {
        let out = self.admin("/clusters");
        let prefix = format!("{cluster}::");
        out.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|rest| rest.split_once("::health_flags::"))
            .map(|(host, flags)| (host.to_string(), flags.to_string()))
            .collect()
    }

    fn stat(&self, name_contains: &str) -> u64 {
        self.admin("/stats")
            .lines()
            .filter(|l| l.contains(name_contains))
            .filter_map(|l| l.rsplit_once(": ").and_then(|(_, v)| v.trim().parse::<u64>().ok()))
            .sum()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP app that answers each connection's bytes with `<tag>:<bytes>`.
fn tagged_echo(tag: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut out = format!("{tag}:").into_bytes();
                    out.extend_from_slice(&buf[..n]);
                    if s.write_all(&out).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// A plain HTTP/1.1 server outside the mesh.
fn http_server(body: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let mut s = s;
                let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    port
}

/// Sends `msg` to `port` and returns what comes back before the peer closes or 3 s pass.
fn exchange(port: u16, msg: &[u8], until: &[u8]) -> Vec<u8> {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return vec![] };
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    if s.write_all(msg).is_err() {
        return vec![];
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if got.windows(until.len()).any(|w| w == until) {
            break;
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    got
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A with upstream B: bytes sent to A's `local_bind_port` reach B's app through both Envoys over
/// mTLS; B's public listener refuses plain TCP and TLS without a mesh certificate; B's sidecar
/// deregistered leaves A's upstream without endpoints.
#[test]
fn two_envoys_carry_bytes_over_mtls_from_the_standin_xds() {
    require_prereqs!(Prereq::Envoy);
    let (s, c) = standin();
    let grpc = s.grpc_addr().unwrap().port();
    let td = s.ca().unwrap().trust_domain.clone();
    let b_cluster = format!("b.default.dc1.internal.{td}");
    let (app_a, app_b) = (tagged_echo("a"), tagged_echo("b"));
    let (public_a, public_b, upstream_b) = (free_port(), free_port(), free_port());
    put(
        &c,
        "/v1/agent/service/register",
        &json!({"Name": "b", "ID": "b-1", "Port": app_b, "Address": "127.0.0.1", "Connect": {"SidecarService": {
            "Port": public_b, "Check": {"TCP": format!("127.0.0.1:{public_b}"), "Interval": "1s"}}}}),
    );
    put(
        &c,
        "/v1/agent/service/register",
        &json!({"Name": "a", "ID": "a-1", "Port": app_a, "Address": "127.0.0.1", "Connect": {"SidecarService": {
            "Port": public_a, "Check": {"TCP": format!("127.0.0.1:{public_a}"), "Interval": "1s"},
            "Proxy": {"Upstreams": [{"DestinationName": "b", "LocalBindPort": upstream_b}]}}}}),
    );
    let a_token = identity_token(&c, "a");
    let envoy_b = Envoy::start("envoy-b", &envoy_bootstrap("b-1-sidecar-proxy", "b", grpc, MANAGEMENT));
    let envoy_a = Envoy::start("envoy-a", &envoy_bootstrap("a-1-sidecar-proxy", "a", grpc, &a_token));
    envoy_b.wait_ready();
    envoy_a.wait_ready();

    let healthy = wait_for_blocking("A's upstream has B's sidecar, healthy", WAIT, || {
        envoy_a.hosts(&b_cluster).into_iter().find(|(h, f)| *h == format!("127.0.0.1:{public_b}") && f == "healthy")
    });
    assert!(healthy.is_ok(), "hosts {:?}\nnacks {:?}\n{}", envoy_a.hosts(&b_cluster), s.xds_nacks(), envoy_a.log());
    let reply = wait_for_blocking("bytes through both sidecars", WAIT, || {
        let got = exchange(upstream_b, b"hello-mesh", b"b:hello-mesh");
        contains(&got, b"b:hello-mesh").then_some(got)
    });
    assert!(reply.is_ok(), "no reply through the mesh\nA:\n{}\nB:\n{}", envoy_a.log(), envoy_b.log());
    assert!(envoy_a.stat(&format!("cluster.{b_cluster}.ssl.handshake")) >= 1, "A's upstream did TLS");
    assert!(envoy_b.stat(&format!("listener.127.0.0.1_{public_b}.ssl.handshake")) >= 1, "B's public listener did TLS");
    assert!(s.xds_nacks().is_empty(), "{:?}", s.xds_nacks());

    // Without a mesh client certificate, B's public listener does not reach the app.
    let plain = exchange(public_b, b"hello-plain\n", b"b:");
    assert!(!contains(&plain, b"b:"), "plain TCP reached B's app: {plain:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut s_client = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{public_b}"), "-servername", &b_cluster, "-quiet"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    s_client.stdin.take().unwrap().write_all(b"hello-tls\n").unwrap();
    let out = wait_for_blocking("s_client ends", WAIT, || s_client.try_wait().ok().flatten()).map(|_| s_client.wait_with_output().unwrap());
    let out = out.expect("s_client exits on its own");
    assert!(!contains(&out.stdout, b"b:"), "TLS without a client cert reached B's app: {:?}", String::from_utf8_lossy(&out.stdout));
    let refused = wait_for_blocking("B counts the missing client certificate", WAIT, || {
        (envoy_b.stat(&format!("listener.127.0.0.1_{public_b}.ssl.fail_verify_no_cert")) >= 1).then_some(())
    });
    assert!(refused.is_ok(), "stats:\n{}", envoy_b.admin("/stats?filter=ssl"));

    // B's sidecar goes away: A's upstream is left without endpoints.
    put(&c, "/v1/agent/service/deregister/b-1-sidecar-proxy", &json!({}));
    let empty = wait_for_blocking("A's upstream without endpoints", WAIT, || envoy_a.hosts(&b_cluster).is_empty().then_some(()));
    assert!(empty.is_ok(), "{:?}", envoy_a.hosts(&b_cluster));
    let after = exchange(upstream_b, b"hello-again", b"b:");
    assert!(!contains(&after, b"b:"), "reached B without endpoints: {after:?}");
}

/// A terminating gateway, linked to an HTTP server outside the mesh by its config entry, lets A
/// reach it through A's upstream: A's Envoy → mTLS (SNI `ext....`) → the gateway → plain HTTP.
#[test]
fn a_terminating_gateway_lets_a_reach_an_http_server_outside_the_mesh() {
    require_prereqs!(Prereq::Envoy);
    let (s, c) = standin();
    let grpc = s.grpc_addr().unwrap().port();
    let td = s.ca().unwrap().trust_domain.clone();
    let ext_cluster = format!("ext.default.dc1.internal.{td}");
    let http = http_server("outside-the-mesh");
    let (app_a, public_a, upstream_ext, gateway_port) = (tagged_echo("a"), free_port(), free_port(), free_port());
    put(&c, "/v1/agent/service/register", &json!({"Name": "ext", "ID": "ext-1", "Port": http, "Address": "127.0.0.1"}));
    put(
        &c,
        "/v1/agent/service/register",
        &json!({"Kind": "terminating-gateway", "Name": "tgw", "ID": "tgw-1", "Port": gateway_port, "Address": "127.0.0.1",
                "Check": {"TCP": format!("127.0.0.1:{gateway_port}"), "Interval": "1s"}}),
    );
    put(&c, "/v1/config", &json!({"Kind": "terminating-gateway", "Name": "tgw", "Services": [{"Name": "ext"}]}));
    put(
        &c,
        "/v1/agent/service/register",
        &json!({"Name": "a", "ID": "a-1", "Port": app_a, "Address": "127.0.0.1", "Connect": {"SidecarService": {
            "Port": public_a, "Proxy": {"Upstreams": [{"DestinationName": "ext", "LocalBindPort": upstream_ext}]}}}}),
    );
    let gateway = Envoy::start("gateway", &envoy_bootstrap("tgw-1", "tgw", grpc, MANAGEMENT));
    let envoy_a = Envoy::start("envoy-a", &envoy_bootstrap("a-1-sidecar-proxy", "a", grpc, MANAGEMENT));
    gateway.wait_ready();
    envoy_a.wait_ready();
    let healthy = wait_for_blocking("A's ext upstream points at the gateway", WAIT, || {
        envoy_a.hosts(&ext_cluster).into_iter().find(|(h, f)| *h == format!("127.0.0.1:{gateway_port}") && f == "healthy")
    });
    assert!(healthy.is_ok(), "hosts {:?}\n{}", envoy_a.hosts(&ext_cluster), envoy_a.log());
    let got = wait_for_blocking("HTTP through the gateway", WAIT, || {
        let got = exchange(upstream_ext, b"GET / HTTP/1.1\r\nHost: ext\r\nConnection: close\r\n\r\n", b"outside-the-mesh");
        contains(&got, b"outside-the-mesh").then_some(got)
    });
    assert!(got.is_ok(), "no answer through the gateway\nA:\n{}\ngateway:\n{}", envoy_a.log(), gateway.log());
    assert!(gateway.stat(&format!("listener.127.0.0.1_{gateway_port}.ssl.handshake")) >= 1, "the gateway terminated mTLS");
    assert!(s.xds_nacks().is_empty(), "{:?}", s.xds_nacks());
}

/// `consul-standin --xds` serves the control plane and prints its gRPC address second.
#[test]
fn the_binary_with_xds_prints_its_grpc_address() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_consul-standin")).arg("--xds").stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut http, mut grpc) = (String::new(), String::new());
    out.read_line(&mut http).unwrap();
    out.read_line(&mut grpc).unwrap();
    let http = http.trim().strip_prefix("consul-standin listening on ").expect(&http).to_string();
    let grpc = grpc.trim().strip_prefix("consul-standin grpc on ").expect(&grpc).to_string();
    let v = HttpClient::new(&http).get_json("/v1/agent/self");
    let reachable = TcpStream::connect(&grpc).is_ok();
    child.kill().unwrap();
    child.wait().unwrap();
    let port: u16 = grpc.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(v.unwrap()["DebugConfig"]["GRPCPort"], port);
    assert!(reachable, "nothing listens on {grpc}");
}
