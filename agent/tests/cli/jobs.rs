//! Job commands against an in-process server (no scheduler: evals stay pending).

use nomad_proto::EvalStatus;

use crate::support::{Api, example};

fn eval_id_from(stdout: &str) -> String {
    let line = stdout.lines().find(|l| l.starts_with("Evaluation ID: ")).unwrap_or_else(|| panic!("no eval ID in:\n{stdout}"));
    line.trim_start_matches("Evaluation ID: ").trim().to_string()
}

#[tokio::test]
async fn job_run_detach_registers_the_job_and_prints_the_eval_id() {
    let api = Api::start().await;
    let run = api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await;
    run.expect_code(0).stdout_has("Job registration successful");
    let eval_id = eval_id_from(&run.stdout);
    let snap = api.server.store.snapshot();
    let job = snap.job("default", "hello").expect("the job is registered");
    assert_eq!(job.task_groups[0].name, "greeter");
    let eval = snap.eval(&eval_id).expect("the printed eval exists");
    assert_eq!(eval.job_id, "hello");
    assert_eq!(eval.triggered_by, "job-register");
    assert_eq!(eval.status, EvalStatus::Pending);
}

#[tokio::test]
async fn check_index_0_submits_only_a_new_job() {
    let api = Api::start().await;
    let file = example("hello.nomad.hcl");
    api.nomad(&["job", "run", "-detach", "-check-index", "0", &file]).await.expect_code(0);
    api.nomad(&["job", "run", "-detach", "-check-index", "0", &file]).await.expect_code(1).stderr_has("Enforcing job modify index 0");
}

#[tokio::test]
async fn job_run_gives_up_monitoring_after_the_timeout_and_leaves_the_job() {
    let api = Api::start().await;
    let run = api.nomad(&["job", "run", "-timeout", "1s", &example("hello.nomad.hcl")]).await;
    run.expect_code(1).stdout_has("Monitoring evaluation").stdout_has("Timed out after 1s waiting for job \"hello\"; it stays submitted");
    assert!(api.server.store.snapshot().job("default", "hello").is_some());
}

#[tokio::test]
async fn job_status_lists_jobs_and_shows_one_with_its_allocations() {
    let api = Api::start().await;
    api.nomad(&["job", "status"]).await.expect_code(0).stdout_has("No running jobs");
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    api.nomad(&["job", "status"])
        .await
        .expect_code(0)
        .stdout_has("ID     Type     Priority  Status   Submit Date")
        .stdout_has("hello  service  50        pending");
    api.nomad(&["job", "status", "hel"])
        .await
        .expect_code(0)
        .stdout_has("ID            = hello")
        .stdout_has("Type          = service")
        .stdout_has("Datacenters   = dc1")
        .stdout_has("Summary\nTask Group  Queued  Starting  Running  Failed  Complete  Lost  Unknown\ngreeter")
        .stdout_has("Allocations\nNo allocations placed");

    let node = api.server.register_node(nomad_server::testing::node("n1")).await;
    let alloc = api.place("hello", &node.id, 0).await;
    let run = api.nomad(&["job", "status", "-verbose", "hello"]).await;
    run.expect_code(0)
        .stdout_has("Evaluations\nID")
        .stdout_has("ID                                    Eval ID                               Node ID  Task Group  Version  Desired  Status   Created")
        .stdout_has(&format!("{}  {}  n1       greeter     0        run      running", alloc.id, alloc.eval_id));
    let json = api.nomad(&["job", "status", "-json"]).await;
    json.expect_code(0);
    let list: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(list[0]["ID"], "hello");
}

#[tokio::test]
async fn job_inspect_prints_the_job_wrapped_in_a_job_key() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let run = api.nomad(&["job", "inspect", "-json", "hello"]).await;
    run.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
    assert_eq!(v["Job"]["ID"], "hello");
    assert_eq!(v["Job"]["TaskGroups"][0]["Tasks"][0]["Name"], "hello");
    assert_eq!(v["Job"]["Namespace"], "default");
}

#[tokio::test]
async fn job_stop_purge_removes_the_job_and_prints_the_eval() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let run = api.nomad(&["job", "stop", "-purge", "-detach", "hello"]).await;
    run.expect_code(0);
    let eval_id = run.stdout.trim();
    assert_eq!(eval_id.len(), 36, "an eval ID: {eval_id:?}");
    let snap = api.server.store.snapshot();
    assert!(snap.job("default", "hello").is_none(), "purged");
    assert_eq!(snap.eval(eval_id).expect("the deregister eval").triggered_by, "job-deregister");
    api.nomad(&["job", "status", "hello"]).await.expect_code(1).stderr_has("No job(s) with prefix or id \"hello\" found");
}

