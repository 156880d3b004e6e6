//! The event stream survives a server restart: a subscriber that resumes
//! from its last index sees every later change once, in order.

use std::time::Duration;

use crate::{SETTLE, job_json, single_server};

#[test]
fn a_subscriber_resumes_across_a_server_restart_without_gaps_or_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = single_server(dir.path());
    let mut stream = server.http().stream_lines("/v1/event/stream?topic=Job", Duration::from_secs(20)).unwrap();
    assert_eq!(stream.next_line().unwrap(), "{}", "heartbeat first");
    let mut seen = Vec::new();
    for id in ["a", "b"] {
        server.http().put_json("/v1/jobs", &job_json(id)).unwrap();
        let b = stream.next_batch().unwrap();
        seen.push((b["Index"].as_u64().unwrap(), b["Events"][0]["Key"].as_str().unwrap().to_string()));
    }
    assert_eq!(seen.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
    let last = seen.last().unwrap().0;
    drop(stream);

    server.restart().unwrap();
    server.wait_for_leader(SETTLE).unwrap();
    server.http().put_json("/v1/jobs", &job_json("c")).unwrap();

    let mut resumed =
        server.http().stream_lines(&format!("/v1/event/stream?topic=Job&index={}", last + 1), Duration::from_secs(20)).unwrap();
    let b = resumed.next_batch().unwrap();
    assert!(b["Index"].as_u64().unwrap() > last, "nothing already seen comes back: {b}");
    assert_eq!(b["Events"][0]["Key"], "c");
    assert_eq!(b["Events"][0]["Type"], "JobRegistered");
}
