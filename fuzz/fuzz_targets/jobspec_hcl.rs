//! HCL2 job files, as `nomad-rs job run` and `PUT /v1/jobs/parse` parse them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nomad_proto::jobspec::{ParseOptions, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(job) = parse(src, &ParseOptions::default())
        && job.check_limits(&nomad_proto::JobLimits::default()).is_ok()
    {
        // What the CLI does next: send it as JSON, which must encode.
        let _ = serde_json::to_vec(&job).expect("a parsed job encodes");
    }
});
