//! API compatibility with a real third-party client: python-nomad 2.1.0.
//!
//! The project's test script installs python-nomad into a virtualenv and
//! points `NOMAD_RS_PYTHON` at its interpreter. The client module runs against a raw_exec and a
//! docker task (`compat_client.py`). Its own test suite (from its sdist, installed beside the
//! interpreter by `scripts/install-deps`) runs its ACL tests against an ACL-enabled dev agent.

use std::process::Command;

use crate::single_server;

fn python() -> String {
    std::env::var("NOMAD_RS_PYTHON").unwrap_or_else(|_| {
        panic!("NOMAD_RS_PYTHON is not set: run the tests through scripts/test, which installs python-nomad 2.1.0 into a virtualenv")
    })
}

fn run_script(script: &str, addr: &str) -> String {
    run_script_with(script, addr, &[])
}

/// Runs `script` against the agent at `addr`, with `env` set for it.
fn run_script_with(script: &str, addr: &str, env: &[(&str, &str)]) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python").join(script);
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = Command::new(python())
        .arg(&path)
        .env("NOMAD_HOST", host)
        .env("NOMAD_PORT", port)
        .envs(env.iter().copied())
        .output()
        .expect("running python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{script} failed:\nstdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn python_nomad_registers_lists_reads_stops_and_purges_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let server = single_server(dir.path());
    let out = run_script("compat_jobs.py", &server.http_addr);
    assert!(out.contains("ok: purged"), "{out}");
    // The script's purge is visible to us too.
    let r = server.http().request("GET", "/v1/job/py-web", None).unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn python_nomads_event_stream_reader_reads_our_stream() {
    let dir = tempfile::tempdir().unwrap();
    let server = single_server(dir.path());
    let out = run_script("compat_events.py", &server.http_addr);
    assert!(out.contains("ok: events"), "{out}");
}

#[test]
fn python_nomad_against_one_server_and_two_clients_registers_lists_reads_and_stops() {
    let cluster = nomad_e2e::Cluster::start(nomad_e2e::ClusterOptions { servers: 1, clients: 2, ..Default::default() }).expect("cluster");
    let out = run_script("compat_cluster.py", &cluster.servers[0].http_addr);
    for step in ["NodeResources present", "one allocation on each client", "allocation stopped", "ok: cluster"] {
        assert!(out.contains(step), "missing {step:?}:\n{out}");
    }
}

#[test]
fn python_nomads_client_module_reads_files_and_stats_signals_restarts_and_collects_a_raw_exec_task() {
    let dir = tempfile::tempdir().unwrap();
    let agent = crate::cli::dev_agent(&dir.path().join("agent"));
    let out = run_script("compat_client.py", &agent.http_addr);
    assert!(out.contains("11 passed, 0 failed"), "{out}");
}

#[test]
fn python_nomads_client_module_works_on_a_docker_task() {
    if !crate::docker::docker_possible() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = crate::docker::TestImage::import(dir.path());
    let agent = crate::docker::docker_agent(&dir.path().join("agent"), crate::docker::NO_REAPER);
    let out = run_script_with("compat_client.py", &agent.http_addr, &[("NOMAD_DRIVER", "docker"), ("NOMAD_IMAGE", &image.name)]);
    assert!(out.contains("11 passed, 0 failed"), "{out}");
}

/// Where `scripts/install-deps` unpacked python-nomad 2.1.0's own test suite: beside the
/// virtualenv's interpreter (`.venv/bin/python` → `.venv/python-nomad-2.1.0`).
fn python_nomad_suite() -> std::path::PathBuf {
    let python = std::path::PathBuf::from(python());
    let suite = python.parent().and_then(|bin| bin.parent()).map(|venv| venv.join("python-nomad-2.1.0")).unwrap_or_default();
    assert!(
        suite.join("tests/test_acl.py").is_file() && suite.join("tests/conftest.py").is_file(),
        "python-nomad's test suite is not at {}: run scripts/install-deps",
        suite.display()
    );
    suite
}

/// python-nomad's own ACL, base and Variables tests, run as its CI runs them: against `agent -dev
/// -acl-enabled`, the ACL tests first (they bootstrap and hand the management token to the rest).
#[test]
fn python_nomads_own_acl_base_and_variables_tests_pass_against_an_acl_enabled_dev_agent() {
    let suite = python_nomad_suite();
    let dir = tempfile::tempdir().unwrap();
    let config =
        format!("plugin \"oci\" {{\n  config {{\n    runtime_root = {:?}\n  }}\n}}\n", dir.path().join("runc").display().to_string());
    let opts = nomad_e2e::AgentOptions { args: vec!["-dev".into(), "-acl-enabled".into()], config: Some(config), ..Default::default() };
    let agent = nomad_e2e::Agent::start("dev", &dir.path().join("agent"), opts).expect("start dev agent");
    agent.wait_for_leader(crate::SETTLE).unwrap();
    // ACLs are on: an anonymous caller cannot list tokens before (or after) the bootstrap.
    assert_eq!(agent.http().request("GET", "/v1/acl/tokens", None).unwrap().status, 403);

    let (host, port) = agent.http_addr.rsplit_once(':').unwrap();
    let out = Command::new(python())
        .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "tests/test_acl.py", "tests/test_base.py"])
        .args(["tests/test_variable.py", "tests/test_variables.py"])
        .current_dir(&suite)
        .env("NOMAD_IP", host)
        .env("NOMAD_PORT", port)
        .env("NOMAD_VERSION", "1.6.1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("NOMAD_TOKEN")
        .env_remove("NOMAD_ADDR")
        .output()
        .expect("running pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let passed = |file: &str| stdout.lines().filter(|l| l.starts_with(&format!("PASSED tests/{file}::"))).count();
    assert!(
        out.status.success()
            && passed("test_acl.py") == 13
            && passed("test_base.py") == 14
            && passed("test_variable.py") == 16
            && passed("test_variables.py") == 12,
        "python-nomad's suite:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        agent.logs()
    );
    assert_eq!(agent.http().request("GET", "/v1/acl/tokens", None).unwrap().status, 403);
}
