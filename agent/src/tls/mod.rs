//! TLS for the HTTP API and RPC: the agent's `tls {}` block, the HTTPS listener's rustls config
//! (reloaded on SIGHUP), the client side shared by the CLI and agent-to-agent calls, and the
//! configs of mutual TLS on RPC ([`TlsSettings::rpc_tls`], served and dialled by
//! `nomad_server::rpc_tls`).
//!
//! [`generate`] makes the CA and certificates of `nomad-rs tls ca|cert create`.
//!
//! Only ring is used as the crypto provider, passed explicitly (no process-wide default).

pub mod generate;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedCipherSuite};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Go's answer to a plaintext request on an HTTPS port (`net/http`), body included.
pub const PLAIN_HTTP_TO_HTTPS: &str = "Client sent an HTTP request to an HTTPS server.";

/// `tls {}` as written in an agent config file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsBlock {
    /// HTTPS only on the HTTP listener.
    pub http: Option<bool>,
    /// Mutual TLS on RPC.
    pub rpc: Option<bool>,
    /// CA bundle (PEM) client certificates and peers are checked against.
    pub ca_file: Option<String>,
    /// The agent's certificate (PEM, chain allowed).
    pub cert_file: Option<String>,
    /// The agent's private key (PEM).
    pub key_file: Option<String>,
    /// RPC name checks: `server.<region>.nomad` dialled, roles checked on the RPC port.
    pub verify_server_hostname: Option<bool>,
    /// HTTPS asks for a client certificate signed by `ca_file`.
    pub verify_https_client: Option<bool>,
    /// RPC plaintext + TLS (not built yet: refused when true).
    pub rpc_upgrade_mode: Option<bool>,
    /// `tls12` (default) or `tls13`.
    pub tls_min_version: Option<String>,
    /// Comma-separated Go cipher suite names (TLS 1.2; TLS 1.3's suites are always on, as in Go).
    pub tls_cipher_suites: Option<String>,
    /// The server's order of cipher suites wins.
    pub tls_prefer_server_cipher_suites: Option<bool>,
}

/// Lowest TLS version the listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    /// TLS 1.2 (Nomad's default).
    #[default]
    Tls12,
    /// TLS 1.3.
    Tls13,
}

/// The `tls {}` block, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TlsSettings {
    /// HTTPS on the HTTP listener.
    pub http: bool,
    /// Mutual TLS on the RPC port and every outgoing RPC.
    pub rpc: bool,
    /// With `rpc`: outgoing RPC checks `server.<region>.nomad`, incoming calls the role names.
    pub verify_server_hostname: bool,
    /// CA bundle.
    pub ca_file: Option<PathBuf>,
    /// Certificate.
    pub cert_file: Option<PathBuf>,
    /// Key.
    pub key_file: Option<PathBuf>,
    /// Require a CA-signed client certificate on HTTPS.
    pub verify_https_client: bool,
    /// Lowest version.
    pub min_version: MinVersion,
    /// TLS 1.2 suites by Go name, in order (`None`: the default set).
    pub cipher_suites: Option<Vec<String>>,
    /// The server's cipher order wins.
    pub prefer_server_cipher_suites: bool,
}

/// Go's names of the TLS 1.2 suites rustls has (ECDHE with AES-GCM or ChaCha20-Poly1305).
const SUITES: &[(&str, &str)] = &[
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
];

/// Go suites rustls does not implement (CBC, RSA key exchange, 3DES, RC4): named in the error.
const UNSUPPORTED_SUITES: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// rustls' ring provider, the only one built in (aws-lc-rs would need a C toolchain and cmake).
/// rustls 0.23.48 marks it deprecated for lacking post-quantum key exchange; TLS 1.3 here uses
/// X25519 and the NIST curves.
#[allow(deprecated)]
pub fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn ring_suite(rustls_name: &str) -> Option<SupportedCipherSuite> {
    rustls::crypto::ring::ALL_CIPHER_SUITES.iter().copied().find(|s| format!("{:?}", s.suite()) == rustls_name)
}

