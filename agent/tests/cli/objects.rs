//! Node, allocation, evaluation, server and prefix-search commands against in-process servers.

use std::time::Duration;

use nomad_server::http::AgentInfo;
use nomad_server::server::{Server, ServerConfig};
use nomad_server::testing;

use crate::support::{Api, example, nomad, serve};

/// A server with node `n1` and a running alloc of `hello` on it.
async fn cluster() -> (Api, nomad_proto::Allocation) {
    let api = Api::start().await;
    api.server.register_node(testing::node("4e0d0001-aaaa-bbbb-cccc-000000000001")).await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let alloc = api.place("hello", "4e0d0001-aaaa-bbbb-cccc-000000000001", 0).await;
    (api, alloc)
}

#[tokio::test]
async fn node_status_lists_nodes_and_shows_one_by_prefix() {
    let (api, alloc) = cluster().await;
    api.nomad(&["node", "status"])
        .await
        .expect_code(0)
        .stdout_has("ID        Node Pool  DC   Name                                  Class   Drain  Eligibility  Status")
        .stdout_has("4e0d0001  default    dc1  4e0d0001-aaaa-bbbb-cccc-000000000001  <none>  false  eligible     initializing");
    api.nomad(&["node", "status", "4e0d"])
        .await
        .expect_code(0)
        .stdout_has("ID            = 4e0d0001-aaaa-bbbb-cccc-000000000001")
        .stdout_has("Eligibility   = eligible")
        .stdout_has("Driver Status = raw_exec")
        .stdout_has("Allocated Resources\nCPU")
        .stdout_has(&format!(
            "Allocations\nID        Node ID   Task Group  Version  Desired  Status   Created  Modified\n{}",
            &alloc.id[..8]
        ));
    let json = api.nomad(&["node", "status", "-json", "4e0d"]).await;
    json.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["ID"], "4e0d0001-aaaa-bbbb-cccc-000000000001");
    assert_eq!(v["SecretID"], "", "no secret leaves the server");
    api.nomad(&["node", "status", "ffff"]).await.expect_code(1).stderr_has("No node(s) with prefix \"ffff\" found");
    api.nomad(&["node", "status", "4"]).await.expect_code(1).stderr_has("Identifier must contain at least two characters.");
}

#[tokio::test]
async fn node_eligibility_and_drain_toggle_through_the_cli() {
    let (api, _) = cluster().await;
    api.nomad(&["node", "eligibility", "-disable", "4e0d"])
        .await
        .expect_code(0)
        .stdout_has("Node \"4e0d0001-aaaa-bbbb-cccc-000000000001\" scheduling eligibility set: ineligible for scheduling");
    api.nomad(&["node", "status", "4e0d"]).await.expect_code(0).stdout_has("Eligibility   = ineligible");
    api.nomad(&["node", "eligibility", "4e0d"]).await.expect_code(1).stderr_has("<-enable|-disable>");
    api.nomad(&["node", "drain", "-enable", "-yes", "-detach", "4e0d"])
        .await
        .expect_code(0)
        .stdout_has("Node \"4e0d0001-aaaa-bbbb-cccc-000000000001\" drain strategy set");
    api.nomad(&["node", "status", "4e0d"]).await.expect_code(0).stdout_has("Drain         = true");
    api.nomad(&["node", "drain", "-disable", "-yes", "4e0d"]).await.expect_code(0).stdout_has("drain strategy unset");
    api.nomad(&["node", "status", "4e0d"]).await.expect_code(0).stdout_has("Drain         = false");
}

