//! oci driver: busybox containers run by runc, limits, stop escalation, OCI image layouts.
//! Needs root, runc and busybox-static (scripts/install-deps installs them): without them each
//! test is skipped loudly, or fails under CI (`nomad_testkit::prereq`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{log, options, task, wait_for_output};
use nix::sys::signal::Signal;
use nomad_agent::client::driver::{Driver, DriverError, DriverOptions, DriverRegistry, DriverState, TaskHandle};
use serde_json::json;
use sha2::{Digest, Sha256};

const BUSYBOX: &str = "/bin/busybox";
const APPLETS: [&str; 10] = ["sh", "echo", "cat", "sleep", "id", "ls", "test", "hostname", "env", "true"];

/// Containers need root, runc and a static busybox to copy into the rootfs.
macro_rules! require_oci_host {
    () => {
        nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Root, nomad_testkit::Prereq::Runc, nomad_testkit::Prereq::Busybox);
    };
}

/// Options with runc's state kept inside the test's temp dir.
fn oci_options(root: &Path) -> DriverOptions {
    let mut options = options(false);
    options.oci.runtime_root = root.join("runc-state");
    options
}

fn oci_driver(options: &DriverOptions) -> Arc<dyn Driver> {
    DriverRegistry::new(options).get("oci").unwrap()
}

/// A minimal rootfs: static busybox with applet symlinks and an /etc/passwd.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    for sub in ["bin", "etc", "proc", "dev", "sys", "tmp"] {
        fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n").unwrap();
    rootfs
}

fn container_id(handle: &TaskHandle) -> String {
    match &handle.driver_state {
        DriverState::Oci { container_id, .. } => container_id.clone(),
        other => panic!("not an oci handle: {other:?}"),
    }
}

#[tokio::test]
async fn a_busybox_container_prints_to_its_log() {
    require_oci_host!();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(dir.path());
    let script = "echo hello-from-oci; echo uid=$(id -u); test -d /local && test -d /alloc && echo dirs-mounted";
    let task = task(dir.path(), "web", json!({"image": rootfs, "command": "/bin/sh", "args": ["-c", script]}));
    let driver = oci_driver(&oci_options(dir.path()));
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?} stderr: {}", log(&task, "stderr", 0));
    assert_eq!(log(&task, "stdout", 0), "hello-from-oci\nuid=0\ndirs-mounted\n");
}

#[tokio::test]
async fn memory_limit_is_applied_and_stop_escalates_to_kill() {
    require_oci_host!();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(dir.path());
    // As PID 1 without a handler, sh ignores SIGTERM: only SIGKILL ends it.
    let mut task = task(dir.path(), "stubborn", json!({"image": rootfs, "command": "/bin/sh", "args": ["-c", "echo ready; sleep 600"]}));
    task.resources.memory_mib = 48;
    task.resources.pids_max = 20;
    let driver = oci_driver(&oci_options(dir.path()));
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;

    let id = container_id(&handle);
    if nomad_agent::executor::cgroups::detect_version(Path::new("/sys/fs/cgroup")) == nomad_agent::client::driver::CgroupVersion::V1 {
        let cgroup = Path::new("/sys/fs/cgroup/memory/nomad-rs").join(&id);
        let limit = fs::read_to_string(cgroup.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (48u64 << 20).to_string());
        let pids = fs::read_to_string(Path::new("/sys/fs/cgroup/pids/nomad-rs").join(&id).join("pids.max")).unwrap();
        assert_eq!(pids.trim(), "20");
    } else {
        let limit = fs::read_to_string(Path::new("/sys/fs/cgroup/nomad-rs").join(&id).join("memory.max")).unwrap();
        assert_eq!(limit.trim(), (48u64 << 20).to_string());
    }

    let kill_timeout = Duration::from_millis(500);
    let started = Instant::now();
    driver.stop(&handle, Signal::SIGTERM, kill_timeout).await.unwrap();
    assert!(started.elapsed() >= kill_timeout, "SIGTERM alone must not have stopped it");
    let exit = driver.wait(&handle).await.unwrap();
    assert_eq!(exit.signal, Signal::SIGKILL as i32, "{exit:?}");

    driver.destroy(&handle).await.unwrap();
    assert!(!Path::new("/sys/fs/cgroup/memory/nomad-rs").join(&id).exists());
    assert!(!task.state_dir.join("bundle").exists());
}