#[tokio::test]
async fn job_stop_by_prefix_needs_confirmation() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    api.nomad(&["job", "stop", "-detach", "hel"])
        .await
        .expect_code(1)
        .stderr_has("\"hel\" is only a prefix of its ID; give the full ID or pass -yes");
    assert!(!api.server.store.snapshot().job("default", "hello").unwrap().stop, "not stopped without confirmation");
    api.nomad(&["job", "stop", "-detach", "-yes", "hel"]).await.expect_code(0);
    assert!(api.server.store.snapshot().job("default", "hello").unwrap().stop);
}

#[tokio::test]
async fn an_ambiguous_job_prefix_lists_the_candidates() {
    let api = Api::start().await;
    let dir = tempfile::tempdir().unwrap();
    for id in ["web-a", "web-b"] {
        let path = dir.path().join(format!("{id}.hcl"));
        let text = std::fs::read_to_string(example("hello.nomad.hcl")).unwrap().replace("job \"hello\"", &format!("job \"{id}\""));
        std::fs::write(&path, text).unwrap();
        api.nomad(&["job", "run", "-detach", path.to_str().unwrap()]).await.expect_code(0);
    }
    let run = api.nomad(&["job", "status", "web"]).await;
    run.expect_code(1)
        .stderr_has("Prefix matched multiple jobs\n\nID     Type     Priority  Status   Submit Date\nweb-a")
        .stderr_has("\nweb-b ");
    api.nomad(&["job", "inspect", "web"]).await.expect_code(1).stderr_has("Prefix matched multiple jobs");
}

#[tokio::test]
async fn job_plan_dry_runs_the_scheduler_and_exits_1_when_allocations_would_change() {
    let api = Api::start().await;
    let out = api.nomad(&["job", "plan", &example("hello.nomad.hcl")]).await;
    // No nodes: the plan shows the placement it could not make; nothing is registered.
    out.expect_code(1).stdout_has("+ Job: \"hello\"").stdout_has("failed to place 1 allocation");
    api.nomad(&["job", "status", "hello"]).await.expect_code(1);
}

const COUNTDASH: &str = r#"
job "countdash" {
  group "api" {
    network {
      mode = "bridge"
    }
    service {
      name = "count-api"
      port = "9001"
      connect {
        sidecar_service {}
      }
    }
    task "web" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["600"]
      }
    }
  }
}
"#;

/// A Connect job file: `job validate` checks it as the servers do (with the sidecar the servers
/// inject), `job plan` shows the injected Envoy task.
#[tokio::test]
async fn a_connect_job_validates_and_its_plan_shows_the_injected_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("countdash.nomad.hcl");
    std::fs::write(&file, COUNTDASH).unwrap();
    let file = file.display().to_string();
    crate::support::nomad(&["job", "validate", &file]).await.expect_code(0).stdout_has("Job validation successful");
    let api = Api::start().await;
    api.nomad(&["job", "plan", &file]).await.expect_code(1).stdout_has("+ Task: \"connect-proxy-count-api\"").stdout_has("+ Task: \"web\"");

    let host = dir.path().join("host.nomad.hcl");
    std::fs::write(&host, COUNTDASH.replace("\"bridge\"", "\"host\"")).unwrap();
    crate::support::nomad(&["job", "validate", &host.display().to_string()])
        .await
        .expect_code(1)
        .stderr_has("Consul Connect sidecar requires bridge network, found \"host\" in group \"api\"");
}

