//! Running the binary and serving APIs for it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use nomad_proto::alloc::TaskEvent;
use nomad_proto::{Allocation, ClientStatus, EvalStatus, Evaluation, Job, TaskState};
use nomad_server::consensus::Consensus;
use nomad_server::fsm::{Command, PlanApply};
use nomad_server::testing::TestServer;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// What a run of the binary produced.
#[derive(Debug)]
pub struct Run {
    /// Exit code.
    pub code: i32,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
}

impl Run {
    /// Panics with the whole output unless the exit code is `code`.
    pub fn expect_code(&self, code: i32) -> &Run {
        assert_eq!(self.code, code, "exit code\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }

    /// Panics with the whole output unless stdout contains `s`.
    pub fn stdout_has(&self, s: &str) -> &Run {
        assert!(self.stdout.contains(s), "stdout lacks {s:?}\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }

    /// Panics with the whole output unless stderr contains `s`.
    pub fn stderr_has(&self, s: &str) -> &Run {
        assert!(self.stderr.contains(s), "stderr lacks {s:?}\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }
}

/// Runs `nomad-rs` with `args`, no NOMAD_* settings from the environment unless `env` gives them,
/// and `stdin` as its standard input (empty: closed).
pub async fn nomad_with(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nomad-rs"));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("NOMAD_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("start nomad-rs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.expect("wait for nomad-rs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `nomad-rs` with `args`.
pub async fn nomad(args: &[&str]) -> Run {
    nomad_with(args, &[], "").await
}

/// Serves `router` on 127.0.0.1:0 and returns its `http://` address.
pub async fn serve(router: axum::Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    format!("http://{addr}")
}

/// An in-process server and its address.
pub struct Api {
    /// The server.
    pub server: TestServer,
    /// `http://127.0.0.1:<port>`.
    pub addr: String,
}

impl Api {
    /// A fresh TestServer, served.
    pub async fn start() -> Api {
        Api::serving(TestServer::new()).await
    }

    /// `server`, served.
    pub async fn serving(server: TestServer) -> Api {
        let addr = serve(server.router()).await;
        Api { server, addr }
    }

    /// Runs `nomad-rs <args> -address <this server>`.
    pub async fn nomad(&self, args: &[&str]) -> Run {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-address", &self.addr]);
        nomad(&all).await
    }

    /// Places a running allocation of `job_id`'s first group on `node_id`, as a scheduler and
    /// client would: the eval is completed and the alloc reports a running task.
    pub async fn place(&self, job_id: &str, node_id: &str, index: u64) -> Allocation {
        self.place_as(job_id, node_id, index, &nomad_proto::new_id()).await
    }

    /// [`Api::place`] with a chosen allocation ID.
    pub async fn place_as(&self, job_id: &str, node_id: &str, index: u64, alloc_id: &str) -> Allocation {
        let snap = self.server.store.snapshot();
        let job: Arc<Job> = snap.job("default", job_id).expect("job registered").clone();
        let mut eval: Evaluation = snap.evals_by_job("default", job_id).next().map(|e| (**e).clone()).expect("the job has an eval");
        eval.status = EvalStatus::Complete;
        let group = &job.task_groups[0];
        let task = group.tasks[0].name.clone();
        let state = TaskState {
            state: "running".into(),
            events: vec![
                TaskEvent {
                    event_type: "Received".into(),
                    time: nomad_proto::Timestamp::now().unix_nanos() - 2_000_000_000,
                    ..TaskEvent::default()
                },
                TaskEvent { event_type: "Started".into(), time: nomad_proto::Timestamp::now().unix_nanos(), ..TaskEvent::default() },
            ],
            started_at: nomad_proto::Timestamp::now(),
            ..TaskState::default()
        };
        let alloc = Allocation {
            id: alloc_id.into(),
            namespace: "default".into(),
            eval_id: eval.id.clone(),
            name: format!("{job_id}.{}[{index}]", group.name),
            node_id: node_id.into(),
            node_name: node_id.into(),
            job_id: job_id.into(),
            task_group: group.name.clone(),
            client_status: ClientStatus::Running,
            client_description: "Tasks are running".into(),
            task_states: Some(BTreeMap::from([(task, state)])),
            ..Allocation::default()
        };
        let plan = PlanApply {
            job: Some((*job).clone()),
            allocs_upserted: vec![alloc.clone()],
            eval: Some(eval),
            now: nomad_proto::Timestamp::now(),
            ..PlanApply::default()
        };
        self.server.consensus.apply(Command::PlanApply(plan)).await.expect("apply plan");
        self.server.store.snapshot().alloc(&alloc.id).expect("alloc stored").as_ref().clone()
    }
}

/// A path under the repository's `examples/`.
pub fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).display().to_string()
}

/// A port nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Answers with the next value of a canned sequence each call (the last one repeats), with an
/// `X-Nomad-Index` that grows per call, as a blocking endpoint would.
pub struct Seq {
    items: Vec<serde_json::Value>,
    calls: std::sync::atomic::AtomicUsize,
}

impl Seq {
    /// A sequence.
    pub fn new(items: Vec<serde_json::Value>) -> Arc<Seq> {
        assert!(!items.is_empty());
        Arc::new(Seq { items, calls: std::sync::atomic::AtomicUsize::new(0) })
    }

    /// The next answer.
    pub fn reply(&self) -> axum::response::Response {
        let i = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let v = self.items[i.min(self.items.len() - 1)].clone();
        json_reply(&v, i as u64 + 1)
    }
}

/// A JSON answer with `X-Nomad-Index`.
pub fn json_reply(v: &serde_json::Value, index: u64) -> axum::response::Response {
    axum::response::Response::builder()
        .header("Content-Type", "application/json")
        .header("X-Nomad-Index", index.to_string())
        .body(axum::body::Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

/// Requests a fake server received: method, path with query, headers of interest, body.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// `X-Nomad-Token`, if sent.
    pub token: Option<String>,
    /// Body as JSON (null when empty).
    pub body: serde_json::Value,
}

/// A log of requests, shared with a fake server's middleware.
pub type Log = Arc<std::sync::Mutex<Vec<Seen>>>;

/// Wraps `router` so every request is appended to the returned log.
pub fn recorded(router: axum::Router) -> (axum::Router, Log) {
    let log: Log = Arc::default();
    let l = log.clone();
    let router = router.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let l = l.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            l.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                token: parts.headers.get("X-Nomad-Token").and_then(|v| v.to_str().ok()).map(str::to_string),
                body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            });
            next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await
        }
    }));
    (router, log)
}

/// The first recorded request whose path starts with `prefix`.
pub fn find(log: &Log, method: &str, prefix: &str) -> Option<Seen> {
    log.lock().unwrap().iter().find(|s| s.method == method && s.uri.starts_with(prefix)).cloned()
}
