//! The kubelet's pod-resources `List` answer (protobuf).
#![no_main]

use junction::sources::kubernetes::allocations;
use junction::sources::kubernetes::proto::ListPodResourcesResponse;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    if let Ok(answer) = ListPodResourcesResponse::decode(data) {
        let _ = allocations(&answer, &["nvidia.com/".to_string()]);
    }
});
