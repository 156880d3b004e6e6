//! Who may call which RPC on a server's RPC port, decided in one table.
//!
//! Three kinds of callers reach the port: other servers (Raft replication, joining, forwarded
//! API requests), client nodes (the `Node`, `Alloc`, `ServiceRegistration` and `CSIVolume` services, each
//! call authenticated by the node's SecretID inside its endpoint) and strangers. [`RPC_TABLE`]
//! names what every method requires; [`RpcAuthLayer`] enforces it in front of every service, so
//! a method missing from the table is refused (default deny) rather than served.
//!
//! A server proves it is one of this cluster's servers with a proof derived from the cluster key
//! (Nomad's `server { encrypt = "..." }`): an HMAC-SHA256 of the region under the key, sent in
//! [`SERVER_PROOF_HEADER`] on every call. The key itself never travels. Without TLS the link is
//! plaintext, so an observer of the network could read and replay the proof (as it could read the
//! replicated log itself); TLS is the answer to an on-path attacker, the key keeps out everyone
//! who merely reaches the port.
//!
//! With RPC TLS and `verify_server_hostname` ([`crate::rpc_tls`]) the peer's certificate is
//! checked here too, before the proof ([`check_role`]): a server-only method needs a certificate
//! for `server.<region>.nomad`, a node method one for `client.<region>.nomad` or
//! `server.<region>.nomad`. A client's certificate is CA-signed, so without the name check a
//! compromised client could pose as a server; with it, it cannot join Raft or take servers' calls.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{KeyInit, Mac};
use http::HeaderMap;
use tonic::Status;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

use crate::rpc_listener::RpcConnInfo;
use crate::rpc_tls::{PeerCert, Roles};

/// The metadata key carrying a server's proof.
pub const SERVER_PROOF_HEADER: &str = "x-nomad-rs-server-proof";

/// Metadata a forwarding server adds to a node's call: the address the node's own connection
/// came from. Trusted only on a call that carries a valid server proof.
pub const NODE_PEER_HEADER: &str = "x-nomad-rs-node-peer";

/// What a method requires of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requires {
    /// A server of this cluster (valid server proof).
    Server,
    /// A client node: the endpoint checks the node's SecretID (a node's first `Register` claims
    /// its ID and secret). Forwarded by a follower, the call also carries a server proof.
    Node,
}

/// Every RPC method served on the RPC port and what it requires. Methods not listed are refused.
pub const RPC_TABLE: &[(&str, Requires)] = &[
    ("/nomad.raft.Raft/AppendEntries", Requires::Server),
    ("/nomad.raft.Raft/Vote", Requires::Server),
    ("/nomad.raft.Raft/InstallSnapshot", Requires::Server),
    ("/nomad.server.Forward/Http", Requires::Server),
    ("/nomad.raft.Raft/Join", Requires::Server),
    ("/nomad.raft.Raft/Info", Requires::Server),
    ("/nomad.server.ClientConn/Call", Requires::Server),
    ("/nomad.Node/Register", Requires::Node),
    ("/nomad.Node/UpdateStatus", Requires::Node),
    ("/nomad.Node/UpdateAlloc", Requires::Node),
    ("/nomad.Node/GetClientAllocs", Requires::Node),
    ("/nomad.Node/ServerRequests", Requires::Node),
    ("/nomad.Node/ServerRequestReply", Requires::Node),
    ("/nomad.Node/DeriveSIToken", Requires::Node),
    ("/nomad.Node/SignIdentities", Requires::Node),
    ("/nomad.Node/ResolveToken", Requires::Node),
    ("/nomad.Alloc/GetAllocs", Requires::Node),
    ("/nomad.ServiceRegistration/Upsert", Requires::Node),
    ("/nomad.ServiceRegistration/DeleteByAlloc", Requires::Node),
    ("/nomad.ServiceRegistration/DeleteByID", Requires::Node),
    ("/nomad.CSIVolume/Claim", Requires::Node),
    ("/nomad.CSIVolume/Unpublish", Requires::Node),
];

/// What `path` (`/package.Service/Method`) requires, if it is served at all.
pub fn requirement(path: &str) -> Option<Requires> {
    RPC_TABLE.iter().find(|(p, _)| *p == path).map(|(_, r)| *r)
}

