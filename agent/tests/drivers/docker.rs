//! docker driver against the real Engine: run, ports, logs, exit codes, OOM, stop signal,
//! restore, removal behind our back, missing images, image GC, dangling containers, health,
//! commands in a container (script checks and `alloc exec`), the infra container of a group
//! network. Images are imported from a busybox rootfs (`scripts/make-busybox-rootfs`): no
//! registry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::CreateImageOptions;
use futures::StreamExt;
use nix::sys::signal::Signal;
use nomad_agent::client::driver::docker::{DockerDriver, DockerOptions, container, network, reaper};
use nomad_agent::client::driver::{
    CHECK_BUF_SIZE, Driver, DriverError, DriverState, ExecInput, ExecOutputChunk, ExecSession, Recovered, TaskConfig, TaskHandle,
};
use nomad_agent::client::network::NetnsMaker;
use nomad_agent::client::network::netns;
use nomad_testkit::Prereq;
use serde_json::json;

use crate::support::{log, task, wait_for_output, wait_until};

macro_rules! require_docker {
    () => {
        nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Docker, Prereq::Busybox);
    };
}

fn docker() -> Docker {
    Docker::connect_with_unix(&nomad_testkit::prereq::docker_socket().display().to_string(), 120, bollard::API_DEFAULT_VERSION).unwrap()
}

/// A busybox rootfs as a tar, with `extra` files added (to make an image of its own).
fn rootfs_tar(extra: &[(&str, &[u8])]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    let out = std::process::Command::new("bash").arg(script).arg(&rootfs).output().unwrap();
    assert!(out.status.success(), "make-busybox-rootfs: {}", String::from_utf8_lossy(&out.stderr));
    for (name, data) in extra {
        std::fs::write(rootfs.join(name), data).unwrap();
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", &rootfs).unwrap();
    builder.into_inner().unwrap()
}

async fn import(docker: &Docker, repo: &str, tag: &str, tar: Vec<u8>) {
    let options = CreateImageOptions { from_src: Some("-".into()), repo: Some(repo.into()), tag: Some(tag.into()), ..Default::default() };
    let mut progress = docker.create_image(Some(options), Some(bollard::body_full(tar.into())), None);
    while let Some(item) = progress.next().await {
        item.unwrap();
    }
}

/// The shared test image (see `nomad_testkit::docker`).
async fn busybox_image() -> &'static str {
    tokio::task::spawn_blocking(nomad_testkit::docker::busybox_image).await.unwrap()
}

/// Polls the async `f` until it returns `Some`, up to the testkit's deadline.
async fn wait_for_async<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let deadline = tokio::time::Instant::now() + nomad_testkit::wait::DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Options for tests: dangling reaping off (the reaper is tested by itself).
fn test_options() -> DockerOptions {
    DockerOptions {
        dangling_enabled: false,
        socket: nomad_testkit::prereq::docker_socket().display().to_string(),
        ..DockerOptions::default()
    }
}

fn driver(options: DockerOptions) -> Arc<DockerDriver> {
    Arc::new(DockerDriver::new(options))
}

fn container_id(handle: &TaskHandle) -> String {
    match &handle.driver_state {
        DriverState::Docker { container_id, .. } => container_id.clone(),
        other => panic!("not a docker handle: {other:?}"),
    }
}

/// Removes the task's container at the end of a test, whatever happened.
struct Cleanup(String);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

async fn docker_task(root: &Path, name: &str, config: serde_json::Value) -> (TaskConfig, Cleanup) {
    let mut config = config;
    config["image"] = json!(busybox_image().await);
    let t = task(root, name, config);
    let cleanup = Cleanup(container::container_name(&t));
    (t, cleanup)
}

