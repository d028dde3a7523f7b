//! Self-telemetry: a failed read in every source shows up in `junction_source_errors_total`
//! with its source, stage and kind, and is logged once, not at every poll. One agent, each
//! source failing its own way at once: an NVML call that fails one time in three (GPU 6 of
//! `hang.toml`), the health rules that need it, a kernel-log "file" that is a directory, a
//! Redfish sensor the service links but cannot serve, an IPMI BMC that never answers, and a
//! kubelet that refuses `List`. (eBPF's failure to load without privileges is checked by
//! `ebpf::without_privileges_or_when_disabled_junction_runs_and_says_why`.)

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::bmc::DynamicBmc;
use crate::support::kubelet::Kubelet;
use crate::support::{self, Agent, Series, parse};

/// A chassis with two sensors, one of which the service cannot serve.
fn one_broken_sensor(path: &str, _t: f64) -> Option<Value> {
    let r = "/redfish/v1";
    let sensors = format!("{r}/Chassis/1/Sensors");
    Some(match path.trim_start_matches(r) {
        "" => json!({"@odata.id": r, "Chassis": {"@odata.id": format!("{r}/Chassis")}}),
        "/Chassis" => json!({"Members": [{"@odata.id": format!("{r}/Chassis/1")}]}),
        "/Chassis/1" => json!({"Id": "1", "Name": "Node", "Sensors": {"@odata.id": sensors}}),
        "/Chassis/1/Sensors" => json!({"Members": [
            {"@odata.id": format!("{sensors}/Inlet")},
            {"@odata.id": format!("{sensors}/Broken")}
        ]}),
        "/Chassis/1/Sensors/Inlet" => json!({"Id": "Inlet", "Name": "Inlet", "Reading": 24,
            "ReadingType": "Temperature", "ReadingUnits": "Cel"}),
        _ => return None,
    })
}

fn errors<'a>(s: &'a [Series], source: &str) -> Vec<&'a Series> {
    s.iter()
        .filter(|x| {
            x.name == "junction_source_errors_total"
                && x.labels.get("junction_source").map(String::as_str) == Some(source)
        })
        .collect()
}

/// A series of `source` whose stage starts with `stage`, with a kind, counted, about `subject`.
fn has(s: &[Series], source: &str, stage: &str, subject: Option<(&str, &str)>) -> bool {
    errors(s, source).iter().any(|x| {
        x.labels
            .get("junction_stage")
            .is_some_and(|st| st.starts_with(stage))
            && x.labels.contains_key("error_type")
            && x.value >= 1.0
            && subject.is_none_or(|(k, v)| x.labels.get(k).map(String::as_str) == Some(v))
    })
}

