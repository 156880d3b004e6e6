//! A unix socket in an alloc dir whose every connection is copied, byte for byte, to a TCP
//! address on the host (Nomad's `grpcSocketProxy`/`httpSocketProxy`): how a task in a group
//! network namespace reaches the Consul agent on the host's loopback.
//!
//! The socket is made beneath the alloc dir through `fs_beneath`: an entry a task left at its
//! name is removed (never followed), the socket is bound in the directory the agent resolved
//! (its fd, not a path a task could swap), and its mode is set to 0777 on the entry the agent
//! opened (unprivileged tasks connect to it; a socket's mode cannot be given at bind time).

use std::io;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::Path;
use std::time::Duration;

use tokio::net::{TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::fs_beneath::{Beneath, Kind, Links};

/// The socket's mode: any task user may connect.
pub const SOCKET_MODE: u32 = 0o777;
/// How long one dial of the destination may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`SocketProxy::stop`] waits for the connections to close (`socketProxyStopWaitTime`).
pub const STOP_WAIT: Duration = Duration::from_secs(3);
/// Connections open at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 1024;

/// Why the socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketProxyError {
    /// The directory or an old entry in it.
    #[error(transparent)]
    Fs(#[from] crate::fs_beneath::FsError),
    /// `bind(2)` or `listen(2)`.
    #[error("bind {path}: {source}")]
    Bind {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A running proxy; it stops when [`SocketProxy::stop`] is called or the token it was started
/// with is cancelled. Dropping it leaves it running until then.
#[derive(Debug)]
pub struct SocketProxy {
    stop: CancellationToken,
    tracker: TaskTracker,
}

/// Binds `name` in `dir` (removing whatever entry is there) with mode 0777.
pub fn bind_beneath(dir: &Beneath, name: &str) -> Result<UnixListener, SocketProxyError> {
    let rel = Path::new(name);
    match dir.remove_file(rel) {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    // The directory's fd path: the socket lands in the directory resolved above, whatever its
    // path now leads to. bind(2) never follows a symlink at the last component (EADDRINUSE).
    let at = dir.fd_path().join(name);
    let bind_err = |source| SocketProxyError::Bind { path: dir.path().join(name).display().to_string(), source };
    let listener = StdUnixListener::bind(&at).map_err(bind_err)?;
    dir.set_mode(rel, Kind::Socket, SOCKET_MODE)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    UnixListener::from_std(listener).map_err(bind_err)
}

impl SocketProxy {
    /// Serves `listener`, copying each connection to `dest` (`host:port`), until `stop`.
    pub fn start(listener: UnixListener, dest: String, stop: CancellationToken) -> SocketProxy {
        let tracker = TaskTracker::new();
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let (accept_stop, conns) = (stop.clone(), tracker.clone());
        tracker.spawn(async move {
            loop {
                let permit = tokio::select! {
                    p = slots.clone().acquire_owned() => p,
                    _ = accept_stop.cancelled() => break,
                };
                let Ok(permit) = permit else { break };
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = accept_stop.cancelled() => break,
                };
                let mut conn = match conn {
                    Ok((c, _)) => c,
                    Err(e) => {
                        tracing::error!(dest, error = %e, "error in socket proxy; shutting down proxy");
                        break;
                    }
                };
                let (dest, stop) = (dest.clone(), accept_stop.clone());
                conns.spawn(async move {
                    let _permit = permit;
                    let dialed = tokio::select! {
                        d = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(dest.as_str())) => d,
                        _ = stop.cancelled() => return,
                    };
                    let mut upstream = match dialed {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::warn!(dest, error = %e, "socket proxy: cannot connect to the destination");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(dest, "socket proxy: connecting to the destination timed out");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream) => {}
                        _ = stop.cancelled() => {}
                    }
                });
            }
            // The listener is dropped here: no new connections.
        });
        tracker.close();
        SocketProxy { stop, tracker }
    }

    /// Stops accepting and closes every connection, without waiting.
    pub fn cancel(&self) {
        self.stop.cancel();
    }

    /// Stops accepting, closes every connection, and waits (up to [`STOP_WAIT`]) for them.
    /// Returns whether everything ended in time.
    pub async fn stop(&self) -> bool {
        self.stop.cancel();
        tokio::time::timeout(STOP_WAIT, self.tracker.wait()).await.is_ok()
    }

    /// Whether the proxy still serves.
    pub fn running(&self) -> bool {
        !self.tracker.is_empty()
    }
}

/// Where a socket proxy's directory is: `<alloc dir>/alloc/tmp`, opened beneath the alloc dir
/// without symlinks.
pub fn alloc_tmp(alloc_dir: &Beneath) -> Result<Beneath, crate::fs_beneath::FsError> {
    alloc_dir.open_dir(Path::new("alloc/tmp"), Links::Refuse)
}

#[cfg(test)]
mod tests;