#[tokio::test]
async fn a_container_runs_with_nomads_name_labels_dirs_env_and_its_exit_code_and_logs() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _cleanup) = docker_task(
        dir.path(),
        "web",
        json!({"command": "sh", "args": ["-c", "echo out-$NOMAD_ALLOC_ID; echo err-line >&2; echo shared > /alloc/f; ls /local /secrets >/dev/null && exit 3"]}),
    )
    .await;
    t.env.insert("NOMAD_ALLOC_ID".into(), t.alloc_id.clone());
    t.resources.cpu_mhz = 300;
    t.resources.memory_mib = 64;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    let exit = d.wait(&handle).await.unwrap();
    assert_eq!(exit.exit_code, 3);
    assert!(!exit.oom_killed);
    assert_eq!(log(&t, "stdout", 0), format!("out-{}\n", t.alloc_id));
    assert_eq!(log(&t, "stderr", 0), "err-line\n");
    assert_eq!(std::fs::read_to_string(t.shared_dir().join("f")).unwrap(), "shared\n");

    let c = docker().inspect_container(&container_id(&handle), None).await.unwrap();
    assert_eq!(c.name.unwrap(), format!("/web-{}", t.alloc_id));
    let labels = c.config.unwrap().labels.unwrap();
    assert_eq!(labels[container::ALLOC_ID_LABEL], t.alloc_id);
    let host = c.host_config.unwrap();
    assert_eq!(host.cpu_shares, Some(300));
    assert_eq!(host.memory, Some(64 * 1024 * 1024));
    d.destroy(&handle).await.unwrap();
    assert!(docker().inspect_container(&container_id(&handle), None).await.is_err(), "destroy removes the container");
}

#[tokio::test]
async fn a_mapped_port_is_reachable_on_the_host() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _cleanup) =
        docker_task(dir.path(), "httpd", json!({"command": "httpd", "args": ["-f", "-p", "8080", "-h", "/local"], "ports": ["http"]}))
            .await;
    std::fs::write(t.local_dir().join("index.html"), "hello from docker\n").unwrap();
    let host_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    t.env.insert("NOMAD_HOST_PORT_http".into(), host_port.to_string());
    t.env.insert("NOMAD_PORT_http".into(), "8080".into());
    t.env.insert("NOMAD_HOST_IP_http".into(), "127.0.0.1".into());
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    let body = wait_for_async("the mapped port answers", || async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", host_port)).await.ok()?;
        s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        out.contains("hello from docker").then_some(out)
    })
    .await;
    assert!(body.starts_with("HTTP/1.1 200") || body.starts_with("HTTP/1.0 200"), "{body}");
    d.destroy(&handle).await.unwrap();
}

#[tokio::test]
async fn an_oom_kill_is_reported() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _cleanup) =
        docker_task(dir.path(), "hog", json!({"command": "sh", "args": ["-c", "x=aaaaaaaa; while true; do x=$x$x; done"]})).await;
    t.resources.memory_mib = 10;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    let exit = d.wait(&handle).await.unwrap();
    assert!(exit.oom_killed, "{exit:?}");
    assert_eq!(exit.err.as_deref(), Some("OOM Killed"));
    d.destroy(&handle).await.unwrap();
}

#[tokio::test]
async fn stop_sends_the_kill_signal_first() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'echo got-USR1 > /alloc/signal; exit 0' USR1; echo ready; while true; do sleep 0.05; done";
    let (t, _cleanup) = docker_task(dir.path(), "trap", json!({"command": "sh", "args": ["-c", script]})).await;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    wait_for_output(&t, "ready").await;
    d.stop(&handle, Signal::SIGUSR1, Duration::from_secs(20)).await.unwrap();
    assert_eq!(std::fs::read_to_string(t.shared_dir().join("signal")).unwrap(), "got-USR1\n");
    assert_eq!(d.wait(&handle).await.unwrap().exit_code, 0, "it exited by its trap, not by SIGKILL");
    d.destroy(&handle).await.unwrap();
}

