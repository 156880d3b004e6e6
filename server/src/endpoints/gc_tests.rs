use nomad_proto::{Allocation, ClientStatus, EvalStatus, Evaluation, JobType, NodeStatus, Timestamp};

use crate::consensus::Consensus as _;
use crate::fsm::Command;
use crate::testing::{TestServer, job};

fn eval_of(job: &nomad_proto::Job, status: EvalStatus) -> Evaluation {
    let mut e = Evaluation::for_job(job, "job-register", Timestamp::now());
    e.status = status;
    e
}

fn alloc_of(job: &nomad_proto::Job, eval: &Evaluation, id: &str, status: ClientStatus) -> Allocation {
    Allocation {
        id: id.into(),
        namespace: job.namespace.clone(),
        job_id: job.id.clone(),
        task_group: "web".into(),
        eval_id: eval.id.clone(),
        node_id: "n1".into(),
        client_status: status,
        job: Some(std::sync::Arc::new(job.clone())),
        ..Allocation::default()
    }
}

/// `system gc`: a finished batch job goes with its eval and alloc; a running service job stays
/// with its live alloc while its finished eval and failed alloc go; a batch job still running
/// keeps its finished allocs; a down node with nothing left goes, a ready one stays.
#[tokio::test]
async fn force_gc_removes_what_is_finished_and_keeps_what_is_not() {
    let ts = TestServer::new();
    ts.register_node(crate::testing::node("n1")).await;
    ts.register_node(crate::testing::node("n2")).await;
    let mut batch = job("done", 1);
    batch.job_type = JobType::Batch;
    let mut running_batch = job("busy", 1);
    running_batch.job_type = JobType::Batch;
    let mut web = job("web", 1);
    for j in [&mut batch, &mut running_batch, &mut web] {
        j.namespace = "default".into();
    }
    for j in [&batch, &running_batch, &web] {
        ts.consensus.apply(Command::JobRegister { job: j.clone(), eval: None, now: Timestamp::now() }).await.unwrap();
    }
    let (e_done, e_busy_old, e_busy, e_web_old, e_web) = (
        eval_of(&batch, EvalStatus::Complete),
        eval_of(&running_batch, EvalStatus::Complete),
        eval_of(&running_batch, EvalStatus::Complete),
        eval_of(&web, EvalStatus::Complete),
        eval_of(&web, EvalStatus::Complete),
    );
    let evals = vec![e_done.clone(), e_busy_old.clone(), e_busy.clone(), e_web_old.clone(), e_web.clone()];
    ts.consensus.apply(Command::EvalUpsert { evals }).await.unwrap();
    let in_deployment = |mut a: Allocation, d: &str| {
        a.deployment_id = d.into();
        a
    };
    let allocs = vec![
        alloc_of(&batch, &e_done, "a-done", ClientStatus::Complete),
        alloc_of(&running_batch, &e_busy_old, "a-busy-old", ClientStatus::Complete),
        alloc_of(&running_batch, &e_busy, "a-busy", ClientStatus::Running),
        in_deployment(alloc_of(&web, &e_web_old, "a-web-old", ClientStatus::Failed), "d-failed"),
        in_deployment(alloc_of(&web, &e_web, "a-web", ClientStatus::Running), "d-done"),
    ];
    let deployment =
        |id: &str, status: &str| nomad_proto::Deployment { status: status.into(), ..nomad_proto::Deployment::new(id.into(), &web, 50) };
    let idx = ts.store.snapshot().index + 1;
    ts.store
        .write(idx, |tx| {
            // A failed deployment whose alloc goes, a successful one whose alloc runs, a running one.
            for (id, status) in [("d-failed", "failed"), ("d-done", "successful"), ("d-live", "running")] {
                tx.upsert_deployment(deployment(id, status));
            }
            // The statuses of the jobs are left as stored: GC reads them from the allocs.
            tx.upsert_allocs_from_plan(allocs);
            tx.update_node_status("n2", NodeStatus::Down, None, 0).map(|_| ())
        })
        .unwrap();

    let report = ts.endpoints.force_gc().await.unwrap();
    assert_eq!(report.jobs, ["default/done"]);
    assert_eq!(report.nodes, ["n2"]);
    let snap = ts.store.snapshot();
    assert!(snap.job("default", "done").is_none() && snap.eval(&e_done.id).is_none() && snap.alloc("a-done").is_none());
    assert!(snap.eval(&e_web_old.id).is_none() && snap.alloc("a-web-old").is_none(), "the replaced alloc and its eval go");
    assert!(snap.alloc("a-web").is_some() && snap.eval(&e_web.id).is_some(), "the running alloc and its eval stay");
    assert!(snap.alloc("a-busy-old").is_some() && snap.eval(&e_busy_old.id).is_some(), "a running batch job keeps its finished allocs");
    assert!(snap.node("n1").is_some() && snap.node("n2").is_none());
    assert_eq!((report.evals, report.allocs), (2, 2));
    assert_eq!(report.deployments, 1);
    assert!(snap.deployment("d-failed").is_none(), "a finished deployment with nothing live goes");
    assert!(snap.deployment("d-done").is_some() && snap.deployment("d-live").is_some());

    // Nothing left to collect: a second run removes nothing.
    assert_eq!(ts.endpoints.force_gc().await.unwrap(), Default::default());
}

