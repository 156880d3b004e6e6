//! `GET /v1/client/allocation/<alloc_id>/stats`: a minimal resource usage report in Nomad's
//! shape: per running task, resident memory and CPU time of its main process, and the sum.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Method, Request};
use axum::response::{IntoResponse, Response};
use nomad_proto::Timestamp;
use nomad_server::http::util::{HttpError, json_response, require_method};
use serde_json::{Value, json};

use super::{ClientHttp, Target};

/// (RSS bytes, CPU seconds) of a process, from `/proc`.
fn usage(pid: i32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: u64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    // utime and stime are fields 14 and 15; `fields` starts at field 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((rss_kb * 1024, ticks as f64 / hz))
}

fn resource_usage(rss: u64, cpu_seconds: f64) -> Value {
    json!({
        "MemoryStats": { "RSS": rss, "Usage": rss, "Measured": ["RSS"] },
        "CpuStats": { "TotalTicks": cpu_seconds, "Measured": ["Total Ticks"] },
    })
}

pub(super) async fn handle(State(state): State<ClientHttp>, Path(alloc_id): Path<String>, req: Request<Body>) -> Response {
    if let Err(e) = require_method(req.method(), &[Method::GET]) {
        return e.into_response();
    }
    let runner = match state.target(&alloc_id, req).await {
        Target::Local(r) => r,
        Target::Done(resp) => return resp,
    };
    let now = Timestamp::now().unix_nanos();
    let mut tasks = BTreeMap::new();
    let (mut total_rss, mut total_cpu) = (0, 0.0);
    for name in runner.task_names() {
        let Some(handle) = runner.task(&name).and_then(|t| t.handle()) else { continue };
        let (rss, cpu) = usage(handle.task.pid).unwrap_or((0, 0.0));
        total_rss += rss;
        total_cpu += cpu;
        tasks.insert(name, json!({ "ResourceUsage": resource_usage(rss, cpu), "Timestamp": now, "Pids": null }));
    }
    let body = json!({ "ResourceUsage": resource_usage(total_rss, total_cpu), "Tasks": tasks, "Timestamp": now });
    json_response(&body, None, false).unwrap_or_else(|e: HttpError| e.into_response())
}