impl TlsSettings {
    /// Checks a `tls {}` block. Errors are `(key, message)`; `rpc_upgrade_mode` is refused by name.
    pub fn resolve(b: Option<TlsBlock>) -> Result<TlsSettings, (String, String)> {
        let Some(b) = b else { return Ok(TlsSettings::default()) };
        if b.rpc_upgrade_mode == Some(true) {
            return Err((
                "tls.rpc_upgrade_mode".into(),
                "rpc_upgrade_mode = true is not supported yet: nomad-rs serves RPC either plaintext or TLS only (RPC upgrade mode is not built yet)".into(),
            ));
        }
        let path = |s: Option<String>| s.filter(|s| !s.is_empty()).map(PathBuf::from);
        let min_version = match b.tls_min_version.as_deref().map(str::trim) {
            None | Some("") | Some("tls12") => MinVersion::Tls12,
            Some("tls13") => MinVersion::Tls13,
            Some(v @ ("tls10" | "tls11")) => {
                return Err((
                    "tls.tls_min_version".into(),
                    format!("{v} is not supported: nomad-rs speaks TLS 1.2 and 1.3 (use tls12 or tls13)"),
                ));
            }
            Some(v) => {
                return Err(("tls.tls_min_version".into(), format!("unknown TLS version {v:?}: use tls12 or tls13")));
            }
        };
        let cipher_suites = match b.tls_cipher_suites.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(list) => {
                let mut names = Vec::new();
                for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                    if !SUITES.iter().any(|(go, _)| *go == name) {
                        let why = if UNSUPPORTED_SUITES.contains(&name) {
                            "is not supported by nomad-rs (rustls)"
                        } else {
                            "is an unknown cipher suite"
                        };
                        let known: Vec<&str> = SUITES.iter().map(|(go, _)| *go).collect();
                        return Err(("tls.tls_cipher_suites".into(), format!("{name} {why}; supported: {}", known.join(", "))));
                    }
                    names.push(name.to_string());
                }
                Some(names)
            }
        };
        let s = TlsSettings {
            http: b.http.unwrap_or(false),
            rpc: b.rpc.unwrap_or(false),
            verify_server_hostname: b.verify_server_hostname.unwrap_or(false),
            ca_file: path(b.ca_file),
            cert_file: path(b.cert_file),
            key_file: path(b.key_file),
            verify_https_client: b.verify_https_client.unwrap_or(false),
            min_version,
            cipher_suites,
            prefer_server_cipher_suites: b.tls_prefer_server_cipher_suites.unwrap_or(false),
        };
        if s.http && (s.cert_file.is_none() || s.key_file.is_none()) {
            return Err(("tls.http".into(), "http = true needs cert_file and key_file".into()));
        }
        if s.rpc && (s.ca_file.is_none() || s.cert_file.is_none() || s.key_file.is_none()) {
            return Err((
                "tls.rpc".into(),
                "rpc = true needs ca_file, cert_file and key_file (every RPC peer must present a CA-signed certificate)".into(),
            ));
        }
        if s.verify_https_client && s.ca_file.is_none() {
            return Err(("tls.verify_https_client".into(), "verify_https_client = true needs ca_file".into()));
        }
        Ok(s)
    }

    /// The crypto provider with the configured cipher suites (TLS 1.3's always, as in Go).
    fn provider(&self) -> rustls::crypto::CryptoProvider {
        let mut p = ring_provider();
        if let Some(names) = &self.cipher_suites {
            let mut suites: Vec<SupportedCipherSuite> =
                p.cipher_suites.iter().copied().filter(|s| s.version().version == rustls::ProtocolVersion::TLSv1_3).collect();
            for name in names {
                if let Some(s) = SUITES.iter().find(|(go, _)| go == name).and_then(|(_, r)| ring_suite(r))
                    && !suites.iter().any(|have| have.suite() == s.suite())
                {
                    suites.push(s);
                }
            }
            p.cipher_suites = suites;
        }
        p
    }

    fn versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        match self.min_version {
            MinVersion::Tls12 => rustls::ALL_VERSIONS,
            MinVersion::Tls13 => TLS13_ONLY,
        }
    }

    /// The HTTPS listener's config, read from the files now.
    pub fn server_config(&self) -> anyhow::Result<ServerConfig> {
        use anyhow::Context;
        let (Some(cert_file), Some(key_file)) = (&self.cert_file, &self.key_file) else {
            anyhow::bail!("tls: cert_file and key_file are needed to serve HTTPS");
        };
        let certs = read_certs(cert_file)?;
        let key = read_key(key_file)?;
        let builder = ServerConfig::builder_with_provider(Arc::new(self.provider()))
            .with_protocol_versions(self.versions())
            .context("tls: versions")?;
        let builder = if self.verify_https_client {
            let ca = self.ca_file.as_ref().context("tls: verify_https_client needs ca_file")?;
            let roots = Arc::new(read_roots(ca)?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, Arc::new(self.provider()))
                .build()
                .context("tls: the client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config =
            builder.with_single_cert(certs, key).with_context(|| format!("tls: {} and {}", cert_file.display(), key_file.display()))?;
        config.ignore_client_order = self.prefer_server_cipher_suites;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The RPC listener's config: the agent's certificate, and a CA-signed client certificate
    /// required of every peer (Nomad's `RequireAndVerifyClientCert` on RPC).
    pub fn rpc_server_config(&self) -> anyhow::Result<ServerConfig> {
        let strict = TlsSettings { verify_https_client: true, ..self.clone() };
        strict.server_config()
    }

    /// The config of outgoing RPC: the agent's certificate as the client certificate, the
    /// peer's chain checked against `ca_file`, and its name (`server.<region>.nomad`, set by the
    /// dialler) only with `verify_server_hostname`.
    pub fn rpc_client_config(&self) -> anyhow::Result<ClientConfig> {
        let tls = ClientTls {
            ca_cert: self.ca_file.clone(),
            client_cert: self.cert_file.clone(),
            client_key: self.key_file.clone(),
            chain_only: !self.verify_server_hostname,
            ..Default::default()
        };
        tls.config()
    }

    /// RPC TLS for `region` when `rpc` is on: the files are read now (an error stops the start)
    /// and again on each [`nomad_server::rpc_tls::RpcTls::reload`].
    pub fn rpc_tls(&self, region: &str) -> anyhow::Result<Option<Arc<nomad_server::rpc_tls::RpcTls>>> {
        if !self.rpc {
            return Ok(None);
        }
        let me = self.clone();
        let load: nomad_server::rpc_tls::Loader = Box::new(move || {
            let server = me.rpc_server_config().map_err(|e| format!("{e:#}"))?;
            let client = me.rpc_client_config().map_err(|e| format!("{e:#}"))?;
            Ok((server, client))
        });
        nomad_server::rpc_tls::RpcTls::new(region, self.verify_server_hostname, load)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("tls (rpc): {e}"))
    }

    /// The client side for calls to other agents: the agent's CA, its own certificate as the
    /// client certificate. `None` when `http` is off.
    pub fn agent_client(&self) -> anyhow::Result<Option<ClientTls>> {
        if !self.http {
            return Ok(None);
        }
        Ok(Some(ClientTls {
            ca_cert: self.ca_file.clone(),
            client_cert: self.cert_file.clone(),
            client_key: self.key_file.clone(),
            chain_only: true,
            ..Default::default()
        }))
    }
}

/// The TLS of this agent's own HTTP calls to other agents (forwarding, the exec relay): set once
/// at the agent's start when `tls.http` is on (one agent per process).
static AGENT_CLIENT: std::sync::OnceLock<ClientTls> = std::sync::OnceLock::new();

/// Sets [`AGENT_CLIENT`]; the first call wins.
pub fn set_agent_client(tls: ClientTls) {
    let _ = AGENT_CLIENT.set(tls);
}

/// `https` when this agent's peers serve TLS, else `http`.
pub fn agent_scheme() -> &'static str {
    if AGENT_CLIENT.get().is_some() { "https" } else { "http" }
}