#[tokio::test]
async fn ctrl_c_stops_monitoring_but_leaves_the_job_submitted() {
    use tokio::io::AsyncBufReadExt;

    let api = Api::start().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nomad-rs"))
        .args(["job", "run", "-address", &api.addr, &example("hello.nomad.hcl")])
        .env_remove("NOMAD_ADDR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // The handler is in place before the first monitoring line is printed.
    loop {
        let line = lines.next_line().await.unwrap().expect("the monitor prints before exiting");
        if line.contains("Monitoring evaluation") {
            break;
        }
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let mut rest = String::new();
    while let Some(l) = lines.next_line().await.unwrap() {
        rest.push_str(&l);
        rest.push('\n');
    }
    let status = child.wait().await.unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(rest.contains("Monitoring interrupted; job \"hello\" stays submitted"), "{rest}");
    let job = api.server.store.snapshot().job("default", "hello").cloned().expect("still registered");
    assert!(!job.stop, "an interrupted monitor does not stop the job");
}

/// The job as the user gave it: what a server keeps, minus what it sets itself.
fn user_fields(job: &nomad_proto::Job) -> serde_json::Value {
    let mut v = serde_json::to_value(job).unwrap();
    for server_set in
        ["CreateIndex", "ModifyIndex", "JobModifyIndex", "SubmitTime", "Status", "StatusDescription", "Stable", "Version", "Stop"]
    {
        v.as_object_mut().unwrap().remove(server_set);
    }
    v
}

#[tokio::test]
async fn a_json_job_from_job_inspect_or_job_run_output_runs_again_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let first = Api::start().await;
    first.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let original = user_fields(first.server.store.snapshot().job("default", "hello").unwrap());

    // `job inspect` output, as it is: read as JSON by content, or with -json.
    let inspected = first.nomad(&["job", "inspect", "hello"]).await;
    inspected.expect_code(0);
    let inspect_file = dir.path().join("inspect.json");
    std::fs::write(&inspect_file, &inspected.stdout).unwrap();
    for flags in [&[][..], &["-json"]] {
        let second = Api::start().await;
        let mut args = vec!["job", "run", "-detach"];
        args.extend_from_slice(flags);
        args.push(inspect_file.to_str().unwrap());
        second.nomad(&args).await.expect_code(0).stdout_has("Job registration successful");
        let job = second.server.store.snapshot().job("default", "hello").cloned().expect("registered from JSON");
        assert_eq!(user_fields(&job), original, "{flags:?}");
    }

    // The job object alone, without the `Job` key.
    let bare: serde_json::Value = serde_json::from_str(&inspected.stdout).unwrap();
    let bare_file = dir.path().join("bare.json");
    std::fs::write(&bare_file, serde_json::to_string(&bare["Job"]).unwrap()).unwrap();
    crate::support::nomad(&["job", "validate", bare_file.to_str().unwrap()]).await.expect_code(0);
    let third = Api::start().await;
    third.nomad(&["job", "run", "-detach", "-json", bare_file.to_str().unwrap()]).await.expect_code(0);
    assert_eq!(user_fields(third.server.store.snapshot().job("default", "hello").unwrap()), original);

    // `job run -output` prints the JSON without submitting (no server is asked), Nomad's shape.
    let dead = format!("http://127.0.0.1:{}", crate::support::closed_port());
    let output = crate::support::nomad(&["job", "run", "-output", "-address", &dead, &example("hello.nomad.hcl")]).await;
    output.expect_code(0);
    assert!(output.stdout.starts_with("{\n    \"Job\": {\n        \""), "indented four spaces: {}", output.stdout);
    let printed: serde_json::Value = serde_json::from_str(&output.stdout).unwrap();
    assert_eq!(printed["Job"]["ID"], "hello");
    let output_file = dir.path().join("output.json");
    std::fs::write(&output_file, &output.stdout).unwrap();
    let fourth = Api::start().await;
    fourth.nomad(&["job", "run", "-detach", "-json", output_file.to_str().unwrap()]).await.expect_code(0);
    assert_eq!(user_fields(fourth.server.store.snapshot().job("default", "hello").unwrap()), original);

    // Variables belong to HCL2 files.
    crate::support::nomad(&["job", "run", "-json", "-var", "a=1", output_file.to_str().unwrap()])
        .await
        .expect_code(1)
        .stderr_has("cannot use variables with JSON files.");
    std::fs::write(dir.path().join("broken.json"), "{\"Job\": [1]}").unwrap();
    crate::support::nomad(&["job", "validate", dir.path().join("broken.json").to_str().unwrap()])
        .await
        .expect_code(1)
        .stderr_has("Failed to parse JSON job: Job: expected a JSON object");
}

#[tokio::test]
async fn job_eval_detach_creates_an_eval_for_the_job_found_by_prefix() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let before = api.server.store.snapshot().evals().count();
    let run = api.nomad(&["job", "eval", "-detach", "-verbose", "hel"]).await;
    run.expect_code(0).stdout_has("Created eval ID: \"");
    let id = run.stdout.trim().trim_start_matches("Created eval ID: \"").trim_end_matches('"').to_string();
    let snap = api.server.store.snapshot();
    let eval = snap.eval(&id).unwrap_or_else(|| panic!("the printed eval {id:?} exists"));
    assert_eq!((eval.job_id.as_str(), eval.triggered_by.as_str()), ("hello", "job-register"));
    assert_eq!(snap.evals().count(), before + 1);
    api.nomad(&["job", "eval", "-detach", "nope"]).await.expect_code(1).stderr_has("No job(s) with prefix or id \"nope\" found");
}

