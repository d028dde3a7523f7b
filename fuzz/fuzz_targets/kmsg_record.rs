//! `/dev/kmsg` records (header, escapes, continuation lines) into the model.
#![no_main]

use std::sync::LazyLock;

use junction::model::Model;
use junction::sources::kmsg::fuzzing::feed_record;
use libfuzzer_sys::fuzz_target;

static MODEL: LazyLock<Model> = LazyLock::new(Model::default);

fuzz_target!(|data: &[u8]| {
    feed_record(&MODEL, data, data.last().is_some_and(|b| b & 1 == 1));
});