/// `wss` or `ws`, as [`agent_scheme`].
pub fn agent_ws_scheme() -> &'static str {
    if AGENT_CLIENT.get().is_some() { "wss" } else { "ws" }
}

/// An HTTP client for calls to other agents, with this agent's certificate when TLS is on.
/// The files are read on each call, so a reloaded certificate is used from then on.
pub fn agent_http_client<B>() -> anyhow::Result<hyper_util::client::legacy::Client<AgentConnector, B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let connector = match AGENT_CLIENT.get() {
        Some(tls) => tls.connector(http, true)?,
        None => ClientTls::default().connector(http, false)?,
    };
    Ok(hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector))
}

/// [`agent_http_client`], or on an error (logged) a client whose https calls fail.
pub fn agent_http_client_or_plain<B>() -> hyper_util::client::legacy::Client<AgentConnector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    agent_http_client().unwrap_or_else(|e| {
        tracing::error!(error = %format!("{e:#}"), "TLS for calls to other agents");
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.enforce_http(false);
        let plain = ClientTls::default().connector(http, false).expect("a TLS config without files");
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(plain)
    })
}

/// The connector of [`agent_http_client`].
pub type AgentConnector = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// A stream to another agent for a websocket: TLS when this agent's peers serve it.
pub async fn agent_connect(addr: &str) -> std::io::Result<Box<dyn nomad_server::http::listener::Conn>> {
    let tcp = TcpStream::connect(addr).await?;
    match AGENT_CLIENT.get() {
        None => Ok(Box::new(tcp)),
        Some(tls) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            tls.connect(host, tcp).await.map(|s| Box::new(s) as Box<dyn nomad_server::http::listener::Conn>).map_err(std::io::Error::other)
        }
    }
}

