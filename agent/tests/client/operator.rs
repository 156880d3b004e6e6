//! Operator access to running tasks through the client's HTTP API: `alloc fs` (path escapes
//! refused, offsets honoured), `alloc signal` delivery, `alloc exec` over the websocket with and
//! without a TTY (raw_exec; exec as root; docker on the real Engine), host stats and client GC.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use nomad_agent::client::Client;
use nomad_agent::client::http::{ClientHttp, router};
use nomad_proto::Task;
use nomad_proto::job::JobType;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{TestServer, event_types, job, restart_policy, sh_task, start_client, task_pid, wait_for, wait_ready, wait_until};

async fn serve(client: &Client) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = router(ClientHttp { client: Some(client.clone()), locator: None, own_addr: addr.clone() });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn request(method: &str, url: &str, body: &str) -> (u16, String) {
    let req = hyper::Request::builder().method(method).uri(url).body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let http: HttpClient<_, Full<Bytes>> = HttpClient::builder(TokioExecutor::new()).build_http();
    let resp = http.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A client serving its routes, and one running alloc of `task`.
struct Running {
    _root: tempfile::TempDir,
    server: TestServer,
    client: Client,
    addr: String,
    id: String,
    alloc_dir: std::path::PathBuf,
}

async fn running(task: Task) -> Running {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;
    let name = task.name.clone();
    let id = server.place(&job("op", JobType::Service, vec![task], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the task runs", || task_pid(&client, &id, &name)).await;
    let alloc_dir = root.path().join("alloc").join(&id);
    Running { _root: root, server, client, addr, id, alloc_dir }
}

impl Running {
    async fn fs(&self, op: &str, query: &str) -> (u16, String) {
        request("GET", &format!("http://{}/v1/client/fs/{op}/{}?{query}", self.addr, self.id), "").await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_fs_serves_the_alloc_dir_and_refuses_every_way_out_of_it() {
    // The task plants a symlink to /etc in its dir and a symlinked parent dir in the shared dir.
    let script = "printf 0123456789 > local/digits; ln -s /etc etc; ln -s / ../alloc/up; ln -s ../../../../../../../etc/passwd climb; touch ready; sleep 300";
    let r = running(sh_task("t", script)).await;
    wait_until("the task planted its links", || r.alloc_dir.join("t/ready").exists()).await;

    let (code, body) = r.fs("ls", "path=/t").await;
    assert_eq!(code, 200, "{body}");
    let files: Vec<Value> = serde_json::from_str(&body).unwrap();
    let etc = files.iter().find(|f| f["Name"] == "etc").expect("etc listed");
    assert_eq!((etc["IsDir"].clone(), etc["FileMode"].as_str().unwrap().starts_with('L')), (json!(false), true), "{etc}");
    let (code, body) = r.fs("stat", "path=t/local/digits").await;
    assert_eq!(code, 200);
    let info: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (info["Name"].clone(), info["Size"].clone(), info["ContentType"].clone()),
        (json!("digits"), json!(10), json!("text/plain; charset=utf-8"))
    );
    assert!(info["ModTime"].as_str().unwrap().starts_with("20"), "{info}");

    assert_eq!(r.fs("cat", "path=/t/local/digits").await, (200, "0123456789".into()));
    assert_eq!(r.fs("readat", "path=/t/local/digits&offset=3&limit=4").await, (200, "3456".into()));
    assert_eq!(r.fs("readat", "path=/t/local/digits&offset=8").await, (200, "89".into()));
    let (code, body) = r.fs("stream", "path=/t/local/digits&offset=2&origin=end&follow=false").await;
    assert_eq!(code, 200);
    let frame: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((frame["Offset"].clone(), frame["Data"].clone()), (json!(10), json!("ODk=")), "{body}");

    // Every way out: `..`, a symlink to /etc (at the end and on the way), a symlinked parent
    // dir, a relative link that climbs out. An absolute path is the alloc dir's, never the host's.
    for query in ["path=../../etc/passwd", "path=/t/etc/passwd", "path=/t/etc", "path=/alloc/up/etc/passwd", "path=t/climb"] {
        for op in ["cat", "readat", "stream"] {
            let q = format!("{query}&offset=0&follow=false");
            assert_eq!(r.fs(op, &q).await, (400, "Path escapes the alloc directory".into()), "{op} {query}");
        }
        let (code, body) = r.fs("stat", query).await;
        assert_eq!((code, body.as_str()), (500, "Path escapes the alloc directory"), "stat {query}");
    }
    assert_eq!(r.fs("ls", "path=/t/etc").await, (500, "Path escapes the alloc directory".into()));
    assert_eq!(r.fs("cat", "path=/etc/passwd").await.0, 400);
    assert_eq!(r.fs("stat", "path=/etc/passwd").await.0, 404);
    let (code, body) = r.fs("cat", "path=/t").await;
    assert_eq!((code, body.as_str()), (400, "file \"/t\" is a directory"));
    assert_eq!(r.fs("cat", "").await, (400, "must provide a file name".into()));
    assert_eq!(r.fs("readat", "path=/t/local/digits&offset=x").await.0, 400);
    let (code, body) = r.fs("cat", "path=/t/secrets/x").await;
    assert_eq!(code, 400, "{body}");
    r.client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_signal_reaches_the_task_through_its_driver_with_an_event() {
    let script = "trap 'echo usr1 > got-usr1' USR1; touch ready; while true; do sleep 0.1; done";
    let r = running(sh_task("t", script)).await;
    wait_until("the trap is set", || r.alloc_dir.join("t/ready").exists()).await;
    let url = format!("http://{}/v1/client/allocation/{}/signal", r.addr, r.id);

    let (code, body) = request("POST", &url, r#"{"Signal": "SIGUSR1", "Task": "t"}"#).await;
    assert_eq!((code, body.as_str()), (200, r#"{"Index":0}"#));
    wait_until("the task trapped SIGUSR1", || std::fs::read_to_string(r.alloc_dir.join("t/got-usr1")).is_ok_and(|s| s == "usr1\n")).await;
    let state = wait_for("the server sees the event", || {
        r.server.task_state(&r.id, "t").filter(|s| event_types(s).iter().any(|t| t == "Signaling"))
    })
    .await;
    let event = state.events.iter().find(|e| e.event_type == "Signaling").unwrap();
    assert_eq!(
        (event.display_message.as_str(), event.details.get("signal").map(String::as_str)),
        ("Task being sent a signal", Some("SIGUSR1"))
    );
    assert_eq!(state.state, "running", "the trap kept it alive");

    let (code, body) = request("PUT", &url, r#"{"Signal": "SIGUSR1", "Task": "ghost"}"#).await;
    assert_eq!((code, body.as_str()), (500, "Task not found"));
    // Nomad's drivers' text (python-nomad matches "invalid signal"), for one task or all.
    for body in [r#"{"Signal": "SIGNOPE", "Task": "t"}"#, r#"{"Signal": "SIGNOPE"}"#] {
        let (code, text) = request("PUT", &url, body).await;
        assert_eq!(code, 400, "{text}");
        assert!(text.starts_with("failed to parse signal: invalid signal \"SIGNOPE\" - valid signals are [\""), "{text}");
        assert!(text.contains("\"SIGUSR1\""), "{text}");
    }
    assert_eq!(request("GET", &url, "").await.0, 405);
    r.client.shutdown_destroying_allocs().await;
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn exec_ws(addr: &str, id: &str, task: &str, command: &[&str], tty: bool) -> Ws {
    let cmd = serde_json::to_string(command).unwrap();
    let url = format!("ws://{addr}/v1/client/allocation/{id}/exec?task={task}&tty={tty}&command={}", enc(&cmd));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.expect("websocket upgrade");
    ws
}

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::Text(v.to_string().into())).await.unwrap();
}

/// Reads frames until stdout holds `want` (or the exit when `want` is empty); returns stdout and
/// the exit code if it came.
async fn read_until(ws: &mut Ws, want: &str) -> (String, Option<i64>) {
    let mut out = String::new();
    let mut code = None;
    let got = tokio::time::timeout(crate::support::DEADLINE, async {
        while let Some(Ok(msg)) = ws.next().await {
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            for stream in ["stdout", "stderr"] {
                if let Some(d) = v[stream]["data"].as_str() {
                    out.push_str(&String::from_utf8_lossy(&nomad_agent::client::base64::decode(d).unwrap()));
                }
            }
            if v["exited"] == json!(true) {
                code = v["result"]["exit_code"].as_i64();
                return;
            }
            if !want.is_empty() && out.contains(want) {
                return;
            }
        }
    })
    .await;
    assert!(got.is_ok(), "timed out waiting for {want:?}: {out:?}");
    (out, code)
}

async fn exec_sessions_work(addr: &str, id: &str) {
    // Pipes: stdin echoed back, stderr apart, the exit code reported.
    let mut ws = exec_ws(addr, id, "t", &["/bin/sh", "-c", "read x; echo got-$x; echo oops >&2; exit 3"], false).await;
    send(&mut ws, json!({"stdin": {"data": "aGVsbG8K"}})).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert!(out.contains("got-hello") && out.contains("oops"), "{out:?}");
    assert_eq!(code, Some(3));

    // Closing stdin ends cat.
    let mut ws = exec_ws(addr, id, "t", &["/bin/cat"], false).await;
    send(&mut ws, json!({"stdin": {"data": "YWJj"}})).await;
    send(&mut ws, json!({"stdin": {"close": true}})).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert_eq!((out.as_str(), code), ("abc", Some(0)));

    // A TTY: the command has a terminal of the size sent, and follows a resize.
    let mut ws = exec_ws(addr, id, "t", &["/bin/sh", "-c", "tty -s && echo on-a-tty; stty size; read x; stty size; exit 4"], true).await;
    send(&mut ws, json!({"tty_size": {"height": 24, "width": 80}})).await;
    // The first size may land before or after the shell asks: wait for the prompt, then resize.
    let (first, _) = read_until(&mut ws, "on-a-tty").await;
    assert!(first.contains("on-a-tty"), "{first:?}");
    send(&mut ws, json!({"tty_size": {"height": 50, "width": 132}})).await;
    send(&mut ws, json!({"stdin": {"data": "Z28K"}})).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert!(out.contains("50 132"), "{out:?}");
    assert_eq!(code, Some(4));

    // What cannot run is said in the close frame.
    let mut ws = exec_ws(addr, id, "ghost", &["true"], false).await;
    let closed = tokio::time::timeout(crate::support::DEADLINE, ws.next()).await.unwrap();
    match closed {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.reason.as_str(), "unknown task name \"ghost\""),
        other => panic!("expected a close frame, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_exec_runs_commands_in_a_raw_exec_task_with_and_without_a_tty() {
    let r = running(sh_task("t", "sleep 300")).await;
    exec_sessions_work(&r.addr, &r.id).await;
    r.client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_exec_runs_commands_inside_an_exec_task_with_and_without_a_tty() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root);
    let mut t = Task { name: "t".into(), driver: "exec".into(), ..Task::default() };
    t.config.insert("command".into(), json!("/bin/sleep"));
    t.config.insert("args".into(), json!(["300"]));
    t.resources.cpu = 100;
    t.resources.memory_mb = 64;
    let r = running(t).await;
    exec_sessions_work(&r.addr, &r.id).await;
    // Inside the task's namespaces: its own PID 1 is the task's sleep.
    let mut ws = exec_ws(&r.addr, &r.id, "t", &["/bin/sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"], false).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert_eq!((out.trim(), code), ("/bin/sleep 300", Some(0)));
    r.client.shutdown_destroying_allocs().await;
}

/// The locator of a server that knows where some allocs run.
struct Fixed(Vec<(String, String)>);
impl nomad_agent::client::http::AllocLocator for Fixed {
    fn node_http_addr(&self, alloc_id: &str) -> Option<String> {
        self.0.iter().find(|(id, _)| id == alloc_id).map(|(_, addr)| addr.clone())
    }
}

/// `alloc exec` reaching an agent that does not run the alloc (a server) is relayed to the
/// alloc's node: sessions behave as they do there, a handshake is read by the relay, and what
/// the node refuses comes back as it said it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_exec_is_relayed_from_an_agent_that_does_not_run_the_alloc() {
    let r = running(sh_task("t", "sleep 300")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay = listener.local_addr().unwrap().to_string();
    // `ghost` is an alloc the servers place on the node, which does not run it.
    let locator = Arc::new(Fixed(vec![(r.id.clone(), r.addr.clone()), ("ghost".into(), r.addr.clone())]));
    let app = router(ClientHttp { client: None, locator: Some(locator), own_addr: relay.clone() });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    exec_sessions_work(&relay, &r.id).await;

    // With a handshake: the relay reads it; the node never sees one.
    let cmd = serde_json::to_string(&["/bin/sh", "-c", "echo via-relay; exit 5"]).unwrap();
    let url = format!("ws://{relay}/v1/client/allocation/{}/exec?task=t&ws_handshake=true&command={}", r.id, enc(&cmd));
    let (mut ws, _) = tokio_tungstenite::client_async(url.clone(), tokio::net::TcpStream::connect(&relay).await.unwrap()).await.unwrap();
    send(&mut ws, json!({"version": 1, "auth_token": "secret"})).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert_eq!((out.as_str(), code), ("via-relay\n", Some(5)));
    let (mut ws, _) = tokio_tungstenite::client_async(url, tokio::net::TcpStream::connect(&relay).await.unwrap()).await.unwrap();
    send(&mut ws, json!({"version": 2})).await;
    match tokio::time::timeout(crate::support::DEADLINE, ws.next()).await.unwrap() {
        Some(Ok(Message::Close(Some(frame)))) => assert_eq!(frame.reason.as_str(), "unexpected handshake value: 2"),
        other => panic!("expected a close frame, got {other:?}"),
    }

    // Refusals come over HTTP, before any upgrade: the relay's own, and the node's as it said it.
    for alloc in ["nope", "ghost"] {
        let url = format!("ws://{relay}/v1/client/allocation/{alloc}/exec?task=t&command=%5B%22true%22%5D");
        let refused = tokio_tungstenite::client_async(url, tokio::net::TcpStream::connect(&relay).await.unwrap()).await.unwrap_err();
        let tokio_tungstenite::tungstenite::Error::Http(resp) = refused else { panic!("{refused:?}") };
        let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
        assert_eq!((resp.status().as_u16(), body), (404, format!("Unknown allocation \"{alloc}\"")));
    }
    r.client.shutdown_destroying_allocs().await;
}

/// Removes a container by name when the test ends, whatever happened.
struct RemoveContainer(String);
impl Drop for RemoveContainer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_exec_runs_commands_inside_a_docker_task_with_and_without_a_tty() {
    use nomad_testkit::Prereq;
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Docker, Prereq::Busybox);
    let image = tokio::task::spawn_blocking(nomad_testkit::docker::busybox_image).await.unwrap();
    let mut t = Task { name: "t".into(), driver: "docker".into(), ..Task::default() };
    t.config.insert("image".into(), json!(image));
    t.config.insert("command".into(), json!("sleep"));
    t.config.insert("args".into(), json!(["300"]));
    t.resources.cpu = 100;
    t.resources.memory_mb = 64;
    let r = running(t).await;
    let _container = RemoveContainer(format!("t-{}", r.id));
    exec_sessions_work(&r.addr, &r.id).await;
    // Inside the container: its PID 1 is the task's sleep.
    let mut ws = exec_ws(&r.addr, &r.id, "t", &["/bin/sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '"], false).await;
    let (out, code) = read_until(&mut ws, "").await;
    assert_eq!((out.trim(), code), ("sleep 300", Some(0)));
    r.client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_stats_and_client_gc_of_terminal_allocs() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;

    let (code, body) = request("GET", &format!("http://{addr}/v1/client/stats"), "").await;
    assert_eq!(code, 200);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert!(stats["Memory"]["Total"].as_u64().unwrap() > 0 && !stats["CPU"].as_array().unwrap().is_empty(), "{stats}");
    assert!(stats["AllocDirStats"]["Size"].as_u64().unwrap() > 0 && stats["Uptime"].as_u64().unwrap() > 0, "{stats}");
    let (code, _) = request("GET", &format!("http://{addr}/v1/client/stats?node_id=someone-else"), "").await;
    assert_eq!(code, 400);

    let done = server.place(&job("done", JobType::Batch, vec![sh_task("t", "echo hi")], restart_policy(0, 0)), client.node_id()).await;
    let live = server.place(&job("live", JobType::Service, vec![sh_task("t", "sleep 300")], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the live task runs", || task_pid(&client, &live, "t")).await;
    wait_until("the batch alloc finished", || client.alloc_runner(&done).is_some_and(|r| r.tasks_finished())).await;
    let done_dir = root.path().join("alloc").join(&done);
    assert!(done_dir.exists());

    let (code, body) = request("PUT", &format!("http://{addr}/v1/client/allocation/{live}/gc"), "").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("not terminal"), "{body}");
    let (code, _) = request("GET", &format!("http://{addr}/v1/client/allocation/nope/gc"), "").await;
    assert_eq!(code, 404);
    let (code, _) = request("GET", &format!("http://{addr}/v1/client/allocation/{done}/gc"), "").await;
    assert_eq!(code, 200);
    assert!(!done_dir.exists(), "the terminal alloc's dir is gone");
    // All terminal allocs: none left but the live one, which stays.
    let (code, _) = request("GET", &format!("http://{addr}/v1/client/gc"), "").await;
    assert_eq!(code, 200);
    assert!(Path::new(&root.path().join("alloc").join(&live)).exists());
    assert!(task_pid(&client, &live, "t").is_some());
    client.shutdown_destroying_allocs().await;
}
