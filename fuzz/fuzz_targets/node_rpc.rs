//! Bodies of the node RPCs, decoded as the servers decode them, then the checks a registering
//! node goes through. The first byte picks the method.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nomad_proto::rpc::codec::decode_message;
use nomad_proto::rpc::*;

fuzz_target!(|data: &[u8]| {
    let Some((&method, body)) = data.split_first() else { return };
    match method % 9 {
        0 => {
            if let Ok(req) = decode_message::<NodeRegisterRequest>(body) {
                let _ = req.node.check_limits();
                let _ = req.node.validate_registration();
            }
        }
        1 => {
            let _ = decode_message::<NodeUpdateStatusRequest>(body);
        }
        2 => {
            let _ = decode_message::<AllocUpdateRequest>(body);
        }
        3 => {
            let _ = decode_message::<NodeSpecificRequest>(body);
        }
        4 => {
            let _ = decode_message::<AllocsGetRequest>(body);
        }
        5 => {
            let _ = decode_message::<ServiceRegistrationUpsertRequest>(body);
        }
        6 => {
            let _ = decode_message::<ServiceRegistrationDeleteRequest>(body);
        }
        7 => {
            let _ = decode_message::<ServiceRegistrationDeleteByIdRequest>(body);
        }
        _ => {
            let _ = decode_message::<DeriveSiTokenRequest>(body);
        }
    }
});
