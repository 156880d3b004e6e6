//! The group network's `dns {}` is what an exec task reads as `/etc/resolv.conf` (Nomad's
//! resolvconf mount), while the host's file stays as it was.

use nomad_proto::job::JobType;
use nomad_proto::resources::{DnsConfig, NetworkResource};
use nomad_testkit::Prereq;

use crate::support::{TestServer, job, log_file, restart_policy, sh_task, start_client, wait_for, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_task_reads_the_groups_dns_as_its_resolv_conf() {
    nomad_testkit::require_prereqs!(Prereq::Root);
    let host_before = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let server = TestServer::start().await;
    let root = tempfile::tempdir().unwrap();
    let client = start_client(root.path(), &server).await;
    wait_ready(&server, &client).await;

    let mut task = sh_task("web", "cat /etc/resolv.conf; echo done >&2; sleep 60");
    task.driver = "exec".into();
    let mut job = job("dns", JobType::Service, vec![task], restart_policy(0, 0));
    job.task_groups[0].networks = vec![NetworkResource {
        dns: Some(DnsConfig { servers: vec!["192.0.2.53".into()], searches: vec!["svc.example".into()], options: vec!["ndots:1".into()] }),
        ..NetworkResource::default()
    }];
    let id = server.place(&job, client.node_id()).await;
    let seen = wait_for("the task printed its resolv.conf", || {
        log_file(root.path(), &id, "web", "stderr").contains("done").then(|| log_file(root.path(), &id, "web", "stdout"))
    })
    .await;
    assert!(seen.contains("nameserver 192.0.2.53\nsearch svc.example\noptions ndots:1\n"), "the task saw: {seen}");
    assert_eq!(seen.matches("nameserver").count(), 1, "only the job's server: {seen}");
    assert_eq!(std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(), host_before, "the host's file is untouched");
    client.shutdown_destroying_allocs().await;
}
