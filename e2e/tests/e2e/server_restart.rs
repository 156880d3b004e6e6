//! A server killed with `kill -9` comes back with every acknowledged write.

use nomad_e2e::wait_for;

use crate::{SETTLE, job_json, single_server};

#[test]
fn a_killed_server_restarts_with_the_same_jobs_and_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = single_server(dir.path());
    let http = server.http();
    let mut evals = Vec::new();
    for i in 0..5 {
        let r = http.put_json("/v1/jobs", &job_json(&format!("web-{i}"))).unwrap();
        evals.push(r["EvalID"].as_str().unwrap().to_string());
    }
    // Let the scheduler finish with the registrations (no clients: the evals block).
    wait_for("every eval to be processed", SETTLE, || {
        let evals = http.get_json("/v1/evaluations").ok()?;
        let all = evals.as_array()?;
        (all.len() >= 5 && all.iter().all(|e| e["Status"] != "pending")).then_some(())
    })
    .unwrap();
    let before = http.get("/v1/jobs").unwrap();
    let jobs_before = before.json().unwrap();
    let index_before = before.index();
    assert_eq!(jobs_before.as_array().unwrap().len(), 5);

    for round in 0..3 {
        server.restart().unwrap();
        server.wait_for_leader(SETTLE).unwrap();
        let http = server.http();
        let after = http.get("/v1/jobs").unwrap();
        assert_eq!(after.index(), index_before, "round {round}: the jobs table index survives");
        let jobs_after = after.json().unwrap();
        let ids = |v: &serde_json::Value| {
            v.as_array().unwrap().iter().map(|j| (j["ID"].clone(), j["JobModifyIndex"].clone())).collect::<Vec<_>>()
        };
        assert_eq!(ids(&jobs_after), ids(&jobs_before), "round {round}");
        for e in &evals {
            let eval = http.get_json(&format!("/v1/evaluation/{e}")).unwrap();
            assert_eq!(eval["ID"], e.as_str());
        }
    }
    // Still writable after the restarts.
    let r = server.http().put_json("/v1/jobs", &job_json("after")).unwrap();
    assert!(r["Index"].as_u64().unwrap() > index_before);
}
