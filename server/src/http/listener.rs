//! The HTTP listener: hyper's HTTP/1 connections under the agent's `limits`.
//!
//! Two limits hold a connection's cost before any request is read (Nomad's agent `limits`
//! block): each connection must finish sending a request head within `header_read_timeout`
//! (the first one, and each next one on a kept-alive connection), or it is closed, so a
//! client that opens connections and sends nothing, or half a header, holds nothing for long;
//! and one client address holds at most `max_conns_per_client` connections at once, a
//! connection above that is answered 429 and closed while the others go on.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// What the listener enforces. Zero (or `None`) turns a limit off, as in Nomad.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest time a connection may take to send a full request head.
    pub header_read_timeout: Option<Duration>,
    /// Most connections open at once from one client IP (`http_max_conns_per_client`).
    pub max_conns_per_client: usize,
}

impl Default for HttpLimits {
    /// Nomad's defaults: 100 connections per client, 5 s to send a request head.
    fn default() -> Self {
        HttpLimits { header_read_timeout: Some(Duration::from_secs(5)), max_conns_per_client: 100 }
    }
}

/// Nomad's answer to a connection over the per-client limit.
pub const TOO_MANY_CONNECTIONS: &str = "too many concurrent connections";

/// Open connections per client IP; a [`ConnSlot`] is one of them.
#[derive(Debug, Default, Clone)]
pub struct ConnCounter {
    open: Arc<Mutex<Open>>,
}

/// A crowd of connections at least this large that has mostly gone is followed by a trim.
const TRIM_AFTER_CONNECTIONS: usize = 256;

#[derive(Debug, Default)]
struct Open {
    per_ip: HashMap<IpAddr, usize>,
    total: usize,
    /// Most connections open at once since the last trim.
    peak: usize,
}

impl Open {
    /// Counts one connection closed from `ip`. True when a crowd of connections (thousands of
    /// parked blocking queries, say) has shrunk to a quarter: their buffers are free in glibc's
    /// arenas and should go back to the OS.
    fn close(&mut self, ip: IpAddr) -> bool {
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
        self.total = self.total.saturating_sub(1);
        if self.peak >= TRIM_AFTER_CONNECTIONS && self.total <= self.peak / 4 {
            self.peak = self.total;
            return true;
        }
        false
    }
}

impl ConnCounter {
    /// Takes a slot for `ip`, or `None` when it already holds `limit` (0: no limit).
    pub fn acquire(&self, ip: IpAddr, limit: usize) -> Option<ConnSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.per_ip.entry(ip).or_default();
        if limit > 0 && *n >= limit {
            return None;
        }
        *n += 1;
        open.total += 1;
        open.peak = open.peak.max(open.total);
        Some(ConnSlot { counter: self.clone(), ip })
    }

    /// Connections open now from `ip`.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).per_ip.get(&ip).copied().unwrap_or(0)
    }
}

/// One open connection; dropping it frees the slot.
#[derive(Debug)]
pub struct ConnSlot {
    counter: ConnCounter,
    ip: IpAddr,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let crowd_gone = self.counter.open.lock().unwrap_or_else(|e| e.into_inner()).close(self.ip);
        if crowd_gone {
            release_freed_memory();
        }
    }
}

/// A request body at least this large (or of unknown length) is followed by a trim.
const TRIM_AFTER_BODY_BYTES: u64 = 1024 * 1024;

/// After a large body, glibc keeps the freed pages in its arenas for reuse (tens of MB per
/// body); hand them back to the OS once the request is done.
pub(crate) async fn release_after_large_bodies(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let h = req.headers();
    let large = h
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n >= TRIM_AFTER_BODY_BYTES)
        || h.contains_key(http::header::TRANSFER_ENCODING);
    let resp = next.run(req).await;
    if large {
        release_freed_memory();
    }
    resp
}

/// Returns free heap pages to the OS, at most once a second (a trim walks every arena).
fn release_freed_memory() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
        return;
    }
    *last = Some(Instant::now());
    drop(last);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    runtime.spawn_blocking(|| {
        // SAFETY: malloc_trim only gives free pages back; it has no preconditions.
        unsafe { libc::malloc_trim(0) };
    });
}

