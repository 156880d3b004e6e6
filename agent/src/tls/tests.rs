use std::net::IpAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_SIG_ECDSA_WITH_SHA256};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::generate::{CaRequest, CertRequest, Role, ca, cert};
use super::*;

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
}

fn ca_req() -> CaRequest {
    CaRequest { days: 1825, domain: "nomad".into(), common_name: String::new(), name_constraint: false, additional_domains: vec![] }
}

fn cert_req(role: Role, region: &str) -> CertRequest {
    CertRequest { role, region: region.into(), domain: "nomad".into(), days: 365, additional_dns: vec![], additional_ips: vec![] }
}

/// DNS and IP SANs of a certificate.
fn sans(c: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for n in &c.subject_alternative_name().unwrap().expect("a SAN extension").value.general_names {
        match n {
            GeneralName::DNSName(d) => dns.push(d.to_string()),
            GeneralName::IPAddress(b) if b.len() == 4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap())),
            GeneralName::IPAddress(b) if b.len() == 16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap())),
            other => panic!("unexpected SAN {other:?}"),
        }
    }
    (dns, ips)
}

fn assert_p256(c: &X509Certificate<'_>) {
    let spki = c.public_key();
    assert_eq!(spki.algorithm.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY, "an EC key");
    let curve = spki.algorithm.parameters.as_ref().unwrap().as_oid().unwrap();
    assert_eq!(curve, OID_EC_P256, "on P-256");
    assert_eq!(c.signature_algorithm.algorithm, OID_SIG_ECDSA_WITH_SHA256);
}

fn days_valid(c: &X509Certificate<'_>) -> i64 {
    (c.validity().not_after.timestamp() - c.validity().not_before.timestamp()) / 86_400
}

