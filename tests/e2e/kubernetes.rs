//! Pod attribution end to end: the real `junction` reads a kubelet pod-resources server (the
//! v1 gRPC API over a unix socket, served in this test process) and a kubelet pod directory;
//! GPU allocations become per-GPU series naming the pod, and a process whose cgroup names a
//! pod (an eBPF-attributed workload, as root) carries the pod's namespace and name.

use std::time::Duration;

use crate::ebpf;
use crate::support::kubelet::{Kubelet, pod};
use crate::support::{self, Agent, parse, value};

const POD_UID: &str = "6a0b8f52-3c1d-4e2f-9a8b-7c6d5e4f3a21";

fn section(socket: &std::path::Path, pods: &std::path::Path) -> String {
    format!(
        "[sources.kubernetes]\npod_resources_socket = {:?}\npod_logs_dir = {:?}\ninterval_secs = 1\n",
        socket.display().to_string(),
        pods.display().to_string()
    )
}

fn allocation(s: &[support::Series], gpu: &str, pod: &str, container: &str) -> Option<f64> {
    value(
        s,
        "gpu_k8s_allocation",
        &[
            ("hw_id", gpu),
            ("k8s_namespace_name", "ml"),
            ("k8s_pod_name", pod),
            ("k8s_container_name", container),
        ],
    )
}

#[test]
fn gpu_allocations_name_the_pod_follow_the_kubelet_and_a_failing_kubelet_is_down() {
    let dir = support::temp_dir();
    let socket = dir.join("kubelet.sock");
    let pods = dir.join("pods");
    std::fs::create_dir_all(pods.join(format!("ml_train-0_{POD_UID}"))).expect("pod dir");
    let kubelet = Kubelet::start(&socket);
    let port = support::free_port();
    let config = format!(
        "{}\n{}",
        support::sim_config("current", port, ""),
        section(&socket, &pods)
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &config);
    let page = agent.wait_for(Duration::from_secs(30), |m| m.contains("gpu_info{"));
    let uuids = support::uuids(&parse(&page));
    // Two GPUs to one container (one of them a time-sliced replica), a MIG device to another
    // pod, and a resource that is not a GPU.
    let mig = "MIG-11111111-2222-4333-8444-555555555555";
    kubelet.set_pods(vec![
        pod(
            "ml",
            "train-0",
            "worker",
            "nvidia.com/gpu",
            &[&uuids[2], &format!("{}::3", uuids[3])],
        ),
        pod("ml", "infer-1", "server", "nvidia.com/mig-1g.10gb", &[mig]),
        pod("ml", "web", "nginx", "example.com/nic", &["eth7"]),
    ]);
    let page = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_k8s_allocation{") && m.contains("infer-1")
    });
    let s = parse(&page);
    assert_eq!(
        allocation(&s, &uuids[2], "train-0", "worker"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(allocation(&s, &uuids[3], "train-0", "worker"), Some(1.0));
    assert_eq!(allocation(&s, mig, "infer-1", "server"), Some(1.0));
    assert!(!page.contains("eth7"), "not a GPU resource");
    assert_eq!(
        page.lines()
            .filter(|l| l.starts_with("gpu_k8s_allocation{"))
            .count(),
        3
    );
    assert_eq!(
        value(
            &s,
            "junction_source_up",
            &[("junction_source", "kubernetes")]
        ),
        Some(1.0)
    );

    // The pod ends: its series go with it.
    kubelet.set_pods(vec![pod(
        "ml",
        "infer-1",
        "server",
        "nvidia.com/mig-1g.10gb",
        &[mig],
    )]);
    agent.wait_for(Duration::from_secs(20), |m| {
        !m.contains("train-0") && m.contains("infer-1")
    });

    // The kubelet fails: down, the allocations dropped, and the reason in the log.
    kubelet.fail(tonic::Code::Unavailable, "kubelet is restarting");
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("junction_source_up{junction_source=\"kubernetes\"} 0")
            && !m.contains("gpu_k8s_allocation{")
    });
    assert!(
        agent.log().contains("kubelet is restarting"),
        "{}",
        agent.log()
    );
    // Everything else goes on.
    let page = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    assert!(page.contains("hw_gpu_memory_usage_bytes"));
    assert!(agent.terminate().success());
}