#[tokio::test]
async fn system_gc_purges_a_stopped_job_whose_evals_are_done() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    api.nomad(&["job", "stop", "-detach", "hello"]).await.expect_code(0);
    // No scheduler runs here: the evals are finished by hand.
    let evals: Vec<_> = api
        .server
        .store
        .snapshot()
        .evals_by_job("default", "hello")
        .map(|e| nomad_proto::Evaluation { status: EvalStatus::Complete, ..(**e).clone() })
        .collect();
    nomad_server::consensus::Consensus::apply(&*api.server.consensus, nomad_server::fsm::Command::EvalUpsert { evals }).await.unwrap();
    let run = api.nomad(&["system", "gc"]).await;
    run.expect_code(0);
    assert_eq!(run.stdout, "", "nothing printed on success");
    assert!(api.server.store.snapshot().job("default", "hello").is_none(), "the stopped job is collected");
}

const SCALABLE: &str = r#"
job "web" {
  datacenters = ["dc1"]
  group "web" {
    count = 2
    scaling {
      min = 1
      max = 4
    }
    task "server" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["1000"]
      }
    }
  }
  group "db" {
    task "db" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["1000"]
      }
    }
  }
}
"#;

#[tokio::test]
async fn job_scale_sets_a_groups_count_within_its_policy_and_scaling_events_lists_it() {
    let api = Api::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.nomad.hcl");
    std::fs::write(&file, SCALABLE).unwrap();
    api.nomad(&["job", "run", "-detach", file.to_str().unwrap()]).await.expect_code(0);
    api.nomad(&["job", "scaling-events", "web"]).await.expect_code(0).stdout_has("No events found");

    api.nomad(&["job", "scale", "-detach", "web", "3"]).await.expect_code(1).stderr_has("Group name required");
    api.nomad(&["job", "scale", "-detach", "web", "cache", "3"]).await.expect_code(1).stderr_has("Group cache not found within job");
    api.nomad(&["job", "scale", "-detach", "web", "web", "x"]).await.expect_code(1).stderr_has("Failed to convert count string to int");
    api.nomad(&["job", "scale", "-detach", "web", "web", "9"])
        .await
        .expect_code(1)
        .stderr_has("Error submitting scaling request")
        .stderr_has("group count was greater than scaling policy maximum: 9 > 4");
    let run = api.nomad(&["job", "scale", "-detach", "we", "web", "3"]).await;
    run.expect_code(0);
    let eval_id = eval_id_from(&run.stdout);
    let snap = api.server.store.snapshot();
    assert_eq!(snap.job("default", "web").unwrap().task_groups[0].count, 3);
    assert_eq!(snap.eval(&eval_id).expect("the printed eval exists").triggered_by, "job-scaling");

    let events = api.nomad(&["job", "scaling-events", "-verbose", "web"]).await;
    events.expect_code(0);
    let lines: Vec<&str> = events.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", events.stdout);
    let header: Vec<&str> = lines[0].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(header, ["Task Group", "Count", "PrevCount", "Error", "Message", "Eval ID", "Date"]);
    let row: Vec<&str> = lines[1].split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(row[..6], ["web", "3", "2", "false", "submitted using the Nomad CLI", eval_id.as_str()]);
}

#[tokio::test]
async fn eval_list_shows_nomads_columns_filters_and_pages() {
    let api = Api::start().await;
    let first = eval_id_from(&api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0).stdout);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.nomad.hcl");
    std::fs::write(&file, SCALABLE).unwrap();
    api.nomad(&["job", "run", "-detach", file.to_str().unwrap()]).await.expect_code(0);

    let list = api.nomad(&["eval", "list", "-verbose", "-job", "hello"]).await;
    list.expect_code(0);
    let lines: Vec<&str> = list.stdout.lines().collect();
    let cells = |l: &str| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(cells(lines[0]), ["ID", "Priority", "Triggered By", "Job ID", "Namespace", "Node ID", "Status", "Placement Failures"]);
    assert_eq!(lines.len(), 2, "{}", list.stdout);
    assert_eq!(cells(lines[1]), [first.as_str(), "50", "job-register", "hello", "default", "pending", "false"]);
    api.nomad(&["eval", "list", "-status", "complete"]).await.expect_code(0).stdout_has("No evals found");
    let json = api.nomad(&["eval", "list", "-json"]).await;
    json.expect_code(0);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&json.stdout).unwrap().as_array().unwrap().len(), 2);
    let paged = api.nomad(&["eval", "list", "-per-page", "1"]).await;
    paged.expect_code(0).stdout_has("Results have been paginated. To get the next page run:").stdout_has("-page-token ");
}
