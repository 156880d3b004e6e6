//! `?filter=` expressions: any text parses to a filter or an error, and a filter evaluates.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The filter module is self-contained (regex, serde_json, thiserror); it is compiled here from
// its source file rather than through the whole nomad-server crate, which would make every
// fuzz build compile Raft, axum and tonic with sanitizer instrumentation.
#[path = "../../server/src/http/filter.rs"]
#[allow(dead_code)]
mod filter;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(f) = filter::Filter::parse(src) {
        let job = serde_json::json!({
            "ID": "web", "Status": "running", "Priority": 50, "Stop": false,
            "Datacenters": ["dc1", "dc2"], "Meta": {"team": "core", "tier": ""}, "TaskGroups": [{"Name": "g", "Count": 2}],
        });
        let _ = f.matches(&job);
    }
});