#[tokio::test]
async fn eval_status_shows_the_eval_and_its_placed_allocations() {
    let (api, alloc) = cluster().await;
    api.nomad(&["eval", "status", &alloc.eval_id[..6]])
        .await
        .expect_code(0)
        .stdout_has(&format!("ID                 = {}", &alloc.eval_id[..8]))
        .stdout_has("Status             = complete")
        .stdout_has("TriggeredBy        = job-register")
        .stdout_has("Job ID             = hello")
        .stdout_has("Placement Failures = false")
        .stdout_has(&format!(
            "Placed Allocations\nID        Node ID   Task Group  Version  Desired  Status   Created  Modified\n{}",
            &alloc.id[..8]
        ));
    let json = api.nomad(&["eval", "status", "-json", &alloc.eval_id]).await;
    json.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["ID"], alloc.eval_id.as_str());
}

#[tokio::test]
async fn alloc_status_shows_tasks_and_events() {
    let (api, alloc) = cluster().await;
    api.nomad(&["alloc", "status", &alloc.id[..5]])
        .await
        .expect_code(0)
        .stdout_has(&format!("ID                  = {}", &alloc.id[..8]))
        .stdout_has("Name                = hello.greeter[0]")
        .stdout_has("Client Status       = running")
        .stdout_has("Task \"hello\" is \"running\"")
        .stdout_has("Recent Events:\nTime")
        .stdout_has("Started   Task started by client")
        .stdout_has("Received  Task received by client");
    api.nomad(&["alloc", "status", "-verbose", &alloc.id]).await.expect_code(0).stdout_has(&format!("ID                  = {}", alloc.id));
}

#[tokio::test]
async fn alloc_commands_on_routes_this_server_lacks_explain_themselves() {
    let (api, alloc) = cluster().await;
    api.nomad(&["alloc", "logs", &alloc.id[..8]]).await.expect_code(1).stderr_has("this agent does not serve task logs yet");
    api.nomad(&["alloc", "restart", &alloc.id[..8]]).await.expect_code(1).stderr_has("this agent does not serve allocation restarts yet");
}

#[tokio::test]
async fn alloc_stop_detach_prints_the_eval_it_created() {
    let (api, alloc) = cluster().await;
    let run = api.nomad(&["alloc", "stop", "-detach", &alloc.id[..8]]).await;
    run.expect_code(0);
    let eval_id = run.stdout.trim();
    let snap = api.server.store.snapshot();
    let eval = snap.eval(eval_id).unwrap_or_else(|| panic!("no eval {eval_id:?}"));
    assert_eq!(eval.job_id, "hello");
    assert_eq!(eval.triggered_by, "alloc-stop");
}

#[tokio::test]
async fn ambiguous_prefixes_list_the_candidates() {
    let (api, first) = cluster().await;
    let node = "4e0d0001-aaaa-bbbb-cccc-000000000001";
    api.place_as("hello", node, 1, "abab0001-0000-0000-0000-000000000001").await;
    api.place_as("hello", node, 2, "abab0002-0000-0000-0000-000000000002").await;
    api.nomad(&["alloc", "status", "abab"])
        .await
        .expect_code(1)
        .stderr_has("Prefix matched multiple allocations\n\nID")
        .stderr_has("abab0001-0000-0000-0000-000000000001")
        .stderr_has("abab0002-0000-0000-0000-000000000002");
    // Across kinds: a job named after the start of an eval ID.
    let eval = &first.eval_id[..4];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j.hcl");
    let text = std::fs::read_to_string(example("hello.nomad.hcl")).unwrap().replace("job \"hello\"", &format!("job \"{eval}-job\""));
    std::fs::write(&path, text).unwrap();
    api.nomad(&["job", "run", "-detach", path.to_str().unwrap()]).await.expect_code(0);
    api.nomad(&["status", eval])
        .await
        .expect_code(1)
        .stderr_has(&format!("Prefix \"{eval}\" matched objects of several kinds:"))
        .stderr_has(&format!("Jobs\n  {eval}-job"))
        .stderr_has(&format!("{}  (job hello)", &first.eval_id[..8]));
}

