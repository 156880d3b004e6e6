//! CSI endpoints: plugins listen on a unix socket named by a `unix://PATH` URL (the
//! `CSI_ENDPOINT` convention), and the orchestrator dials it.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint};

/// The longest socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// How long one dial of the socket may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

/// A bad endpoint or socket path, named in the message.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Not of the form `unix://PATH`.
    #[error("CSI endpoint {0:?} is not a unix socket URL (unix:///path/to/csi.sock)")]
    NotUnix(String),
    /// Longer than the kernel allows.
    #[error("CSI socket path {} is {len} bytes, longer than the {MAX_SOCKET_PATH} a unix socket allows", path.display())]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// A channel was asked for outside a tokio runtime (it runs a background task).
    #[error("a CSI channel needs a tokio runtime to run in")]
    NoRuntime,
    /// Binding the listener failed.
    #[error("listening on CSI socket {}: {source}", path.display())]
    Listen {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// The socket path of a `unix://PATH` endpoint (`unix:///csi/csi.sock` is `/csi/csi.sock`).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, EndpointError> {
    let path = endpoint.strip_prefix("unix://").filter(|p| !p.is_empty()).ok_or_else(|| EndpointError::NotUnix(endpoint.to_string()))?;
    let path = PathBuf::from(path);
    check_length(&path)?;
    Ok(path)
}

fn check_length(path: &Path) -> Result<(), EndpointError> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(EndpointError::TooLong { path: path.to_path_buf(), len });
    }
    Ok(())
}

/// A gRPC channel to the plugin listening at `socket`. It dials when first used and again
/// after the connection drops (a restarted plugin), so creating it never waits. It must be
/// created inside a tokio runtime.
pub fn channel(socket: &Path) -> Result<Channel, EndpointError> {
    check_length(socket)?;
    tokio::runtime::Handle::try_current().map_err(|_| EndpointError::NoRuntime)?;
    let socket = socket.to_path_buf();
    // The URI is never dialled; its authority is what Nomad sends too ("localhost").
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(DIAL_TIMEOUT);
    Ok(endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
        let socket = socket.clone();
        async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
    })))
}

/// Listens on `socket`, replacing a stale socket file left by an earlier run (the endpoint is
/// this plugin's by convention). Anything else at that path is an error.
pub fn listen(socket: &Path) -> Result<UnixListener, EndpointError> {
    use std::os::unix::fs::FileTypeExt;
    check_length(socket)?;
    let listen_err = |source| EndpointError::Listen { path: socket.to_path_buf(), source };
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(socket).map_err(listen_err)?,
        Ok(_) => return Err(listen_err(io::Error::new(io::ErrorKind::AlreadyExists, "the path exists and is not a socket"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e)),
    }
    UnixListener::bind(socket).map_err(listen_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_urls() {
        assert_eq!(socket_path("unix:///csi/csi.sock").unwrap(), PathBuf::from("/csi/csi.sock"));
        assert_eq!(socket_path("unix://relative.sock").unwrap(), PathBuf::from("relative.sock"));
        for bad in ["", "unix://", "/csi/csi.sock", "tcp://127.0.0.1:1", "UNIX:///x"] {
            let err = socket_path(bad).unwrap_err().to_string();
            assert!(err.contains("is not a unix socket URL"), "{bad}: {err}");
        }
        let long = format!("unix:///{}", "a".repeat(MAX_SOCKET_PATH));
        let err = socket_path(&long).unwrap_err().to_string();
        assert!(err.contains("108 bytes, longer than the 107"), "{err}");
    }

    #[test]
    fn a_channel_outside_a_runtime_is_an_error_not_a_panic() {
        assert!(matches!(channel(Path::new("/run/csi.sock")), Err(EndpointError::NoRuntime)));
    }

    #[tokio::test]
    async fn listen_replaces_a_stale_socket_but_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        drop(listen(&socket).unwrap());
        assert!(socket.exists(), "a dropped listener leaves its socket file");
        let _listener = listen(&socket).expect("the stale socket is replaced");

        let file = dir.path().join("file");
        std::fs::write(&file, "keep").unwrap();
        let err = listen(&file).unwrap_err().to_string();
        assert!(err.contains("exists and is not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    }
}
