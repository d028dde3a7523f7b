//! The nic and pcie sources alone: polls a composed HGX tree (`testkit::sysfs::hgx`, every
//! standard and mlx5 counter on each port) `--polls N` times and prints
//! `ports=… counters=… polls=… nic_cpu_us=… pcie_cpu_us=…` (CPU time of this thread per
//! poll; run by `cargo xtask bench`).
//!
//! Usage: `fabric_bench DIR --ports 8|32 [--polls N]`

use std::process::ExitCode;
use std::time::Instant;

use junction::config::Config;
use junction::model::{GpuInfo, Model};

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn thread_cpu_us() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 * 1e6 + v.tv_usec as f64;
    t(u.ru_utime) + t(u.ru_stime)
}

fn arg(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(dir), Some(ports)) = (args.first(), arg(&args, "--ports")) else {
        eprintln!("usage: fabric_bench DIR --ports 8|32 [--polls N]");
        return ExitCode::from(2);
    };
    let polls = arg(&args, "--polls").unwrap_or(200);
    let node = testkit::sysfs::hgx(std::path::Path::new(dir), &BUSES, true);
    // Only the InfiniBand rails: 1 or 4 ports each.
    for name in ["mlx5_8", "efa_0"] {
        let _ = std::fs::remove_file(node.tree.root.join("class/infiniband").join(name));
    }
    let per_device = (ports / 8).max(1) as u32;
    for (dev, port) in &node.rails {
        testkit::sysfs::every_counter(&node.tree, port, 1000);
        for n in 2..=per_device {
            let p = node.tree.ib_port(
                dev,
                n,
                "4: ACTIVE",
                "5: LinkUp",
                "400 Gb/sec (4X NDR)",
                "InfiniBand",
            );
            testkit::sysfs::every_counter(&node.tree, &p, 1000);
        }
    }
    let model = Model::new();
    for (i, b) in BUSES.iter().enumerate() {
        model.add_gpu(GpuInfo {
            index: i as u32,
            uuid: format!("GPU-{i}"),
            pci_bus_id: format!("00000000:{b:02X}:00.0"),
            ..GpuInfo::default()
        });
    }
    let config = Config {
        sysfs_root: node.tree.root.clone(),
        ..Config::default()
    };
    let mut nic = junction::sources::nic::State::default();
    let mut pcie = junction::sources::pcie::State::default();
    let (mut nic_us, mut pcie_us) = (0.0, 0.0);
    for _ in 0..polls {
        let c0 = thread_cpu_us();
        nic.poll(&config, &model, Instant::now());
        let c1 = thread_cpu_us();
        pcie.poll(&config, &model, Instant::now());
        let c2 = thread_cpu_us();
        nic_us += c1 - c0;
        pcie_us += c2 - c1;
    }
    let series: usize = model.sets().iter().map(|s| s.len()).sum();
    let counters =
        testkit::sysfs::STANDARD_COUNTERS.len() + testkit::sysfs::MLX5_HW_COUNTERS.len() - 1;
    println!(
        "ports={} counters_per_port={counters} polls={polls} series={series} nic_cpu_us={:.0} pcie_cpu_us={:.0}",
        8 * per_device,
        nic_us / polls as f64,
        pcie_us / polls as f64
    );
    ExitCode::SUCCESS
}