#[test]
fn a_ca_is_p256_self_signed_named_after_its_serial_and_valid_five_years() {
    let g = ca(&ca_req()).unwrap();
    let der = der_of(&g.cert_pem);
    let (_, c) = X509Certificate::from_der(&der).unwrap();
    assert_p256(&c);
    assert!(c.is_ca());
    assert_eq!(days_valid(&c), 1825);
    let cn = c.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string();
    assert!(cn.starts_with("Nomad Agent CA ") && cn.len() > "Nomad Agent CA ".len(), "{cn}");
    assert_eq!(c.subject(), c.issuer());
    c.verify_signature(None).expect("self-signed");
    assert!(g.key_pem.contains("PRIVATE KEY"));
    assert!(c.name_constraints().unwrap().is_none(), "no constraint unless asked");

    let constrained = ca(&CaRequest { name_constraint: true, additional_domains: vec!["example.com".into()], ..ca_req() }).unwrap();
    let der = der_of(&constrained.cert_pem);
    let (_, c) = X509Certificate::from_der(&der).unwrap();
    let nc = c.name_constraints().unwrap().expect("a name constraint");
    assert!(nc.critical);
    let permitted: Vec<String> = nc
        .value
        .permitted_subtrees
        .as_ref()
        .unwrap()
        .iter()
        .map(|s| match &s.base {
            GeneralName::DNSName(d) => d.to_string(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(permitted, ["nomad", "localhost", "example.com"]);
}

#[test]
fn server_client_and_cli_certificates_carry_nomads_names_and_validity() {
    let authority = ca(&ca_req()).unwrap();
    let ca_der = der_of(&authority.cert_pem);
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
    for (role, dns, ips, server_auth) in [
        (Role::Server, vec!["server.global.nomad", "localhost"], vec![IpAddr::from([127, 0, 0, 1])], true),
        (Role::Client, vec!["client.global.nomad", "localhost"], vec![IpAddr::from([127, 0, 0, 1])], true),
        (Role::Cli, vec!["cli.global.nomad", "localhost"], vec![], false),
    ] {
        let g = cert(&cert_req(role, "global"), &authority.cert_pem, &authority.key_pem).unwrap();
        let der = der_of(&g.cert_pem);
        let (_, c) = X509Certificate::from_der(&der).unwrap();
        assert_p256(&c);
        assert!(!c.is_ca());
        assert_eq!(days_valid(&c), 365);
        assert_eq!(c.subject().iter_common_name().next().unwrap().as_str().unwrap(), dns[0]);
        assert_eq!(sans(&c), (dns.iter().map(|s| s.to_string()).collect(), ips), "{role:?}");
        assert_eq!(c.issuer(), ca_cert.subject());
        c.verify_signature(Some(ca_cert.public_key())).expect("signed by the CA");
        let eku = c.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth);
        assert_eq!(eku.server_auth, server_auth, "{role:?}");
    }
}

#[test]
fn another_region_also_names_the_global_one_and_the_additional_names_follow() {
    let authority = ca(&ca_req()).unwrap();
    let req = CertRequest {
        additional_dns: vec!["nomad.example.com".into(), "localhost".into()],
        additional_ips: vec!["10.0.0.7".parse().unwrap(), "::1".parse().unwrap()],
        days: 30,
        ..cert_req(Role::Server, "eu")
    };
    assert_eq!(req.file_stem(), "eu-server-nomad");
    let g = cert(&req, &authority.cert_pem, &authority.key_pem).unwrap();
    let der = der_of(&g.cert_pem);
    let (_, c) = X509Certificate::from_der(&der).unwrap();
    let (dns, ips) = sans(&c);
    assert_eq!(dns, ["server.eu.nomad", "server.global.nomad", "localhost", "nomad.example.com"]);
    assert_eq!(ips, [IpAddr::from([127, 0, 0, 1]), "10.0.0.7".parse().unwrap(), "::1".parse().unwrap()]);
    assert_eq!(days_valid(&c), 30);
}

#[test]
fn the_commands_write_nomads_files_and_never_overwrite_them() {
    use std::os::unix::fs::PermissionsExt;

    use crate::cli::tls::{CaCreateArgs, CertCreateArgs, ca_create, cert_create};
    let dir = tempfile::tempdir().unwrap();
    let ca_args =
        CaCreateArgs { additional_domain: vec![], common_name: String::new(), days: 1825, domain: "nomad".into(), name_constraint: false };
    assert_eq!(ca_create(dir.path(), &ca_args), Ok(0));
    let ca_pem = std::fs::read_to_string(dir.path().join("nomad-agent-ca.pem")).unwrap();
    let mode = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode("nomad-agent-ca-key.pem"), 0o600);
    let again = ca_create(dir.path(), &ca_args).unwrap_err();
    assert_eq!(again.message, "CA certificate file 'nomad-agent-ca.pem' already exists");
    assert_eq!(std::fs::read_to_string(dir.path().join("nomad-agent-ca.pem")).unwrap(), ca_pem, "untouched");

    let args = |server: bool, client: bool, cli: bool| CertCreateArgs {
        additional_dnsname: vec![],
        additional_ipaddress: vec![],
        ca: None,
        key: None,
        cli,
        client,
        server,
        days: 365,
        domain: "nomad".into(),
        region: None,
        cluster_region: None,
    };
    assert_eq!(
        cert_create(dir.path(), &args(false, false, false), None).unwrap_err().message,
        "Please provide either -server, -client, or -cli"
    );
    assert!(cert_create(dir.path(), &args(true, true, false), None).is_err());
    assert_eq!(cert_create(dir.path(), &args(true, false, false), None), Ok(0));
    assert_eq!(cert_create(dir.path(), &args(false, true, false), None), Ok(0));
    assert_eq!(cert_create(dir.path(), &args(false, false, true), Some("eu".into())), Ok(0), "NOMAD_REGION names the region");
    for name in ["global-server-nomad.pem", "global-client-nomad.pem", "eu-cli-nomad.pem"] {
        assert!(dir.path().join(name).is_file(), "{name}");
    }
    for key in ["global-server-nomad-key.pem", "global-client-nomad-key.pem", "eu-cli-nomad-key.pem"] {
        assert_eq!(mode(key), 0o600, "{key}");
    }
    let before = std::fs::read(dir.path().join("global-server-nomad.pem")).unwrap();
    let again = cert_create(dir.path(), &args(true, false, false), None).unwrap_err();
    assert_eq!(again.message, "Server certificate file 'global-server-nomad.pem' already exists");
    assert_eq!(std::fs::read(dir.path().join("global-server-nomad.pem")).unwrap(), before);
    // A key left alone is refused as well, before anything is written.
    std::fs::remove_file(dir.path().join("global-client-nomad.pem")).unwrap();
    let again = cert_create(dir.path(), &args(false, true, false), None).unwrap_err();
    assert_eq!(again.message, "Client certificate key file 'global-client-nomad-key.pem' already exists");
    assert!(!dir.path().join("global-client-nomad.pem").exists());
    let bad_ip = CertCreateArgs { additional_ipaddress: vec!["nope".into()], ..args(true, false, false) };
    assert!(cert_create(dir.path(), &bad_ip, None).unwrap_err().message.contains("-additional-ipaddress"));
}

fn block(src: &str) -> Result<TlsSettings, (String, String)> {
    let v: serde_json::Value = hcl::from_str(src).unwrap();
    TlsSettings::resolve(Some(serde_json::from_value(v).unwrap()))
}

#[test]
fn the_tls_block_is_checked_and_rpc_upgrade_mode_is_refused_by_name() {
    let ok = block(
        "http = true\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nverify_https_client = true\n\
         tls_min_version = \"tls13\"\ntls_cipher_suites = \"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305\"\n\
         tls_prefer_server_cipher_suites = true\n",
    )
    .unwrap();
    assert!(ok.http && ok.verify_https_client && ok.prefer_server_cipher_suites);
    assert_eq!(ok.min_version, MinVersion::Tls13);
    assert_eq!(ok.cert_file, Some(PathBuf::from("c.pem")));
    assert_eq!(ok.cipher_suites.as_ref().unwrap().len(), 2);
    assert_eq!(block("").unwrap(), TlsSettings::default());
    let (k, m) = block("rpc_upgrade_mode = true\n").unwrap_err();
    assert_eq!(k, "tls.rpc_upgrade_mode");
    assert!(m.contains("rpc_upgrade_mode") && m.contains("not built yet"), "{m}");
    assert!(block("rpc_upgrade_mode = false\n").is_ok());
    let rpc =
        block("rpc = true\nverify_server_hostname = true\nca_file = \"ca.pem\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n").unwrap();
    assert!(rpc.rpc && rpc.verify_server_hostname && !rpc.http);
    let (k, m) = block("rpc = true\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n").unwrap_err();
    assert_eq!(k, "tls.rpc");
    assert!(m.contains("needs ca_file, cert_file and key_file"), "{m}");
    for (src, key, says) in [
        ("tls_min_version = \"tls11\"", "tls.tls_min_version", "tls11 is not supported"),
        ("tls_min_version = \"ssl3\"", "tls.tls_min_version", "unknown TLS version"),
        ("tls_cipher_suites = \"TLS_RSA_WITH_AES_128_CBC_SHA\"", "tls.tls_cipher_suites", "is not supported by nomad-rs"),
        ("tls_cipher_suites = \"TLS_MADE_UP\"", "tls.tls_cipher_suites", "unknown cipher suite"),
        ("http = true\ncert_file = \"c.pem\"", "tls.http", "needs cert_file and key_file"),
        ("verify_https_client = true", "tls.verify_https_client", "needs ca_file"),
    ] {
        let (k, m) = block(src).unwrap_err();
        assert_eq!(k, key, "{src}");
        assert!(m.contains(says), "{src}: {m}");
    }
}

#[test]
fn go_booleans_parse_as_go_does() {
    assert_eq!(parse_go_bool("T"), Some(true));
    assert_eq!(parse_go_bool("0"), Some(false));
    assert_eq!(parse_go_bool("yes"), None);
}

/// A CA with a server and a CLI certificate in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca: generate::Generated,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let authority = ca(&ca_req()).unwrap();
        std::fs::write(dir.path().join("ca.pem"), &authority.cert_pem).unwrap();
        let pki = Pki { dir, ca: authority };
        pki.issue(Role::Server, "server");
        pki.issue(Role::Cli, "cli");
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `<stem>.pem` and `<stem>-key.pem`; returns the certificate's DER.
    fn issue(&self, role: Role, stem: &str) -> Vec<u8> {
        let g = cert(&cert_req(role, "global"), &self.ca.cert_pem, &self.ca.key_pem).unwrap();
        std::fs::write(self.path(&format!("{stem}.pem")), &g.cert_pem).unwrap();
        std::fs::write(self.path(&format!("{stem}-key.pem")), &g.key_pem).unwrap();
        der_of(&g.cert_pem)
    }

    fn settings(&self) -> TlsSettings {
        TlsSettings {
            http: true,
            ca_file: Some(self.path("ca.pem")),
            cert_file: Some(self.path("server.pem")),
            key_file: Some(self.path("server-key.pem")),
            verify_https_client: true,
            ..Default::default()
        }
    }

    fn cli(&self, with_cert: bool) -> ClientTls {
        ClientTls {
            ca_cert: Some(self.path("ca.pem")),
            client_cert: with_cert.then(|| self.path("cli.pem")),
            client_key: with_cert.then(|| self.path("cli-key.pem")),
            ..Default::default()
        }
    }
}

