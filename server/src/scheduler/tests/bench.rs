//! Pure scheduling throughput: `compute` only, no Raft, no plan applier.
//!
//! ```text
//! CARGO_PROFILE_DEV_OPT_LEVEL=3 cargo test -p nomad-server --lib scheduler::tests::bench -- --ignored --nocapture
//! ```
//!
//! (The env var optimizes the workspace crates the way a release build
//! would while reusing the prebuilt dependencies.)

use std::time::Instant;

use nomad_proto::eval::trigger;

use super::*;

/// Registers `nodes` ready nodes directly in one transaction (fast setup).
fn cluster(nodes: usize) -> Harness {
    let mut h = Harness::new();
    for i in 0..nodes {
        let mut n = crate::testing::node(&format!("node-{i:05}"));
        n.status = NodeStatus::Ready;
        n.datacenter = format!("dc{}", i % 3);
        h.add_node(n);
    }
    h
}

/// Nanoseconds this thread has spent on a CPU (Linux), so a busy machine
/// does not distort the figure.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn run(nodes: usize, jobs: usize, count: i64, job_type: nomad_proto::JobType) {
    let mut h = cluster(nodes);
    let mut evals = Vec::new();
    for j in 0..jobs {
        let mut job = service_job(&format!("job-{j}"), count);
        job.job_type = job_type;
        job.datacenters = vec!["*".into()];
        job.task_groups[0].tasks[0].resources.cpu = 100;
        job.task_groups[0].tasks[0].resources.memory_mb = 128;
        h.register_job(job);
        evals.push(h.eval(&format!("job-{j}"), trigger::JOB_REGISTER));
    }
    let state = h.state();
    // Warm the allocator as a running server's would be.
    for e in evals.iter().take(jobs.div_ceil(2)) {
        drop(BuiltinScheduler.compute(&state, e, h.now));
    }
    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    let mut placements = 0;
    for e in &evals {
        let out = BuiltinScheduler.compute(&state, e, h.now);
        placements += placed(&out).len();
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_start.zip(thread_cpu_ns()).map(|(a, b)| (b - a) as f64 / 1e9).unwrap_or(wall);
    let want = if job_type == nomad_proto::JobType::System { jobs * nodes } else { jobs * count as usize };
    assert_eq!(placements, want);
    println!(
        "{nodes} nodes, {jobs} {job_type} job(s) x {count}: {placements} placements, on-CPU {cpu:.3} s = {:.0} placements/s ({:.1} us each); wall {wall:.3} s",
        placements as f64 / cpu,
        cpu * 1e6 / placements as f64
    );
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture, optimized"]
fn placements_per_second() {
    // BENCH_SCENARIO=0|1|2 runs one scenario (for profiling).
    let only: Option<usize> = std::env::var("BENCH_SCENARIO").ok().and_then(|s| s.parse().ok());
    use nomad_proto::JobType::{Batch, Service, System};
    let scenarios = [(1, 10_000, Service), (100, 100, Service), (1000, 10, Service), (1, 10_000, Batch), (1, 1, System)];
    for (i, (jobs, count, job_type)) in scenarios.into_iter().enumerate() {
        if only.is_none_or(|o| o == i) {
            run(10_000, jobs, count, job_type);
        }
    }
}
