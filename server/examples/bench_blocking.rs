//! What parked blocking queries cost the writes: the server's HTTP API (over `LocalConsensus`)
//! on a real socket, job writes (`PUT /v1/jobs`) timed with no blocking query waiting and with
//! `--waiters` of them parked on other jobs (`GET /v1/job/<other>?index=&wait=`), and the
//! process RSS before they were opened, while they wait and after they all ended; then the
//! RSS left after a few large request bodies.
//!
//! ```text
//! cargo run --release -p nomad-server --example bench_blocking -- --waiters 2000 --writes 100 --wait-secs 60
//! ```
//!
//! Only uses what every version of the server has (the router and the test fixtures), so the
//! same file measures a baseline checkout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nomad_server::testing::{TestServer, job};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    waiters: usize,
    writes: usize,
    wait: Duration,
}

fn args() -> Args {
    let mut a = Args { waiters: 2000, writes: 100, wait: Duration::from_secs(60) };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or_else(|| panic!("{flag} needs a number"));
        match flag.as_str() {
            "--waiters" => a.waiters = value() as usize,
            "--writes" => a.writes = value() as usize,
            "--wait-secs" => a.wait = Duration::from_secs(value()),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// One request on its own connection; returns the status line's code and the body.
async fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let _ = s.set_nodelay(true);
    let head = format!("{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.expect("write head");
    // A server that refuses a body may answer and close before it is all sent.
    let _ = s.write_all(body).await;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    let code = std::str::from_utf8(&out[..out.len().min(12)]).ok().and_then(|l| l.get(9..12)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.windows(4).position(|w| w == b"\r\n\r\n").map(|i| out[i + 4..].to_vec()).unwrap_or_default();
    (code, body)
}

async fn register(addr: SocketAddr, id: &str, count: i64) -> u64 {
    let body = serde_json::to_vec(&serde_json::json!({ "Job": job(id, count) })).expect("job json");
    let (code, resp) = request(addr, "PUT", "/v1/jobs", &body).await;
    assert_eq!(code, 200, "register {id}: {}", String::from_utf8_lossy(&resp));
    let v: serde_json::Value = serde_json::from_slice(&resp).expect("register response");
    v["JobModifyIndex"].as_u64().unwrap_or(0)
}

/// Seconds per write for `n` writes of the job `target` (each changes its spec).
async fn time_writes(addr: SocketAddr, n: usize, first_count: i64) -> f64 {
    let start = Instant::now();
    for i in 0..n {
        register(addr, "target", first_count + i as i64).await;
    }
    start.elapsed().as_secs_f64() / n as f64
}

async fn until(what: &str, deadline: Duration, cond: impl Fn() -> bool) {
    let end = Instant::now() + deadline;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::main]
async fn main() {
    let a = args();
    let ts = TestServer::new();
    // Requests inside a handler now: tells when every blocking query is parked and when all ended.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let counted = in_flight.clone();
    let router = ts.router().layer(axum::middleware::from_fn(move |req, next: axum::middleware::Next| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            let r = next.run(req).await;
            counted.fetch_sub(1, Ordering::SeqCst);
            r
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });

    let mut watched = Vec::with_capacity(a.waiters);
    for i in 0..a.waiters {
        let id = format!("watched-{i}");
        let index = register(addr, &id, 1).await;
        watched.push((id, index));
    }
    register(addr, "target", 1).await;

    // Warm up, then writes with no query waiting.
    time_writes(addr, a.writes / 4 + 1, 1000).await;
    let idle = time_writes(addr, a.writes, 2000).await;

    let rss_before = rss_mib();
    let wait = format!("{}s", a.wait.as_secs());
    let opened = Instant::now();
    let queries: Vec<_> = watched
        .iter()
        .map(|(id, index)| {
            let path = format!("/v1/job/{id}?index={index}&wait={wait}");
            tokio::spawn(async move { request(addr, "GET", &path, b"").await.0 })
        })
        .collect();
    until("the blocking queries to park", Duration::from_secs(60), || in_flight.load(Ordering::SeqCst) >= a.waiters).await;
    let busy = time_writes(addr, a.writes, 3000).await;
    let rss_waiting = rss_mib();
    let answered_early = queries.iter().filter(|q| q.is_finished()).count();
    for q in queries {
        assert_eq!(q.await.expect("query task"), 200);
    }
    let held = opened.elapsed();
    until("every request to end", Duration::from_secs(60), || in_flight.load(Ordering::SeqCst) == 0).await;
    let rss_after = rss_mib();

    // Large bodies: a valid job with a 20 MiB ID (read, decoded, refused), then 40 MiB bodies
    // (over the 32 MiB limit: a 413).
    let rss_before_bodies = rss_mib();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let big = format!("{{\"Job\":{{\"ID\":\"{}\"}}}}", "a".repeat(20 << 20));
        codes.push(request(addr, "PUT", "/v1/jobs", big.as_bytes()).await.0);
        codes.push(request(addr, "PUT", "/v1/jobs", &vec![b' '; 40 << 20]).await.0);
    }
    until("every request to end", Duration::from_secs(60), || in_flight.load(Ordering::SeqCst) == 0).await;
    let rss_after_bodies = rss_mib();

    println!(
        "one write: {:.3} ms with no blocking query, {:.3} ms with {} waiting on other jobs ({:.2}x); {} of them answered before their wait ({} writes each phase)",
        idle * 1e3,
        busy * 1e3,
        a.waiters,
        busy / idle,
        answered_early,
        a.writes,
    );
    println!(
        "rss: {rss_before:.1} MiB before the queries, {rss_waiting:.1} MiB while they wait, {rss_after:.1} MiB after they ended ({:+.1} MiB kept); queries held {:.1} s",
        rss_after - rss_before,
        held.as_secs_f64(),
    );
    println!(
        "large bodies (4 x 20 MiB job, 4 x 40 MiB over the limit; statuses {codes:?}): rss {rss_before_bodies:.1} MiB before, {rss_after_bodies:.1} MiB after ({:+.1} MiB kept)",
        rss_after_bodies - rss_before_bodies,
    );
}
