//! `/v1/system/gc` (a forced garbage collection) and `/v1/system/reconcile/summaries` (every
//! job summary recomputed from the allocs), both management only.

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::HttpState;
use super::util::require_method;

/// `PUT|POST /v1/system/gc`: runs every collector now; answers 200 with no body once done, as
/// Nomad does.
pub async fn gc(State(s): State<HttpState>, method: Method, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        let report = s.endpoints.force_gc().await?;
        tracing::info!(
            jobs = report.jobs.len(),
            evals = report.evals,
            allocs = report.allocs,
            nodes = report.nodes.len(),
            "forced garbage collection"
        );
        Ok(StatusCode::OK.into_response())
    })
    .await
}

/// `PUT|POST /v1/system/reconcile/summaries`: answers 200 with no body once written.
pub async fn reconcile_summaries(State(s): State<HttpState>, method: Method, _body: Body) -> Response {
    super::respond(async {
        require_method(&method, &[Method::PUT, Method::POST])?;
        s.endpoints.reconcile_summaries().await?;
        Ok(StatusCode::OK.into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use tower::ServiceExt;

    use crate::acl::AclConfig;
    use crate::testing::{TestServer, job};

    async fn put(ts: &TestServer, path: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut b = Request::builder().method(Method::PUT).uri(path);
        if let Some(t) = token {
            b = b.header("X-Nomad-Token", t);
        }
        let resp = ts.router().oneshot(b.body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        (status, String::from_utf8_lossy(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).into_owned())
    }

    /// A purged-by-GC job: stopped, with nothing running. Only a management token may ask.
    #[tokio::test]
    async fn system_gc_purges_a_stopped_job_and_is_for_management_only() {
        let mut ts = TestServer::new();
        ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
        let (_, boot) = put(&ts, "/v1/acl/bootstrap", None).await;
        let mgmt = serde_json::from_str::<serde_json::Value>(&boot).unwrap()["SecretID"].as_str().unwrap().to_string();
        let mut j = job("old", 1);
        j.namespace = "default".into();
        ts.endpoints.job_register(j, Default::default()).await.unwrap();
        ts.endpoints.job_deregister("default", "old", false, 0).await.unwrap();
        assert_eq!(put(&ts, "/v1/system/gc", None).await.0, StatusCode::FORBIDDEN);
        assert!(ts.store.snapshot().job("default", "old").is_some());
        // Its evals are still pending (no scheduler runs here): nothing is collected yet.
        assert_eq!(put(&ts, "/v1/system/gc", Some(&mgmt)).await, (StatusCode::OK, String::new()));
        assert!(ts.store.snapshot().job("default", "old").is_some(), "a job with pending evals stays");
        let evals: Vec<_> = ts
            .store
            .snapshot()
            .evals_by_job("default", "old")
            .map(|e| {
                let mut e = (**e).clone();
                e.status = nomad_proto::EvalStatus::Complete;
                e
            })
            .collect();
        crate::consensus::Consensus::apply(&*ts.consensus, crate::fsm::Command::EvalUpsert { evals }).await.unwrap();
        assert_eq!(put(&ts, "/v1/system/gc", Some(&mgmt)).await, (StatusCode::OK, String::new()));
        let snap = ts.store.snapshot();
        assert!(snap.job("default", "old").is_none() && snap.evals_by_job("default", "old").next().is_none());
    }

    /// A summary that drifted from the allocs is recomputed; the queued count stays.
    #[tokio::test]
    async fn reconcile_summaries_recounts_the_allocs_and_is_for_management_only() {
        let mut ts = TestServer::new();
        ts.endpoints = ts.endpoints.clone().with_acl(AclConfig { enabled: true, ..AclConfig::default() });
        let (_, boot) = put(&ts, "/v1/acl/bootstrap", None).await;
        let mgmt = serde_json::from_str::<serde_json::Value>(&boot).unwrap()["SecretID"].as_str().unwrap().to_string();
        let mut j = job("web", 2);
        j.namespace = "default".into();
        ts.endpoints.job_register(j, Default::default()).await.unwrap();
        let stored = ts.store.snapshot().job("default", "web").unwrap().clone();
        let alloc = |id: &str, status| nomad_proto::Allocation {
            id: id.into(),
            namespace: "default".into(),
            job_id: "web".into(),
            task_group: "web".into(),
            client_status: status,
            job: Some(stored.clone()),
            ..nomad_proto::Allocation::default()
        };
        let idx = ts.store.snapshot().index + 1;
        ts.store
            .write(idx, |tx| {
                tx.upsert_allocs_from_plan(vec![
                    alloc("a1", nomad_proto::ClientStatus::Running),
                    alloc("a2", nomad_proto::ClientStatus::Failed),
                ]);
                // The summary drifts: a count nothing backs, and a queued count.
                tx.update_summary(&nomad_proto::NamespacedId::new("default", "web"), |s| {
                    let g = s.summary.get_mut("web").unwrap();
                    g.lost = 7;
                    g.queued = 3;
                });
                Ok(())
            })
            .unwrap();
        assert_eq!(put(&ts, "/v1/system/reconcile/summaries", None).await.0, StatusCode::FORBIDDEN);
        assert_eq!(put(&ts, "/v1/system/reconcile/summaries", Some(&mgmt)).await, (StatusCode::OK, String::new()));
        let snap = ts.store.snapshot();
        let g = snap.job_summary("default", "web").unwrap().summary["web"].clone();
        assert_eq!((g.running, g.failed, g.lost, g.queued), (1, 1, 0, 3));
    }
}