/// Marks a request whose caller proved it is a server of this cluster (a request extension).
#[derive(Debug, Clone, Copy)]
pub struct AuthenticatedServer;

/// Why a cluster key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The configured or stored key is not base64 of 16, 24 or 32 bytes.
    #[error("{what}: {message}")]
    Invalid {
        /// Where the key came from.
        what: String,
        /// What is wrong with it.
        message: String,
    },
    /// The key file could not be read or written.
    #[error("{context} {}: {source}", path.display())]
    Io {
        /// What was being done.
        context: &'static str,
        /// The key file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Servers forming or joining a cluster were started without the shared key.
    #[error(
        "server.encrypt: servers that form or join a cluster must share the cluster key: give every server the same server {{ encrypt = \"...\" }} (generate one with `nomad-rs operator keygen`)"
    )]
    Missing,
}

/// The secret the servers of one cluster share.
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// The file under the server's data dir that keeps the key (mode 0600).
pub const KEY_FILE: &str = "cluster.key";

impl ClusterKey {
    /// A new random 32-byte key.
    pub fn generate() -> ClusterKey {
        ClusterKey(rand::random::<[u8; 32]>().to_vec())
    }

    /// Decodes a key written as Nomad writes `encrypt`: standard base64 of 16, 24 or 32 bytes.
    pub fn decode(text: &str, what: &str) -> Result<ClusterKey, KeyError> {
        let invalid = |message: String| KeyError::Invalid { what: what.to_string(), message };
        let bytes = BASE64.decode(text.trim()).map_err(|e| invalid(format!("the key is not valid base64: {e}")))?;
        if ![16, 24, 32].contains(&bytes.len()) {
            return Err(invalid(format!("the key must be 16, 24 or 32 bytes, this one is {} bytes", bytes.len())));
        }
        Ok(ClusterKey(bytes))
    }

    /// A 32-byte key for another purpose (`label` names it), derived from this one with
    /// HMAC-SHA256, so the cluster key itself is used for one thing only.
    pub fn derive(&self, label: &str) -> [u8; 32] {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0).expect("hmac takes keys of any length");
        mac.update(label.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The key as `encrypt` takes it.
    pub fn encode(&self) -> String {
        BASE64.encode(&self.0)
    }

    /// The key a server uses: the one stored under `data_dir` if there is one (as Nomad prefers
    /// its keyring file over `encrypt`), else the configured one, else, for a server that forms
    /// a cluster of one, a new one. Whatever is used is stored (0600) for the next start.
    pub fn load_or_create(data_dir: &Path, configured: Option<&str>, single_server: bool) -> Result<ClusterKey, KeyError> {
        let path = data_dir.join(KEY_FILE);
        let configured = configured.map(|text| ClusterKey::decode(text, "server.encrypt")).transpose()?;
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let stored = ClusterKey::decode(&text, &path.display().to_string())?;
                if configured.as_ref().is_some_and(|c| c.0 != stored.0) {
                    tracing::warn!(
                        file = %path.display(),
                        "server.encrypt differs from the cluster key this server stored: using the stored key (remove the file to change keys)"
                    );
                }
                Ok(stored)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = match configured {
                    Some(key) => key,
                    None if single_server => {
                        let key = ClusterKey::generate();
                        tracing::info!(
                            file = %path.display(),
                            "generated a cluster key: servers joining this one need it as server {{ encrypt = \"...\" }}"
                        );
                        key
                    }
                    None => return Err(KeyError::Missing),
                };
                key.store(&path)?;
                Ok(key)
            }
            Err(source) => Err(KeyError::Io { context: "reading", path, source }),
        }
    }

    fn store(&self, path: &Path) -> Result<(), KeyError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let io = |context: &'static str| move |source| KeyError::Io { context, path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("creating the directory of"))?;
        }
        let temp = path.with_extension("tmp");
        let mut file =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temp).map_err(io("writing"))?;
        file.write_all(format!("{}\n", self.encode()).as_bytes()).and_then(|()| file.sync_all()).map_err(io("writing"))?;
        std::fs::rename(&temp, path).map_err(io("renaming to"))
    }
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Makes and checks server proofs for one cluster (key and region).
pub struct ClusterAuth {
    key: ClusterKey,
    region: String,
    proof: AsciiMetadataValue,
}

impl std::fmt::Debug for ClusterAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterAuth").field("region", &self.region).finish_non_exhaustive()
    }
}

