//! Consul checks with a real dev agent against the Consul stand-in: `check_restart` restarts a
//! task whose http check fails after `limit` failures and never during `grace`; a script check
//! runs in the task and its output reaches the TTL check; the agent advertises itself
//! (`auto_advertise`) and does not when told not to.

use std::time::Duration;

use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_e2e::{Agent, AgentOptions, HttpClient, wait_for};
use serde_json::Value;

use crate::SETTLE;
use crate::cli::nomad;

fn dev_agent_with_consul(dir: &std::path::Path, consul: &ConsulStandIn, extra: &str) -> Agent {
    let config = format!("consul {{\n  address = \"{}\"\n{extra}}}\n", consul.addr());
    let opts = AgentOptions { args: vec!["-dev".into()], config: Some(config), ..Default::default() };
    let agent = Agent::start("dev", dir, opts).expect("start dev agent");
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    // Ready, and fingerprinted with Consul (the implied constraint of Consul services needs it).
    wait_for("the dev node to be ready with Consul", SETTLE, || {
        http.get_json("/v1/nodes").ok()?.as_array()?.iter().any(|n| n["Status"] == "ready").then_some(())?;
        let id = http.get_json("/v1/nodes").ok()?.as_array()?.first()?["ID"].as_str()?.to_string();
        let node = http.get_json(&format!("/v1/node/{id}")).ok()?;
        node["Attributes"]["consul.version"].is_string().then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    agent
}

fn run_job(agent: &Agent, dir: &std::path::Path, name: &str, hcl: &str) {
    let file = dir.join(format!("{name}.nomad.hcl"));
    std::fs::write(&file, hcl).unwrap();
    // Detached: a job whose check is meant to fail would fail its deployment, and `job run`
    // follows the deployment to its end; the tests wait for what they need themselves.
    nomad(agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, "job run");
}

fn running_alloc(http: &HttpClient, job: &str) -> Value {
    wait_for("the alloc to run", SETTLE, || {
        let list = http.get_json(&format!("/v1/job/{job}/allocations")).ok()?;
        let a = list.as_array()?.iter().find(|a| a["ClientStatus"] == "running")?.clone();
        http.get_json(&format!("/v1/allocation/{}", a["ID"].as_str()?)).ok()
    })
    .unwrap()
}

fn consul_checks(consul: &ConsulStandIn) -> Value {
    HttpClient::new(&consul.addr().to_string()).get_json("/v1/agent/checks").unwrap()
}

const FAILING_HTTP_CHECK: &str = r#"
job "unhealthy" {
  datacenters = ["dc1"]
  group "g" {
    network {
      port "http" {}
    }
    restart {
      attempts = 5
      interval = "10m"
      delay    = "1s"
      mode     = "fail"
    }
    task "web" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
      service {
        name = "unhealthy-web"
        port = "http"
        check {
          name     = "alive"
          type     = "http"
          path     = "/health"
          interval = "1s"
          timeout  = "1s"
          check_restart {
            limit = 3
            grace = "4s"
          }
        }
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"#;

/// Nothing listens on the service's port, so Consul (the stand-in runs http checks itself, as
/// Consul's agent does) finds the check critical from its first run. The restart comes only
/// after `grace` (4 s) plus `interval × (limit − 1)` (2 s) from the task's start, with Nomad's
/// event, and counts as a restart.
#[test]
fn a_task_whose_http_check_fails_is_restarted_after_limit_failures_and_not_during_grace() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent_with_consul(dir.path(), &consul, "");
    let http = agent.http();
    run_job(&agent, dir.path(), "unhealthy", FAILING_HTTP_CHECK);
    let alloc = running_alloc(&http, "unhealthy");
    let alloc_id = alloc["ID"].as_str().unwrap().to_string();
    // Registered, and critical in Consul during the grace: the grace, not health, holds the
    // restart back.
    wait_for("the check critical in Consul", SETTLE, || {
        let checks = consul_checks(&consul);
        checks.as_object()?.values().any(|c| c["Name"] == "alive" && c["Status"] == "critical").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));

    let state = wait_for("a check_restart restart", Duration::from_secs(60), || {
        let a = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        let s = a["TaskStates"]["web"].clone();
        s["Events"].as_array()?.iter().any(|e| e["Type"] == "Restart Signaled").then_some(s)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let events = state["Events"].as_array().unwrap();
    let started = events.iter().find(|e| e["Type"] == "Started").expect("a Started event")["Time"].as_i64().unwrap();
    let signaled = events.iter().find(|e| e["Type"] == "Restart Signaled").unwrap();
    assert_eq!(signaled["Details"]["restart_reason"], "healthcheck: check \"alive\" unhealthy", "{signaled}");
    let after = Duration::from_nanos((signaled["Time"].as_i64().unwrap() - started) as u64);
    assert!(after >= Duration::from_millis(5900), "restarted {after:?} after the start: within grace + (limit - 1) intervals");
    // It is started again, the restart counted (as a failure, by the restart policy).
    let state = wait_for("the task to run again", Duration::from_secs(30), || {
        let a = http.get_json(&format!("/v1/allocation/{alloc_id}")).ok()?;
        let s = a["TaskStates"]["web"].clone();
        (s["State"] == "running" && s["Restarts"].as_i64()? >= 1).then_some(s)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let events = state["Events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["Type"].as_str()).collect();
    let at = kinds.iter().position(|k| *k == "Restart Signaled").unwrap();
    assert!(kinds[at..].contains(&"Restarting") && kinds[at..].contains(&"Started"), "{kinds:?}");
    let restarting = events.iter().find(|e| e["Type"] == "Restarting").unwrap();
    assert_eq!(restarting["Details"]["restart_reason"], "Restart within policy", "counted as a failure: {restarting}");
    nomad(&agent, &["job", "stop", "-purge", "unhealthy"]).expect(0, "job stop");
}

const SCRIPT_CHECK: &str = r#"
job "scripted" {
  datacenters = ["dc1"]
  group "g" {
    task "worker" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo from-task > state; sleep 600"]
      }
      env {
        GREETING = "hello"
      }
      service {
        name = "scripted-worker"
        check {
          name     = "script"
          type     = "script"
          command  = "/bin/sh"
          args     = ["-c", "echo $GREETING-${NOMAD_ALLOC_INDEX} $(cat state); exit 1"]
          interval = "1s"
          timeout  = "5s"
        }
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"#;

/// The script runs in the task (its dir: it reads the file the task wrote; its environment),
/// and Consul gets exit 1 as `warning` with the output, on a check registered as TTL
/// (interval + 31 s). This agent has `auto_advertise = false`: it registers the job's service
/// but not itself.
#[test]
fn a_script_checks_output_reaches_the_ttl_check_and_auto_advertise_off_registers_no_agent_service() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent_with_consul(dir.path(), &consul, "  auto_advertise = false\n");
    run_job(&agent, dir.path(), "scripted", SCRIPT_CHECK);
    let alloc = running_alloc(&agent.http(), "scripted");
    let alloc_id = alloc["ID"].as_str().unwrap();

    let check = wait_for("the script's result in Consul", SETTLE, || {
        let checks = consul_checks(&consul);
        let c = checks.as_object()?.values().find(|c| c["Name"] == "script")?.clone();
        (c["Status"] == "warning").then_some(c)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    assert_eq!(check["Output"], "hello-0 from-task\n", "{check}");
    assert_eq!(check["Type"], "ttl");
    assert_eq!(check["ServiceID"], format!("_nomad-task-{alloc_id}-worker-scripted-worker-"));
    let reg = consul
        .calls_to("PUT", "/v1/agent/service/register")
        .iter()
        .map(|c| c.json())
        .find(|b| b["Name"] == "scripted-worker")
        .expect("the service was registered");
    let ttl = &reg["Checks"][0];
    assert_eq!((ttl["TTL"].as_str(), ttl.get("Interval")), (Some("32s"), None), "{reg}");
    let updates = consul.calls_to("PUT", "/v1/agent/check/update/");
    assert!(updates.iter().all(|c| c.json()["Status"] == "warning"), "every run reports the same result");

    let agent_registrations: Vec<Value> = consul
        .calls_to("PUT", "/v1/agent/service/register")
        .iter()
        .map(|c| c.json())
        .filter(|b| b["ID"].as_str().is_some_and(|id| id.starts_with("_nomad-client-") || id.starts_with("_nomad-server-")))
        .collect();
    assert!(agent_registrations.is_empty(), "auto_advertise = false: {agent_registrations:?}");
    nomad(&agent, &["job", "stop", "-purge", "scripted"]).expect(0, "job stop");
}

/// A dev agent (server and client) registers `nomad` (rpc, http) and `nomad-client` (http),
/// `consul.tags` appended, with Nomad's IDs; Consul's http checks of the agent's health
/// endpoints pass; a graceful stop removes them.
#[test]
fn auto_advertise_registers_the_agents_services_with_passing_checks_and_removes_them_on_stop() {
    let consul = ConsulStandIn::start(ConsulOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = dev_agent_with_consul(dir.path(), &consul, "  tags = [\"e2e\"]\n");
    let services = wait_for("the agent's services in Consul", SETTLE, || {
        let s = HttpClient::new(&consul.addr().to_string()).get_json("/v1/agent/services").ok()?;
        let ours: Vec<Value> =
            s.as_object()?.values().filter(|v| v["ID"].as_str().is_some_and(|id| id.starts_with("_nomad-"))).cloned().collect();
        (ours.len() == 3).then_some(ours)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let find = |id_prefix: &str, tag: &str| {
        services
            .iter()
            .find(|s| s["ID"].as_str().unwrap().starts_with(id_prefix) && s["Tags"][0] == tag)
            .unwrap_or_else(|| panic!("no {id_prefix} {tag}: {services:?}"))
            .clone()
    };
    let client = find("_nomad-client-", "http");
    assert_eq!(client["Service"], "nomad-client");
    assert_eq!(client["Tags"], serde_json::json!(["http", "e2e"]));
    assert_eq!(format!("{}:{}", client["Address"].as_str().unwrap(), client["Port"]), agent.http_addr);
    let server_rpc = find("_nomad-server-", "rpc");
    assert_eq!(server_rpc["Service"], "nomad");
    assert_eq!(format!("{}:{}", server_rpc["Address"].as_str().unwrap(), server_rpc["Port"]), agent.rpc_addr);
    assert_eq!(find("_nomad-server-", "http")["Tags"], serde_json::json!(["http", "e2e"]));

    // Consul runs the agent's own checks against it: /v1/agent/health answers 200.
    wait_for("the agent's checks to pass", SETTLE, || {
        let checks = consul_checks(&consul);
        let names: Vec<&str> =
            checks.as_object()?.values().filter(|c| c["Status"] == "passing").filter_map(|c| c["Name"].as_str()).collect();
        (names.contains(&"Nomad Client HTTP Check")
            && names.contains(&"Nomad Server HTTP Check")
            && names.contains(&"Nomad Server RPC Check"))
        .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", consul_checks(&consul), agent.logs()));

    agent.stop_with(nix::sys::signal::Signal::SIGINT, SETTLE).unwrap();
    let left: Vec<String> = ["_nomad-client-", "_nomad-server-"]
        .iter()
        .flat_map(|p| services.iter().filter_map(move |s| s["ID"].as_str().filter(|id| id.starts_with(p)).map(str::to_string)))
        .filter(|id| consul.has_service(id))
        .collect();
    assert!(left.is_empty(), "a graceful stop deregisters the agent's services: {left:?}");
}
