//! Commands that follow progress (`job run`, `node drain`) and client-side routes
//! (`alloc logs`, `alloc restart`, `job plan`), against fake API servers with canned answers.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::routing::{get, put};
use nomad_proto::alloc::TaskEvent;
use nomad_proto::node::DrainStrategy;
use nomad_proto::{
    AllocMetric, AllocStubFields, Allocation, ClientStatus, DesiredStatus, EvalStatus, Evaluation, Job, JobType, Node, Task, TaskGroup,
    TaskState,
};
use serde_json::{Value, json};

use crate::support::{Seq, example, find, json_reply, nomad, recorded, serve};

const EVAL: &str = "e0e0e0e0-1111-2222-3333-444444444444";
const ALLOC: &str = "a1a1a1a1-5555-6666-7777-888888888888";
const NODE: &str = "f00df00d-9999-aaaa-bbbb-cccccccccccc";

fn eval(status: EvalStatus, job_type: JobType) -> Evaluation {
    Evaluation {
        id: EVAL.into(),
        namespace: "default".into(),
        job_id: "hello".into(),
        triggered_by: "job-register".into(),
        eval_type: job_type,
        status,
        create_index: 5,
        ..Evaluation::default()
    }
}

fn hello_job(job_type: JobType) -> Job {
    Job {
        id: "hello".into(),
        job_type,
        task_groups: vec![TaskGroup {
            name: "greeter".into(),
            tasks: vec![Task { name: "hello".into(), driver: "raw_exec".into(), ..Task::default() }],
            ..TaskGroup::default()
        }],
        ..Job::default()
    }
}

fn alloc(status: ClientStatus, job_type: JobType) -> Allocation {
    Allocation {
        id: ALLOC.into(),
        namespace: "default".into(),
        eval_id: EVAL.into(),
        name: "hello.greeter[0]".into(),
        node_id: NODE.into(),
        node_name: "node-1".into(),
        job_id: "hello".into(),
        job: Some(Arc::new(hello_job(job_type))),
        task_group: "greeter".into(),
        client_status: status,
        create_index: 6,
        ..Allocation::default()
    }
}

fn stubs(allocs: &[Allocation]) -> Value {
    json!(allocs.iter().map(|a| a.stub(AllocStubFields::default())).collect::<Vec<_>>())
}

/// A fake API for `job run`: register answers with [`EVAL`], the eval and its allocations
/// answer with the canned sequences, and full allocations come from `full`.
fn run_api(evals: Vec<Evaluation>, allocs: Vec<Value>, full: Option<Allocation>) -> Router {
    let evals = Seq::new(evals.iter().map(|e| json!(e)).collect());
    let allocs = Seq::new(allocs);
    let full = Arc::new(full.map(|a| json!(a)).unwrap_or(Value::Null));
    Router::new()
        .route(
            "/v1/jobs",
            put(|| async { json_reply(&json!({"EvalID": EVAL, "EvalCreateIndex": 5, "JobModifyIndex": 5, "Warnings": ""}), 5) }),
        )
        .route(
            "/v1/evaluation/{id}",
            get(move || {
                let e = evals.clone();
                async move { e.reply() }
            }),
        )
        .route(
            "/v1/evaluation/{id}/allocations",
            get(move || {
                let a = allocs.clone();
                async move { a.reply() }
            }),
        )
        .route(
            "/v1/allocation/{id}",
            get(move || {
                let f = full.clone();
                async move { json_reply(&f, 9) }
            }),
        )
}

