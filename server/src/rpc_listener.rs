//! The RPC listener's connections under the agent's `limits`: at most `max_conns_per_client`
//! open from one IP (a connection above that is closed at once), and a connection that sends
//! nothing within `handshake_timeout` of being accepted is closed (Nomad's
//! `rpc_handshake_timeout`). Once a connection has sent its first bytes (the HTTP/2 preface)
//! it may stay idle for as long as it likes: clients hold one for their blocking calls.
//!
//! With RPC TLS ([`crate::rpc_tls`]) every connection must open with a TLS handshake (first byte
//! 0x16) presenting a CA-signed client certificate, done within the handshake timeout; anything
//! else is closed. Handshakes run beside the accept loop, so a slow one holds up no other.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::http::listener::{ConnCounter, ConnSlot};
use crate::rpc_tls::{PeerCert, RpcTls};

/// What the RPC listener enforces. Zero (or `None`) turns a limit off, as in Nomad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcLimits {
    /// Longest time a new connection may take to send its first bytes.
    pub handshake_timeout: Option<Duration>,
    /// Most connections open at once from one IP.
    pub max_conns_per_client: usize,
}

impl Default for RpcLimits {
    /// Nomad's defaults: 5 s handshake, 100 connections per client.
    fn default() -> Self {
        RpcLimits { handshake_timeout: Some(Duration::from_secs(5)), max_conns_per_client: 100 }
    }
}

/// What the services learn of an RPC connection (a request extension): its addresses and,
/// over TLS, the names of the peer's certificate. [`crate::rpc_auth`] turns it into tonic's
/// `TcpConnectInfo` (so `Request::remote_addr` works) before any service sees the call.
#[derive(Debug, Clone)]
pub struct RpcConnInfo {
    /// Local and peer addresses.
    pub tcp: TcpConnectInfo,
    /// The peer's certificate, on a TLS connection.
    pub peer: Option<Arc<PeerCert>>,
}

/// The bytes of a connection: plaintext or TLS.
enum RpcIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted RPC connection holding its per-client slot.
pub struct RpcConn {
    tcp: RpcIo,
    info: RpcConnInfo,
    _slot: ConnSlot,
    /// Until the first byte arrives.
    handshake: Option<Pin<Box<Sleep>>>,
}

macro_rules! io {
    ($io:expr, $s:ident => $e:expr) => {
        match $io {
            RpcIo::Plain($s) => $e,
            RpcIo::Tls($s) => $e,
        }
    };
}

impl AsyncRead for RpcIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        io!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for RpcIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        io!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        io!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        io!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        io!(self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        io!(self, s => s.is_write_vectored())
    }
}

impl AsyncRead for RpcConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.handshake = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.handshake.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "no RPC handshake within the timeout"))),
                _ => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for RpcConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

impl Connected for RpcConn {
    type ConnectInfo = RpcConnInfo;
    fn connect_info(&self) -> RpcConnInfo {
        self.info.clone()
    }
}

/// The accepted connections of `listener` under `limits`, over TLS when `tls` is given (see
/// the module docs), else as [`incoming`].
pub fn incoming_with(
    listener: TcpListener,
    limits: RpcLimits,
    tls: Option<Arc<RpcTls>>,
) -> Pin<Box<dyn Stream<Item = Result<RpcConn, io::Error>> + Send + 'static>> {
    let Some(tls) = tls else { return Box::pin(incoming(listener, limits)) };
    let (tx, rx) = tokio::sync::mpsc::channel::<RpcConn>(64);
    let mut plain = Box::pin(incoming(listener, RpcLimits { handshake_timeout: None, ..limits }));
    tokio::spawn(async move {
        use futures::StreamExt as _;
        while let Some(Ok(conn)) = plain.next().await {
            let (tls, tx) = (tls.clone(), tx.clone());
            let deadline = limits.handshake_timeout.unwrap_or(Duration::from_secs(60));
            tokio::spawn(async move {
                let peer = conn.info.tcp.remote_addr;
                match tokio::time::timeout(deadline, accept_tls(conn, &tls)).await {
                    Ok(Ok(conn)) => {
                        let _ = tx.send(conn).await;
                    }
                    Ok(Err(e)) => tracing::debug!(?peer, error = %e, "refused an RPC connection"),
                    Err(_) => tracing::debug!(?peer, "no RPC TLS handshake within the timeout"),
                }
            });
        }
    });
    Box::pin(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) }))
}

