//! `PUT /v1/jobs` bodies through the server's admission steps: decode, limits, canonicalize,
//! the Connect mutator (which must be idempotent), size, validate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nomad_proto::Job;
use serde::Deserialize;

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "PascalCase")]
struct Register {
    job: Option<Job>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = nomad_proto::lenient::from_slice::<Register>(data) else { return };
    let Some(mut job) = req.job else { return };
    if job.check_limits(&nomad_proto::JobLimits::default()).is_err() {
        return;
    }
    job.canonicalize();
    if job.mutate_connect().is_err() {
        return;
    }
    let mutated = job.clone();
    job.mutate_connect().expect("a mutated job mutates again");
    // A name whose interpolated value holds another `${...}` changes again (as in Nomad).
    let interpolates_again = job.task_groups.iter().flat_map(|g| &g.services).any(|s| s.name.contains("${"));
    assert!(interpolates_again || job == mutated, "the Connect mutator is idempotent");
    if job.check_limits(&nomad_proto::JobLimits::default()).is_err() || job.check_encoded_size().is_err() {
        return;
    }
    let _ = job.validate_connect();
    let _ = job.validate();
    // What the servers store must decode again, as Raft replay and clients do.
    let stored = serde_json::to_vec(&job).expect("an admitted job encodes");
    let _: Job = serde_json::from_slice(&stored).expect("an admitted job decodes again");
});
