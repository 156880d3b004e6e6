//! The RPC listener's connections under the agent's `limits`: at most `max_conns_per_client`
//! open from one IP (a connection above that is closed at once), and a connection that sends
//! nothing within `handshake_timeout` of being accepted is closed (Nomad's
//! `rpc_handshake_timeout`). Once a connection has sent its first bytes (the HTTP/2 preface)
//! it may stay idle for as long as it likes: clients hold one for their blocking calls.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::http::listener::{ConnCounter, ConnSlot};

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

/// An accepted RPC connection holding its per-client slot.
pub struct RpcConn {
    tcp: TcpStream,
    _slot: ConnSlot,
    /// Until the first byte arrives.
    handshake: Option<Pin<Box<Sleep>>>,
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
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
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
            let conn = RpcConn { tcp, _slot: slot, handshake };
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
        assert_eq!(a.connect_info().remote_addr, Some(talker.local_addr().unwrap()), "the peer address reaches the services");

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
