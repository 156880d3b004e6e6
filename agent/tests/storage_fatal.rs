//! A server agent whose Raft log can no longer be written exits non-zero with a message naming
//! its data dir, so a supervisor restarts it (instead of a leader that cannot write).
//!
//! The disk "fills" for real: once the agent runs, its file size limit (RLIMIT_FSIZE, set with
//! prlimit, no root needed) is lowered to just above the Raft log's size, so the next writes
//! that grow the file fail with EFBIG the way they would with ENOSPC.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

/// Sends one HTTP/1.1 request and returns the status code (0 when the agent did not answer).
fn http(addr: &str, method: &str, path: &str, body: &str) -> u16 {
    let Ok(mut stream) = TcpStream::connect(addr) else { return 0 };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return 0;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// A job of about 450 KB (its meta), so a few of them outgrow any file size limit set below.
fn big_job(n: usize) -> String {
    let meta: Vec<String> = (0..7).map(|k| format!("\"k{k}\": \"{}\"", "x".repeat(60 * 1024))).collect();
    format!(
        r#"{{"Job": {{"ID": "big-{n}", "Type": "batch", "Datacenters": ["dc1"], "Meta": {{{}}},
  "TaskGroups": [{{"Name": "g", "Count": 1, "Tasks": [{{"Name": "t", "Driver": "raw_exec",
    "Config": {{"command": "/bin/true"}}, "Resources": {{"CPU": 20, "MemoryMB": 10}}}}]}}]}}}}"#,
        meta.join(", ")
    )
}

fn start_agent(data_dir: &Path) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nomad-rs"));
    cmd.args(["agent", "-server", "-bootstrap-expect", "1", "-bind", "127.0.0.1", "-http-port", "0", "-rpc-port", "0"])
        .arg("-data-dir")
        .arg(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec. An ignored SIGXFSZ makes a
    // write past the size limit fail with EFBIG instead of killing the process.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    cmd.spawn().expect("start nomad-rs agent")
}

/// The HTTP address from the banner (`Bind Addrs: HTTP: [addr]; ...`).
fn http_addr(child: &mut Child) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines.next().expect("the agent printed its banner").unwrap();
        if let Some(rest) = line.split("Bind Addrs: HTTP: [").nth(1) {
            break rest.split(']').next().unwrap().to_string();
        }
    };
    // Keep draining stdout so the agent never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    addr
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn limit_file_size(pid: u32, bytes: u64) {
    let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
    // SAFETY: prlimit with a valid pid and a pointer to a live rlimit; the old value is not asked for.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_FSIZE, &limit, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn a_server_that_cannot_write_its_raft_log_exits_non_zero_naming_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut agent = start_agent(&data_dir);
    let addr = http_addr(&mut agent);
    // Read stderr all along, so the agent never blocks on a full pipe.
    let stderr = agent.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    wait_until("a leader", || http(&addr, "PUT", "/v1/jobs", &big_job(0)) == 200);

    let log = data_dir.join("server/raft/raft.redb");
    let size = std::fs::metadata(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display())).len();
    limit_file_size(agent.id(), size + (1 << 20));

    // Writes go on until the log cannot grow; the one that fails is not acknowledged.
    let mut refused = false;
    for n in 1..200 {
        if http(&addr, "PUT", "/v1/jobs", &big_job(n)) != 200 {
            refused = true;
            break;
        }
    }
    assert!(refused, "every write was acknowledged although the log could not grow past {} bytes", size + (1 << 20));

    let mut status = None;
    wait_until("the agent to exit", || {
        status = agent.try_wait().unwrap();
        status.is_some()
    });
    let stderr = stderr.join().unwrap();
    let status = status.unwrap();
    assert_eq!(status.code(), Some(1), "exit status {status:?}; stderr:\n{stderr}");
    let raft_dir = log.parent().unwrap().display().to_string();
    assert!(stderr.contains(&raft_dir), "the error names the data dir {raft_dir}:\n{stderr}");
    assert!(stderr.contains("raft stopped on a storage error"), "the error says what failed:\n{stderr}");
}