#[test]
fn a_failed_read_in_every_source_is_counted_with_its_source_stage_and_kind() {
    let dir = support::temp_dir();
    // A directory where a kernel-log file is expected: opened, never readable.
    let not_a_file = dir.join("kern.log");
    std::fs::create_dir_all(&not_a_file).expect("dir");
    let bmc = DynamicBmc::start(one_broken_sensor);
    // An IPMI "BMC" on a UDP port that nothing answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let pw = dir.join("ipmi-pw");
    std::fs::write(&pw, "x\n").expect("pw");
    let socket = dir.join("kubelet.sock");
    let kubelet = Kubelet::start(&socket);
    kubelet.fail(tonic::Code::Unavailable, "the kubelet is restarting");
    let port = support::free_port();
    let config = format!(
        "{}\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n\
         \n[[sources.redfish.targets]]\nname = \"rf\"\nurl = \"http://127.0.0.1:{}\"\ninterval_secs = 1\ntimeout_secs = 5\n\
         \n[[sources.ipmi.targets]]\nname = \"silent\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"x\"\npassword_file = {:?}\ninterval_secs = 1\ntimeout_secs = 1\n\
         \n[sources.kubernetes]\npod_resources_socket = {:?}\ninterval_secs = 1\n",
        support::sim_config("current", port, ""),
        not_a_file.display().to_string(),
        bmc.port,
        silent.local_addr().expect("addr").port(),
        pw.display().to_string(),
        socket.display().to_string(),
    );
    let mut agent = Agent::spawn_config("hang.toml", &config);
    let page = agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    let g6 = support::uuids(&parse(&page))[6].clone();
    let all = |m: &str| {
        let s = parse(m);
        has(&s, "nvml", "pcie_throughput", Some(("hw_id", &g6)))
            && has(&s, "health", "rules", Some(("hw_id", &g6)))
            && has(&s, "kmsg", "file", None)
            && has(&s, "redfish", "resource", Some(("junction_target", "rf")))
            && has(&s, "ipmi", "poll", Some(("junction_target", "silent")))
            && has(&s, "kubernetes", "list", None)
    };
    let body = agent.wait_for(Duration::from_secs(60), all);
    let s = parse(&body);
    let kind = |source: &str, stage: &str| {
        errors(&s, source)
            .iter()
            .find(|x| {
                x.labels
                    .get("junction_stage")
                    .is_some_and(|st| st.starts_with(stage))
            })
            .and_then(|x| x.labels.get("error_type").cloned())
    };
    assert_eq!(kind("nvml", "pcie_throughput").as_deref(), Some("unknown"));
    assert_eq!(kind("kmsg", "file").as_deref(), Some("is_a_directory"));
    assert_eq!(kind("redfish", "resource").as_deref(), Some("http"));
    assert_eq!(kind("kubernetes", "list").as_deref(), Some("status"));
    assert_eq!(kind("health", "rules").as_deref(), Some("input_unreadable"));
    // The Redfish target as a whole is up: one sensor failed, the other was read.
    assert_eq!(
        support::value(&s, "junction_target_up", &[("junction_target", "rf")]),
        Some(1.0)
    );
    // Failing at every poll, each is logged once (the limiter's window is 10 minutes).
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.log();
    for line in [
        "Redfish resource failed",
        "IPMI poll failed",
        "cannot list pod resources",
        "cannot read the kernel-log file",
        "health rules cannot read their inputs",
    ] {
        assert_eq!(log.matches(line).count(), 1, "{line:?} once:\n{log}");
    }
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// `VmRSS` of `pid`, bytes.
fn rss(pid: u32) -> f64 {
    let kib = support::rss_kib(pid);
    assert!(kib > 0, "no VmRSS for {pid}");
    kib as f64 * 1024.0
}

#[test]
fn the_agents_own_heap_is_on_metrics_and_within_its_rss() {
    // jemalloc's counts, published at start and after each release: the live heap is some
    // MiB (the model, the sinks' buffers), the pages under it at least that, both within
    // the process's RSS (which adds the binary, the NVML library, stacks, glibc's heap).
    let mut agent = Agent::start("healthy-node.toml", "current");
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("junction_memory_heap_allocated_bytes")
    });
    let rss = rss(agent.child.id());
    let s = parse(&body);
    let allocated =
        support::value(&s, "junction_memory_heap_allocated_bytes", &[]).expect("allocated");
    let resident =
        support::value(&s, "junction_memory_heap_resident_bytes", &[]).expect("resident");
    let active = support::value(&s, "junction_memory_heap_active_bytes", &[]).expect("active");
    let metadata =
        support::value(&s, "junction_memory_heap_metadata_bytes", &[]).expect("metadata");
    assert!(allocated > 256.0 * 1024.0, "allocated {allocated}");
    // The pages of live blocks hold them; the resident pages hold those.
    assert!(
        allocated <= active && active <= resident,
        "allocated {allocated}, active {active}, resident {resident}"
    );
    // jemalloc's bookkeeping: some pages, a small part of the heap.
    assert!(
        metadata > 4096.0 && metadata < resident,
        "metadata {metadata} of {resident}"
    );
    assert!(resident < rss, "heap resident {resident} >= RSS {rss}");
    // The event history's share of the live heap (the agent's first start in this state
    // directory is in it).
    let history = support::value(&s, "junction_history_memory_bytes", &[]).expect("history");
    assert!(
        history > 0.0 && history < allocated,
        "history {history} of {allocated}"
    );
    assert!(agent.terminate().success(), "{}", agent.log());
}
