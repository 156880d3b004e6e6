//! Nomad-native services with a real dev agent: a job's group and task services
//! (`provider = "nomad"`) are registered with the alloc's dynamic port, shown by `/v1/service/<name>`
//! and `nomad-rs service info`, and removed when the job stops.

use nomad_e2e::wait_for;
use serde_json::Value;

use crate::SETTLE;
use crate::cli::{dev_agent, nomad};

const JOB: &str = r#"
job "svc-e2e" {
  datacenters = ["dc1"]

  group "api" {
    network {
      port "http" {}
    }

    service {
      name     = "${NOMAD_JOB_NAME}-http"
      provider = "nomad"
      port     = "http"
      tags     = ["dc-${node.datacenter}", "idx-${NOMAD_ALLOC_INDEX}"]
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "/bin/sleep"
        args    = ["300"]
      }

      service {
        name     = "svc-e2e-task"
        provider = "nomad"
        port     = "http"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"#;

fn service(http: &nomad_e2e::HttpClient, name: &str) -> Vec<Value> {
    http.get_json(&format!("/v1/service/{name}")).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

#[test]
fn a_jobs_nomad_services_carry_the_allocs_dynamic_port_and_go_with_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let file = dir.path().join("svc.nomad.hcl");
    std::fs::write(&file, JOB).unwrap();
    // A service without a provider is Nomad's default, a Consul service: admitted, with Nomad's
    // implied constraint, which keeps it off this node (no Consul) and names itself.
    let consul = dir.path().join("consul.nomad.hcl");
    std::fs::write(&consul, JOB.replace("provider = \"nomad\"\n      port     = \"http\"\n      tags", "port     = \"http\"\n      tags"))
        .unwrap();
    nomad(&agent, &["job", "validate", consul.to_str().unwrap()]).expect(0, "job validate of a Consul service");
    let unplaced = nomad(&agent, &["job", "run", consul.to_str().unwrap()]).expect(2, "job run of a Consul service");
    let want = "* Constraint \"${attr.consul.version} semver >= 1.7.0\": 1 nodes excluded by filter";
    assert!(unplaced.stdout.contains(want), "{}\n{}", unplaced.stdout, unplaced.stderr);
    nomad(&agent, &["job", "run", file.to_str().unwrap()]).expect(0, "job run");

    let alloc = wait_for("the alloc to run", SETTLE, || {
        let list = http.get_json("/v1/job/svc-e2e/allocations").ok()?;
        let a = list.as_array()?.iter().find(|a| a["ClientStatus"] == "running")?.clone();
        http.get_json(&format!("/v1/allocation/{}", a["ID"].as_str()?)).ok()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let alloc_id = alloc["ID"].as_str().unwrap().to_string();
    let port = &alloc["AllocatedResources"]["Shared"]["Ports"][0];
    assert_eq!(port["Label"], "http");
    let (host_ip, value) = (port["HostIP"].as_str().unwrap().to_string(), port["Value"].as_i64().unwrap());
    assert!(value > 0);

    let regs = wait_for("the group service to be registered", SETTLE, || Some(service(&http, "svc-e2e-http")).filter(|r| r.len() == 1))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
    let r = &regs[0];
    assert_eq!(r["ID"], format!("_nomad-task-{alloc_id}-group-api-svc-e2e-http-http"));
    assert_eq!((r["Address"].as_str().unwrap(), r["Port"].as_i64().unwrap()), (host_ip.as_str(), value));
    assert_eq!(r["Tags"], serde_json::json!(["dc-dc1", "idx-0"]));
    assert_eq!(
        (r["JobID"].as_str(), r["AllocID"].as_str(), r["Namespace"].as_str()),
        (Some("svc-e2e"), Some(alloc_id.as_str()), Some("default"))
    );
    assert_eq!(r["NodeID"], alloc["NodeID"]);
    wait_for("the task service to be registered", SETTLE, || Some(service(&http, "svc-e2e-task")).filter(|r| r.len() == 1))
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));

    let info = nomad(&agent, &["service", "info", "svc-e2e-http"]).expect(0, "service info");
    let row: Vec<&str> = info.stdout.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        row,
        ["svc-e2e", &format!("{host_ip}:{value}"), "[dc-dc1,idx-0]", &alloc["NodeID"].as_str().unwrap()[..8], &alloc_id[..8]],
        "{}",
        info.stdout
    );
    let list = nomad(&agent, &["service", "list"]).expect(0, "service list");
    assert!(list.stdout.contains("svc-e2e-task") && list.stdout.contains("svc-e2e-http"), "{}", list.stdout);
    nomad(&agent, &["service", "info", "no-such-service"]).expect(1, "service info of an unknown service");

    nomad(&agent, &["job", "stop", "svc-e2e"]).expect(0, "job stop");
    wait_for("every registration to be removed", SETTLE, || {
        (service(&http, "svc-e2e-http").is_empty() && service(&http, "svc-e2e-task").is_empty()).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
}