#[tokio::test]
async fn stop_kills_after_the_kill_timeout() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let script = "trap '' TERM; echo ready; while true; do sleep 0.05; done";
    let (t, _cleanup) = docker_task(dir.path(), "stubborn", json!({"command": "sh", "args": ["-c", script]})).await;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    wait_for_output(&t, "ready").await;
    let started = std::time::Instant::now();
    d.stop(&handle, Signal::SIGTERM, Duration::from_millis(500)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(d.wait(&handle).await.unwrap().exit_code, 137, "SIGKILLed");
    d.destroy(&handle).await.unwrap();
}

fn ticks(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix("tick-")?.parse().ok()).collect()
}

#[tokio::test]
async fn a_restarted_agent_reattaches_to_the_same_container_and_its_logs_resume_without_duplicates() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let script = "i=0; while [ ! -e /local/stop ]; do echo tick-$i; i=$((i+1)); sleep 0.02; done; exit 4";
    let (t, _cleanup) = docker_task(dir.path(), "ticker", json!({"command": "sh", "args": ["-c", script]})).await;
    let persisted = {
        let d = driver(test_options());
        let handle = d.start(&t).await.unwrap();
        wait_for_output(&t, "tick-5\n").await;
        d.shutdown().await;
        serde_json::to_string(&handle).unwrap()
    };
    let seen = *ticks(&log(&t, "stdout", 0)).last().unwrap();
    let handle: TaskHandle = serde_json::from_str(&persisted).unwrap();
    let d = driver(test_options());
    let Recovered::Running(recovered) = d.recover(&handle).await.unwrap() else { panic!("the container should still run") };
    assert_eq!(container_id(&recovered), container_id(&handle), "same container, not a new one");
    wait_until("the logs keep flowing", || ticks(&log(&t, "stdout", 0)).last().is_some_and(|n| *n > seen + 20)).await;
    std::fs::write(t.local_dir().join("stop"), "").unwrap();
    let exit = d.wait(&recovered).await.unwrap();
    assert_eq!(exit.exit_code, 4);
    let all = ticks(&log(&t, "stdout", 0));
    let expected: Vec<u64> = (0..all.len() as u64).collect();
    assert_eq!(all, expected, "every line once, in order, across the restart");
    let started = docker().inspect_container(&container_id(&handle), None).await.unwrap().restart_count;
    assert_eq!(started, Some(0));
    d.destroy(&recovered).await.unwrap();
}

#[tokio::test]
async fn a_container_that_exited_while_the_agent_was_away_reports_its_real_exit() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let script = "echo before; while [ ! -e /local/stop ]; do sleep 0.02; done; echo after; exit 7";
    let (t, _cleanup) = docker_task(dir.path(), "short", json!({"command": "sh", "args": ["-c", script]})).await;
    let persisted = {
        let d = driver(test_options());
        let handle = d.start(&t).await.unwrap();
        wait_for_output(&t, "before").await;
        d.shutdown().await;
        serde_json::to_string(&handle).unwrap()
    };
    std::fs::write(t.local_dir().join("stop"), "").unwrap();
    let handle: TaskHandle = serde_json::from_str(&persisted).unwrap();
    let id = container_id(&handle);
    let docker = docker();
    wait_for_async("the container exits", || {
        let docker = docker.clone();
        let id = id.clone();
        async move { (!docker.inspect_container(&id, None).await.ok()?.state?.running?).then_some(()) }
    })
    .await;
    let d = driver(test_options());
    match d.recover(&handle).await.unwrap() {
        Recovered::Exited(exit) => assert_eq!(exit.exit_code, 7),
        Recovered::Running(_) => panic!("it exited"),
    }
    assert_eq!(log(&t, "stdout", 0), "before\nafter\n", "what it wrote while nobody followed is collected, once");
    d.destroy(&handle).await.unwrap();
}