/// A connection HTTP is served on: the accepted TCP stream, or TLS over it.
pub trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// What turns an accepted TCP connection into the one HTTP is served on (the agent's TLS
/// handshake); `None` closes the connection. It runs under the request head timeout.
pub type Handshake =
    Arc<dyn Fn(TcpStream, SocketAddr) -> std::pin::Pin<Box<dyn Future<Output = Option<Box<dyn Conn>>> + Send>> + Send + Sync>;

/// Serves `router` on `listener` until the task is dropped. Accept errors (out of file
/// descriptors, a connection reset before it was accepted) are logged and the loop goes on.
pub async fn serve(listener: TcpListener, router: Router, limits: HttpLimits) {
    serve_with(listener, router, limits, None).await
}

/// [`serve`], with each connection first passed through `handshake` (HTTPS) when there is one.
pub async fn serve_with(listener: TcpListener, router: Router, limits: HttpLimits, handshake: Option<Handshake>) {
    let counter = ConnCounter::default();
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection");
                // Out of fds: give the ones in use a moment to close instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = counter.acquire(peer.ip(), limits.max_conns_per_client) else {
            tokio::spawn(refuse(tcp, peer));
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let handshake = handshake.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // TCP_NODELAY, as on the RPC listener: no reply waits for a delayed ACK.
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Conn> = match handshake {
                None => Box::new(tcp),
                Some(h) => {
                    let shake = h(tcp, peer);
                    let done = match limits.header_read_timeout {
                        Some(t) => tokio::time::timeout(t, shake).await.ok().flatten(),
                        None => shake.await,
                    };
                    match done {
                        Some(io) => io,
                        None => return,
                    }
                }
            };
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
            // Upgrades on: `alloc exec` is a websocket.
            if let Err(e) = http.serve_connection(TokioIo::new(io), service).with_upgrades().await {
                tracing::debug!(%peer, error = %e, "http connection ended");
            }
        });
    }
}

