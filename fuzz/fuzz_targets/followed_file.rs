//! A followed file written in pieces (the input's first byte says where to cut): the saved
//! position is always the end of the last complete line, and an unfinished line is never
//! held past the cap.
#![no_main]

use std::sync::LazyLock;

use junction::model::Model;
use junction::sources::kmsg::fuzzing::follow_chunks;
use libfuzzer_sys::fuzz_target;

static MODEL: LazyLock<Model> = LazyLock::new(Model::default);
static DIR: LazyLock<std::path::PathBuf> = LazyLock::new(|| {
    let d = std::env::temp_dir().join(format!("junction-fuzz-follow-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
});

fuzz_target!(|data: &[u8]| {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step).max(1);
    let chunks: Vec<&[u8]> = rest.chunks(step).collect();
    follow_chunks(&MODEL, &DIR, &chunks);
});
