//! The task API (Nomad 1.5+): the agent's HTTP API on a unix socket in the task's secrets dir,
//! `secrets/api.sock`, for tasks with an `identity` block. Every request must carry a workload
//! identity (`X-Nomad-Token` or `Authorization: Bearer`, a JWT); the agent's own authorization
//! table then decides what it may do (with ACLs on: its job's variables, its namespace's
//! services). Served in-process by the agent's router, so it speaks plain HTTP whatever
//! `tls { http }` says, as Nomad's does.
//!
//! The client starts before the agent builds its router: sockets bound before that accept
//! connections and answer them once [`TaskApi::set_router`] was called.

use std::path::Path;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::connect::socket_proxy::bind_beneath;
use crate::fs_beneath::Beneath;

/// The socket's name in the secrets dir.
pub const SOCKET: &str = "api.sock";

/// The agent's router, once it exists.
pub struct TaskApi {
    router: watch::Sender<Option<Router>>,
}

impl Default for TaskApi {
    fn default() -> Self {
        TaskApi { router: watch::channel(None).0 }
    }
}

/// Refuses a request that carries no workload identity.
async fn require_workload_identity(req: Request, next: Next) -> Response {
    let secret = nomad_server::http::authz::request_secret(req.headers());
    if secret.split('.').count() != 3 {
        return (StatusCode::FORBIDDEN, "Permission denied: the task API takes the task's workload identity (NOMAD_TOKEN)").into_response();
    }
    next.run(req).await
}

impl TaskApi {
    /// The agent's router (the same routes and authorization as its HTTP listener).
    pub fn set_router(&self, router: Router) {
        self.router.send_replace(Some(router.layer(axum::middleware::from_fn(require_workload_identity))));
    }

    /// Serves one request in process (the template runner's reads), once the router exists.
    pub async fn call(&self, req: axum::http::Request<axum::body::Body>) -> Result<Response, String> {
        use tower::ServiceExt;
        let router = {
            let mut rx = self.router.subscribe();
            let r = rx.wait_for(Option::is_some).await.map_err(|_| "the agent is shutting down".to_string())?;
            r.clone().ok_or("the agent has no HTTP router")?
        };
        router.oneshot(req).await.map_err(|e| match e {})
    }

    /// Binds `secrets/api.sock` beneath `task_dir` (never through a symlink) and serves it until
    /// `stop`.
    pub fn serve(&self, task_dir: &Beneath, stop: CancellationToken) -> Result<(), String> {
        let secrets = task_dir.open_dir(Path::new("secrets"), crate::fs_beneath::Links::Refuse).map_err(|e| e.to_string())?;
        let listener = bind_beneath(&secrets, SOCKET).map_err(|e| e.to_string())?;
        let mut rx = self.router.subscribe();
        tokio::spawn(async move {
            let router = tokio::select! {
                r = rx.wait_for(Option::is_some) => match r {
                    Ok(r) => r.clone().expect("waited for a router"),
                    Err(_) => return,
                },
                _ = stop.cancelled() => return,
            };
            let served = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "task API socket stopped");
            }
        });
        Ok(())
    }
}