#[tokio::test]
async fn stop_signal_reaches_the_container_first() {
    require_oci_host!();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(dir.path());
    let script = "trap 'echo got-term; exit 5' TERM; echo ready; sleep 600 & wait";
    let task = task(dir.path(), "graceful", json!({"image": rootfs, "command": "/bin/sh", "args": ["-c", script]}));
    let driver = oci_driver(&oci_options(dir.path()));
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    driver.stop(&handle, Signal::SIGTERM, Duration::from_secs(15)).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert_eq!((exit.exit_code, exit.signal), (5, 0), "{exit:?}");
    assert!(log(&task, "stdout", 0).contains("got-term"));
}

/// Writes `bytes` as a blob of the layout and returns its descriptor JSON.
fn add_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let hex: String = Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(&hex), bytes).unwrap();
    json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

fn tar_gz(build: impl FnOnce(&mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>)) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    build(&mut builder);
    builder.into_inner().unwrap().finish().unwrap()
}

fn add_file(builder: &mut tar::Builder<flate2::write::GzEncoder<Vec<u8>>>, path: &str, content: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_cksum();
    builder.append_data(&mut header, path, content).unwrap();
}

/// An OCI layout: layer 1 is the busybox rootfs plus /etc/doomed, layer 2 whites out /etc/doomed.
fn image_layout(dir: &Path) -> PathBuf {
    let rootfs = busybox_rootfs(dir);
    let layout = dir.join("layout");
    let base = tar_gz(|b| {
        b.append_dir_all(".", &rootfs).unwrap();
        add_file(b, "etc/doomed", b"remove me");
    });
    let whiteout = tar_gz(|b| add_file(b, "etc/.wh.doomed", b""));
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo from-layout; test -e /etc/doomed || echo whiteout-applied"], "Env": ["GREETING=hi"]},
        "rootfs": {"type": "layers", "diff_ids": []}
    });
    let config = add_blob(&layout, "application/vnd.oci.image.config.v1+json", config.to_string().as_bytes());
    let layers = vec![
        add_blob(&layout, "application/vnd.oci.image.layer.v1.tar+gzip", &base),
        add_blob(&layout, "application/vnd.oci.image.layer.v1.tar+gzip", &whiteout),
    ];
    let manifest =
        json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config, "layers": layers});
    let manifest = add_blob(&layout, "application/vnd.oci.image.manifest.v1+json", manifest.to_string().as_bytes());
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest]});
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    layout
}

#[tokio::test]
async fn an_oci_image_layout_is_unpacked_with_whiteouts_and_run_with_its_entrypoint() {
    require_oci_host!();
    let dir = tempfile::tempdir().unwrap();
    let layout = image_layout(dir.path());
    let task = task(dir.path(), "layout", json!({"image": layout}));
    let driver = oci_driver(&oci_options(dir.path()));
    let handle = driver.start(&task).await.unwrap();
    let exit = driver.wait(&handle).await.unwrap();
    driver.destroy(&handle).await.unwrap();
    assert!(exit.successful(), "{exit:?} stderr: {}", log(&task, "stderr", 0));
    assert_eq!(log(&task, "stdout", 0), "from-layout\nwhiteout-applied\n");
}

