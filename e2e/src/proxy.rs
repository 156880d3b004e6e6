//! A fault-injecting proxy to put between clients and servers (TCP), or between an agent and the
//! Docker Engine's unix socket.
//!
//! Modes apply to live connections at once:
//! - `Open`: bytes flow both ways;
//! - `Blackhole`: bytes are read and dropped both ways, connections stay open
//!   (what a real partition looks like: no RST, just silence);
//! - `DropUpstream` / `DropDownstream`: one direction is silenced;
//! - `Pause`: bytes are held, not dropped, until the mode changes (a peer that hangs and
//!   then answers: nothing is lost, so framed streams survive it);
//! - `Refuse`: new connections are closed at once (with [`FaultProxy::reset`]: a peer that went
//!   away; see [`FaultProxy::down`]).
//!
//! [`FaultProxy::reset`] closes every connection at once.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does with bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Forward everything.
    Open = 0,
    /// Drop everything, keep connections open.
    Blackhole = 1,
    /// Drop client → server bytes.
    DropUpstream = 2,
    /// Drop server → client bytes.
    DropDownstream = 3,
    /// Hold every byte until the mode changes.
    Pause = 4,
    /// Close new connections at once; bytes of live ones are dropped.
    Refuse = 5,
}

/// One proxied connection's socket.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn try_clone(&self) -> std::io::Result<Conn> {
        match self {
            Conn::Tcp(s) => s.try_clone().map(Conn::Tcp),
            Conn::Unix(s) => s.try_clone().map(Conn::Unix),
        }
    }

    fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(how),
            Conn::Unix(s) => s.shutdown(how),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Unix(s) => s.flush(),
        }
    }
}

/// Where the proxy listens and where it forwards to.
enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

impl Endpoint {
    fn connect(&self) -> std::io::Result<Conn> {
        match self {
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect(addr)?;
                let _ = s.set_nodelay(true);
                Ok(Conn::Tcp(s))
            }
            Endpoint::Unix(path) => UnixStream::connect(path).map(Conn::Unix),
        }
    }
}

struct Shared {
    mode: AtomicU8,
    target: Endpoint,
    conns: Mutex<Vec<Conn>>,
    stopped: AtomicBool,
}

