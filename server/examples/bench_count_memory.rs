//! Peak heap of one `Job.Plan` dry run as a function of a group's `count`.
//!
//! ```text
//! cargo run --release -p nomad-server --example bench_count_memory
//! ```
//!
//! Prints, per count, the peak bytes the plan allocated above what the state
//! held before, and that figure per unit of count, with no node that fits (every
//! placement fails) and with enough nodes for all of them. `job_max_count` is raised
//! to 2^31 so the scheduler's own bound is what is measured: with no node, a count
//! of 2^31 costs what a count of 1,000 does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;

use nomad_proto::JobLimits;
use nomad_proto::limits::MAX_RESOURCE_VALUE;
use nomad_server::endpoints::{EndpointConfig, Endpoints};
use nomad_server::sim::ready_node;
use nomad_server::testing::{TestServer, job};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

async fn measure(nodes: usize, count: i64) -> usize {
    let server = TestServer::new();
    for i in 0..nodes {
        let mut n = ready_node(&format!("node-{i:05}"));
        if let Some(r) = n.node_resources.as_mut() {
            // Room for every placement of the largest run.
            r.cpu.cpu_shares = MAX_RESOURCE_VALUE;
            r.memory.memory_mb = MAX_RESOURCE_VALUE;
            r.disk.disk_mb = MAX_RESOURCE_VALUE;
        }
        server.register_node(n).await;
    }
    let mut j = job("count", count);
    j.task_groups[0].tasks[0].resources.cpu = 1;
    j.task_groups[0].tasks[0].resources.memory_mb = 10;
    j.task_groups[0].ephemeral_disk.size_mb = 10;
    // Logs must fit the disk (Nomad's rule).
    j.task_groups[0].tasks[0].log_config.max_files = 1;
    j.task_groups[0].tasks[0].log_config.max_file_size_mb = 1;
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let config = EndpointConfig { job_limits: JobLimits { max_count: 1 << 31 }, ..EndpointConfig::default() };
    let endpoints = Endpoints::new(server.store.clone(), server.consensus.clone(), server.endpoints.heartbeats().clone(), config)
        .with_scheduler(Arc::new(nomad_server::scheduler::BuiltinScheduler));
    let plan = endpoints.job_plan(j, false).await.expect("plan");
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(plan);
    peak
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for nodes in [0usize, 100] {
        let huge: &[i64] = if nodes == 0 { &[1 << 31] } else { &[] };
        for &count in [1_000i64, 10_000, 50_000, 100_000].iter().chain(huge) {
            let peak = measure(nodes, count).await;
            println!(
                "nodes={nodes:<4} count={count:<7} plan peak heap {:>8.1} MiB  {:>6} bytes per count",
                peak as f64 / (1024.0 * 1024.0),
                peak / count as usize
            );
        }
    }
}