/// Reads every certificate of a PEM file.
pub fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let text = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: not a PEM certificate: {e}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no certificate found", path.display());
    }
    Ok(certs)
}

/// Reads a PEM private key (PKCS#8, SEC1 or PKCS#1).
pub fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let text = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| anyhow::anyhow!("{}: no PEM private key: {e}", path.display()))
}

/// Reads a CA bundle into a root store.
pub fn read_roots(path: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(roots)
}

/// The HTTPS listener's config, swapped in place on SIGHUP; connections in progress keep the
/// config they started with.
#[derive(Debug)]
pub struct ReloadableServer {
    settings: TlsSettings,
    current: RwLock<Arc<ServerConfig>>,
}

impl ReloadableServer {
    /// Reads the files; an error stops the agent's start.
    pub fn new(settings: TlsSettings) -> anyhow::Result<Arc<ReloadableServer>> {
        let config = settings.server_config()?;
        Ok(Arc::new(ReloadableServer { settings, current: RwLock::new(Arc::new(config)) }))
    }

    /// Reads the files again; on an error the old config stays and the error is returned.
    pub fn reload(&self) -> anyhow::Result<()> {
        let config = self.settings.server_config()?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        Ok(())
    }

    /// The config new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The listener's handshake: a first byte that is not a TLS handshake record (a plaintext
    /// request) gets Go's 400 and the connection closes; otherwise TLS with the current config.
    pub fn handshake(self: &Arc<Self>) -> nomad_server::http::listener::Handshake {
        let me = self.clone();
        Arc::new(move |tcp: TcpStream, peer: SocketAddr| {
            let me = me.clone();
            Box::pin(async move {
                let mut first = [0u8; 1];
                match tcp.peek(&mut first).await {
                    Ok(1) if first[0] == 0x16 => {}
                    Ok(1) => {
                        refuse_plaintext(tcp).await;
                        return None;
                    }
                    _ => return None,
                }
                let acceptor = tokio_rustls::TlsAcceptor::from(me.current());
                match acceptor.accept(tcp).await {
                    Ok(tls) => Some(Box::new(tls) as Box<dyn nomad_server::http::listener::Conn>),
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        None
                    }
                }
            }) as Pin<Box<dyn std::future::Future<Output = Option<Box<dyn nomad_server::http::listener::Conn>>> + Send>>
        })
    }
}