/// The TLS handshake of an accepted plaintext connection; a first byte that is not a TLS
/// handshake record closes it (Nomad closes a plaintext RPC connection when TLS is required).
async fn accept_tls(conn: RpcConn, tls: &RpcTls) -> io::Result<RpcConn> {
    let RpcConn { tcp: RpcIo::Plain(tcp), mut info, _slot, .. } = conn else {
        return Err(io::Error::other("already TLS"));
    };
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? != 1 || first[0] != 0x16 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "plaintext on the RPC port, which requires TLS"));
    }
    let stream = tls.acceptor().accept(tcp).await?;
    let cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(|c| PeerCert::from_der(c));
    info.peer = Some(Arc::new(cert.unwrap_or_default()));
    Ok(RpcConn { tcp: RpcIo::Tls(Box::new(stream)), info, _slot, handshake: None })
}

/// The accepted connections of `listener` under `limits`, TCP_NODELAY set. Accept errors are
/// logged and the stream goes on (it never yields an error, which would stop the server).
pub fn incoming(listener: TcpListener, limits: RpcLimits) -> impl Stream<Item = Result<RpcConn, io::Error>> + Send + 'static {
    let counter = ConnCounter::default();
    futures::stream::unfold((listener, counter), move |(listener, counter)| async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an RPC connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let ip: IpAddr = peer.ip();
            let Some(slot) = counter.acquire(ip, limits.max_conns_per_client) else {
                tracing::warn!(%peer, "refusing an RPC connection: too many concurrent connections from this address");
                drop(tcp);
                continue;
            };
            // No reply waits for the peer's delayed ACK (gRPC writes a reply as several frames).
            let _ = tcp.set_nodelay(true);
            let handshake = limits.handshake_timeout.map(|t| Box::pin(tokio::time::sleep(t)));
            let info = RpcConnInfo { tcp: tcp.connect_info(), peer: None };
            let conn = RpcConn { tcp: RpcIo::Plain(tcp), info, _slot: slot, handshake };
            return Some((Ok(conn), (listener, counter)));
        }
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn silent_connections_time_out_and_the_per_client_limit_holds() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = RpcLimits { handshake_timeout: Some(Duration::from_millis(200)), max_conns_per_client: 2 };
        let (tx, mut conns) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut accepted = Box::pin(incoming(listener, limits));
            while let Some(c) = accepted.next().await {
                let _ = tx.send(c.unwrap());
            }
        });

        let mut talker = TcpStream::connect(addr).await.unwrap();
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut over = TcpStream::connect(addr).await.unwrap();
        let mut a = conns.recv().await.unwrap();
        let mut b = conns.recv().await.unwrap();
        assert_eq!(a.connect_info().tcp.remote_addr, Some(talker.local_addr().unwrap()), "the peer address reaches the services");

        // The third from the same address is closed without being handed out.
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(Duration::from_secs(10), over.read(&mut buf)).await.expect("over-limit connection left open");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");

        // One that talks keeps its connection past the deadline; the silent one is cut.
        talker.write_all(b"PRI").await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf[..n], b"PRI");
        let err = tokio::time::timeout(Duration::from_secs(10), b.read(&mut buf)).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        tokio::time::sleep(Duration::from_millis(300)).await;
        talker.write_all(b"!").await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf[..n], b"!", "a connection that sent its handshake is not cut later");
        assert!(conns.try_recv().is_err(), "the over-limit connection was handed out");
    }
}