#[tokio::test]
async fn a_container_removed_behind_our_back_is_reported_failed() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (t, _cleanup) = docker_task(dir.path(), "victim", json!({"command": "sleep", "args": ["600"]})).await;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    let persisted = serde_json::to_string(&handle).unwrap();
    d.shutdown().await;
    container::remove(&docker(), &container_id(&handle)).await.unwrap();
    let handle: TaskHandle = serde_json::from_str(&persisted).unwrap();
    let err = driver(test_options()).recover(&handle).await.unwrap_err();
    assert!(err.to_string().contains("removed outside Nomad"), "{err}");

    // And while the agent waits on it.
    let (t2, _cleanup2) = docker_task(dir.path(), "victim2", json!({"command": "sleep", "args": ["600"]})).await;
    let handle = d.start(&t2).await.unwrap();
    let waiting = {
        let d = d.clone();
        let handle = handle.clone();
        tokio::spawn(async move { d.wait(&handle).await })
    };
    container::remove(&docker(), &container_id(&handle)).await.unwrap();
    let exit = waiting.await.unwrap().unwrap();
    assert!(!exit.successful());
    // `docker rm -f` kills before it removes, so the wait sees an exit first: the removal is
    // still what the exit says.
    assert!(exit.err.as_deref().is_some_and(|e| e.contains("removed outside Nomad")), "{exit:?}");
}

#[tokio::test]
async fn a_missing_image_fails_the_start_clearly() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let t = task(dir.path(), "ghost", json!({"image": "nomad-rs-test/does-not-exist:1.0", "command": "true"}));
    let err = driver(test_options()).start(&t).await.unwrap_err();
    assert!(matches!(err, DriverError::ImageUnavailable(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("Failed to pull `nomad-rs-test/does-not-exist:1.0`: image not found locally and no registry reachable"),
        "{message}"
    );
}

#[tokio::test]
async fn privileged_is_refused_unless_the_plugin_allows_it() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (t, _cleanup) = docker_task(dir.path(), "priv", json!({"command": "true", "privileged": true})).await;
    let err = driver(test_options()).start(&t).await.unwrap_err();
    assert!(err.to_string().contains("privileged mode is disabled"), "{err}");
}

