//! Kernel-log file lines into the model, as a followed file's would go; across the whole run
//! the XID state stays within its caps (one model for every input).
#![no_main]

use std::sync::LazyLock;

use junction::model::{Metric, Model};
use junction::sources::kmsg::fuzzing::feed_file_text;
use libfuzzer_sys::fuzz_target;

static MODEL: LazyLock<Model> = LazyLock::new(Model::default);

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    feed_file_text(&MODEL, &text, data.first().is_some_and(|b| b & 1 == 1));
    let series = MODEL
        .sets()
        .iter()
        .flat_map(|s| s.iter())
        .filter(|s| matches!(s.metric, Metric::XidErrors | Metric::SxidErrors))
        .count();
    // 33 GPU ids × (the catalog + other), 65 switches × (64 codes + other) × 3 severities.
    assert!(series <= 33 * 50 + 65 * 65 * 3, "{series} XID series");
});