/// Answers a connection over the limit with a 429 and closes it, without reading from it.
async fn refuse(mut tcp: TcpStream, peer: SocketAddr) {
    tracing::warn!(%peer, "refusing an HTTP connection: {TOO_MANY_CONNECTIONS} from this address");
    let response = format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{TOO_MANY_CONNECTIONS}",
        TOO_MANY_CONNECTIONS.len()
    );
    // Bounded: a peer that does not read cannot keep this task.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = tcp.write_all(response.as_bytes()).await;
        let _ = tcp.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use axum::routing::get;
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn start(limits: HttpLimits) -> SocketAddr {
        let router = Router::new().route("/ok", get(|| async { "ok" })).route(
            "/slow",
            get(|| async {
                // Longer than the header timeout of the test: answering takes its time.
                tokio::time::sleep(Duration::from_millis(600)).await;
                "slow"
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router, limits));
        addr
    }

    /// Everything the server sends until it closes (or 10 s pass: then the test fails).
    async fn read_all(tcp: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server kept the connection open; got {:?}", String::from_utf8_lossy(&out));
        String::from_utf8_lossy(&out).into_owned()
    }

    async fn get_on(tcp: &mut TcpStream, path: &str) -> String {
        tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        read_all(tcp).await
    }

    /// A websocket (`alloc exec`) is served: after the 101 the upgraded connection carries the
    /// route's first message.
    #[tokio::test]
    async fn an_upgraded_connection_carries_the_websocket() {
        use axum::extract::ws::{Message, WebSocketUpgrade};
        let router = Router::new().route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    let _ = socket.send(Message::Text("hello-upgraded".into())).await;
                    let _ = socket.send(Message::Close(None)).await;
                })
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router, HttpLimits { header_read_timeout: None, max_conns_per_client: 0 }));
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let handshake = "GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
        tcp.write_all(handshake.as_bytes()).await.unwrap();
        let answer = read_all(&mut tcp).await;
        assert!(answer.starts_with("HTTP/1.1 101"), "{answer:?}");
        assert!(answer.contains("hello-upgraded"), "the message after the upgrade: {answer:?}");
    }

    #[tokio::test]
    async fn a_connection_that_sends_half_a_header_is_closed_after_the_timeout() {
        let timeout = Duration::from_millis(300);
        let addr = start(HttpLimits { header_read_timeout: Some(timeout), max_conns_per_client: 0 }).await;
        let started = Instant::now();
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /ok HTTP/1.1\r\nHost: t\r\nX-Half: ").await.unwrap();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let answer = read_all(&mut half).await;
        assert!(!answer.contains("200 OK"), "a half header was answered: {answer}");
        read_all(&mut silent).await;
        let took = started.elapsed();
        assert!(took >= timeout, "closed before the timeout ({took:?})");
        // A full request on a fresh connection is still served.
        let mut ok = TcpStream::connect(addr).await.unwrap();
        assert!(get_on(&mut ok, "/ok").await.starts_with("HTTP/1.1 200 OK"));
    }

    #[tokio::test]
    async fn the_timeout_covers_the_request_head_not_the_answer() {
        let addr = start(HttpLimits { header_read_timeout: Some(Duration::from_millis(200)), max_conns_per_client: 0 }).await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let answer = get_on(&mut tcp, "/slow").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("slow"), "{answer}");
    }

    #[tokio::test]
    async fn connections_over_the_per_client_limit_are_refused_while_the_first_ones_work() {
        let addr = start(HttpLimits { header_read_timeout: None, max_conns_per_client: 3 }).await;
        let mut first = Vec::new();
        for _ in 0..3 {
            first.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut over = TcpStream::connect(addr).await.unwrap();
        let refused = read_all(&mut over).await;
        assert!(refused.starts_with("HTTP/1.1 429 Too Many Requests"), "{refused}");
        assert!(refused.ends_with(TOO_MANY_CONNECTIONS), "{refused}");
        // The three admitted connections are served.
        for tcp in &mut first[1..] {
            assert!(get_on(tcp, "/ok").await.starts_with("HTTP/1.1 200 OK"));
        }
        // Once they closed, their slots are free again.
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut again = TcpStream::connect(addr).await.unwrap();
            let answer = get_on(&mut again, "/ok").await;
            if answer.starts_with("HTTP/1.1 200 OK") {
                break;
            }
            assert!(Instant::now() < deadline, "slots were never freed: {answer}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn slots_are_counted_per_address_and_freed_on_drop() {
        let c = ConnCounter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let s1 = c.acquire(a, 2).unwrap();
        let _s2 = c.acquire(a, 2).unwrap();
        assert!(c.acquire(a, 2).is_none());
        assert!(c.acquire(b, 2).is_some(), "another address has its own budget");
        drop(s1);
        assert_eq!(c.open(a), 1);
        assert!(c.acquire(a, 2).is_some());
        assert!(c.acquire(a, 0).is_some(), "0 is no limit");
    }

    #[test]
    fn memory_is_handed_back_once_a_crowd_of_connections_has_mostly_gone() {
        let c = ConnCounter::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut slots: Vec<ConnSlot> = (0..1000).map(|_| c.acquire(ip, 0).unwrap()).collect();
        let mut open = c.open.lock().unwrap();
        let trims: Vec<usize> = (0..1000).filter(|_| open.close(ip)).collect();
        assert_eq!(trims.len(), 1, "one trim when 1,000 connections fall to 250, none after");
        assert_eq!((open.total, open.peak), (0, 250), "the peak starts again from the trim");
        drop(open);
        // The slots' own drops would count them again: forget them (the test closed them above).
        slots.drain(..).for_each(std::mem::forget);
        let small: Vec<ConnSlot> = (0..100).map(|_| c.acquire(ip, 0).unwrap()).collect();
        let mut open = c.open.lock().unwrap();
        assert!(!(0..100).any(|_| open.close(ip)), "a hundred connections are not a crowd");
        drop(open);
        small.into_iter().for_each(std::mem::forget);
    }
}