#[tokio::test]
async fn job_run_shows_progress_and_exits_0_once_allocations_run() {
    let pending = alloc(ClientStatus::Pending, JobType::Service);
    let mut running = alloc(ClientStatus::Running, JobType::Service);
    running.client_description = "Tasks are running".into();
    let api = run_api(
        vec![eval(EvalStatus::Pending, JobType::Service), eval(EvalStatus::Complete, JobType::Service)],
        vec![json!([]), stubs(std::slice::from_ref(&pending)), stubs(&[pending]), stubs(&[running])],
        None,
    );
    let (api, log) = recorded(api);
    let addr = serve(api).await;
    let run = nomad(&["job", "run", "-address", &addr, &example("hello.nomad.hcl")]).await;
    run.expect_code(0)
        .stdout_has("Monitoring evaluation \"e0e0e0e0\"")
        .stdout_has("Evaluation triggered by job \"hello\"")
        .stdout_has("Allocation \"a1a1a1a1\" created: node \"f00df00d\", group \"greeter\"")
        .stdout_has("Evaluation status changed: \"pending\" -> \"complete\"")
        .stdout_has("Evaluation \"e0e0e0e0\" finished with status \"complete\"")
        .stdout_has("Allocation \"a1a1a1a1\" status changed: \"pending\" -> \"running\" (Tasks are running)")
        .stdout_has("All 1 allocation(s) of job \"hello\" are running");
    // Off a terminal: one line per change, no cursor movement.
    assert!(!run.stdout.contains('\x1b'), "{}", run.stdout);
    let reg = find(&log, "PUT", "/v1/jobs").expect("the job was registered");
    assert_eq!(reg.body["Job"]["ID"], "hello");
    assert_eq!(reg.body["Job"]["TaskGroups"][0]["Tasks"][0]["Driver"], "raw_exec");
    assert_eq!(reg.body["Submission"]["Format"], "hcl2");
    assert_eq!(reg.body["EnforceIndex"], false);
    let blocking = find(&log, "GET", &format!("/v1/evaluation/{EVAL}?index=")).expect("the eval is read with blocking queries");
    assert!(blocking.uri.contains("&wait="), "{}", blocking.uri);
}

#[tokio::test]
async fn job_run_exits_2_and_names_the_constraint_when_placement_fails() {
    let mut failed = eval(EvalStatus::Complete, JobType::Service);
    let mut m = AllocMetric { nodes_evaluated: 3, nodes_filtered: 2, nodes_exhausted: 1, coalesced_failures: 2, ..AllocMetric::default() };
    m.constraint_filtered.insert("${attr.kernel.name} = windows".into(), 2);
    m.dimension_exhausted.insert("memory".into(), 1);
    failed.failed_tg_allocs.insert("greeter".into(), m);
    failed.blocked_eval = "b10cb10c-0000-0000-0000-000000000000".into();
    let api = run_api(vec![eval(EvalStatus::Pending, JobType::Service), failed], vec![json!([])], None);
    let addr = serve(api).await;
    nomad(&["job", "run", "-address", &addr, &example("hello.nomad.hcl")])
        .await
        .expect_code(2)
        .stdout_has("Evaluation \"e0e0e0e0\" finished with status \"complete\" but failed to place all allocations:")
        .stdout_has("Task Group \"greeter\" (failed to place 3 allocations):")
        .stdout_has("* Constraint \"${attr.kernel.name} = windows\": 2 nodes excluded by filter")
        .stdout_has("* Resources exhausted on 1 nodes")
        .stdout_has("* Dimension \"memory\" exhausted on 1 nodes")
        .stdout_has("Evaluation \"b10cb10c\" waiting for additional capacity to place remainder");
}

#[tokio::test]
async fn job_run_exits_2_with_the_task_events_when_an_allocation_fails() {
    let pending = alloc(ClientStatus::Pending, JobType::Batch);
    let failed_stub = alloc(ClientStatus::Failed, JobType::Batch);
    let mut full = failed_stub.clone();
    full.client_description = "Failed tasks".into();
    full.task_states = Some(BTreeMap::from([(
        "hello".to_string(),
        TaskState {
            state: "dead".into(),
            failed: true,
            events: vec![
                TaskEvent { event_type: "Received".into(), time: 1_700_000_000_000_000_000, ..TaskEvent::default() },
                TaskEvent {
                    event_type: "Driver Failure".into(),
                    time: 1_700_000_001_000_000_000,
                    driver_error: "exec: \"/bin/nope\": no such file".into(),
                    ..TaskEvent::default()
                },
            ],
            ..TaskState::default()
        },
    )]));
    let api = run_api(
        vec![eval(EvalStatus::Complete, JobType::Batch)],
        vec![stubs(std::slice::from_ref(&pending)), stubs(&[pending]), stubs(&[failed_stub])],
        Some(full),
    );
    let addr = serve(api).await;
    nomad(&["job", "run", "-verbose", "-address", &addr, &example("hello.nomad.hcl")])
        .await
        .expect_code(2)
        .stdout_has("Waiting for 1 allocation(s) to be complete")
        .stdout_has(&format!("Allocation \"{ALLOC}\" status changed: \"pending\" -> \"failed\""))
        .stdout_has(&format!("Allocation \"{ALLOC}\" failed (Failed tasks)"))
        .stdout_has("Task \"hello\" is \"failed\"; recent events:")
        .stdout_has("Failed to start task: exec: \"/bin/nope\": no such file")
        .stdout_has(&format!("nomad-rs alloc status {ALLOC}"));
}

