//! Embeds the BPF object when `cargo xtask build-ebpf` has built it; without it, Junction
//! still builds and says at run time how to get it.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(junction_bpf)");
    let obj = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf");
    // Watch the directory that will hold it (and the object itself once it exists), so that
    // building the object later rebuilds Junction with it.
    let dir = obj.parent().map(Path::to_path_buf).unwrap_or_default();
    if obj.exists() {
        println!("cargo::rerun-if-changed={}", obj.display());
        println!("cargo::rustc-cfg=junction_bpf");
        println!("cargo::rustc-env=JUNCTION_BPF_OBJECT={}", obj.display());
    } else {
        println!("cargo::rerun-if-changed={}", dir.display());
        println!("cargo::rerun-if-changed=../collector-ebpf/target");
    }
}
