//! RFC 3339 times and Go durations, as every RPC and HTTP body carries them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nomad_proto::time::{Timestamp, parse_go_duration};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(t) = Timestamp::parse_rfc3339(s) {
        // Whatever parses, formats to a string that parses to the same instant.
        let again = Timestamp::parse_rfc3339(&t.to_rfc3339()).expect("a formatted time parses");
        assert_eq!(again, t, "{s:?}");
    }
    let _ = serde_json::from_slice::<Timestamp>(data);
    let _ = parse_go_duration(s);
});