const DEPLOYMENT: &str = "d0d0d0d0-1111-2222-3333-444444444444";
const ROLLBACK: &str = "d1d1d1d1-1111-2222-3333-444444444444";

fn deployment(id: &str, status: &str, description: &str, healthy: i64, auto_revert: bool) -> Value {
    let group =
        nomad_proto::DeploymentState { auto_revert, desired_total: 1, placed_allocs: 1, healthy_allocs: healthy, ..Default::default() };
    json!(nomad_proto::Deployment {
        id: id.into(),
        namespace: "default".into(),
        job_id: "hello".into(),
        status: status.into(),
        status_description: description.into(),
        task_groups: BTreeMap::from([("greeter".to_string(), group)]),
        create_index: if id == ROLLBACK { 20 } else { 10 },
        ..Default::default()
    })
}

/// A fake API for `job run` of a job whose eval rolled out in [`DEPLOYMENT`]: it answers with
/// `first` in turn; [`ROLLBACK`] (the job's latest deployment) with `rollback`.
fn deployment_api(first: Vec<Value>, rollback: Value) -> Router {
    let mut e = eval(EvalStatus::Complete, JobType::Service);
    e.deployment_id = DEPLOYMENT.into();
    let first = Seq::new(first);
    let latest = rollback.clone();
    run_api(vec![e], vec![json!([])], None)
        .route(
            "/v1/deployment/{id}",
            get(move |axum::extract::Path(id): axum::extract::Path<String>| {
                let (first, rollback) = (first.clone(), rollback.clone());
                async move { if id == DEPLOYMENT { first.reply() } else { json_reply(&rollback, 30) } }
            }),
        )
        .route("/v1/deployment/allocations/{id}", get(|| async { json_reply(&json!([]), 30) }))
        .route(
            "/v1/job/{id}/deployment",
            get(move || {
                let l = latest.clone();
                async move { json_reply(&l, 30) }
            }),
        )
}

#[tokio::test]
async fn job_run_follows_the_deployment_and_exits_0_once_it_succeeds() {
    let api = deployment_api(
        vec![
            deployment(DEPLOYMENT, "running", "Deployment is running", 0, false),
            deployment(DEPLOYMENT, "successful", "Deployment completed successfully", 1, false),
        ],
        Value::Null,
    );
    let addr = serve(api).await;
    let run = nomad(&["job", "run", "-address", &addr, &example("hello.nomad.hcl")]).await;
    run.expect_code(0)
        .stdout_has("Evaluation \"e0e0e0e0\" finished with status \"complete\"")
        .stdout_has("Monitoring deployment \"d0d0d0d0\"")
        .stdout_has("Status      = running")
        .stdout_has("Description = Deployment completed successfully")
        .stdout_has("Task Group  Desired  Placed  Healthy  Unhealthy\ngreeter     1        1       1        0")
        .stdout_has("  ✓ Deployment \"d0d0d0d0\" successful");
    assert!(!run.stdout.contains("allocation(s) of job"), "the deployment, not the allocs, decides: {}", run.stdout);
}

#[tokio::test]
async fn job_run_exits_1_when_the_deployment_fails_and_follows_the_rollback() {
    let api = deployment_api(
        vec![deployment(DEPLOYMENT, "failed", "Failed due to unhealthy allocations - rolling back to job version 0", 0, true)],
        deployment(ROLLBACK, "successful", "Deployment completed successfully", 1, true),
    );
    let addr = serve(api).await;
    nomad(&["job", "run", "-verbose", "-address", &addr, &example("hello.nomad.hcl")])
        .await
        .expect_code(1)
        .stdout_has(&format!("  ! Deployment \"{DEPLOYMENT}\" failed"))
        .stdout_has("Allocations\nNo allocations placed")
        .stdout_has(&format!("Monitoring rollback deployment \"{ROLLBACK}\""))
        .stdout_has(&format!("  ✓ Deployment \"{ROLLBACK}\" successful"));
}

