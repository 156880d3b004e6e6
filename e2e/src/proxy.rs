//! A fault-injecting TCP proxy to put between clients and servers.
//!
//! Modes apply to live connections at once:
//! - `Open`: bytes flow both ways;
//! - `Blackhole`: bytes are read and dropped both ways, connections stay open
//!   (what a real partition looks like: no RST, just silence);
//! - `DropUpstream` / `DropDownstream`: one direction is silenced;
//! - [`FaultProxy::reset`] closes every connection at once.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

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
}

struct Shared {
    mode: AtomicU8,
    target: String,
    conns: Mutex<Vec<TcpStream>>,
    stopped: AtomicBool,
}

/// A proxy listening on 127.0.0.1 and forwarding to one target.
pub struct FaultProxy {
    addr: String,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Starts a proxy to `target` (`host:port`) on a kernel-chosen port.
    pub fn start(target: &str) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Open as u8),
            target: target.to_string(),
            conns: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(&s.target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                    let mut conns = s.conns.lock().unwrap_or_else(|e| e.into_inner());
                    conns.push(c2);
                    conns.push(s2);
                }
                pump(&s, client.try_clone(), server.try_clone(), Mode::DropUpstream);
                pump(&s, server.try_clone(), client.try_clone(), Mode::DropDownstream);
            }
        });
        Ok(FaultProxy { addr, shared })
    }

    /// The address clients should dial.
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
        let _ = TcpStream::connect(&self.addr);
    }
}

fn pump(s: &Arc<Shared>, from: std::io::Result<TcpStream>, to: std::io::Result<TcpStream>, silenced_by: Mode) {
    let (Ok(mut from), Ok(mut to)) = (from, to) else { return };
    let s = s.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mode = s.mode.load(Ordering::SeqCst);
            if mode == Mode::Blackhole as u8 || mode == silenced_by as u8 {
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
}