#[tokio::test]
async fn status_shows_whatever_kind_the_prefix_names() {
    let (api, alloc) = cluster().await;
    api.nomad(&["status"]).await.expect_code(0).stdout_has("hello  service  50");
    api.nomad(&["status", "hello"]).await.expect_code(0).stdout_has("ID            = hello");
    api.nomad(&["status", "4e0d0001"]).await.expect_code(0).stdout_has("ID            = 4e0d0001-aaaa-bbbb-cccc-000000000001");
    api.nomad(&["status", &alloc.id]).await.expect_code(0).stdout_has("Task \"hello\" is \"running\"");
    api.nomad(&["status", "zz-nothing"])
        .await
        .expect_code(1)
        .stderr_has("No job, node, allocation or evaluation with prefix or id \"zz-nothing\" found");
}

#[tokio::test]
async fn server_members_marks_the_raft_leader() {
    let dir = tempfile::tempdir().unwrap();
    let rpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let rpc_addr = rpc.local_addr().unwrap();
    let srv = Server::start(ServerConfig::new(dir.path(), rpc_addr.to_string()), rpc).await.unwrap();
    assert!(srv.wait_for_leadership(Duration::from_secs(20)).await, "a single server elects itself");
    let info = AgentInfo {
        name: "srv1".into(),
        region: "global".into(),
        datacenter: "dc1".into(),
        addr: "127.0.0.1".into(),
        port: rpc_addr.port(),
        server: true,
        ..AgentInfo::default()
    };
    let addr = serve(srv.http_router(info)).await;
    nomad(&["server", "members", "-address", &addr])
        .await
        .expect_code(0)
        .stdout_has("Name         Address    Port")
        .stdout_has(&format!("srv1.global  127.0.0.1  {}  alive   true    -             1.6.1  dc1         global", rpc_addr.port()));
    // A job submitted through Raft shows up too.
    nomad(&["job", "run", "-detach", "-address", &addr, &example("hello.nomad.hcl")]).await.expect_code(0);
    nomad(&["job", "status", "-address", &addr]).await.expect_code(0).stdout_has("hello  service  50");
    srv.shutdown().await;
}

#[tokio::test]
async fn service_list_and_info_show_registrations_and_an_unknown_service_exits_1() {
    let (api, alloc) = cluster().await;
    api.nomad(&["service", "list"]).await.expect_code(0).stdout_has("No service registrations found");
    let node = api.server.store.snapshot().node(&alloc.node_id).map(|n| (**n).clone()).unwrap();
    let reg = nomad_proto::ServiceRegistration {
        id: format!("_nomad-task-{}-group-g-hello-web-http", alloc.id),
        service_name: "hello-web".into(),
        namespace: "default".into(),
        node_id: node.id.clone(),
        datacenter: "dc1".into(),
        job_id: "hello".into(),
        alloc_id: alloc.id.clone(),
        tags: vec!["v1".into(), "edge".into()],
        address: "10.0.0.7".into(),
        port: 23456,
        ..Default::default()
    };
    api.server
        .endpoints
        .service_upsert(nomad_proto::rpc::ServiceRegistrationUpsertRequest {
            services: vec![reg],
            node_id: node.id.clone(),
            secret_id: node.secret_id.clone(),
        })
        .await
        .unwrap();

    api.nomad(&["service", "list"]).await.expect_code(0).stdout_has("Service Name  Tags\nhello-web     [v1,edge]");
    api.nomad(&["service", "list", "-namespace", "*"])
        .await
        .expect_code(0)
        .stdout_has("Service Name  Namespace  Tags\nhello-web     default    [v1,edge]");
    let short = &alloc.id[..8];
    api.nomad(&["service", "info", "hello-web"])
        .await
        .expect_code(0)
        .stdout_has("Job ID  Address         Tags       Node ID   Alloc ID")
        .stdout_has(&format!("hello   10.0.0.7:23456  [v1,edge]  4e0d0001  {short}"));
    api.nomad(&["service", "info", "-verbose", "hello-web"]).await.expect_code(0).stdout_has(&format!("Alloc ID     = {}", alloc.id));
    let run = api.nomad(&["service", "info", "-json", "hello-web"]).await;
    run.expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!((v[0]["ServiceName"].as_str(), v[0]["Port"].as_i64()), (Some("hello-web"), Some(23456)));

    api.nomad(&["service", "info", "nope"]).await.expect_code(1).stderr_has("No service registrations with name \"nope\" found");
    api.nomad(&["service", "info"]).await.expect_code(1).stderr_has("<SERVICE_NAME>");
    api.nomad(&["service", "info", "-json", "nope"]).await.expect_code(1).stderr_has("No service registrations with name \"nope\" found");
}