#[tokio::test]
async fn job_plan_prints_the_diff_and_exits_1_when_allocations_would_change() {
    let plan = json!({
        "Annotations": {"DesiredTGUpdates": {"greeter": {"Place": 1, "Ignore": 0}}, "PreemptedAllocs": null},
        "FailedTGAllocs": null,
        "JobModifyIndex": 0,
        "CreatedEvals": null,
        "Diff": {"Type": "Added", "ID": "hello", "Fields": null, "Objects": null,
                 "TaskGroups": [{"Type": "Added", "Name": "greeter", "Updates": {"create": 1}, "Fields": null, "Objects": null,
                                 "Tasks": [{"Type": "Added", "Name": "hello", "Annotations": null, "Fields": null, "Objects": null}]}]},
        "Warnings": "",
    });
    let (api, log) = recorded(Router::new().route(
        "/v1/job/{id}/plan",
        put(move || {
            let p = plan.clone();
            async move { json_reply(&p, 3) }
        }),
    ));
    let addr = serve(api).await;
    let file = example("hello.nomad.hcl");
    nomad(&["job", "plan", "-address", &addr, &file])
        .await
        .expect_code(1)
        .stdout_has("+ Job: \"hello\"")
        .stdout_has("+ Task Group: \"greeter\" (1 create)")
        .stdout_has("  + Task: \"hello\"")
        .stdout_has("Scheduler dry-run:\n- All tasks successfully allocated.")
        .stdout_has("Job Modify Index: 0")
        .stdout_has(&format!("nomad-rs job run -check-index 0 {file}"));
    let req = find(&log, "PUT", "/v1/job/hello/plan").unwrap();
    assert_eq!(req.body["Diff"], true);
    assert_eq!(req.body["Job"]["ID"], "hello");
}

#[tokio::test]
async fn job_plan_exits_0_when_nothing_changes() {
    let plan = json!({"Annotations": {"DesiredTGUpdates": {"greeter": {"Ignore": 1}}}, "Diff": {"Type": "None", "ID": "hello"}, "JobModifyIndex": 7});
    let api = Router::new().route(
        "/v1/job/{id}/plan",
        put(move || {
            let p = plan.clone();
            async move { json_reply(&p, 3) }
        }),
    );
    let addr = serve(api).await;
    nomad(&["job", "plan", "-diff=false", "-address", &addr, &example("hello.nomad.hcl")])
        .await
        .expect_code(0)
        .stdout_has("Job Modify Index: 7");
}

fn node(drain: bool) -> Value {
    let mut n = nomad_server::testing::node(NODE);
    n.secret_id.clear();
    if drain {
        n.drain_strategy = Some(DrainStrategy { deadline: 3_600_000_000_000, ..DrainStrategy::default() });
    }
    json!(n)
}

fn node_list() -> Value {
    json!([nomad_server::testing::node(NODE).stub(Default::default())])
}

