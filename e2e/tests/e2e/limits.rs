//! Admission limits against a real dev agent: a poison count is refused at register and at
//! plan, the process keeps answering, and `server { job_max_count }` reaches the server.

use nomad_e2e::{Agent, AgentOptions, wait_for};

use crate::{SETTLE, job_json};

fn dev_agent_with(dir: &std::path::Path, config: &str) -> Agent {
    let opts = AgentOptions { args: vec!["-dev".into()], config: Some(config.to_string()), ..Default::default() };
    let agent = Agent::start("dev", dir, opts).expect("start dev agent");
    agent.wait_for_leader(SETTLE).unwrap();
    let http = agent.http();
    wait_for("the dev node to be ready", SETTLE, || {
        http.get_json("/v1/nodes").ok()?.as_array()?.iter().any(|n| n["Status"] == "ready").then_some(())
    })
    .unwrap();
    agent
}

#[test]
fn a_count_of_2_31_is_refused_at_register_and_plan_and_the_agent_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let agent = dev_agent_with(dir.path(), "server {\n  job_max_count = 3\n}\n");
    let http = agent.http();
    let mut poison = job_json("poison");
    poison["Job"]["TaskGroups"][0]["Count"] = serde_json::json!(1u64 << 31);
    let body = poison.to_string();
    for path in ["/v1/jobs", "/v1/job/poison/plan"] {
        let r = http.request("PUT", path, Some(body.as_bytes())).unwrap();
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert_eq!(r.text(), "task group \"web\" count 2147483648 is greater than job_max_count (3)", "{path}");
    }
    // The configured limit, not the default, is the one enforced.
    let mut four = job_json("four");
    four["Job"]["TaskGroups"][0]["Count"] = serde_json::json!(4);
    let r = http.request("PUT", "/v1/jobs", Some(four.to_string().as_bytes())).unwrap();
    assert_eq!((r.status, r.text()), (400, "task group \"web\" count 4 is greater than job_max_count (3)".to_string()));
    // Still up, still leading, and still scheduling.
    assert_eq!(http.get("/v1/status/leader").unwrap().status, 200);
    let ok = http.put_json("/v1/jobs", &job_json("fine")).unwrap();
    assert!(!ok["EvalID"].as_str().unwrap_or_default().is_empty(), "{ok}");
    wait_for("the fine job's alloc to be placed", SETTLE, || {
        http.get_json("/v1/job/fine/allocations").ok()?.as_array().filter(|a| !a.is_empty()).map(|_| ())
    })
    .unwrap();
    assert!(http.get_json("/v1/jobs").unwrap().as_array().unwrap().iter().all(|j| j["ID"] != "poison"), "nothing poison was stored");
}
