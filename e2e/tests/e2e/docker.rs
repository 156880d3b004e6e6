//! A docker job through a dev agent on the real Engine: it runs, `alloc logs` shows its output,
//! its mapped port answers, and `job stop -purge` removes its container. The image is imported
//! from a busybox rootfs (no registry).

use std::path::Path;
use std::process::{Command, Stdio};

use nomad_e2e::wait_for;
use nomad_testkit::Prereq;

use crate::SETTLE;
use crate::cli::{alloc_with_status, busybox_rootfs, dev_agent, http_get, logs_contain, nomad, port, stop_and_purge};

/// Imports `rootfs` as `name` with `docker import` (test setup only; the driver speaks the API).
fn docker_import(rootfs: &Path, name: &str) {
    let tar = Command::new("tar").args(["-C"]).arg(rootfs).args(["-c", "."]).stdout(Stdio::piped()).spawn().unwrap();
    let out = Command::new("docker").args(["import", "-", name]).stdin(tar.stdout.unwrap()).output().unwrap();
    assert!(out.status.success(), "docker import: {}", String::from_utf8_lossy(&out.stderr));
}

fn containers_of(alloc_id: &str) -> String {
    let filter = format!("label=com.hashicorp.nomad.alloc_id={alloc_id}");
    let out = Command::new("docker").args(["ps", "-aq", "--filter", &filter]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_docker_job_runs_through_a_dev_agent_and_alloc_logs_shows_its_output() {
    if !nomad_testkit::prereq::met(&[Prereq::Root, Prereq::Docker, Prereq::Busybox]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let image = format!("nomad-rs-e2e/busybox:{tag}");
    docker_import(&busybox_rootfs(dir.path()), &image);
    let agent = dev_agent(&dir.path().join("agent"));
    let job = format!(
        r#"job "dockerweb" {{
  datacenters = ["*"]
  group "web" {{
    network {{
      port "http" {{ to = 8080 }}
    }}
    task "httpd" {{
      driver = "docker"
      config {{
        image   = "{image}"
        command = "sh"
        args    = ["-c", "echo hello-from-docker; echo ok > /local/index.html; exec httpd -f -p 8080 -h /local"]
        ports   = ["http"]
      }}
      resources {{
        cpu    = 100
        memory = 32
      }}
    }}
  }}
}}
"#
    );
    let file = dir.path().join("dockerweb.nomad.hcl");
    std::fs::write(&file, job).unwrap();
    nomad(&agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, "job run");
    let alloc = alloc_with_status(&agent, "dockerweb", "running");
    let alloc_id = alloc["ID"].as_str().unwrap().to_string();
    logs_contain(&agent, &alloc_id, &[], "hello-from-docker");
    let host_port = port(&alloc, "http");
    wait_for("the docker task's mapped port to answer", SETTLE, || http_get(host_port, "/index.html").filter(|r| r.contains("ok")))
        .unwrap();
    assert!(!containers_of(&alloc_id).is_empty());
    stop_and_purge(&agent, "dockerweb");
    wait_for("the container to be removed", SETTLE, || containers_of(&alloc_id).is_empty().then_some(())).unwrap();
    let _ = Command::new("docker").args(["rmi", "-f", &image]).output();
}
