//! A task's files never reach the host (design decision 13): what a task plants in its alloc
//! dir is never followed by the agent, which works there as root.
//!
//! The attacks as they were reproduced: an `exec` task running as `nobody` replaced its log
//! files with symlinks to a root-only file, and `/v1/client/fs/logs` returned that file while
//! log rotation appended the task's output to it; a task named `..` made its task dir the
//! node's alloc root (chmodded 0777), which stayed after the alloc was gone.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use nomad_agent::client::Client;
use nomad_agent::client::http::{ClientHttp, router};
use nomad_proto::job::JobType;
use nomad_proto::{ClientStatus, Task};

use crate::support::{TestServer, job, log_file, restart_policy, sh_task, start_client, wait_for, wait_ready};

/// What the victim holds: a stand-in for `/etc/shadow`.
const SECRET: &[u8] = b"root:$6$not-for-tasks$0123456789:19000:0:99999:7:::\n";

async fn serve(client: &Client) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = router(ClientHttp { client: Some(client.clone()), locator: None, own_addr: addr.clone() });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn get(url: &str) -> (u16, Vec<u8>) {
    let http = HttpClient::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = http.request(hyper::Request::get(url).body(Full::new(Bytes::new())).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

/// As root: the exec driver, running the task as `nobody` (the reproduced attack). Otherwise
/// raw_exec, running as the test's user, which still cannot be allowed to reach the victim
/// through the agent.
fn attacker_task(name: &str, script: &str) -> Task {
    let mut task = sh_task(name, script);
    if nix::unistd::geteuid().is_root() {
        task.driver = "exec".into();
        task.user = "nobody".into();
    } else {
        eprintln!("not root: running the attacker with raw_exec instead of exec as nobody");
    }
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_a_task_plants_in_alloc_logs_are_neither_read_nor_written_through() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    // The victim: root-only, 0600, outside the alloc dir (the test's own `/etc/shadow`).
    let victim = root.path().join("shadow");
    std::fs::write(&victim, SECRET).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let addr = serve(&client).await;

    // The task swaps its current stdout log for a link to the victim (for the logs route), plants
    // one at the index rotation opens next, then writes past the 1 MiB rotation size.
    let script = format!(
        "L=\"$NOMAD_ALLOC_DIR/logs\"; \
         ln -s {victim} \"$L/web.stdout.1\" && rm -f \"$L/web.stdout.0\" && ln -s {victim} \"$L/web.stdout.0\" && echo planted >&2; \
         head -c 1500000 /dev/zero | tr '\\0' x; echo wrote >&2; sleep 60",
        victim = victim.display()
    );
    let mut task = attacker_task("web", &script);
    task.log_config.max_files = 3;
    task.log_config.max_file_size_mb = 1;
    let id = server.place(&job("escape", JobType::Service, vec![task], restart_policy(0, 0)), client.node_id()).await;
    wait_for("the task planted its links and wrote its output", || {
        let stderr = log_file(root.path(), &id, "web", "stderr");
        stderr.contains("wrote").then_some(()).or_else(|| {
            assert!(!stderr.contains("No such file") && !stderr.contains("denied"), "the task could not plant: {stderr}");
            None
        })
    })
    .await;
    assert!(log_file(root.path(), &id, "web", "stderr").contains("planted"));

    let logs = format!("http://{addr}/v1/client/fs/logs/{id}?task=web&type=stdout");
    for query in ["&plain=true", "", "&plain=true&origin=end&offset=100"] {
        let (code, body) = get(&format!("{logs}{query}")).await;
        assert_eq!(code, 200, "{query}");
        let leaked = body.windows(12).any(|w| w == &SECRET[..12]) || String::from_utf8_lossy(&body).contains("cm9vdDok");
        let head = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        assert!(!leaked, "the logs route returned the victim ({query}): {head}");
    }
    assert_eq!(std::fs::read(&victim).unwrap(), SECRET, "rotation wrote nothing into the victim");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777, 0o600);
    // Both links are still the task's own links, not replaced by (or turned into) anything else.
    let logs_dir = root.path().join("alloc").join(&id).join("alloc/logs");
    for n in ["web.stdout.0", "web.stdout.1"] {
        assert!(std::fs::symlink_metadata(logs_dir.join(n)).unwrap().file_type().is_symlink(), "{n}");
    }
    // Purge: the links go with the alloc dir; the victim stays.
    client.shutdown_destroying_allocs().await;
    assert!(!root.path().join("alloc").join(&id).exists());
    assert_eq!(std::fs::read(&victim).unwrap(), SECRET);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_named_dot_dot_is_refused_without_touching_the_alloc_root() {
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;
    let alloc_root = root.path().join("alloc");
    let marker = alloc_root.join("another-alloc");
    std::fs::create_dir_all(&marker).unwrap();
    let mode_before = std::fs::metadata(&alloc_root).unwrap().permissions().mode();

    // Placed straight through the state, as a server without the admission rule would.
    let tasks = vec![sh_task("..", "echo escaped"), sh_task("web", "touch \"$NOMAD_ALLOC_DIR/web-ran\"; sleep 30")];
    let id = server.place(&job("dotdot", JobType::Service, tasks, restart_policy(3, 10)), client.node_id()).await;

    let state = wait_for("the task is refused", || server.task_state(&id, "..").filter(|s| s.state == "dead")).await;
    assert!(state.failed);
    let event = state.events.iter().find(|e| e.event_type == "Failed Validation").expect("a Failed Validation event");
    assert!(event.display_message.contains("task name \"..\""), "{}", event.display_message);
    assert_eq!(state.restarts, 0, "never retried");
    let sibling = wait_for("the sibling is refused too", || server.task_state(&id, "web").filter(|s| s.state == "dead")).await;
    assert!(sibling.failed && sibling.started_at.is_zero(), "{sibling:?}");
    let alloc = wait_for("the alloc failed", || server.alloc(&id).filter(|a| a.client_status == ClientStatus::Failed)).await;
    assert!(alloc.client_description.contains("task name \"..\""), "{}", alloc.client_description);

    let alloc_root_untouched = |when: &str| {
        assert_eq!(std::fs::metadata(&alloc_root).unwrap().permissions().mode(), mode_before, "{when}: alloc root not chmodded");
        for d in ["local", "secrets", "tmp", "alloc"] {
            assert!(!alloc_root.join(d).exists(), "{when}: {d} made in the alloc root");
        }
        assert!(marker.is_dir(), "{when}: another alloc's dir is still there");
    };
    alloc_root_untouched("refused");
    assert!(!alloc_root.join(&id).exists(), "nothing was made for the refused alloc");
    client.shutdown_destroying_allocs().await;
    alloc_root_untouched("after purge");
    assert!(Path::new(&alloc_root).is_dir());
}
