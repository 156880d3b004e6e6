//! The job lifecycle through the CLI against a real dev agent: a parameterized job dispatched
//! with a payload and meta that reach its task; a periodic job launching on its schedule and
//! forced; a job's history, with diffs, and a revert to an earlier version.

use std::path::Path;

use nomad_e2e::wait_for;
use serde_json::Value;

use crate::SETTLE;
use crate::cli::{allocs, dev_agent, logs_contain, nomad};

const GREET: &str = r#"
job "greet" {
  type        = "batch"
  datacenters = ["dc1"]
  parameterized {
    payload       = "required"
    meta_required = ["who"]
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      dispatch_payload {
        file = "input.txt"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"hello $NOMAD_META_who\"; cat \"$NOMAD_TASK_DIR/input.txt\""]
      }
    }
  }
}
"#;

const TICK: &str = r#"
job "tick" {
  type        = "batch"
  datacenters = ["dc1"]
  periodic {
    crons            = ["*/2 * * * * * *"]
    prohibit_overlap = true
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/echo"
        args    = ["tick"]
      }
    }
  }
}
"#;

fn web(count: u32) -> String {
    format!(
        r#"
job "hist" {{
  datacenters = ["dc1"]
  group "g" {{
    count = {count}
    task "t" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sleep"
        args    = ["300"]
      }}
    }}
  }}
}}
"#
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The value of `key` in `Key = Value` output.
fn kv_value(out: &str, key: &str) -> String {
    out.lines().find_map(|l| l.split_once('=').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string())).unwrap_or_default()
}

