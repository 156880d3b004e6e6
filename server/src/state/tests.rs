use std::sync::Arc;
use std::time::Duration;

use nomad_proto::{Allocation, ClientStatus, EvalStatus, Evaluation, Job, JobStatus, Node, NodeStatus, TaskGroup, Timestamp};

use super::*;

fn job(id: &str) -> Job {
    let mut j = Job { id: id.into(), task_groups: vec![TaskGroup { name: "g".into(), ..TaskGroup::default() }], ..Job::default() };
    j.canonicalize();
    j
}

fn alloc(id: &str, job: &Job, node: &str) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: job.namespace.clone(),
        job_id: job.id.clone(),
        job: Some(Arc::new(job.clone())),
        task_group: "g".into(),
        node_id: node.into(),
        name: format!("{}.g[0]", job.id),
        ..Allocation::default()
    }
}

#[test]
fn snapshots_are_isolated_from_later_writes() {
    let store = StateStore::new();
    store.write(1, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let before = store.snapshot();
    store.write(2, |tx| tx.upsert_job(job("b")).map(|_| ())).unwrap();
    store.write(3, |tx| tx.delete_job("default", "a")).unwrap();
    assert!(before.job("default", "a").is_some());
    assert!(before.job("default", "b").is_none());
    assert_eq!(before.table_index(Table::Jobs), 1);
    let after = store.snapshot();
    assert!(after.job("default", "a").is_none());
    assert_eq!(after.table_index(Table::Jobs), 3);
}

#[test]
fn a_failed_transaction_changes_nothing() {
    let store = StateStore::new();
    store.write(1, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let err = store
        .write(2, |tx| {
            tx.upsert_job(job("b"))?;
            tx.delete_job("default", "missing")
        })
        .unwrap_err();
    assert!(err.0.contains("job not found"));
    let s = store.snapshot();
    assert!(s.job("default", "b").is_none(), "partial writes are discarded");
    assert_eq!(s.table_index(Table::Jobs), 1);
}

#[tokio::test]
async fn blocking_queries_wake_on_their_table_only() {
    let store = Arc::new(StateStore::new());
    store.write(5, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store.blocking_query(&[Table::Jobs], 5, Duration::from_secs(30), |s| (s.jobs().count(), s.table_index(Table::Jobs))).await
        })
    };
    // A write to another table must not release the waiter.
    store.write(6, |tx| Ok(tx.upsert_node(Node { id: "n".into(), ..Node::default() }, Timestamp::ZERO))).unwrap();
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished());
    store.write(7, |tx| tx.upsert_job(job("b")).map(|_| ())).unwrap();
    let (count, index) = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    assert_eq!((count, index), (2, 7));
}

/// Waits (with a deadline) until `cond` holds, yielding to the runtime between looks.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn writes_wake_only_the_queries_on_the_keys_they_touch() {
    const WAITERS: usize = 500;
    let store = Arc::new(StateStore::new());
    store.write(1, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    store.write(2, |tx| tx.upsert_job(job("b")).map(|_| ())).unwrap();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .blocking_query_on(&[Watch::Job(Watch::job_key("default", "b"))], 2, Duration::from_secs(60), |s| {
                        let j = s.job("default", "b").expect("job b");
                        (j.version, j.modify_index)
                    })
                    .await
            })
        })
        .collect();
    until("every waiter registered", || store.blocking_registrations() == WAITERS).await;
    let wakeups = store.blocking_wakeups();
    // 100 writes to job a (and its allocs and evals): none of them is for a waiter on b.
    let a = job("a");
    for i in 0..100u64 {
        store
            .write(3 + i, |tx| {
                tx.upsert_job(a.clone())?;
                tx.upsert_allocs_from_plan(vec![alloc(&format!("alloc-{i}"), &a, "n1")]);
                tx.upsert_evals(vec![Evaluation::for_job(&a, "job-register", Timestamp::ZERO)]);
                Ok(())
            })
            .unwrap();
    }
    assert_eq!(store.blocking_wakeups(), wakeups, "a write to job a woke a query on job b");
    assert!(waiters.iter().all(|w| !w.is_finished()), "a query on job b answered after writes to job a only");
    assert_eq!(store.blocking_registrations(), WAITERS);

    // One write to b answers every one of them, once, with b's new index.
    let mut b = job("b");
    b.task_groups[0].count = 2;
    store.write(200, |tx| tx.upsert_job(b).map(|_| ())).unwrap();
    assert_eq!(store.blocking_wakeups(), wakeups + WAITERS as u64);
    for w in waiters {
        assert_eq!(tokio::time::timeout(Duration::from_secs(10), w).await.unwrap().unwrap(), (1, 200));
    }
    assert_eq!(store.blocking_registrations(), 0, "answered queries left their registrations behind");
}

