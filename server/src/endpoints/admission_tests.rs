//! Admission: the limits and rules `Job.Register`, `Job.Plan` and `Node.Register` apply
//! before anything is written or scheduled.

use nomad_proto::rpc::NodeRegisterRequest;
use nomad_proto::{Job, JobLimits};

use super::{EndpointConfig, EndpointError, Endpoints};
use crate::testing::{TestServer, job, node};

fn huge_count_job() -> Job {
    job("web", 1 << 31)
}

#[tokio::test]
async fn a_count_of_2_31_is_refused_at_register_and_plan_naming_the_field_and_the_limit() {
    let ts = TestServer::new();
    ts.register_node(node("n1")).await;
    let want = "task group \"web\" count 2147483648 is greater than job_max_count (50000)";
    let e = ts.endpoints.job_register(huge_count_job(), Default::default()).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest(want.into()));
    // The plan is refused before the scheduler runs: it used to allocate per unit of count.
    let e = ts.endpoints.job_plan(huge_count_job(), false).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest(want.into()));
    assert!(ts.store.snapshot().job("default", "web").is_none(), "nothing was stored");
    // And the server carries on.
    ts.endpoints.job_register(job("web", 2), Default::default()).await.unwrap();
    ts.endpoints.job_plan(job("web", 3), false).await.unwrap();
}

#[tokio::test]
async fn the_configured_job_max_count_is_the_one_enforced() {
    let ts = TestServer::new();
    let config = EndpointConfig { job_limits: JobLimits { max_count: 4 }, ..EndpointConfig::default() };
    let endpoints = Endpoints::new(ts.store.clone(), ts.consensus.clone(), ts.endpoints.heartbeats().clone(), config);
    let mut two_groups = job("web", 3);
    let mut second = two_groups.task_groups[0].clone();
    second.name = "api".into();
    second.count = 2;
    two_groups.task_groups.push(second);
    let e = endpoints.job_register(two_groups, Default::default()).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest("total count of the job's task groups (5) is greater than job_max_count (4)".into()));
    endpoints.job_register(job("web", 4), Default::default()).await.unwrap();
}

#[tokio::test]
async fn two_tasks_asking_5e18_mhz_are_refused_before_their_sum_could_wrap() {
    let ts = TestServer::new();
    let mut j = job("greedy", 1);
    let mut second = j.task_groups[0].tasks[0].clone();
    second.name = "second".into();
    j.task_groups[0].tasks.push(second);
    for t in &mut j.task_groups[0].tasks {
        t.resources.cpu = 5_000_000_000_000_000_000;
    }
    let e = ts.endpoints.job_register(j, Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("Task server validation failed: maximum CPU value is 4294967296; got 5000000000000000000"), "{e}");
    assert!(e.contains("Task second validation failed: maximum CPU value is 4294967296"), "{e}");
    assert!(ts.store.snapshot().job("default", "greedy").is_none());
}

#[tokio::test]
async fn ids_and_names_with_control_characters_or_dot_dot_are_refused() {
    let ts = TestServer::new();
    let mut dotdot = job("web", 1);
    dotdot.task_groups[0].tasks[0].name = "..".into();
    let e = ts.endpoints.job_register(dotdot, Default::default()).await.unwrap_err().to_string();
    assert!(e.contains("Task .. validation failed: Task name cannot be \"..\""), "{e}");
    for id in ["evil\n2024-01-01T00:00:00Z[INFO]forged", "\u{1b}]0;title\u{7}", "bidi\u{202e}"] {
        let e = ts.endpoints.job_register(job(id, 1), Default::default()).await.unwrap_err().to_string();
        assert!(e.contains("Job ID contains a control character"), "{id:?}: {e}");
        assert!(!e.contains(id), "the refusal echoes the ID raw: {e:?}");
    }
    assert_eq!(ts.store.snapshot().jobs().count(), 0);
}

#[tokio::test]
async fn oversized_or_malformed_node_registrations_are_refused() {
    let ts = TestServer::new();
    let mut absurd = node("n1");
    absurd.reserved_resources = Some(nomad_proto::resources::NodeReservedResources {
        cpu: nomad_proto::resources::NodeReservedCpuResources { cpu_shares: i64::MAX, ..Default::default() },
        ..Default::default()
    });
    let e = ts.endpoints.node_register(NodeRegisterRequest { node: absurd, ..Default::default() }).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest(format!("node reserved CPU (MHz) must be between 0 and 4294967296; got {}", i64::MAX)));
    let mut huge = node("n1");
    if let Some(r) = huge.node_resources.as_mut() {
        r.memory.memory_mb = -5;
    }
    assert!(ts.endpoints.node_register(NodeRegisterRequest { node: huge, ..Default::default() }).await.is_err());
    let mut escape = node("n1");
    escape.name = "\u{1b}[2Jhost".into();
    let e = ts.endpoints.node_register(NodeRegisterRequest { node: escape, ..Default::default() }).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest("node name \"\\u{1b}[2Jhost\" contains a control character".into()));
    let mut many = node("n1");
    many.attributes = (0..=nomad_proto::limits::MAX_NODE_ATTRIBUTES).map(|i| (format!("a{i}"), String::new())).collect();
    let e = ts.endpoints.node_register(NodeRegisterRequest { node: many, ..Default::default() }).await.unwrap_err();
    assert_eq!(e, EndpointError::BadRequest("node \"n1\" attributes has 4097 entries, more than the limit of 4096".into()));
    assert_eq!(ts.store.snapshot().nodes().count(), 0, "nothing was registered");
    ts.register_node(node("n1")).await;
}
