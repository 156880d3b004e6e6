//! End-to-end harness: real `nomad-rs` processes driven over HTTP.
//!
//! Every agent gets its own temp dir and kernel-chosen ports (read back from
//! its banner), its output is kept in files that are printed when a test
//! fails, and processes are killed when their handle drops, so a panicking
//! test leaves nothing behind.

pub mod cluster;
pub mod consul;
pub mod http;
pub mod netns;
pub mod proxy;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

pub use cluster::{Cluster, ClusterOptions};
pub use http::HttpClient;
pub use proxy::{FaultProxy, Mode};

/// The `nomad-rs` binary under test: `$NOMAD_RS_BIN`, else the workspace's debug build.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("NOMAD_RS_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let bin = target.join("debug").join("nomad-rs");
    assert!(bin.exists(), "{} is missing: build it first with `cargo build -p nomad-agent` (or set NOMAD_RS_BIN)", bin.display());
    bin
}

/// Polls `f` until it returns `Some` or `timeout` passes; the error names what was awaited.
pub use nomad_testkit::wait_for_blocking as wait_for;

/// How to start an agent.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// Extra command-line arguments after `agent`.
    pub args: Vec<String>,
    /// Contents of a config file passed with `-config`.
    pub config: Option<String>,
    /// Fixed ports (used when restarting an agent on the same addresses).
    pub ports: Option<(u16, u16)>,
    /// Run inside this network-namespace host, bound to its address.
    pub host: Option<netns::Host>,
}

/// A running `nomad-rs agent` process.
pub struct Agent {
    /// Name used in logs.
    pub name: String,
    dir: PathBuf,
    child: Option<Child>,
    opts: AgentOptions,
    /// HTTP address (`127.0.0.1:port`).
    pub http_addr: String,
    /// RPC address.
    pub rpc_addr: String,
}

impl Agent {
    /// Starts an agent whose state lives in `dir` (created if needed).
    pub fn start(name: &str, dir: &Path, opts: AgentOptions) -> Result<Agent> {
        std::fs::create_dir_all(dir)?;
        let mut a =
            Agent { name: name.to_string(), dir: dir.to_path_buf(), child: None, opts, http_addr: String::new(), rpc_addr: String::new() };
        a.spawn()?;
        Ok(a)
    }

    /// The agent's directory (data dir and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data dir passed to the agent.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn spawn(&mut self) -> Result<()> {
        let (http_port, rpc_port) = self.opts.ports.unwrap_or((0, 0));
        let (mut cmd, bind) = match &self.opts.host {
            Some(h) => {
                let prefix = h.exec_prefix();
                let mut c = Command::new(&prefix[0]);
                c.args(&prefix[1..]).arg(binary());
                (c, h.ip.clone())
            }
            None => (Command::new(binary()), "127.0.0.1".to_string()),
        };
        cmd.arg("agent")
            .arg("-data-dir")
            .arg(self.data_dir())
            .arg("-bind")
            .arg(bind)
            .arg("-http-port")
            .arg(http_port.to_string())
            .arg("-rpc-port")
            .arg(rpc_port.to_string())
            .arg("-node")
            .arg(&self.name);
        if let Some(cfg) = &self.opts.config {
            let path = self.dir.join("agent.hcl");
            std::fs::write(&path, cfg)?;
            cmd.arg("-config").arg(path);
        }
        cmd.args(&self.opts.args);
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("agent.stderr.log"))?;
        cmd.stdout(Stdio::piped()).stderr(stderr).stdin(Stdio::null());
        let mut child = cmd.spawn().with_context(|| format!("spawning {}", binary().display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let log_path = self.dir.join("agent.stdout.log");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut log = std::fs::OpenOptions::new().create(true).append(true).open(log_path).ok();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(f) = log.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
                if let Some(rest) = line.trim().strip_prefix("Bind Addrs: HTTP: [") {
                    let http = rest.split(']').next().unwrap_or_default().to_string();
                    let rpc = rest.split("RPC: ").nth(1).unwrap_or_default().trim().to_string();
                    let _ = tx.send((http, rpc));
                }
            }
        });
        self.child = Some(child);
        let (http, rpc) = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(v) => v,
            Err(_) => {
                let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                bail!("agent {} did not start (exit: {status:?}):\n{}", self.name, self.logs());
            }
        };
        self.http_addr = http;
        self.rpc_addr = rpc;
        Ok(())
    }

    /// An HTTP client for this agent.
    pub fn http(&self) -> HttpClient {
        HttpClient::new(&self.http_addr)
    }

    /// The agent's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`: no shutdown of any kind.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().context("SIGKILL")?;
            c.wait()?;
        }
        Ok(())
    }

    /// Sends a signal (e.g. SIGSTOP, SIGCONT, SIGTERM) to the agent.
    pub fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid = self.pid().ok_or_else(|| anyhow!("agent {} is not running", self.name))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    /// Sends `sig` (SIGINT, SIGTERM: a normal shutdown) and waits up to `timeout` for the agent
    /// to exit; returns its exit status. On timeout the agent is killed and an error returned.
    pub fn stop_with(&mut self, sig: nix::sys::signal::Signal, timeout: Duration) -> Result<std::process::ExitStatus> {
        self.signal(sig)?;
        let mut child = self.child.take().ok_or_else(|| anyhow!("agent {} is not running", self.name))?;
        let exited = wait_for(&format!("agent {} to exit after {sig}", self.name), timeout, || child.try_wait().ok().flatten());
        if exited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
        exited.map_err(|e| anyhow!("{e}\n{}", self.logs()))
    }

    /// Starts the agent again on the same data dir and the same ports.
    pub fn restart(&mut self) -> Result<()> {
        self.kill9()?;
        let port = |a: &str| a.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0);
        self.opts.ports = Some((port(&self.http_addr), port(&self.rpc_addr)));
        self.spawn()
    }

    /// Waits until the HTTP API answers and a leader is known.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<String> {
        let http = self.http();
        wait_for("a cluster leader", timeout, || {
            http.get_json("/v1/status/leader").ok().and_then(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string))
        })
        .map_err(|e| anyhow!("{e}\n{}", self.logs()))
    }

    /// Both log files, for failure messages.
    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!("--- {} stdout ---\n{}\n--- {} stderr ---\n{}", self.name, read("agent.stdout.log"), self.name, read("agent.stderr.log"))
    }
}

impl Drop for Agent {
    /// Kills the agent, then what it started that outlives it: a killed client leaves its tasks
    /// running by design (a restarted agent reattaches), but a finished test must leave nothing.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = self.kill9();
        kill_executors_under(&self.dir);
        unmount_under(&self.dir);
    }
}

/// Detaches every mount under `dir` (a killed client leaves its tasks' `secrets/` tmpfs
/// mounted by design, for the agent that restarts), deepest first, so the temp dir can go.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else { return };
    let mut points: Vec<&str> =
        mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| Path::new(m).starts_with(dir)).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Kills every task executor whose command line names a path under `dir`, and its tasks.
fn kill_executors_under(dir: &Path) {
    let marker = dir.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("nomad-rs-executor") && cmdline.contains(&marker) {
            kill_tree(pid);
        }
    }
}

/// SIGKILLs a process and its descendants (children first, so none is reparented away).
fn kill_tree(pid: i32) {
    let children: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect();
    for child in children {
        kill_tree(child);
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}