#[test]
fn dispatch_periodic_history_and_revert_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(dir.path());
    let http = agent.http();

    // Dispatch: the payload file and the meta reach the task; the same idempotency token twice
    // gives the same child.
    let greet = write(dir.path(), "greet.nomad.hcl", GREET);
    nomad(&agent, &["job", "run", &greet]).expect(0, "job run of a parameterized job");
    let payload = write(dir.path(), "payload.txt", "the payload text\n");
    let missing = nomad(&agent, &["job", "dispatch", "-detach", "greet", &payload]);
    assert_eq!(missing.code, 1, "{}", missing.stdout);
    assert!(missing.stderr.contains("Dispatch did not provide required meta keys: [who]"), "{}", missing.stderr);
    let run = nomad(&agent, &["job", "dispatch", "-meta", "who=alice", "-idempotency-token", "once", "greet", &payload])
        .expect(0, "job dispatch");
    let child = kv_value(&run.stdout, "Dispatched Job ID");
    assert!(child.starts_with("greet/dispatch-"), "{}", run.stdout);
    let again = nomad(&agent, &["job", "dispatch", "-detach", "-meta", "who=alice", "-idempotency-token", "once", "greet", &payload])
        .expect(0, "job dispatch with the same token");
    assert_eq!(kv_value(&again.stdout, "Dispatched Job ID"), child);
    let child_path = child.replace('/', "%2F");
    let alloc = wait_for("the dispatched child's alloc to complete", SETTLE, || {
        allocs(&http, &child_path).into_iter().find(|a| a["ClientStatus"] == "complete")
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", allocs(&http, &child_path), agent.logs()));
    let logs = logs_contain(&agent, alloc["ID"].as_str().unwrap(), &[], "the payload text");
    assert!(logs.contains("hello alice"), "{logs}");
    let status = nomad(&agent, &["job", "status", "greet"]).expect(0, "job status of the parameterized job");
    assert!(status.stdout.contains("Parameterized Job") && status.stdout.contains("Dispatched Jobs"), "{}", status.stdout);
    assert!(status.stdout.contains(&child), "{}", status.stdout);

    // Periodic: children every two seconds, named by their launch second; a forced launch.
    let tick = write(dir.path(), "tick.nomad.hcl", TICK);
    nomad(&agent, &["job", "run", &tick]).expect(0, "job run of a periodic job");
    let children = || -> Vec<String> {
        let list = http.get_json("/v1/jobs?prefix=tick/periodic-").ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
        list.iter().filter_map(|j| j["ID"].as_str().map(str::to_string)).collect()
    };
    let launched = wait_for("two periodic launches", SETTLE, || {
        let c = children();
        (c.len() >= 2).then_some(c)
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", children(), agent.logs()));
    for id in &launched {
        let secs: i64 = id.rsplit('-').next().unwrap().parse().unwrap();
        assert_eq!(secs % 2, 0, "{id}: launched on the cron's even seconds");
    }
    let status = nomad(&agent, &["job", "status", "tick"]).expect(0, "job status of the periodic job");
    assert!(status.stdout.contains("Next Periodic Launch") && status.stdout.contains("Previously Launched Jobs"), "{}", status.stdout);
    let forced = nomad(&agent, &["job", "periodic", "force", "-detach", "tick"]).expect(0, "job periodic force");
    assert!(forced.stdout.starts_with("Force periodic successful\nEvaluation ID: "), "{}", forced.stdout);
    nomad(&agent, &["job", "stop", "-purge", "tick"]).expect(0, "stop the periodic job");

    // History and revert.
    let v0 = write(dir.path(), "hist0.nomad.hcl", &web(1));
    let v1 = write(dir.path(), "hist1.nomad.hcl", &web(2));
    nomad(&agent, &["job", "run", "-detach", &v0]).expect(0, "version 0");
    nomad(&agent, &["job", "run", "-detach", &v1]).expect(0, "version 1");
    let history = nomad(&agent, &["job", "history", "-p", "hist"]).expect(0, "job history -p");
    let blocks: Vec<&str> = history.stdout.split("\n\n").collect();
    assert_eq!(blocks.len(), 2, "{}", history.stdout);
    assert_eq!(kv_value(blocks[0], "Version"), "1");
    assert!(blocks[0].contains("Count") && blocks[0].contains("\"1\" => \"2\""), "{}", blocks[0]);
    assert_eq!(kv_value(blocks[1], "Version"), "0");
    nomad(&agent, &["job", "revert", "-detach", "hist", "0"]).expect(0, "job revert to version 0");
    let job: Value = http.get_json("/v1/job/hist").unwrap();
    assert_eq!((job["Version"].as_u64(), job["TaskGroups"][0]["Count"].as_u64()), (Some(2), Some(1)));
    let json = nomad(&agent, &["job", "history", "-json", "hist"]).expect(0, "job history -json");
    let versions: Vec<u64> =
        serde_json::from_str::<Vec<Value>>(&json.stdout).unwrap().iter().map(|j| j["Version"].as_u64().unwrap()).collect();
    assert_eq!(versions, [2, 1, 0]);
    let refused = nomad(&agent, &["job", "revert", "hist", "2"]);
    assert!(refused.code == 1 && refused.stderr.contains("can't revert to current version"), "{}", refused.stderr);
    nomad(&agent, &["job", "stop", "-purge", "hist"]).expect(0, "stop hist");
}

fn rolling(version: &str, command: &str, update: &str) -> String {
    format!(
        r#"
job "roll" {{
  datacenters = ["dc1"]
  update {{
    {update}
  }}
  group "g" {{
    count = 3
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    task "t" {{
      driver = "raw_exec"
      env {{
        VERSION = "{version}"
      }}
      config {{
        command = "/bin/sh"
        args    = ["-c", "{command}"]
      }}
    }}
  }}
}}
"#
    )
}

/// The job's newest deployment.
fn latest_deployment(http: &nomad_e2e::HttpClient) -> Value {
    http.get_json("/v1/job/roll/deployment").unwrap_or(Value::Null)
}

/// A rolling update goes one alloc at a time, each batch after the last is healthy, and ends
/// successful with the version stable; a version whose tasks fail fails its deployment at the
/// progress deadline and stops rolling.
#[test]
fn a_rolling_update_deploys_one_healthy_alloc_at_a_time_and_a_failing_one_stops_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let update = r#"max_parallel = 1
    min_healthy_time = "1s"
    healthy_deadline = "5s"
    progress_deadline = "8s""#;
    let v0 = write(dir.path(), "roll0.nomad.hcl", &rolling("0", "sleep 300", update));
    nomad(&agent, &["job", "run", "-detach", &v0]).expect(0, "version 0");
    let first = wait_for("the first deployment to succeed", SETTLE, || {
        let d = latest_deployment(&http);
        (d["Status"] == "successful").then_some(d)
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", latest_deployment(&http), agent.logs()));
    assert_eq!(first["TaskGroups"]["g"]["HealthyAllocs"], 3);
    let id = first["ID"].as_str().unwrap();
    let list = nomad(&agent, &["deployment", "list"]).expect(0, "deployment list");
    assert!(list.stdout.starts_with("ID ") && list.stdout.contains(&id[..8]) && list.stdout.contains("successful"), "{}", list.stdout);
    let status = nomad(&agent, &["deployment", "status", &id[..6]]).expect(0, "deployment status by prefix");
    assert!(status.stdout.contains("Description = Deployment completed successfully"), "{}", status.stdout);
    assert!(
        status
            .stdout
            .contains("Deployed\nTask Group  Desired  Placed  Healthy  Unhealthy  Progress Deadline\ng           3        3       3"),
        "{}",
        status.stdout
    );
    let refused = nomad(&agent, &["deployment", "fail", id]);
    assert!(refused.code == 1 && refused.stderr.contains("can't fail terminal deployment"), "{}", refused.stderr);

    // Version 1: never more than one new alloc without a health verdict at a time.
    let v1 = write(dir.path(), "roll1.nomad.hcl", &rolling("1", "sleep 300", update));
    nomad(&agent, &["job", "run", "-detach", &v1]).expect(0, "version 1");
    let mut most_unsettled = 0;
    let second = wait_for("the second deployment to succeed", SETTLE, || {
        let live: Vec<Value> = allocs(&http, "roll").into_iter().filter(|a| a["DesiredStatus"] == "run").collect();
        let unsettled = live.iter().filter(|a| a["JobVersion"] == 1 && a["DeploymentStatus"]["Healthy"].is_null()).count();
        most_unsettled = most_unsettled.max(unsettled);
        let d = latest_deployment(&http);
        (d["Status"] == "successful" && d["JobVersion"] == 1).then_some(d)
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", latest_deployment(&http), agent.logs()));
    assert_ne!(second["ID"], first["ID"]);
    assert!(most_unsettled <= 1, "max_parallel = 1 held: {most_unsettled} new allocs were unsettled at once");
    let live: Vec<Value> = allocs(&http, "roll").into_iter().filter(|a| a["ClientStatus"] == "running").collect();
    assert_eq!(live.len(), 3);
    assert!(live.iter().all(|a| a["JobVersion"] == 1), "{live:?}");
    let job: Value = http.get_json("/v1/job/roll").unwrap();
    assert_eq!((job["Version"].as_u64(), job["Stable"].as_bool()), (Some(1), Some(true)));

    // Version 2 fails: its first alloc is unhealthy, nothing more is replaced, and the deadline
    // fails the deployment.
    let v2 = write(dir.path(), "roll2.nomad.hcl", &rolling("2", "exit 1", update));
    nomad(&agent, &["job", "run", "-detach", &v2]).expect(0, "version 2");
    let failed = wait_for("the third deployment to fail", SETTLE, || {
        let d = latest_deployment(&http);
        (d["Status"] == "failed" && d["JobVersion"] == 2).then_some(d)
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", latest_deployment(&http), agent.logs()));
    assert_eq!(failed["StatusDescription"], "Failed due to progress deadline");
    let still_v1 = allocs(&http, "roll").into_iter().filter(|a| a["ClientStatus"] == "running" && a["JobVersion"] == 1).count();
    assert_eq!(still_v1, 2, "only the first alloc was replaced before the deployment failed");
    let out = nomad(&agent, &["job", "history", "roll"]).expect(0, "job history");
    assert!(out.stdout.contains("Stable      = true"), "{}", out.stdout);
}

fn canaried(version: &str, command: &str, progress_deadline: &str) -> String {
    let update = format!(
        r#"max_parallel = 1
    canary = 1
    auto_revert = true
    min_healthy_time = "1s"
    healthy_deadline = "10s"
    progress_deadline = "{progress_deadline}""#
    );
    rolling(version, command, &update).replace("job \"roll\"", "job \"canary\"").replace("count = 3", "count = 2")
}

/// A canary runs beside the old allocs until `job promote`, then the rest roll; a version
/// whose canary fails (with `progress_deadline = 0` and `auto_revert`) fails its deployment
/// at once and the job goes back to the stable version, the canary stopped.
#[test]
fn a_canary_waits_for_job_promote_and_a_failing_one_reverts_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent(dir.path());
    let http = agent.http();
    let deployment = || http.get_json("/v1/job/canary/deployment").unwrap_or(Value::Null);
    let live = || allocs(&http, "canary").into_iter().filter(|a| a["DesiredStatus"] == "run").collect::<Vec<Value>>();
    let v0 = write(dir.path(), "c0.nomad.hcl", &canaried("0", "sleep 300", "30s"));
    nomad(&agent, &["job", "run", "-detach", &v0]).expect(0, "version 0");
    wait_for("version 0 deployed", SETTLE, || (deployment()["Status"] == "successful").then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", deployment(), agent.logs()));

    let v1 = write(dir.path(), "c1.nomad.hcl", &canaried("1", "sleep 300", "30s"));
    nomad(&agent, &["job", "run", "-detach", &v1]).expect(0, "version 1");
    let waiting = wait_for("the canary to be healthy", SETTLE, || {
        let d = deployment();
        (d["JobVersion"] == 1 && d["TaskGroups"]["g"]["HealthyAllocs"] == 1).then_some(d)
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", deployment(), agent.logs()));
    assert_eq!(waiting["StatusDescription"], "Deployment is running but requires manual promotion");
    let now = live();
    assert_eq!(now.len(), 3, "the canary runs beside both old allocs: {now:?}");
    assert_eq!(now.iter().filter(|a| a["JobVersion"] == 1 && a["DeploymentStatus"]["Canary"] == true).count(), 1, "{now:?}");
    let status = nomad(&agent, &["job", "deployments", "-latest", "canary"]).expect(0, "job deployments -latest");
    assert!(status.stdout.contains("Promoted") && status.stdout.contains("Canaries"), "{}", status.stdout);

    nomad(&agent, &["job", "promote", "canary"]).expect(0, "job promote");
    wait_for("version 1 deployed", SETTLE, || (deployment()["Status"] == "successful").then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", deployment(), agent.logs()));
    wait_for("the old allocs to stop", SETTLE, || {
        let now = live();
        (now.len() == 2 && now.iter().all(|a| a["JobVersion"] == 1)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", live()));

    // Version 2's canary fails: the deployment fails at once and the job reverts to version 1.
    let v2 = write(dir.path(), "c2.nomad.hcl", &canaried("2", "exit 1", "0s"));
    nomad(&agent, &["job", "run", "-detach", &v2]).expect(0, "version 2");
    let failed = wait_for("version 2 to fail", SETTLE, || {
        let d = http.get_json("/v1/job/canary/deployments").unwrap_or(Value::Null);
        d.as_array()?.iter().find(|d| d["JobVersion"] == 2 && d["Status"] == "failed").cloned()
    })
    .unwrap_or_else(|e| panic!("{e}: {}\n{}", deployment(), agent.logs()));
    assert_eq!(failed["StatusDescription"], "Failed due to unhealthy allocations - rolling back to job version 1");
    let job: Value = http.get_json("/v1/job/canary").unwrap();
    assert_eq!(job["Version"], 3, "the revert registers version 1's spec as version 3");
    assert_eq!(job["TaskGroups"][0]["Tasks"][0]["Env"]["VERSION"], "1");
    wait_for("the failed canary gone and two allocs of the reverted spec", SETTLE, || {
        let now = live();
        (now.len() == 2 && now.iter().all(|a| a["JobVersion"] == 3)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", live()));
}