/// A proxy listening on 127.0.0.1 (or a unix socket) and forwarding to one target.
pub struct FaultProxy {
    addr: String,
    listen: Endpoint,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy to `target` (`host:port`) on a kernel-chosen port.
    pub fn start(target: &str) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let shared = Self::shared(Endpoint::Tcp(target.to_string()));
        let s = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                let _ = client.set_nodelay(true);
                if !accept(&s, Conn::Tcp(client)) {
                    break;
                }
            }
        });
        Ok(FaultProxy { listen: Endpoint::Tcp(addr.clone()), addr, shared })
    }

    /// Starts a proxy listening on the unix socket `listen` (created; removed on drop) and
    /// forwarding to the unix socket `target`: the Docker Engine's, for example.
    pub fn start_unix(listen: &Path, target: &Path) -> std::io::Result<FaultProxy> {
        let listener = UnixListener::bind(listen)?;
        let shared = Self::shared(Endpoint::Unix(target.to_path_buf()));
        let s = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                if !accept(&s, Conn::Unix(client)) {
                    break;
                }
            }
        });
        Ok(FaultProxy { addr: listen.display().to_string(), listen: Endpoint::Unix(listen.to_path_buf()), shared })
    }

    fn shared(target: Endpoint) -> Arc<Shared> {
        Arc::new(Shared { mode: AtomicU8::new(Mode::Open as u8), target, conns: Mutex::new(Vec::new()), stopped: AtomicBool::new(false) })
    }

    /// The address clients should dial (`host:port`, or the unix socket's path).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Changes what happens to bytes, for live and new connections.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Cuts the link: silence both ways, connections left hanging.
    pub fn cut(&self) {
        self.set_mode(Mode::Blackhole);
    }

    /// Heals the link.
    pub fn heal(&self) {
        self.set_mode(Mode::Open);
    }

    /// The peer went away: live connections are closed and new ones refused until [`heal`].
    ///
    /// [`heal`]: FaultProxy::heal
    pub fn down(&self) {
        self.set_mode(Mode::Refuse);
        self.reset();
    }

    /// Closes every live connection (peers see a reset/EOF); new ones still work.
    pub fn reset(&self) {
        let mut conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        for c in conns.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.reset();
        // Wake the accept loop so it sees `stopped`.
        let _ = self.listen.connect();
        if let Endpoint::Unix(path) = &self.listen {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Takes one accepted connection; `false` once the proxy is stopped.
fn accept(s: &Arc<Shared>, client: Conn) -> bool {
    if s.stopped.load(Ordering::SeqCst) {
        return false;
    }
    if s.mode.load(Ordering::SeqCst) == Mode::Refuse as u8 {
        let _ = client.shutdown(Shutdown::Both);
        return true;
    }
    let Ok(server) = s.target.connect() else {
        let _ = client.shutdown(Shutdown::Both);
        return true;
    };
    if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
        let mut conns = s.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.push(c2);
        conns.push(s2);
    }
    pump(s, client.try_clone(), server.try_clone(), Mode::DropUpstream);
    pump(s, server.try_clone(), client.try_clone(), Mode::DropDownstream);
    true
}

fn pump(s: &Arc<Shared>, from: std::io::Result<Conn>, to: std::io::Result<Conn>, silenced_by: Mode) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else { return };
    let s = s.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        'conn: loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Held while paused; then forwarded or dropped by the mode of that moment.
            let mode = loop {
                let mode = s.mode.load(Ordering::SeqCst);
                if mode != Mode::Pause as u8 {
                    break mode;
                }
                if s.stopped.load(Ordering::SeqCst) {
                    break 'conn;
                }
                thread::sleep(Duration::from_millis(10));
            };
            if mode == Mode::Blackhole as u8 || mode == Mode::Refuse as u8 || mode == silenced_by as u8 {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::time::Duration;

    use super::*;

    fn echo_server() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut w = c.try_clone().unwrap();
                    for line in BufReader::new(c).lines().map_while(Result::ok) {
                        if writeln!(w, "{line}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn roundtrip(conn: &mut TcpStream, reader: &mut BufReader<TcpStream>, msg: &str) -> Option<String> {
        writeln!(conn, "{msg}").ok()?;
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        (!line.is_empty()).then(|| line.trim().to_string())
    }

    #[test]
    fn modes_cut_heal_and_reset() {
        let p = FaultProxy::start(&echo_server()).unwrap();
        let mut c = TcpStream::connect(p.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut r = BufReader::new(c.try_clone().unwrap());
        assert_eq!(roundtrip(&mut c, &mut r, "one").as_deref(), Some("one"));
        p.cut();
        assert_eq!(roundtrip(&mut c, &mut r, "lost"), None, "a cut link is silent");
        p.heal();
        assert_eq!(roundtrip(&mut c, &mut r, "two").as_deref(), Some("two"));
        p.set_mode(Mode::DropDownstream);
        assert_eq!(roundtrip(&mut c, &mut r, "no reply"), None);
        p.heal();
        // The "no reply" echo was dropped on the way back; the next one arrives.
        assert_eq!(roundtrip(&mut c, &mut r, "three").as_deref(), Some("three"));
        p.reset();
        assert_eq!(roundtrip(&mut c, &mut r, "gone"), None, "reset closes live connections");
        let mut c2 = TcpStream::connect(p.addr()).unwrap();
        c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r2 = BufReader::new(c2.try_clone().unwrap());
        assert_eq!(roundtrip(&mut c2, &mut r2, "new").as_deref(), Some("new"), "new connections still work");
    }

    fn unix_echo_server(path: &Path) {
        let l = UnixListener::bind(path).unwrap();
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut w = c.try_clone().unwrap();
                    for line in BufReader::new(c).lines().map_while(Result::ok) {
                        if writeln!(w, "{line}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }

    fn unix_roundtrip(conn: &mut UnixStream, reader: &mut BufReader<UnixStream>, msg: &str) -> Option<String> {
        writeln!(conn, "{msg}").ok()?;
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        (!line.is_empty()).then(|| line.trim().to_string())
    }

    #[test]
    fn a_unix_proxy_pauses_without_losing_bytes_and_goes_down_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.sock");
        unix_echo_server(&target);
        let p = FaultProxy::start_unix(&dir.path().join("proxy.sock"), &target).unwrap();
        let connect = || {
            let c = UnixStream::connect(p.addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            let r = BufReader::new(c.try_clone().unwrap());
            (c, r)
        };
        let (mut c, mut r) = connect();
        assert_eq!(unix_roundtrip(&mut c, &mut r, "one").as_deref(), Some("one"));
        p.set_mode(Mode::Pause);
        assert_eq!(unix_roundtrip(&mut c, &mut r, "held"), None, "a paused link does not answer");
        p.heal();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "held", "what was held arrives after the pause");
        p.down();
        assert_eq!(unix_roundtrip(&mut c, &mut r, "gone"), None, "down closes live connections");
        let (mut c2, mut r2) = connect();
        assert_eq!(unix_roundtrip(&mut c2, &mut r2, "refused"), None, "down refuses new connections");
        p.heal();
        let (mut c3, mut r3) = connect();
        c3.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(unix_roundtrip(&mut c3, &mut r3, "back").as_deref(), Some("back"));
        let path = p.addr().to_string();
        drop(p);
        assert!(!Path::new(&path).exists(), "the socket is removed with the proxy");
    }
}