#[tokio::test]
async fn a_corrupt_image_layout_fails_with_a_clear_message() {
    // Fails while preparing the image, before runc is involved: no root or runc needed.
    let dir = tempfile::tempdir().unwrap();
    let driver = oci_driver(&oci_options(dir.path()));
    let start_error = |layout: &Path, name: &str| {
        let task = task(dir.path(), name, json!({"image": layout, "command": "/bin/sh"}));
        let driver = driver.clone();
        async move { driver.start(&task).await.unwrap_err() }
    };

    let garbled = dir.path().join("garbled");
    fs::create_dir_all(&garbled).unwrap();
    fs::write(garbled.join("index.json"), "{ not json").unwrap();
    let err = start_error(&garbled, "garbled").await;
    assert!(matches!(err, DriverError::Image { .. }), "{err:?}");
    assert!(err.to_string().contains("index.json"), "{err}");

    // A layer whose bytes were changed after its digest was recorded.
    let tampered = image_layout(&dir.path().join("t"));
    let index: serde_json::Value = serde_json::from_str(&fs::read_to_string(tampered.join("index.json")).unwrap()).unwrap();
    let manifest_hex = index["manifests"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let manifest: serde_json::Value = serde_json::from_slice(&fs::read(tampered.join("blobs/sha256").join(manifest_hex)).unwrap()).unwrap();
    let layer_hex = manifest["layers"][1]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
    let layer_path = tampered.join("blobs/sha256").join(&layer_hex);
    let mut bytes = fs::read(&layer_path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&layer_path, bytes).unwrap();
    let err = start_error(&tampered, "tampered").await.to_string();
    assert!(err.contains(&layer_hex) && err.contains("does not match its digest"), "{err}");

    // A manifest that names a blob which is not there.
    fs::remove_file(&layer_path).unwrap();
    let err = start_error(&tampered, "missing").await.to_string();
    assert!(err.contains(&layer_hex) && err.contains("No such file"), "{err}");
}

#[tokio::test]
async fn an_image_never_leads_out_of_the_task_dir_or_the_rootfs() {
    // All of it fails while preparing the image, before runc: no root or runc needed.
    let dir = tempfile::tempdir().unwrap();
    let driver = oci_driver(&oci_options(dir.path()));

    // The task replaced its relative image with a link to the host's root in an earlier run.
    let task_a = task(dir.path(), "escape", json!({"image": "local/rootfs", "command": "/bin/sh"}));
    std::os::unix::fs::symlink("/", task_a.local_dir().join("rootfs")).unwrap();
    let err = driver.start(&task_a).await.unwrap_err();
    assert!(matches!(err, DriverError::TaskFiles(_)), "{err:?}");
    assert!(err.to_string().contains("resolves outside"), "{err}");

    // A layer plants `etc -> <host dir>`, the next whites out `etc/victim`: the host file stays.
    let host = tempfile::tempdir().unwrap();
    fs::write(host.path().join("victim"), b"host file").unwrap();
    let layout = dir.path().join("hostile");
    let planted = tar_gz(|b| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        b.append_link(&mut header, "etc", host.path()).unwrap();
    });
    let whiteout = tar_gz(|b| add_file(b, "etc/.wh.victim", b""));
    let config = json!({"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}});
    let config = add_blob(&layout, "application/vnd.oci.image.config.v1+json", config.to_string().as_bytes());
    let layers = vec![
        add_blob(&layout, "application/vnd.oci.image.layer.v1.tar+gzip", &planted),
        add_blob(&layout, "application/vnd.oci.image.layer.v1.tar+gzip", &whiteout),
    ];
    let manifest =
        json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": config, "layers": layers});
    let manifest = add_blob(&layout, "application/vnd.oci.image.manifest.v1+json", manifest.to_string().as_bytes());
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest]});
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let task_b = task(dir.path(), "whiteout", json!({"image": layout}));
    let err = driver.start(&task_b).await.unwrap_err();
    assert!(err.to_string().contains("command"), "unpacked, then refused for want of a command: {err}");
    assert_eq!(fs::read(host.path().join("victim")).unwrap(), b"host file");

    // A FIFO in place of index.json fails at once instead of hanging the start.
    let fifo_layout = dir.path().join("fifo");
    fs::create_dir_all(&fifo_layout).unwrap();
    fs::write(fifo_layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    nix::unistd::mkfifo(&fifo_layout.join("index.json"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let task_c = task(dir.path(), "fifo", json!({"image": fifo_layout, "command": "/bin/sh"}));
    let err = tokio::time::timeout(Duration::from_secs(20), driver.start(&task_c)).await.expect("no hang").unwrap_err();
    assert!(err.to_string().contains("fifo"), "{err}");
}

#[tokio::test]
async fn fingerprint_reports_the_runtime_version() {
    require_oci_host!();
    let info = oci_driver(&options(false)).fingerprint().await;
    assert!(info.detected && info.healthy, "{info:?}");
    assert_eq!(info.attributes.get("driver.oci.runtime").map(String::as_str), Some("runc"));
    let version = info.attributes.get("driver.oci.runtime.version").unwrap();
    assert!(version.chars().next().is_some_and(|c| c.is_ascii_digit()), "{version}");
}

#[test]
fn an_oci_config_without_an_image_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let task = task(dir.path(), "noimage", json!({"command": "/bin/sh"}));
    let message = oci_driver(&oci_options(dir.path())).validate_config(&task).unwrap_err().to_string();
    assert!(message.contains("image"), "{message}");
}

#[tokio::test]
async fn exec_task_runs_inside_the_container() {
    require_oci_host!();
    let dir = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(dir.path());
    let task = task(
        dir.path(),
        "boxed",
        json!({"image": rootfs, "command": "/bin/sh", "args": ["-c", "echo x > /tmp/mark; echo ready; sleep 600"]}),
    );
    let driver = oci_driver(&oci_options(dir.path()));
    let handle = driver.start(&task).await.unwrap();
    wait_for_output(&task, "ready").await;
    let args = vec!["-c".to_string(), "cat /tmp/mark; ls /bin/busybox; exit 1".to_string()];
    let out = driver.exec_task(&handle, "/bin/sh", &args, Duration::from_secs(20)).await.unwrap();
    assert_eq!((out.exit_code, String::from_utf8_lossy(&out.output).as_ref()), (1, "x\n/bin/busybox\n"));
    driver.destroy(&handle).await.unwrap();
}