#[tokio::test]
async fn node_drain_sends_the_spec_and_follows_the_allocations_off_the_node() {
    let running = alloc(ClientStatus::Running, JobType::Service);
    let mut migrating = running.clone();
    migrating.desired_transition.migrate = Some(true);
    migrating.desired_status = DesiredStatus::Stop;
    let mut done = migrating.clone();
    done.client_status = ClientStatus::Complete;
    let nodes = Seq::new(vec![node_list()]);
    let node_reads = Seq::new(vec![node(true), node(true), node(false)]);
    let allocs = Seq::new(vec![json!([running]), json!([migrating]), json!([done])]);
    let api = Router::new()
        .route(
            "/v1/nodes",
            get(move || {
                let n = nodes.clone();
                async move { n.reply() }
            }),
        )
        .route(
            "/v1/node/{id}",
            get(move || {
                let n = node_reads.clone();
                async move { n.reply() }
            }),
        )
        .route(
            "/v1/node/{id}/allocations",
            get(move || {
                let a = allocs.clone();
                async move { a.reply() }
            }),
        )
        .route(
            "/v1/node/{id}/drain",
            put(|| async { json_reply(&json!({"NodeModifyIndex": 8, "EvalIDs": [], "EvalCreateIndex": 0, "Index": 8}), 8) }),
        );
    let (api, log) = recorded(api);
    let addr = serve(api).await;
    nomad(&["node", "drain", "-enable", "-yes", "-address", &addr, "f00d"])
        .await
        .expect_code(0)
        .stdout_has(&format!("Node \"{NODE}\" drain strategy set"))
        .stdout_has("Alloc \"a1a1a1a1\" marked for migration")
        .stdout_has("Alloc \"a1a1a1a1\" draining")
        .stdout_has("Alloc \"a1a1a1a1\" status running -> complete")
        .stdout_has(&format!("All allocations on node \"{NODE}\" have stopped"));
    let req = find(&log, "PUT", &format!("/v1/node/{NODE}/drain")).unwrap();
    assert_eq!(req.body["NodeID"], NODE);
    assert_eq!(req.body["DrainSpec"], json!({"Deadline": 3_600_000_000_000i64, "IgnoreSystemJobs": false}));
    assert_eq!(req.body["MarkEligible"], false);
}

#[tokio::test]
async fn node_drain_without_a_terminal_or_yes_refuses() {
    let nodes = Seq::new(vec![node_list()]);
    let api = Router::new().route(
        "/v1/nodes",
        get(move || {
            let n = nodes.clone();
            async move { n.reply() }
        }),
    );
    let (api, log) = recorded(api);
    let addr = serve(api).await;
    nomad(&["node", "drain", "-enable", "-address", &addr, "f00d"]).await.expect_code(1).stderr_has("without confirmation; pass -yes");
    assert!(find(&log, "PUT", "/v1/node/").is_none(), "nothing was changed");
}

/// A fake client agent: alloc lookup by prefix and full alloc, plus the logs and restart routes.
fn client_api(logs: &'static str) -> Router {
    let a = alloc(ClientStatus::Running, JobType::Service);
    let stub = json!([a.stub(AllocStubFields::default())]);
    let full = json!(a);
    Router::new()
        .route(
            "/v1/allocations",
            get(move || {
                let s = stub.clone();
                async move { json_reply(&s, 4) }
            }),
        )
        .route(
            "/v1/allocation/{id}",
            get(move || {
                let f = full.clone();
                async move { json_reply(&f, 4) }
            }),
        )
        .route("/v1/client/fs/logs/{id}", get(move || async move { logs }))
        .route("/v1/client/allocation/{id}/restart", put(|| async { json_reply(&json!({"Index": 0}), 0) }))
}

#[tokio::test]
async fn alloc_logs_tail_shows_the_last_lines_of_the_only_task() {
    let text: &'static str = Box::leak((1..=20).map(|i| format!("line {i}\n")).collect::<String>().into_boxed_str());
    let (api, log) = recorded(client_api(text));
    let addr = serve(api).await;
    let run = nomad(&["alloc", "logs", "-address", &addr, "-stderr", "-tail", "-n", "3", "a1a1"]).await;
    run.expect_code(0);
    assert_eq!(run.stdout, "line 18\nline 19\nline 20\n");
    let req = find(&log, "GET", &format!("/v1/client/fs/logs/{ALLOC}")).unwrap();
    for p in ["task=hello", "type=stderr", "plain=true", "follow=false", "origin=end"] {
        assert!(req.uri.contains(p), "{} lacks {p}", req.uri);
    }
    let all = nomad(&["alloc", "logs", "-address", &addr, ALLOC, "hello"]).await;
    all.expect_code(0);
    assert_eq!(all.stdout, text);
}

#[tokio::test]
async fn alloc_restart_asks_the_client_agent() {
    let (api, log) = recorded(client_api(""));
    let addr = serve(api).await;
    nomad(&["alloc", "restart", "-address", &addr, "-task", "hello", "a1a1"]).await.expect_code(0);
    let req = find(&log, "PUT", &format!("/v1/client/allocation/{ALLOC}/restart")).unwrap();
    assert_eq!(req.body, json!({"TaskName": "hello", "AllTasks": false}));
    nomad(&["alloc", "restart", "-address", &addr, "-task", "nope", "a1a1"])
        .await
        .expect_code(1)
        .stderr_has("Could not find task named: nope");
}