/// Go's `net/http` answer to plaintext on a TLS port.
async fn refuse_plaintext(mut tcp: TcpStream) {
    let answer =
        format!("HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n{PLAIN_HTTP_TO_HTTPS}\n");
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let _ = tcp.write_all(answer.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

/// The client side of TLS (`NOMAD_CACERT` and friends, or an agent's own files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// CA bundle file.
    pub ca_cert: Option<PathBuf>,
    /// Directory of CA files.
    pub ca_path: Option<PathBuf>,
    /// Client certificate.
    pub client_cert: Option<PathBuf>,
    /// Client key.
    pub client_key: Option<PathBuf>,
    /// Name the server's certificate is checked for, instead of the address's host.
    pub server_name: Option<String>,
    /// No verification of the server's certificate at all.
    pub skip_verify: bool,
    /// The chain is verified against the CA but not the name (agent-to-agent calls: peers are
    /// reached by whatever address they advertise, as Nomad's RPC without
    /// `verify_server_hostname`).
    pub chain_only: bool,
}

impl ClientTls {
    /// rustls' client config: the given CA (or the system's roots), the client certificate, TLS
    /// 1.2+ and HTTP/1.1, as Nomad's Go client.
    pub fn config(&self) -> anyhow::Result<ClientConfig> {
        let provider = Arc::new(ring_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone()).with_protocol_versions(rustls::ALL_VERSIONS)?;
        let builder = if self.skip_verify {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        } else {
            let mut roots = RootCertStore::empty();
            if let Some(f) = &self.ca_cert {
                for c in read_certs(f)? {
                    roots.add(c).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
                }
            }
            if let Some(dir) = &self.ca_path {
                let entries = std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.display()))?;
                let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
                files.sort();
                for f in files {
                    // A directory may hold other files (keys, READMEs): only certificates count.
                    if let Ok(certs) = read_certs(&f) {
                        for c in certs {
                            let _ = roots.add(c);
                        }
                    }
                }
            }
            if self.ca_cert.is_none() && self.ca_path.is_none() {
                for c in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(c);
                }
            }
            if self.chain_only {
                let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
            } else {
                builder.with_root_certificates(roots)
            }
        };
        let config = match (&self.client_cert, &self.client_key) {
            (Some(c), Some(k)) => builder.with_client_auth_cert(read_certs(c)?, read_key(k)?)?,
            (None, None) => builder.with_no_client_auth(),
            _ => anyhow::bail!("a client certificate needs both a certificate and a key file"),
        };
        // No ALPN here: hyper-rustls sets its own (and refuses a config that has one).
        Ok(config)
    }

    /// An HTTP client connector that speaks https (and still http) with this config. Without
    /// `https` no file is read and https URLs find no trusted root.
    pub fn connector(
        &self,
        http: hyper_util::client::legacy::connect::HttpConnector,
        https: bool,
    ) -> anyhow::Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>> {
        let config = if https {
            self.config()?
        } else {
            ClientConfig::builder_with_provider(Arc::new(ring_provider()))
                .with_protocol_versions(rustls::ALL_VERSIONS)?
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth()
        };
        let mut http = http;
        // https URLs go through the HTTP connector too.
        http.enforce_http(false);
        let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
        let builder = match &self.server_name {
            Some(name) => builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                ServerName::try_from(name.clone()).map_err(|e| anyhow::anyhow!("invalid TLS server name {name:?}: {e}"))?,
            )),
            None => builder,
        };
        Ok(builder.enable_http1().wrap_connector(http))
    }

    /// TLS over `tcp` to `host` (the websocket of `alloc exec`).
    pub async fn connect<IO>(&self, host: &str, tcp: IO) -> anyhow::Result<tokio_rustls::client::TlsStream<IO>>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = self.server_name.clone().unwrap_or_else(|| host.trim_start_matches('[').trim_end_matches(']').to_string());
        let name = ServerName::try_from(name.clone()).map_err(|e| anyhow::anyhow!("invalid TLS server name {name:?}: {e}"))?;
        let mut config = self.config()?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        Ok(connector.connect(name, tcp).await?)
    }
}

/// Verifies a certificate's chain, and its name only in that a wrong name is accepted.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(NotValidForName | NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `-tls-skip-verify`: accepts any certificate (signatures of the handshake are still checked).
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Creates `path` with `mode`, failing if it exists (O_EXCL), and writes `contents`.
pub fn write_new(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path)?;
    f.write_all(contents)?;
    f.sync_all()
}

#[cfg(test)]
mod tests;