impl ClusterAuth {
    /// Proofs for the servers of `region` sharing `key`.
    pub fn new(key: ClusterKey, region: &str) -> Arc<ClusterAuth> {
        let tag = Self::mac(&key, region).finalize().into_bytes();
        let proof = AsciiMetadataValue::try_from(BASE64.encode(tag)).expect("base64 is ASCII");
        Arc::new(ClusterAuth { key, region: region.to_string(), proof })
    }

    fn mac(key: &ClusterKey, region: &str) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&key.0).expect("hmac takes keys of any length");
        mac.update(b"nomad-rs server rpc v1\n");
        mac.update(region.as_bytes());
        mac
    }

    /// Adds this server's proof to an outgoing call.
    pub fn stamp(&self, metadata: &mut MetadataMap) {
        metadata.insert(SERVER_PROOF_HEADER, self.proof.clone());
    }

    /// Whether `headers` carry a valid proof (compared in constant time).
    pub fn verify(&self, headers: &HeaderMap) -> bool {
        let Some(tag) = headers.get(SERVER_PROOF_HEADER).and_then(|v| BASE64.decode(v.as_bytes()).ok()) else {
            return false;
        };
        Self::mac(&self.key, &self.region).verify_slice(&tag).is_ok()
    }

    /// A tonic interceptor stamping every call with this server's proof.
    pub fn interceptor(self: &Arc<Self>) -> Stamp {
        Stamp(self.clone())
    }
}

/// Stamps outgoing calls with the server proof (see [`ClusterAuth::interceptor`]).
#[derive(Clone, Debug)]
pub struct Stamp(Arc<ClusterAuth>);

impl tonic::service::Interceptor for Stamp {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        self.0.stamp(request.metadata_mut());
        Ok(request)
    }
}

/// The certificate check of `verify_server_hostname`: whether `peer` (the certificate of the
/// call's connection, `None` on a plaintext one) may call `path`, which requires `required`.
pub fn check_role(roles: &Roles, peer: Option<&PeerCert>, path: &str, required: Requires) -> Result<(), Status> {
    let names = peer.map(|p| p.names.join(", ")).unwrap_or_default();
    let allowed = match required {
        Requires::Server => peer.is_some_and(|p| p.has(&roles.server)),
        Requires::Node => peer.is_some_and(|p| p.has(&roles.server) || p.has(&roles.client)),
    };
    if allowed {
        return Ok(());
    }
    let wanted = match required {
        Requires::Server => format!("{:?}", roles.server),
        Requires::Node => format!("{:?} or {:?}", roles.client, roles.server),
    };
    Err(Status::permission_denied(match peer {
        None => format!("Permission denied: rpc {path} requires a TLS certificate for {wanted}"),
        Some(_) => format!("Permission denied: rpc {path} requires a certificate for {wanted}; the caller's certificate is for [{names}]"),
    }))
}

/// Enforces [`RPC_TABLE`] in front of the RPC services (see the module docs).
#[derive(Clone, Debug)]
pub struct RpcAuthLayer {
    auth: Arc<ClusterAuth>,
    roles: Option<Arc<Roles>>,
}

impl RpcAuthLayer {
    /// A layer checking proofs with `auth`.
    pub fn new(auth: Arc<ClusterAuth>) -> RpcAuthLayer {
        RpcAuthLayer { auth, roles: None }
    }

    /// Also checks the caller's certificate names ([`check_role`]) when `roles` is given.
    pub fn with_roles(mut self, roles: Option<Roles>) -> RpcAuthLayer {
        self.roles = roles.map(Arc::new);
        self
    }
}

impl<S> tower::Layer<S> for RpcAuthLayer {
    type Service = RpcAuth<S>;

    fn layer(&self, inner: S) -> RpcAuth<S> {
        RpcAuth { inner, auth: self.auth.clone(), roles: self.roles.clone() }
    }
}

/// The service [`RpcAuthLayer`] wraps around the RPC routes.
#[derive(Clone, Debug)]
pub struct RpcAuth<S> {
    inner: S,
    auth: Arc<ClusterAuth>,
    roles: Option<Arc<Roles>>,
}