#[test]
fn off_kubernetes_the_source_says_nothing_and_health_is_not_affected() {
    let port = support::free_port();
    let dir = support::temp_dir();
    let config = format!(
        "{}\n{}",
        support::sim_config("current", port, ""),
        section(&dir.join("absent.sock"), &dir.join("absent-pods"))
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &config);
    agent.wait_for(Duration::from_secs(30), |m| m.contains("gpu_info{"));
    // The source polls every second: a page scraped after two intervals is one it could have
    // written to.
    std::thread::sleep(Duration::from_secs(2));
    let page = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    assert!(page.contains("gpu_info{"), "a full page");
    assert!(!page.contains("junction_source=\"kubernetes\""), "{page}");
    let health = support::get(agent.port, "/healthz", Duration::from_secs(5)).expect("healthz");
    assert!(!health.contains("kubernetes"), "{health}");
    assert!(
        !agent.log().contains("pod"),
        "nothing said: {}",
        agent.log()
    );
}

#[test]
fn a_process_in_a_pod_carries_the_pods_name() {
    if ebpf::cannot_run() {
        return;
    }
    let dir = support::temp_dir();
    let socket = dir.join("kubelet.sock");
    let pods = dir.join("pods");
    std::fs::create_dir_all(pods.join(format!("ml_train-0_{POD_UID}"))).expect("pod dir");
    let kubelet = Kubelet::start(&socket);
    let port = support::free_port();
    let config = format!(
        "{}\n{}",
        ebpf::ebpf_config(port, ebpf::SECTION),
        section(&socket, &pods)
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &config);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("junction_source_up{junction_source=\"ebpf\"} 1") && m.contains("gpu_info{")
    });
    let uuids = support::uuids(&parse(&page));
    kubelet.set_pods(vec![pod(
        "ml",
        "train-0",
        "worker",
        "nvidia.com/gpu",
        &[&uuids[5]],
    )]);
    let (container, cgroup) = ebpf::pod_cgroup(POD_UID, 7);
    let w = ebpf::spawn_workload_in("basic", &uuids[5], &cgroup, container.clone());
    let pid = w.pid;
    let first = ebpf::wait_pid(&mut agent, pid, "k8s_pod_name=\"train-0\"");
    let p = pid.to_string();
    let rm_alloc = |s: &[support::Series]| {
        value(
            s,
            "gpu_process_driver_calls_total",
            &[("process_pid", &p), ("gpu_driver_call", "rm_alloc")],
        )
    };
    let allocated = |s: &[support::Series]| {
        value(
            s,
            "gpu_k8s_allocation",
            &[("hw_id", &uuids[5]), ("k8s_pod_name", "train-0")],
        )
    };
    // The workload's whole sequence published (a later interval than the first sighting), and
    // the kubelet's allocation read: the two sources poll on their own clocks, and eBPF can see
    // all four calls before the kubernetes source's next `List` after `set_pods`.
    let mut page = first;
    support::wait_until(
        Duration::from_secs(15),
        "the workload's 4 RM_ALLOC calls and the pod's allocation",
        || {
            if let Ok(now) = support::scrape(agent.port, Duration::from_secs(5)) {
                page = now;
            }
            let s = parse(&page);
            rm_alloc(&s) == Some(4.0) && allocated(&s).is_some()
        },
    );
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "gpu_process_driver_calls_total",
            &[
                ("process_pid", &p),
                ("gpu_driver_call", "rm_alloc"),
                ("k8s_pod_uid", POD_UID),
                ("k8s_namespace_name", "ml"),
                ("k8s_pod_name", "train-0"),
                ("container_id", &container),
            ]
        ),
        Some(4.0),
        "the basic workload makes 4 RM_ALLOC calls: {page}"
    );
    // The GPU it registered is the one the kubelet allocated to the pod.
    assert_eq!(allocated(&s), Some(1.0), "{page}");
    w.finish();
    let _ = std::fs::remove_dir(&cgroup);
}