/// The leader's periodic GC: only what has been finished for longer than its threshold goes.
#[tokio::test]
async fn periodic_gc_collects_only_what_is_older_than_its_threshold() {
    use super::{GcConfig, GcCutoffs, collect_garbage};
    let ts = TestServer::new();
    for n in ["n1", "n2", "n3"] {
        ts.register_node(crate::testing::node(n)).await;
    }
    let now = Timestamp::now();
    let ago = |minutes: i64| now.unix_nanos() - minutes * 60 * 1_000_000_000;
    let with_ns = |mut j: nomad_proto::Job| {
        j.namespace = "default".into();
        j
    };
    let (old_job, new_job, web) = (with_ns(job("old", 1)), with_ns(job("new", 1)), with_ns(job("web", 1)));
    for (j, at) in [(&old_job, ago(300)), (&new_job, ago(300)), (&web, ago(300))] {
        ts.consensus.apply(Command::JobRegister { job: j.clone(), eval: None, now: Timestamp::from_unix_nanos(at) }).await.unwrap();
    }
    for id in ["old", "new"] {
        let stop = Command::JobDeregister { namespace: "default".into(), job_id: id.into(), purge: false, eval: None, now };
        ts.consensus.apply(stop).await.unwrap();
    }
    let finished = |j: &nomad_proto::Job, minutes: i64, batch: bool| {
        let mut e = eval_of(j, EvalStatus::Complete);
        e.modify_time = ago(minutes);
        if batch {
            e.eval_type = JobType::Batch;
        }
        e
    };
    let mut gone = with_ns(job("gone", 1));
    gone.job_type = JobType::Batch;
    let (e_old, e_new, e_web_old, e_web_recent, e_gone_old, e_gone_recent) = (
        finished(&old_job, 300, false),
        finished(&new_job, 30, false),
        finished(&web, 120, false),
        finished(&web, 30, false),
        finished(&gone, 25 * 60, true),
        finished(&gone, 120, true),
    );
    let evals = vec![e_old.clone(), e_new.clone(), e_web_old.clone(), e_web_recent.clone(), e_gone_old.clone(), e_gone_recent.clone()];
    ts.consensus.apply(Command::EvalUpsert { evals }).await.unwrap();
    let at = |mut a: Allocation, minutes: i64, deployment: &str| {
        a.modify_time = ago(minutes);
        a.deployment_id = deployment.into();
        a
    };
    let allocs = vec![
        at(alloc_of(&old_job, &e_old, "a-old", ClientStatus::Complete), 300, ""),
        at(alloc_of(&new_job, &e_new, "a-new", ClientStatus::Complete), 30, ""),
        at(alloc_of(&web, &e_web_old, "a-web-old", ClientStatus::Failed), 120, "d-old"),
        at(alloc_of(&web, &e_web_recent, "a-web-recent", ClientStatus::Failed), 30, "d-recent"),
    ];
    let idx = ts.store.snapshot().index + 1;
    ts.store
        .write(idx, |tx| {
            for id in ["d-old", "d-recent"] {
                tx.upsert_deployment(nomad_proto::Deployment {
                    status: "failed".into(),
                    ..nomad_proto::Deployment::new(id.into(), &web, 50)
                });
            }
            tx.upsert_allocs_from_plan(allocs);
            let secs = |minutes: i64| ago(minutes) / 1_000_000_000;
            tx.update_node_status("n2", NodeStatus::Down, None, secs(25 * 60))?;
            tx.update_node_status("n3", NodeStatus::Down, None, secs(60)).map(|_| ())
        })
        .unwrap();

    let report = collect_garbage(&ts.store, ts.consensus.as_ref(), GcCutoffs::at(now, &GcConfig::default())).await.unwrap();
    let snap = ts.store.snapshot();
    assert_eq!(report.jobs, ["default/old"], "a job stopped 5h ago goes at 4h; one touched 30 min ago stays");
    assert!(snap.job("default", "new").is_some() && snap.eval(&e_new.id).is_some() && snap.alloc("a-new").is_some());
    assert!(snap.eval(&e_web_old.id).is_none() && snap.alloc("a-web-old").is_none(), "a service eval finished 2h ago goes at 1h");
    assert!(snap.eval(&e_web_recent.id).is_some() && snap.alloc("a-web-recent").is_some());
    assert!(snap.eval(&e_gone_old.id).is_none(), "a batch eval finished 25h ago goes at 24h");
    assert!(snap.eval(&e_gone_recent.id).is_some(), "a batch eval finished 2h ago stays: 24h for batch");
    assert!(snap.deployment("d-old").is_none() && snap.deployment("d-recent").is_some());
    assert_eq!(report.nodes, ["n2"], "down for 25h goes at 24h; down for 1h stays");

    // The forced GC takes the rest that is finished.
    let forced = ts.endpoints.force_gc().await.unwrap();
    assert_eq!(forced.jobs, ["default/new"]);
    assert_eq!(forced.nodes, ["n3"]);
}