async fn serve_https(tls: &Arc<ReloadableServer>) -> SocketAddr {
    use nomad_server::http::listener::{HttpLimits, serve_with};
    let router = axum::Router::new().route("/v1/ok", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_with(listener, router, HttpLimits::default(), Some(tls.handshake())));
    addr
}

/// GET /v1/ok over HTTPS with `client`.
async fn get_ok(client: &ClientTls, addr: SocketAddr) -> anyhow::Result<String> {
    use http_body_util::BodyExt;
    let http = hyper_util::client::legacy::connect::HttpConnector::new();
    let c: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(client.connector(http, true)?);
    let resp = c.get(format!("https://localhost:{}/v1/ok", addr.port()).parse()?).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The certificate the listener presents now.
async fn served_cert(client: &ClientTls, addr: SocketAddr) -> Vec<u8> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = client.connect("localhost", tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn https_requires_a_ca_signed_client_cert_refuses_plain_http_and_reloads_certificates() {
    let pki = Pki::new();
    let tls = ReloadableServer::new(pki.settings()).unwrap();
    let addr = serve_https(&tls).await;

    assert_eq!(get_ok(&pki.cli(true), addr).await.unwrap(), "ok");
    assert!(get_ok(&pki.cli(false), addr).await.is_err(), "no client certificate: refused");
    // A certificate from another CA is refused too.
    let other = Pki::new();
    let stranger = ClientTls { ca_cert: Some(pki.path("ca.pem")), ..other.cli(true) };
    assert!(get_ok(&stranger, addr).await.is_err(), "a client certificate of another CA: refused");
    // The CA is checked on the client side: another CA's roots do not trust this server.
    assert!(get_ok(&other.cli(true), addr).await.is_err());

    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"GET /v1/ok HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), plain.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request\r\n"), "{answer}");
    assert!(answer.ends_with(&format!("\r\n\r\n{PLAIN_HTTP_TO_HTTPS}\n")), "{answer}");

    let first = served_cert(&pki.cli(true), addr).await;
    let rotated = pki.issue(Role::Server, "server");
    assert_ne!(first, rotated);
    assert_eq!(served_cert(&pki.cli(true), addr).await, first, "no reload yet: the old certificate");
    tls.reload().unwrap();
    assert_eq!(served_cert(&pki.cli(true), addr).await, rotated, "the rotated certificate after a reload");
    // A broken file on reload keeps the certificate in use.
    std::fs::write(pki.path("server.pem"), "garbage").unwrap();
    assert!(tls.reload().is_err());
    assert_eq!(served_cert(&pki.cli(true), addr).await, rotated);
    assert_eq!(get_ok(&pki.cli(true), addr).await.unwrap(), "ok");
}