#[tokio::test]
async fn tokens_travel_in_the_header_from_the_flag_or_the_environment() {
    let nodes = Seq::new(vec![json!([])]);
    let (api, log) = recorded(Router::new().route(
        "/v1/nodes",
        get(move || {
            let n = nodes.clone();
            async move { n.reply() }
        }),
    ));
    let addr = serve(api).await;
    nomad(&["node", "status", "-address", &addr, "-token", "from-flag"]).await.expect_code(0).stdout_has("No nodes registered");
    crate::support::nomad_with(&["node", "status"], &[("NOMAD_ADDR", &addr), ("NOMAD_TOKEN", "from-env"), ("NOMAD_REGION", "eu")], "")
        .await
        .expect_code(0);
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0].token.as_deref(), Some("from-flag"));
    assert_eq!(seen[1].token.as_deref(), Some("from-env"));
    assert!(seen[1].uri.contains("region=eu"), "{}", seen[1].uri);
}

#[tokio::test]
async fn node_status_reads_a_full_node_document() {
    let nodes = Seq::new(vec![node_list()]);
    let full: Value = node(false);
    let _: Node = serde_json::from_value(full.clone()).unwrap();
    let allocs = Seq::new(vec![json!([alloc(ClientStatus::Running, JobType::Service)])]);
    let api = Router::new()
        .route(
            "/v1/nodes",
            get(move || {
                let n = nodes.clone();
                async move { n.reply() }
            }),
        )
        .route(
            "/v1/node/{id}",
            get(move || {
                let f = full.clone();
                async move { json_reply(&f, 2) }
            }),
        )
        .route(
            "/v1/node/{id}/allocations",
            get(move || {
                let a = allocs.clone();
                async move { a.reply() }
            }),
        );
    let addr = serve(api).await;
    nomad(&["node", "status", "-address", &addr, "f00d"])
        .await
        .expect_code(0)
        .stdout_has(&format!("ID            = {NODE}"))
        .stdout_has("Allocated Resources")
        .stdout_has("a1a1a1a1  f00df00d  greeter     0        run      running");
}

/// `monitor`: the agent's log frames to stdout (heartbeats print nothing), with the level and
/// format asked for; it ends when the agent ends the stream.
#[tokio::test]
async fn monitor_prints_the_agents_log_lines_at_the_level_asked() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let frames = format!(
        "{{\"Data\":\"{}\",\"FileEvent\":\"log\"}}{{}}{{\"Data\":\"{}\",\"FileEvent\":\"log\"}}",
        b64("2023-08-01T12:34:56.789Z [DEBUG] one\n"),
        b64("{\"@level\":\"debug\",\"@message\":\"two\"}\n")
    );
    let router = Router::new().route(
        "/v1/agent/monitor",
        get(move || {
            let frames = frames.clone();
            async move { ([("content-type", "application/json")], frames) }
        }),
    );
    let (router, log) = recorded(router);
    let addr = serve(router).await;
    let run = nomad(&["monitor", "-log-level", "debug", "-json", "-address", &addr]).await;
    run.expect_code(0);
    assert_eq!(run.stdout, "2023-08-01T12:34:56.789Z [DEBUG] one\n{\"@level\":\"debug\",\"@message\":\"two\"}\n");
    let seen = find(&log, "GET", "/v1/agent/monitor").expect("the monitor was asked for");
    assert!(seen.uri.contains("log_level=debug") && seen.uri.contains("log_json=true"), "{}", seen.uri);
}

#[tokio::test]
async fn monitor_reports_the_agents_refusal() {
    let router =
        Router::new().route("/v1/agent/monitor", get(|| async { (axum::http::StatusCode::BAD_REQUEST, "Unknown log level: loud") }));
    let addr = serve(router).await;
    nomad(&["monitor", "-log-level", "loud", "-address", &addr])
        .await
        .expect_code(1)
        .stderr_has("Error starting monitor: Unexpected response code: 400 (Unknown log level: loud)");
}