#[tokio::test]
async fn system_reconcile_summaries_asks_the_servers_and_prints_nothing() {
    let ts = testing::TestServer::new();
    let (router, log) = crate::support::recorded(ts.router());
    let addr = serve(router).await;
    let run = nomad(&["system", "reconcile", "summaries", "-address", &addr]).await;
    run.expect_code(0);
    assert_eq!(run.stdout, "");
    assert!(crate::support::find(&log, "PUT", "/v1/system/reconcile/summaries").is_some());
    let closed = format!("http://127.0.0.1:{}", crate::support::closed_port());
    let bad = nomad(&["system", "reconcile", "summaries", "-address", &closed]).await;
    bad.expect_code(1).stderr_has("Error running system summary reconciliation");
}

#[tokio::test]
async fn namespaces_are_applied_listed_shown_and_deleted_through_the_cli() {
    let api = Api::start().await;
    api.nomad(&["namespace", "apply", "-description", "team a", "prod"])
        .await
        .expect_code(0)
        .stdout_has("Successfully applied namespace \"prod\"!");
    let list = api.nomad(&["namespace", "list"]).await;
    list.expect_code(0);
    let rows: Vec<Vec<&str>> = list.stdout.lines().map(|l| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect()).collect();
    assert_eq!(rows[0], ["Name", "Description"]);
    assert!(rows.contains(&vec!["prod", "team a"]), "{}", list.stdout);
    api.nomad(&["namespace", "status", "pro"])
        .await
        .expect_code(0)
        .stdout_has("Name            = prod")
        .stdout_has("Description     = team a");

    // A specification file, with meta; a flag given with it is ignored, with a warning.
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("ns.hcl");
    std::fs::write(&spec, "name = \"batch\"\ndescription = \"nightly\"\nmeta {\n  owner = \"ops\"\n}\n").unwrap();
    api.nomad(&["namespace", "apply", "-description", "x", spec.to_str().unwrap()])
        .await
        .expect_code(0)
        .stderr_has("Flags are ignored when a file is specified!");
    let ns = api.server.store.snapshot().namespace("batch").cloned().expect("applied");
    assert_eq!((ns.description.as_str(), ns.meta.get("owner").map(String::as_str)), ("nightly", Some("ops")));
    api.nomad(&["namespace", "status", "batch"]).await.expect_code(0).stdout_has("Metadata").stdout_has("owner = ops");
    std::fs::write(&spec, "name = \"gpu\"\ncapabilities {\n  enabled_task_drivers = [\"docker\"]\n}\n").unwrap();
    api.nomad(&["namespace", "apply", spec.to_str().unwrap()]).await.expect_code(1).stderr_has("capabilities");
    assert!(api.server.store.snapshot().namespace("gpu").is_none(), "nothing half applied");
    api.nomad(&["namespace", "apply", "-quota", "q1", "gpu"]).await.expect_code(1).stderr_has("Nomad Enterprise");

    api.nomad(&["namespace", "delete", "prod"]).await.expect_code(0).stdout_has("Successfully deleted namespace \"prod\"!");
    api.nomad(&["namespace", "status", "prod"]).await.expect_code(1).stderr_has("matched no namespaces");
    api.nomad(&["namespace", "delete", "default"]).await.expect_code(1).stderr_has("default namespace can not be deleted");
}