#[tokio::test]
async fn queries_that_time_out_or_are_dropped_leave_the_registry() {
    let store = Arc::new(StateStore::new());
    store.write(1, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let query = |store: Arc<StateStore>, wait: Duration| async move {
        store
            .blocking_query_on(&[Watch::Job(Watch::job_key("default", "a")), Watch::Table(Table::Nodes)], 1, wait, |s| {
                ((), s.job("default", "a").map_or(0, |j| j.modify_index))
            })
            .await
    };
    let timed_out: Vec<_> = (0..50).map(|_| tokio::spawn(query(store.clone(), Duration::from_millis(50)))).collect();
    let abandoned: Vec<_> = (0..50).map(|_| tokio::spawn(query(store.clone(), Duration::from_secs(60)))).collect();
    until("every waiter registered", || store.blocking_registrations() == 200).await;
    for w in timed_out {
        assert_eq!(tokio::time::timeout(Duration::from_secs(10), w).await.unwrap().unwrap(), ((), 1));
    }
    assert_eq!(store.blocking_registrations(), 100, "timed-out queries are still registered");
    // A caller that goes away (its connection closed) drops the query future.
    for w in &abandoned {
        w.abort();
    }
    until("abandoned queries to leave", || store.blocking_registrations() == 0).await;
}

#[tokio::test]
async fn a_blocking_query_times_out_with_current_data() {
    let store = StateStore::new();
    store.write(3, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let (count, index) =
        store.blocking_query(&[Table::Jobs], 3, Duration::from_millis(20), |s| (s.jobs().count(), s.table_index(Table::Jobs))).await;
    assert_eq!((count, index), (1, 3));
}

#[test]
fn job_versions_move_only_on_spec_changes() {
    let store = StateStore::new();
    store.write(1, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    store.write(2, |tx| tx.upsert_job(job("a")).map(|_| ())).unwrap();
    let j = store.snapshot().job("default", "a").unwrap().clone();
    assert_eq!((j.version, j.job_modify_index, j.modify_index, j.create_index), (0, 1, 2, 1));
    let mut changed = job("a");
    changed.task_groups[0].count = 3;
    store.write(3, |tx| tx.upsert_job(changed).map(|_| ())).unwrap();
    let j = store.snapshot().job("default", "a").unwrap().clone();
    assert_eq!((j.version, j.job_modify_index), (1, 3));
}

#[test]
fn a_job_in_an_unknown_namespace_is_refused() {
    let store = StateStore::new();
    let mut j = job("a");
    j.namespace = "nope".into();
    let err = store.write(1, |tx| tx.upsert_job(j).map(|_| ())).unwrap_err();
    assert!(err.0.contains("nonexistent namespace"));
}

#[test]
fn summaries_and_status_follow_allocs_and_evals() {
    let store = StateStore::new();
    let j = job("web");
    store.write(1, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    let eval = Evaluation::for_job(&j, "job-register", Timestamp::ZERO);
    store
        .write(2, |tx| {
            let jobs = tx.upsert_evals(vec![eval.clone()]);
            jobs.iter().for_each(|k| tx.refresh_job_status(k));
            Ok(())
        })
        .unwrap();
    assert_eq!(store.snapshot().job("default", "web").unwrap().status, JobStatus::Pending);

    store
        .write(3, |tx| {
            let jobs = tx.upsert_allocs_from_plan(vec![alloc("a1", &j, "n1"), alloc("a2", &j, "n1")]);
            let mut done = eval.clone();
            done.status = EvalStatus::Complete;
            tx.upsert_evals(vec![done]);
            jobs.iter().for_each(|k| tx.refresh_job_status(k));
            Ok(())
        })
        .unwrap();
    let s = store.snapshot();
    assert_eq!(s.job("default", "web").unwrap().status, JobStatus::Running);
    assert_eq!(s.job_summary("default", "web").unwrap().summary["g"].starting, 2);

    let mut running = alloc("a1", &j, "n1");
    running.client_status = ClientStatus::Running;
    let mut done = alloc("a2", &j, "n1");
    done.client_status = ClientStatus::Complete;
    store
        .write(4, |tx| {
            tx.update_allocs_from_client(&[running, done], 0);
            Ok(())
        })
        .unwrap();
    let s = store.snapshot();
    let g = &s.job_summary("default", "web").unwrap().summary["g"];
    assert_eq!((g.starting, g.running, g.complete), (0, 1, 1));
    let a1 = s.alloc("a1").unwrap();
    assert_eq!((a1.modify_index, a1.alloc_modify_index), (4, 3), "client updates do not move AllocModifyIndex");
}

#[test]
fn client_updates_stamp_the_nodes_alloc_update_index() {
    let store = StateStore::new();
    let j = job("web");
    store
        .write(1, |tx| {
            tx.upsert_node(Node { id: "n1".into(), ..Node::default() }, Timestamp::ZERO);
            tx.upsert_job(j.clone())?;
            tx.upsert_allocs_from_plan(vec![alloc("a1", &j, "n1")]);
            Ok(())
        })
        .unwrap();
    let mut update = alloc("a1", &j, "n1");
    update.client_status = ClientStatus::Running;
    store.write(9, |tx| Ok(tx.update_allocs_from_client(&[update], 0))).unwrap();
    assert_eq!(store.snapshot().node("n1").unwrap().last_alloc_update_index, 9);
}

#[test]
fn plan_updates_keep_the_clients_status_unless_marking_unknown_or_lost() {
    let store = StateStore::new();
    let j = job("web");
    store.write(1, |tx| tx.upsert_job(j.clone()).map(|_| ())).unwrap();
    store.write(2, |tx| Ok(tx.upsert_allocs_from_plan(vec![alloc("a1", &j, "n1")]))).unwrap();
    let mut running = alloc("a1", &j, "n1");
    running.client_status = ClientStatus::Running;
    store.write(3, |tx| Ok(tx.update_allocs_from_client(&[running], 0))).unwrap();
    // An in-place update from the scheduler carries the stale pending status.
    store.write(4, |tx| Ok(tx.upsert_allocs_from_plan(vec![alloc("a1", &j, "n1")]))).unwrap();
    assert_eq!(store.snapshot().alloc("a1").unwrap().client_status, ClientStatus::Running);
    let mut unknown = alloc("a1", &j, "n1");
    unknown.client_status = ClientStatus::Unknown;
    store.write(5, |tx| Ok(tx.upsert_allocs_from_plan(vec![unknown]))).unwrap();
    let a = store.snapshot().alloc("a1").unwrap().clone();
    assert_eq!((a.client_status, a.alloc_modify_index), (ClientStatus::Unknown, 5));
}

#[test]
fn node_status_changes_track_the_missed_heartbeat_index() {
    let store = StateStore::new();
    store.write(1, |tx| Ok(tx.upsert_node(Node { id: "n1".into(), ..Node::default() }, Timestamp::ZERO))).unwrap();
    store.write(2, |tx| tx.update_node_status("n1", NodeStatus::Ready, None, 0).map(|_| ())).unwrap();
    store.write(3, |tx| tx.update_node_status("n1", NodeStatus::Disconnected, None, 0).map(|_| ())).unwrap();
    assert_eq!(store.snapshot().node("n1").unwrap().last_missed_heartbeat_index, 3);
    store.write(4, |tx| tx.update_node_status("n1", NodeStatus::Down, None, 0).map(|_| ())).unwrap();
    assert_eq!(store.snapshot().node("n1").unwrap().last_missed_heartbeat_index, 3, "unresponsive to unresponsive keeps it");
    store.write(5, |tx| tx.update_node_status("n1", NodeStatus::Ready, None, 0).map(|_| ())).unwrap();
    assert_eq!(store.snapshot().node("n1").unwrap().last_missed_heartbeat_index, 0);
}

#[test]
fn register_never_changes_a_known_nodes_status_or_events() {
    let store = StateStore::new();
    store.write(1, |tx| Ok(tx.upsert_node(Node { id: "n1".into(), ..Node::default() }, Timestamp::ZERO))).unwrap();
    store.write(2, |tx| tx.update_node_status("n1", NodeStatus::Disconnected, None, 0).map(|_| ())).unwrap();
    let again = Node { id: "n1".into(), status: NodeStatus::Ready, ..Node::default() };
    store.write(3, |tx| Ok(tx.upsert_node(again, Timestamp::ZERO))).unwrap();
    let n = store.snapshot().node("n1").unwrap().clone();
    assert_eq!(n.status, NodeStatus::Disconnected);
    assert_eq!(n.events.len(), 1);
    assert_eq!(n.events[0].message, "Node registered");
    assert_eq!((n.create_index, n.modify_index), (1, 3));
}

#[test]
fn prefix_lookups_stop_at_the_prefix() {
    let store = StateStore::new();
    store
        .write(1, |tx| {
            for id in ["aa1", "ab2", "b3"] {
                tx.upsert_node(Node { id: id.into(), ..Node::default() }, Timestamp::ZERO);
            }
            Ok(())
        })
        .unwrap();
    let s = store.snapshot();
    let ids: Vec<_> = s.nodes_by_prefix("a").map(|n| n.id.clone()).collect();
    assert_eq!(ids, vec!["aa1", "ab2"]);
    assert_eq!(s.nodes_by_prefix("c").count(), 0);
}