#[tokio::test]
async fn min_version_and_skip_verify_and_server_name_are_honoured() {
    let pki = Pki::new();
    let tls13 =
        ReloadableServer::new(TlsSettings { min_version: MinVersion::Tls13, verify_https_client: false, ..pki.settings() }).unwrap();
    let addr = serve_https(&tls13).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let s = pki.cli(false).connect("localhost", tcp).await.unwrap();
    assert_eq!(s.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));

    // A TLS 1.2-only client cannot talk to a tls13 listener.
    let only12 = ClientConfig::builder_with_provider(Arc::new(ring_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(read_roots(&pki.path("ca.pem")).unwrap())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let refused = tokio_rustls::TlsConnector::from(Arc::new(only12)).connect(ServerName::try_from("localhost").unwrap(), tcp).await;
    assert!(refused.is_err());

    // The name must match unless another is given or verification is skipped.
    let wrong_name = ClientTls { server_name: Some("elsewhere.example".into()), ..pki.cli(false) };
    assert!(get_ok(&wrong_name, addr).await.is_err());
    let right_name = ClientTls { server_name: Some("server.global.nomad".into()), ..pki.cli(false) };
    assert_eq!(get_ok(&right_name, addr).await.unwrap(), "ok");
    let skip = ClientTls { skip_verify: true, ..Default::default() };
    assert_eq!(get_ok(&skip, addr).await.unwrap(), "ok");
    let chain_only = ClientTls { chain_only: true, server_name: Some("elsewhere.example".into()), ..pki.cli(false) };
    assert_eq!(get_ok(&chain_only, addr).await.unwrap(), "ok", "chain-only ignores the name");
    let other = Pki::new();
    let chain_only_other_ca = ClientTls { chain_only: true, ..other.cli(false) };
    assert!(get_ok(&chain_only_other_ca, addr).await.is_err(), "chain-only still checks the CA");
}

#[test]
fn a_cipher_suite_list_limits_tls12_and_keeps_tls13() {
    let s = TlsSettings { cipher_suites: Some(vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".into()]), ..Default::default() };
    let p = s.provider();
    let names: Vec<String> = p.cipher_suites.iter().map(|c| format!("{:?}", c.suite())).collect();
    assert!(names.contains(&"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("CHACHA20") && !n.starts_with("TLS13")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("TLS13")), "{names:?}");
    for (_, rustls_name) in SUITES {
        assert!(ring_suite(rustls_name).is_some(), "{rustls_name} is a ring suite");
    }
}

#[tokio::test]
async fn rpc_tls_requires_client_certificates_reads_the_peer_names_and_checks_the_server_name() {
    use futures::StreamExt as _;
    use nomad_server::rpc_listener::{RpcLimits, incoming_with};
    use tonic::transport::server::Connected as _;

    let pki = Pki::new();
    pki.issue(Role::Client, "client");
    let rpc = |stem: &str| {
        let s = TlsSettings {
            rpc: true,
            verify_server_hostname: true,
            ca_file: Some(pki.path("ca.pem")),
            cert_file: Some(pki.path(&format!("{stem}.pem"))),
            key_file: Some(pki.path(&format!("{stem}-key.pem"))),
            ..Default::default()
        };
        s.rpc_tls("global").unwrap().expect("rpc is on")
    };
    let serve = |tls: Arc<nomad_server::rpc_tls::RpcTls>| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut conns = incoming_with(listener, RpcLimits::default(), Some(tls));
            while let Some(Ok(c)) = conns.next().await {
                let _ = tx.send(c);
            }
        });
        (addr, rx)
    };
    let (server_tls, client_tls) = (rpc("server"), rpc("client"));
    assert!(TlsSettings::default().rpc_tls("global").unwrap().is_none());

    // A client dials a server: TLS, and the server reads the client's certificate names.
    let (addr, mut accepted) = serve(server_tls.clone()).await;
    let uri: http::Uri = format!("http://{addr}").parse().unwrap();
    let mut dialled = client_tls.connect(&uri).await.expect("a client reaches a server");
    dialled.write_all(b"x").await.unwrap();
    let conn = tokio::time::timeout(Duration::from_secs(10), accepted.recv()).await.unwrap().unwrap();
    let peer = conn.connect_info().peer.expect("a TLS peer");
    assert!(peer.has("client.global.nomad") && !peer.has("server.global.nomad"), "{peer:?}");
    assert_eq!(dialled.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    // Plaintext on the TLS port is closed and never handed to the services.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), plain.read(&mut buf)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(accepted.try_recv().is_err());

    // A listener holding a client's certificate is not a server to verify_server_hostname.
    let (rogue, _rogue_accepted) = serve(client_tls.clone()).await;
    let err = server_tls.connect(&format!("http://{rogue}").parse().unwrap()).await.unwrap_err();
    assert!(err.to_string().to_lowercase().contains("name"), "{err}");
}
