//! The `artifact` block end to end: a local HTTP server on 127.0.0.1:0, a real client, raw_exec
//! tasks that read what the artifacts hook put in their dirs.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;

use nomad_proto::job::{JobType, TaskArtifact};

use crate::support::{TestServer, event_types, job, log_file, restart_policy, sh_task, start_client, wait_for, wait_ready};

/// What a path answers: a body, after `fail_first` requests answered 500.
#[derive(Clone)]
struct Route {
    body: Vec<u8>,
    fail_first: u64,
}

/// Serves `routes` on 127.0.0.1:0; returns its base URL and a request count per path.
async fn serve(routes: BTreeMap<&'static str, Route>) -> (String, Arc<std::sync::Mutex<BTreeMap<String, u64>>>) {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let hits = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let routes = Arc::new(routes);
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else { return };
            let (routes, counter) = (routes.clone(), counter.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let path = req.uri().path().to_string();
                    let n = {
                        let mut hits = counter.lock().unwrap();
                        let n = hits.entry(path.clone()).or_insert(0u64);
                        *n += 1;
                        *n
                    };
                    let (status, body) = match routes.get(path.as_str()) {
                        Some(r) if n > r.fail_first => (200, r.body.clone()),
                        Some(_) => (500, b"try later".to_vec()),
                        None => (404, b"not found".to_vec()),
                    };
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder().status(status).body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(conn), svc).await;
            });
        }
    });
    (base, hits)
}

fn ok(body: &[u8]) -> Route {
    Route { body: body.to_vec(), fail_first: 0 }
}

fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

fn zip(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in files {
        z.start_file(*name, zip::write::SimpleFileOptions::default()).unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap().into_inner()
}

fn artifact(source: String) -> TaskArtifact {
    TaskArtifact { getter_source: source, ..TaskArtifact::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_land_in_local_archives_are_unpacked_and_file_mode_names_the_destination() {
    let (base, _) = serve(BTreeMap::from([
        ("/hello.txt", ok(b"plain file\n")),
        ("/app.tar.gz", ok(&tar_gz(&[("bin/run", b"from the tarball\n")]))),
        ("/site.zip", ok(&zip(&[("html/index.html", b"from the zip\n")]))),
        ("/releases/download", ok(b"named by destination\n")),
    ]))
    .await;
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let mut task = sh_task(
        "t",
        "cd \"$NOMAD_TASK_DIR\" && cat hello.txt bin/run site/html/index.html tools/tool && test ! -e ../tmp/.nomad-rs-artifact-*",
    );
    let mut tool = artifact(format!("{base}/releases/download"));
    tool.getter_mode = "file".into();
    tool.relative_dest = "local/tools/tool".into();
    let mut site = artifact(format!("{base}/site.zip"));
    site.relative_dest = "local/site".into();
    task.artifacts = vec![artifact(format!("{base}/hello.txt")), artifact(format!("{base}/app.tar.gz")), site, tool];
    let id = server.place(&job("artifacts", JobType::Batch, vec![task], restart_policy(0, 0)), client.node_id()).await;

    let state = wait_for("the task ran", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    let stdout = log_file(root.path(), &id, "t", "stdout");
    assert!(
        !state.failed,
        "{:?} {stdout} {}",
        state.events.iter().map(|e| &e.display_message).collect::<Vec<_>>(),
        log_file(root.path(), &id, "t", "stderr")
    );
    assert_eq!(stdout, "plain file\nfrom the tarball\nfrom the zip\nnamed by destination\n");
    let types = event_types(&state);
    let downloading = types.iter().position(|t| t == "Downloading Artifacts").expect("a Downloading Artifacts event");
    assert!(downloading < types.iter().position(|t| t == "Started").unwrap(), "{types:?}");
    let local = root.path().join("alloc").join(&id).join("t/local");
    assert!(!local.join("app.tar.gz").exists() && !local.join("site.zip").exists(), "archives are unpacked, not kept");
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checksum_mismatch_fails_the_task_with_the_download_event_and_leaves_no_file() {
    let (base, hits) = serve(BTreeMap::from([("/data.bin", ok(b"the real bytes"))])).await;
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let mut task = sh_task("t", "echo should not run");
    let mut a = artifact(format!("{base}/data.bin"));
    a.getter_options.insert("checksum".into(), format!("sha256:{}", "0".repeat(64)));
    task.artifacts = vec![a];
    let id = server.place(&job("bad-sum", JobType::Batch, vec![task], restart_policy(1, 10)), client.node_id()).await;

    let state = wait_for("the task failed", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    assert!(state.failed);
    let types = event_types(&state);
    assert!(!types.contains(&"Started".to_string()), "{types:?}");
    assert_eq!(types.last().map(String::as_str), Some("Not Restarting"), "{types:?}");
    let failed = state.events.iter().find(|e| e.event_type == "Failed Artifact Download").expect("a Failed Artifact Download event");
    let want = format!(
        "failed to download artifact \"{base}/data.bin\": Checksums did not match for local/data.bin.\nExpected: {}",
        "0".repeat(64)
    );
    assert!(failed.download_error.starts_with(&want), "{}", failed.download_error);
    assert_eq!(failed.display_message, failed.download_error);
    assert_eq!(failed.details["download_error"], failed.download_error);
    assert_eq!(hits.lock().unwrap()["/data.bin"], 2, "tried once, retried once by the restart policy");
    let task_dir = root.path().join("alloc").join(&id).join("t");
    assert!(!task_dir.join("local/data.bin").exists(), "no partial file");
    assert_eq!(std::fs::read_dir(task_dir.join("tmp")).unwrap().count(), 0, "no temp file left");
    client.shutdown_destroying_allocs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_that_fails_at_first_is_retried_by_the_restart_policy_and_the_task_runs() {
    let (base, hits) =
        serve(BTreeMap::from([("/stable.txt", ok(b"stable\n")), ("/flaky.txt", Route { body: b"flaky\n".to_vec(), fail_first: 1 })])).await;
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let mut task = sh_task("t", "cat \"$NOMAD_TASK_DIR/stable.txt\" \"$NOMAD_TASK_DIR/flaky.txt\"");
    task.artifacts = vec![artifact(format!("{base}/stable.txt")), artifact(format!("{base}/flaky.txt"))];
    let id = server.place(&job("flaky", JobType::Batch, vec![task], restart_policy(2, 10)), client.node_id()).await;

    let state = wait_for("the task ran", || server.task_state(&id, "t").filter(|s| s.state == "dead")).await;
    let types = event_types(&state);
    assert!(!state.failed, "{types:?}");
    let failed = state.events.iter().find(|e| e.event_type == "Failed Artifact Download").expect("the first try failed");
    assert!(failed.download_error.ends_with("flaky.txt\": bad response code: 500"), "{}", failed.download_error);
    let (f, r, s) = (
        types.iter().position(|t| t == "Failed Artifact Download").unwrap(),
        types.iter().position(|t| t == "Restarting").expect("a restart"),
        types.iter().position(|t| t == "Started").unwrap(),
    );
    assert!(f < r && r < s, "{types:?}");
    assert_eq!(log_file(root.path(), &id, "t", "stdout"), "stable\nflaky\n");
    let hits = hits.lock().unwrap().clone();
    assert_eq!(hits["/flaky.txt"], 2);
    assert_eq!(hits["/stable.txt"], 1, "the finished artifact is not fetched again on the retry");
    client.shutdown_destroying_allocs().await;
}