/// The decision for one incoming call: pass it on (marked if a server proved itself), or refuse.
fn admit(auth: &ClusterAuth, path: &str, headers: &mut HeaderMap) -> Result<bool, Status> {
    let Some(required) = requirement(path) else {
        return Err(Status::unimplemented(format!("unknown rpc {path}")));
    };
    let is_server = auth.verify(headers);
    match required {
        Requires::Server if !is_server => Err(Status::unauthenticated(format!(
            "rpc {path} is for the servers of this cluster only, and the caller did not prove it is one (a server needs the cluster's server {{ encrypt }} key)"
        ))),
        _ => {
            if !is_server {
                // Only a server may vouch for where a node's connection came from.
                headers.remove(NODE_PEER_HEADER);
            }
            Ok(is_server)
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for RpcAuth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::Either<S::Future, std::future::Ready<Result<Self::Response, Self::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let path = request.uri().path().to_string();
        // The listener's connection info: tonic's own type for the services, the certificate here.
        let peer = match request.extensions().get::<RpcConnInfo>().cloned() {
            Some(info) => {
                request.extensions_mut().insert(info.tcp);
                info.peer
            }
            None => None,
        };
        let checked = match (&self.roles, requirement(&path)) {
            (Some(roles), Some(required)) => check_role(roles, peer.as_deref(), &path, required),
            _ => Ok(()),
        };
        match checked.and_then(|()| admit(&self.auth, &path, request.headers_mut())) {
            Ok(is_server) => {
                if is_server {
                    request.extensions_mut().insert(AuthenticatedServer);
                }
                futures::future::Either::Left(self.inner.call(request))
            }
            Err(status) => {
                tracing::warn!(rpc = %path, code = ?status.code(), "refused an rpc call");
                futures::future::Either::Right(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(key: &ClusterKey) -> Arc<ClusterAuth> {
        ClusterAuth::new(key.clone(), "global")
    }

    fn stamped(auth: &ClusterAuth) -> HeaderMap {
        let mut metadata = MetadataMap::new();
        auth.stamp(&mut metadata);
        metadata.into_headers()
    }

    #[test]
    fn a_proof_is_valid_only_for_the_same_key_and_region() {
        let key = ClusterKey::generate();
        let ours = auth(&key);
        assert!(ours.verify(&stamped(&ours)));
        assert!(!ours.verify(&stamped(&auth(&ClusterKey::generate()))), "another key");
        assert!(!ours.verify(&stamped(&ClusterAuth::new(key.clone(), "europe"))), "another region");
        assert!(!ours.verify(&HeaderMap::new()), "no proof");
        let mut garbage = HeaderMap::new();
        garbage.insert(SERVER_PROOF_HEADER, "bm90IGEgcHJvb2Y=".parse().unwrap());
        assert!(!ours.verify(&garbage));
        let proof = stamped(&ours);
        assert!(!proof.get(SERVER_PROOF_HEADER).unwrap().to_str().unwrap().contains(&key.encode()), "the key never travels");
    }

    #[test]
    fn server_methods_need_a_proof_node_methods_do_not_and_unknown_ones_are_refused() {
        let ours = auth(&ClusterKey::generate());
        for (path, required) in RPC_TABLE {
            let refused = admit(&ours, path, &mut HeaderMap::new());
            match required {
                Requires::Server => assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated, "{path}"),
                Requires::Node => assert!(!refused.unwrap(), "{path}"),
            }
            assert!(admit(&ours, path, &mut stamped(&ours)).unwrap(), "{path} with a proof");
        }
        let unknown = admit(&ours, "/nomad.raft.Raft/Forward", &mut stamped(&ours)).unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::Unimplemented, "the raw command forward is gone");
    }

    #[test]
    fn every_server_to_server_method_generated_is_in_the_table() {
        // The routes tonic generated for the services this crate declares (build.rs).
        let generated = [
            include_str!(concat!(env!("OUT_DIR"), "/nomad.raft.Raft.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/nomad.server.Forward.rs")),
            include_str!(concat!(env!("OUT_DIR"), "/nomad.server.ClientConn.rs")),
        ];
        let mut routes = Vec::new();
        for code in generated {
            for piece in code.split('"').skip(1).step_by(2) {
                if piece.starts_with("/nomad.") && piece.matches('/').count() == 2 && !routes.contains(&piece) {
                    routes.push(piece);
                }
            }
        }
        assert!(routes.len() >= 7, "{routes:?}");
        for route in routes {
            assert_eq!(requirement(route), Some(Requires::Server), "{route} must be in RPC_TABLE, for servers only");
        }
    }

    #[test]
    fn only_a_server_may_say_where_a_node_connected_from() {
        let ours = auth(&ClusterKey::generate());
        let mut forged = HeaderMap::new();
        forged.insert(NODE_PEER_HEADER, "10.9.9.9".parse().unwrap());
        admit(&ours, "/nomad.Node/Register", &mut forged).unwrap();
        assert!(forged.get(NODE_PEER_HEADER).is_none(), "a node's own claim is dropped");
        let mut vouched = stamped(&ours);
        vouched.insert(NODE_PEER_HEADER, "10.9.9.9".parse().unwrap());
        admit(&ours, "/nomad.Node/Register", &mut vouched).unwrap();
        assert!(vouched.get(NODE_PEER_HEADER).is_some());
    }

    #[test]
    fn verify_server_hostname_gives_server_methods_to_server_certificates_only() {
        let roles = Roles::of("global");
        let cert = |names: &[&str]| PeerCert { names: names.iter().map(|n| n.to_string()).collect() };
        let server = cert(&["server.global.nomad", "localhost"]);
        let client = cert(&["client.global.nomad", "localhost"]);
        let cli = cert(&["cli.global.nomad", "localhost"]);
        let other_region = cert(&["server.europe.nomad"]);
        for (path, required) in RPC_TABLE {
            assert!(check_role(&roles, Some(&server), path, *required).is_ok(), "{path}: a server certificate may call anything");
            let by_client = check_role(&roles, Some(&client), path, *required);
            match required {
                Requires::Server => {
                    let refused = by_client.unwrap_err();
                    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{path}");
                    assert!(refused.message().contains("\"server.global.nomad\""), "{}", refused.message());
                    assert!(refused.message().contains("client.global.nomad"), "{}", refused.message());
                }
                Requires::Node => assert!(by_client.is_ok(), "{path}: a client certificate may call node methods"),
            }
            for nobody in [Some(&cli), Some(&other_region), Some(&PeerCert::default()), None] {
                let refused = check_role(&roles, nobody, path, *required).unwrap_err();
                assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{path} by {nobody:?}");
            }
        }
        // Names match exactly, not as suffixes or patterns.
        let lookalike = cert(&["xserver.global.nomad", "server.global.nomad.evil", "*.global.nomad"]);
        assert!(check_role(&roles, Some(&lookalike), "/nomad.raft.Raft/Vote", Requires::Server).is_err());
    }

    #[test]
    fn keys_decode_as_nomad_writes_them_and_bad_ones_say_why() {
        let key = ClusterKey::generate();
        assert_eq!(ClusterKey::decode(&key.encode(), "k").unwrap().0, key.0);
        assert!(ClusterKey::decode(&BASE64.encode([7u8; 16]), "k").is_ok());
        let short = ClusterKey::decode(&BASE64.encode([7u8; 10]), "server.encrypt").unwrap_err().to_string();
        assert_eq!(short, "server.encrypt: the key must be 16, 24 or 32 bytes, this one is 10 bytes");
        let bad = ClusterKey::decode("not base64!", "server.encrypt").unwrap_err().to_string();
        assert!(bad.starts_with("server.encrypt: the key is not valid base64"), "{bad}");
    }

    #[test]
    fn the_key_is_generated_once_for_a_single_server_stored_0600_and_preferred_after() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = ClusterKey::load_or_create(dir.path(), None, true).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = ClusterKey::load_or_create(dir.path(), Some(&ClusterKey::generate().encode()), true).unwrap();
        assert_eq!(again.0, first.0, "the stored key wins over a different configured one, as Nomad's keyring file does");

        let cluster = tempfile::tempdir().unwrap();
        assert!(matches!(ClusterKey::load_or_create(cluster.path(), None, false), Err(KeyError::Missing)));
        assert!(!cluster.path().join(KEY_FILE).exists());
        let configured = ClusterKey::generate();
        let used = ClusterKey::load_or_create(cluster.path(), Some(&configured.encode()), false).unwrap();
        assert_eq!(used.0, configured.0);
        assert_eq!(ClusterKey::load_or_create(cluster.path(), None, false).unwrap().0, configured.0, "stored for the next start");
    }
}
