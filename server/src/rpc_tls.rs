//! Mutual TLS on the RPC port (`tls { rpc = true }`).
//!
//! The listener accepts only TLS and requires a client certificate signed by the agent's CA
//! (as Nomad does on RPC, always); every outgoing RPC channel (client to server, server to
//! server) dials TLS with the agent's certificate and checks the peer's chain against the CA,
//! and with `verify_server_hostname` also its name, `server.<region>.nomad`. The agent builds the
//! rustls configs from its `tls {}` block ([`RpcTls::new`] takes a loader) and reloads them on
//! SIGHUP: connections made afterwards use the new files, open ones keep theirs.
//!
//! The role checks that `verify_server_hostname` turns on (a server-only method needs a
//! `server.<region>.nomad` certificate) are in [`crate::rpc_auth`], from the [`PeerCert`] this
//! module reads off each accepted connection.
//!
//! One agent runs per process, so the RPC TLS of this process is set once ([`install`]) and
//! read where channels are built ([`connect_lazy`]) and where the listener accepts.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// Builds the listener's and the dialer's rustls configs from the agent's files.
pub type Loader = Box<dyn Fn() -> Result<(ServerConfig, ClientConfig), String> + Send + Sync>;

/// The RPC TLS of this agent: configs (swapped on reload) and the name rules.
pub struct RpcTls {
    region: String,
    verify_server_hostname: bool,
    load: Loader,
    current: RwLock<(Arc<ServerConfig>, Arc<ClientConfig>)>,
}

impl std::fmt::Debug for RpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcTls")
            .field("region", &self.region)
            .field("verify_server_hostname", &self.verify_server_hostname)
            .finish_non_exhaustive()
    }
}

/// The certificate role names of a region (Nomad's `server.<region>.nomad`, `client.<region>.nomad`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roles {
    /// `server.<region>.nomad`.
    pub server: String,
    /// `client.<region>.nomad`.
    pub client: String,
}

impl Roles {
    /// The names of `region`.
    pub fn of(region: &str) -> Roles {
        Roles { server: format!("server.{region}.nomad"), client: format!("client.{region}.nomad") }
    }
}

impl RpcTls {
    /// Loads the configs now (an error stops the agent's start). Both configs get ALPN `h2`.
    pub fn new(region: &str, verify_server_hostname: bool, load: Loader) -> Result<Arc<RpcTls>, String> {
        let current = RwLock::new(Self::loaded(&load)?);
        Ok(Arc::new(RpcTls { region: region.to_string(), verify_server_hostname, load, current }))
    }

    fn loaded(load: &Loader) -> Result<(Arc<ServerConfig>, Arc<ClientConfig>), String> {
        let (mut server, mut client) = load()?;
        server.alpn_protocols = vec![b"h2".to_vec()];
        client.alpn_protocols = vec![b"h2".to_vec()];
        Ok((Arc::new(server), Arc::new(client)))
    }

    /// Reads the files again; on an error the configs in use stay.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = Self::loaded(&self.load)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// Whether peers' names are checked (outgoing: the server name; incoming: the roles).
    pub fn verify_server_hostname(&self) -> bool {
        self.verify_server_hostname
    }

    /// The role names checked on incoming calls, when `verify_server_hostname` is on.
    pub fn role_check(&self) -> Option<Roles> {
        self.verify_server_hostname.then(|| Roles::of(&self.region))
    }

    /// The acceptor for a new connection, with the current config.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.read().unwrap_or_else(|e| e.into_inner()).0.clone())
    }

    fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.current.read().unwrap_or_else(|e| e.into_inner()).1.clone())
    }

    /// The name a server's certificate must carry: `server.<region>.nomad` with
    /// `verify_server_hostname`, else the host dialled (only the chain is checked then).
    fn server_name(&self, host: &str) -> io::Result<ServerName<'static>> {
        let name = if self.verify_server_hostname {
            Roles::of(&self.region).server
        } else {
            host.trim_start_matches('[').trim_end_matches(']').to_string()
        };
        ServerName::try_from(name.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name {name:?}: {e}")))
    }

    /// Dials `uri` (`http://host:port`) over TLS.
    pub async fn connect(&self, uri: &Uri) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
        let port = uri.port_u16().unwrap_or(4647);
        let name = self.server_name(host)?;
        let tcp = TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port)).await?;
        let _ = tcp.set_nodelay(true);
        self.connector().connect(name, tcp).await
    }
}

static RPC_TLS: OnceLock<Arc<RpcTls>> = OnceLock::new();

/// Sets this process's RPC TLS (the first call wins); call it before any server or client starts.
pub fn install(tls: Arc<RpcTls>) {
    let _ = RPC_TLS.set(tls);
}

/// This process's RPC TLS, if `tls { rpc = true }`.
pub fn current() -> Option<Arc<RpcTls>> {
    RPC_TLS.get().cloned()
}

/// A lazily connecting channel to `endpoint`: over TLS when RPC TLS is on, else plaintext.
pub fn connect_lazy(endpoint: Endpoint) -> Channel {
    match current() {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(Connector(tls)),
    }
}

/// Dials RPC channels over TLS (see [`connect_lazy`]).
#[derive(Clone, Debug)]
pub struct Connector(pub Arc<RpcTls>);

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.0.clone();
        Box::pin(async move { tls.connect(&uri).await.map(TokioIo::new) })
    }
}

/// The names of the certificate a peer presented on an RPC connection: the DNS SANs and the
/// common name (Nomad matches either, exactly).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerCert {
    /// DNS SANs, then the CN.
    pub names: Vec<String>,
}

impl PeerCert {
    /// Reads the names of a DER certificate; `None` if it does not parse.
    pub fn from_der(der: &[u8]) -> Option<PeerCert> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let mut names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                if let GeneralName::DNSName(d) = n {
                    names.push(d.to_string());
                }
            }
        }
        for cn in cert.subject().iter_common_name() {
            if let Ok(cn) = cn.as_str() {
                names.push(cn.to_string());
            }
        }
        Some(PeerCert { names })
    }

    /// Whether the certificate is issued for `name` (exact match).
    pub fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}