#[tokio::test]
async fn an_image_is_removed_image_delay_after_its_last_task() {
    require_docker!();
    let docker = docker();
    let unique = uuid::Uuid::new_v4().to_string();
    let repo = "nomad-rs-test/gc";
    import(&docker, repo, &unique, rootfs_tar(&[("unique", unique.as_bytes())])).await;
    let image = format!("{repo}:{unique}");
    let image_id = docker.inspect_image(&image).await.unwrap().id.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let t = task(dir.path(), "gc", json!({"image": image, "command": "true"}));
    let _cleanup = Cleanup(container::container_name(&t));
    let mut options = test_options();
    options.image_delay = Duration::from_millis(300);
    let d = driver(options);
    let handle = d.start(&t).await.unwrap();
    assert_eq!(d.images().users(&image_id), 1);
    d.wait(&handle).await.unwrap();
    assert!(docker.inspect_image(&image).await.is_ok(), "kept while a task holds it");
    d.destroy(&handle).await.unwrap();
    wait_for_async("the image is removed", || {
        let docker = docker.clone();
        let image = image.clone();
        async move { docker.inspect_image(&image).await.is_err().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_dangling_container_of_this_agent_is_reaped_and_a_tracked_one_is_kept() {
    require_docker!();
    let docker = docker();
    let image = busybox_image().await;
    let root = format!("/nonexistent/{}", uuid::Uuid::new_v4());
    let mut ids = Vec::new();
    let mut cleanups = Vec::new();
    for n in 0..2 {
        let name = format!("dangling{n}-{}", uuid::Uuid::new_v4());
        cleanups.push(Cleanup(name.clone()));
        let labels = HashMap::from([
            (container::ALLOC_ID_LABEL.to_string(), uuid::Uuid::new_v4().to_string()),
            (container::ALLOC_ROOT_LABEL.to_string(), root.clone()),
        ]);
        let body = bollard::models::ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(vec!["sleep".into(), "600".into()]),
            labels: Some(labels),
            ..Default::default()
        };
        let (id, _) = container::create(&docker, &name, body).await.unwrap();
        docker.start_container(&id, None).await.unwrap();
        ids.push(id);
    }
    let scope = reaper::Scope {
        alloc_root: root.clone(),
        tracked: Arc::new(std::sync::Mutex::new([ids[1].clone()].into_iter().collect())),
        netns_dir: PathBuf::from("/nonexistent"),
    };
    let reaped = reaper::reap_once(&docker, &scope, Duration::ZERO, false).await.unwrap();
    assert_eq!(reaped, vec![ids[0].clone()]);
    assert!(docker.inspect_container(&ids[0], None).await.is_err());
    assert!(docker.inspect_container(&ids[1], None).await.is_ok());
    // Another agent's alloc root: not ours to reap.
    let other = reaper::Scope { alloc_root: "/some/other/root".into(), tracked: Arc::default(), netns_dir: PathBuf::from("/nonexistent") };
    let none = reaper::reap_once(&docker, &other, Duration::ZERO, false).await.unwrap();
    assert!(!none.contains(&ids[1]));
}

/// A unix socket forwarding to the Engine that the test can take away and bring back.
struct EngineProxy {
    path: PathBuf,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl EngineProxy {
    fn start(path: &Path) -> EngineProxy {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let engine = nomad_testkit::prereq::docker_socket();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let engine = engine.clone();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::UnixStream::connect(engine).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        EngineProxy { path: path.to_path_buf(), task: Some(task) }
    }

    fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test]
async fn the_fingerprint_is_undetected_without_an_engine_and_goes_unhealthy_and_back() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("engine.sock");
    let mut options = test_options();
    options.socket = socket.display().to_string();
    options.allow_privileged = true;

    let none = driver(options.clone()).fingerprint().await;
    assert!(!none.detected && !none.healthy, "no Engine: undetected, not an error: {none:?}");

    let mut proxy = EngineProxy::start(&socket);
    let d = driver(options);
    let up = d.fingerprint().await;
    assert!(up.detected && up.healthy, "{up:?}");
    assert_eq!(up.attributes["driver.docker"], "1");
    assert!(up.attributes["driver.docker.version"].starts_with(|c: char| c.is_ascii_digit()));
    assert!(up.attributes["driver.docker.runtimes"].contains("runc"));
    assert!(up.attributes["driver.docker.bridge_ip"].parse::<std::net::IpAddr>().is_ok(), "{:?}", up.attributes);
    assert_eq!(up.attributes["driver.docker.privileged.enabled"], "true");
    assert!(!up.attributes.contains_key("driver.docker.volumes.enabled"));

    proxy.stop();
    let down = d.fingerprint().await;
    assert!(down.detected && !down.healthy, "{down:?}");
    assert!(down.health_description.starts_with("Failed to connect to docker daemon"));

    let mut proxy = EngineProxy::start(&socket);
    let back = d.fingerprint().await;
    assert!(back.detected && back.healthy, "{back:?}");
    proxy.stop();
}

/// Runs `sh -c script` in the task with a 20 s timeout; its exit code and output.
async fn sh(d: &DockerDriver, handle: &TaskHandle, script: &str) -> (i32, String) {
    let out = d.exec_task(handle, "/bin/sh", &["-c".to_string(), script.to_string()], Duration::from_secs(20)).await.unwrap();
    (out.exit_code, String::from_utf8_lossy(&out.output).into_owned())
}

/// Waits until no process in the task's container has `needle` in its command line.
async fn wait_gone(d: &DockerDriver, handle: &TaskHandle, needle: &str) {
    let script = format!("ps -o args | grep -v grep | grep -c '{needle}' || true");
    let mut last = String::new();
    let gone = tokio::time::timeout(nomad_testkit::wait::DEADLINE, async {
        loop {
            last = sh(d, handle, &script).await.1;
            if last.trim() == "0" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "{needle:?} still runs in the container: {last}");
}

#[tokio::test]
async fn exec_task_runs_in_the_container_keeps_the_tail_and_kills_at_the_timeout() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _cleanup) =
        docker_task(dir.path(), "checked", json!({"command": "sh", "args": ["-c", "echo ready; sleep 600; echo never"]})).await;
    t.env.insert("TASK_VAR".into(), "from-task".into());
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    wait_for_output(&t, "ready").await;

    // In the container: its PID 1 is the task, its environment the task's; stderr is kept.
    let (code, text) = sh(&d, &handle, "echo pid1=$(cat /proc/1/cmdline | tr '\\0' ' '); echo var=$TASK_VAR; echo err >&2; exit 3").await;
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("pid1=sh -c echo ready; sleep 600; echo never"), "{text}");
    assert!(text.contains("var=from-task\n") && text.contains("err\n"), "{text}");

    // The last 4 KiB only.
    let (code, text) = sh(&d, &handle, "head -c 10000 /dev/zero | tr '\\0' a; echo; echo tail").await;
    assert_eq!((code, text.len()), (0, CHECK_BUF_SIZE));
    assert!(text.ends_with("a\ntail\n"), "{:?}", &text[text.len() - 20..]);

    // A command the container does not have: the Engine's exit code for it.
    let out = d.exec_task(&handle, "no-such-command", &[], Duration::from_secs(20)).await.unwrap();
    assert!(matches!(out.exit_code, 126 | 127), "{out:?}");

    // Past the timeout the command is killed, children included.
    let err = d.exec_task(&handle, "/bin/sh", &["-c".into(), "sleep 31 & sleep 32".into()], Duration::from_millis(500)).await.unwrap_err();
    assert!(matches!(err, DriverError::ExecTimedOut(_)), "{err}");
    wait_gone(&d, &handle, "sleep 3[12]").await;

    d.stop(&handle, Signal::SIGKILL, Duration::from_secs(5)).await.unwrap();
    d.wait(&handle).await.unwrap();
    let err = d.exec_task(&handle, "true", &[], Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("task \"checked\" is not running"), "{err}");
    d.destroy(&handle).await.unwrap();
}

/// What a session wrote until `done` holds of it (stdout, stderr, closed markers seen).
async fn read_session(s: &mut ExecSession, done: impl Fn(&str, &str, usize) -> bool) -> (String, String, usize) {
    let (mut out, mut err, mut closed) = (String::new(), String::new(), 0);
    let read = tokio::time::timeout(nomad_testkit::wait::DEADLINE, async {
        while !done(&out, &err, closed) {
            match s.output.recv().await {
                Some(ExecOutputChunk::Stdout(d)) => out.push_str(&String::from_utf8_lossy(&d)),
                Some(ExecOutputChunk::Stderr(d)) => err.push_str(&String::from_utf8_lossy(&d)),
                Some(ExecOutputChunk::StdoutClosed | ExecOutputChunk::StderrClosed) => closed += 1,
                None => return,
            }
        }
    })
    .await;
    assert!(read.is_ok() && done(&out, &err, closed), "stdout {out:?} stderr {err:?} closed {closed}");
    (out, err, closed)
}

async fn exit_of(s: &mut ExecSession) -> i32 {
    tokio::time::timeout(nomad_testkit::wait::DEADLINE, &mut s.exit).await.unwrap().unwrap().unwrap()
}

#[tokio::test]
async fn exec_streaming_attaches_stdin_and_a_tty_that_follows_resizes_and_ends_with_its_session() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (t, _cleanup) = docker_task(dir.path(), "shell", json!({"command": "sleep", "args": ["600"]})).await;
    let d = driver(test_options());
    let handle = d.start(&t).await.unwrap();
    let args = |script: &str| vec!["-c".to_string(), script.to_string()];

    // Pipes: stdin in, stdout and stderr apart, both ends marked, then the exit code.
    let mut s = d.exec_streaming(&handle, "/bin/sh", &args("read x; echo got-$x; echo oops >&2; exit 3"), false, None).await.unwrap();
    s.input.send(ExecInput::Stdin(b"hello\n".to_vec())).await.unwrap();
    let (out, err, _) = read_session(&mut s, |_, _, closed| closed == 2).await;
    assert_eq!((out.as_str(), err.as_str()), ("got-hello\n", "oops\n"));
    assert_eq!(exit_of(&mut s).await, 3);

    // The end of stdin reaches the command.
    let mut s = d.exec_streaming(&handle, "/bin/cat", &[], false, None).await.unwrap();
    s.input.send(ExecInput::Stdin(b"abc".to_vec())).await.unwrap();
    s.input.send(ExecInput::CloseStdin).await.unwrap();
    let (out, _, _) = read_session(&mut s, |_, _, closed| closed == 2).await;
    assert_eq!((out.as_str(), exit_of(&mut s).await), ("abc", 0));

    // A terminal of the size asked, resized in order with the input.
    let script = "tty -s && echo on-a-tty; read x; stty size; read y; stty size; exit 4";
    let mut s = d.exec_streaming(&handle, "/bin/sh", &args(script), true, Some((24, 80))).await.unwrap();
    read_session(&mut s, |out, _, _| out.contains("on-a-tty")).await;
    s.input.send(ExecInput::Stdin(b"a\r".to_vec())).await.unwrap();
    read_session(&mut s, |out, _, _| out.contains("24 80")).await;
    s.input.send(ExecInput::Resize { height: 50, width: 132 }).await.unwrap();
    s.input.send(ExecInput::Stdin(b"b\r".to_vec())).await.unwrap();
    read_session(&mut s, |out, _, _| out.contains("50 132")).await;
    assert_eq!(exit_of(&mut s).await, 4);

    // A session dropped while its command runs takes the command with it.
    let mut s = d.exec_streaming(&handle, "/bin/sh", &args("echo started; sleep 33"), false, None).await.unwrap();
    read_session(&mut s, |out, _, _| out.contains("started")).await;
    drop(s);
    wait_gone(&d, &handle, "sleep 33").await;

    // Dropped at once, while the Engine has not yet recorded the command's PID (it reports
    // the exec running with PID 0 for a while after the command started).
    let s = d.exec_streaming(&handle, "/bin/sh", &args("sleep 34"), false, None).await.unwrap();
    drop(s);
    wait_gone(&d, &handle, "sleep 34").await;
    d.destroy(&handle).await.unwrap();
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// An alloc of a group with a docker task, as the network manager hands it to the maker.
fn docker_group_alloc(alloc_id: &str) -> nomad_proto::Allocation {
    use nomad_proto::{Job, Task, TaskGroup};
    let task = Task { name: "web".into(), driver: "docker".into(), ..Task::default() };
    let job = Job { task_groups: vec![TaskGroup { name: "g".into(), tasks: vec![task], ..TaskGroup::default() }], ..Job::default() };
    nomad_proto::Allocation { id: alloc_id.into(), task_group: "g".into(), job: Some(Arc::new(job)), ..Default::default() }
}

async fn pause_options() -> DockerOptions {
    let pause = tokio::task::spawn_blocking(nomad_testkit::docker::pause_image).await.unwrap();
    DockerOptions { infra_image: pause.to_string(), ..test_options() }
}

/// A group network with a docker task is one infra container: made once (found again, not
/// made twice), its namespace the one the task's container joins, removed with the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_network_is_one_infra_container_that_the_docker_task_joins() {
    require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let (mut t, _cleanup) = docker_task(dir.path(), "web", json!({"command": "sleep", "args": ["600"]})).await;
    let _infra_cleanup = Cleanup(network::infra_name(&t.alloc_id));
    let d = driver(pause_options().await);
    let alloc = docker_group_alloc(&t.alloc_id);
    let maker = network::InfraContainers(d.clone());
    assert!(maker.makes(&alloc));

    let (sandbox, new) = maker.create(&alloc).unwrap();
    assert!(new && netns::is_netns(&sandbox), "{sandbox:?}");
    let (again, new) = maker.create(&alloc).unwrap();
    assert_eq!((again.as_path(), new), (sandbox.as_path(), false), "the running one is found, not made again");
    let infra = docker().inspect_container(&network::infra_name(&t.alloc_id), None).await.unwrap();
    let infra_id = infra.id.unwrap();
    assert_eq!(infra.config.unwrap().labels.unwrap()[container::ALLOC_ID_LABEL], t.alloc_id);
    let host = infra.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));

    t.netns = Some(PathBuf::from("/var/run/netns").join(&t.alloc_id));
    let handle = d.start(&t).await.unwrap();
    let task_netns = PathBuf::from(format!("/proc/{}/ns/net", handle.task.pid));
    assert_eq!(inode(&task_netns), inode(&sandbox), "the task's container is in the infra container's namespace");
    let c = docker().inspect_container(&container_id(&handle), None).await.unwrap();
    assert_eq!(c.host_config.unwrap().network_mode, Some(format!("container:{infra_id}")));
    d.destroy(&handle).await.unwrap();

    maker.destroy(&t.alloc_id).unwrap();
    assert!(docker().inspect_container(&infra_id, None).await.is_err(), "the infra container is removed");
    maker.destroy(&t.alloc_id).unwrap();
    let err = d.start(&t).await.unwrap_err();
    assert!(err.to_string().contains(&format!("the alloc's infra container nomad_init_{} is not running", t.alloc_id)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_infra_image_fails_the_network_naming_it() {
    require_docker!();
    let options = DockerOptions { infra_image: "nomad-rs-test/no-such-pause:3.1".into(), ..test_options() };
    let maker = network::InfraContainers(driver(options));
    let alloc = docker_group_alloc(&uuid::Uuid::new_v4().to_string());
    let err = maker.create(&alloc).unwrap_err();
    assert!(
        err.starts_with("Failed to pull `nomad-rs-test/no-such-pause:3.1`: image not found locally and no registry reachable"),
        "{err}"
    );
    assert!(docker().inspect_container(&network::infra_name(&alloc.id), None).await.is_err(), "no container is left");
}

/// Outside a multi-threaded runtime the maker runs its Engine calls on a runtime of its own.
#[test]
fn the_infra_maker_works_from_plain_blocking_code() {
    require_docker!();
    let maker = network::InfraContainers(driver(test_options()));
    maker.destroy(&uuid::Uuid::new_v4().to_string()).unwrap();
}

/// A restarted agent does not track the infra containers of its running allocs: the reaper keeps
/// one while its alloc's namespace is mounted, and removes it once that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infra_container_is_kept_while_its_alloc_network_is_mounted_and_reaped_after() {
    require_docker!();
    let root = format!("/nonexistent/{}", uuid::Uuid::new_v4());
    let d = driver(DockerOptions { alloc_root: Some(PathBuf::from(&root)), ..pause_options().await });
    let alloc_id = uuid::Uuid::new_v4().to_string();
    let _cleanup = Cleanup(network::infra_name(&alloc_id));
    let docker = docker();
    let (sandbox, _) = d.create_network(&docker, &alloc_id).await.unwrap();
    let netns_dir = tempfile::tempdir().unwrap();
    let mounted = netns_dir.path().join(&alloc_id);
    netns::bind(&sandbox, &mounted).unwrap();
    let scope = reaper::Scope { alloc_root: root, tracked: Arc::default(), netns_dir: netns_dir.path().to_path_buf() };
    let reaped = reaper::reap_once(&docker, &scope, Duration::ZERO, false).await.unwrap();
    assert_eq!(reaped, Vec::<String>::new(), "its alloc's namespace is mounted");
    netns::remove(&mounted).unwrap();
    let reaped = reaper::reap_once(&docker, &scope, Duration::ZERO, false).await.unwrap();
    assert_eq!(reaped.len(), 1, "orphaned");
    assert!(docker.inspect_container(&network::infra_name(&alloc_id), None).await.is_err());
}
